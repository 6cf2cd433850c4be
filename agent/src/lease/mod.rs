//! Subnet leases in etcd, flannel-compatible and fenced.

pub mod acquire;
pub mod attrs;
pub mod config;
pub mod etcd;
pub mod keeper;
pub mod store;
pub mod subnet;
pub mod subnet_file;
pub mod watch;
