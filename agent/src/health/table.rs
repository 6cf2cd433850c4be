//! What the prober knows of each peer, and when each is probed next: pure
//! bookkeeping on a clock the caller passes in, so it is tested without
//! sockets or sleeps.
//!
//! Each peer is probed once a period: the probe interval, or longer where
//! the peers are too many for the rate bound (`peers / rate` seconds), so
//! a node never sends more than `rate` probes a second however large the
//! cluster. New peers are spread over the first period. A probe not
//! answered within the timeout is a miss; a miss is retried half a second
//! later, and the third miss in a row makes the peer unreachable (one lost
//! packet does not). An answer makes it reachable again.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use ipnet::IpNet;

/// Misses in a row that make a peer unreachable.
pub(crate) const MISSES: u8 = 3;
/// How soon a missed probe is tried again.
pub(crate) const RETRY: Duration = Duration::from_millis(500);

/// A peer's state, as the probes found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Not answered nor missed enough yet.
    Unknown,
    Reachable,
    Unreachable,
}

impl State {
    pub(crate) fn name(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Reachable => "reachable",
            State::Unreachable => "unreachable",
        }
    }
}

/// One peer's record.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub vtep: IpAddr,
    /// What is probed: the peer's overlay address (its subnet's network
    /// address, held by its overlay device), reached through the tunnel.
    pub target: IpAddr,
    pub state: State,
    misses: u8,
    /// The last answered probe's round trip.
    pub rtt: Option<Duration>,
    pub last_error: Option<String>,
    next: Instant,
    /// The probe in flight: its sequence number and when it left.
    outstanding: Option<(u16, Instant)>,
}

/// Probes sent, by what became of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub answered: u64,
    pub lost: u64,
    /// The probe could not be sent.
    pub failed: u64,
}

/// Every peer's record, and the probes in flight.
pub(crate) struct Table {
    interval: Duration,
    rate: f64,
    timeout: Duration,
    peers: HashMap<IpNet, Entry>,
    by_seq: HashMap<u16, IpNet>,
    seq: u16,
    pub tally: Tally,
    /// Round trips of answered probes not yet handed to the metrics.
    pub rtts: Vec<Duration>,
}

impl Table {
    pub(crate) fn new(interval: Duration, rate: f64, timeout: Duration) -> Self {
        Self {
            interval,
            rate: rate.max(0.1),
            timeout,
            peers: HashMap::new(),
            by_seq: HashMap::new(),
            seq: 0,
            tally: Tally::default(),
            rtts: Vec::new(),
        }
    }

    /// How long between two probes of one peer: the interval, or longer
    /// where the rate bound needs it.
    pub(crate) fn period(&self) -> Duration {
        let spread = Duration::from_secs_f64(self.peers.len() as f64 / self.rate);
        self.interval.max(spread)
    }

    /// The peers are now `peers` (subnet, VTEP): new ones get a slot
    /// spread over the first period, gone ones are forgotten.
    pub(crate) fn set_peers(&mut self, peers: &[(IpNet, IpAddr)], now: Instant) {
        let keep: std::collections::HashSet<IpNet> = peers.iter().map(|(s, _)| *s).collect();
        self.peers.retain(|s, _| keep.contains(s));
        self.by_seq.retain(|_, s| keep.contains(s));
        let n = peers.len().max(1) as u64;
        let period = self
            .interval
            .max(Duration::from_secs_f64(n as f64 / self.rate));
        for (i, (subnet, vtep)) in peers.iter().enumerate() {
            match self.peers.get_mut(subnet) {
                Some(e) if e.vtep == *vtep => {}
                Some(e) => {
                    // A new VTEP is a new path: start over.
                    e.vtep = *vtep;
                    e.state = State::Unknown;
                    e.misses = 0;
                    e.next = now;
                }
                None => {
                    let slot = period.mul_f64(spread(subnet, i as u64, n));
                    self.peers.insert(
                        *subnet,
                        Entry {
                            vtep: *vtep,
                            target: subnet.network(),
                            state: State::Unknown,
                            misses: 0,
                            rtt: None,
                            last_error: None,
                            next: now + slot,
                            outstanding: None,
                        },
                    );
                }
            }
        }
    }

