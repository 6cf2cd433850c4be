//! What the lease layer needs of etcd, as a trait: the key-value operations
//! of the acquisition, the watch that follows every lease and the keep-alive
//! of this node's. etcd implements it for real (`etcd.rs`); the in-memory
//! stores implement it with the same compare, revision and expiry semantics
//! (`memory.rs` for the lease layer's own tests, the acquisition model's in
//! `agent/tests`), so the whole layer runs without an etcd.
//!
//! Every write is a transaction guarded by compares; there is no plain put.

use std::{future::Future, time::Duration};

use thiserror::Error;

/// One key as etcd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    /// The etcd lease the key is attached to; 0 for none (a reservation).
    pub lease: i64,
}

/// A consistent read of a prefix at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
}

/// One page of a read of a prefix: what a reader parses and drops before
/// it asks for the next, so what etcd holds never has to fit in memory at
/// once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// The revision every page of the read is at.
    pub revision: i64,
    /// The etcd cluster's id (0 where the store has none).
    pub cluster: u64,
    pub kvs: Vec<KeyValue>,
    /// More keys follow, from [`Page::next`].
    pub more: bool,
    /// Where the next page starts: the raw bytes of the last key read, and
    /// a NUL (never a key as [`KeyValue::key`] shows it: a key that is not
    /// UTF-8, or too long to keep, is shown changed, and a cursor built
    /// from that would read the same page again).
    pub next: Vec<u8>,
}

impl From<Listing> for Page {
    fn from(l: Listing) -> Self {
        Page {
            revision: l.revision,
            cluster: 0,
            kvs: l.kvs,
            more: false,
            next: Vec::new(),
        }
    }
}

/// A transaction guard (all are equality compares).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// 0 means "the key does not exist".
    CreateRevision(String, i64),
    ModRevision(String, i64),
    Lease(String, i64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `lease` 0 attaches no lease.
    Put {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    Delete {
        key: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    pub succeeded: bool,
    /// The store's revision after the transaction (the revision of the
    /// writes when it succeeded).
    pub revision: i64,
    /// When it failed and a prefix was given: the first page of that
    /// prefix, read in the same transaction, so a retry needs no extra
    /// request; the rest, if any, is read with [`Store::list_page`] from
    /// its cursor, at its revision (a retry's compare decides either way).
    pub listing: Option<Page>,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StoreError {
    /// The store could not be reached, or did not answer in time. For a
    /// write, the outcome is unknown: it may have been applied.
    #[error("etcd unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error.
    #[error("etcd error: {0}")]
    Other(String),
}

/// What a watch delivers: etcd's changes as they come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    Delete { key: String, revision: i64 },
}

/// One response of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchResponse {
    /// Changes, in revision order; none for a progress notification.
    /// `revision`: every change up to it has been delivered (what a watch
    /// started again resumes after); 0 where the response cannot say so
    /// (the watch's creation, and the answer to a progress request, which
    /// an etcd before 3.4.25 may send ahead of changes it still holds).
    /// `member`: the etcd member that answered (0 when unknown).
    Events {
        events: Vec<WatchEvent>,
        revision: i64,
        member: u64,
    },
    /// The revision the watch started from is compacted away: only a fresh
    /// list can catch up.
    Compacted(String),
    /// The watch cannot go on (etcd cancelled it, the connection was
    /// replaced), and why: start it again from where it was.
    Restart(String),
}

/// A watch of a prefix from a revision on.
pub trait WatchStream: Send {
    /// The next response; `Ok(None)` when the stream ended.
    fn next(&mut self) -> impl Future<Output = Result<Option<WatchResponse>, StoreError>> + Send;

    /// Asks for a progress notification (an empty [`WatchResponse::Events`]
    /// once the watch is current). A store that cannot is silent.
    fn request_progress(&mut self) -> impl Future<Output = ()> + Send;
}

/// Renewals of one etcd lease.
pub trait KeepAlive: Send {
    /// Renews the lease once; its TTL left in seconds, 0 when etcd has
    /// expired or revoked it (the keys it carried are gone).
    fn renew(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

/// The operations the lease layer is written against.
pub trait Store: Send + Sync {
    type Watch: WatchStream;
    type KeepAlive: KeepAlive;

    /// All keys under `prefix`, with values, at one revision. For small
    /// reads (one key's history, a command's listing); the agent reads the
    /// subnets page by page ([`Store::list_page`]).
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Listing, StoreError>> + Send;

    /// One page of the keys under `prefix` from `from` on (the prefix
    /// itself for the first page, then [`Page::next`]), at `revision` (0:
    /// the current one, which the page then names). A store that does not
    /// page answers everything at once.
    fn list_page(
        &self,
        prefix: &str,
        from: &[u8],
        revision: i64,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send {
        let _ = (from, revision);
        async move { self.list(prefix).await.map(Page::from) }
    }

    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>, StoreError>> + Send;

    /// If every compare holds, apply `ops`; otherwise, read `else_list` (a
    /// prefix) if given.
    fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<Op>,
        else_list: Option<&str>,
    ) -> impl Future<Output = Result<TxnOutcome, StoreError>> + Send;

    /// Grants a lease of `ttl` seconds; returns its id.
    fn grant(&self, ttl: i64) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Watches the keys under `prefix` from `revision` on (after a listing
    /// at `revision - 1`: nothing is missed in between).
    fn watch(
        &self,
        prefix: &str,
        revision: i64,
    ) -> impl Future<Output = Result<Self::Watch, StoreError>> + Send;

    /// Whether the store still holds its history from `revision` on (it is
    /// not compacted away), asked with a read of `key` at that revision:
    /// the cluster's id (as [`Page::cluster`]) if it does. A store that
    /// cannot tell says it does not.
    fn holds_revision(
        &self,
        key: &str,
        revision: i64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send {
        let _ = (key, revision);
        async { Ok(None) }
    }

    /// Opens renewals of the etcd lease `lease`.
    fn keep_alive(
        &self,
        lease: i64,
    ) -> impl Future<Output = Result<Self::KeepAlive, StoreError>> + Send;

    /// Waits between retries. The real store sleeps; the model store makes
    /// it a scheduling point.
    fn pause(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}
