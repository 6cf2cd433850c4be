//! Switching a running cluster's backend as the README says (write the
//! network config, restart the agents), both ways, under `auto` and
//! `legacy`: nothing of the old backend stays (devices, programs, pins,
//! sockets on its port), the pods reach each other over the new one only
//! (nothing crosses the underlay on the old backend's port, so nothing
//! travels unencrypted under WireGuard), and VXLAN forged from an underlay
//! host with a peer's address reaches no pod once WireGuard carries the
//! network (under VXLAN the same datagram does: VXLAN has no
//! authentication, which is what the test can tell apart).
//!
//! WireGuard is not in the host's kernel: `cargo xtask test` runs this in
//! the Debian 6.12 VM.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use weft_tests::{
    agent::eventually,
    netns::Netns,
    traffic::tcp_transfer,
    weft_cluster::{PREFIX, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
const VXLAN: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#;
const WIREGUARD: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#;

/// Counts, in the underlay's bridge, the UDP datagrams to each port.
struct Wire;

impl Wire {
    fn new(ns: &Netns) -> Self {
        for cmd in [
            "add table bridge wcount",
            "add chain bridge wcount tally { type filter hook forward priority 0 ; }",
            "add rule bridge wcount tally udp dport 8472 counter comment \"vxlan\"",
            "add rule bridge wcount tally udp dport 51820 counter comment \"wireguard\"",
        ] {
            let args: Vec<&str> = cmd.split(' ').collect();
            ns.command("nft").args(&args).output().expect("nft");
        }
        Self
    }

    /// (VXLAN datagrams, WireGuard datagrams) crossed so far.
    fn counts(&self, ns: &Netns) -> (u64, u64) {
        let out = ns
            .command("nft")
            .args(["list", "table", "bridge", "wcount"])
            .output()
            .expect("nft");
        let text = String::from_utf8_lossy(&out.stdout);
        let packets = |what: &str| {
            text.lines()
                .find(|l| l.contains(&format!("comment \"{what}\"")))
                .and_then(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    let i = w.iter().position(|x| *x == "packets")?;
                    w.get(i + 1)?.parse().ok()
                })
                .unwrap_or(0)
        };
        (packets("vxlan"), packets("wireguard"))
    }
}

/// What of the VXLAN backend is on `n`: its devices, the programs pinned
/// on its uplink and devices, a socket on the VXLAN port.
fn vxlan_left(n: &WeftNode) -> Vec<String> {
    let mut left = Vec::new();
    let links = n.node.ns.ip(&["-o", "link", "show"]).unwrap();
    for l in links.lines() {
        let name = l.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or(name);
        if name.starts_with("weft.") || name.starts_with("weft-rx.") || name.starts_with("weft-v6.")
        {
            left.push(format!("device {name}"));
        }
    }
    let vx = n
        .node
        .ns
        .ip(&["-d", "link", "show", "type", "vxlan"])
        .unwrap();
    if !vx.trim().is_empty() {
        left.push(format!("a vxlan device: {vx}"));
    }
    let eth0 = n.node.ns.ip(&["-d", "link", "show", "eth0"]).unwrap();
    if eth0.contains("prog/xdp") {
        left.push("XDP on the uplink".into());
    }
    for pin in pins(n) {
        // `<hook>-<device>-<index>`; a pod's veth may well be veth0....
        let dev = pin.split('-').nth(1).unwrap_or("");
        if dev == "eth0" || dev.starts_with("weft") {
            left.push(format!("link pin {pin}"));
        }
    }
    if listening(n, 8472) {
        left.push("a socket on UDP 8472".into());
    }
    left
}

/// What of the WireGuard backend is on `n`.
fn wireguard_left(n: &WeftNode) -> Vec<String> {
    let mut left = Vec::new();
    for dev in ["flannel-wg", "flannel-wg-v6"] {
        if n.node.ns.ip(&["link", "show", dev]).is_ok() {
            left.push(format!("device {dev}"));
        }
    }
    for pin in pins(n) {
        if pin.contains("flannel-wg") {
            left.push(format!("link pin {pin}"));
        }
    }
    if listening(n, 51820) {
        left.push("a socket on UDP 51820".into());
    }
    left
}

