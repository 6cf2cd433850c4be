//! `weft agent`: the node daemon, wired together: the host probed and the
//! plan built ([`plan`]), then the lease holder, the dataplane and the lease
//! view driven by one event loop.
//!
//! lease holder (acquire, keep alive, lose, acquire again) → dataplane up
//! around the subnet → subnet.env → the lease view turns the watch into
//! peer updates → the dataplane applies them.
//!
//! This file is the loop; the start has a file ([`start`]), and so has each
//! thing the loop drives: the subnet held and moved ([`relocation`]),
//! subnet.env ([`subnet_file`]), the local pods ([`endpoints`]), the
//! programs' check ([`verify`]), peer health and path MTUs
//! ([`peer_health`]), metrics and the status report ([`reporting`]). Each
//! keeps its state in a struct of its own, a field of [`Agent`].

mod endpoints;
mod peer_health;
mod plan;
mod relocation;
mod reporting;
mod start;
mod subnet_file;
mod verify;

pub(crate) use self::start::run;

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use std::sync::atomic::AtomicUsize;

use tokio::signal::unix::{SignalKind, signal};

use self::plan::{Host, NodePlan};
use crate::{
    cli::{AgentArgs, DatapathKind},
    cni,
    dataplane::{Dataplane, HostRouting, PeerUpdate, ProblemKind, Verified},
    health,
    lease::{
        self, Batch, EnvFamily, EtcdStore, HeldLease, Inbox, LeaseHolder, LeaseView, NetworkConfig,
        SubnetEnv, Subnets,
    },
    metrics::Metrics,
    pods,
    report::{self, Report, Reporter},
};

/// A change that arrives within this long of the last batch waits this
/// long for others, and they are applied as one batch (each key's last
/// change): a trickle costs one decision per window, not one per change.
/// A change after a quiet while goes through at once.
const BATCH_WINDOW: Duration = Duration::from_millis(50);
/// A batch this large was a burst: what decoding it took is given back.
const BATCH_BURST: usize = 64;

/// The leases known are kept for a restart every this many 1 s ticks
/// (when they changed), and at a stop.
const KEEP_TICKS: u64 = 30;

/// The dataplane is checked (and repaired) every this many 1 s ticks, and
/// whenever rtnetlink reports a change.
/// How long after a failed check of the programs the next one starts.
const VERIFY_RETRY: Duration = Duration::from_secs(2);
const HEAL_EVERY_TICKS: u64 = 2;

/// The TLS files are checked for new contents every this many 1 s ticks.
const TLS_CHECK_TICKS: u64 = 5;

/// Peers whose health the status report lists (beyond, only those not
/// reachable).
const REPORTED_PEERS: usize = 1000;

/// What the event loop drives.
struct Agent {
    holder: LeaseHolder<EtcdStore>,
    view: LeaseView,
    dataplane: Dataplane,
    metrics: Arc<Metrics>,
    held: relocation::Held,
    pods: endpoints::Pods,
    subnet_env: subnet_file::SubnetEnvFile,
    verify: verify::Verify,
    health: peer_health::PeerHealth,
    reporting: reporting::Reporting,
    /// What the lease watch heard and the loop has not applied.
    inbox: Arc<Inbox>,
    /// The leases known (for the window etcd retries spread over).
    nodes: Arc<AtomicUsize>,
    /// The leases kept for a restart.
    kept: Kept,
}

/// Where the leases known are kept for a restart, and what was kept last.
struct Kept {
    path: PathBuf,
    prefix: String,
    /// The revision last written (0: none).
    revision: i64,
    /// Why the last write failed (said once).
    failing: Option<String>,
}

/// Connects to etcd again when the TLS files' contents changed (rotated
/// certificates, a Secret volume's update); keeps the current connection,
/// and tries again at the next check, when that fails (a half-written pair).
async fn reload_tls(store: &EtcdStore, metrics: &Metrics) {
    if !store.tls_files_changed() {
        return;
    }
    let r = store.reconnect().await;
    metrics.inc_etcd_reconnect(r.is_ok());
    match r {
        Ok(()) => {
            tracing::info!("the etcd TLS files changed: connected again with them");
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "the etcd TLS files changed but connecting with them failed; keeping the current connection and trying again")
        }
    }
}

