//! Following every lease in etcd, as thousands of agents can on one etcd.
//!
//! List the subnets prefix at revision R (page by page, each page parsed
//! and dropped before the next is read), watch from R+1. A watch that
//! breaks (etcd restarted, a leader change, a member taken out of
//! rotation, the connection replaced) starts again *after the last
//! revision it delivered*: no list. Only a watch whose revision etcd has
//! compacted away lists again. Every retry waits a random time up to the
//! larger of its backoff step (1 s, 2 s, ... 30 s) and a window that grows
//! with the cluster (10 ms a node, 1 s to 60 s), so agents that lost etcd
//! together come back spread out ([`Retry`]).
//!
//! Liveness costs etcd nothing while it is healthy: the connection's
//! HTTP/2 keep-alives find a dead etcd within seconds (the stream breaks),
//! the server's own timed progress notifications tell a quiet watch how far
//! it has come, and only a watch that heard nothing at all for 2 to 4
//! minutes (a random time: agents do not ask together) asks for a progress
//! notification; one that gets no answer within 10 s starts again.
//!
//! The watch never waits on the agent's loop: what it hears goes to the
//! [`Inbox`], coalesced by key. A restarted agent resumes from the leases
//! and revision it kept ([`super::resume`]) where etcd still holds that
//! revision. The time since the watch last heard from etcd is
//! `weft_etcd_watch_lag_seconds`; the agent is not ready while the watch is
//! broken or has been silent past its progress request.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use tokio::{sync::Notify, time::Instant};

use super::{
    cache::{Change, Lease, NotALease, Snapshot, parse_lease},
    inbox::Inbox,
    store::{KeyValue, Store, WatchEvent, WatchResponse, WatchStream as _},
};
use crate::{
    backoff::{ETCD, Retry},
    metrics::Metrics,
};

/// A watch that heard nothing this long (and as long again, at random)
/// asks for a progress notification.
const SILENT: Duration = Duration::from_secs(120);
/// How long a progress request may go unanswered.
const ANSWER: Duration = Duration::from_secs(10);
/// How long the members' check takes at most ([`super::members`]).
const MEMBERS_CHECKED: Duration = Duration::from_secs(1);

/// What the watch follows and where it hands over.
pub(crate) struct Watch<S> {
    pub(crate) store: S,
    /// `<prefix>/subnets/`.
    pub(crate) prefix: String,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) metrics: Arc<Metrics>,
    /// A member was taken out of rotation: the watch may be on it.
    pub(crate) moved: Arc<Notify>,
    /// Told when the watch breaks: the members are worth a look.
    pub(crate) trouble: Arc<Notify>,
    /// How many nodes the cluster has (the leases known), for the window
    /// retries spread over.
    pub(crate) nodes: Arc<AtomicUsize>,
}

/// How a watch ended.
enum Ended {
    /// Start again after `reached`.
    Broken { why: String, reached: i64 },
    /// Its member was taken out of rotation: start again after `reached`,
    /// on another.
    Moved { reached: i64 },
    /// Its history is gone: list again.
    Compacted(String),
}

