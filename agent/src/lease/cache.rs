//! Every lease in etcd, as one node knows it: the one copy, built from what
//! the watch hands over (already parsed: [`Change`], [`Snapshot`]), with
//! duplicate and stale changes recognised by their revision and dropped,
//! and a fresh listing diffed against what was known. Keys that hold no
//! lease are not kept at all: the watch counts them and says so. The lease
//! view owns the cache.

use std::{
    borrow::Borrow,
    collections::HashSet,
    hash::{Hash, Hasher},
};

use super::{
    attrs::LeaseAttrs,
    key::{Subnets, parse_key},
    store::KeyValue,
};

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

/// What a watch hands over of one key's change, parsed where it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Put(Lease),
    /// A put of something that is no lease (why): a lease there before is
    /// gone.
    Malformed {
        key: String,
        why: NotALease,
        revision: i64,
    },
    Delete {
        key: String,
        revision: i64,
    },
}

impl Change {
    /// The key changed.
    pub(crate) fn key(&self) -> &str {
        match self {
            Change::Put(l) => &l.key,
            Change::Malformed { key, .. } | Change::Delete { key, .. } => key,
        }
    }

    /// The revision of the change.
    pub(crate) fn revision(&self) -> i64 {
        match self {
            Change::Put(l) => l.mod_revision,
            Change::Malformed { revision, .. } | Change::Delete { revision, .. } => *revision,
        }
    }
}

/// Every lease under the prefix at one revision, parsed page by page as
/// it was read; of the keys that hold none, only how many and a few
/// examples are kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) revision: i64,
    /// The etcd cluster it was read from (0: unknown).
    pub(crate) cluster: u64,
    pub(crate) leases: Vec<Lease>,
    pub(crate) skipped: Skipped,
}

/// The keys of a listing that hold no lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Skipped {
    /// Keys that are no lease's key (not under the prefix, not a subnet,
    /// not UTF-8, too long).
    pub(crate) keys: u64,
    /// Keys of a subnet whose value is no lease.
    pub(crate) values: u64,
    /// The first few, with why.
    pub(crate) examples: Vec<(String, String)>,
}

impl Skipped {
    /// How many examples are kept.
    pub(crate) const EXAMPLES: usize = 5;

    pub(crate) fn total(&self) -> u64 {
        self.keys + self.values
    }

    pub(crate) fn add(&mut self, key: &str, why: &NotALease) {
        match why {
            NotALease::Key(_) => self.keys += 1,
            NotALease::Value(_) => self.values += 1,
        }
        if self.examples.len() < Self::EXAMPLES {
            // A junk key may be long: an example keeps its start.
            let mut k: String = key.chars().take(120).collect();
            if k.len() < key.len() {
                k.push_str("...");
            }
            self.examples.push((k, why.to_string()));
        }
    }
}

/// Why a key under the prefix holds no lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NotALease {
    /// The key names no subnet.
    Key(String),
    /// The key names a subnet; its value is no lease.
    Value(String),
}

impl std::fmt::Display for NotALease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotALease::Key(w) => write!(f, "not a lease's key: {w}"),
            NotALease::Value(w) => write!(f, "not a lease: {w}"),
        }
    }
}

/// What the node knows of the leases, and the diffing that turns changes
/// into changes of leases.
#[derive(Default)]
pub(super) struct LeaseCache {
    leases: HashSet<ByKey>,
    /// The revision of the last snapshot: a change at or below it is in the
    /// snapshot already. (A watch resumes after the last revision it
    /// delivered, so it repeats nothing; a change of a key that holds a
    /// lease is also checked against the lease's own revision.)
    floor: i64,
    /// The etcd cluster the last snapshot was read from.
    cluster: u64,
}

