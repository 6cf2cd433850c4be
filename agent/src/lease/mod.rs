//! Subnet leases in etcd, flannel-compatible and fenced.
//!
//! - `config`, `attrs`, `key`, `subnet_file`, `wireguard`: flannel's formats.
//! - `store` (the operations the protocol needs) and `etcd` (the real store).
//! - `acquire`: the fenced acquisition, one attempt.
//! - `holder` and `keeper`: this node's lease through its life: acquired,
//!   kept alive, lost, acquired again.
//! - `watch`: every lease in etcd, as events; `members`: which etcd
//!   members are healthy enough to use.
//! - `view` and `validate`: what each lease is to this node: ours, a peer,
//!   or rejected.
//!
//! The acquisition and the formats are public for the model test and the
//! benchmarks; the rest is the agent's.

#[cfg(feature = "agent")]
mod acquire;
mod attrs;
#[cfg(feature = "agent")]
mod cache;
mod config;
#[cfg(feature = "agent")]
mod etcd;
#[cfg(feature = "agent")]
mod holder;
mod json;
#[cfg(feature = "agent")]
mod keeper;
mod key;
#[cfg(all(test, feature = "agent"))]
mod layer_tests;
#[cfg(feature = "agent")]
mod members;
#[cfg(all(test, feature = "agent"))]
mod memory;
mod pool;
#[cfg(feature = "agent")]
mod store;
mod subnet_file;
#[cfg(feature = "agent")]
mod validate;
#[cfg(feature = "agent")]
mod view;
#[cfg(feature = "agent")]
mod watch;
mod wireguard;

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

#[cfg(feature = "agent")]
pub use acquire::{AcquireError, AcquireRequest, AcquireStats, HeldLease, Identity, acquire};
#[cfg(feature = "agent")]
pub use etcd::{EtcdOptions, EtcdStore};
#[cfg(feature = "agent")]
pub use store::{
    Compare, KeepAlive, KeyValue, Listing, Op, Store, StoreError, TxnOutcome, WatchEvent,
    WatchResponse, WatchStream,
};

#[cfg(feature = "agent")]
pub(crate) use holder::{LeaseHolder, Timing, wait_for_config};
#[cfg(feature = "agent")]
pub(crate) use keeper::unix_now;
#[cfg(feature = "agent")]
pub(crate) use members::run as watch_members;
#[cfg(feature = "agent")]
pub(crate) use subnet_file::{DEFAULT_PATH as DEFAULT_SUBNET_FILE, read_subnet};
#[cfg(feature = "agent")]
pub(crate) use view::{LeaseView, Lost, decide};
#[cfg(feature = "agent")]
pub(crate) use watch::{list_once, run as watch};