impl<S: Store> Watch<S> {
    /// Follows the prefix forever. `resume`: the leases a restarted agent
    /// kept and the revision they are at, used (instead of a list) where
    /// etcd still holds that revision.
    pub(crate) async fn run(self, resume: Option<Snapshot>) {
        let mut rng = StdRng::from_os_rng();
        let mut retry = Retry::new(ETCD);
        let mut log = Warnings::default();
        let mut at = match resume {
            Some(s) => self.resume(s).await,
            None => None,
        };
        // When the last watch ended, until the next hears from etcd.
        let mut down: Option<Instant> = None;
        loop {
            let revision = match at {
                Some(r) => r,
                None => match self.list(&mut log).await {
                    Ok(s) => {
                        let r = s.revision;
                        self.metrics.watch_listed();
                        self.inbox.snapshot(s);
                        r
                    }
                    Err(e) => {
                        self.metrics.inc_etcd_error();
                        let wait = retry.failed(self.nodes(), &mut rng);
                        tracing::warn!(error = %e, retry_in = ?wait, "cannot list leases");
                        self.store.pause(wait).await;
                        continue;
                    }
                },
            };
            let ended = self
                .follow(revision, &mut retry, &mut rng, &mut log, down.take())
                .await;
            down = Some(Instant::now());
            self.metrics.watch_broken();
            let (why, next, wait) = match ended {
                Ended::Moved { reached } => (
                    "its etcd member was taken out of rotation".to_string(),
                    Some(reached),
                    retry.moved(self.nodes(), &mut rng),
                ),
                Ended::Broken { why, reached } => {
                    self.trouble.notify_one();
                    // Not before the members are looked at (a member
                    // without a leader is taken out of rotation first),
                    // then spread like any retry.
                    let wait = MEMBERS_CHECKED + retry.failed(self.nodes(), &mut rng);
                    (why, Some(reached), wait)
                }
                Ended::Compacted(why) => (why, None, retry.failed(self.nodes(), &mut rng)),
            };
            match next {
                Some(r) => {
                    self.metrics.inc_watch_resume();
                    tracing::info!(reason = %why, after_revision = r, retry_in = ?wait, "lease watch starting again where it was");
                }
                None => {
                    tracing::info!(reason = %why, retry_in = ?wait, "lease watch restarting from a fresh list");
                }
            }
            at = next;
            self.store.pause(wait).await;
        }
    }

    fn nodes(&self) -> usize {
        self.nodes.load(Ordering::Relaxed)
    }