impl LeaseCache {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.leases.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The leases known.
    pub(super) fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.iter().map(|l| &l.0)
    }

    /// The etcd cluster the leases were read from (0: unknown).
    pub(super) fn cluster(&self) -> u64 {
        self.cluster
    }

    /// How many leases are known.
    pub(super) fn count(&self) -> usize {
        self.leases.len()
    }

    /// The lease `key` holds.
    pub(super) fn get(&self, key: &str) -> Option<&Lease> {
        self.leases.get(key).map(|l| &l.0)
    }

    /// Whether `key` holds a lease.
    pub(super) fn contains(&self, key: &str) -> bool {
        self.leases.contains(key)
    }

    /// What a change changes of the leases (None: nothing, or stale).
    pub(super) fn change(&mut self, c: Change) -> Option<LeaseEvent> {
        let revision = c.revision();
        if revision <= self.floor
            || self
                .leases
                .get(c.key())
                .is_some_and(|l| l.0.mod_revision >= revision)
        {
            return None;
        }
        match c {
            Change::Put(new) => match self.leases.replace(ByKey(new.clone())) {
                None => Some(LeaseEvent::Added(new)),
                Some(old) if old.0 == new => None,
                Some(old) => Some(LeaseEvent::Changed { old: old.0, new }),
            },
            // A lease rewritten as junk is no lease any more: its peer goes.
            Change::Malformed { key, .. } | Change::Delete { key, .. } => self
                .leases
                .take(key.as_str())
                .map(|old| LeaseEvent::Removed(old.0)),
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

    /// Replaces what is known with a fresh snapshot; returns the
    /// difference, between [`LeaseEvent::Listing`] and
    /// [`LeaseEvent::Synced`].
    pub(super) fn resync(&mut self, snapshot: Snapshot) -> Vec<LeaseEvent> {
        let mut events = vec![LeaseEvent::Listing];
        let mut fresh: HashSet<ByKey> = HashSet::with_capacity(snapshot.leases.len());
        for new in snapshot.leases {
            // A snapshot is authoritative: a key recreated at a lower
            // revision than what was known counts.
            match self.leases.take(new.key.as_str()) {
                None => events.push(LeaseEvent::Added(new.clone())),
                Some(old) if old.0 == new => {}
                Some(old) => events.push(LeaseEvent::Changed {
                    old: old.0,
                    new: new.clone(),
                }),
            }
            fresh.replace(ByKey(new));
        }
        for gone in self.leases.drain() {
            events.push(LeaseEvent::Removed(gone.0));
        }
        self.leases = fresh;
        self.floor = snapshot.revision;
        self.cluster = snapshot.cluster;
        events.push(LeaseEvent::Synced {
            revision: snapshot.revision,
        });
        events
    }
}

/// A key under the prefix as a lease, or why it is none.
pub(super) fn parse_lease(prefix: &str, kv: &KeyValue) -> Result<Lease, NotALease> {
    let suffix = kv
        .key
        .strip_prefix(prefix)
        .ok_or_else(|| NotALease::Key("outside the subnets prefix".to_string()))?;
    let subnet = parse_key(suffix).map_err(|e| NotALease::Key(e.to_string()))?;
    if kv.value.len() > super::etcd::MAX_VALUE_BYTES {
        return Err(NotALease::Value(format!(
            "a value of more than {} bytes (a lease is a few hundred)",
            super::etcd::MAX_VALUE_BYTES
        )));
    }
    let attrs = LeaseAttrs::parse(&kv.value).map_err(|e| NotALease::Value(e.to_string()))?;
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

    fn put(kv: &KeyValue) -> Change {
        match parse_lease("/p/subnets/", kv) {
            Ok(l) => Change::Put(l),
            Err(why) => Change::Malformed {
                key: kv.key.clone(),
                why,
                revision: kv.mod_revision,
            },
        }
    }

    #[test]
    fn changes_with_duplicates_and_stale_ones_dropped() {
        let mut c = LeaseCache::default();
        let a = kv("10.5.1.0-24", "198.18.0.1", 5);
        assert!(
            matches!(c.change(put(&a)), Some(LeaseEvent::Added(l)) if l.subnet.to_string() == "10.5.1.0/24")
        );
        assert_eq!(c.change(put(&a)), None, "a duplicate is dropped");
        let mut a2 = kv("10.5.1.0-24", "198.18.0.9", 6);
        a2.create_revision = 5;
        match c.change(put(&a2)) {
            Some(LeaseEvent::Changed { old, new }) => {
                assert_eq!(old.attrs.public_ip.to_string(), "198.18.0.1");
                assert_eq!(new.attrs.public_ip.to_string(), "198.18.0.9");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.change(put(&a)), None, "an older change is stale");
        let del = Change::Delete {
            key: a.key.clone(),
            revision: 7,
        };
        match c.change(del.clone()) {
            Some(LeaseEvent::Removed(l)) => assert_eq!(l.attrs.public_ip.to_string(), "198.18.0.9"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.change(del), None);
        assert!(c.is_empty());
        // After a snapshot at 9, nothing at or below 9 applies.
        c.resync(Snapshot {
            revision: 9,
            ..Default::default()
        });
        assert_eq!(c.change(put(&kv("10.5.2.0-24", "198.18.0.2", 9))), None);
        assert!(
            c.change(put(&kv("10.5.2.0-24", "198.18.0.2", 10)))
                .is_some()
        );
    }

    #[test]
    fn malformed_values_remove_the_lease_they_overwrite() {
        let mut c = LeaseCache::default();
        let mut bad = kv("10.5.1.0-24", "198.18.0.1", 5);
        bad.value = b"{not json".to_vec();
        assert!(matches!(
            put(&bad),
            Change::Malformed {
                why: NotALease::Value(_),
                ..
            }
        ));
        assert_eq!(c.change(put(&bad)), None);
        let mut badkey = kv("10.5.1.0-24", "198.18.0.1", 6);
        badkey.key = "/p/subnets/banana".into();
        assert!(matches!(
            put(&badkey),
            Change::Malformed {
                why: NotALease::Key(_),
                ..
            }
        ));
        // A good value after that is seen normally.
        assert!(matches!(
            c.change(put(&kv("10.5.1.0-24", "198.18.0.1", 7))),
            Some(LeaseEvent::Added(_))
        ));
        // Rewritten as junk: the lease is gone (its peer must not stay).
        let mut junk = kv("10.5.1.0-24", "198.18.0.1", 8);
        junk.value = b"{not json".to_vec();
        assert!(
            matches!(c.change(put(&junk)), Some(LeaseEvent::Removed(l)) if l.attrs.public_ip.to_string() == "198.18.0.1")
        );
        assert!(c.is_empty());
    }

    #[test]
    fn resync_diffs_against_what_was_seen() {
        let mut c = LeaseCache::default();
        let lease = |kv: &KeyValue| parse_lease("/p/subnets/", kv).unwrap();
        let a = kv("10.5.1.0-24", "198.18.0.1", 5);
        let b = kv("10.5.2.0-24", "198.18.0.2", 6);
        let ev = c.resync(Snapshot {
            revision: 6,
            cluster: 0,
            leases: vec![lease(&a), lease(&b)],
            skipped: Skipped::default(),
        });
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0], LeaseEvent::Listing);
        assert_eq!(ev[3], LeaseEvent::Synced { revision: 6 });
        // Meanwhile (changes missed): a removed, b changed, c added.
        let mut b2 = kv("10.5.2.0-24", "198.18.0.22", 9);
        b2.create_revision = 6;
        let cc = kv("10.5.3.0-24", "198.18.0.3", 8);
        let ev = c.resync(Snapshot {
            revision: 9,
            cluster: 0,
            leases: vec![lease(&b2), lease(&cc)],
            skipped: Skipped::default(),
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

    #[test]
    fn skipped_keys_keep_a_few_examples_cut_short() {
        let mut s = Skipped::default();
        let long = format!("/p/subnets/{}", "x".repeat(2000));
        for _ in 0..1000 {
            s.add(&long, &NotALease::Key("junk".into()));
        }
        s.add("/p/subnets/10.5.1.0-24", &NotALease::Value("junk".into()));
        assert_eq!((s.keys, s.values, s.total()), (1000, 1, 1001));
        assert_eq!(s.examples.len(), Skipped::EXAMPLES);
        assert!(s.examples[0].0.len() < 130, "{}", s.examples[0].0);
    }
}