impl Agent {
    /// The event loop: lease events, lease expiry, a tick for retries and
    /// checks, signals. Acquiring a lease again after a loss runs on a task
    /// of its own (it may wait long: a full pool, etcd away), so nothing
    /// here ever waits for it.
    async fn run(
        &mut self,
        mut listener: cni::Listener,
        store: &EtcdStore,
        changed: Arc<tokio::sync::Notify>,
    ) -> Result<()> {
        let mut acquiring: Option<tokio::task::JoinHandle<HeldLease>> = None;
        let r = self
            .serve(&mut acquiring, &mut listener, store, &changed)
            .await;
        self.keep(true);
        if let Some(a) = acquiring {
            a.abort();
        }
        r
    }

    async fn serve(
        &mut self,
        acquiring: &mut Option<tokio::task::JoinHandle<HeldLease>>,
        listener: &mut cni::Listener,
        store: &EtcdStore,
        changed: &tokio::sync::Notify,
    ) -> Result<()> {
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sighup = signal(SignalKind::hangup())?;
        // Ready for systemd only now that a SIGTERM is handled: one sent
        // right after READY=1 stops the agent as any other does.
        self.notify_ready();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        let mut heal_at: Option<tokio::time::Instant> = None;
        let mut last_batch: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    // A failure here is netlink's, not a peer's: logged,
                    // and the next tick tries again.
                    if let Err(e) = self.dataplane.retry_problems().await {
                        tracing::warn!(error = %format!("{e:#}"), "cannot retry the peers not yet programmed; trying again");
                    }
                    self.sync_endpoints().await;
                    self.check_old_subnet();
                    if self.subnet_env.pending {
                        self.publish_subnet_env();
                    }
                    self.verify_programs();
                    self.apply_path_mtus().await;
                    ticks += 1;
                    if ticks.is_multiple_of(HEAL_EVERY_TICKS) {
                        self.heal().await;
                    }
                    if ticks.is_multiple_of(TLS_CHECK_TICKS) {
                        reload_tls(store, &self.metrics).await;
                        self.wireguard_metrics();
                    }
                    if ticks.is_multiple_of(KEEP_TICKS) {
                        self.keep(false);
                    }
                    self.report();
                }
                () = changed.notified(), if heal_at.is_none() => {
                    // Let a burst of changes (a device going with its
                    // routes) settle, then look once; lease events go on
                    // being handled meanwhile.
                    heal_at = Some(tokio::time::Instant::now() + Duration::from_millis(100));
                }
                () = async { tokio::time::sleep_until(heal_at.expect("guarded")).await }, if heal_at.is_some() => {
                    heal_at = None;
                    self.heal().await;
                    self.report();
                }
                () = crate::dataplane::trace::changed() => {
                    let on = crate::dataplane::trace::on();
                    match self.dataplane.write_config() {
                        Ok(()) => tracing::info!(on, "the drop trace is switched"),
                        Err(e) => tracing::warn!(on, error = %format!("{e:#}"), "cannot switch the drop trace in the programs' config"),
                    }
                    self.report();
                }
                Some(done) = listener.next() => {
                    self.sync_endpoints().await;
                    let _ = done.send(());
                    self.report();
                }
                () = self.inbox.wait() => {
                    // In a trickle, let the rest of it arrive, then take
                    // each key's last change at once.
                    if last_batch.is_some_and(|t: tokio::time::Instant| t.elapsed() < 2 * BATCH_WINDOW) {
                        tokio::time::sleep(BATCH_WINDOW).await;
                    }
                    last_batch = Some(tokio::time::Instant::now());
                    let batch = self.inbox.take();
                    let large = batch.changes.len() >= BATCH_BURST || batch.snapshot.is_some();
                    if let Some(lost) = self.on_batch(batch).await?
                        && acquiring.is_none()
                    {
                        *acquiring = Some(self.relocate(&lost.why, lost.to.as_deref()));
                    }
                    if large {
                        // What decoding a burst took is free again.
                        crate::sys::memory::give_back();
                    }
                    self.report_batch();
                }
                () = self.holder.expired(), if acquiring.is_none() => {
                    *acquiring = Some(self.relocate("etcd expired our lease", None));
                    self.report();
                }
                held = async { acquiring.as_mut().expect("guarded").await }, if acquiring.is_some() => {
                    *acquiring = None;
                    let held = held.context("acquiring a subnet again")?;
                    self.relocated(held).await?;
                    self.report();
                }
                _ = sighup.recv() => {
                    // Certificates replaced on disk: connect with them.
                    let r = store.reconnect().await;
                    self.metrics.inc_etcd_reconnect(r.is_ok());
                    match r {
                        Ok(()) => tracing::info!("SIGHUP: reconnected to etcd, certificate files read again"),
                        Err(e) => tracing::error!(error = %format!("{e:#}"), "SIGHUP: cannot reconnect to etcd; keeping the current connection"),
                    }
                }
                _ = sigterm.recv() => {
                    tracing::info!("SIGTERM: exiting; the dataplane stays in place and the lease is kept");
                    self.dataplane.release_port().await;
                    return Ok(());
                }
                _ = sigint.recv() => {
                    tracing::info!("SIGINT: exiting; the dataplane stays in place and the lease is kept");
                    self.dataplane.release_port().await;
                    return Ok(());
                }
            }
        }
    }

    /// Applies a batch from the lease watch; returns our loss, if the
    /// batch says our lease is gone.
    async fn on_batch(&mut self, batch: Batch) -> Result<Option<lease::Lost>> {
        if batch.is_empty() {
            return Ok(None);
        }
        let out = self.view.apply(batch.snapshot, batch.changes);
        self.nodes.store(
            self.view.lease_count(),
            std::sync::atomic::Ordering::Relaxed,
        );
        // A batch that fails part-way (netlink not answering) stops nothing:
        // the map entries are in, and the periodic check puts in the routes
        // that are missing.
        if let Err(e) = self.apply(&out.updates).await {
            tracing::error!(error = %format!("{e:#}"), "applying lease changes failed part-way; the dataplane check repairs what is missing");
        }
        if let Some(revision) = out.synced {
            self.dataplane
                .synced(revision, &self.view.peer_subnets())
                .await?;
            self.held.synced = true;
            self.metrics.set_peers(self.dataplane.peer_count() as u64);
            if let Some(p) = &self.health.prober {
                p.set_peers(&self.dataplane.peer_targets());
                // The full list was built for this: give it back.
                crate::sys::memory::give_back();
            }
        }
        Ok(out.lost)
    }

    /// Puts back what something else removed from the dataplane, counts
    /// it, and rewrites subnet.env when the overlay MTU followed the
    /// uplink's.
    async fn heal(&mut self) {
        match self.dataplane.heal().await {
            Ok(h) => {
                for what in &h.repairs {
                    self.metrics.inc_repairs(what);
                    tracing::warn!(what, "something removed part of the dataplane: put back");
                }
                if h.mtu_changed {
                    self.publish_subnet_env();
                }
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot check the dataplane; trying again")
            }
        }
    }

    /// Ready: the lease is held, the peer set has been complete once, no
    /// local pod is left on an old subnet, and the lease watch is current
    /// (its stream open: a dead etcd ends it within seconds, through the
    /// connection's keep-alives, and a silent one within minutes, through
    /// its progress request; lease changes may be going unseen meanwhile,
    /// while the dataplane keeps forwarding).
    fn ready(&mut self) -> bool {
        self.holder.conflict().is_none()
            && self.metrics.lease_held()
            && self.held.synced
            && self.held.old.is_none()
            && !self.subnet_env.pending
            && self.dataplane.verified()
            && self.metrics.watch_open()
    }

    /// Writes the leases known for a restart, where they moved since the
    /// last write (`stopping`: whatever was written before). A failure
    /// (a full disk) is said once and costs only the next start a list.
    fn keep(&mut self, stopping: bool) {
        let Some(revision) = self.inbox.settled_revision() else {
            return;
        };
        if revision <= 0 || (revision == self.kept.revision && !stopping) {
            return;
        }
        let (cluster, leases) = self.view.known();
        let r = lease::resume::save(
            &self.kept.path,
            &self.kept.prefix,
            cluster,
            revision,
            self.holder.held(),
            leases,
        );
        match r {
            Ok(()) => {
                self.kept.revision = revision;
                self.kept.failing = None;
            }
            Err(e) => {
                let why = e.to_string();
                if self.kept.failing.as_deref() != Some(why.as_str()) {
                    tracing::warn!(file = %self.kept.path.display(), error = %why, "cannot keep the leases for the next start (it will list them)");
                }
                self.kept.failing = Some(why);
            }
        }
    }

    async fn apply(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.dataplane.apply(updates).await?;
        if let Some(p) = &self.health.prober {
            p.apply(updates);
        }
        self.metrics.inc_lease_changes_applied(updates.len() as u64);
        self.metrics.set_peers(self.dataplane.peer_count() as u64);
        Ok(())
    }
}
