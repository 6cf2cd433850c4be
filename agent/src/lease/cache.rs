//! Every lease in etcd, as one node knows it: the one copy, parsed from
//! what the watch delivers, with duplicate and stale events (older etcd
//! releases can repeat events after a reconnect) recognised by their
//! revision and dropped, and a fresh listing diffed against what was known.
//! A malformed value from another writer is skipped with a warning naming
//! its key and counted; it never stops anything. The lease view owns it.

use std::{
    borrow::Borrow,
    collections::{HashMap, HashSet},
    hash::{Hash, Hasher},
    sync::Arc,
};

use super::{
    attrs::LeaseAttrs,
    key::{Subnets, parse_key},
    store::{KeyValue, Listing, WatchEvent},
};
use crate::metrics::Metrics;

/// A lease as seen in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
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

/// A lease in a set, found by its key: the key is kept once, in the lease
/// (at 50,000 leases a second copy as a map's key was 4.8 MB).
#[derive(Debug)]
struct ByKey(Lease);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl Hash for ByKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // As the key's own hash, so a lookup by `&str` finds it.
        self.0.key.as_str().hash(h);
    }
}

impl Borrow<str> for ByKey {
    fn borrow(&self) -> &str {
        &self.0.key
    }
}

/// What the node knows of the leases, and the diffing that turns etcd's
/// changes into changes of leases.
#[derive(Default)]
pub(super) struct LeaseCache {
    prefix: String,
    leases: HashSet<ByKey>,
    /// The revision of the last change applied to each key that holds no
    /// lease (deleted, or malformed), to drop duplicates and stale events;
    /// a key that holds one has it in the lease's `mod_revision`.
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
        parse_lease(&self.prefix, kv)
            .map_err(|why| self.malformed(&kv.key, &why))
            .ok()
    }

    /// The leases known.
    pub(super) fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.iter().map(|l| &l.0)
    }

    /// Whether `key` holds a lease.
    pub(super) fn contains(&self, key: &str) -> bool {
        self.leases.contains(key)
    }

    /// The revision of the last change applied to `key`.
    fn last_revision(&self, key: &str) -> Option<i64> {
        match self.leases.get(key) {
            Some(l) => Some(l.0.mod_revision),
            None => self.seen.get(key).copied(),
        }
    }

    /// What a watch event changes.
    pub(super) fn take(&mut self, ev: WatchEvent) -> Vec<LeaseEvent> {
        match ev {
            WatchEvent::Put(kv) => self.put(&kv, true).into_iter().collect(),
            WatchEvent::Delete { key, revision } => {
                self.delete(&key, revision).into_iter().collect()
            }
            WatchEvent::Listed(listing) => self.resync(&listing),
        }
    }

    /// Records a change made elsewhere (tests feed changes directly).
    #[cfg(test)]
    pub(super) fn record(&mut self, ev: &LeaseEvent) {
        match ev {
            LeaseEvent::Added(l) | LeaseEvent::Changed { new: l, .. } => {
                self.leases.replace(ByKey(l.clone()));
            }
            LeaseEvent::Removed(l) => {
                self.leases.remove(l.key.as_str());
            }
            LeaseEvent::Listing | LeaseEvent::Synced { .. } => {}
        }
    }

    /// A put seen at `kv.mod_revision`; with `stale_check`, dropped unless
    /// newer than the last change applied to its key.
    fn put(&mut self, kv: &KeyValue, stale_check: bool) -> Option<LeaseEvent> {
        if stale_check
            && self
                .last_revision(&kv.key)
                .is_some_and(|r| r >= kv.mod_revision)
        {
            return None;
        }
        let Some(new) = self.parse(kv) else {
            // A lease rewritten as junk is no lease any more: its peer goes.
            self.seen.insert(kv.key.clone(), kv.mod_revision);
            return self
                .leases
                .take(kv.key.as_str())
                .map(|old| LeaseEvent::Removed(old.0));
        };
        self.seen.remove(&kv.key);
        match self.leases.replace(ByKey(new.clone())) {
            None => Some(LeaseEvent::Added(new)),
            Some(old) if old.0 == new => None,
            Some(old) => Some(LeaseEvent::Changed { old: old.0, new }),
        }
    }

    /// A delete seen at `revision`.
    fn delete(&mut self, key: &str, revision: i64) -> Option<LeaseEvent> {
        if self.last_revision(key).is_some_and(|r| r >= revision) {
            return None;
        }
        self.seen.insert(key.to_string(), revision);
        self.leases.take(key).map(|old| LeaseEvent::Removed(old.0))
    }

    /// Replaces what is known with a fresh listing; returns the difference.
    fn resync(&mut self, listing: &Listing) -> Vec<LeaseEvent> {
        let mut events = vec![LeaseEvent::Listing];
        let present: HashSet<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
        for kv in &listing.kvs {
            // A listing is authoritative: no per-key revision holds, so a
            // key recreated at a lower revision than a stale tombstone
            // counts.
            if let Some(ev) = self.put(kv, false) {
                events.push(ev);
            }
        }
        let gone: Vec<String> = self
            .leases
            .iter()
            .filter(|l| !present.contains(l.0.key.as_str()))
            .map(|l| l.0.key.clone())
            .collect();
        for k in gone {
            if let Some(old) = self.leases.take(k.as_str()) {
                events.push(LeaseEvent::Removed(old.0));
            }
        }
        self.seen.retain(|k, _| present.contains(k.as_str()));
        events.push(LeaseEvent::Synced {
            revision: listing.revision,
        });
        events
    }
}

