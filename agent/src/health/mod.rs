//! Continuous peer health: every peer probed through the tunnel at a low,
//! bounded rate, always on. A probe is an ICMP echo to the peer's overlay
//! address (its subnet's network address, which its overlay device holds:
//! Weft's `weft.<VNI>` and flannel's `flannel.<VNI>` alike), so an answer
//! means VXLAN passes both ways between the two nodes.
//!
//! One thread sends and receives on one raw socket per family; the
//! schedule is [`table`]'s. What it finds goes to the metrics (aggregates
//! by default: peers reachable and unreachable, a round-trip histogram;
//! per-peer series only with `--peer-metrics`, as they grow with the
//! square of the cluster) and to `weft status`.

mod metrics;
pub(crate) mod path_mtu;
pub(crate) mod table;
mod tick;

use std::{
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use ipnet::IpNet;

use crate::sys::{
    echo_sweep::{DRAIN_MAX, PROBE_SIZE},
    icmp::{Pinger, Received},
};
use path_mtu::PathMtus;
use table::{State, Table};

use crate::metrics::exposition::Histogram;

/// Upper bounds of the round-trip histogram, in seconds.
const RTT_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// How peers are probed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// How often each peer is probed (longer where `rate` needs it).
    pub interval: Duration,
    /// Probes a second this node sends at most, retries included.
    pub rate: f64,
    /// How long a probe waits for its answer.
    pub timeout: Duration,
    /// Export a series per peer, not only the aggregates.
    pub per_peer_metrics: bool,
    /// Measure each IPv4 peer's path MTU ([`path_mtu`]), up to this
    /// (the uplink's MTU); None: not measured.
    pub path_mtu: Option<u32>,
    /// The VXLAN UDP port: "fragmentation needed" about packets to it is a
    /// hint about a peer's path.
    pub port: u16,
    /// This node's IPv4 VTEP address: a hint must quote a packet from it.
    pub vtep: Option<std::net::Ipv4Addr>,
}

/// The subnets among `known` that are not in `peers`: what a table
/// forgets when the peer set becomes `peers`.
fn gone<'a>(known: impl Iterator<Item = &'a IpNet>, peers: &[(IpNet, IpAddr)]) -> Vec<IpNet> {
    let keep: std::collections::HashSet<&IpNet> = peers.iter().map(|(s, _)| s).collect();
    known.filter(|s| !keep.contains(s)).copied().collect()
}

/// One peer as `weft status` shows it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PeerHealth {
    pub subnet: IpNet,
    pub vtep: IpAddr,
    pub state: State,
    pub rtt: Option<Duration>,
    pub last_error: Option<String>,
    /// The path MTU measured to it (outer packet), and when.
    pub path_mtu: Option<path_mtu::Measured>,
}

struct Shared {
    table: Mutex<Table>,
    path: Option<Mutex<PathMtus>>,
    hist: Mutex<Histogram>,
    stop: AtomicBool,
    settings: Settings,
}

