//! `weft agent`: the node daemon.
//!
//! acquire the lease → set up the host and the dataplane → write subnet.env →
//! apply the initial lease list → follow the watch, keep the lease alive, and
//! go back through the fenced acquisition whenever the lease is lost.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use rand::SeedableRng as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    task::JoinHandle,
    time::{Instant, sleep},
};

use crate::{
    cli::{AgentArgs, DatapathKind},
    datapath::Datapath,
    dataplane::netlink::Netlink,
    lease::{
        acquire::{self, AcquireError, AcquireRequest, HeldLease, Identity},
        attrs::LeaseAttrs,
        config::NetworkConfig,
        etcd::EtcdStore,
        keeper::{self, KeeperConfig, Loss},
        store::Store as _,
        subnet::Ipv4Net,
        subnet_file::{self, SubnetEnv},
        watch::{self, LeaseEvent},
    },
    mac::MacAddr,
    metrics::Metrics,
    node,
    peers::{self, Me},
};

/// Everything the running agent keeps.
struct Agent {
    args: AgentArgs,
    store: EtcdStore,
    metrics: Arc<Metrics>,
    prefix: String,
    config: NetworkConfig,
    me: Identity,
    value: LeaseAttrs,
    uplink_mtu: u32,
    rng: rand::rngs::StdRng,
    /// An etcd lease granted but not (yet) attached, with when it was granted.
    spare_lease: Option<(i64, Instant)>,
    held: HeldLease,
    keeper: Option<JoinHandle<()>>,
    lost_tx: mpsc::Sender<(i64, Loss)>,
    datapath: Datapath,
}

pub async fn run(args: AgentArgs) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let node_id = node::node_id(args.node_id.as_deref(), Path::new("/etc/machine-id"))?;
    let opts = args.etcd.options();
    opts.validate()?;
    let prefix = args.etcd.prefix();

    // The uplink: needed by the eBPF datapath; with `--datapath none` and a
    // given --public-ip, the address need not be local (tests, dry runs).
    let nl = Netlink::new()?;
    let (uplink, public_ip) = match (args.datapath, args.public_ip, args.iface.as_deref()) {
        (DatapathKind::None, Some(ip), None) => (None, ip),
        _ => {
            let (l, ip) = node::uplink(&nl, args.iface.as_deref(), args.public_ip).await?;
            (Some(l), ip)
        }
    };
    let uplink_mtu = uplink.as_ref().map(|l| l.mtu).unwrap_or(1500);
    tracing::info!(
        node_id,
        %public_ip,
        uplink = uplink.as_ref().map(|l| l.name.as_str()).unwrap_or("-"),
        datapath = ?args.datapath,
        version = env!("CARGO_PKG_VERSION"),
        "starting"
    );

    let counters: crate::datapath::CountersSlot = Default::default();
    let datapath = Datapath::new(&args, uplink.clone(), public_ip, counters.clone()).await?;

    if args.healthz_port != 0 {
        let addr = SocketAddr::new(args.healthz_ip, args.healthz_port);
        let listener = crate::http::bind(addr).await?;
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
        let m = metrics.clone();
        let m2 = metrics.clone();
        let counters = counters.clone();
        tokio::spawn(crate::http::serve(
            listener,
            Arc::new(move || m.ready()),
            Arc::new(move || {
                let mut s = m2.render(keeper::unix_now());
                if let Some(c) = counters.get() {
                    s.push_str(&crate::datapath::render_counters(c));
                }
                s
            }),
        ));
    }

    let store = EtcdStore::connect(&opts).await?;
    let config = wait_for_config(&store, &prefix, &args, &metrics).await;
    for note in &config.ignored {
        tracing::warn!("network config: ignoring {note}");
    }
    let vtep_mac = MacAddr::derived(format!("{node_id}/{public_ip}").as_bytes());
    let me = Identity {
        node_id: node_id.clone(),
        public_ip,
    };
    let value = LeaseAttrs::vxlan(public_ip, config.vni, vtep_mac, &node_id);
    let preferred = match subnet_file::read_subnet(&args.subnet_file) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring the subnet file");
            None
        }
    };
    if let Some(p) = preferred {
        tracing::info!(subnet = %p, file = %args.subnet_file.display(), "the subnet file names a subnet; it is tried only if free");
    }

    let (lost_tx, mut lost_rx) = mpsc::channel(4);
    let mut agent = Agent {
        store,
        metrics,
        prefix,
        config,
        me,
        value,
        uplink_mtu,
        rng: rand::rngs::StdRng::from_os_rng(),
        spare_lease: None,
        held: HeldLease {
            subnet: "0.0.0.0/32".parse().expect("valid"),
            key: String::new(),
            lease_id: 0,
            create_revision: 0,
            mod_revision: 0,
            attrs: LeaseAttrs::vxlan(public_ip, 1, vtep_mac, &node_id),
        },
        keeper: None,
        lost_tx,
        datapath,
        args,
    };
    agent.held = agent.acquire_until_held(preferred).await;
    agent.took_lease().await?;

    let (watch_tx, mut watch_rx) = mpsc::channel(1024);
    let watcher = tokio::spawn(watch::run(
        agent.store.clone(),
        format!("{}/subnets/", agent.prefix),
        watch_tx,
        agent.metrics.clone(),
    ));

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    loop {
        tokio::select! {
            ev = watch_rx.recv() => {
                let Some(ev) = ev else { break };
                // Take whatever else is already queued, and apply it as one
                // batch (thousands of leases arrive together at start).
                let mut batch = vec![ev];
                while batch.len() < 4096 {
                    match watch_rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(_) => break,
                    }
                }
                agent.on_lease_events(batch).await?;
            }
            Some((lease_id, loss)) = lost_rx.recv() => {
                if lease_id == agent.held.lease_id {
                    agent.lost(&format!("{loss:?}: etcd no longer has lease {lease_id:x}")).await?;
                }
            }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: exiting; the dataplane stays in place and the lease is kept"); break; }
            _ = sigint.recv() => { tracing::info!("SIGINT: exiting; the dataplane stays in place and the lease is kept"); break; }
        }
    }
    watcher.abort();
    if let Some(k) = agent.keeper.take() {
        k.abort();
    }
    Ok(())
}

