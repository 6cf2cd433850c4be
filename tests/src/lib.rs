//! Test harness: network namespaces, veth pairs, processes, a real etcd.
//!
//! Everything a test creates is named with a per-process prefix and removed
//! when its guard drops, also when the test fails. Test traffic only goes to
//! addresses inside namespaces the test made, or to loopback.

pub mod agent;
pub mod bench;
pub mod cgroup;
pub mod cluster;
pub mod cni;
pub mod counters;
pub mod dual;
pub mod etcd;
pub mod etcd_cluster;
pub mod netns;
pub mod overlay;
pub mod pins;
pub mod podman;
pub mod proc;
pub mod traffic;
pub mod weft_cluster;

/// A name unique to this test process: `<prefix><pid%10000><n>`, short
/// enough for an interface name (15 bytes) when the prefix is short.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}{n}", std::process::id() % 10000)
}

/// Fails the test early, with a clear message, when not run as root.
pub fn require_root() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests create network namespaces and attach eBPF programs: run them as root (`cargo xtask test`)"
    );
}

/// The host routing the tests run with: `$WEFT_TEST_HOST_ROUTING`
/// (`cargo xtask test` runs the datapath and agent tests with `auto`, the
/// default, and again with `legacy`).
pub fn host_routing() -> &'static str {
    match std::env::var("WEFT_TEST_HOST_ROUTING").as_deref() {
        Ok("legacy") => "legacy",
        Ok("bpf") => "bpf",
        _ => "auto",
    }
}
