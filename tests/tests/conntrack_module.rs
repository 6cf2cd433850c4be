//! Conntrack's kfuncs where conntrack is a module (Debian, Ubuntu, RHEL,
//! Amazon Linux, Bottlerocket, Flatcar): the agent loads the module if
//! nothing has yet (as conntrack's first use would), calls the kfuncs
//! through the module's BTF, and says so; its programs hold the module,
//! which the kernel then refuses to unload; once they are gone, it lets
//! go. Where conntrack is built in (this project's host), the kfuncs are
//! vmlinux's and the agent says that.
//!
//! One test in its own binary: it unloads and loads the module, which no
//! other test may see happen. `cargo xtask test` runs it on the host and
//! first thing in the Debian 6.12 VM, before anything else loads
//! conntrack there.

use std::{path::Path, process::Command, time::Duration};

use weft_tests::{
    agent::eventually,
    weft_cluster::{WeftCluster, WeftNode},
};

const MODULE: &str = "/sys/module/nf_conntrack";

/// `nf_conntrack`'s reference count (None: built in, or not loaded).
fn refcnt() -> Option<u64> {
    std::fs::read_to_string(format!("{MODULE}/refcnt"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The conntrack feature's line of `n`'s status report.
fn conntrack_detail(n: &WeftNode) -> (bool, String) {
    let r = n.status_json().expect("a status report");
    let f = r["kernel"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "conntrack_kfuncs")
        .expect("the conntrack feature")
        .clone();
    (
        f["available"].as_bool().unwrap(),
        f["detail"].as_str().unwrap().to_string(),
    )
}

/// The kernel's id of the BTF object named `name`, as bpftool lists it.
fn btf_id(name: &str) -> Option<u32> {
    let out = Command::new("bpftool")
        .args(["btf", "show"])
        .output()
        .expect("bpftool");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            t.get(1) == Some(&"name")
                && t.get(2)
                    .is_some_and(|n| n.trim_matches(|c| c == '[' || c == ']') == name)
        })
        .and_then(|l| l.split(':').next()?.trim().parse().ok())
}

fn rmmod(names: &[&str]) -> (bool, String) {
    let out = Command::new("rmmod").args(names).output().expect("rmmod");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn conntrack_as_a_module_is_loaded_called_and_held_by_the_programs() {
    weft_tests::require_root();
    // Built in: vmlinux's kfuncs, and no module to hold.
    let built_in = Path::new(MODULE).exists() && refcnt().is_none();
    if built_in {
        let c = WeftCluster::new(1, &[]).unwrap();
        c.nodes[0].wait_dataplane_up(weft_tests::scaled(Duration::from_secs(30)));
        let (available, detail) = conntrack_detail(&c.nodes[0]);
        assert!(available && detail.contains("vmlinux's BTF"), "{detail}");
        let log = c.nodes[0].agent.log();
        assert!(log.contains("conntrack_kfuncs=\"in vmlinux's BTF"), "{log}");
        return;
    }

    // A module: unloaded first (nothing holds it yet in a fresh VM), so
    // the agent has to load it.
    unload();
    let mut c = WeftCluster::new(1, &[]).unwrap();
    let id = loaded_and_said(&c.nodes[0]);

    // Every loaded program that calls the kfuncs holds the module: the
    // kernel refuses to unload it.
    let held = refcnt().expect("a module has a reference count");
    let (ok, why) = rmmod(&["nf_conntrack"]);
    assert!(!ok && why.contains("in use"), "rmmod: {why}");
    assert!(Path::new("/sys/kernel/btf/nf_conntrack").exists());

    // The agent stopped and what it set up removed (`weft teardown`): the
    // references the programs held go with them, and the module can be
    // unloaded.
    let n = &mut c.nodes[0];
    n.agent.stop().unwrap();
    n.weft(&["teardown"]).unwrap();
    eventually(
        "the programs' references on nf_conntrack to go",
        weft_tests::scaled(Duration::from_secs(30)),
        || refcnt().is_some_and(|r| r < held).then_some(()),
    );
    unload();

    // The same agent started again, in the same boot and with the same
    // state directory (its kernel probes kept there): it loads the module
    // again and names the module's new BTF, not the one it kept.
    n.agent.restart().unwrap();
    let again = loaded_and_said(n);
    assert_ne!(again, id, "a module loaded again has a BTF of another id");
    let log = n.agent.log();
    assert!(
        log.contains(&format!("BTF id {again}")),
        "the start's log names the kfuncs' BTF: {log}"
    );
    drop(c);
}

/// Unloads conntrack's module and the modules loaded on top of it
/// (ctnetlink, nftables' `ct` expression, ...), which stay loaded after
/// their last user is gone; fails the test where the kernel refuses:
/// something still uses one.
fn unload() {
    fn unload_module(name: &str) {
        let dir = Path::new("/sys/module").join(name);
        for h in std::fs::read_dir(dir.join("holders")).into_iter().flatten() {
            unload_module(&h.unwrap().file_name().to_string_lossy());
        }
        if dir.exists() {
            let (ok, why) = rmmod(&[name]);
            assert!(ok, "{name} could not be unloaded: {why}");
        }
    }
    unload_module("nf_conntrack");
    assert!(!Path::new(MODULE).exists(), "nf_conntrack is unloaded");
}

/// Waits for `n`'s dataplane, then checks that the module is loaded and
/// that `weft status` and `weft doctor` name its BTF by the kernel's id;
/// returns that id.
fn loaded_and_said(n: &WeftNode) -> u32 {
    n.wait_dataplane_up(weft_tests::scaled(Duration::from_secs(30)));
    assert!(Path::new(MODULE).exists(), "the agent loaded the module");
    let (available, detail) = conntrack_detail(n);
    let id = btf_id("nf_conntrack").expect("the module's BTF is listed");
    let named = format!("the nf_conntrack module's BTF (BTF id {id})");
    assert!(available && detail.contains(&named), "{detail}");
    let status = n.weft(&["status"]).unwrap();
    assert!(status.contains(&named), "{status}");
    let doctor = n.doctor_from_host();
    assert!(
        doctor
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("conntrack_kfuncs") && l.contains(&named)),
        "{doctor}"
    );
    id
}