    /// Misses for probes whose time is up.
    pub(crate) fn expire(&mut self, now: Instant) {
        let timeout = self.timeout;
        let period = self.period();
        let mut lost = 0;
        for e in self.peers.values_mut() {
            if let Some((seq, sent)) = e.outstanding
                && now.duration_since(sent) >= timeout
            {
                e.outstanding = None;
                self.by_seq.remove(&seq);
                lost += 1;
                miss(e, now, period, format!("no answer within {timeout:?}"));
            }
        }
        self.tally.lost += lost;
    }

    /// Up to `budget` probes whose time has come: (subnet, target, seq),
    /// each now in flight.
    pub(crate) fn due(&mut self, now: Instant, budget: usize) -> Vec<(IpNet, IpAddr, u16)> {
        let mut ready: Vec<(Instant, IpNet)> = self
            .peers
            .iter()
            .filter(|(_, e)| e.outstanding.is_none() && e.next <= now)
            .map(|(s, e)| (e.next, *s))
            .collect();
        ready.sort();
        ready.truncate(budget);
        let mut out = Vec::with_capacity(ready.len());
        for (_, subnet) in ready {
            let seq = self.next_seq();
            let e = self.peers.get_mut(&subnet).expect("listed above");
            e.outstanding = Some((seq, now));
            self.by_seq.insert(seq, subnet);
            out.push((subnet, e.target, seq));
        }
        out
    }

    fn next_seq(&mut self) -> u16 {
        loop {
            self.seq = self.seq.wrapping_add(1);
            if !self.by_seq.contains_key(&self.seq) {
                return self.seq;
            }
        }
    }

    /// The probe `seq` was answered by `from`.
    pub(crate) fn answered(&mut self, seq: u16, from: IpAddr, now: Instant) {
        let Some(subnet) = self.by_seq.get(&seq).copied() else {
            return;
        };
        let period = self.period();
        let Some(e) = self.peers.get_mut(&subnet) else {
            return;
        };
        if e.target != from {
            return;
        }
        self.by_seq.remove(&seq);
        let Some((_, sent)) = e.outstanding.take() else {
            return;
        };
        let rtt = now.duration_since(sent);
        e.rtt = Some(rtt);
        e.state = State::Reachable;
        e.misses = 0;
        e.last_error = None;
        e.next = now + period;
        self.tally.answered += 1;
        self.rtts.push(rtt);
    }

    /// The probe `seq` could not be sent.
    pub(crate) fn failed(&mut self, seq: u16, why: String, now: Instant) {
        let Some(subnet) = self.by_seq.remove(&seq) else {
            return;
        };
        let period = self.period();
        if let Some(e) = self.peers.get_mut(&subnet) {
            e.outstanding = None;
            self.tally.failed += 1;
            miss(e, now, period, why);
        }
    }

    /// When the next probe is due or the next one in flight times out.
    pub(crate) fn next_event(&self) -> Option<Instant> {
        self.peers
            .values()
            .map(|e| match e.outstanding {
                Some((_, sent)) => sent + self.timeout,
                None => e.next,
            })
            .min()
    }

    pub(crate) fn peers(&self) -> impl Iterator<Item = (&IpNet, &Entry)> {
        self.peers.iter()
    }

    /// (reachable, unreachable, unknown).
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for e in self.peers.values() {
            match e.state {
                State::Reachable => c.0 += 1,
                State::Unreachable => c.1 += 1,
                State::Unknown => c.2 += 1,
            }
        }
        c
    }
}

fn miss(e: &mut Entry, now: Instant, period: Duration, why: String) {
    e.misses = e.misses.saturating_add(1);
    e.last_error = Some(why);
    if e.misses >= MISSES {
        e.state = State::Unreachable;
        e.next = now + period;
    } else {
        e.next = now + RETRY;
    }
}

