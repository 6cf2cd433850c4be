//! `weft agent`: the node daemon, wired together: the host probed and the
//! plan built ([`plan`]), then the lease holder, the dataplane and the lease
//! view driven by one event loop.
//!
//! lease holder (acquire, keep alive, lose, acquire again) → dataplane up
//! around the subnet → subnet.env → the lease view turns the watch into
//! peer updates → the dataplane applies them.
//!
//! This file is the loop; what it drives each has a file: the subnet held
//! and moved ([`relocation`]), subnet.env ([`subnet_file`]), the local pods
//! ([`endpoints`]), the programs' check ([`verify`]), metrics and the
//! status report ([`reporting`]).

mod endpoints;
mod plan;
mod relocation;
mod reporting;
mod subnet_file;
mod verify;

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use self::plan::{Host, NodePlan};
use crate::{
    cli::{AgentArgs, DatapathKind},
    cni,
    dataplane::{Dataplane, HostRouting, PeerUpdate, ProblemKind, Verified},
    health,
    lease::{
        self, EnvFamily, EtcdStore, HeldLease, LeaseHolder, LeaseView, NetworkConfig, SubnetEnv,
        Subnets, WatchEvent,
    },
    metrics::Metrics,
    pods,
    report::{self, Report, Reporter},
};

/// Lease events applied as one batch at most.
const BATCH_MAX: usize = 16_384;
/// A batch this large is a burst: wait briefly for the rest of it.
const BATCH_BURST: usize = 64;

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

/// Not ready while the lease watch has not known itself current for this
/// long: lease changes may be going unseen (the dataplane keeps forwarding).
const WATCH_STALE: Duration = Duration::from_secs(15);

/// What the event loop drives.
struct Agent {
    holder: LeaseHolder<EtcdStore>,
    view: LeaseView,
    dataplane: Dataplane,
    metrics: Arc<Metrics>,
    reporter: Reporter,
    config: NetworkConfig,
    uplink_mtu: u32,
    subnet_file: PathBuf,
    cni_ipam_dir: PathBuf,
    /// Our subnets, once held.
    subnet: Option<Subnets>,
    /// Writing subnet.env for our subnets failed: the tick tries again,
    /// and the node is not ready until it is written.
    subnet_file_pending: bool,
    /// A check that the programs in the links reach the peers, running
    /// on a thread of its own (an exit does not wait for it).
    verifying: Option<std::thread::JoinHandle<Result<usize, String>>>,
    /// When the next such check may start (after one that failed).
    verify_at: Option<tokio::time::Instant>,
    /// The subnets we held before a loss moved us, while local pods still
    /// hold addresses in them.
    old_subnet: Option<(Subnets, usize)>,
    /// Whether the peer set has been complete once.
    synced: bool,
    state_dir: PathBuf,
    host_routing: HostRouting,
    /// Local pods host routing reaches directly.
    endpoints: usize,
    /// Pods of those that Weft's plugin did not attach.
    endpoints_adopted: usize,
    /// libcni's cache directory (results of attachments Weft did not make).
    cni_cache_dir: PathBuf,
    /// Registrations not fit for host routing: (owner, why).
    endpoints_rejected: Vec<(String, String)>,
    /// `--ip-masq` (FLANNEL_IPMASQ in subnet.env).
    ip_masq: bool,
    /// rtnetlink reported a change: check the dataplane now.
    changed: Arc<tokio::sync::Notify>,
    /// While a lost lease is acquired again, beside the loop: the subnets
    /// held before.
    relocating: Option<Option<Subnets>>,
    /// How peers are probed (None: not at all).
    probe: Option<health::Settings>,
    /// Continuous peer health, once the dataplane is up.
    prober: Option<health::Prober>,
    /// The kernel's features, as probed at start (None: no dataplane).
    kernel: Option<report::Kernel>,
}

