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
    /// When it failed and a prefix was given: that prefix, read in the same
    /// transaction, so a retry needs no extra request (or, when that read
    /// was too large for one response, page by page just after; a retry's
    /// compare decides either way).
    pub listing: Option<Listing>,
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

/// What a watch delivers: etcd's changes as they come, and listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    Delete {
        key: String,
        revision: i64,
    },
    /// Every key under the prefix at the listing's revision (after a start,
    /// a compaction or a broken watch).
    Listed(Listing),
}

/// One response of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchResponse {
    /// Changes, in revision order; none for a progress notification (the
    /// watch is current). `member`: the etcd member that answered (0 when
    /// unknown).
    Events {
        events: Vec<WatchEvent>,
        member: u64,
    },
    /// The watch cannot go on from where it was (its start revision was
    /// compacted, etcd cancelled it, the connection was replaced), and why:
    /// list again and watch from there.
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

    /// All keys under `prefix`, with values, at one revision.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Listing, StoreError>> + Send;

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