/// Where in the period the `i`-th of `n` new peers goes: evenly spaced,
/// shifted by a per-subnet jitter so that nodes do not probe in step.
fn spread(subnet: &IpNet, i: u64, n: u64) -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(subnet.to_string().as_bytes());
    let jitter = (h.finish() % 1000) as f64 / 1000.0;
    ((i as f64 + jitter) / n as f64).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(i: u32) -> IpNet {
        let a = std::net::Ipv4Addr::from(0x0a00_0000 + (i << 8));
        IpNet::V4(ipnet::Ipv4Net::new(a, 24).unwrap())
    }

    fn peers(n: u32) -> Vec<(IpNet, IpAddr)> {
        (1..=n)
            .map(|i| (net(i), IpAddr::from([198, 18, (i >> 8) as u8, i as u8])))
            .collect()
    }

    /// Runs the table for `secs` seconds in steps of 10 ms, answering
    /// every probe `answer` says is answered after 1 ms; returns the
    /// probes sent.
    fn drive(
        t: &mut Table,
        start: Instant,
        secs: u64,
        rate: f64,
        answer: impl Fn(&IpNet) -> bool,
    ) -> usize {
        let mut sent = 0;
        let mut tokens = rate;
        for step in 0..secs * 100 {
            let now = start + Duration::from_millis(step * 10);
            tokens = (tokens + rate / 100.0).min(rate);
            t.expire(now);
            let due = t.due(now, tokens as usize);
            tokens -= due.len() as f64;
            sent += due.len();
            for (subnet, target, seq) in due {
                if answer(&subnet) {
                    t.answered(seq, target, now + Duration::from_millis(1));
                }
            }
        }
        sent
    }

    #[test]
    fn every_peer_is_probed_once_a_period_and_answers_make_it_reachable() {
        let start = Instant::now();
        let mut t = Table::new(Duration::from_secs(10), 20.0, Duration::from_secs(1));
        t.set_peers(&peers(5), start);
        let sent = drive(&mut t, start, 30, 20.0, |_| true);
        // 5 peers, 10 s apart, over 30 s: each 3 times (its slot, +10, +20).
        assert!((13..=16).contains(&sent), "{sent} probes");
        assert_eq!(t.counts(), (5, 0, 0));
        assert!(
            t.peers()
                .all(|(_, e)| e.rtt == Some(Duration::from_millis(1)))
        );
        assert_eq!(t.tally.answered as usize, sent);
    }

    #[test]
    fn three_misses_in_a_row_make_a_peer_unreachable_and_an_answer_reachable() {
        let start = Instant::now();
        let mut t = Table::new(Duration::from_secs(10), 20.0, Duration::from_secs(1));
        t.set_peers(&peers(2), start);
        let dark = net(2);
        drive(&mut t, start, 20, 20.0, |s| *s != dark);
        let (_, e) = t.peers().find(|(s, _)| **s == dark).unwrap();
        // Its slot (within the first period), then two retries a second
        // after each timeout.
        assert_eq!(e.state, State::Unreachable);
        assert!(e.last_error.as_deref().unwrap().contains("no answer"));
        assert_eq!(t.counts(), (1, 1, 0));
        assert!(t.tally.lost >= 3);
        drive(&mut t, start + Duration::from_secs(20), 11, 20.0, |_| true);
        assert_eq!(t.counts(), (2, 0, 0));
    }

    #[test]
    fn the_rate_bound_stretches_the_period_for_many_peers() {
        let start = Instant::now();
        let mut t = Table::new(Duration::from_secs(10), 20.0, Duration::from_secs(1));
        t.set_peers(&peers(1000), start);
        assert_eq!(t.period(), Duration::from_secs(50));
        // Every probe lost: retries count against the bound too.
        let sent = drive(&mut t, start, 60, 20.0, |_| false);
        assert!(sent <= 60 * 20 + 20, "{sent} probes in 60 s");
        assert!(sent >= 1000, "every peer probed: {sent}");
    }

    #[test]
    fn replies_from_elsewhere_or_for_gone_peers_are_ignored() {
        let start = Instant::now();
        let mut t = Table::new(Duration::from_secs(1), 20.0, Duration::from_secs(1));
        t.set_peers(&peers(1), start);
        let later = start + Duration::from_secs(2);
        let due = t.due(later, 10);
        assert_eq!(due.len(), 1);
        let (_, target, seq) = due[0];
        t.answered(seq, IpAddr::from([10, 9, 9, 9]), later);
        assert_eq!(t.counts(), (0, 0, 1), "not from the target");
        t.set_peers(&[], later);
        t.answered(seq, target, later);
        assert_eq!(t.counts(), (0, 0, 0));
        assert_eq!(t.tally.answered, 0);
    }
}