/// A key under the prefix as a lease, or why it is none.
pub(super) fn parse_lease(prefix: &str, kv: &KeyValue) -> Result<Lease, String> {
    let suffix = kv
        .key
        .strip_prefix(prefix)
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
            matches!(c.put(&a, true), Some(LeaseEvent::Added(l)) if l.subnet.to_string() == "10.5.1.0/24")
        );
        assert_eq!(c.put(&a, true), None, "a duplicate is dropped");
        assert!(c.seen.is_empty(), "a live lease keeps its revision itself");
        let mut a2 = kv("10.5.1.0-24", "198.18.0.9", 6);
        a2.create_revision = 5;
        match c.put(&a2, true) {
            Some(LeaseEvent::Changed { old, new }) => {
                assert_eq!(old.attrs.public_ip.to_string(), "198.18.0.1");
                assert_eq!(new.attrs.public_ip.to_string(), "198.18.0.9");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.put(&a, true), None, "an older event is stale");
        match c.delete(&a.key, 7) {
            Some(LeaseEvent::Removed(l)) => assert_eq!(l.attrs.public_ip.to_string(), "198.18.0.9"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.delete(&a.key, 7), None);
        assert_eq!(
            c.put(&a2, true),
            None,
            "a put older than the delete is stale"
        );
        assert_eq!(
            c.seen.get(&a.key),
            Some(&7),
            "a deleted key keeps its revision"
        );
        assert!(c.is_empty());
        assert_eq!(m.malformed_leases(), 0);
    }

    #[test]
    fn malformed_values_are_skipped_and_counted() {
        let m = Arc::new(Metrics::default());
        let mut c = LeaseCache::new("/p/subnets/", Some(m.clone()));
        let mut bad = kv("10.5.1.0-24", "198.18.0.1", 5);
        bad.value = b"{not json".to_vec();
        assert_eq!(c.put(&bad, true), None);
        let mut badkey = kv("10.5.1.0-24", "198.18.0.1", 6);
        badkey.key = "/p/subnets/banana".into();
        assert_eq!(c.put(&badkey, true), None);
        assert_eq!(m.malformed_leases(), 2);
        // A good value after that is seen normally.
        assert!(matches!(
            c.put(&kv("10.5.1.0-24", "198.18.0.1", 7), true),
            Some(LeaseEvent::Added(_))
        ));
        // Rewritten as junk: the lease is gone (its peer must not stay).
        let mut junk = kv("10.5.1.0-24", "198.18.0.1", 8);
        junk.value = b"{not json".to_vec();
        assert!(
            matches!(c.put(&junk, true), Some(LeaseEvent::Removed(l)) if l.attrs.public_ip.to_string() == "198.18.0.1")
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
