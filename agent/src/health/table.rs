//! What the prober knows of each peer, and when each is probed next: pure
//! bookkeeping on a clock the caller passes in, so it is tested without
//! sockets or sleeps.
//!
//! Each peer is probed once a period: the probe interval, or longer where
//! the peers are too many for the rate bound (`peers / rate` seconds), so
//! a node never sends more than `rate` probes a second however large the
//! cluster. New peers are spread over the first period (a jitter of their
//! own). The schedule is ordered by time, so each step costs the log of
//! the peers, not the peers: 50,000 of them cost nothing between probes. A probe not
//! answered within the timeout is a miss; a miss is retried half a second
//! later, and the third miss in a row makes the peer unreachable (one lost
//! packet does not). An answer makes it reachable again.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    net::IpAddr,
    time::{Duration, Instant},
};

use ipnet::IpNet;

use super::tick::Tick;

/// Misses in a row that make a peer unreachable.
pub(crate) const MISSES: u8 = 3;
/// How soon a missed probe is tried again.
pub(crate) const RETRY: Duration = Duration::from_millis(500);

/// A peer's state, as the probes found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum State {
    Unreachable,
    /// Not answered nor missed enough yet.
    Unknown,
    Reachable,
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

/// Why the last probe failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// Not answered within the timeout.
    NoAnswer,
    NotSent(Box<str>),
}

impl Miss {
    pub(crate) fn describe(&self, timeout: Duration) -> String {
        match self {
            Miss::NoAnswer => format!("no answer within {timeout:?}"),
            Miss::NotSent(why) => format!("not sent: {why}"),
        }
    }
}

/// One peer's record (small: a node may have 50,000 peers).
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub vtep: IpAddr,
    pub state: State,
    misses: u8,
    /// The probe in flight, by sequence number (0: none; never used).
    in_flight: u16,
    /// The last answered probe's round trip, in µs (0: none yet).
    rtt_us: u32,
    /// When the next probe is due; while one is in flight, when it left.
    at: Tick,
    pub last_error: Option<Miss>,
}

impl Entry {
    /// The last answered probe's round trip.
    pub(crate) fn rtt(&self) -> Option<Duration> {
        (self.rtt_us > 0).then(|| Duration::from_micros(u64::from(self.rtt_us)))
    }
}

/// Probes sent, by what became of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub answered: u64,
    pub lost: u64,
    /// The probe could not be sent.
    pub failed: u64,
}

/// Every peer's record, the schedule, and the probes in flight.
pub(crate) struct Table {
    interval: Duration,
    rate: f64,
    timeout: Duration,
    peers: HashMap<IpNet, Entry>,
    /// Peers not in flight, by when their next probe is due.
    schedule: BTreeSet<(Tick, IpNet)>,
    /// Probes in the order they left (their timeouts come in that order).
    in_flight: VecDeque<(u16, IpNet, Instant)>,
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
            schedule: BTreeSet::new(),
            in_flight: VecDeque::new(),
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

    /// The peers are now `peers` (subnet, VTEP): gone ones are forgotten,
    /// the others as [`Table::upsert`].
    pub(crate) fn set_peers(&mut self, peers: &[(IpNet, IpAddr)], now: Instant) {
        for s in super::gone(self.peers.keys(), peers) {
            self.remove(&s);
        }
        for (subnet, vtep) in peers {
            self.upsert(*subnet, *vtep, now);
        }
    }

    /// A peer added (its first probe at a slot of its own within the
    /// period) or changed (a new VTEP is a new path: probed now, from
    /// scratch).
    pub(crate) fn upsert(&mut self, subnet: IpNet, vtep: IpAddr, now: Instant) {
        if let Some(e) = self.peers.get(&subnet) {
            if e.vtep == vtep {
                return;
            }
            self.remove(&subnet);
            self.insert(subnet, vtep, now);
            return;
        }
        let period = self.period();
        self.insert(subnet, vtep, now + period.mul_f64(jitter(&subnet)));
    }

    fn insert(&mut self, subnet: IpNet, vtep: IpAddr, at: Instant) {
        let at = Tick::of(at);
        self.peers.insert(
            subnet,
            Entry {
                vtep,
                state: State::Unknown,
                misses: 0,
                in_flight: 0,
                rtt_us: 0,
                at,
                last_error: None,
            },
        );
        self.schedule.insert((at, subnet));
    }

    /// A peer gone.
    pub(crate) fn remove(&mut self, subnet: &IpNet) {
        if let Some(e) = self.peers.remove(subnet) {
            if e.in_flight != 0 {
                self.by_seq.remove(&e.in_flight);
            } else {
                self.schedule.remove(&(e.at, *subnet));
            }
        }
    }

    /// The probe in flight as `seq` to `subnet`, taken out of flight.
    fn land(&mut self, seq: u16) -> Option<(IpNet, Instant)> {
        let subnet = self.by_seq.remove(&seq)?;
        let e = self.peers.get_mut(&subnet)?;
        if e.in_flight != seq {
            return None;
        }
        e.in_flight = 0;
        Some((subnet, e.at.instant()))
    }

    fn reschedule(&mut self, subnet: IpNet, at: Instant) {
        let at = Tick::of(at);
        if let Some(e) = self.peers.get_mut(&subnet) {
            e.at = at;
            self.schedule.insert((at, subnet));
        }
    }

