//! Peer health beside the loop: the prober's settings from the flags, the
//! prober once the dataplane is up, and the path MTUs it measures handed
//! to the dataplane.

use super::*;

/// How peers are probed, and the prober once it runs.
pub(super) struct PeerHealth {
    /// None: peers are not probed.
    pub(super) settings: Option<health::Settings>,
    /// Continuous peer health, once the dataplane is up.
    pub(super) prober: Option<health::Prober>,
}

impl PeerHealth {
    pub(super) fn new(args: &AgentArgs) -> Self {
        let probes = args.datapath == DatapathKind::Ebpf && args.peer_probe_interval > 0.0;
        Self {
            settings: probes.then(|| health::Settings {
                interval: Duration::from_secs_f64(args.peer_probe_interval),
                rate: args.peer_probe_rate,
                timeout: Duration::from_secs(1),
                per_peer_metrics: args.peer_metrics,
                // Set once the dataplane knows the uplink.
                path_mtu: None,
                port: 0,
                vtep: None,
            }),
            prober: None,
        }
    }
}

impl Agent {
    /// Hands the path MTUs the prober measured (or lost) since the last
    /// tick to the dataplane, and the uplink's MTU to the prober.
    pub(super) async fn apply_path_mtus(&mut self) {
        let Some(p) = &self.health.prober else {
            return;
        };
        if let Some(ceiling) = self.dataplane.path_mtu_ceiling() {
            p.set_path_ceiling(ceiling);
        }
        let changes = p.take_path_changes();
        if changes.is_empty() {
            return;
        }
        if let Err(e) = self.dataplane.set_path_mtus(&changes).await {
            tracing::warn!(target: "weft::agent", error = %format!("{e:#}"), "cannot apply the measured path MTUs; the next check puts the routes right");
        }
    }
}
