//! The kernels Weft runs on. Where the kernel has what the dataplane needs
//! (BTF, TCX links: Linux 6.6), a node comes up and `weft doctor` says the
//! kernel is fine; where it has not (Debian's 6.1), the agent refuses to
//! start, naming the missing feature, before it takes anything, and `weft
//! doctor` fails the kernel with the same words. Where the conntrack
//! kfuncs are out of reach (no conntrack, or a module without BTF), both
//! say what Weft does without them; where they are in reach (built in, or
//! a module with BTF, as in Debian's 6.12), neither warns.
//!
//! `cargo xtask test` runs this on the host and in VMs of Debian's 6.12 and
//! 6.1; the oracle here is the kernel's own version, symbols and module
//! BTF, not Weft's reading of its BTF.

use std::time::Duration;

use weft_tests::{
    agent::{eventually, weft},
    cluster::Node,
    pins::TestPins,
    weft_cluster::{PREFIX, WeftCluster},
};

/// `uname -r`'s first two numbers.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// `weft doctor`'s lines about the kernel.
fn doctor_kernel_lines() -> Vec<String> {
    let (_, out, err) = weft(&["doctor", "--probe-timeout", "0.1"]);
    let lines: Vec<String> = out
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("kernel"))
        .map(str::to_string)
        .collect();
    assert!(
        !lines.is_empty(),
        "weft doctor checks the kernel: stdout {out:?}, stderr {err:?}"
    );
    lines
}

#[test]
fn the_agent_runs_only_on_a_kernel_with_what_the_dataplane_needs() {
    let (major, minor) = kernel_version();
    let supported = (major, minor) >= (6, 6);
    let without_kfuncs = !weft_tests::conntrack_kfuncs();
    eprintln!(
        "kernel {major}.{minor}: {}, conntrack kfuncs {}",
        if supported { "supported" } else { "too old" },
        if without_kfuncs {
            "out of reach"
        } else {
            "in reach"
        }
    );
    let mut cluster = WeftCluster::new(0, &[]).unwrap();
    let node = Node::new(&cluster.underlay, 1).unwrap();
    let started = cluster.start_agent(node, TestPins::new(), &[]).unwrap();
    let doctor = doctor_kernel_lines();

    if supported {
        let n = cluster.adopt(started).unwrap();
        n.wait_dataplane_up(Duration::from_secs(30));
        assert!(
            doctor[0].starts_with("ok") && doctor[0].contains("TCX links"),
            "doctor: {doctor:?}"
        );
        let log = n.agent.log();
        let said = log.contains("lacks an optional feature: conntrack_kfuncs");
        assert_eq!(
            said, without_kfuncs,
            "the agent says it runs without the conntrack kfuncs exactly where they are out of reach; log:\n{log}"
        );
        assert_eq!(
            doctor
                .iter()
                .any(|l| l.starts_with("warn") && l.contains("conntrack_kfuncs:")),
            without_kfuncs,
            "doctor warns of the missing kfuncs exactly where they are out of reach: {doctor:?}"
        );
        return;
    }

    // Too old: refused before anything is taken.
    let agent = &started.agent;
    eventually("the agent to exit", Duration::from_secs(30), || {
        (!agent.running()).then_some(())
    });
    let log = agent.log();
    assert!(
        log.contains("lacks what Weft needs: tcx (TCX links (BPF_TCX_INGRESS, Linux 6.6)")
            && log.contains("no BPF_TCX_INGRESS in the kernel's BTF")
            && log.contains("Nothing was taken"),
        "the agent names the missing feature; log:\n{log}"
    );
    let leases = cluster
        .etcd
        .etcdctl(&[
            "get",
            "--prefix",
            "--keys-only",
            &format!("{PREFIX}/subnets/"),
        ])
        .unwrap();
    assert!(leases.trim().is_empty(), "no lease was taken: {leases}");
    assert!(!agent.subnet_file().exists(), "no subnet file was written");
    let pinned: Vec<_> = std::fs::read_dir(started.pins.path())
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(pinned.is_empty(), "nothing was pinned: {pinned:?}");
    assert!(
        doctor[0].starts_with("FAIL")
            && doctor[0].contains("no BPF_TCX_INGRESS in the kernel's BTF"),
        "doctor fails the kernel with the agent's words: {doctor:?}"
    );
}
