//! The prober's metrics: peers by state, probes by outcome, round trips,
//! and the path MTUs measured (per peer only with `--peer-metrics`).

use ipnet::IpNet;

use super::{HealthView, State, table};
use crate::metrics::exposition::{Exposition, Kind};

impl HealthView {
    /// The prober's families, written to `e`.
    pub(crate) fn render(&self, e: &mut Exposition) {
        let s = &self.0;
        let t = s.table.lock().expect("prober lock");
        let (up, down, unknown) = t.counts();
        let tally = t.tally;
        e.gauge(
            "weft_peers_reachable",
            "Peers whose last probe through the tunnel was answered.",
            up,
        );
        e.gauge(
            "weft_peers_unreachable",
            &format!(
                "Peers that missed {} probes through the tunnel in a row.",
                table::MISSES
            ),
            down,
        );
        e.gauge(
            "weft_peers_unprobed",
            "Peers not yet answered nor missed enough.",
            unknown,
        );
        let mut f = e.family(
            "weft_peer_probes_total",
            Kind::Counter,
            "Probes sent to peers, by what became of them (failed: could not be sent).",
        );
        for (r, v) in [
            ("answered", tally.answered),
            ("lost", tally.lost),
            ("failed", tally.failed),
        ] {
            f.sample(&[("result", &r)], v);
        }
        e.gauge(
            "weft_peer_probe_period_seconds",
            "How long between two probes of one peer (the interval, longer where the rate bound needs it).",
            t.period().as_secs_f64(),
        );
        if s.settings.per_peer_metrics {
            let mut peers: Vec<_> = t.peers().collect();
            peers.sort_by_key(|(s, _)| **s);
            let mut f = e.family(
                "weft_peer_reachable",
                Kind::Gauge,
                "1 if the peer's last probe was answered, 0 if it is unreachable, -1 not yet known.",
            );
            for (subnet, p) in &peers {
                let v = match p.state {
                    State::Reachable => 1,
                    State::Unreachable => 0,
                    State::Unknown => -1,
                };
                f.sample(&[("subnet", subnet), ("vtep", &p.vtep)], v);
            }
            let mut f = e.family(
                "weft_peer_rtt_last_seconds",
                Kind::Gauge,
                "The peer's last answered probe's round trip.",
            );
            for (subnet, p) in &peers {
                if let Some(r) = p.rtt() {
                    f.sample(&[("subnet", subnet), ("vtep", &p.vtep)], r.as_secs_f64());
                }
            }
        }
        drop(t);
        if let Some(path) = &s.path {
            let p = path.lock().expect("prober lock");
            let mut measured: Vec<(IpNet, std::net::Ipv4Addr, u32)> =
                p.measured().map(|(s, v, m)| (*s, v, m)).collect();
            measured.sort();
            e.gauge(
                "weft_peers_path_mtu_measured",
                "IPv4 peers whose path MTU is measured (the others get the base size).",
                measured.len(),
            );
            e.gauge(
                "weft_peer_path_mtu_min_bytes",
                "The smallest path MTU measured to any peer (outer packet, 0: none measured).",
                measured.iter().map(|m| m.2).min().unwrap_or(0),
            );
            let mut f = e.family(
                "weft_path_mtu_probes_total",
                Kind::Counter,
                "Path MTU probes sent, by whether they were answered.",
            );
            f.sample(&[("result", &"answered")], p.answered);
            f.sample(
                &[("result", &"unanswered")],
                p.probes.saturating_sub(p.answered),
            );
            let mut f = e.family(
                "weft_path_mtu_hints_total",
                Kind::Counter,
                "ICMP fragmentation-needed messages naming a smaller path MTU for a peer, by whether a probe of that size confirmed it.",
            );
            f.sample(&[("result", &"confirmed")], p.hints_confirmed);
            f.sample(
                &[("result", &"not_confirmed")],
                p.hints.saturating_sub(p.hints_confirmed),
            );
            if s.settings.per_peer_metrics {
                let mut f = e.family(
                    "weft_peer_path_mtu_bytes",
                    Kind::Gauge,
                    "The path MTU measured to the peer (outer packet).",
                );
                for (subnet, vtep, m) in &measured {
                    f.sample(&[("subnet", subnet), ("vtep", vtep)], m);
                }
            }
        }
        e.histogram(
            "weft_peer_rtt_seconds",
            "Round trips of answered probes, across peers.",
            &s.hist.lock().expect("prober lock"),
        );
    }
}