pub(crate) async fn run(args: AgentArgs) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    crate::dataplane::trace::init(args.trace_drops);
    let opts = args.etcd.options();
    opts.validate()?;
    // A kernel the dataplane cannot run on is refused before anything is
    // taken: no lease for a node that could not forward. What it lacks of
    // the optional features is said once, each with what it costs.
    let kernel = match args.datapath {
        DatapathKind::Ebpf => Some(kernel_features(&args)?),
        DatapathKind::None => None,
    };
    if let Some(k) = &kernel {
        metrics.set_kernel_features(k);
    }
    let prefix = args.etcd.prefix();
    let mut host = Host::probe(&args).await?;
    host.kernel = kernel
        .as_ref()
        .map(crate::dataplane::ProgramKernel::of)
        .unwrap_or_default();
    tracing::info!(
        node_id = host.node_id,
        public_ip = %host.public_ip.map_or_else(|| "-".to_string(), |ip| ip.to_string()),
        uplink = host.uplink.as_ref().map_or("-", |l| l.name.as_str()),
        datapath = ?args.datapath,
        version = env!("CARGO_PKG_VERSION"),
        "starting"
    );

    if args.healthz_port != 0 {
        let addr = SocketAddr::new(args.healthz_ip, args.healthz_port);
        crate::http::start(addr, metrics.clone(), crate::http::Serves::All).await?;
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    }
    if args.metrics_port != 0 {
        let addr = SocketAddr::new(args.metrics_ip, args.metrics_port);
        crate::http::start(addr, metrics.clone(), crate::http::Serves::Metrics).await?;
        tracing::info!(%addr, "serving /metrics");
    }

    let store = EtcdStore::connect_retrying(&opts, &metrics).await?;
    // Members that lose their leader or stop answering leave the rotation.
    let moved = Arc::new(tokio::sync::Notify::new());
    let members = tokio::spawn(lease::watch_members(
        store.clone(),
        metrics.clone(),
        moved.clone(),
    ));
    let config =
        lease::wait_for_config(&store, &prefix, plan::retry_interval(&args), &metrics).await;
    host.complete(&args, &config).await?;
    let plan = NodePlan::build(&args, &config, host.clone(), opts.request_timeout)?;
    plan.log(&host, config.vni);
    let dataplane = match (plan.dataplane.clone(), plan.wireguard.clone()) {
        (Some(spec), _) => Dataplane::ebpf(spec),
        (None, Some(spec)) => Dataplane::wireguard(spec),
        (None, None) => Dataplane::off(),
    };
    let holder = LeaseHolder::new(
        store.clone(),
        &prefix,
        config.clone(),
        plan.me.clone(),
        plan.value.clone(),
        plan.timing,
        metrics.clone(),
    );
    let mut agent = Agent {
        holder,
        view: LeaseView::new(
            &format!("{prefix}/subnets/"),
            config.clone(),
            plan.me.clone(),
            metrics.clone(),
        ),
        dataplane,
        metrics,
        reporter: Reporter::new(&args.state.state_dir),
        config,
        uplink_mtu: plan.uplink_mtu,
        subnet_file: args.subnet_file.clone(),
        cni_ipam_dir: args.cni_ipam_dir.clone(),
        subnet: None,
        subnet_file_pending: false,
        verifying: None,
        verify_at: None,
        old_subnet: None,
        synced: false,
        state_dir: args.state.state_dir.clone(),
        host_routing: args.host_routing,
        endpoints: 0,
        endpoints_adopted: 0,
        cni_cache_dir: args.cni_cache_dir.clone(),
        endpoints_rejected: Vec::new(),
        ip_masq: args.ip_masq,
        changed: Arc::new(tokio::sync::Notify::new()),
        relocating: None,
        probe: (args.datapath == DatapathKind::Ebpf && args.peer_probe_interval > 0.0).then(|| {
            health::Settings {
                interval: Duration::from_secs_f64(args.peer_probe_interval),
                rate: args.peer_probe_rate,
                timeout: Duration::from_secs(1),
                per_peer_metrics: args.peer_metrics,
                // Set once the dataplane knows the uplink.
                path_mtu: None,
                port: 0,
                vtep: None,
            }
        }),
        prober: None,
        kernel: kernel.as_ref().map(report::Kernel::of),
    };
    let events = match args.datapath {
        DatapathKind::Ebpf => Some(crate::dataplane::watch_changes(agent.changed.clone())?),
        DatapathKind::None => None,
    };
    // The CNI plugin says when endpoints change; bound before the first
    // acquisition so no notification of a pod started meanwhile is lost
    // (it is read from the records anyway).
    let listener = {
        let m = agent.metrics.clone();
        cni::Listener::bind(&args.state.state_dir, move || m.ready())?
    };

    let preferred = match lease::read_subnet(&args.subnet_file) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring the subnet file");
            None
        }
    };
    if let Some(p) = preferred {
        tracing::info!(subnet = %p, file = %args.subnet_file.display(), "the subnet file names a subnet; it is tried only if free");
    }
    let held = agent.holder.acquire(preferred).await;
    agent.took(&held).await?;
    agent.sync_endpoints().await;

    let (watch_tx, watch_rx) = mpsc::channel(1024);
    let watcher = tokio::spawn(lease::watch(
        store.clone(),
        format!("{prefix}/subnets/"),
        watch_tx,
        agent.metrics.clone(),
        moved,
    ));
    let r = agent.run(watch_rx, listener, &store).await;
    crate::sys::sd_notify::notify("STOPPING=1");
    watcher.abort();
    members.abort();
    if let Some(e) = events {
        e.abort();
    }
    r
}

