//! Following every lease in etcd.
//!
//! List the subnets prefix at revision R, watch from R+1; on compaction,
//! cancellation or a broken stream, list again. What etcd says is handed
//! on as it is ([`WatchEvent`]): the lease view keeps the one copy of every
//! lease ([`super::cache`]), drops duplicates and diffs listings.
//!
//! A watch can go silent without breaking (its member cut off from clients,
//! a connection that hangs): every 1 s the watch asks etcd for a progress
//! notification, and one that has heard nothing (no event, no progress) for
//! 5 s starts again from a fresh list, on whatever member is in rotation.
//! So does one whose member was taken out of rotation ([`super::members`]),
//! and one whose client was replaced. The time since the watch last knew it
//! was current is `weft_etcd_watch_lag_seconds`; the agent is not ready
//! while it exceeds 15 s.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Notify, mpsc};

use super::{
    cache::{Lease, parse_lease},
    store::{Store, WatchEvent, WatchResponse, WatchStream as _},
};
use crate::{backoff::Backoff, metrics::Metrics};

/// How often the watch asks for a progress notification.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A watch that heard nothing for this long starts again (a healthy member
/// answers a progress request in milliseconds).
const SILENT: Duration = Duration::from_secs(5);

/// Follows `<prefix>/subnets/` forever, sending events on `tx`. Returns when
/// the receiver is gone. `moved`: a member was taken out of rotation.
pub(crate) async fn run<S: Store>(
    store: S,
    subnets_prefix: String,
    tx: mpsc::Sender<WatchEvent>,
    metrics: Arc<Metrics>,
    moved: Arc<Notify>,
) {
    let mut failures = 0u32;
    loop {
        let listing = match store.list(&subnets_prefix).await {
            Ok(l) => l,
            Err(e) => {
                metrics.inc_etcd_error();
                failures += 1;
                let wait = retry_delay(failures);
                tracing::warn!(error = %e, retry_in = ?wait, "cannot list leases");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        metrics.watch_confirmed();
        let revision = listing.revision;
        if tx.send(WatchEvent::Listed(listing)).await.is_err() {
            return;
        }
        let w = Watching {
            prefix: &subnets_prefix,
            revision,
            moved: &moved,
            metrics: &metrics,
        };
        match follow(&store, w, &tx).await {
            Follow::ReceiverGone => return,
            Follow::Resync { reason, received } => {
                metrics.inc_watch_resync();
                // A watch that delivered something was healthy for a while:
                // restart at once; one that failed straight away backs off.
                failures = if received { 0 } else { failures + 1 };
                let wait = if failures > 0 {
                    retry_delay(failures)
                } else {
                    Duration::ZERO
                };
                tracing::info!(%reason, "lease watch restarting from a fresh list");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

enum Follow {
    ReceiverGone,
    Resync { reason: String, received: bool },
}

/// What a watch follows, from where, and what it reports to.
struct Watching<'a> {
    prefix: &'a str,
    revision: i64,
    moved: &'a Notify,
    metrics: &'a Metrics,
}

async fn follow<S: Store>(store: &S, w: Watching<'_>, tx: &mpsc::Sender<WatchEvent>) -> Follow {
    let Watching {
        prefix,
        revision,
        moved,
        metrics,
    } = w;
    let mut received = false;
    let resync = |reason: String, received: bool| Follow::Resync { reason, received };
    let mut stream = match store.watch(prefix, revision + 1).await {
        Ok(s) => s,
        Err(e) => return resync(format!("cannot start the watch: {e}"), false),
    };
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = tokio::time::Instant::now();
    loop {
        let next = tokio::select! {
            m = stream.next() => m,
            _ = progress.tick() => {
                if heard.elapsed() > SILENT {
                    return resync(
                        format!("the watch heard nothing (no event, no progress) for {SILENT:?}"),
                        received,
                    );
                }
                // A store without progress requests just never answers:
                // then events (or the silence check) keep the watch honest.
                stream.request_progress().await;
                continue;
            }
            () = moved.notified() => {
                return resync("its etcd member may have been taken out of rotation".into(), received);
            }
        };
        let (events, member) = match next {
            Ok(Some(WatchResponse::Events { events, member })) => (events, member),
            Ok(Some(WatchResponse::Restart(reason))) => return resync(reason, received),
            Ok(None) => return resync("the watch stream ended".into(), received),
            Err(e) => return resync(format!("the watch stream broke: {e}"), received),
        };
        heard = tokio::time::Instant::now();
        metrics.watch_confirmed();
        if member != 0 {
            metrics.set_watch_member(member);
        }
        received = true;
        for ev in events {
            if tx.send(ev).await.is_err() {
                return Follow::ReceiverGone;
            }
        }
    }
}

fn retry_delay(failures: u32) -> Duration {
    Backoff::RETRY.delay(failures)
}

/// Reads every lease once (for `weft leases`): the leases, and the keys
/// that are not leases, with why.
pub(crate) async fn list_once<S: Store>(
    store: &S,
    prefix: &str,
) -> anyhow::Result<(Vec<Lease>, Vec<(String, String)>)> {
    let listing = store.list(prefix).await?;
    let mut leases = Vec::new();
    let mut bad = Vec::new();
    for kv in &listing.kvs {
        match parse_lease(prefix, kv) {
            Ok(l) => leases.push(l),
            Err(why) => bad.push((kv.key.clone(), why)),
        }
    }
    leases.sort_by_key(|l| l.subnet);
    Ok((leases, bad))
}
