//! The agent's one home for talking to the kernel: the system calls std
//! does not have, netlink (rtnetlink's links, addresses, routes and their
//! notifications; nftables over nfnetlink), sysctls and the BPF
//! filesystem. Every `unsafe` block the agent needs for them sits here,
//! each with its SAFETY comment; callers see plain Rust types and
//! `Result`s, and the policy (which routes, which rules) stays with them.

pub(crate) mod bpf;
pub(crate) mod bpffs;
pub(crate) mod bpffs_hold;
pub(crate) mod echo_sweep;
pub(crate) mod ethtool;
pub(crate) mod fs;
pub(crate) mod icmp;
pub(crate) mod memory;
pub(crate) mod netlink;
pub(crate) mod nfnetlink;
pub(crate) mod nftables;
pub(crate) mod process;
pub(crate) mod sd_notify;
pub(crate) mod sysctl;