    /// Misses for probes whose time is up.
    pub(crate) fn expire(&mut self, now: Instant) {
        while let Some((seq, subnet, sent)) = self.in_flight.front().copied() {
            if now.duration_since(sent) < self.timeout {
                break;
            }
            self.in_flight.pop_front();
            if self.by_seq.get(&seq) != Some(&subnet) {
                continue; // answered, or the peer is gone
            }
            if self.land(seq).is_some() {
                self.tally.lost += 1;
                self.miss(subnet, now, Miss::NoAnswer);
            }
        }
    }

    fn miss(&mut self, subnet: IpNet, now: Instant, why: Miss) {
        let period = self.period();
        let Some(e) = self.peers.get_mut(&subnet) else {
            return;
        };
        e.misses = e.misses.saturating_add(1);
        e.last_error = Some(why);
        let at = if e.misses >= MISSES {
            e.state = State::Unreachable;
            now + period
        } else {
            now + RETRY
        };
        self.reschedule(subnet, at);
    }

    /// Up to `budget` probes whose time has come: (subnet, target, seq),
    /// each now in flight. The target is the peer's overlay address (its
    /// subnet's network address, which its overlay device holds).
    pub(crate) fn due(&mut self, now: Instant, budget: usize) -> Vec<(IpNet, IpAddr, u16)> {
        let mut out = Vec::new();
        let tick = Tick::of(now);
        while out.len() < budget {
            match self.schedule.first() {
                Some((at, _)) if *at <= tick => {}
                _ => break,
            }
            let (_, subnet) = self.schedule.pop_first().expect("looked at above");
            let seq = self.next_seq();
            if let Some(e) = self.peers.get_mut(&subnet) {
                e.in_flight = seq;
                e.at = tick;
                self.by_seq.insert(seq, subnet);
                self.in_flight.push_back((seq, subnet, now));
                out.push((subnet, subnet.network(), seq));
            }
        }
        out
    }

    fn next_seq(&mut self) -> u16 {
        loop {
            self.seq = self.seq.wrapping_add(1);
            if self.seq != 0 && !self.by_seq.contains_key(&self.seq) {
                return self.seq;
            }
        }
    }

    /// The probe `seq` was answered by `from`.
    pub(crate) fn answered(&mut self, seq: u16, from: IpAddr, now: Instant) {
        match self.by_seq.get(&seq) {
            Some(subnet) if subnet.network() == from => {}
            _ => return,
        }
        let Some((subnet, sent)) = self.land(seq) else {
            return;
        };
        let period = self.period();
        let rtt = now.duration_since(sent);
        if let Some(e) = self.peers.get_mut(&subnet) {
            e.rtt_us = u32::try_from(rtt.as_micros()).unwrap_or(u32::MAX).max(1);
            e.state = State::Reachable;
            e.misses = 0;
            e.last_error = None;
        }
        self.reschedule(subnet, now + period);
        self.tally.answered += 1;
        self.rtts.push(rtt);
    }

    /// The probe `seq` could not be sent.
    pub(crate) fn failed(&mut self, seq: u16, why: String, now: Instant) {
        if let Some((subnet, _)) = self.land(seq) {
            self.tally.failed += 1;
            self.miss(subnet, now, Miss::NotSent(why.into()));
        }
    }

    /// When the next probe is due or the next one in flight times out.
    pub(crate) fn next_event(&self) -> Option<Instant> {
        let due = self.schedule.first().map(|(at, _)| at.instant());
        let timeout = self
            .in_flight
            .front()
            .map(|(_, _, sent)| *sent + self.timeout);
        match (due, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn get(&self, subnet: &IpNet) -> Option<&Entry> {
        self.peers.get(subnet)
    }

    pub(crate) fn peers(&self) -> impl Iterator<Item = (&IpNet, &Entry)> {
        self.peers.iter()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn len(&self) -> usize {
        self.peers.len()
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

/// Where in the period a new peer's first probe goes: a fraction of its
/// own, so that peers and nodes do not probe in step.
fn jitter(subnet: &IpNet) -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(subnet.to_string().as_bytes());
    (h.finish() % 10_000) as f64 / 10_000.0
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
                .all(|(_, e)| e.rtt() == Some(Duration::from_millis(1)))
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
        assert_eq!(e.last_error, Some(Miss::NoAnswer));
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

    #[test]
    fn peers_come_and_go_one_by_one() {
        let start = Instant::now();
        let mut t = Table::new(Duration::from_secs(1), 20.0, Duration::from_secs(1));
        let p = peers(2);
        for (s, v) in &p {
            t.upsert(*s, *v, start);
        }
        let now = start + Duration::from_secs(2);
        let due = t.due(now, 10);
        assert_eq!(due.len(), 2);
        let seq_of = |s: IpNet| due.iter().find(|d| d.0 == s).unwrap().2;
        // Gone while its probe is in flight: its answer and its timeout
        // count for nothing.
        t.remove(&p[0].0);
        t.answered(seq_of(p[0].0), p[0].0.network(), now);
        t.answered(seq_of(p[1].0), p[1].0.network(), now);
        assert_eq!(t.counts(), (1, 0, 0));
        t.expire(now + Duration::from_secs(5));
        assert_eq!(
            t.tally,
            Tally {
                answered: 1,
                lost: 0,
                failed: 0
            }
        );
        // A new VTEP is a new path: unknown again, and probed at once.
        let later = now + Duration::from_secs(5);
        t.upsert(p[1].0, IpAddr::from([198, 18, 9, 9]), later);
        assert_eq!(t.counts(), (0, 0, 1));
        assert_eq!(t.due(later, 10).len(), 1);
        assert_eq!(t.len(), 1);
    }
}
