//! The agent's start: the kernel probed, the host and the plan, etcd
//! reached, the first lease acquired, then the loop.
//!
//! Its log lines keep the target they had before the start had a file of
//! its own (`weft::agent`): operators' filters and alerts match
//! `weft::agent: starting`.

use super::*;

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
    tracing::info!(target: "weft::agent",
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
        tracing::info!(target: "weft::agent", %addr, "serving /healthz, /readyz and /metrics");
    }
    if args.metrics_port != 0 {
        let addr = SocketAddr::new(args.metrics_ip, args.metrics_port);
        crate::http::start(addr, metrics.clone(), crate::http::Serves::Metrics).await?;
        tracing::info!(target: "weft::agent", %addr, "serving /metrics");
    }

    let store = EtcdStore::connect_retrying(&opts, &metrics).await?;
    // Members that lose their leader or stop answering leave the rotation
    // (looked at when the watch breaks).
    let moved = Arc::new(tokio::sync::Notify::new());
    let trouble = Arc::new(tokio::sync::Notify::new());
    let members = tokio::spawn(lease::watch_members(
        store.clone(),
        metrics.clone(),
        moved.clone(),
        trouble.clone(),
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
        held: relocation::Held::default(),
        pods: endpoints::Pods::new(&args),
        subnet_env: subnet_file::SubnetEnvFile {
            path: args.subnet_file.clone(),
            config,
            uplink_mtu: plan.uplink_mtu,
            ip_masq: args.ip_masq,
            pending: false,
        },
        verify: verify::Verify::default(),
        health: peer_health::PeerHealth::new(&args),
        reporting: reporting::Reporting {
            reporter: Reporter::new(&args.state.state_dir),
            kernel: kernel.as_ref().map(report::Kernel::of),
            built: None,
        },
        inbox: Arc::new(lease::Inbox::default()),
        nodes: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        kept: Kept {
            path: lease::resume::path(&args.state.state_dir),
            prefix: format!("{prefix}/subnets/"),
            revision: 0,
            failing: None,
        },
    };
    // What the last stop kept: the leases known (the watch resumes from
    // them where etcd still holds their revision) and the key held.
    let kept = match lease::resume::load(&agent.kept.path, &agent.kept.prefix) {
        Ok(k) => k,
        Err(why) => {
            tracing::warn!(target: "weft::agent", reason = %why, "not resuming from the leases kept at the last stop");
            None
        }
    };
    let (kept_leases, kept_held) = match kept {
        Some(k) => (Some(k.leases), k.held),
        None => (None, None),
    };
    // rtnetlink reported a change: the loop checks the dataplane.
    let changed = Arc::new(tokio::sync::Notify::new());
    let events = match args.datapath {
        DatapathKind::Ebpf => Some(crate::dataplane::watch_changes(changed.clone())?),
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
            tracing::warn!(target: "weft::agent", error = %e, "ignoring the subnet file");
            None
        }
    };
    if let Some(p) = preferred {
        tracing::info!(target: "weft::agent", subnet = %p, file = %args.subnet_file.display(), "the subnet file names a subnet; it is tried only if free");
    }
    let held = agent.holder.start(preferred, kept_held).await;
    agent.took(&held).await?;
    agent.sync_endpoints().await;

    let watcher = tokio::spawn(
        lease::Watch {
            store: store.clone(),
            prefix: format!("{prefix}/subnets/"),
            inbox: agent.inbox.clone(),
            metrics: agent.metrics.clone(),
            moved,
            trouble,
            nodes: agent.nodes.clone(),
        }
        .run(kept_leases),
    );
    let r = agent.run(listener, &store, changed).await;
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
    let conntrack = k
        .found(crate::dataplane::kernel_features::CONNTRACK)
        .unwrap_or("unavailable");
    tracing::info!(target: "weft::agent",
        kernel = %k.release,
        probed = !k.cached,
        available = %k.features.iter().filter(|f| f.available).map(|f| f.name.as_str()).collect::<Vec<_>>().join(","),
        conntrack_kfuncs = conntrack,
        "kernel features"
    );
    for d in k.degraded() {
        tracing::warn!(target: "weft::agent", kernel = %k.release, feature = d.feature, "this kernel lacks an optional feature: {d}");
    }
    Ok(k)
}
