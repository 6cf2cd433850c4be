//! Following every lease in etcd.
//!
//! List the subnets prefix at revision R, watch from R+1 with previous
//! values; on compaction, cancellation or a broken stream, list again and
//! diff against what was seen. Duplicate or stale events (older etcd releases
//! can repeat events after a reconnect) are recognised by their revision and
//! dropped. A malformed value from another writer is skipped with a warning
//! naming its key and counted; it never stops the watch.
//!
//! A watch can go silent without breaking (its member cut off from clients,
//! a connection that hangs): every 1 s the watch asks etcd for a progress
//! notification, and one that has heard nothing (no event, no progress) for
//! 5 s starts again from a fresh list, on whatever member is in rotation.
//! So does one whose member was taken out of rotation ([`super::members`]),
//! and one whose client was replaced. The time since the watch last knew it
//! was current is `weft_etcd_watch_lag_seconds`; the agent is not ready
//! while it exceeds 15 s.

use std::{collections::HashMap, sync::Arc, time::Duration};

use etcd_client::{EventType, WatchOptions};
use tokio::sync::{Notify, mpsc};

use super::{
    attrs::LeaseAttrs,
    etcd::{EtcdStore, store_error, to_kv},
    key::{Subnets, parse_key},
    store::{KeyValue, Listing},
};
use crate::{backoff::Backoff, metrics::Metrics};

/// A lease as seen in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub subnet: Subnets,
    pub key: String,
    pub attrs: LeaseAttrs,
    /// The etcd lease attached; 0 for a reservation.
    pub lease_id: i64,
    pub create_revision: i64,
    pub mod_revision: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LeaseEvent {
    Added(Lease),
    /// Carries the full value the lease had.
    Removed(Lease),
    Changed {
        old: Lease,
        new: Lease,
    },
    /// A fresh list follows, as events ended by [`LeaseEvent::Synced`]
    /// (no need to decide anything before that end).
    Listing,
    /// The events so far add up to etcd's state at `revision` (sent after
    /// every list, the first one included).
    Synced {
        revision: i64,
    },
}

/// What the watcher knows, and the diffing that turns etcd's view into events.
#[derive(Default)]
pub(super) struct LeaseCache {
    prefix: String,
    leases: HashMap<String, Lease>,
    /// The revision of the last change applied to each key (deletes too), to
    /// drop duplicates and stale events.
    seen: HashMap<String, i64>,
    metrics: Option<Arc<Metrics>>,
}

impl LeaseCache {
    pub(super) fn new(prefix: &str, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            prefix: prefix.to_string(),
            metrics,
            ..Default::default()
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.leases.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    fn malformed(&self, key: &str, why: &str) {
        tracing::warn!(key, reason = why, "skipping a malformed lease");
        if let Some(m) = &self.metrics {
            m.inc_malformed_lease();
        }
    }

    fn parse(&self, kv: &KeyValue) -> Option<Lease> {
        self.parse_quiet(kv)
            .map_err(|why| self.malformed(&kv.key, &why))
            .ok()
    }

    fn parse_quiet(&self, kv: &KeyValue) -> Result<Lease, String> {
        let suffix = kv
            .key
            .strip_prefix(&self.prefix)
            .ok_or_else(|| "key outside the subnets prefix".to_string())?;
        let subnet = parse_key(suffix).map_err(|e| e.to_string())?;
        if kv.value.len() > super::etcd::MAX_VALUE_BYTES {
            return Err(format!(
                "a value of more than {} bytes (a lease is a few hundred)",
                super::etcd::MAX_VALUE_BYTES
            ));
        }
        let attrs = LeaseAttrs::parse(&kv.value).map_err(|e| e.to_string())?;
        Ok(Lease {
            subnet,
            key: kv.key.clone(),
            attrs,
            lease_id: kv.lease,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        })
    }

    /// A put seen at `kv.mod_revision`.
    pub(super) fn put(&mut self, kv: &KeyValue) -> Option<LeaseEvent> {
        if self
            .seen
            .get(&kv.key)
            .is_some_and(|r| *r >= kv.mod_revision)
        {
            return None;
        }
        self.seen.insert(kv.key.clone(), kv.mod_revision);
        let Some(new) = self.parse(kv) else {
            // A lease rewritten as junk is no lease any more: its peer goes.
            return self.leases.remove(&kv.key).map(LeaseEvent::Removed);
        };
        match self.leases.insert(kv.key.clone(), new.clone()) {
            None => Some(LeaseEvent::Added(new)),
            Some(old) if old == new => None,
            Some(old) => Some(LeaseEvent::Changed { old, new }),
        }
    }

    /// A delete seen at `revision`.
    pub(super) fn delete(&mut self, key: &str, revision: i64) -> Option<LeaseEvent> {
        if self.seen.get(key).is_some_and(|r| *r >= revision) {
            return None;
        }
        self.seen.insert(key.to_string(), revision);
        self.leases.remove(key).map(LeaseEvent::Removed)
    }

    /// Replaces what is known with a fresh listing; returns the difference.
    pub(super) fn resync(&mut self, listing: &Listing) -> Vec<LeaseEvent> {
        let mut events = vec![LeaseEvent::Listing];
        let mut present = std::collections::HashSet::new();
        for kv in &listing.kvs {
            present.insert(kv.key.clone());
            // A listing is authoritative: forget the per-key revision so a
            // key recreated at a lower revision than a stale tombstone counts.
            self.seen.remove(&kv.key);
            if let Some(ev) = self.put(kv) {
                events.push(ev);
            }
        }
        let gone: Vec<String> = self
            .leases
            .keys()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(old) = self.leases.remove(&k) {
                events.push(LeaseEvent::Removed(old));
            }
        }
        self.seen.retain(|k, _| present.contains(k));
        events.push(LeaseEvent::Synced {
            revision: listing.revision,
        });
        events
    }
}

