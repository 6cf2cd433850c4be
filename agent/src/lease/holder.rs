//! The life cycle of this node's lease: acquire it (retrying forever, saying
//! why), keep it alive, notice when etcd lets it go, and go back through the
//! fenced acquisition for a new one.
//!
//! A machine replaced at the same address (a new node id) takes back the
//! lease of its address. Two live nodes that claim one address (cloned
//! machines, one `--public-ip` behind NAT) would take it from each other
//! forever; a node that loses the lease to a node it took it from within
//! [`CONFLICT_WINDOW`], or takes it from a node it lost it to, reports a
//! conflict (log, `weft_public_ip_conflict`, `weft status`, not ready) and
//! never takes that node's lease again: the one that holds it keeps it,
//! the other waits until it is gone.

use std::{collections::HashMap, sync::Arc, time::Duration};

use rand::SeedableRng as _;
use tokio::{
    sync::mpsc,
    task::JoinHandle,
    time::{Instant, sleep},
};

use super::{
    acquire::{self, AcquireError, AcquireRequest, HeldLease, Identity},
    attrs::LeaseAttrs,
    config::NetworkConfig,
    keeper::{self, KeeperConfig},
    key::Subnets,
    store::Store,
};
use crate::{
    backoff::{ETCD, Retry},
    metrics::Metrics,
};

/// A takeover and a loss between us and one node this close together are
/// two live nodes claiming one address.
pub(crate) const CONFLICT_WINDOW: Duration = Duration::from_secs(600);

/// The conflict stays reported this long on the node that kept the lease
/// (the other one has stopped taking it).
const CONFLICT_HOLD: Duration = Duration::from_secs(300);

/// Another live node that claims our public IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub(crate) node: String,
    pub(crate) since: Instant,
}

/// Who we took our address's lease from, and lost it to, and when.
#[derive(Default)]
struct Claims {
    took_from: HashMap<String, Instant>,
    lost_to: HashMap<String, Instant>,
    /// Nodes whose leases of our address we no longer take over.
    not_from: Vec<String>,
    conflict: Option<Conflict>,
}

impl Claims {
    fn recent(map: &HashMap<String, Instant>, node: &str) -> bool {
        map.get(node)
            .is_some_and(|at| at.elapsed() < CONFLICT_WINDOW)
    }

    /// A cycle with `node`: it claims our address while alive.
    fn conflict(&mut self, node: &str, metrics: &Metrics) {
        if !self.not_from.iter().any(|n| n == node) {
            self.not_from.push(node.to_string());
        }
        tracing::error!(
            other_node = node,
            "PUBLIC IP CONFLICT: another live node claims this node's public IP (cloned machines, or one --public-ip for two nodes behind NAT); this node stops taking that node's lease and is not ready until it is fixed"
        );
        self.conflict = Some(Conflict {
            node: node.to_string(),
            since: Instant::now(),
        });
        metrics.set_public_ip_conflict(true);
    }
}

/// The holder's timing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// TTL of the etcd lease.
    pub(crate) ttl: Duration,
    /// Warn when less than this is left and renewal keeps failing.
    pub(crate) renew_margin: Duration,
    pub(crate) request_timeout: Duration,
    /// Between retries when no subnet is free or the config is unusable.
    pub(crate) retry_interval: Duration,
}

/// What every acquisition of this node needs, shared by the holder and
/// the acquisitions it starts.
struct Context<S> {
    store: S,
    subnets_prefix: String,
    config: NetworkConfig,
    me: Identity,
    value: LeaseAttrs,
    timing: Timing,
    metrics: Arc<Metrics>,
}

pub(crate) struct LeaseHolder<S> {
    ctx: Arc<Context<S>>,
    rng: rand::rngs::StdRng,
    held: Option<HeldLease>,
    keeper: Option<JoinHandle<()>>,
    expired_tx: mpsc::Sender<i64>,
    expired_rx: mpsc::Receiver<i64>,
    claims: Claims,
}

