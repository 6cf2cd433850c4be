//! The agent's counters and gauges: set by the loop and the lease layer,
//! rendered in Prometheus text format ([`render`]) through one writer
//! ([`exposition`]).

pub(crate) mod exposition;
mod render;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use self::exposition::{Exposition, Histogram};
use crate::dataplane::{Counters, LiberalStats};

/// What `weft_repairs_total` counts, all shown from the start.
const REPAIRS: [&str; 8] = [
    "bpffs",
    "device",
    "address",
    "programs",
    "routes",
    "sysctls",
    "nftables",
    "forward_rules",
];

/// Bucket bounds (seconds) of the acquire latency histogram.
const ACQUIRE_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[derive(Default)]
pub(crate) struct Metrics {
    etcd_errors: AtomicU64,
    /// Connections to etcd made again (TLS files changed, SIGHUP): made,
    /// failed (the current connection kept).
    etcd_reconnects: [AtomicU64; 2],
    watch_lists: AtomicU64,
    watch_resumes: AtomicU64,
    malformed_leases: AtomicU64,
    /// Keys of the last list that held no lease: no subnet key, no lease
    /// value.
    skipped_keys: [AtomicU64; 2],
    /// The lease watch's stream is open (false from its break until it
    /// hears from etcd again).
    watch_open: AtomicBool,
    leases_lost: AtomicU64,
    out_of_subnets: AtomicU64,
    lease_changes_applied: AtomicU64,
    lease_held: AtomicBool,
    /// Unix time (s) at which our etcd lease expires if not renewed; 0 for
    /// a reservation (no TTL) or when nothing is held.
    lease_expires_at: AtomicI64,
    peers: AtomicU64,
    ready: AtomicBool,
    acquire_hist: Mutex<AcquireHistogram>,
    /// Leases currently rejected, by reason.
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    /// Peers not (fully) programmed, by problem.
    problems: Mutex<BTreeMap<&'static str, u64>>,
    old_subnet_pods: AtomicU64,
    /// Whether subnet.env names the subnets held (0 while a write fails).
    subnet_file_current: AtomicBool,
    /// Things found removed and put back, by what.
    repairs: Mutex<BTreeMap<&'static str, u64>>,
    /// Peers reached without encapsulation (DirectRouting).
    direct_peers: AtomicU64,
    /// When (unix ms) the lease watch last knew it was current: a list, an
    /// event or a progress notification. 0: not yet.
    watch_confirmed_ms: AtomicI64,
    /// The etcd member the watch's last response came from.
    watch_member: AtomicU64,
    /// Each etcd endpoint: healthy and in rotation.
    etcd_members: Mutex<Vec<(String, bool)>>,
    /// The dataplane's packet counters, once it is up.
    counters: OnceLock<Arc<Counters>>,
    /// What the marking of fast-path flows as liberal did (host routing).
    liberal: OnceLock<Arc<LiberalStats>>,
    /// Another live node claims our public IP.
    public_ip_conflict: AtomicBool,
    /// This build's programs' self-test: cases passed, failed (None: not
    /// run yet).
    selftest: Mutex<Option<(usize, usize)>>,
    /// This build's programs failed it, the earlier ones still run.
    upgrade_refused: AtomicBool,
    /// `weft rollback` put the previous programs back.
    rolled_back: AtomicBool,
    programs_verified: AtomicBool,
    /// The dataplane's programs are in (the gauges above mean something).
    programs_known: AtomicBool,
    /// Continuous peer health, once probing.
    health: OnceLock<crate::health::HealthView>,
    /// The wireguard backend's peers, as last read from the kernel.
    wireguard: Mutex<Option<WgMetrics>>,
    /// The kernel's features, by name: available or not.
    kernel_features: Mutex<Vec<(String, bool)>>,
}

