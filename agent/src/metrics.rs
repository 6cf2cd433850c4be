//! The agent's counters and gauges, rendered in Prometheus text format.

use std::{
    fmt::Write as _,
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

/// Bucket bounds (seconds) of the acquire latency histogram.
const ACQUIRE_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[derive(Default)]
pub struct Metrics {
    etcd_errors: AtomicU64,
    watch_resyncs: AtomicU64,
    malformed_leases: AtomicU64,
    leases_lost: AtomicU64,
    acquisitions: AtomicU64,
    out_of_subnets: AtomicU64,
    lease_changes_applied: AtomicU64,
    lease_held: AtomicBool,
    /// Unix time (s) at which our etcd lease expires if not renewed; 0 for
    /// a reservation (no TTL) or when nothing is held.
    lease_expires_at: AtomicI64,
    peers: AtomicU64,
    ready: AtomicBool,
    acquire_hist: Mutex<Histogram>,
}

#[derive(Default)]
struct Histogram {
    counts: [u64; ACQUIRE_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Metrics {
    pub fn inc_etcd_error(&self) {
        self.etcd_errors.fetch_add(1, Relaxed);
    }
    pub fn inc_watch_resync(&self) {
        self.watch_resyncs.fetch_add(1, Relaxed);
    }
    pub fn inc_malformed_lease(&self) {
        self.malformed_leases.fetch_add(1, Relaxed);
    }
    pub fn inc_lease_lost(&self) {
        self.leases_lost.fetch_add(1, Relaxed);
    }
    pub fn inc_out_of_subnets(&self) {
        self.out_of_subnets.fetch_add(1, Relaxed);
    }
    pub fn inc_lease_changes_applied(&self, n: u64) {
        self.lease_changes_applied.fetch_add(n, Relaxed);
    }
    pub fn set_peers(&self, n: u64) {
        self.peers.store(n, Relaxed);
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Relaxed);
    }
    pub fn ready(&self) -> bool {
        self.ready.load(Relaxed)
    }
    pub fn set_lease(&self, held: bool, expires_at_unix: i64) {
        self.lease_held.store(held, Relaxed);
        self.lease_expires_at.store(expires_at_unix, Relaxed);
    }
    pub fn lease_held(&self) -> bool {
        self.lease_held.load(Relaxed)
    }
    pub fn malformed_leases(&self) -> u64 {
        self.malformed_leases.load(Relaxed)
    }
    pub fn leases_lost(&self) -> u64 {
        self.leases_lost.load(Relaxed)
    }

    pub fn observe_acquire(&self, took: Duration) {
        self.acquisitions.fetch_add(1, Relaxed);
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

    /// The agent's own metrics in Prometheus text format (the dataplane's
    /// counters are appended by the caller).
    pub fn render(&self, now_unix: i64) -> String {
        let mut o = String::new();
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
        o
    }
}
