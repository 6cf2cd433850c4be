//! The key-value operations the lease protocol needs, as a trait: etcd
//! implements it for real (`etcd.rs`); the model tests implement it in memory
//! with the same compare semantics.
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

/// The operations the lease protocol is written against.
pub trait Store: Send + Sync {
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

    /// Waits between retries. The real store sleeps; the model store makes
    /// it a scheduling point.
    fn pause(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}