fn pins(n: &WeftNode) -> Vec<String> {
    std::fs::read_dir(n.pins.path().join("links"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn listening(n: &WeftNode, port: u16) -> bool {
    let out = n
        .node
        .ns
        .command("ss")
        .args(["-ulnH"])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        l.split_whitespace()
            .nth(3)
            .is_some_and(|a| a.ends_with(&format!(":{port}")))
    })
}

/// Sends VXLAN from an underlay host, with node 2's address as the outer
/// source and the nodes' VTEP MACs under VXLAN (`macs`), to node 1's pod;
/// returns what the pod's UDP port received.
fn forged_vxlan_reaches(c: &WeftCluster, attacker: &Netns, macs: &[String; 2]) -> Vec<String> {
    let (target, peer) = (&c.nodes[0], &c.nodes[1]);
    let pod = &target.node.pods[0];
    let (tx, rx) = std::sync::mpsc::channel();
    let pod_ip = pod.ip;
    let sent = Arc::new(AtomicBool::new(false));
    let listener = pod.ns.spawn_thread({
        let sent = sent.clone();
        move || {
            let s = std::net::UdpSocket::bind((pod_ip, 7777)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            tx.send(()).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            let deadline = std::time::Instant::now() + weft_tests::scaled(T);
            while std::time::Instant::now() < deadline {
                match s.recv(&mut buf) {
                    Ok(n) => got.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(_) if sent.load(Ordering::SeqCst) => break,
                    Err(_) => {}
                }
            }
            got
        }
    });
    rx.recv().unwrap();
    let inner_src: Ipv4Addr = peer.subnet.hosts().nth(9).unwrap();
    let script = format!(
        r#"
from scapy.all import Ether, IP, UDP, Raw, sendp, conf
conf.verb = 0
inner = Ether(dst="{vtep}", src="{peer_vtep}")/IP(src="{inner_src}", dst="{pod}")/UDP(sport=5555, dport=7777)/Raw(b"forged")
sendp([Ether(dst="{mac}")/IP(src="{peer}", dst="{node}")/UDP(sport=40000, dport=8472)/Raw(b"\x08\x00\x00\x00\x00\x00\x01\x00" + bytes(inner))] * 3, iface="eth0")
"#,
        vtep = macs[0],
        peer_vtep = macs[1],
        pod = pod.ip,
        mac = target.node.mac(),
        node = target.node.ip,
        peer = peer.node.ip,
    );
    let r = attacker.exec("/usr/bin/python3", &["-c", &script]);
    sent.store(true, Ordering::SeqCst);
    r.unwrap();
    listener.join().unwrap()
}

/// A checksummed TCP flow from node 1's pod to node 2's, counting what
/// crossed the underlay meanwhile: (VXLAN datagrams, WireGuard datagrams).
fn flow(c: &WeftCluster, wire: &Wire, port: u16) -> (u64, u64) {
    let (a, b) = (&c.nodes[0].node.pods[0], &c.nodes[1].node.pods[0]);
    let before = wire.counts(&c.underlay.ns);
    let bytes = ((4 << 20) as f64 / weft_tests::time_scale()) as usize;
    let (n, ok) = tcp_transfer(&b.ns, std::net::IpAddr::from(b.ip), port, &a.ns, bytes);
    assert!(n == bytes && ok, "the flow arrived whole");
    let after = wire.counts(&c.underlay.ns);
    (after.0 - before.0, after.1 - before.1)
}

fn restart_all(c: &mut WeftCluster, config: &str, keys: Option<&[PathBuf]>) {
    c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), config])
        .unwrap();
    for (i, n) in c.nodes.iter_mut().enumerate() {
        let args = n.agent.args_mut();
        if let Some(at) = args.iter().position(|a| a == "--wireguard-key-file") {
            args.drain(at..at + 2);
        }
        if let Some(keys) = keys {
            args.extend([
                "--wireguard-key-file".to_string(),
                keys[i].to_str().unwrap().to_string(),
            ]);
        }
        n.agent.restart().unwrap();
    }
}

