//! An in-memory etcd for the lease layer's own tests: revisions, compare
//! semantics, leases that expire on tokio's clock and take their keys with
//! them, a watch with compaction and progress notifications, keep-alives,
//! and an outage switch. The holder, the keeper, the watch and the view run
//! on it unchanged, so the lease layer is tested end to end without an
//! etcd (the safety claims are tested against a real one too).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::store::{
    Compare, KeepAlive, KeyValue, Listing, Op, Store, StoreError, TxnOutcome, WatchEvent,
    WatchResponse, WatchStream,
};

#[derive(Default)]
struct State {
    rev: i64,
    kvs: BTreeMap<String, KeyValue>,
    /// Lease id -> (TTL, expiry).
    leases: HashMap<i64, (Duration, Instant)>,
    next_lease: i64,
    /// Every change, in order (what a watch replays).
    log: Vec<(i64, WatchEvent)>,
    /// Revisions up to this one are compacted away.
    compacted: i64,
    down: bool,
}

impl State {
    fn up(&self) -> Result<(), StoreError> {
        if self.down {
            return Err(StoreError::Unavailable("the in-memory etcd is down".into()));
        }
        Ok(())
    }

    /// Leases past their expiry go, with their keys (one revision).
    fn expire(&mut self) {
        let now = Instant::now();
        let dead: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.revoke(id);
        }
    }

    fn revoke(&mut self, id: i64) {
        self.leases.remove(&id);
        let keys: Vec<String> = self
            .kvs
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        if keys.is_empty() {
            return;
        }
        self.rev += 1;
        for key in keys {
            self.delete(key);
        }
    }

    fn delete(&mut self, key: String) {
        if self.kvs.remove(&key).is_some() {
            let revision = self.rev;
            self.log
                .push((revision, WatchEvent::Delete { key, revision }));
        }
    }

    fn put(&mut self, key: String, value: Vec<u8>, lease: i64) {
        let rev = self.rev;
        let old = self.kvs.get(&key);
        let kv = KeyValue {
            key: key.clone(),
            value,
            create_revision: old.map_or(rev, |o| o.create_revision),
            mod_revision: rev,
            version: old.map_or(1, |o| o.version + 1),
            lease,
        };
        self.log.push((rev, WatchEvent::Put(kv.clone())));
        self.kvs.insert(key, kv);
    }

    fn holds(&self, c: &Compare) -> bool {
        let field = |k: &String, f: fn(&KeyValue) -> i64| self.kvs.get(k).map_or(0, f);
        match c {
            Compare::CreateRevision(k, r) => field(k, |kv| kv.create_revision) == *r,
            Compare::ModRevision(k, r) => field(k, |kv| kv.mod_revision) == *r,
            Compare::Lease(k, l) => field(k, |kv| kv.lease) == *l,
        }
    }

    fn list(&self, prefix: &str) -> Listing {
        Listing {
            revision: self.rev,
            kvs: self
                .kvs
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, kv)| kv.clone())
                .collect(),
        }
    }
}

/// The store; clones share it.
#[derive(Clone, Default)]
pub(crate) struct MemStore {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl MemStore {
    /// Runs `f` on the state after expiring what is due; wakes the
    /// watches if anything changed (only then: a watch's own look wakes
    /// no one).
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().expect("state lock");
        let before = (s.rev, s.compacted, s.down);
        s.expire();
        let r = f(&mut s);
        let changed = (s.rev, s.compacted, s.down) != before;
        drop(s);
        if changed {
            self.changed.notify_waiters();
        }
        r
    }

    /// A plain put (an operator's `etcdctl put`).
    pub(crate) fn put(&self, key: &str, value: &[u8]) {
        self.with(|s| {
            s.rev += 1;
            s.put(key.to_string(), value.to_vec(), 0);
        });
    }

    /// Revokes an etcd lease (its keys go).
    pub(crate) fn revoke(&self, id: i64) {
        self.with(|s| s.revoke(id));
    }

    /// Compacts the history up to the current revision: watches from
    /// before it must list again.
    pub(crate) fn compact(&self) {
        self.with(|s| {
            s.compacted = s.rev;
            s.log.clear();
        });
    }

    /// An outage: every request fails, watches break.
    pub(crate) fn set_down(&self, down: bool) {
        self.with(|s| s.down = down);
    }
}

