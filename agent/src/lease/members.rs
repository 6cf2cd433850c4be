//! Which etcd members the client may use.
//!
//! A healthy cluster is never asked: when the lease watch breaks (`trouble`),
//! each member given in `--etcd-endpoints` is asked for its status over a
//! connection of its own, with a 1 s deadline. A member that does not
//! answer, or answers without a leader (cut off from its peers), is taken
//! out of the client's rotation, and asked again 2 s later, then at longer
//! random intervals (up to 30 s) until it answers with a leader and is put
//! back. The last member in rotation is never taken out (then every request
//! fails until one recovers, and is retried). When a member is taken out,
//! the lease watch is told to start again, since it may be on that member.
//! (Asked every 2 s, 5,000 agents of a 3-member cluster made 7,500 status
//! requests a second.)

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use etcd_client::Client;
use tokio::sync::Notify;

use rand::SeedableRng as _;

use super::etcd::EtcdStore;
use crate::{backoff::Backoff, metrics::Metrics};

const RECHECK: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(30));
const DEADLINE: Duration = Duration::from_secs(1);

/// One member's state.
struct Member {
    client: Option<Client>,
    in_rotation: bool,
    /// Why it is out, as last logged.
    down: Option<String>,
}

/// Checks the members when `trouble` says so, and those out of rotation
/// until they are back; `moved` is notified when one is taken out.
pub(crate) async fn run(
    store: EtcdStore,
    metrics: Arc<Metrics>,
    moved: Arc<Notify>,
    trouble: Arc<Notify>,
) {
    let endpoints = store.options().endpoints.clone();
    if endpoints.len() < 2 {
        return;
    }
    let mut members: BTreeMap<String, Member> = endpoints
        .iter()
        .map(|e| {
            (
                e.clone(),
                Member {
                    client: None,
                    in_rotation: true,
                    down: None,
                },
            )
        })
        .collect();
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut rechecks = 0u32;
    loop {
        let unwell = members.values().any(|m| !m.in_rotation || m.down.is_some());
        if unwell {
            // The first recheck in 2 s, then at random up to 30 s.
            let wait = if rechecks == 0 {
                RECHECK.delay(0)
            } else {
                RECHECK.jittered(rechecks, &mut rng).max(RECHECK.delay(0))
            };
            rechecks += 1;
            tokio::select! {
                () = trouble.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        } else {
            rechecks = 0;
            trouble.notified().await;
        }
        // All at once: one member that hangs must not delay the others.
        let verdicts: Vec<(String, Result<(), String>)> =
            futures::future::join_all(members.iter_mut().map(|(ep, m)| {
                let store = &store;
                async move { (ep.clone(), check(store, ep, m).await) }
            }))
            .await;
        let mut in_rotation = members.values().filter(|m| m.in_rotation).count();
        for (ep, verdict) in verdicts {
            let m = members.get_mut(&ep).expect("listed");
            match verdict {
                Ok(()) => {
                    if !m.in_rotation {
                        match store.set_in_rotation(&ep, true).await {
                            Ok(()) => {
                                tracing::info!(member = %ep, "etcd member healthy again: back in rotation");
                                m.in_rotation = true;
                                in_rotation += 1;
                            }
                            Err(e) => {
                                tracing::warn!(member = %ep, error = %format!("{e:#}"), "cannot put an etcd member back in rotation")
                            }
                        }
                    }
                    m.down = None;
                }
                Err(why) => {
                    if m.down.as_ref() != Some(&why) {
                        tracing::warn!(member = %ep, reason = %why, "etcd member unhealthy");
                    }
                    m.down = Some(why);
                    if m.in_rotation && in_rotation > 1 {
                        match store.set_in_rotation(&ep, false).await {
                            Ok(()) => {
                                tracing::warn!(member = %ep, "etcd member taken out of rotation");
                                m.in_rotation = false;
                                in_rotation -= 1;
                                moved.notify_one();
                            }
                            Err(e) => {
                                tracing::warn!(member = %ep, error = %format!("{e:#}"), "cannot take an etcd member out of rotation")
                            }
                        }
                    }
                }
            }
        }
        metrics.set_etcd_members(
            members
                .iter()
                .map(|(ep, m)| (ep.clone(), m.in_rotation && m.down.is_none()))
                .collect(),
        );
    }
}

/// Whether `ep` answers its status in time, with a leader.
async fn check(store: &EtcdStore, ep: &str, m: &mut Member) -> Result<(), String> {
    if m.client.is_none() {
        m.client = Some(
            store
                .member_client(ep)
                .await
                .map_err(|e| format!("{e:#}"))?,
        );
    }
    let mut c = m.client.clone().expect("just set");
    match tokio::time::timeout(DEADLINE, c.status()).await {
        Err(_) => Err(format!("no answer within {DEADLINE:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(s)) if s.leader() == 0 => Err("it has no leader (cut off from its peers?)".into()),
        Ok(Ok(_)) => Ok(()),
    }
}