fn switch_both_ways(routing: &str) {
    let mut c =
        WeftCluster::with_config(2, VXLAN, &["--host-routing", routing, "--ip-masq"]).unwrap();
    c.wait_meshed(weft_tests::scaled(T));
    let wire = Wire::new(&c.underlay.ns);
    let attacker = Netns::new("bsx").unwrap();
    c.underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    let macs = [
        c.nodes[0].vtep_mac().to_string(),
        c.nodes[1].vtep_mac().to_string(),
    ];

    // VXLAN: the flow crosses as VXLAN; forged VXLAN from a peer's
    // address reaches the pod (nothing authenticates VXLAN).
    let (vx, wg) = flow(&c, &wire, 5501);
    assert!(
        vx > 0 && wg == 0,
        "under vxlan: {vx} VXLAN, {wg} WireGuard datagrams"
    );
    assert_eq!(
        forged_vxlan_reaches(&c, &attacker, &macs),
        vec!["forged"; 3],
        "under vxlan the forged datagrams reach the pod"
    );

    // To WireGuard.
    let keys: Vec<PathBuf> = (1..=2)
        .map(|i| std::env::temp_dir().join(weft_tests::unique(&format!("weft-bs-key-{i}-"))))
        .collect();
    restart_all(&mut c, WIREGUARD, Some(&keys));
    for n in &c.nodes {
        eventually(
            &format!("{}: WireGuard up", n.agent.name),
            weft_tests::scaled(T),
            || {
                (n.node.ns.ip(&["link", "show", "flannel-wg"]).is_ok() && listening(n, 51820))
                    .then_some(())
            },
        );
    }
    eventually(
        "the pods reach each other over WireGuard",
        weft_tests::scaled(T),
        || c.all_pairs_reach().ok(),
    );
    for n in &c.nodes {
        let left = vxlan_left(n);
        assert!(
            left.is_empty(),
            "{}: the VXLAN backend left {left:?}",
            n.agent.name
        );
    }
    let (vx, wg) = flow(&c, &wire, 5502);
    assert!(
        vx == 0 && wg > 0,
        "under wireguard: {vx} VXLAN, {wg} WireGuard datagrams"
    );
    assert!(
        forged_vxlan_reaches(&c, &attacker, &macs).is_empty(),
        "under wireguard no forged VXLAN reaches a pod"
    );

    // And back to VXLAN.
    restart_all(&mut c, VXLAN, None);
    for n in &c.nodes {
        eventually(
            &format!("{}: VXLAN up", n.agent.name),
            weft_tests::scaled(T),
            || listening(n, 8472).then_some(()),
        );
    }
    eventually(
        "the pods reach each other over VXLAN",
        weft_tests::scaled(T),
        || c.all_pairs_reach().ok(),
    );
    for n in &c.nodes {
        let left = wireguard_left(n);
        assert!(
            left.is_empty(),
            "{}: the WireGuard backend left {left:?}",
            n.agent.name
        );
    }
    let (vx, wg) = flow(&c, &wire, 5503);
    assert!(
        vx > 0 && wg == 0,
        "back under vxlan: {vx} VXLAN, {wg} WireGuard datagrams"
    );
    for k in &keys {
        let _ = std::fs::remove_file(k);
    }
}

#[test]
fn a_backend_switch_over_wireguard_leaves_nothing_of_the_old_one_under_auto() {
    switch_both_ways("auto");
}

#[test]
fn a_backend_switch_over_wireguard_leaves_nothing_of_the_old_one_under_legacy() {
    switch_both_ways("legacy");
}