impl Store for MemStore {
    type Watch = MemWatch;
    type KeepAlive = MemKeepAlive;

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.with(|s| s.up().map(|()| s.list(prefix)))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.with(|s| s.up().map(|()| s.kvs.get(key).cloned()))
    }

    async fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<Op>,
        else_list: Option<&str>,
    ) -> Result<TxnOutcome, StoreError> {
        self.with(|s| {
            s.up()?;
            if !compares.iter().all(|c| s.holds(c)) {
                return Ok(TxnOutcome {
                    succeeded: false,
                    revision: s.rev,
                    listing: else_list.map(|p| s.list(p).into()),
                });
            }
            let missing = ops.iter().any(|op| {
                matches!(op, Op::Put { lease, .. } if *lease != 0 && !s.leases.contains_key(lease))
            });
            if missing {
                return Err(StoreError::Other("requested lease not found".into()));
            }
            s.rev += 1;
            for op in ops {
                match op {
                    Op::Put { key, value, lease } => s.put(key, value, lease),
                    Op::Delete { key } => s.delete(key),
                }
            }
            Ok(TxnOutcome {
                succeeded: true,
                revision: s.rev,
                listing: None,
            })
        })
    }

    async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        self.with(|s| {
            s.up()?;
            s.next_lease += 1;
            let ttl = Duration::from_secs(ttl.max(1) as u64);
            s.leases.insert(s.next_lease, (ttl, Instant::now() + ttl));
            Ok(s.next_lease)
        })
    }

    async fn watch(&self, prefix: &str, revision: i64) -> Result<MemWatch, StoreError> {
        self.with(|s| s.up())?;
        Ok(MemWatch {
            store: self.clone(),
            prefix: prefix.to_string(),
            next: revision,
            progress: false,
        })
    }

    async fn keep_alive(&self, lease: i64) -> Result<MemKeepAlive, StoreError> {
        self.with(|s| s.up())?;
        Ok(MemKeepAlive {
            store: self.clone(),
            lease,
        })
    }

    async fn holds_revision(&self, _key: &str, revision: i64) -> Result<Option<u64>, StoreError> {
        self.with(|s| s.up().map(|()| (revision > s.compacted).then_some(0)))
    }

    fn pause(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

pub(crate) struct MemWatch {
    store: MemStore,
    prefix: String,
    /// The next revision to deliver.
    next: i64,
    progress: bool,
}

impl WatchStream for MemWatch {
    async fn next(&mut self) -> Result<Option<WatchResponse>, StoreError> {
        loop {
            let changed = self.store.changed.clone();
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let ready = self.store.with(|s| {
                s.up()?;
                if self.next <= s.compacted {
                    return Ok(Some(WatchResponse::Compacted(format!(
                        "revision {} was compacted (oldest kept: {})",
                        self.next,
                        s.compacted + 1
                    ))));
                }
                let events: Vec<WatchEvent> = s
                    .log
                    .iter()
                    .filter(|(rev, ev)| *rev >= self.next && under(ev, &self.prefix))
                    .map(|(_, ev)| ev.clone())
                    .collect();
                if events.is_empty() && !std::mem::take(&mut self.progress) {
                    return Ok(None);
                }
                self.next = s.rev + 1;
                Ok(Some(WatchResponse::Events {
                    events,
                    revision: s.rev,
                    member: 1,
                }))
            })?;
            if ready.is_some() {
                return Ok(ready);
            }
            // Woken by a change, or in a while to let leases expire.
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    async fn request_progress(&mut self) {
        self.progress = true;
    }
}

fn under(ev: &WatchEvent, prefix: &str) -> bool {
    match ev {
        WatchEvent::Put(kv) => kv.key.starts_with(prefix),
        WatchEvent::Delete { key, .. } => key.starts_with(prefix),
    }
}

pub(crate) struct MemKeepAlive {
    store: MemStore,
    lease: i64,
}

impl KeepAlive for MemKeepAlive {
    async fn renew(&mut self) -> Result<i64, StoreError> {
        self.store.with(|s| {
            s.up()?;
            Ok(match s.leases.get_mut(&self.lease) {
                Some((ttl, at)) => {
                    *at = Instant::now() + *ttl;
                    ttl.as_secs() as i64
                }
                None => 0,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch from a compacted revision must list again; one from the
    /// current revision on gets the next change, and nothing outside its
    /// prefix.
    #[tokio::test(start_paused = true)]
    async fn a_watch_from_a_compacted_revision_restarts() {
        let s = MemStore::default();
        s.put("/p/a", b"1");
        s.put("/p/b", b"2");
        s.compact();
        let mut old = s.watch("/p/", 1).await.unwrap();
        assert!(matches!(
            old.next().await,
            Ok(Some(WatchResponse::Compacted(_)))
        ));
        let rev = s.list("/p/").await.unwrap().revision;
        let mut w = s.watch("/p/", rev + 1).await.unwrap();
        s.put("/q/x", b"elsewhere");
        s.put("/p/c", b"3");
        match w.next().await {
            Ok(Some(WatchResponse::Events { events, .. })) => {
                assert_eq!(events.len(), 1);
                assert!(matches!(&events[0], WatchEvent::Put(kv) if kv.key == "/p/c"));
            }
            other => panic!("{other:?}"),
        }
    }
}
