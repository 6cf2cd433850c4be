//! The eBPF dataplane: loading and attaching the programs, their maps, and the
//! host configuration they rely on.

pub mod bpffs;
pub mod ethtool;
pub mod loader;
pub mod maps;
pub mod netlink;
pub mod overlay;
pub mod sysctl;
