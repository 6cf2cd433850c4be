//! Subnet leases in etcd, flannel-compatible and fenced.
//!
//! - `config`, `attrs`, `key`, `subnet_file`, `wireguard`: flannel's formats
//!   (the `weft-formats` crate, re-exported here).
//! - `store` (the operations the protocol needs) and `etcd` (the real store).
//! - `acquire`: the fenced acquisition, one attempt.
//! - `holder` and `keeper`: this node's lease through its life: acquired,
//!   kept alive, lost, acquired again.
//! - `watch`: every lease in etcd, parsed as it arrives and handed to the
//!   loop through the `inbox` (coalesced by key); `resume`: the leases a
//!   restart resumes from; `members`: which etcd members are healthy
//!   enough to use.
//! - `view` and `validate`: what each lease is to this node: ours, a peer,
//!   or rejected.
//!
//! The acquisition and the formats are public for the model test and the
//! benchmarks; the rest is the agent's.

mod acquire;
mod cache;
mod etcd;
mod holder;
mod inbox;
mod keeper;
#[cfg(test)]
mod layer_tests;
mod members;
#[cfg(test)]
mod memory;
pub(crate) mod resume;
mod store;
mod validate;
mod view;
mod watch;

use weft_formats::{attrs, config, key, pool, subnet_file, wireguard};

pub use attrs::{AttrsError, LeaseAttrs, VxlanData};
pub use config::{ConfigError, Ipv4Pool, Ipv6Pool, NetworkConfig};
pub use key::{KeyError, Subnets, parse_key, to_key};
pub use subnet_file::{
    EnvFamily, SubnetEnv, SubnetEnvError, first_host, first_host6, parse_subnet_env,
};
pub use wireguard::{
    DEFAULT_LISTEN_PORT, DEFAULT_LISTEN_PORT_V6, WIREGUARD_OVERHEAD, WgMode, WireguardConfig,
    WireguardData,
};

pub use acquire::{AcquireError, AcquireRequest, AcquireStats, HeldLease, Identity, acquire};
pub use etcd::{EtcdOptions, EtcdStore};
pub use store::{
    Compare, KeepAlive, KeyValue, Listing, Op, Page, Store, StoreError, TxnOutcome, WatchEvent,
    WatchResponse, WatchStream,
};

pub(crate) use holder::{LeaseHolder, Timing, wait_for_config};
pub(crate) use inbox::{Batch, Inbox};
pub(crate) use keeper::unix_now;
pub(crate) use members::run as watch_members;
pub(crate) use subnet_file::{DEFAULT_PATH as DEFAULT_SUBNET_FILE, read_subnet};
pub(crate) use validate::Rejection;
pub(crate) use view::{LeaseView, Lost, decide};
pub(crate) use watch::{Watch, list_once};
