//! The agent's state to the metrics and the status report (`weft
//! status` reads it), each tick.

use super::*;

/// Where the status report goes, and what it says of the kernel.
pub(super) struct Reporting {
    pub(super) reporter: Reporter,
    /// The kernel's features, as probed at start (None: no dataplane).
    pub(super) kernel: Option<report::Kernel>,
    /// When the status report was last built (a lease batch within
    /// `REPORT_EVERY` of it leaves the report to the loop's next tick).
    pub(super) built: Option<std::time::Instant>,
}

/// Lease batches build the status report at most this often (its peers'
/// health and rejected leases cost a walk of thousands): a burst of lease
/// changes makes one report, not one per batch, and the next tick writes
/// what the burst left. Everything else (the tick, the node's own events,
/// a readiness change) builds it at once; the metrics are always kept.
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What made the report.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The tick or one of the node's own events.
    Event,
    /// A batch of lease changes.
    Batch,
}

impl Agent {
    /// The wireguard backend's peers, read from the kernel, to the
    /// metrics (aggregates; per peer with `--peer-metrics`).
    pub(super) fn wireguard_metrics(&self) {
        let Some(r) = self.dataplane.wireguard_peers() else {
            return;
        };
        let stats = match r {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot read the WireGuard devices' peers");
                return;
            }
        };
        let per_peer = self.health.settings.is_some_and(|p| p.per_peer_metrics);
        let mut m = crate::metrics::WgMetrics::default();
        for p in &stats {
            let age = crate::dataplane::wireguard::age(p.last_handshake);
            match age {
                None => m.never += 1,
                Some(a) if a <= crate::dataplane::wireguard::HANDSHAKE_RECENT_SECS => m.recent += 1,
                Some(_) => m.stale += 1,
            }
            m.oldest_handshake = m.oldest_handshake.max(age);
            m.rx_bytes += p.rx_bytes;
            m.tx_bytes += p.tx_bytes;
            if per_peer {
                m.per_peer.push((
                    format!("{}/{}", p.device, p.key),
                    age,
                    p.rx_bytes,
                    p.tx_bytes,
                ));
            }
        }
        self.metrics.set_wireguard(m);
    }

    /// The first rejected leases by key (a few thousand junk keys must not
    /// make every report that large).
    fn rejected_shown(&self) -> Vec<report::RejectedLease> {
        let mut shown: Vec<(&str, &crate::lease::Rejection)> = self.view.rejected().collect();
        shown.sort_unstable_by_key(|(k, _)| *k);
        shown
            .into_iter()
            .take(report::Report::REJECTED_SHOWN)
            .map(|(key, why)| report::RejectedLease {
                key: key.to_string(),
                reason: why.name().to_string(),
                detail: why.to_string(),
            })
            .collect()
    }

    /// Metrics and the status report, from the current state.
    pub(super) fn report(&mut self) {
        self.report_as(Why::Event);
    }

    /// After a batch of lease changes: the report waits for the tick when
    /// one was built within `REPORT_EVERY`.
    pub(super) fn report_batch(&mut self) {
        self.report_as(Why::Batch);
    }

    fn report_as(&mut self, why: Why) {
        let problems = self.dataplane.problems();
        let mut counts: BTreeMap<&'static str, u64> =
            ProblemKind::ALL.iter().map(|k| (k.name(), 0)).collect();
        for p in &problems {
            *counts.entry(p.kind.name()).or_default() += 1;
        }
        self.metrics.set_problems(counts);
        self.metrics
            .set_old_subnet_pods(self.held.old.map_or(0, |(_, n)| n as u64));
        self.metrics
            .set_direct_peers(self.dataplane.direct_peers().len() as u64);
        let ready = self.ready();
        let was = self.metrics.ready();
        self.metrics.set_ready(ready);
        if ready != was
            && let Some(subnets) = self.held.subnet
        {
            crate::sys::sd_notify::notify(&format!(
                "STATUS=holding {subnets}; {}",
                if ready {
                    "ready"
                } else {
                    "not ready (weft status says why)"
                }
            ));
        }
        let programs = self.dataplane.programs();
        if let Some(p) = &programs {
            let ran = p.selftest_cases > 0 || !p.selftest_failed.is_empty();
            self.metrics.set_programs(
                ran.then(|| {
                    (
                        p.selftest_cases - p.selftest_failed.len().min(p.selftest_cases),
                        p.selftest_failed.len(),
                    )
                }),
                p.upgrade_refused,
                p.rolled_back,
                p.verified,
            );
        }
        if why == Why::Event
            || ready != was
            || self
                .reporting
                .built
                .is_none_or(|t| t.elapsed() >= REPORT_EVERY)
        {
            self.reporting.built = Some(std::time::Instant::now());
        } else {
            return;
        }
        self.reporting.reporter.write(Report {
            peer_health: self
                .health
                .prober
                .as_ref()
                .map(|p| {
                    p.peers(REPORTED_PEERS)
                        .into_iter()
                        .map(|h| report::PeerHealth {
                            subnet: h.subnet.to_string(),
                            vtep: h.vtep.to_string(),
                            state: h.state.name().to_string(),
                            // To 0.1 ms: the report is rewritten when it
                            // changes.
                            rtt_us: h.rtt.map(|r| (r.as_micros() as u64 / 100) * 100),
                            error: h.last_error,
                            path_mtu: h.path_mtu.map(|m| m.mtu),
                            // To the 10 s: the report is rewritten when it
                            // changes, and paths are checked that often.
                            path_mtu_measured: h.path_mtu.and_then(|m| {
                                m.at.duration_since(std::time::UNIX_EPOCH)
                                    .ok()
                                    .map(|d| d.as_secs() / 10 * 10)
                            }),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            programs: programs.map(|p| report::Programs {
                selftest_cases: p.selftest_cases,
                selftest_failed: p.selftest_failed,
                upgrade_refused: p.upgrade_refused,
                rolled_back: p.rolled_back,
                rollback_reason: p.rollback_reason,
                verified: p.verified,
                ids: p.ids,
            }),
            subnet: self.held.subnet.map(|s| s.to_string()),
            ready,
            old_subnet: self.held.old.map(|(s, n)| report::OldSubnet {
                subnet: s.to_string(),
                pods: n,
            }),
            problems: problems
                .iter()
                .map(|p| report::PeerProblem {
                    subnet: p.peer.subnet.to_string(),
                    vtep: p.peer.vtep.to_string(),
                    problem: p.kind.name().to_string(),
                    error: p.error.clone(),
                })
                .collect(),
            host_routing: self.pods.host_routing.as_str().to_string(),
            endpoints: self.pods.endpoints,
            endpoints_adopted: self.pods.adopted,
            endpoints_rejected: self
                .pods
                .rejected
                .iter()
                .map(|(owner, why)| report::RejectedEndpoint {
                    owner: owner.clone(),
                    why: why.clone(),
                })
                .collect(),
            decap: self.dataplane.decap().map(|d| report::Decap {
                hook: d.hook.as_str().to_string(),
                why: d.why,
            }),
            masquerade: self.subnet_env.ip_masq,
            trace_drops: crate::dataplane::trace::on(),
            mtu: self.dataplane.mtu(),
            conflict: self
                .holder
                .conflict()
                .map(|c| report::IpConflict { node: c.node }),
            pid: Some(std::process::id()),
            kernel: self.reporting.kernel.clone(),
            rejected: self.rejected_shown(),
            rejected_total: self.view.rejected_count(),
            skipped_keys: self.view.skipped().total(),
            skipped_examples: self.view.skipped().examples.clone(),
        });
    }
}
