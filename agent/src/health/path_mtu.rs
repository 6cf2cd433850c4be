//! Per-peer path MTU search: pure bookkeeping on a clock the caller passes
//! in (tested without sockets), driven by the prober's thread.
//!
//! Each IPv4 peer's path is measured by probing it through the tunnel with
//! echo requests whose outer header says don't-fragment (the programs set
//! it on packets carrying the prober's mark), in the manner of RFC 8899's
//! packetization-layer probing: a size counts as carried once the peer
//! answers it, and as too big after [`TRIES`] probes of it went
//! unanswered. The search starts at the base size (the smaller of the
//! uplink's MTU and 1500, what a peer not measured is given), tries the
//! uplink's MTU next, and then bisects over the MTUs underlays have (the
//! plateaus of RFC 1191 and the jumbo sizes), so a 9000-byte segment
//! behind a 1500-byte hop is found in a few probes, not dozens. A path
//! whose base size goes unanswered is searched downwards the same way.
//!
//! A measured path is checked again at its size every recheck period (a
//! path that shrank is searched again from below) and searched upwards
//! again every [`RESEARCH`] (one that grew). Probes share the prober's
//! rate bound. One source port suffices: the outer source port is the
//! hash of the inner flow, and a probe's inner flow is fixed, so its path
//! is one of the underlay's equal-cost paths; the checks at each size and
//! the hand-back of oversize packets to the stack (which answers with
//! ICMP) keep the others honest only where their MTUs agree, which is the
//! common case of one fabric.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant, SystemTime},
};

use ipnet::IpNet;

use super::tick::{Stamp, Tick};

/// Probes of one size unanswered before it counts as too big.
pub(crate) const TRIES: u8 = 2;
/// How soon an unanswered size is tried again.
const RETRY: Duration = Duration::from_millis(300);
/// How often a measured path is searched upwards again.
pub(crate) const RESEARCH: Duration = Duration::from_secs(600);
/// A path measured below the base size is searched upwards again after
/// this many recheck periods.
const SHRUNK_RESEARCH_RECHECKS: u32 = 4;
/// The smallest outer packet searched for (IPv6's minimum MTU: an underlay
/// that carries less is not one VXLAN runs on).
pub(crate) const FLOOR: u32 = 1280;
/// MTUs underlays have, smallest first.
const PLATEAUS: [u32; 14] = [
    1280, 1380, 1400, 1420, 1450, 1480, 1492, 1500, 4352, 4470, 8192, 8950, 9000, 9216,
];

/// One peer's search.
#[derive(Clone, Debug)]
struct Search {
    vtep: Ipv4Addr,
    /// The largest size answered since the search began (0: none).
    lo: u32,
    /// The smallest size found too big (above the ceiling: none).
    hi: u32,
    /// Unanswered probes of the size in flight or next.
    misses: u8,
    /// What a "fragmentation needed" asked of the search (see
    /// [`Hint`]).
    hint: Option<Hint>,
    /// The probe in flight: (seq, size, what for); when it left is in
    /// [`PathMtus::in_flight`].
    in_flight: Option<(u16, u32, Kind)>,
    next_at: Tick,
    /// What the dataplane was told, and when it was measured.
    mtu: Option<u32>,
    measured: Option<Stamp>,
    /// When the path is next searched upwards.
    research_at: Tick,
}

/// A smaller size the underlay's "fragmentation needed" named, and where
/// its check is (RFC 8899, 4.6.2: a PTB is a reason to probe, not a
/// measurement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hint {
    /// The size in use is checked next.
    Check(u32),
    /// The size in use was lost: this one is probed first on the way
    /// down.
    Next(u32),
}

/// What a probe in flight is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The search's own.
    Search,
    /// The check of the size in use a hint asked for: lost once, the
    /// hint was right (a forger can send a hint, not lose a probe).
    Check,
    /// The size a confirmed hint named: answered, it is used at once,
    /// and the search goes upwards from it.
    Hinted,
}

/// A peer's path MTU as `weft status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Measured {
    pub mtu: u32,
    pub at: SystemTime,
}

