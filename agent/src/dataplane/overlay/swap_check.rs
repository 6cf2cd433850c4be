//! The check around a swap of programs: peers that answered through the
//! tunnel before the new programs went in must answer after. The self-test
//! proves the programs on golden frames; this proves them on the node's
//! real devices and peers, where a fault the frames do not cover shows.
//! A swap that loses most of them is rolled back by the caller.

use std::{net::IpAddr, time::Duration, time::Instant};

use crate::health;

use super::super::types::Peer;

/// Peers sampled for the check (by subnet, the first ones).
const SAMPLE: usize = 8;
/// How long one probe waits.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long the new programs get to reach the peers that answered before.
pub(super) const GRACE: Duration = Duration::from_secs(10);

/// The peers' overlay addresses that answer now (through the programs in
/// the links before the swap).
pub(super) fn before<'a>(peers: impl Iterator<Item = &'a Peer>) -> Vec<IpAddr> {
    let mut all: Vec<&Peer> = peers.collect();
    all.sort_by_key(|p| p.subnet);
    let targets: Vec<IpAddr> = all
        .iter()
        .take(SAMPLE)
        .map(|p| p.subnet.network())
        .collect();
    if targets.is_empty() {
        return targets;
    }
    health::answering(&targets, TIMEOUT)
}

/// Whether at least half of `before` answer within `grace` after the
/// swap; else what was lost.
pub(super) fn after(before: &[IpAddr], grace: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + grace;
    let mut seen: Vec<IpAddr> = Vec::new();
    loop {
        let left: Vec<IpAddr> = before
            .iter()
            .filter(|t| !seen.contains(t))
            .copied()
            .collect();
        seen.extend(health::answering(&left, TIMEOUT));
        if seen.len() * 2 >= before.len() {
            return Ok(seen.len());
        }
        if Instant::now() >= deadline {
            let lost: Vec<String> = left
                .iter()
                .filter(|t| !seen.contains(t))
                .map(|t| t.to_string())
                .collect();
            return Err(format!(
                "{} of the {} peers that answered before the swap did not answer within {grace:?} after it ({})",
                lost.len(),
                before.len(),
                lost.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
