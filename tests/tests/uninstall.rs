//! Removing Weft from a node as docs/installing.md says (stop the agent,
//! `weft uninstall-cni`, `weft teardown`) leaves nothing of Weft's: no
//! device, attached program, pin, CNI file, nftables or iptables rule,
//! route, or changed sysctl; the node is as it was before the agent ran
//! (the pods' own bridge and IPv4 forwarding aside, which the bridge plugin
//! made and turned on, and flannel leaves too).

use std::{collections::BTreeSet, time::Duration};

use weft_tests::{
    agent::eventually, cluster::Node, netns::Netns, pins::TestPins, weft_cluster::WeftCluster,
};

const T: Duration = Duration::from_secs(60);

/// What the node's network namespace holds, as sets of lines comparable
/// before and after (the pods' bridge cni0 and its routes left out).
fn snapshot(ns: &Netns) -> Vec<(String, BTreeSet<String>)> {
    let lines = |out: String| -> BTreeSet<String> {
        out.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.contains("cni0"))
            .map(str::to_string)
            .collect()
    };
    let links = ns
        .ip(&["-o", "link", "show"])
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap().to_string())
        })
        .collect::<Vec<_>>()
        .join("\n");
    // net.ipv4.ip_forward is left out: the pods' bridge plugin
    // (isGateway) turns it on as well, and teardown leaves it on, as
    // nothing records who else needs it (docs/installing.md says so).
    let sysctls = [
        "net.ipv6.conf.all.forwarding",
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.eth0.rp_filter",
        "net.ipv4.conf.default.rp_filter",
        "net.ipv4.conf.all.send_redirects",
    ]
    .iter()
    .map(|k| {
        let v = ns.exec("sysctl", &["-n", k]).unwrap_or_default();
        format!("{k}={}", v.trim())
    })
    .collect::<Vec<_>>()
    .join("\n");
    vec![
        ("links".into(), lines(links)),
        (
            "routes".into(),
            lines(ns.ip(&["route", "show", "table", "all"]).unwrap()),
        ),
        (
            "routes6".into(),
            lines(ns.ip(&["-6", "route", "show", "table", "all"]).unwrap()),
        ),
        (
            "neighbours".into(),
            lines(ns.ip(&["neigh", "show", "nud", "permanent"]).unwrap()),
        ),
        (
            "fdb".into(),
            lines(
                ns.exec("bridge", &["fdb", "show", "dynamic"])
                    .unwrap_or_default(),
            )
            .into_iter()
            .filter(|l| l.contains("dst"))
            .collect(),
        ),
        (
            "nftables".into(),
            lines(ns.exec("nft", &["list", "ruleset"]).unwrap_or_default()),
        ),
        (
            "iptables".into(),
            lines(ns.exec("iptables-save", &[]).unwrap_or_default())
                .into_iter()
                .filter(|l| !l.starts_with('#') && !l.starts_with(':'))
                .collect(),
        ),
        (
            "programs".into(),
            lines(ns.exec("bpftool", &["net", "show"]).unwrap_or_default())
                .into_iter()
                .filter(|l| l.contains("id "))
                .collect(),
        ),
        ("sysctls".into(), lines(sysctls)),
    ]
}

#[test]
fn uninstall_leaves_nothing_behind() {
    let mut c = WeftCluster::new(1, &[]).unwrap();
    let node = Node::new(&c.underlay, 2).unwrap();
    // Strict reverse-path filtering on the uplink, as many distributions
    // set it: the agent loosens it, and teardown must put it back.
    node.ns.sysctl("net.ipv4.conf.eth0.rp_filter", "1").unwrap();
    let before = snapshot(&node.ns);
    let pins = TestPins::new();
    let s = c.start_agent(node, pins, &[]).unwrap();
    let n = c.adopt(s).unwrap();
    let cni = std::env::temp_dir().join(weft_tests::unique("weft-uninstall-"));
    let (bin_dir, conf_dir) = (cni.join("bin"), cni.join("net.d"));
    let dirs = [
        "--bin-dir",
        bin_dir.to_str().unwrap(),
        "--conf-dir",
        conf_dir.to_str().unwrap(),
    ];
    let (ok, _, err) = weft_tests::agent::weft(&[&["install-cni"][..], &dirs].concat());
    assert!(ok, "{err}");
    n.use_cni();
    n.node.add_pod().unwrap();
    c.wait_meshed(T);
    let n = &mut c.nodes[1];
    let running = snapshot(&n.node.ns);
    assert_ne!(running, before, "the agent changed the node");

    // As the docs say: the pods go, the agent stops, then uninstall-cni
    // and teardown.
    while !n.node.pods.is_empty() {
        n.node.del_pod(0).unwrap();
    }
    n.agent.stop().unwrap();
    let (ok, out, err) = weft_tests::agent::weft(&[&["uninstall-cni"][..], &dirs].concat());
    assert!(ok, "{out}{err}");
    let out = n.weft(&["teardown"]).unwrap();
    println!("{out}");

    let after = snapshot(&n.node.ns);
    let mut left = Vec::new();
    for ((what, b), (_, a)) in before.iter().zip(&after) {
        let added: Vec<&String> = a.difference(b).collect();
        let gone: Vec<&String> = b.difference(a).collect();
        if !added.is_empty() || !gone.is_empty() {
            left.push(format!("{what}: left {added:?}, not restored {gone:?}"));
        }
    }
    assert!(left.is_empty(), "after uninstall:\n{}", left.join("\n"));
    // Pins: nothing of Weft's on its bpffs (the kernel's own iterators,
    // `maps.debug` and `progs.debug`, are in every instance).
    let pinned: Vec<String> = walk(n.pins.path())
        .into_iter()
        .filter(|f| !matches!(f.as_str(), "maps.debug" | "progs.debug"))
        .collect();
    assert!(pinned.is_empty(), "pins left: {pinned:?}");
    // CNI files: the plugin and its network config gone.
    for d in [&bin_dir, &conf_dir] {
        let files: Vec<String> = walk(d);
        assert!(files.is_empty(), "{} keeps {files:?}", d.display());
    }
    // The state directory keeps nothing the plugin or a runtime would read.
    let state: Vec<String> = walk(&n.agent.state_dir())
        .into_iter()
        .filter(|f| f.contains("endpoints/") || f.ends_with("cni.sock") || f.ends_with("pins"))
        .collect();
    assert!(state.is_empty(), "state left: {state:?}");
    eventually("nothing answers on the agent's port", T, || {
        weft_tests::weft_cluster::http_get(&n.node.ns, n.node.ip, 9090, "/healthz")
            .is_err()
            .then_some(())
    });
    let _ = std::fs::remove_dir_all(&cni);
}

/// Every file under `dir` (relative paths), none if it is gone.
fn walk(dir: &std::path::Path) -> Vec<String> {
    fn go(base: &std::path::Path, d: &std::path::Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(d) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                go(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap_or(&p).display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out
}