/// The running prober; stopped when dropped.
pub(crate) struct Prober {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the metrics render from (kept by the metrics after the agent
/// started the prober).
#[derive(Clone)]
pub(crate) struct HealthView(Arc<Shared>);

impl Prober {
    /// Starts probing (no peers yet). The thread inherits this thread's
    /// network namespace.
    pub(crate) fn start(settings: Settings) -> Result<Self> {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::new(
                settings.interval,
                health_rate(&settings),
                settings.timeout,
            )),
            path: settings.path_mtu.map(|ceiling| {
                Mutex::new(PathMtus::new(
                    ceiling,
                    settings.timeout,
                    settings.interval / PATH_RECHECKS_PER_INTERVAL,
                ))
            }),
            hist: Mutex::new(Histogram::new(&RTT_BUCKETS)),
            stop: AtomicBool::new(false),
            settings,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("weft-prober".into())
            .spawn(move || run(&s))
            .context("starting the peer prober")?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The peers are now `peers` (subnet, VTEP).
    pub(crate) fn set_peers(&self, peers: &[(IpNet, IpAddr)]) {
        self.shared
            .table
            .lock()
            .expect("prober lock")
            .set_peers(peers, Instant::now());
        if let Some(p) = &self.shared.path {
            p.lock()
                .expect("prober lock")
                .set_peers(peers, Instant::now());
        }
    }

    /// Path MTUs found or lost since the last call: IPv4 VTEP -> the
    /// largest outer packet its path carries (None: not measured).
    pub(crate) fn take_path_changes(&self) -> Vec<(std::net::Ipv4Addr, Option<u32>)> {
        self.shared
            .path
            .as_ref()
            .map_or_else(Vec::new, |p| p.lock().expect("prober lock").take_changes())
    }

    /// The uplink's MTU changed: paths are searched up to it, again.
    pub(crate) fn set_path_ceiling(&self, ceiling: u32) {
        if let Some(p) = &self.shared.path {
            p.lock()
                .expect("prober lock")
                .set_ceiling(ceiling, Instant::now());
        }
    }

    /// Peer changes, one by one (the full set comes with
    /// [`Prober::set_peers`] once the peer table is complete).
    pub(crate) fn apply(&self, updates: &[crate::peer::PeerUpdate]) {
        let now = Instant::now();
        let mut t = self.shared.table.lock().expect("prober lock");
        let mut path = self
            .shared
            .path
            .as_ref()
            .map(|p| p.lock().expect("prober lock"));
        // Path searches go in runs, each settled in one pass over the rest
        // (thousands of leases can go in one batch).
        let mut gone = Vec::new();
        for u in updates {
            match u {
                crate::peer::PeerUpdate::Upsert(p) => {
                    t.upsert(p.subnet, p.vtep, now);
                    if let Some(path) = &mut path {
                        path.remove_all(&std::mem::take(&mut gone));
                        path.upsert(p.subnet, p.vtep, now);
                    }
                }
                crate::peer::PeerUpdate::Remove(s) => {
                    t.remove(s);
                    gone.push(*s);
                }
            }
        }
        if let Some(path) = &mut path {
            path.remove_all(&gone);
        }
    }

    /// The peers' health, by subnet: all of them up to `limit`; beyond,
    /// those not reachable first (a report of 50,000 peers helps nobody).
    pub(crate) fn peers(&self, limit: usize) -> Vec<PeerHealth> {
        let t = self.shared.table.lock().expect("prober lock");
        // The `limit` first by (state, subnet), kept in a bounded heap: a
        // record is made for those only, not for every peer every second.
        let mut first: std::collections::BinaryHeap<(State, IpNet)> =
            std::collections::BinaryHeap::with_capacity(limit + 1);
        let all = t.len() <= limit;
        for (s, e) in t
            .peers()
            .filter(|(_, e)| all || e.state != State::Reachable)
        {
            first.push((e.state, *s));
            if first.len() > limit {
                first.pop();
            }
        }
        let timeout = t.timeout();
        let mut out: Vec<PeerHealth> = first
            .into_iter()
            .filter_map(|(_, s)| {
                let e = t.get(&s)?;
                Some(PeerHealth {
                    subnet: s,
                    vtep: e.vtep,
                    state: e.state,
                    rtt: e.rtt(),
                    last_error: e.last_error.as_ref().map(|m| m.describe(timeout)),
                    path_mtu: None,
                })
            })
            .collect();
        drop(t);
        if let Some(path) = &self.shared.path {
            let path = path.lock().expect("prober lock");
            for p in &mut out {
                p.path_mtu = path.get(&p.subnet);
            }
        }
        out.sort_by_key(|p| p.subnet);
        out
    }

    pub(crate) fn view(&self) -> HealthView {
        HealthView(self.shared.clone())
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The share of the rate bound path MTU probes have, where they are on.
const PATH_SHARE: f64 = 0.25;
/// A measured path is checked this many times per probe interval (rate
/// permitting): a path that shrank without the underlay saying so is
/// found within a quarter interval and two probe timeouts.
const PATH_RECHECKS_PER_INTERVAL: u32 = 4;

/// The health probes' rate: the bound, less the path probes' share.
fn health_rate(s: &Settings) -> f64 {
    let rate = s.rate.max(0.1);
    if s.path_mtu.is_some() {
        rate * (1.0 - PATH_SHARE)
    } else {
        rate
    }
}

/// A token bucket: `rate` a second, a quarter second's worth at once at
/// most (the bound holds over any window, not only on average).
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        let rate = rate.max(0.05);
        let burst = (rate / 4.0).max(1.0);
        Self {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Whole tokens available now.
    fn available(&mut self, now: Instant) -> usize {
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
        self.tokens.max(0.0) as usize
    }

    fn take(&mut self, n: usize) {
        self.tokens -= n as f64;
    }

    /// How long until a token is there.
    fn until_token(&self) -> Duration {
        Duration::from_secs_f64((1.0 - self.tokens).max(0.0) / self.rate)
    }
}

/// The prober's loop: expire, send what is due within the rate bound,
/// wait for answers until the next thing to do.
fn run(s: &Shared) {
    let mut pingers: [Option<Pinger>; 2] = [None, None];
    let mut path_pinger: Option<Pinger> = None;
    let mut health = Bucket::new(health_rate(&s.settings));
    let mut path_tokens = Bucket::new(s.settings.rate.max(0.1) * PATH_SHARE);
    let mut warned = [false; 2];
    while !s.stop.load(Relaxed) {
        let now = Instant::now();
        let tokens = health.available(now);
        let (due, next) = {
            let mut t = s.table.lock().expect("prober lock");
            t.expire(now);
            let due = t.due(now, tokens);
            (due, t.next_event())
        };
        health.take(due.len());
        for (_, target, seq) in due {
            let f = usize::from(target.is_ipv6());
            if pingers[f].is_none() {
                match Pinger::open(target.is_ipv6()) {
                    Ok(p) => pingers[f] = Some(p),
                    Err(e) if !warned[f] => {
                        warned[f] = true;
                        tracing::warn!(error = %format!("{e:#}"), "peer health: cannot open an ICMP socket");
                    }
                    Err(_) => {}
                }
            }
            let sent = match &pingers[f] {
                Some(p) => p
                    .send(target, seq, PROBE_SIZE)
                    .map_err(|e| format!("{e:#}")),
                None => Err("no ICMP socket".to_string()),
            };
            if let Err(why) = sent {
                s.table
                    .lock()
                    .expect("prober lock")
                    .failed(seq, why, Instant::now());
            }
        }
        // Each kind's next thing to do, once a token is there for it (a
        // probe due without one waits for the bucket, not in a spin).
        let mut next = next.map(|n| n.max(now + health.until_token()));
        if let Some(path) = &s.path {
            let budget = path_tokens.available(now);
            let (due, at) = {
                let mut p = path.lock().expect("prober lock");
                p.expire(now);
                let due = p.due(now, budget);
                (due, p.next_event())
            };
            path_tokens.take(due.len());
            let at = at.map(|n| n.max(now + path_tokens.until_token()));
            next = match (next, at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if !due.is_empty()
                && path_pinger.is_none()
                && let Some(vtep) = s.settings.vtep
            {
                match Pinger::open_path_probe(dataplane_common::PROBE_MARK, vtep, s.settings.port) {
                    Ok(p) => path_pinger = Some(p),
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "path MTU: cannot open the probe socket")
                    }
                }
            }
            if let Some(p) = &path_pinger {
                for (target, size, seq) in due {
                    let inner = size.saturating_sub(dataplane_common::VXLAN_OVERHEAD) as usize;
                    if let Err(e) = p.send(target, seq, inner) {
                        tracing::debug!(%target, size, error = %format!("{e:#}"), "path MTU probe not sent");
                    }
                }
            }
        }
        // Sleep until the next event (once a token is there for it), or
        // an answer.
        let wait = next
            .map_or(Duration::from_millis(200), |n| {
                n.saturating_duration_since(Instant::now())
            })
            .clamp(Duration::from_millis(1), Duration::from_millis(200));
        receive(s, &mut pingers, &mut path_pinger, wait);
    }
}

/// Waits up to `wait` for answers on the open sockets and books them.
fn receive(
    s: &Shared,
    pingers: &mut [Option<Pinger>; 2],
    path_pinger: &mut Option<Pinger>,
    wait: Duration,
) {
    let sockets = pingers
        .iter()
        .chain(std::iter::once(&*path_pinger))
        .flatten();
    match Pinger::any_readable(sockets, wait) {
        None => {
            std::thread::sleep(wait);
            return;
        }
        Some(false) => return,
        Some(true) => {}
    }
    if let (Some(p), Some(path)) = (path_pinger.as_mut(), &s.path) {
        let got = p.drain(DRAIN_MAX).unwrap_or_default();
        if !got.is_empty() {
            let now = Instant::now();
            let mut path = path.lock().expect("prober lock");
            for r in got {
                match r {
                    Received::Echo(e) => path.answered(e.seq, e.from, e.size, now),
                    // A hint quotes one of this node's VXLAN packets; it
                    // only makes the path be checked at its size.
                    Received::FragNeeded {
                        from,
                        to,
                        dport,
                        mtu,
                    } if dport == s.settings.port && Some(from) == s.settings.vtep => {
                        path.hint(to, u32::from(mtu), now)
                    }
                    Received::FragNeeded { .. } => {}
                }
            }
        }
    }
    for p in pingers.iter_mut().flatten() {
        let echoes: Vec<_> = p
            .drain(DRAIN_MAX)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| match r {
                Received::Echo(e) => Some(e),
                Received::FragNeeded { .. } => None,
            })
            .collect();
        if echoes.is_empty() {
            continue;
        }
        let now = Instant::now();
        let mut t = s.table.lock().expect("prober lock");
        for e in echoes {
            t.answered(e.seq, e.from, now);
        }
        let rtts = std::mem::take(&mut t.rtts);
        drop(t);
        let mut h = s.hist.lock().expect("prober lock");
        for r in rtts {
            h.observe(r.as_secs_f64());
        }
    }
}

impl HealthView {
    /// A view of a prober that never ran, with every family it can show
    /// (per-peer series and path MTU on): what the metrics reference lists.
    pub(crate) fn specimen() -> Self {
        let settings = Settings {
            interval: Duration::from_secs(1),
            rate: 1.0,
            timeout: Duration::from_secs(1),
            per_peer_metrics: true,
            path_mtu: Some(1500),
            port: 8472,
            vtep: None,
        };
        // One peer, answered once: its series show with their labels.
        let mut table = Table::new(settings.interval, settings.rate, settings.timeout);
        let now = std::time::Instant::now();
        let (subnet, vtep): (IpNet, IpAddr) = (
            "10.244.1.0/24".parse().expect("a subnet"),
            IpAddr::from([198, 18, 0, 1]),
        );
        table.upsert(subnet, vtep, now);
        for (_, to, seq) in table.due(now, 1) {
            table.answered(seq, to, now);
        }
        Self(Arc::new(Shared {
            table: Mutex::new(table),
            path: Some(Mutex::new(PathMtus::new(
                1500,
                settings.timeout,
                settings.interval,
            ))),
            hist: Mutex::new(Histogram::new(&RTT_BUCKETS)),
            stop: AtomicBool::new(true),
            settings,
        }))
    }
}
