//! The scrape: every family the agent exports, grouped by what it is about
//! (the process, the lease, etcd, the dataplane, the programs), each group
//! a function.

use std::sync::atomic::Ordering::Relaxed;

use super::{
    Metrics, REPAIRS, WgMetrics,
    exposition::{Exposition, Kind},
};

impl Metrics {
    /// Every metric in Prometheus text format.
    pub(crate) fn render(&self, now_unix: i64) -> String {
        let mut e = Exposition::default();
        process(&mut e);
        self.lease(&mut e, now_unix);
        self.etcd(&mut e);
        self.dataplane(&mut e);
        self.programs(&mut e);
        if let Some(h) = self.health.get() {
            h.render(&mut e);
        }
        if let Some(w) = &*self.wireguard.lock().expect("metrics lock") {
            wireguard(&mut e, w);
        }
        if let Some(c) = self.counters.get()
            && let Ok(all) = c.all()
        {
            counter_rows(&mut e, &all);
        }
        if let Some(l) = self.liberal.get() {
            let mut f = e.family(
                "weft_conntrack_liberal_total",
                Kind::Counter,
                "Fast-path TCP flows whose conntrack entry was made liberal (marked), that ended first (gone), or could not be (failed; they stay on the host stack).",
            );
            for (result, v) in [
                ("marked", &l.marked),
                ("gone", &l.gone),
                ("failed", &l.failed),
            ] {
                f.sample(&[("result", &result)], v.load(Relaxed));
            }
            e.family(
                "weft_conntrack_marker_paused_total",
                Kind::Counter,
                "Times a conntrack marker thread spent its CPU budget and paused for the rest of a 100 ms window (flows waiting for their marking stay on the host stack meanwhile).",
            )
            .value(l.paused.load(Relaxed));
        }
        e.into_string()
    }

    /// This node's lease, and the leases of the others as the view sees
    /// them.
    fn lease(&self, e: &mut Exposition, now_unix: i64) {
        for (name, help, v) in [
            (
                "weft_etcd_errors_total",
                "etcd requests that failed.",
                &self.etcd_errors,
            ),
            (
                "weft_watch_lists_total",
                "Full lists of the subnets prefix by the lease watch: the first (unless a restart resumed from the leases kept), and one after each compaction of the history the watch needed.",
                &self.watch_lists,
            ),
            (
                "weft_watch_resumes_total",
                "Times the lease watch started again after the last revision it had delivered (etcd restarted, a leader change, a member out of rotation), without a list.",
                &self.watch_resumes,
            ),
            (
                "weft_malformed_leases_total",
                "Keys under the subnets prefix skipped because they hold no lease (in lists and in the watch's changes).",
                &self.malformed_leases,
            ),
            (
                "weft_lease_lost_total",
                "Times this node's lease was lost and re-acquired.",
                &self.leases_lost,
            ),
            (
                "weft_out_of_subnets_total",
                "Acquisition attempts that found no free subnet.",
                &self.out_of_subnets,
            ),
            (
                "weft_lease_changes_applied_total",
                "Peer lease changes applied to the dataplane.",
                &self.lease_changes_applied,
            ),
        ] {
            e.counter(name, help, v.load(Relaxed));
        }
        e.gauge(
            "weft_lease_held",
            "1 while this node holds its subnet lease.",
            u8::from(self.lease_held.load(Relaxed)),
        );
        let exp = self.lease_expires_at.load(Relaxed);
        let ttl = if exp > 0 { (exp - now_unix).max(0) } else { -1 };
        e.gauge(
            "weft_lease_ttl_seconds",
            "Seconds until this node's etcd lease expires unless renewed (-1: no TTL or none held).",
            ttl,
        );
        e.gauge(
            "weft_peers",
            "Remote subnets programmed in the dataplane.",
            self.peers.load(Relaxed),
        );
        e.gauge(
            "weft_ready",
            "1 when the lease is held and the initial peer set is programmed.",
            u8::from(self.ready.load(Relaxed)),
        );
        e.histogram(
            "weft_lease_acquire_seconds",
            "Time to acquire the subnet lease.",
            &self.acquire_hist.lock().expect("metrics lock").0,
        );
        let mut f = e.family(
            "weft_leases_rejected",
            Kind::Gauge,
            "Leases in etcd that are not programmed, by reason.",
        );
        for (reason, n) in self.rejected.lock().expect("metrics lock").iter() {
            f.sample(&[("reason", reason)], n);
        }
    }

