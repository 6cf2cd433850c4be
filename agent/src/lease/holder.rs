//! The life cycle of this node's lease: acquire it (retrying forever, saying
//! why), keep it alive, notice when etcd lets it go, and go back through the
//! fenced acquisition for a new one.

use std::{sync::Arc, time::Duration};

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
    etcd::EtcdStore,
    keeper::{self, KeeperConfig},
    key::Subnets,
    store::Store as _,
};
use crate::{backoff::Backoff, metrics::Metrics};

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

pub(crate) struct LeaseHolder {
    store: EtcdStore,
    subnets_prefix: String,
    config: NetworkConfig,
    me: Identity,
    value: LeaseAttrs,
    timing: Timing,
    metrics: Arc<Metrics>,
    rng: rand::rngs::StdRng,
    /// An etcd lease granted but not (yet) attached, with when it was granted.
    spare_lease: Option<(i64, Instant)>,
    held: Option<HeldLease>,
    keeper: Option<JoinHandle<()>>,
    expired_tx: mpsc::Sender<i64>,
    expired_rx: mpsc::Receiver<i64>,
}

impl LeaseHolder {
    pub(crate) fn new(
        store: EtcdStore,
        prefix: &str,
        config: NetworkConfig,
        me: Identity,
        value: LeaseAttrs,
        timing: Timing,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (expired_tx, expired_rx) = mpsc::channel(4);
        Self {
            store,
            subnets_prefix: format!("{prefix}/subnets/"),
            config,
            me,
            value,
            timing,
            metrics,
            rng: rand::rngs::StdRng::from_os_rng(),
            spare_lease: None,
            held: None,
            keeper: None,
            expired_tx,
            expired_rx,
        }
    }

    /// Acquires a subnet (`preferred` if it is free), retrying forever with
    /// a log line saying why, then keeps it alive.
    pub(crate) async fn acquire(&mut self, preferred: Option<Subnets>) -> HeldLease {
        let held = self.acquire_until_held(preferred).await;
        let expires = if held.is_reservation() {
            0
        } else {
            keeper::unix_now() + self.timing.ttl.as_secs() as i64
        };
        self.metrics.set_lease(true, expires);
        if !held.is_reservation() {
            self.keeper = Some(tokio::spawn(keeper::keep_alive(
                self.store.clone(),
                KeeperConfig {
                    lease_id: held.lease_id,
                    ttl: self.timing.ttl,
                    renew_margin: self.timing.renew_margin,
                    request_timeout: self.timing.request_timeout,
                },
                self.expired_tx.clone(),
                self.metrics.clone(),
            )));
        }
        self.held = Some(held.clone());
        held
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

    /// Our lease is gone (`why`): stop claiming it. Returns the subnet we
    /// held, to try first when acquiring again.
    pub(crate) fn lose(&mut self, why: &str) -> Option<Subnets> {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        let old = self.held.take()?;
        self.metrics.inc_lease_lost();
        self.metrics.set_lease(false, 0);
        tracing::error!(
            subnet = %old.subnet,
            key = %old.key,
            reason = why,
            "SUBNET LEASE LOST: this node no longer holds its subnet; re-acquiring"
        );
        Some(old.subnet)
    }

    async fn acquire_until_held(&mut self, preferred: Option<Subnets>) -> HeldLease {
        let mut failures = 0u32;
        let started = Instant::now();
        let ttl = self.timing.ttl;
        loop {
            // A granted lease is reused while it has most of its TTL left.
            let reuse = self
                .spare_lease
                .filter(|(_, at)| at.elapsed() < ttl / 2)
                .map(|(id, _)| id);
            let req = AcquireRequest {
                subnets_prefix: &self.subnets_prefix,
                config: &self.config,
                me: &self.me,
                value: &self.value,
                ttl: ttl.as_secs() as i64,
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
                    let wait = self.timing.retry_interval;
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
                    let wait = Backoff::RETRY.delay(failures);
                    tracing::warn!(error = %e, retry_in = ?wait, "etcd unreachable while acquiring a subnet; retrying");
                    sleep(wait).await;
                }
            }
        }
    }
}

impl Drop for LeaseHolder {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

/// Reads `<prefix>/config` until it exists and is valid, saying why not.
pub(crate) async fn wait_for_config(
    store: &EtcdStore,
    prefix: &str,
    retry_interval: Duration,
    metrics: &Metrics,
) -> NetworkConfig {
    let key = format!("{prefix}/config");
    let mut failures = 0u32;
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
                failures += 1;
                let wait = Backoff::RETRY.delay(failures);
                tracing::warn!(error = %e, retry_in = ?wait, "etcd unreachable; retrying");
                sleep(wait).await;
                continue;
            }
        }
        failures = 0;
        sleep(wait).await;
    }
}