impl<S: Store + Clone + 'static> LeaseHolder<S> {
    pub(crate) fn new(
        store: S,
        prefix: &str,
        config: NetworkConfig,
        me: Identity,
        value: LeaseAttrs,
        timing: Timing,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (expired_tx, expired_rx) = mpsc::channel(4);
        Self {
            ctx: Arc::new(Context {
                store,
                subnets_prefix: format!("{prefix}/subnets/"),
                config,
                me,
                value,
                timing,
                metrics,
            }),
            rng: rand::rngs::StdRng::from_os_rng(),
            held: None,
            keeper: None,
            expired_tx,
            expired_rx,
            claims: Claims::default(),
        }
    }

    /// The subnet held, if any.
    pub(crate) fn held(&self) -> Option<&HeldLease> {
        self.held.as_ref()
    }

    /// Another live node that claims our public IP, while that is known.
    pub(crate) fn conflict(&mut self) -> Option<Conflict> {
        if let Some(c) = &self.claims.conflict
            && self.held.is_some()
            && c.since.elapsed() > CONFLICT_HOLD
        {
            tracing::info!(other_node = %c.node, "no more sign of the public IP conflict; this node holds the lease");
            self.claims.conflict = None;
            self.ctx.metrics.set_public_ip_conflict(false);
        }
        self.claims.conflict.clone()
    }

    /// Acquires a subnet (`preferred` if it is free), retrying forever with
    /// a log line saying why, then keeps it alive. The agent's first
    /// acquisition; later ones run beside its event loop
    /// ([`Self::acquisition`], [`Self::install`]).
    #[cfg(test)]
    pub(crate) async fn acquire(&mut self, preferred: Option<Subnets>) -> HeldLease {
        self.start(preferred, None).await
    }

    /// The agent's first acquisition after a restart: the key it held at
    /// its last stop (`kept`) is adopted as it is, with one read of that
    /// key, where etcd still holds it exactly as this node wrote it, with
    /// the same etcd lease (the check [`acquire`] makes of a key it holds);
    /// otherwise the full acquisition runs. A restart then writes nothing:
    /// a rolling restart of a large cluster makes no lease events.
    pub(crate) async fn start(
        &mut self,
        preferred: Option<Subnets>,
        kept: Option<super::resume::KeptHeld>,
    ) -> HeldLease {
        let held = match kept {
            Some(k) => self.adopt(k).await,
            None => None,
        };
        let held = match held {
            Some(h) => h,
            None => self.acquisition(preferred).run().await,
        };
        self.install(held.clone());
        held
    }

    /// The key `kept` names, if it is still ours exactly as kept.
    async fn adopt(&self, kept: super::resume::KeptHeld) -> Option<HeldLease> {
        let ctx = &self.ctx;
        let kv = match ctx.store.get(&kept.key).await {
            Ok(Some(kv)) => kv,
            Ok(None) => {
                tracing::info!(key = %kept.key, "the key held at the last stop is gone; acquiring");
                return None;
            }
            Err(e) => {
                tracing::warn!(key = %kept.key, error = %e, "cannot read the key held at the last stop; acquiring");
                return None;
            }
        };
        let subnet = kv
            .key
            .strip_prefix(&ctx.subnets_prefix)
            .and_then(|k| super::key::parse_key(k).ok())
            .filter(|s| ctx.config.is_assignable(s));
        let same = kv.create_revision == kept.create_revision
            && kv.lease == kept.lease_id
            && kv.value == ctx.value.to_json().into_bytes();
        match subnet {
            Some(subnet) if same => {
                tracing::info!(
                    subnet = %subnet,
                    key = %kv.key,
                    lease = if kv.lease == 0 { "reservation".to_string() } else { format!("{:x}", kv.lease) },
                    "holding the subnet held at the last stop (unchanged in etcd)"
                );
                Some(HeldLease {
                    subnet,
                    key: kv.key,
                    lease_id: kv.lease,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    attrs: ctx.value.clone(),
                    taken_from: None,
                })
            }
            _ => {
                tracing::info!(key = %kept.key, "the key held at the last stop changed; acquiring");
                None
            }
        }
    }

    /// An acquisition of a subnet (`preferred` if it is free) that owns
    /// what it needs, to run on its own task: nothing waits for it.
    pub(crate) fn acquisition(&mut self, preferred: Option<Subnets>) -> Acquisition<S> {
        Acquisition {
            ctx: self.ctx.clone(),
            rng: rand::rngs::StdRng::from_rng(&mut self.rng),
            spare_lease: None,
            not_from: self.claims.not_from.clone(),
            preferred,
        }
    }

    /// We hold `held` (an [`Acquisition`]'s result): record whose lease of
    /// our address it took over, if any, and keep it alive.
    pub(crate) fn install(&mut self, held: HeldLease) {
        if let Some(from) = &held.taken_from {
            tracing::warn!(
                key = %held.key,
                previous_node = %from,
                "took over the lease of this node's public IP from another node id (a machine replaced at this address keeps its subnet)"
            );
            if Claims::recent(&self.claims.lost_to, from) {
                self.claims.conflict(from, &self.ctx.metrics);
            }
            self.claims.took_from.insert(from.clone(), Instant::now());
        } else if let Some(c) = self.claims.conflict.take() {
            // Acquired without taking anyone's lease: the conflicting
            // node's is gone.
            tracing::info!(other_node = %c.node, "the lease of the node that claimed this public IP is gone");
            self.ctx.metrics.set_public_ip_conflict(false);
        }
        let expires = if held.is_reservation() {
            0
        } else {
            keeper::unix_now() + self.ctx.timing.ttl.as_secs() as i64
        };
        self.ctx.metrics.set_lease(true, expires);
        if !held.is_reservation() {
            self.keeper = Some(tokio::spawn(keeper::keep_alive(
                self.ctx.store.clone(),
                KeeperConfig {
                    lease_id: held.lease_id,
                    ttl: self.ctx.timing.ttl,
                    renew_margin: self.ctx.timing.renew_margin,
                    request_timeout: self.ctx.timing.request_timeout,
                },
                self.expired_tx.clone(),
                self.ctx.metrics.clone(),
            )));
        }
        self.held = Some(held);
    }

    /// Resolves when etcd says the etcd lease of the subnet we hold is gone.
    /// Cancel-safe.
    pub(crate) async fn expired(&mut self) {
        loop {
            let id = self.expired_rx.recv().await;
            if id.is_some() && id == self.held.as_ref().map(|h| h.lease_id) {
                return;
            }
        }
    }

    /// Our lease is gone (`why`; taken by node `to`, if a node took it):
    /// stop claiming it. Returns the subnet we held, to try first when
    /// acquiring again; None if we held none (already lost).
    pub(crate) fn lose(&mut self, why: &str, to: Option<&str>) -> Option<Subnets> {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        if let Some(to) = to.filter(|n| *n != self.ctx.me.node_id) {
            if Claims::recent(&self.claims.took_from, to) {
                self.claims.conflict(to, &self.ctx.metrics);
            }
            self.claims.lost_to.insert(to.to_string(), Instant::now());
        }
        let old = self.held.take()?;
        self.ctx.metrics.inc_lease_lost();
        self.ctx.metrics.set_lease(false, 0);
        tracing::error!(
            subnet = %old.subnet,
            key = %old.key,
            reason = why,
            "SUBNET LEASE LOST: this node no longer holds its subnet; re-acquiring"
        );
        Some(old.subnet)
    }
}