/// The running kernel's features (probed, or as probed earlier in this
/// boot), less those `--kernel-feature-off` turns off; an error naming
/// what is missing where the dataplane cannot run.
fn kernel_features(args: &AgentArgs) -> Result<crate::dataplane::KernelFeatures> {
    let mut k = crate::dataplane::KernelFeatures::probe(Some(&args.state.state_dir), true);
    if let Some(missing) = k.missing() {
        anyhow::bail!(
            "{missing}. Nothing was taken (no lease, no programs); `weft doctor` says the same. On this kernel, --datapath none holds a lease without forwarding"
        );
    }
    k.turn_off(&args.kernel_feature_off)?;
    tracing::info!(
        kernel = %k.release,
        probed = !k.cached,
        available = %k.features.iter().filter(|f| f.available).map(|f| f.name.as_str()).collect::<Vec<_>>().join(","),
        "kernel features"
    );
    for d in k.degraded() {
        tracing::warn!(kernel = %k.release, feature = d.feature, "this kernel lacks an optional feature: {d}");
    }
    Ok(k)
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
        mut watch_rx: mpsc::Receiver<WatchEvent>,
        mut listener: cni::Listener,
        store: &EtcdStore,
    ) -> Result<()> {
        let mut acquiring: Option<tokio::task::JoinHandle<HeldLease>> = None;
        let r = self
            .serve(&mut acquiring, &mut watch_rx, &mut listener, store)
            .await;
        if let Some(a) = acquiring {
            a.abort();
        }
        r
    }

    async fn serve(
        &mut self,
        acquiring: &mut Option<tokio::task::JoinHandle<HeldLease>>,
        watch_rx: &mut mpsc::Receiver<WatchEvent>,
        listener: &mut cni::Listener,
        store: &EtcdStore,
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
        let changed = self.changed.clone();
        let mut heal_at: Option<tokio::time::Instant> = None;
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
                    if self.subnet_file_pending {
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
                ev = watch_rx.recv() => {
                    let Some(ev) = ev else { return Ok(()) };
                    // Take whatever else is already queued and apply it as
                    // one batch (thousands of leases arrive together at start).
                    let mut batch = vec![ev];
                    loop {
                        let before = batch.len();
                        while batch.len() < BATCH_MAX {
                            match watch_rx.try_recv() {
                                Ok(ev) => batch.push(ev),
                                Err(_) => break,
                            }
                        }
                        // Many at once (thousands of leases written together):
                        // each decision looks at every lease, so gather the
                        // rest of the burst first, until a pause brings
                        // nothing more. A single change goes through at once.
                        let more = batch.len() > before;
                        if batch.len() < BATCH_BURST || batch.len() >= BATCH_MAX || !more {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let large = batch.len() >= BATCH_BURST;
                    if let Some(lost) = self.on_lease_events(batch).await?
                        && acquiring.is_none()
                    {
                        *acquiring = Some(self.relocate(&lost.why, lost.to.as_deref()));
                    }
                    if large {
                        // What decoding a burst took is free again.
                        crate::sys::memory::give_back();
                    }
                    self.report();
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

    /// Applies a batch of lease events; returns our loss, if the batch
    /// says our lease is gone.
    async fn on_lease_events(&mut self, batch: Vec<WatchEvent>) -> Result<Option<lease::Lost>> {
        let out = self.view.apply(batch);
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
            self.synced = true;
            self.metrics.set_peers(self.dataplane.peer_count() as u64);
            if let Some(p) = &self.prober {
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
    /// local pod is left on an old subnet, and the lease watch is current.
    fn ready(&mut self) -> bool {
        self.holder.conflict().is_none()
            && self.metrics.lease_held()
            && self.synced
            && self.old_subnet.is_none()
            && !self.subnet_file_pending
            && self.dataplane.verified()
            && self.metrics.watch_lag().is_some_and(|l| l < WATCH_STALE)
    }

    /// Hands the path MTUs the prober measured (or lost) since the last
    /// tick to the dataplane, and the uplink's MTU to the prober.
    async fn apply_path_mtus(&mut self) {
        let Some(p) = &self.prober else {
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
            tracing::warn!(error = %format!("{e:#}"), "cannot apply the measured path MTUs; the next check puts the routes right");
        }
    }

    async fn apply(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.dataplane.apply(updates).await?;
        if let Some(p) = &self.prober {
            p.apply(updates);
        }
        self.metrics.inc_lease_changes_applied(updates.len() as u64);
        self.metrics.set_peers(self.dataplane.peer_count() as u64);
        Ok(())
    }
}
