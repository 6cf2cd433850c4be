//! Between the lease watch and the agent's loop: what etcd said and the
//! loop has not taken yet, coalesced by key.
//!
//! The watch never waits on the loop: a slow netlink or map update must not
//! stop it reading its gRPC stream (a slow watcher delays every write on
//! the etcd leader). Changes wait here instead, one per key (a key put and
//! deleted a hundred times while the loop was busy is one change, the
//! last), so what waits is bounded by the keys etcd holds, not by how often
//! they change. A snapshot (a fresh list) replaces everything before it.

use std::{collections::HashMap, sync::Mutex};

use tokio::sync::Notify;

use super::cache::{Change, Snapshot};

/// What the loop takes in one go.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// A fresh list, to be applied first.
    pub(crate) snapshot: Option<Snapshot>,
    /// The last change of each key since (or since the last batch).
    pub(crate) changes: Vec<Change>,
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.snapshot.is_none() && self.changes.is_empty()
    }
}

#[derive(Default)]
struct Pending {
    snapshot: Option<Snapshot>,
    changes: HashMap<String, Change>,
    revision: i64,
}

/// The queue; the watch puts, the loop takes.
#[derive(Default)]
pub(crate) struct Inbox {
    pending: Mutex<Pending>,
    ready: Notify,
}

impl Inbox {
    fn with<T>(&self, f: impl FnOnce(&mut Pending) -> T) -> T {
        f(&mut self.pending.lock().expect("inbox lock"))
    }

    /// A fresh list: what waited before it is in it.
    pub(crate) fn snapshot(&self, s: Snapshot) {
        self.with(|p| {
            p.changes.clear();
            p.revision = s.revision;
            p.snapshot = Some(s);
        });
        self.ready.notify_one();
    }

    /// Changes, and the revision the watch has delivered everything up to
    /// (`revision` alone, with no changes: a progress notification).
    pub(crate) fn changes(&self, changes: Vec<Change>, revision: i64) {
        let any = !changes.is_empty();
        self.with(|p| {
            for c in changes {
                p.revision = p.revision.max(c.revision());
                match p.changes.get(c.key()) {
                    Some(old) if old.revision() > c.revision() => {}
                    _ => {
                        p.changes.insert(c.key().to_string(), c);
                    }
                }
            }
            p.revision = p.revision.max(revision);
        });
        if any {
            self.ready.notify_one();
        }
    }

    /// Waits until there is something to take.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.ready.notified();
            if self.with(|p| p.snapshot.is_some() || !p.changes.is_empty()) {
                return;
            }
            notified.await;
        }
    }

    /// Takes everything waiting.
    pub(crate) fn take(&self) -> Batch {
        self.with(|p| Batch {
            snapshot: p.snapshot.take(),
            changes: p.changes.drain().map(|(_, c)| c).collect(),
        })
    }

    /// The revision the node's view is at once everything waiting is
    /// applied (what a restart may resume from), if nothing waits.
    pub(crate) fn settled_revision(&self) -> Option<i64> {
        self.with(|p| (p.snapshot.is_none() && p.changes.is_empty()).then_some(p.revision))
    }

    /// How many keys wait.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.with(|p| p.changes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn del(key: &str, revision: i64) -> Change {
        Change::Delete {
            key: key.into(),
            revision,
        }
    }

    #[tokio::test]
    async fn changes_coalesce_by_key_and_a_snapshot_replaces_them() {
        let inbox = Inbox::default();
        for rev in 1..=100 {
            inbox.changes(vec![del("/a", rev), del("/b", rev)], rev);
        }
        assert_eq!(inbox.len(), 2, "one change per key");
        inbox.wait().await;
        let b = inbox.take();
        assert_eq!(b.changes.len(), 2);
        assert!(b.changes.iter().all(|c| c.revision() == 100));
        assert_eq!(inbox.settled_revision(), Some(100));
        assert!(inbox.take().is_empty());

        // A progress notification moves the revision, wakes nobody.
        inbox.changes(vec![], 120);
        assert_eq!(inbox.settled_revision(), Some(120));
        inbox.changes(vec![del("/c", 121)], 121);
        assert_eq!(inbox.settled_revision(), None);
        inbox.snapshot(Snapshot {
            revision: 130,
            ..Default::default()
        });
        let b = inbox.take();
        assert!(b.changes.is_empty(), "the snapshot holds them");
        assert_eq!(b.snapshot.map(|s| s.revision), Some(130));
        assert_eq!(inbox.settled_revision(), Some(130));
    }
}