/// The sizes searched under `ceiling`, ascending: the plateaus up to it,
/// it, and the base size.
fn candidates(ceiling: u32) -> Vec<u32> {
    let base = ceiling.min(dataplane_common::DEFAULT_PATH_MTU);
    let mut c: Vec<u32> = PLATEAUS
        .iter()
        .copied()
        .filter(|p| *p <= ceiling)
        .chain([ceiling, base])
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// Every IPv4 peer's search.
pub(crate) struct PathMtus {
    /// The uplink's MTU: the largest outer packet searched for.
    ceiling: u32,
    /// The sizes searched, ascending: the plateaus up to the ceiling, the
    /// ceiling and the base size.
    candidates: Vec<u32>,
    timeout: Duration,
    recheck: Duration,
    peers: HashMap<IpNet, Search>,
    /// Peers not in flight, by when their next probe is due.
    schedule: BTreeSet<(Tick, IpNet)>,
    /// Probes in the order they left (their timeouts come in that order).
    in_flight: VecDeque<(u16, IpNet, Instant)>,
    by_seq: HashMap<u16, IpNet>,
    seq: u16,
    /// Paths changed since the dataplane was last told: VTEP -> MTU (None:
    /// not measured, the base size applies).
    changes: HashMap<Ipv4Addr, Option<u32>>,
    /// VTEPs whose hints are not taken before a time (one check per
    /// recheck period: a flood of them costs a probe a period, not one
    /// each); only VTEPs hinted lately are here.
    hints_quiet: HashMap<Ipv4Addr, Tick>,
    /// Probes sent, and those answered.
    pub probes: u64,
    pub answered: u64,
    /// "Fragmentation needed" messages that named a smaller size for a
    /// peer, and those the probe of that size confirmed.
    pub hints: u64,
    pub hints_confirmed: u64,
}

impl PathMtus {
    pub(crate) fn new(ceiling: u32, timeout: Duration, recheck: Duration) -> Self {
        Self {
            ceiling,
            candidates: candidates(ceiling),
            timeout,
            recheck,
            peers: HashMap::new(),
            schedule: BTreeSet::new(),
            in_flight: VecDeque::new(),
            by_seq: HashMap::new(),
            seq: 0,
            changes: HashMap::new(),
            hints_quiet: HashMap::new(),
            probes: 0,
            answered: 0,
            hints: 0,
            hints_confirmed: 0,
        }
    }

    /// The underlay said (ICMP "fragmentation needed") that an outer
    /// packet to `vtep` met a hop of `mtu` bytes. Never believed: anyone
    /// can send one (a pod with CAP_NET_RAW, any host of the underlay), and
    /// a probe of the named, smaller size always gets through. As RFC 8899
    /// (4.6.2) has it, the size in use is probed again at once; only if
    /// it is lost ([`TRIES`] times) does the path shrink, searched from
    /// the named size upwards. A forged message costs one probe, never the
    /// path; one that names more than the size in use is ignored.
    pub(crate) fn hint(&mut self, vtep: Ipv4Addr, mtu: u32, now: Instant) {
        if mtu < FLOOR {
            return;
        }
        let base = self.base();
        let tick = Tick::of(now);
        if self
            .hints_quiet
            .get(&vtep)
            .is_some_and(|until| tick < *until)
        {
            return;
        }
        self.hints_quiet.retain(|_, until| tick < *until);
        for e in self.peers.values_mut().filter(|e| e.vtep == vtep) {
            if mtu >= e.mtu.unwrap_or(base) || e.hint.is_some() {
                continue;
            }
            e.hint = Some(Hint::Check(mtu));
            e.misses = 0;
            self.hints += 1;
        }
        let now_due: Vec<IpNet> = self
            .peers
            .iter()
            .filter(|(_, e)| {
                e.vtep == vtep && matches!(e.hint, Some(Hint::Check(_))) && e.in_flight.is_none()
            })
            .map(|(s, _)| *s)
            .collect();
        for subnet in now_due {
            self.reschedule(subnet, now);
        }
    }

    /// Puts a peer not in flight at `at` in the schedule.
    fn reschedule(&mut self, subnet: IpNet, at: Instant) {
        let at = Tick::of(at);
        if let Some(e) = self.peers.get_mut(&subnet) {
            self.schedule.remove(&(e.next_at, subnet));
            e.next_at = at;
            self.schedule.insert((at, subnet));
        }
    }

    /// The base size: what a peer not measured is given.
    pub(crate) fn base(&self) -> u32 {
        self.ceiling.min(dataplane_common::DEFAULT_PATH_MTU)
    }

    /// The uplink's MTU changed: every path is searched again.
    pub(crate) fn set_ceiling(&mut self, ceiling: u32, now: Instant) {
        if ceiling == self.ceiling {
            return;
        }
        self.ceiling = ceiling;
        self.candidates = candidates(ceiling);
        let subnets: Vec<(IpNet, Ipv4Addr)> =
            self.peers.iter().map(|(s, e)| (*s, e.vtep)).collect();
        self.remove_all(&subnets.iter().map(|(s, _)| *s).collect::<Vec<_>>());
        for (s, v) in subnets {
            self.upsert(s, IpAddr::V4(v), now);
        }
    }

    /// A peer added or changed (a new VTEP is a new path). Only IPv4
    /// peers are searched (IPv6's outer headers are the kernel vxlan
    /// device's, which learns the path MTU from Packet Too Big itself).
    pub(crate) fn upsert(&mut self, subnet: IpNet, vtep: IpAddr, now: Instant) {
        let (IpNet::V4(_), IpAddr::V4(vtep)) = (subnet, vtep) else {
            return;
        };
        if self.peers.get(&subnet).is_some_and(|e| e.vtep == vtep) {
            return;
        }
        self.remove(&subnet);
        let at = Tick::of(now);
        self.peers.insert(
            subnet,
            Search {
                vtep,
                lo: 0,
                hi: self.ceiling + 1,
                misses: 0,
                hint: None,
                in_flight: None,
                next_at: at,
                mtu: None,
                measured: None,
                research_at: Tick::of(now + RESEARCH),
            },
        );
        self.schedule.insert((at, subnet));
    }

    /// A peer gone.
    pub(crate) fn remove(&mut self, subnet: &IpNet) {
        self.remove_all(std::slice::from_ref(subnet));
    }

    /// Peers gone. A measured VTEP no peer left has goes back to the base
    /// size (one pass over the rest, however many went).
    pub(crate) fn remove_all(&mut self, subnets: &[IpNet]) {
        let mut measured = Vec::new();
        for subnet in subnets {
            let Some(e) = self.peers.remove(subnet) else {
                continue;
            };
            match e.in_flight {
                Some((seq, ..)) => {
                    self.by_seq.remove(&seq);
                }
                None => {
                    self.schedule.remove(&(e.next_at, *subnet));
                }
            }
            if e.mtu.is_some() {
                measured.push(e.vtep);
            }
        }
        if measured.is_empty() {
            return;
        }
        let left: std::collections::HashSet<Ipv4Addr> =
            self.peers.values().map(|e| e.vtep).collect();
        for vtep in measured {
            if !left.contains(&vtep) {
                self.changes.insert(vtep, None);
            }
        }
    }

    /// The peers are now `peers`: gone ones are forgotten.
    pub(crate) fn set_peers(&mut self, peers: &[(IpNet, IpAddr)], now: Instant) {
        self.remove_all(&super::gone(self.peers.keys(), peers));
        for (s, v) in peers {
            self.upsert(*s, *v, now);
        }
    }

    /// The size a search probes next, or None once it is done.
    fn next_size(&self, e: &Search) -> Option<u32> {
        let base = self.base();
        if e.lo == 0 {
            // A check of what was measured, then the base size, then
            // downwards.
            if let Some(m) = e.mtu
                && m < e.hi
            {
                return Some(m);
            }
            if e.hi > base {
                return Some(base);
            }
            return self.middle(FLOOR, e.hi);
        }
        if e.hi > self.ceiling {
            return (e.lo < self.ceiling).then_some(self.ceiling);
        }
        // Bisect over the sizes strictly between what was answered and
        // what was too big.
        self.middle(e.lo + 1, e.hi)
    }

    /// The middle one of the sizes searched in `from..to`.
    fn middle(&self, from: u32, to: u32) -> Option<u32> {
        let c = &self.candidates;
        let sizes = c.get(c.partition_point(|p| *p < from)..c.partition_point(|p| *p < to))?;
        sizes.get(sizes.len() / 2).copied()
    }

    /// Up to `budget` probes whose time has come: (target, size, seq),
    /// each now in flight. The target is the peer's overlay address; the
    /// size is the outer packet's (the echo request is 50 bytes smaller).
    pub(crate) fn due(&mut self, now: Instant, budget: usize) -> Vec<(IpAddr, u32, u16)> {
        let mut out = Vec::new();
        let mut done = Vec::new();
        let tick = Tick::of(now);
        while out.len() < budget {
            // The longest waiting first: a rate bound that binds delays
            // every peer alike instead of starving some.
            match self.schedule.first() {
                Some((at, _)) if *at <= tick => {}
                _ => break,
            }
            let (_, subnet) = self.schedule.pop_first().expect("looked at above");
            let Some(e) = self.peers.get(&subnet) else {
                continue;
            };
            // A hint: the size in use, checked; or the size it named,
            // where that was lost. Else what the search probes next.
            let (size, kind) = match e.hint {
                Some(Hint::Check(_)) => (Some(e.mtu.unwrap_or(self.base())), Kind::Check),
                Some(Hint::Next(n)) => (Some(n), Kind::Hinted),
                None => (self.next_size(e), Kind::Search),
            };
            let Some(size) = size else {
                done.push(subnet);
                continue;
            };
            let seq = self.next_seq();
            let e = self.peers.get_mut(&subnet).expect("listed above");
            if kind != Kind::Check {
                e.hint = None;
            }
            e.in_flight = Some((seq, size, kind));
            self.by_seq.insert(seq, subnet);
            self.in_flight.push_back((seq, subnet, now));
            self.probes += 1;
            out.push((subnet.network(), size, seq));
        }
        for subnet in done {
            self.finish(subnet, now);
        }
        out
    }

    /// A search with nothing left to probe: its result goes to the
    /// dataplane, and the path is checked again at its size later.
    fn finish(&mut self, subnet: IpNet, now: Instant) {
        let recheck = self.recheck;
        let Some(e) = self.peers.get_mut(&subnet) else {
            return;
        };
        let mtu = (e.lo > 0).then_some(e.lo);
        let base = self.ceiling.min(dataplane_common::DEFAULT_PATH_MTU);
        if mtu != e.mtu {
            tracing::info!(%subnet, vtep = %e.vtep, from = ?e.mtu, to = ?mtu, "path MTU to the peer");
            e.mtu = mtu;
            self.changes.insert(e.vtep, mtu);
        }
        // Found below the base size: the losses that led the search down
        // may have been a passing cut or congestion, not a smaller hop, so
        // the sizes above are tried again soon rather than in RESEARCH.
        if mtu.is_some_and(|m| m < base) {
            let soon = Tick::of(now + recheck * SHRUNK_RESEARCH_RECHECKS);
            e.research_at = e.research_at.min(soon);
        }
        if mtu.is_some() {
            e.measured = Stamp::now();
        }
        // The check: the measured size again (the search goes on from
        // there only if it is no longer answered), or upwards again now
        // and then, or from scratch where nothing was measured.
        let research = Tick::of(now) >= e.research_at;
        if research {
            e.research_at = Tick::of(now + RESEARCH);
        }
        e.hi = match e.mtu {
            Some(m) if !research => m + 1,
            _ => self.ceiling + 1,
        };
        e.lo = 0;
        e.misses = 0;
        self.reschedule(subnet, now + recheck);
    }

    fn next_seq(&mut self) -> u16 {
        loop {
            self.seq = self.seq.wrapping_add(1);
            if self.seq != 0 && !self.by_seq.contains_key(&self.seq) {
                return self.seq;
            }
        }
    }

    /// The probe `seq` was answered by `from`, with an echo of `echoed`
    /// bytes on the wire (a genuine answer echoes the probe's whole
    /// size: one of another size answers nothing).
    pub(crate) fn answered(&mut self, seq: u16, from: IpAddr, echoed: usize, now: Instant) {
        let Some(subnet) = self.by_seq.get(&seq).copied() else {
            return;
        };
        if subnet.network() != from {
            return;
        }
        let Some(e) = self.peers.get_mut(&subnet) else {
            return;
        };
        let Some((s, size, kind)) = e.in_flight else {
            return;
        };
        if s != seq || echoed != size.saturating_sub(dataplane_common::VXLAN_OVERHEAD) as usize {
            tracing::debug!(%subnet, seq, in_flight = s, size, echoed, "path MTU: an answer that is not the probe's");
            return;
        }
        self.by_seq.remove(&seq);
        e.in_flight = None;
        self.answered += 1;
        e.misses = 0;
        match kind {
            Kind::Check => {
                // The size in use is still carried: the hint was wrong (or
                // forged), and nothing changes; the answer counts as the
                // recheck of that size it is.
                e.hint = None;
                let vtep = e.vtep;
                self.hints_quiet.insert(vtep, Tick::of(now + self.recheck));
            }
            Kind::Hinted
                if size
                    < e.mtu
                        .unwrap_or(self.ceiling.min(dataplane_common::DEFAULT_PATH_MTU)) =>
            {
                // The size in use was lost and the one the hint named is
                // carried: in use at once (the search goes on upwards).
                tracing::info!(%subnet, vtep = %e.vtep, from = ?e.mtu, to = size, "path MTU to the peer (fragmentation needed, and the size in use lost)");
                e.mtu = Some(size);
                e.measured = Stamp::now();
                self.changes.insert(e.vtep, Some(size));
            }
            Kind::Hinted | Kind::Search => {}
        }
        let Some(e) = self.peers.get_mut(&subnet) else {
            return;
        };
        e.lo = e.lo.max(size);
        if e.hi <= e.lo {
            e.hi = self.ceiling + 1;
        }
        self.reschedule(subnet, now);
    }

    /// Probes whose time is up count as misses; a size missed [`TRIES`]
    /// times is too big. A measured size that is no longer answered
    /// starts the search again from below at once (its MTU goes back to
    /// the base size until then).
    pub(crate) fn expire(&mut self, now: Instant) {
        while let Some((seq, subnet, sent)) = self.in_flight.front().copied() {
            if now.duration_since(sent) < self.timeout {
                break;
            }
            self.in_flight.pop_front();
            if self.by_seq.get(&seq) != Some(&subnet) {
                continue; // answered, or the peer is gone
            }
            self.by_seq.remove(&seq);
            let Some(e) = self.peers.get_mut(&subnet) else {
                continue;
            };
            let Some((_, size, kind)) = e.in_flight.take() else {
                continue;
            };
            e.misses += 1;
            let check = kind == Kind::Check;
            if e.misses < TRIES && !check {
                self.reschedule(subnet, now + RETRY);
                continue;
            }
            e.misses = 0;
            if check {
                // The hint was right: the size in use is lost. The search
                // goes down, from the size the hint named.
                self.hints_confirmed += 1;
                e.hint = match e.hint {
                    Some(Hint::Check(h)) if h < size => Some(Hint::Next(h)),
                    _ => None,
                };
                tracing::info!(%subnet, vtep = %e.vtep, size, next = ?e.hint, "path MTU: the size in use is no longer carried, as fragmentation needed said");
            }
            if size <= FLOOR {
                // Not even the smallest size gets through: the path is
                // down, not small (a cut, a peer away). What was lost
                // meanwhile says nothing of its size: the search starts
                // over from the base size once the recheck comes.
                e.hi = self.ceiling + 1;
                e.lo = 0;
                e.hint = None;
                if e.mtu.take().is_some() {
                    self.changes.insert(e.vtep, None);
                }
                let recheck = self.recheck;
                self.reschedule(subnet, now + recheck);
                continue;
            }
            e.hi = size;
            if e.lo >= size {
                e.lo = 0;
            }
            if e.mtu.is_some_and(|m| size <= m) {
                // What was measured is no longer carried.
                e.lo = 0;
                if e.mtu.take().is_some() {
                    tracing::warn!(%subnet, vtep = %e.vtep, size, "the path to the peer no longer carries its measured MTU: searching again");
                    self.changes.insert(e.vtep, None);
                }
            }
            self.reschedule(subnet, now);
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

    /// Paths changed since the last call: VTEP -> MTU (None: the base).
    pub(crate) fn take_changes(&mut self) -> Vec<(Ipv4Addr, Option<u32>)> {
        self.changes.drain().collect()
    }

    /// The peer's path MTU and when it was measured (None: not yet).
    pub(crate) fn get(&self, subnet: &IpNet) -> Option<Measured> {
        let e = self.peers.get(subnet)?;
        Some(Measured {
            mtu: e.mtu?,
            at: e.measured?.time(),
        })
    }

    /// Every measured path MTU (for the metrics).
    pub(crate) fn measured(&self) -> impl Iterator<Item = (&IpNet, Ipv4Addr, u32)> {
        self.peers
            .iter()
            .filter_map(|(s, e)| Some((s, e.vtep, e.mtu?)))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
#[path = "path_mtu_tests.rs"]
mod tests;
