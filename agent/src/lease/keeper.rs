//! Keeping our etcd lease alive, and noticing when it is gone.
//!
//! Keep-alives go out every TTL/3 (at most every five minutes). A reply with
//! TTL 0 means etcd has expired or revoked the lease: the subnet is no longer
//! ours, and the agent must go back through the fenced acquisition path. A
//! keep-alive that cannot reach etcd is retried; once renewal has failed for
//! longer than TTL minus the renew margin, the agent warns that the lease is
//! at risk. Retries are fully jittered ([`Retry`]), at most one renewal
//! interval apart.

use std::{sync::Arc, time::Duration};

use rand::SeedableRng as _;

use tokio::{
    sync::mpsc,
    time::{Instant, sleep, timeout},
};

use super::store::{KeepAlive as _, Store};
use crate::{
    backoff::{ETCD, Retry},
    metrics::Metrics,
};

pub(crate) struct KeeperConfig {
    pub(crate) lease_id: i64,
    pub(crate) ttl: Duration,
    pub(crate) renew_margin: Duration,
    pub(crate) request_timeout: Duration,
}

fn interval(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(500), Duration::from_secs(300))
}

/// Runs until etcd says the lease is gone (the lease id is sent on `lost`)
/// or the task is aborted.
pub(crate) async fn keep_alive<S: Store>(
    store: S,
    cfg: KeeperConfig,
    lost: mpsc::Sender<i64>,
    metrics: Arc<Metrics>,
) {
    let every = interval(cfg.ttl);
    let mut last_ok = Instant::now();
    let mut warned = false;
    let mut retry = Retry::new(ETCD);
    let mut rng = rand::rngs::StdRng::from_os_rng();
    loop {
        let mut renewals = match store.keep_alive(cfg.lease_id).await {
            Ok(r) => r,
            Err(e) => {
                metrics.inc_etcd_error();
                at_risk(&cfg, last_ok, &mut warned, &e.to_string());
                sleep(retry.failed(0, &mut rng).min(every)).await;
                continue;
            }
        };
        loop {
            match timeout(cfg.request_timeout, renewals.renew()).await {
                Ok(Ok(ttl)) if ttl > 0 => {
                    last_ok = Instant::now();
                    retry.working();
                    if warned {
                        tracing::info!(
                            lease = format!("{:x}", cfg.lease_id),
                            "lease renewal works again"
                        );
                        warned = false;
                    }
                    metrics.set_lease(true, unix_now() + ttl);
                    sleep(every).await;
                }
                Ok(Ok(_)) => {
                    let _ = lost.send(cfg.lease_id).await;
                    return;
                }
                Ok(Err(e)) => {
                    metrics.inc_etcd_error();
                    at_risk(&cfg, last_ok, &mut warned, &e.to_string());
                    break;
                }
                Err(_) => {
                    metrics.inc_etcd_error();
                    at_risk(&cfg, last_ok, &mut warned, "keep-alive timed out");
                    break;
                }
            }
        }
        sleep(retry.failed(0, &mut rng).min(every)).await;
    }
}

fn at_risk(cfg: &KeeperConfig, last_ok: Instant, warned: &mut bool, why: &str) {
    let since = last_ok.elapsed();
    let budget = cfg.ttl.saturating_sub(cfg.renew_margin.min(cfg.ttl / 2));
    if since >= budget && !*warned {
        *warned = true;
        tracing::warn!(
            lease = format!("{:x}", cfg.lease_id),
            unrenewed_for = ?since,
            ttl = ?cfg.ttl,
            error = why,
            "subnet lease renewal keeps failing: the lease will expire unless etcd is reachable again"
        );
    } else {
        tracing::debug!(error = why, "lease keep-alive failed; retrying");
    }
}

pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}