/// Reads `<prefix>/config` until it exists and is valid, saying why not.
async fn wait_for_config(
    store: &EtcdStore,
    prefix: &str,
    args: &AgentArgs,
    metrics: &Metrics,
) -> NetworkConfig {
    let key = format!("{prefix}/config");
    let mut failures = 0u32;
    loop {
        let wait = Duration::from_secs(args.retry_interval.max(1));
        match store.get(&key).await {
            Ok(Some(kv)) => match NetworkConfig::parse(&kv.value) {
                Ok(c) => {
                    tracing::info!(
                        network = %c.network,
                        subnet_len = c.subnet_len,
                        vni = c.vni,
                        port = c.port,
                        "network config"
                    );
                    return c;
                }
                Err(e) => {
                    tracing::error!(key, error = %e, retry_in = ?wait, "the network config is unusable; fix it in etcd")
                }
            },
            Ok(None) => tracing::error!(
                key,
                retry_in = ?wait,
                "no network config in etcd; write one, e.g. {{\"Network\":\"10.244.0.0/16\",\"Backend\":{{\"Type\":\"vxlan\"}}}}"
            ),
            Err(e) => {
                metrics.inc_etcd_error();
                failures += 1;
                let wait = backoff(failures);
                tracing::warn!(endpoints = %args.etcd.etcd_endpoints.join(","), error = %e, retry_in = ?wait, "etcd unreachable; retrying");
                sleep(wait).await;
                continue;
            }
        }
        sleep(wait).await;
    }
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis((250u64 << failures.min(5)).min(5_000))
}

impl Agent {
    fn ttl(&self) -> Duration {
        Duration::from_secs(self.args.subnet_lease_ttl)
    }

    /// Acquires a subnet, retrying forever (out of subnets, lost races, etcd
    /// down) with a log line saying why.
    async fn acquire_until_held(&mut self, preferred: Option<Ipv4Net>) -> HeldLease {
        let subnets_prefix = format!("{}/subnets/", self.prefix);
        let mut failures = 0u32;
        let started = Instant::now();
        loop {
            // A granted lease is reused while it has most of its TTL left.
            let reuse = self
                .spare_lease
                .filter(|(_, at)| at.elapsed() < self.ttl() / 2)
                .map(|(id, _)| id);
            let req = AcquireRequest {
                subnets_prefix: &subnets_prefix,
                config: &self.config,
                me: &self.me,
                value: &self.value,
                ttl: self.args.subnet_lease_ttl as i64,
                preferred,
                lease_id: reuse,
            };
            let (r, stats, lease) = acquire::acquire(&self.store, &req, &mut self.rng).await;
            if lease != reuse {
                self.spare_lease = lease.map(|id| (id, Instant::now()));
            }
            match r {
                Ok(held) => {
                    self.spare_lease = None;
                    self.metrics.observe_acquire(started.elapsed());
                    tracing::info!(
                        subnet = %held.subnet,
                        key = %held.key,
                        lease = if held.is_reservation() { "reservation".to_string() } else { format!("{:x}", held.lease_id) },
                        requests = stats.requests,
                        retries = stats.retries,
                        took = ?started.elapsed(),
                        "acquired the subnet lease"
                    );
                    return held;
                }
                Err(e @ AcquireError::OutOfSubnets { .. }) => {
                    self.metrics.inc_out_of_subnets();
                    let wait = Duration::from_secs(self.args.retry_interval.max(1));
                    tracing::error!(error = %e, retry_in = ?wait, "no subnet for this node");
                    sleep(wait).await;
                }
                Err(e @ AcquireError::Contended(_)) => {
                    let wait = Duration::from_millis(rand::random_range(100..1000));
                    tracing::warn!(error = %e, retry_in = ?wait, "subnet contention; trying again");
                    sleep(wait).await;
                }
                Err(AcquireError::Store(e)) => {
                    self.metrics.inc_etcd_error();
                    // The granted lease may have been lost with the outage.
                    self.spare_lease = None;
                    failures += 1;
                    let wait = backoff(failures);
                    tracing::warn!(error = %e, retry_in = ?wait, "etcd unreachable while acquiring a subnet; retrying");
                    sleep(wait).await;
                }
            }
        }
    }

