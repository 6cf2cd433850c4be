//! `weft doctor` on a healthy node passes; each thing broken on a test node
//! (with the agent stopped, so that it does not repair it first) makes the
//! check that covers it fail, with its fix, and the exit status non-zero.

use std::{path::Path, time::Duration};

use weft_tests::{
    agent::{Agent, weft_bin},
    cluster::Node,
    dual::{DUAL, DualCluster},
    netns::Netns,
    weft_cluster::{ETCD_IP, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

/// Runs `weft doctor` in `n`'s namespace with its paths; returns (exit ok,
/// stdout + stderr).
fn doctor(n: &WeftNode, cni_dir: &Path) -> (bool, String) {
    run_doctor(&n.node, n.pins.path(), &n.agent, cni_dir)
}

/// `weft doctor --json`: its exit status and the document it printed.
fn doctor_json(n: &WeftNode, cni_dir: &Path) -> (bool, serde_json::Value) {
    let (ok, text) = run_doctor_with(&n.node, n.pins.path(), &n.agent, cni_dir, &["--json"]);
    let doc = text.find('{').and_then(|a| {
        let b = text.rfind('}')?;
        serde_json::from_str(&text[a..=b]).ok()
    });
    (
        ok,
        doc.unwrap_or_else(|| panic!("no JSON document:\n{text}")),
    )
}

fn run_doctor(node: &Node, pins: &Path, agent: &Agent, cni_dir: &Path) -> (bool, String) {
    run_doctor_with(node, pins, agent, cni_dir, &[])
}

fn run_doctor_with(
    node: &Node,
    pins: &Path,
    agent: &Agent,
    cni_dir: &Path,
    extra: &[&str],
) -> (bool, String) {
    let out = node
        .ns
        .command(weft_bin().to_str().unwrap())
        .args(["doctor", "--bpffs-dir"])
        .arg(pins)
        .arg("--state-dir")
        .arg(agent.state_dir())
        .arg("--subnet-file")
        .arg(agent.subnet_file())
        .args(["--etcd-endpoints", &format!("http://{ETCD_IP}:2379")])
        .arg("--cni-conf-dir")
        .arg(cni_dir)
        .args(extra)
        .output()
        .expect("running weft doctor");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Asserts that doctor fails, with a FAIL line for `check` containing
/// `saw`, followed by a fix.
fn fails(n: &WeftNode, cni_dir: &Path, check: &str, saw: &str) {
    let (ok, text) = doctor(n, cni_dir);
    println!("--- {check} broken:\n{text}");
    assert!(!ok, "doctor exits non-zero with {check} broken:\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(&format!("FAIL  {check}")) && l.contains(saw))
        .unwrap_or_else(|| panic!("a FAIL for {check} naming {saw:?}:\n{text}"));
    assert!(
        lines.get(at + 1).is_some_and(|l| l.contains("fix: ")),
        "the fix follows:\n{text}"
    );
    // The same findings as one JSON document, with the same exit status.
    let (ok, doc) = doctor_json(n, cni_dir);
    assert!(
        !ok,
        "doctor --json exits non-zero with {check} broken: {doc:#}"
    );
    assert_eq!(doc["passed"], false, "{doc:#}");
    let found = doc["checks"].as_array().unwrap().iter().any(|c| {
        c["check"] == check
            && c["level"] == "fail"
            && c["saw"].as_str().is_some_and(|t| t.contains(saw))
            && c["fix"].as_str().is_some_and(|f| !f.is_empty())
    });
    assert!(
        found,
        "a fail for {check} naming {saw:?} with its fix: {doc:#}"
    );
}

/// Drops what `rule` matches in the underlay's switch (a firewall on the
/// way); returns what lifts it.
fn block_on_switch<'a>(switch: &'a Netns, rule: &str) -> impl FnOnce() + 'a {
    switch
        .exec("nft", &["add", "table", "bridge", "doctor"])
        .unwrap();
    let chain = format!("{{ type filter hook forward priority 0; policy accept; {rule} drop; }}");
    switch
        .exec(
            "nft",
            &["add", "chain", "bridge", "doctor", "block", &chain],
        )
        .unwrap();
    move || {
        switch
            .exec("nft", &["delete", "table", "bridge", "doctor"])
            .unwrap();
    }
}

fn healthy(n: &WeftNode, cni_dir: &Path) {
    let (ok, text) = doctor(n, cni_dir);
    assert!(ok, "a healthy node passes:\n{text}");
    for check in [
        "kernel",
        "bpffs",
        "programs",
        "hook",
        "rp_filter",
        "offloads",
        "mtu",
        "subnet",
        "peers",
        "cni",
    ] {
        assert!(
            text.contains(&format!("ok    {check}")),
            "{check} is checked:\n{text}"
        );
    }
    assert!(!text.contains("FAIL"), "{text}");
}

#[test]
fn doctor_finds_what_is_broken() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    for n in &mut c.nodes {
        n.use_cni();
        n.node.add_pod().unwrap();
    }
    c.wait_meshed(T);
    let n = &c.nodes[0];
    // The node's bpffs is shared, as a host's /sys/fs/bpf is (on the host:
    // `ip netns exec` gives each command a slave copy of its mounts).
    let propagation = |how: &str| {
        weft_tests::proc::run("mount", &[how, n.pins.path().to_str().unwrap()]).unwrap();
    };
    propagation("--make-shared");
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-doctor-"));
    let (cni_bin, cni_dir) = (dir.join("bin"), dir.join("net.d"));
    let install_cni = || {
        let (ok, _, err) = weft_tests::agent::weft(&[
            "install-cni",
            "--bin-dir",
            cni_bin.to_str().unwrap(),
            "--conf-dir",
            cni_dir.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
    };
    install_cni();
    healthy(n, &cni_dir);

    // The agent stops: from here on nothing repairs what breaks.
    n.agent.pause();

    n.node
        .ns
        .sysctl("net.ipv4.conf.eth0.rp_filter", "1")
        .unwrap();
    fails(n, &cni_dir, "rp_filter", "strict on eth0");
    n.node
        .ns
        .sysctl("net.ipv4.conf.eth0.rp_filter", "2")
        .unwrap();

    n.node
        .ns
        .ip(&["link", "set", "weft.1", "mtu", "1480"])
        .unwrap();
    fails(n, &cni_dir, "mtu", "exceeds the uplink's 1500");
    n.node
        .ns
        .ip(&["link", "set", "weft.1", "mtu", "1450"])
        .unwrap();

    // VXLAN blocked on the way (a firewall on the underlay's switch).
    let unblock = block_on_switch(&c.underlay.ns, "udp dport 8472");
    fails(n, &cni_dir, "peers", "no answer through UDP 8472");
    unblock();

    let peer = &c.nodes[1].node.ns;
    // The peer's underlay carries less than the overlay needs.
    peer.ip(&["link", "set", "eth0", "mtu", "1400"]).unwrap();
    fails(n, &cni_dir, "peers", "does not carry the overlay MTU");
    peer.ip(&["link", "set", "eth0", "mtu", "1500"]).unwrap();

    // A stale subnet.env naming the other node's subnet.
    let env_path = n.agent.subnet_file();
    let env = std::fs::read_to_string(&env_path).unwrap();
    let theirs = c.nodes[1].subnet;
    let first = |s: ipnet::Ipv4Net| std::net::Ipv4Addr::from(u32::from(s.network()) + 1);
    std::fs::write(
        &env_path,
        env.replace(
            &format!("{}/", first(n.subnet)),
            &format!("{}/", first(theirs)),
        ),
    )
    .unwrap();
    fails(n, &cni_dir, "subnet", "belongs to 198.18.0.2");
    std::fs::write(&env_path, &env).unwrap();

    // The runtime's first network config does not run Weft's plugin.
    std::fs::write(
        cni_dir.join("05-flannel.conflist"),
        r#"{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel"},{"type":"portmap"}]}"#,
    )
    .unwrap();
    fails(n, &cni_dir, "cni", "does not run Weft's plugin");
    std::fs::remove_file(cni_dir.join("05-flannel.conflist")).unwrap();
    std::fs::remove_file(cni_dir.join("10-weft.conflist")).unwrap();
    fails(n, &cni_dir, "cni", "no network config");
    install_cni();

    // A private mount alone breaks nothing: the agent (in a mount
    // namespace of its own: `ip netns exec` gives it one) still has the
    // host's bpffs under its pins.
    propagation("--make-private");
    let (_, text) = doctor(n, &cni_dir);
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok    bpffs") && l.contains("has the host's bpffs")),
        "{text}"
    );
    // Pins on a bpffs of the agent's own mount namespace (a container that
    // mounted its own): they do not reach the host.
    let report = std::fs::read_to_string(n.agent.state_dir().join("status.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    let pid = v["pid"]
        .as_u64()
        .expect("the report names the agent's pid")
        .to_string();
    let pins = n.pins.path().to_str().unwrap();
    let in_agent_ns = |args: &[&str]| {
        let mut all = vec!["-t", pid.as_str(), "-m", "--"];
        all.extend(args);
        weft_tests::proc::run("nsenter", &all).unwrap();
    };
    in_agent_ns(&["mount", "-t", "bpf", "bpf", pins]);
    fails(
        n,
        &cni_dir,
        "bpffs",
        "on a bpffs of its own mount namespace",
    );
    in_agent_ns(&["umount", pins]);
    propagation("--make-shared");

    // Everything put back: healthy again.
    healthy(n, &cni_dir);

    // The programs detached and the device gone (weft teardown).
    n.weft(&["teardown"]).unwrap();
    let (ok, text) = doctor(n, &cni_dir);
    assert!(!ok && text.contains("FAIL  datapath"), "{text}");
    n.agent.resume();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dual-stack node: both families' programs, devices and MTUs are
/// checked, IPv6 peers are probed through the IPv6 overlay, and what breaks
/// only IPv6 fails only IPv6's checks.
#[test]
fn doctor_checks_both_families() {
    let c = DualCluster::new(2, DUAL, &[]).unwrap();
    c.wait_meshed(T);
    let n = &c.nodes[0];
    weft_tests::proc::run("mount", &["--make-shared", n.pins.path().to_str().unwrap()]).unwrap();
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-doctor6-"));
    let cni_dir = dir.join("net.d");
    let (ok, _, err) = weft_tests::agent::weft(&[
        "install-cni",
        "--bin-dir",
        dir.join("bin").to_str().unwrap(),
        "--conf-dir",
        cni_dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let run = || run_doctor(&n.node, n.pins.path(), &n.agent, &cni_dir);
    let (ok, text) = run();
    println!("--- dual-stack, healthy:\n{text}");
    assert!(
        ok && !text.contains("FAIL"),
        "a healthy dual-stack node passes:\n{text}"
    );
    for saw in [
        "weft_encap on weft.1",
        "weft_encap6 on weft-v6.1",
        "weft.1 1450, weft-v6.1 1430",
        "subnet.env 1430",
    ] {
        assert!(text.contains(saw), "{saw:?}:\n{text}");
    }
    let v6_peer = c.nodes[1].subnets.v6.unwrap();
    let v4_peer = c.nodes[1].subnets.v4.unwrap();
    let answered = |text: &str, subnet: &str| {
        text.lines().any(|l| {
            l.starts_with("ok    peers")
                && l.contains(&format!("peer {subnet} "))
                && l.contains("-byte probe")
                && l.contains("answered")
        })
    };
    assert!(
        answered(&text, &v6_peer.to_string()),
        "the IPv6 peer is probed:\n{text}"
    );
    assert!(
        answered(&text, &v4_peer.to_string()),
        "the IPv4 peer is probed:\n{text}"
    );

    // VXLAN over IPv6 blocked on the underlay: the IPv6 peer fails, the
    // IPv4 one still answers.
    let unblock = block_on_switch(&c.underlay.ns, "ip6 nexthdr udp udp dport 8472");
    let (ok, text) = run();
    println!("--- VXLAN over IPv6 blocked:\n{text}");
    assert!(!ok, "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("FAIL  peers")
            && l.contains(&format!("peer {v6_peer} "))
            && l.contains("no answer through UDP 8472")),
        "{text}"
    );
    assert!(answered(&text, &v4_peer.to_string()), "{text}");
    unblock();

    // The IPv6 overlay MTU set as flannel would (50 bytes below the
    // underlay): too big for VXLAN over IPv6.
    n.agent.pause();
    n.node
        .ns
        .ip(&["link", "set", "weft-v6.1", "mtu", "1450"])
        .unwrap();
    let (ok, text) = run();
    println!("--- IPv6 overlay MTU 1450:\n{text}");
    assert!(!ok, "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("FAIL  mtu")
            && l.contains(
                "weft-v6.1 overlay MTU 1450 + 70 bytes of VXLAN exceeds the uplink's 1500"
            )),
        "{text}"
    );
    n.node
        .ns
        .ip(&["link", "set", "weft-v6.1", "mtu", "1430"])
        .unwrap();
    n.agent.resume();
    let _ = std::fs::remove_dir_all(&dir);
}
