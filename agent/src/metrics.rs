//! The agent's counters and gauges, rendered in Prometheus text format.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

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
    watch_resyncs: AtomicU64,
    malformed_leases: AtomicU64,
    leases_lost: AtomicU64,
    out_of_subnets: AtomicU64,
    lease_changes_applied: AtomicU64,
    lease_held: AtomicBool,
    /// Unix time (s) at which our etcd lease expires if not renewed; 0 for
    /// a reservation (no TTL) or when nothing is held.
    lease_expires_at: AtomicI64,
    peers: AtomicU64,
    ready: AtomicBool,
    acquire_hist: Mutex<Histogram>,
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

#[derive(Default)]
struct Histogram {
    counts: [u64; ACQUIRE_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Metrics {
    pub(crate) fn inc_etcd_error(&self) {
        self.etcd_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn inc_etcd_reconnect(&self, ok: bool) {
        self.etcd_reconnects[usize::from(!ok)].fetch_add(1, Relaxed);
    }
    pub(crate) fn inc_watch_resync(&self) {
        self.watch_resyncs.fetch_add(1, Relaxed);
    }
    pub(crate) fn inc_malformed_lease(&self) {
        self.malformed_leases.fetch_add(1, Relaxed);
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
    #[cfg(test)]
    pub(crate) fn malformed_leases(&self) -> u64 {
        self.malformed_leases.load(Relaxed)
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
    }
    /// How long since the watch last knew it was current (None: never).
    pub(crate) fn watch_lag(&self) -> Option<Duration> {
        let at = self.watch_confirmed_ms.load(Relaxed);
        (at > 0).then(|| Duration::from_millis((now_ms() - at).max(0) as u64))
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
        let s = took.as_secs_f64();
        let mut h = self.acquire_hist.lock().expect("metrics lock");
        for (i, b) in ACQUIRE_BUCKETS.iter().enumerate() {
            if s <= *b {
                h.counts[i] += 1;
            }
        }
        h.sum += s;
        h.count += 1;
    }

    /// Every metric in Prometheus text format.
    pub(crate) fn render(&self, now_unix: i64) -> String {
        let mut o = String::new();
        render_process(&mut o);
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |o: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut o,
            "weft_etcd_errors_total",
            "etcd requests that failed.",
            self.etcd_errors.load(Relaxed),
        );
        counter(
            &mut o,
            "weft_watch_resyncs_total",
            "Times the lease watch restarted from a fresh list.",
            self.watch_resyncs.load(Relaxed),
        );
        counter(
            &mut o,
            "weft_malformed_leases_total",
            "Lease keys or values skipped as malformed.",
            self.malformed_leases.load(Relaxed),
        );
        counter(
            &mut o,
            "weft_lease_lost_total",
            "Times this node's lease was lost and re-acquired.",
            self.leases_lost.load(Relaxed),
        );
        counter(
            &mut o,
            "weft_out_of_subnets_total",
            "Acquisition attempts that found no free subnet.",
            self.out_of_subnets.load(Relaxed),
        );
        counter(
            &mut o,
            "weft_lease_changes_applied_total",
            "Peer lease changes applied to the dataplane.",
            self.lease_changes_applied.load(Relaxed),
        );
        gauge(
            &mut o,
            "weft_lease_held",
            "1 while this node holds its subnet lease.",
            self.lease_held.load(Relaxed) as u8 as f64,
        );
        let exp = self.lease_expires_at.load(Relaxed);
        let ttl = if exp > 0 {
            (exp - now_unix).max(0) as f64
        } else {
            -1.0
        };
        gauge(
            &mut o,
            "weft_lease_ttl_seconds",
            "Seconds until this node's etcd lease expires unless renewed (-1: no TTL or none held).",
            ttl,
        );
        gauge(
            &mut o,
            "weft_peers",
            "Remote subnets programmed in the dataplane.",
            self.peers.load(Relaxed) as f64,
        );
        gauge(
            &mut o,
            "weft_ready",
            "1 when the lease is held and the initial peer set is programmed.",
            self.ready.load(Relaxed) as u8 as f64,
        );
        let h = self.acquire_hist.lock().expect("metrics lock");
        let name = "weft_lease_acquire_seconds";
        let _ = writeln!(
            o,
            "# HELP {name} Time to acquire the subnet lease.\n# TYPE {name} histogram"
        );
        for (i, b) in ACQUIRE_BUCKETS.iter().enumerate() {
            let _ = writeln!(o, "{name}_bucket{{le=\"{b}\"}} {}", h.counts[i]);
        }
        let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(o, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
        drop(h);
        let name = "weft_leases_rejected";
        let _ = writeln!(
            o,
            "# HELP {name} Leases in etcd that are not programmed, by reason.\n# TYPE {name} gauge"
        );
        for (reason, n) in self.rejected.lock().expect("metrics lock").iter() {
            let _ = writeln!(o, "{name}{{reason=\"{reason}\"}} {n}");
        }
        let name = "weft_kernel_feature";
        let _ = writeln!(
            o,
            "# HELP {name} The kernel features the dataplane uses, as probed at start (available=\"false\": that feature is lost; `weft status` says what it costs).\n# TYPE {name} gauge"
        );
        for (feature, available) in self.kernel_features.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                o,
                "{name}{{feature=\"{}\",available=\"{available}\"}} 1",
                label(feature)
            );
        }
        let name = "weft_peer_problems";
        let _ = writeln!(
            o,
            "# HELP {name} Peers not programmed (map_full, map) or without their route (route), retried with backoff.\n# TYPE {name} gauge"
        );
        for (problem, n) in self.problems.lock().expect("metrics lock").iter() {
            let _ = writeln!(o, "{name}{{problem=\"{problem}\"}} {n}");
        }
        gauge(
            &mut o,
            "weft_subnet_file_current",
            "1 when subnet.env names the subnets this node holds; 0 while writing it fails (a full disk): a file naming other subnets is removed meanwhile, and the node is not ready.",
            f64::from(u8::from(self.subnet_file_current.load(Relaxed))),
        );
        gauge(
            &mut o,
            "weft_old_subnet_pods",
            "Local pods still on the subnet this node held before its lease was lost (the node is not ready until there are none).",
            self.old_subnet_pods.load(Relaxed) as f64,
        );
        gauge(
            &mut o,
            "weft_etcd_watch_lag_seconds",
            "Seconds since the lease watch last knew it was current (an event, a progress notification or a list); -1 before the first.",
            self.watch_lag().map_or(-1.0, |d| d.as_secs_f64()),
        );
        let name = "weft_etcd_watch_member";
        let _ = writeln!(
            o,
            "# HELP {name} The etcd member (id, hex) the lease watch last heard from.\n# TYPE {name} gauge"
        );
        let member = self.watch_member.load(Relaxed);
        if member != 0 {
            let _ = writeln!(o, "{name}{{member=\"{member:x}\"}} 1");
        }
        let name = "weft_etcd_endpoint_healthy";
        let _ = writeln!(
            o,
            "# HELP {name} 1 for an etcd endpoint that answers with a leader and is in the client's rotation (checked every 2 s with several endpoints).\n# TYPE {name} gauge"
        );
        for (ep, up) in self.etcd_members.lock().expect("metrics lock").iter() {
            let _ = writeln!(o, "{name}{{endpoint=\"{}\"}} {}", label(ep), u8::from(*up));
        }
        let name = "weft_etcd_reconnects_total";
        let _ = writeln!(
            o,
            "# HELP {name} Connections to etcd made again with the TLS files read again (they changed, or SIGHUP), by result (failed: the current connection is kept).\n# TYPE {name} counter"
        );
        for (i, result) in ["ok", "failed"].into_iter().enumerate() {
            let n = self.etcd_reconnects[i].load(Relaxed);
            let _ = writeln!(o, "{name}{{result=\"{result}\"}} {n}");
        }
        let name = "weft_repairs_total";
        let _ = writeln!(
            o,
            "# HELP {name} Things of Weft's found removed and put back (device, address, programs, routes, sysctls, nftables, forward_rules).\n# TYPE {name} counter"
        );
        for what in REPAIRS {
            let n = self
                .repairs
                .lock()
                .expect("metrics lock")
                .get(what)
                .copied()
                .unwrap_or(0);
            let _ = writeln!(o, "{name}{{what=\"{what}\"}} {n}");
        }
        gauge(
            &mut o,
            "weft_public_ip_conflict",
            "1 while another live node claims this node's public IP (see weft status).",
            if self.public_ip_conflict.load(Relaxed) {
                1.0
            } else {
                0.0
            },
        );
        gauge(
            &mut o,
            "weft_direct_peers",
            "Peers reached without encapsulation (DirectRouting: on the uplink's own subnet).",
            self.direct_peers.load(Relaxed) as f64,
        );
        if let Some((passed, failed)) = *self.selftest.lock().expect("metrics lock") {
            let name = "weft_selftest_cases";
            let _ = writeln!(
                o,
                "# HELP {name} This build's programs on the golden frames, run before any of them went into running links, by result.\n# TYPE {name} gauge\n{name}{{result=\"passed\"}} {passed}\n{name}{{result=\"failed\"}} {failed}"
            );
        }
        if self.programs_known.load(Relaxed) {
            gauge(
                &mut o,
                "weft_upgrade_refused",
                "1 while this build's programs failed their self-test and the programs that ran before this agent still run (see weft status).",
                if self.upgrade_refused.load(Relaxed) {
                    1.0
                } else {
                    0.0
                },
            );
            gauge(
                &mut o,
                "weft_programs_rolled_back",
                "1 once the previous programs were put back under this agent (weft rollback, or the agent itself when the new ones lost the peers).",
                if self.rolled_back.load(Relaxed) {
                    1.0
                } else {
                    0.0
                },
            );
            gauge(
                &mut o,
                "weft_programs_verified",
                "1 once the programs in the links have reached a sample of the peers through the tunnel (after a swap, or once the peer table is complete); 0 meanwhile, and the node is not ready.",
                f64::from(u8::from(self.programs_verified.load(Relaxed))),
            );
        }
        if let Some(h) = self.health.get() {
            h.render(&mut o);
        }
        if let Some(w) = &*self.wireguard.lock().expect("metrics lock") {
            render_wireguard(&mut o, w);
        }
        if let Some(c) = self.counters.get() {
            render_counters(&mut o, c);
        }
        if let Some(l) = self.liberal.get() {
            let name = "weft_conntrack_liberal_total";
            let _ = writeln!(
                o,
                "# HELP {name} Fast-path TCP flows whose conntrack entry was made liberal (marked), that ended first (gone), or could not be (failed; they stay on the host stack).\n# TYPE {name} counter"
            );
            for (result, v) in [
                ("marked", &l.marked),
                ("gone", &l.gone),
                ("failed", &l.failed),
            ] {
                let _ = writeln!(o, "{name}{{result=\"{result}\"}} {}", v.load(Relaxed));
            }
        }
        o
    }
}

/// A label value as the text format wants it: backslash, double quote
/// and newline escaped (etcd endpoints and peer names come from outside).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `weft_build_info` and the `process_*` families every Prometheus
/// exporter has (from /proc/self).
fn render_process(o: &mut String) {
    let _ = writeln!(
        o,
        "# HELP weft_build_info The running build: its version and the layout version of its pinned maps.\n# TYPE weft_build_info gauge\nweft_build_info{{version=\"{}\",map_layout=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        dataplane_common::LAYOUT_VERSION
    );
    let p = crate::sys::process::Usage::of_self();
    let rows: [(&str, &str, &str, f64); 6] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes as f64,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds as f64,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds as f64,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
    ];
    for (name, kind, help, v) in rows {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The wireguard backend's peers.
fn render_wireguard(o: &mut String, w: &WgMetrics) {
    let name = "weft_wireguard_peers";
    let _ = writeln!(
        o,
        "# HELP {name} WireGuard peers by their last handshake: within 180 s (recent), older (stale), never.\n# TYPE {name} gauge\n{name}{{handshake=\"recent\"}} {}\n{name}{{handshake=\"stale\"}} {}\n{name}{{handshake=\"never\"}} {}",
        w.recent, w.stale, w.never
    );
    if let Some(a) = w.oldest_handshake {
        let name = "weft_wireguard_handshake_age_max_seconds";
        let _ = writeln!(
            o,
            "# HELP {name} The oldest last handshake among the WireGuard peers that had one.\n# TYPE {name} gauge\n{name} {a}"
        );
    }
    for (name, help, v, per) in [
        (
            "weft_wireguard_received_bytes_total",
            "Bytes received from WireGuard peers (the current peers' sum).",
            w.rx_bytes,
            2,
        ),
        (
            "weft_wireguard_sent_bytes_total",
            "Bytes sent to WireGuard peers (the current peers' sum).",
            w.tx_bytes,
            3,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        if !w.per_peer.is_empty() {
            let pname = name.replace("weft_wireguard_", "weft_wireguard_peer_");
            let _ = writeln!(
                o,
                "# HELP {pname} {}\n# TYPE {pname} counter",
                help.replace(
                    "WireGuard peers (the current peers' sum)",
                    "each WireGuard peer"
                )
            );
            for p in &w.per_peer {
                let v = if per == 2 { p.2 } else { p.3 };
                let _ = writeln!(o, "{pname}{{peer=\"{}\"}} {v}", label(&p.0));
            }
        }
    }
    if !w.per_peer.is_empty() {
        let name = "weft_wireguard_peer_handshake_age_seconds";
        let _ = writeln!(
            o,
            "# HELP {name} Seconds since each peer's last handshake (peers that had one).\n# TYPE {name} gauge"
        );
        for p in &w.per_peer {
            if let Some(a) = p.1 {
                let _ = writeln!(o, "{name}{{peer=\"{}\"}} {a}", label(&p.0));
            }
        }
    }
}

/// The eBPF counters.
fn render_counters(o: &mut String, c: &Counters) {
    if let Ok(all) = c.all() {
        render_counter_rows(o, &all);
    }
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
        render_counter_rows(&mut o, &rows);
        o
    }
}

fn render_counter_rows(
    o: &mut String,
    all: &[(dataplane_common::Reason, dataplane_common::Counter)],
) {
    for (name, help, value) in [
        (
            "weft_dataplane_packets_total",
            "Packets seen by the eBPF programs, by outcome.",
            (|c: &dataplane_common::Counter| c.packets) as fn(&dataplane_common::Counter) -> u64,
        ),
        (
            "weft_dataplane_bytes_total",
            "Bytes seen by the eBPF programs, by outcome.",
            |c| c.bytes,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for (r, v) in all {
            let _ = writeln!(o, "{name}{{reason=\"{}\"}} {}", r.name(), value(v));
        }
    }
}