    /// After acquiring: subnet.env, dataplane, keep-alive.
    async fn took_lease(&mut self) -> Result<()> {
        let held = self.held.clone();
        let expires = if held.is_reservation() {
            0
        } else {
            keeper::unix_now() + self.args.subnet_lease_ttl as i64
        };
        self.metrics.set_lease(true, expires);
        let env = SubnetEnv {
            network: self.config.network,
            subnet: held.subnet,
            mtu: self.uplink_mtu - dataplane_common::VXLAN_OVERHEAD,
            ipmasq: false,
        };
        env.write(&self.args.subnet_file)
            .with_context(|| format!("writing {}", self.args.subnet_file.display()))?;
        tracing::info!(file = %self.args.subnet_file.display(), subnet = %held.subnet, mtu = env.mtu, "wrote the subnet file");
        self.datapath.set_own(&held, &self.config).await?;
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        if !held.is_reservation() {
            self.keeper = Some(tokio::spawn(keeper::keep_alive(
                self.store.clone(),
                KeeperConfig {
                    lease_id: held.lease_id,
                    ttl: self.ttl(),
                    renew_margin: Duration::from_secs(self.args.subnet_lease_renew_margin * 60),
                    request_timeout: self.args.etcd.options().request_timeout,
                },
                self.lost_tx.clone(),
                self.metrics.clone(),
            )));
        }
        Ok(())
    }

    async fn on_lease_events(&mut self, events: Vec<LeaseEvent>) -> Result<()> {
        let mut updates = Vec::new();
        for ev in events {
            // Events about our own key are about our lease, never a peer.
            let own = match &ev {
                LeaseEvent::Added(l) | LeaseEvent::Changed { new: l, .. }
                    if l.key == self.held.key =>
                {
                    Some(Some(l))
                }
                LeaseEvent::Removed(l) if l.key == self.held.key => Some(None),
                _ => None,
            };
            if let Some(now) = own {
                let still_ours = now.is_some_and(|l| {
                    l.create_revision == self.held.create_revision
                        && l.lease_id == self.held.lease_id
                        && l.attrs.names(&self.me.node_id, self.me.public_ip)
                });
                if !still_ours {
                    let why = match now {
                        None => "our key was deleted".to_string(),
                        Some(l) => format!(
                            "our key now belongs to {} (node {:?}, lease {:x})",
                            l.attrs.public_ip, l.attrs.node_id, l.lease_id
                        ),
                    };
                    self.apply_updates(std::mem::take(&mut updates)).await?;
                    self.lost(&why).await?;
                }
                continue;
            }
            if let LeaseEvent::Synced { revision } = ev {
                self.apply_updates(std::mem::take(&mut updates)).await?;
                self.datapath.synced(revision).await?;
                self.metrics.set_peers(self.datapath.peer_count() as u64);
                self.metrics.set_ready(self.metrics.lease_held());
                continue;
            }
            let me = Me {
                key: &self.held.key,
                public_ip: self.me.public_ip,
            };
            updates.extend(peers::updates(&ev, &me));
        }
        self.apply_updates(updates).await
    }

    async fn apply_updates(&mut self, updates: Vec<crate::peers::PeerUpdate>) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.datapath.apply(&updates).await?;
        self.metrics.inc_lease_changes_applied(updates.len() as u64);
        self.metrics.set_peers(self.datapath.peer_count() as u64);
        Ok(())
    }

    /// Our lease is gone: stop claiming the subnet, and go back through the
    /// fenced path (the same subnet if it is still free, else a new one).
    async fn lost(&mut self, why: &str) -> Result<()> {
        let old = self.held.clone();
        self.metrics.inc_lease_lost();
        self.metrics.set_lease(false, 0);
        self.metrics.set_ready(false);
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        tracing::error!(
            subnet = %old.subnet,
            key = %old.key,
            reason = why,
            "SUBNET LEASE LOST: this node no longer holds its subnet; re-acquiring"
        );
        self.held = self.acquire_until_held(Some(old.subnet)).await;
        if self.held.subnet != old.subnet {
            tracing::warn!(
                old = %old.subnet,
                new = %self.held.subnet,
                "this node's subnet changed: pods still using addresses of the old subnet must be recreated"
            );
        }
        self.took_lease().await?;
        self.metrics.set_ready(true);
        Ok(())
    }
}
