//! Thin, safe wrappers over the system calls std does not have. Every
//! `unsafe` block the agent's commands need sits here, each with its
//! SAFETY comment; callers see plain Rust types and `Result`s.

pub(crate) mod bpf;
pub(crate) mod echo_sweep;
pub(crate) mod ethtool;
pub(crate) mod fs;
pub(crate) mod icmp;
pub(crate) mod memory;
pub(crate) mod process;
pub(crate) mod sd_notify;
