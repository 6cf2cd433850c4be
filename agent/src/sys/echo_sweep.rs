//! Many ICMP echoes at once: each target probed once, the ones that
//! answer within a timeout returned (the check around a program swap), and
//! the probe size and read bound the prober shares.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use super::icmp::{Pinger, Received};

/// The probe's size on the wire, IP header included (a ping's default).
pub(crate) const PROBE_SIZE: usize = 84;

/// Messages one socket's queue is read for at most per pass: a flood of
/// them (forged, or not) cannot hold the prober's thread, which sends and
/// expires between passes whatever arrives.
pub(crate) const DRAIN_MAX: usize = 64;

/// Probes each of `targets` once, all at once, and returns those that
/// answered within `timeout` (the check around a program swap). Bounded
/// by `timeout` whatever arrives: a socket of its own (a random id and
/// nonce, so neither the prober's replies nor forged ones count), read
/// a bounded number of messages at a time between polls.
pub(crate) fn answering(targets: &[IpAddr], timeout: Duration) -> Vec<IpAddr> {
    let mut pingers: [Option<Pinger>; 2] = [None, None];
    let mut sent: Vec<(u16, IpAddr)> = Vec::new();
    let first: u16 = rand::random();
    for (i, t) in targets.iter().enumerate() {
        let f = usize::from(t.is_ipv6());
        if pingers[f].is_none() {
            pingers[f] = Pinger::open(t.is_ipv6()).ok();
        }
        let seq = first.wrapping_add(i as u16);
        if let Some(p) = &pingers[f]
            && p.send(*t, seq, PROBE_SIZE).is_ok()
        {
            sent.push((seq, *t));
        }
    }
    let deadline = Instant::now() + timeout;
    let mut answered = Vec::new();
    while answered.len() < sent.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match Pinger::any_readable(pingers.iter().flatten(), left.min(Duration::from_secs(1))) {
            None => break,
            Some(false) => continue,
            Some(true) => {}
        }
        for p in pingers.iter_mut().flatten() {
            for r in p.drain(DRAIN_MAX).unwrap_or_default() {
                if let Received::Echo(e) = r
                    && sent.contains(&(e.seq, e.from))
                    && !answered.contains(&e.from)
                {
                    answered.push(e.from);
                }
            }
        }
    }
    answered
}