    /// The kernel, the peers' problems, subnet.env, and etcd's members.
    fn etcd(&self, e: &mut Exposition) {
        let mut f = e.family(
            "weft_kernel_feature",
            Kind::Gauge,
            "The kernel features the dataplane uses, as probed at start (available=\"false\": that feature is lost; `weft status` says what it costs).",
        );
        for (feature, available) in self.kernel_features.lock().expect("metrics lock").iter() {
            f.sample(&[("feature", feature), ("available", available)], 1);
        }
        let mut f = e.family(
            "weft_peer_problems",
            Kind::Gauge,
            "Peers not programmed (map_full, map) or without their route (route), retried with backoff.",
        );
        for (problem, n) in self.problems.lock().expect("metrics lock").iter() {
            f.sample(&[("problem", problem)], n);
        }
        e.gauge(
            "weft_subnet_file_current",
            "1 when subnet.env names the subnets this node holds; 0 while writing it fails (a full disk): a file naming other subnets is removed meanwhile, and the node is not ready.",
            u8::from(self.subnet_file_current.load(Relaxed)),
        );
        e.gauge(
            "weft_old_subnet_pods",
            "Local pods still on the subnet this node held before its lease was lost (the node is not ready until there are none).",
            self.old_subnet_pods.load(Relaxed),
        );
        e.gauge(
            "weft_etcd_watch_lag_seconds",
            "Seconds since the lease watch last knew it was current: 0 while its stream is open, else since it last heard from etcd (an event, a progress notification or a list); -1 before the first.",
            self.watch_lag().map_or(-1.0, |d| d.as_secs_f64()),
        );
        let mut f = e.family(
            "weft_etcd_skipped_keys",
            Kind::Gauge,
            "Keys under the subnets prefix that held no lease in the watch's last list, by reason (key: it names no subnet; value: its value is no lease).",
        );
        for (i, reason) in ["key", "value"].into_iter().enumerate() {
            f.sample(&[("reason", &reason)], self.skipped_keys[i].load(Relaxed));
        }
        let mut f = e.family(
            "weft_etcd_watch_member",
            Kind::Gauge,
            "The etcd member (id, hex) the lease watch last heard from.",
        );
        let member = self.watch_member.load(Relaxed);
        if member != 0 {
            f.sample(&[("member", &format_args!("{member:x}"))], 1);
        }
        let mut f = e.family(
            "weft_etcd_endpoint_healthy",
            Kind::Gauge,
            "1 for an etcd endpoint that answers with a leader and is in the client's rotation (checked, with several endpoints, when a request or the watch fails, and again while one is out).",
        );
        for (ep, up) in self.etcd_members.lock().expect("metrics lock").iter() {
            f.sample(&[("endpoint", ep)], u8::from(*up));
        }
        let mut f = e.family(
            "weft_etcd_reconnects_total",
            Kind::Counter,
            "Connections to etcd made again with the TLS files read again (they changed, or SIGHUP), by result (failed: the current connection is kept).",
        );
        for (i, result) in ["ok", "failed"].into_iter().enumerate() {
            f.sample(
                &[("result", &result)],
                self.etcd_reconnects[i].load(Relaxed),
            );
        }
    }

    /// What was repaired, the public IP, direct routing.
    fn dataplane(&self, e: &mut Exposition) {
        let mut f = e.family(
            "weft_repairs_total",
            Kind::Counter,
            "Things of Weft's found removed and put back (device, address, programs, routes, sysctls, nftables, forward_rules).",
        );
        let repairs = self.repairs.lock().expect("metrics lock");
        for what in REPAIRS {
            f.sample(&[("what", &what)], repairs.get(what).copied().unwrap_or(0));
        }
        drop(repairs);
        e.gauge(
            "weft_public_ip_conflict",
            "1 while another live node claims this node's public IP (see weft status).",
            u8::from(self.public_ip_conflict.load(Relaxed)),
        );
        e.gauge(
            "weft_direct_peers",
            "Peers reached without encapsulation (DirectRouting: on the uplink's own subnet).",
            self.direct_peers.load(Relaxed),
        );
    }

