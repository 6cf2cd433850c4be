//! The bpf filesystem unmounted under a running agent (an operator's
//! mistake, a script that cleans up mounts): a plain unmount is refused
//! while the agent runs, and after a lazy one (`umount -l`) the agent
//! mounts a bpf filesystem where it was and pins every object into it
//! again; traffic never stops, and the repair is counted.

use std::{process::Command, time::Duration};

use weft_tests::{
    agent::eventually,
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

/// Runs `args` in the agent's mount namespace (it has a copy of its own:
/// `ip netns exec` makes one).
fn in_agent_mounts(n: &WeftNode, args: &[&str]) -> (bool, String) {
    let pid = n.agent.pid().to_string();
    let out = Command::new("nsenter")
        .args(["-t", &pid, "-m", "--"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Every pin under the agent's pin directory, as the agent sees it.
fn pins(n: &WeftNode) -> Vec<String> {
    let dir = n.pins.path().to_str().unwrap().to_string();
    let (ok, out) = in_agent_mounts(n, &["find", &dir, "-mindepth", "1"]);
    assert!(ok, "{out}");
    let mut v: Vec<String> = out.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn an_unmounted_bpffs_is_put_back_with_every_pin() {
    let c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let n = &c.nodes[0];
    n.wait_metric("weft_ready", |v| v == 1.0, T);
    let dir = n.pins.path().to_str().unwrap().to_string();
    let before = pins(n);
    assert!(before.iter().any(|p| p.contains("/links/")), "{before:?}");

    let (ok, out) = in_agent_mounts(n, &["umount", &dir]);
    assert!(!ok, "an unmount under the running agent is refused: {out}");
    assert!(out.contains("busy"), "{out}");

    let (ok, out) = in_agent_mounts(n, &["umount", "-l", &dir]);
    assert!(ok, "{out}");
    let (_, fs) = in_agent_mounts(n, &["stat", "-f", "-c", "%T", &dir]);
    println!("after umount -l: {}", fs.trim());
    n.wait_metric("weft_repairs_total{what=\"bpffs\"}", |v| v == 1.0, T);
    let (_, fs) = in_agent_mounts(n, &["stat", "-f", "-c", "%T", &dir]);
    assert_eq!(fs.trim(), "bpf_fs", "a bpf filesystem is back");
    assert_eq!(pins(n), before, "every pin is back at its path");
    assert!(n.agent.log().contains("pinned every object of the old one"));
    eventually("the pods reach each other", T, || c.all_pairs_reach().ok());
    // And it stays healed: no second repair.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(n.metric("weft_repairs_total{what=\"bpffs\"}"), 1.0);
}
