//! The check around a swap of programs: peers that answered through the
//! tunnel before the new programs went in must answer after. The self-test
//! proves the programs on golden frames; this proves them on the node's
//! real devices and peers, where a fault the frames do not cover shows.
//! A swap that loses most of them is rolled back by the caller. Where
//! nothing answered before (the programs in the links were broken, or
//! there were none: a reboot), the agent runs [`after`] over a sample of
//! the peers once its peer table is complete, and the node is not ready
//! until it passes.

use std::{net::IpAddr, time::Duration, time::Instant};

use crate::sys::echo_sweep;

use super::super::types::Peer;

/// Peers sampled for the check (at random: whoever writes leases cannot
/// choose which).
const SAMPLE: usize = 8;
/// How long one probe waits.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long the new programs get to reach the peers that answered before.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// Up to [`SAMPLE`] peers drawn at random: (overlay address, VTEP).
pub(super) fn sample<'a>(peers: impl Iterator<Item = &'a Peer>) -> Vec<(IpAddr, IpAddr)> {
    let all: Vec<(IpAddr, IpAddr)> = peers.map(|p| (p.subnet.network(), p.vtep)).collect();
    let mut rng = rand::rng();
    rand::seq::IndexedRandom::choose_multiple(all.as_slice(), &mut rng, SAMPLE)
        .copied()
        .collect()
}

/// The sampled peers' overlay addresses that answer now (through the
/// programs in the links before the swap).
pub(super) fn before<'a>(peers: impl Iterator<Item = &'a Peer>) -> Vec<IpAddr> {
    let targets: Vec<IpAddr> = sample(peers).into_iter().map(|(o, _)| o).collect();
    if targets.is_empty() {
        return targets;
    }
    echo_sweep::answering(&targets, TIMEOUT)
}

/// The check where nothing answered before: of the sampled peers, those
/// whose VTEP answers on the underlay (which the programs do not carry: a
/// node that is down proves nothing either way) must answer through the
/// tunnel, at least half of them within [`GRACE`]. `Ok(0)`: none of them
/// is up to ask.
pub(crate) fn reach(targets: &[(IpAddr, IpAddr)]) -> Result<usize, String> {
    if targets.is_empty() {
        return Ok(0);
    }
    let vteps: Vec<IpAddr> = targets.iter().map(|(_, v)| *v).collect();
    let up = echo_sweep::answering(&vteps, TIMEOUT);
    let overlay: Vec<IpAddr> = targets
        .iter()
        .filter(|(_, v)| up.contains(v))
        .map(|(o, _)| *o)
        .collect();
    after(&overlay, GRACE)
}

/// Whether at least half of `before` (peers that answered before a swap,
/// or a sample of them) answer within `grace`; else what was lost.
pub(crate) fn after(before: &[IpAddr], grace: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + grace;
    let mut seen: Vec<IpAddr> = Vec::new();
    loop {
        let left: Vec<IpAddr> = before
            .iter()
            .filter(|t| !seen.contains(t))
            .copied()
            .collect();
        seen.extend(echo_sweep::answering(&left, TIMEOUT));
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
                "{} of the {} sampled peers did not answer within {grace:?} ({})",
                lost.len(),
                before.len(),
                lost.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