    /// The programs: their self-test, an upgrade refused or rolled back,
    /// their check against the peers.
    fn programs(&self, e: &mut Exposition) {
        if let Some((passed, failed)) = *self.selftest.lock().expect("metrics lock") {
            let mut f = e.family(
                "weft_selftest_cases",
                Kind::Gauge,
                "This build's programs on the golden frames, run before any of them went into running links, by result.",
            );
            f.sample(&[("result", &"passed")], passed);
            f.sample(&[("result", &"failed")], failed);
        }
        if !self.programs_known.load(Relaxed) {
            return;
        }
        for (name, help, v) in [
            (
                "weft_upgrade_refused",
                "1 while this build's programs failed their self-test and the programs that ran before this agent still run (see weft status).",
                &self.upgrade_refused,
            ),
            (
                "weft_programs_rolled_back",
                "1 once the previous programs were put back under this agent (weft rollback, or the agent itself when the new ones lost the peers).",
                &self.rolled_back,
            ),
            (
                "weft_programs_verified",
                "1 once the programs in the links have reached a sample of the peers through the tunnel (after a swap, or once the peer table is complete); 0 meanwhile, and the node is not ready.",
                &self.programs_verified,
            ),
        ] {
            e.gauge(name, help, u8::from(v.load(Relaxed)));
        }
    }
}

/// `weft_build_info` and the `process_*` families every Prometheus
/// exporter has (from /proc/self).
fn process(e: &mut Exposition) {
    e.family(
        "weft_build_info",
        Kind::Gauge,
        "The running build: its version and the layout version of its pinned maps.",
    )
    .sample(
        &[
            ("version", &env!("CARGO_PKG_VERSION")),
            ("map_layout", &dataplane_common::LAYOUT_VERSION),
        ],
        1,
    );
    let p = crate::sys::process::Usage::of_self();
    e.counter(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        p.cpu_seconds,
    );
    for (name, help, v) in [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            p.resident_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            p.virtual_bytes as f64,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            p.open_fds as f64,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors.",
            p.max_fds as f64,
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
    ] {
        e.gauge(name, help, v);
    }
}

/// The wireguard backend's peers.
fn wireguard(e: &mut Exposition, w: &WgMetrics) {
    let mut f = e.family(
        "weft_wireguard_peers",
        Kind::Gauge,
        "WireGuard peers by their last handshake: within 180 s (recent), older (stale), never.",
    );
    for (handshake, n) in [("recent", w.recent), ("stale", w.stale), ("never", w.never)] {
        f.sample(&[("handshake", &handshake)], n);
    }
    if let Some(a) = w.oldest_handshake {
        e.gauge(
            "weft_wireguard_handshake_age_max_seconds",
            "The oldest last handshake among the WireGuard peers that had one.",
            a,
        );
    }
    type Bytes = fn(&(String, Option<u64>, u64, u64)) -> u64;
    for (name, peer_name, what, v, per) in [
        (
            "weft_wireguard_received_bytes_total",
            "weft_wireguard_peer_received_bytes_total",
            "Bytes received from",
            w.rx_bytes,
            (|p| p.2) as Bytes,
        ),
        (
            "weft_wireguard_sent_bytes_total",
            "weft_wireguard_peer_sent_bytes_total",
            "Bytes sent to",
            w.tx_bytes,
            |p| p.3,
        ),
    ] {
        e.counter(
            name,
            &format!("{what} WireGuard peers (the current peers' sum)."),
            v,
        );
        if !w.per_peer.is_empty() {
            let help = format!("{what} each WireGuard peer.");
            let mut f = e.family(peer_name, Kind::Counter, &help);
            for p in &w.per_peer {
                f.sample(&[("peer", &p.0)], per(p));
            }
        }
    }
    if !w.per_peer.is_empty() {
        let mut f = e.family(
            "weft_wireguard_peer_handshake_age_seconds",
            Kind::Gauge,
            "Seconds since each peer's last handshake (peers that had one).",
        );
        for p in &w.per_peer {
            if let Some(a) = p.1 {
                f.sample(&[("peer", &p.0)], a);
            }
        }
    }
}

/// The eBPF programs' counters, by outcome.
pub(super) fn counter_rows(
    e: &mut Exposition,
    all: &[(dataplane_common::Reason, dataplane_common::Counter)],
) {
    type Value = fn(&dataplane_common::Counter) -> u64;
    for (name, help, value) in [
        (
            "weft_dataplane_packets_total",
            "Packets seen by the eBPF programs, by outcome.",
            (|c| c.packets) as Value,
        ),
        (
            "weft_dataplane_bytes_total",
            "Bytes seen by the eBPF programs, by outcome.",
            |c| c.bytes,
        ),
    ] {
        let mut f = e.family(name, Kind::Counter, help);
        for (r, v) in all {
            f.sample(&[("reason", &r.name())], value(v));
        }
    }
}