/// One acquisition: retries until a subnet is held, saying why it waits.
/// It owns what it needs, so it runs on a task of its own while the agent
/// goes on serving lease events, pods, healing and signals.
pub(crate) struct Acquisition<S> {
    ctx: Arc<Context<S>>,
    rng: rand::rngs::StdRng,
    /// An etcd lease granted but not (yet) attached, with when it was granted.
    spare_lease: Option<(i64, Instant)>,
    not_from: Vec<String>,
    preferred: Option<Subnets>,
}

impl<S: Store> Acquisition<S> {
    pub(crate) async fn run(mut self) -> HeldLease {
        let mut retry = Retry::new(ETCD);
        let started = Instant::now();
        let ttl = self.ctx.timing.ttl;
        loop {
            // A granted lease is reused while it has most of its TTL left.
            let reuse = self
                .spare_lease
                .filter(|(_, at)| at.elapsed() < ttl / 2)
                .map(|(id, _)| id);
            let req = AcquireRequest {
                subnets_prefix: &self.ctx.subnets_prefix,
                config: &self.ctx.config,
                me: &self.ctx.me,
                value: &self.ctx.value,
                ttl: ttl.as_secs() as i64,
                preferred: self.preferred,
                lease_id: reuse,
                not_from: &self.not_from,
            };
            let (r, stats, lease) = acquire::acquire(&self.ctx.store, &req, &mut self.rng).await;
            if lease != reuse {
                self.spare_lease = lease.map(|id| (id, Instant::now()));
            }
            match r {
                Ok(held) => {
                    self.ctx.metrics.observe_acquire(started.elapsed());
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
                    self.ctx.metrics.inc_out_of_subnets();
                    let wait = self.ctx.timing.retry_interval;
                    tracing::error!(error = %e, retry_in = ?wait, "no subnet for this node");
                    sleep(wait).await;
                }
                Err(e @ AcquireError::Conflict { .. }) => {
                    let wait = self.ctx.timing.retry_interval;
                    tracing::warn!(error = %e, retry_in = ?wait, "waiting for the other node's lease of this public IP to go");
                    sleep(wait).await;
                }
                Err(e @ AcquireError::Contended(_)) => {
                    let wait = Duration::from_millis(rand::random_range(100..1000));
                    tracing::warn!(error = %e, retry_in = ?wait, "subnet contention; trying again");
                    sleep(wait).await;
                }
                Err(AcquireError::Store(e)) => {
                    self.ctx.metrics.inc_etcd_error();
                    // The granted lease may have been lost with the outage.
                    self.spare_lease = None;
                    let wait = retry.failed(0, &mut self.rng);
                    tracing::warn!(error = %e, retry_in = ?wait, "etcd unreachable while acquiring a subnet; retrying");
                    sleep(wait).await;
                }
            }
        }
    }
}