    /// The kept snapshot, handed over if etcd still holds its revision;
    /// the revision to watch after, or None to list.
    async fn resume(&self, s: Snapshot) -> Option<i64> {
        // A key under the prefix (the prefix itself): a node's role may
        // read nothing else.
        match self.store.holds_revision(&self.prefix, s.revision).await {
            Ok(Some(cluster)) if cluster != s.cluster => {
                tracing::info!(
                    kept = format!("{:x}", s.cluster),
                    now = format!("{cluster:x}"),
                    "the leases kept at the last stop are of another etcd cluster: listing"
                );
                None
            }
            Ok(Some(_)) => {
                tracing::info!(
                    revision = s.revision,
                    leases = s.leases.len(),
                    "resuming the lease watch from the leases kept at the last stop"
                );
                let r = s.revision;
                self.metrics.watch_confirmed();
                self.inbox.snapshot(s);
                Some(r)
            }
            Ok(None) => {
                tracing::info!(
                    revision = s.revision,
                    "the leases kept at the last stop are older than what etcd holds (compacted): listing"
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask etcd whether the kept leases are current: listing");
                None
            }
        }
    }

    /// Every lease under the prefix, page by page at one revision.
    async fn list(&self, log: &mut Warnings) -> Result<Snapshot, super::StoreError> {
        let p = self.prefix.as_str();
        let mut page = self.store.list_page(p, p.as_bytes(), 0).await?;
        let mut s = Snapshot {
            revision: page.revision,
            cluster: page.cluster,
            ..Default::default()
        };
        loop {
            for kv in std::mem::take(&mut page.kvs) {
                match parse_lease(p, &kv) {
                    Ok(l) => s.leases.push(l),
                    Err(why) => s.skipped.add(&kv.key, &why),
                }
            }
            if !page.more {
                break;
            }
            page = self.store.list_page(p, &page.next, s.revision).await?;
        }
        self.metrics
            .set_skipped_keys(s.skipped.keys, s.skipped.values);
        if s.skipped.total() > 0 {
            self.metrics.inc_malformed_leases(s.skipped.total());
            let first: Vec<String> = s
                .skipped
                .examples
                .iter()
                .map(|(k, why)| format!("{k:?}: {why}"))
                .collect();
            tracing::warn!(
                skipped = s.skipped.total(),
                bad_keys = s.skipped.keys,
                bad_values = s.skipped.values,
                first = %first.join("; "),
                "keys under the subnets prefix that hold no lease were skipped"
            );
        }
        log.reset();
        Ok(s)
    }

    /// Watches after `revision` until the watch ends.
    async fn follow(
        &self,
        revision: i64,
        retry: &mut Retry,
        rng: &mut StdRng,
        log: &mut Warnings,
        mut down: Option<Instant>,
    ) -> Ended {
        let mut reached = revision;
        let broken = |why: String, reached| Ended::Broken { why, reached };
        // A member taken out while the watch was down says nothing about
        // the new one.
        let _ = futures::FutureExt::now_or_never(self.moved.notified());
        let mut stream = match self.store.watch(&self.prefix, revision + 1).await {
            Ok(s) => s,
            Err(e) => return broken(format!("cannot start the watch: {e}"), reached),
        };
        let mut quiet = silence(rng);
        let mut heard = Instant::now();
        let mut asked: Option<Instant> = None;
        loop {
            let deadline = match asked {
                Some(t) => t + ANSWER,
                None => heard + quiet,
            };
            let next = tokio::select! {
                m = stream.next() => m,
                () = tokio::time::sleep_until(deadline) => {
                    if asked.is_some() {
                        return broken(format!("no answer to a progress request within {ANSWER:?}"), reached);
                    }
                    stream.request_progress().await;
                    asked = Some(Instant::now());
                    continue;
                }
                () = self.moved.notified() => return Ended::Moved { reached },
            };
            let (events, at, member) = match next {
                Ok(Some(WatchResponse::Events {
                    events,
                    revision,
                    member,
                })) => (events, revision, member),
                Ok(Some(WatchResponse::Compacted(why))) => return Ended::Compacted(why),
                Ok(Some(WatchResponse::Restart(why))) => return broken(why, reached),
                Ok(None) => return broken("the watch stream ended".into(), reached),
                Err(e) => return broken(format!("the watch stream broke: {e}"), reached),
            };
            heard = Instant::now();
            asked = None;
            if let Some(since) = down.take() {
                tracing::info!(down_for = ?since.elapsed(), after_revision = revision, "lease watch reconnected");
            }
            quiet = silence(rng);
            retry.working();
            self.metrics.watch_confirmed();
            if member != 0 {
                self.metrics.set_watch_member(member);
            }
            let changes: Vec<Change> = events.into_iter().map(|ev| self.parse(ev, log)).collect();
            if let Some(last) = changes.last() {
                reached = reached.max(last.revision());
            }
            reached = reached.max(at);
            self.inbox.changes(changes, reached);
        }
    }

    /// An event as a change of a lease.
    fn parse(&self, ev: WatchEvent, log: &mut Warnings) -> Change {
        match ev {
            WatchEvent::Put(kv) => match parse_lease(&self.prefix, &kv) {
                Ok(l) => Change::Put(l),
                Err(why) => {
                    self.metrics.inc_malformed_leases(1);
                    log.malformed(&kv, &why);
                    Change::Malformed {
                        key: kv.key,
                        why,
                        revision: kv.mod_revision,
                    }
                }
            },
            WatchEvent::Delete { key, revision } => Change::Delete { key, revision },
        }
    }
}

/// How long a watch may hear nothing before it asks: [`SILENT`] to twice
/// that, at random.
fn silence(rng: &mut StdRng) -> Duration {
    SILENT + Duration::from_millis(rng.random_range(0..=SILENT.as_millis() as u64))
}

/// Warnings about malformed keys put while watching: a writer that puts
/// junk in a loop gets a few lines a minute, and a count of the rest.
#[derive(Default)]
struct Warnings {
    since: Option<Instant>,
    said: u32,
    unsaid: u64,
}

impl Warnings {
    const PER_MINUTE: u32 = 10;

    fn reset(&mut self) {
        *self = Self::default();
    }

    fn malformed(&mut self, kv: &KeyValue, why: &NotALease) {
        let now = Instant::now();
        if self
            .since
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
        {
            if self.unsaid > 0 {
                tracing::warn!(
                    count = self.unsaid,
                    "more keys that hold no lease were put under the subnets prefix in the last minute (not each logged)"
                );
            }
            self.since = Some(now);
            self.said = 0;
            self.unsaid = 0;
        }
        if self.said < Self::PER_MINUTE {
            self.said += 1;
            tracing::warn!(key = %kv.key.chars().take(200).collect::<String>(), reason = %why, "skipping a key that holds no lease");
        } else {
            self.unsaid += 1;
        }
    }
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
            Err(why) => bad.push((kv.key.clone(), why.to_string())),
        }
    }
    leases.sort_by_key(|l| l.subnet);
    Ok((leases, bad))
}
