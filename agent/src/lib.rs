//! Weft: an eBPF-accelerated VXLAN overlay network agent, wire- and
//! etcd-compatible with flannel's VXLAN backend.

pub mod agent;
pub mod cli;
pub mod commands;
pub mod datapath;
pub mod dataplane;
pub mod http;
pub mod lease;
pub mod mac;
pub mod metrics;
pub mod node;
pub mod peers;
pub mod status;