/// The wireguard backend's peers, for the metrics.
#[derive(Clone, Debug, Default)]
pub(crate) struct WgMetrics {
    /// Peers by handshake: within the last 180 s, older, never.
    pub recent: u64,
    pub stale: u64,
    pub never: u64,
    /// The oldest handshake among the peers that had one, in seconds.
    pub oldest_handshake: Option<u64>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Per peer (with `--peer-metrics`): key, handshake age, rx, tx.
    pub per_peer: Vec<(String, Option<u64>, u64, u64)>,
}

/// The acquire latency histogram (a type of its own for `Default`).
struct AcquireHistogram(Histogram);

impl Default for AcquireHistogram {
    fn default() -> Self {
        Self(Histogram::new(&ACQUIRE_BUCKETS))
    }
}

impl Metrics {
    pub(crate) fn inc_etcd_error(&self) {
        self.etcd_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn inc_etcd_reconnect(&self, ok: bool) {
        self.etcd_reconnects[usize::from(!ok)].fetch_add(1, Relaxed);
    }
    /// The watch read the whole prefix (and is current as of it).
    pub(crate) fn watch_listed(&self) {
        self.watch_lists.fetch_add(1, Relaxed);
        self.watch_confirmed();
    }
    pub(crate) fn inc_watch_resume(&self) {
        self.watch_resumes.fetch_add(1, Relaxed);
    }
    /// The watch's stream broke: not current until it hears again.
    pub(crate) fn watch_broken(&self) {
        self.watch_open.store(false, Relaxed);
    }
    /// Whether the watch's stream is open and has heard from etcd.
    pub(crate) fn watch_open(&self) -> bool {
        self.watch_open.load(Relaxed)
    }
    pub(crate) fn inc_malformed_leases(&self, n: u64) {
        self.malformed_leases.fetch_add(n, Relaxed);
    }
    pub(crate) fn set_skipped_keys(&self, keys: u64, values: u64) {
        self.skipped_keys[0].store(keys, Relaxed);
        self.skipped_keys[1].store(values, Relaxed);
    }

    pub(crate) fn inc_lease_lost(&self) {
        self.leases_lost.fetch_add(1, Relaxed);
    }
    pub(crate) fn inc_out_of_subnets(&self) {
        self.out_of_subnets.fetch_add(1, Relaxed);
    }
    pub(crate) fn inc_lease_changes_applied(&self, n: u64) {
        self.lease_changes_applied.fetch_add(n, Relaxed);
    }
    pub(crate) fn set_peers(&self, n: u64) {
        self.peers.store(n, Relaxed);
    }
    pub(crate) fn set_public_ip_conflict(&self, on: bool) {
        self.public_ip_conflict.store(on, Relaxed);
    }
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Relaxed);
    }
    pub(crate) fn ready(&self) -> bool {
        self.ready.load(Relaxed)
    }
    pub(crate) fn set_lease(&self, held: bool, expires_at_unix: i64) {
        self.lease_held.store(held, Relaxed);
        self.lease_expires_at.store(expires_at_unix, Relaxed);
    }
    pub(crate) fn lease_held(&self) -> bool {
        self.lease_held.load(Relaxed)
    }
    pub(crate) fn set_rejected(&self, by_reason: BTreeMap<&'static str, u64>) {
        *self.rejected.lock().expect("metrics lock") = by_reason;
    }
    pub(crate) fn set_problems(&self, by_kind: BTreeMap<&'static str, u64>) {
        *self.problems.lock().expect("metrics lock") = by_kind;
    }
    pub(crate) fn set_subnet_file_current(&self, current: bool) {
        self.subnet_file_current.store(current, Relaxed);
    }
    pub(crate) fn set_old_subnet_pods(&self, n: u64) {
        self.old_subnet_pods.store(n, Relaxed);
    }
    pub(crate) fn inc_repairs(&self, what: &'static str) {
        *self
            .repairs
            .lock()
            .expect("metrics lock")
            .entry(what)
            .or_default() += 1;
    }
    pub(crate) fn watch_confirmed(&self) {
        self.watch_confirmed_ms.store(now_ms(), Relaxed);
        self.watch_open.store(true, Relaxed);
    }
    /// How long since the watch last knew it was current (None: never):
    /// 0 while its stream is open (a quiet watch is current: the
    /// connection's keep-alives and its progress requests end a stream
    /// that is not), else the time since it last heard from etcd.
    pub(crate) fn watch_lag(&self) -> Option<Duration> {
        let at = self.watch_confirmed_ms.load(Relaxed);
        if at <= 0 {
            return None;
        }
        if self.watch_open() {
            return Some(Duration::ZERO);
        }
        Some(Duration::from_millis((now_ms() - at).max(0) as u64))
    }
    pub(crate) fn set_watch_member(&self, id: u64) {
        self.watch_member.store(id, Relaxed);
    }
    pub(crate) fn set_etcd_members(&self, members: Vec<(String, bool)>) {
        *self.etcd_members.lock().expect("metrics lock") = members;
    }
    /// `selftest`: cases passed and failed, where the self-test ran.
    pub(crate) fn set_programs(
        &self,
        selftest: Option<(usize, usize)>,
        refused: bool,
        rolled_back: bool,
        verified: bool,
    ) {
        *self.selftest.lock().expect("metrics lock") = selftest;
        self.programs_known.store(true, Relaxed);
        self.upgrade_refused.store(refused, Relaxed);
        self.rolled_back.store(rolled_back, Relaxed);
        self.programs_verified.store(verified, Relaxed);
    }
    pub(crate) fn set_health(&self, h: crate::health::HealthView) {
        let _ = self.health.set(h);
    }
    pub(crate) fn set_wireguard(&self, m: WgMetrics) {
        *self.wireguard.lock().expect("metrics lock") = Some(m);
    }
    pub(crate) fn set_kernel_features(&self, k: &crate::dataplane::KernelFeatures) {
        *self.kernel_features.lock().expect("metrics lock") = k
            .features
            .iter()
            .map(|f| (f.name.clone(), f.available))
            .collect();
    }
    pub(crate) fn set_direct_peers(&self, n: u64) {
        self.direct_peers.store(n, Relaxed);
    }
    pub(crate) fn set_counters(&self, c: Arc<Counters>) {
        let _ = self.counters.set(c);
    }
    pub(crate) fn set_liberal(&self, l: Arc<LiberalStats>) {
        let _ = self.liberal.set(l);
    }

    pub(crate) fn observe_acquire(&self, took: Duration) {
        self.acquire_hist
            .lock()
            .expect("metrics lock")
            .0
            .observe(took.as_secs_f64());
    }
}
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Metrics {
    /// Every family the agent can export, each once (a scrape of an agent
    /// running every feature: host routing, peer health with per-peer
    /// series and path MTU, the WireGuard backend, the self-test): what the
    /// metrics reference is generated from.
    pub(crate) fn specimen() -> String {
        let m = Self::default();
        *m.selftest.lock().expect("metrics lock") = Some((0, 0));
        m.programs_known.store(true, Relaxed);
        m.set_health(crate::health::HealthView::specimen());
        m.set_wireguard(WgMetrics {
            oldest_handshake: Some(0),
            per_peer: vec![("weft.1/key".into(), Some(0), 0, 0)],
            ..WgMetrics::default()
        });
        m.set_liberal(Arc::new(LiberalStats::default()));
        m.set_etcd_members(vec![("https://etcd:2379".into(), true)]);
        m.set_watch_member(1);
        *m.kernel_features.lock().expect("metrics lock") = vec![("tcx".into(), true)];
        m.set_rejected(BTreeMap::from([("overlaps", 0)]));
        m.set_problems(BTreeMap::from([("route", 0)]));
        let mut o = m.render(0);
        let zero = dataplane_common::Counter::default();
        let rows: Vec<_> = dataplane_common::Reason::ALL
            .iter()
            .map(|r| (*r, zero))
            .collect();
        let mut e = Exposition::default();
        render::counter_rows(&mut e, &rows);
        o.push_str(&e.into_string());
        o
    }
}