impl<S> Drop for LeaseHolder<S> {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

/// Reads `<prefix>/config` until it exists and is valid, saying why not.
pub(crate) async fn wait_for_config<S: Store>(
    store: &S,
    prefix: &str,
    retry_interval: Duration,
    metrics: &Metrics,
) -> NetworkConfig {
    let key = format!("{prefix}/config");
    let mut retry = Retry::new(ETCD);
    let mut rng = rand::rngs::StdRng::from_os_rng();
    loop {
        let wait = retry_interval;
        match store.get(&key).await {
            Ok(Some(kv)) => match NetworkConfig::parse(&kv.value) {
                Ok(c) => {
                    tracing::info!(
                        network = ?c.network(),
                        subnet_len = ?c.ipv4.as_ref().map(|p| p.subnet_len),
                        ipv6_network = ?c.ipv6_network(),
                        ipv6_subnet_len = ?c.ipv6.as_ref().map(|p| p.subnet_len),
                        vni = c.vni,
                        port = c.port,
                        backend_mtu = ?c.mtu,
                        direct_routing = c.direct_routing,
                        "network config"
                    );
                    for note in &c.ignored {
                        tracing::warn!("network config: ignoring {note}");
                    }
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
                let wait = retry.failed(0, &mut rng);
                tracing::warn!(error = %e, retry_in = ?wait, "etcd unreachable; retrying");
                sleep(wait).await;
                continue;
            }
        }
        retry.working();
        sleep(wait).await;
    }
}