/// How often the watch asks for a progress notification.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A watch that heard nothing for this long starts again (a healthy member
/// answers a progress request in milliseconds).
const SILENT: Duration = Duration::from_secs(5);

/// Follows `<prefix>/subnets/` forever, sending events on `tx`. Returns when
/// the receiver is gone. `moved`: a member was taken out of rotation.
pub(crate) async fn run(
    store: EtcdStore,
    subnets_prefix: String,
    tx: mpsc::Sender<LeaseEvent>,
    metrics: Arc<Metrics>,
    moved: Arc<Notify>,
) {
    use super::store::Store as _;
    let mut cache = LeaseCache::new(&subnets_prefix, Some(metrics.clone()));
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
        for ev in cache.resync(&listing) {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
        let w = Watching {
            prefix: &subnets_prefix,
            revision: listing.revision,
            moved: &moved,
            metrics: &metrics,
        };
        match follow(&store, w, &mut cache, &tx).await {
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

async fn follow(
    store: &EtcdStore,
    w: Watching<'_>,
    cache: &mut LeaseCache,
    tx: &mpsc::Sender<LeaseEvent>,
) -> Follow {
    let Watching {
        prefix,
        revision,
        moved,
        metrics,
    } = w;
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(revision + 1);
    let mut received = false;
    let resync = |reason: String, received: bool| Follow::Resync { reason, received };
    let mut generation = store.generation();
    generation.mark_unchanged();
    let mut stream = match store.client().watch(prefix, Some(opts)).await {
        Ok(s) => s,
        Err(e) => return resync(format!("cannot start the watch: {}", store_error(e)), false),
    };
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = tokio::time::Instant::now();
    loop {
        let next = tokio::select! {
            m = stream.message() => m,
            _ = progress.tick() => {
                if heard.elapsed() > SILENT {
                    return resync(
                        format!("the watch heard nothing (no event, no progress) for {SILENT:?}"),
                        received,
                    );
                }
                // An old etcd without progress requests just never answers:
                // then events (or the silence check) keep the watch honest.
                let _ = stream.request_progress().await;
                continue;
            }
            () = moved.notified() => {
                return resync("its etcd member may have been taken out of rotation".into(), received);
            }
            _ = generation.changed() => {
                return resync("the etcd client was replaced".into(), received);
            }
        };
        let resp = match next {
            Ok(Some(r)) => r,
            Ok(None) => return resync("the watch stream ended".into(), received),
            Err(e) => {
                return resync(
                    format!("the watch stream broke: {}", store_error(e)),
                    received,
                );
            }
        };
        heard = tokio::time::Instant::now();
        metrics.watch_confirmed();
        if let Some(h) = resp.header() {
            metrics.set_watch_member(h.member_id());
        }
        if resp.compact_revision() > 0 {
            return resync(
                format!(
                    "revision {} was compacted (oldest kept: {})",
                    revision + 1,
                    resp.compact_revision()
                ),
                received,
            );
        }
        if resp.canceled() {
            return resync(
                format!("the watch was cancelled: {}", resp.cancel_reason()),
                received,
            );
        }
        received = true;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let kv = to_kv(kv);
            let out = match ev.event_type() {
                EventType::Put => cache.put(&kv),
                EventType::Delete => cache.delete(&kv.key, kv.mod_revision),
            };
            if let Some(out) = out
                && tx.send(out).await.is_err()
            {
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
pub(crate) async fn list_once(
    store: &EtcdStore,
    prefix: &str,
) -> anyhow::Result<(Vec<Lease>, Vec<(String, String)>)> {
    use super::store::Store as _;
    let listing = store.list(prefix).await?;
    let cache = LeaseCache::new(prefix, None);
    let mut leases = Vec::new();
    let mut bad = Vec::new();
    for kv in &listing.kvs {
        match cache.parse_quiet(kv) {
            Ok(l) => leases.push(l),
            Err(why) => bad.push((kv.key.clone(), why)),
        }
    }
    leases.sort_by_key(|l| l.subnet);
    Ok((leases, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(subnet: &str, ip: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: format!("/p/subnets/{subnet}"),
            value: format!(r#"{{"PublicIP":"{ip}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:00:01"}}}}"#).into_bytes(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 7,
        }
    }

    #[test]
    fn events_from_puts_and_deletes_with_duplicates_dropped() {
        let m = Arc::new(Metrics::default());
        let mut c = LeaseCache::new("/p/subnets/", Some(m.clone()));
        let a = kv("10.5.1.0-24", "198.18.0.1", 5);
        assert!(
            matches!(c.put(&a), Some(LeaseEvent::Added(l)) if l.subnet.to_string() == "10.5.1.0/24")
        );
        assert_eq!(c.put(&a), None, "a duplicate is dropped");
        let mut a2 = kv("10.5.1.0-24", "198.18.0.9", 6);
        a2.create_revision = 5;
        match c.put(&a2) {
            Some(LeaseEvent::Changed { old, new }) => {
                assert_eq!(old.attrs.public_ip.to_string(), "198.18.0.1");
                assert_eq!(new.attrs.public_ip.to_string(), "198.18.0.9");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.put(&a), None, "an older event is stale");
        match c.delete(&a.key, 7) {
            Some(LeaseEvent::Removed(l)) => assert_eq!(l.attrs.public_ip.to_string(), "198.18.0.9"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.delete(&a.key, 7), None);
        assert_eq!(c.put(&a2), None, "a put older than the delete is stale");
        assert!(c.is_empty());
        assert_eq!(m.malformed_leases(), 0);
    }

    #[test]
    fn malformed_values_are_skipped_and_counted() {
        let m = Arc::new(Metrics::default());
        let mut c = LeaseCache::new("/p/subnets/", Some(m.clone()));
        let mut bad = kv("10.5.1.0-24", "198.18.0.1", 5);
        bad.value = b"{not json".to_vec();
        assert_eq!(c.put(&bad), None);
        let mut badkey = kv("10.5.1.0-24", "198.18.0.1", 6);
        badkey.key = "/p/subnets/banana".into();
        assert_eq!(c.put(&badkey), None);
        assert_eq!(m.malformed_leases(), 2);
        // A good value after that is seen normally.
        assert!(matches!(
            c.put(&kv("10.5.1.0-24", "198.18.0.1", 7)),
            Some(LeaseEvent::Added(_))
        ));
        // Rewritten as junk: the lease is gone (its peer must not stay).
        let mut junk = kv("10.5.1.0-24", "198.18.0.1", 8);
        junk.value = b"{not json".to_vec();
        assert!(
            matches!(c.put(&junk), Some(LeaseEvent::Removed(l)) if l.attrs.public_ip.to_string() == "198.18.0.1")
        );
        assert!(c.is_empty());
        assert_eq!(m.malformed_leases(), 3);
    }

    #[test]
    fn resync_diffs_against_what_was_seen() {
        let mut c = LeaseCache::new("/p/subnets/", None);
        let a = kv("10.5.1.0-24", "198.18.0.1", 5);
        let b = kv("10.5.2.0-24", "198.18.0.2", 6);
        let ev = c.resync(&Listing {
            revision: 6,
            kvs: vec![a.clone(), b.clone()],
        });
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0], LeaseEvent::Listing);
        assert_eq!(ev[3], LeaseEvent::Synced { revision: 6 });
        // Meanwhile (events missed): a removed, b changed, c added.
        let mut b2 = kv("10.5.2.0-24", "198.18.0.22", 9);
        b2.create_revision = 6;
        let cc = kv("10.5.3.0-24", "198.18.0.3", 8);
        let ev = c.resync(&Listing {
            revision: 9,
            kvs: vec![b2, cc],
        });
        assert!(
            ev.iter()
                .any(|e| matches!(e, LeaseEvent::Removed(l) if l.key == a.key))
        );
        assert!(ev.iter().any(|e| matches!(e, LeaseEvent::Changed { new, .. } if new.attrs.public_ip.to_string() == "198.18.0.22")));
        assert!(
            ev.iter().any(
                |e| matches!(e, LeaseEvent::Added(l) if l.subnet.to_string() == "10.5.3.0/24")
            )
        );
        assert_eq!(c.len(), 2);
    }
}
