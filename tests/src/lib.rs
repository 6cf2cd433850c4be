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
pub mod containerd;
pub mod counters;
pub mod dual;
pub mod etcd;
pub mod etcd_cluster;
pub mod etcd_fill;
pub mod etcd_proxy;
pub mod flood;
pub mod forwarded;
pub mod iperf;
pub mod kernel;
pub mod netns;
pub mod overlay;
pub mod pins;
pub mod podman;
pub mod ports;
pub mod proc;
pub mod swarm;
pub mod traffic;
pub mod weft_cluster;
pub mod wg;

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

/// `d` stretched by `$WEFT_TEST_TIME_SCALE` (1 when unset): the VM test
/// runner sets it where emulation slows the guest, and the helpers' waits
/// and deadlines go through here. What a test measures (a rate, a count
/// of lost packets) is not scaled.
pub fn scaled(d: std::time::Duration) -> std::time::Duration {
    d.mul_f64(time_scale())
}

/// `$WEFT_TEST_TIME_SCALE`, at least 1.
pub fn time_scale() -> f64 {
    static SCALE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SCALE.get_or_init(|| {
        std::env::var("WEFT_TEST_TIME_SCALE")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite())
            .unwrap_or(1.0)
            .max(1.0)
    })
}

/// Whether the conntrack kfuncs are within the loader's reach on this
/// kernel: conntrack built into it (the kfuncs in the kernel's own BTF),
/// or a module with BTF (`CONFIG_DEBUG_INFO_BTF_MODULES`, whose kfuncs the
/// loader calls through the module's BTF). The oracle is the kernel's
/// symbols and module list, not Weft's reading of BTF: the module is
/// loaded first, as its first use would, and then shows in
/// /sys/kernel/btf.
pub fn conntrack_kfuncs() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let _ = std::process::Command::new("modprobe")
            .arg("nf_conntrack")
            .output();
        let syms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let found = match syms
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some("bpf_skb_ct_lookup"))
        {
            None => "no",
            Some(l) if l.contains("[nf_conntrack]") => {
                if std::path::Path::new("/sys/kernel/btf/nf_conntrack").exists() {
                    "module"
                } else {
                    "module-without-btf"
                }
            }
            Some(_) => "built-in",
        };
        kernel::expect("conntrack_kfuncs", found);
        matches!(found, "module" | "built-in")
    })
}

/// Whether pods' flows bypass the host stack under the tests' host
/// routing ([`host_routing`]) on this kernel: never under `legacy`, always
/// under `bpf`, and under `auto` where the conntrack kfuncs are within
/// reach ([`conntrack_kfuncs`]).
pub fn bypasses() -> bool {
    match host_routing() {
        "legacy" => false,
        "bpf" => true,
        _ => conntrack_kfuncs(),
    }
}
