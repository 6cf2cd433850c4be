//! The kernel features the agent probes: what it reports on this kernel,
//! compared with the kernel asked by the tests' own checks (a program that
//! calls the helper, a device of the kind, the conntrack module), and
//! each optional feature turned off (`--kernel-feature-off`, a test's
//! switch): the node still carries pods' traffic, interoperates with a
//! flannel node, drops hostile VXLAN, and its counters say which path each
//! packet took.
//!
//! `cargo xtask test` runs this on the host (whose kernel refuses
//! `bpf_xdp_adjust_meta` in XDP and has no netkit) and in the Debian 6.12
//! VM (which has both, and conntrack as a module).

use std::{collections::BTreeMap, time::Duration};

use dataplane_common::Reason;
use weft::dataplane::Counters;
use weft_tests::{
    agent::eventually,
    cluster::{Node, ping},
    counters::Snapshot,
    kernel,
    netns::Netns,
    traffic::tcp_transfer,
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

/// The kernel features `n`'s status report gives: name -> available.
fn reported(n: &WeftNode) -> BTreeMap<String, bool> {
    features(&n.status_json().expect("a status report")["kernel"])
}

/// A report's kernel section as name -> available.
fn features(kernel: &serde_json::Value) -> BTreeMap<String, bool> {
    kernel["features"]
        .as_array()
        .unwrap_or_else(|| panic!("no kernel features in {kernel}"))
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["available"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn wait_up(c: &WeftCluster) {
    for n in &c.nodes {
        n.wait_dataplane_up(weft_tests::scaled(T));
    }
    c.wait_meshed(weft_tests::scaled(T));
}

#[test]
fn the_agent_reports_what_this_kernel_refuses_and_says_it_once() {
    let mut c = WeftCluster::new(1, &[]).unwrap();
    wait_up(&c);
    let n = &c.nodes[0];
    let got = reported(n);
    println!("reported: {got:?}");
    // `weft status --json` carries the same section.
    let json: serde_json::Value =
        serde_json::from_str(&n.weft(&["status", "--json"]).unwrap()).unwrap();
    assert_eq!(
        features(&json["agent"]["kernel"]),
        got,
        "weft status --json"
    );
    let want: BTreeMap<String, bool> = [
        ("btf", true),
        ("tcx", true),
        ("maps", true),
        ("tc_programs", true),
        ("xdp_decap", true),
        ("xdp_decap_mark", kernel::xdp_adjust_meta()),
        ("conntrack_kfuncs", weft_tests::conntrack_kfuncs()),
        ("netkit", kernel::netkit_devices()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(got, want, "the agent's probes agree with the kernel");

    // One metric series per feature, as reported.
    for (f, available) in &want {
        let series = format!("weft_kernel_feature{{feature=\"{f}\",available=\"{available}\"}}");
        assert_eq!(n.series(&series), Some(1.0), "{series}");
    }
    // `weft status` has the section, and says what a missing feature costs.
    let status = n.weft(&["status"]).unwrap();
    assert!(status.contains("Kernel features (Linux "), "{status}");
    for (f, available) in &want {
        let line = status
            .lines()
            .find(|l| l.split_whitespace().next() == Some(f.as_str()))
            .unwrap_or_else(|| panic!("no line for {f}: {status}"));
        assert_eq!(line.contains("unavailable"), !available, "{line}");
    }
    if !want["xdp_decap_mark"] {
        assert!(
            status.contains("bpf_xdp_adjust_meta"),
            "the kernel's refusal is quoted: {status}"
        );
    }
    // One warning per missing optional feature, no more.
    let log = n.agent.log();
    for (f, available) in &want {
        let warned = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(&format!("feature=\"{f}\"")))
            .count();
        assert_eq!(warned, usize::from(!available), "{f}: {log}");
    }
    // `weft doctor` says the same.
    let doctor = n.doctor_from_host();
    for (f, available) in &want {
        let warned = doctor
            .lines()
            .any(|l| l.starts_with("warn") && l.contains(&format!("kernel     {f}:")));
        assert_eq!(warned, !available, "{f}: {doctor}");
    }

    // A restart in the same boot takes the kept results instead of
    // probing again, and reports the same.
    assert!(log.contains("probed=true"), "{log}");
    let n = &mut c.nodes[0];
    n.agent.restart().unwrap();
    n.wait_dataplane_up(weft_tests::scaled(T));
    n.agent
        .wait_log("probed=false", weft_tests::scaled(T))
        .unwrap_or_else(|e| panic!("{e:#}: {}", n.agent.log()));
    assert_eq!(reported(n), want, "after the restart");
}

/// What each node counted of a transfer, as differences.
struct Paths {
    sent_bypass: u64,
    sent_stack: u64,
    received_bypass: u64,
    received_stack: u64,
}

/// A cluster of two Weft nodes started with `extra`, and a flannel node:
/// a checksummed transfer between the Weft nodes' pods, pings with the
/// flannel node's pod both ways, hostile VXLAN at the receiver. Returns
/// which path the transfer took.
fn carries_interoperates_and_drops(extra: &[&str]) -> (WeftCluster, Paths) {
    let c = WeftCluster::new(2, extra).unwrap();
    wait_up(&c);
    let mut flannel = Node::new(&c.underlay, 3).unwrap();
    let fsub = c.free_subnets(1)[0];
    flannel.pods_for(fsub, 1, 1450).unwrap();
    c.flannel_up(&flannel, fsub);
    eventually(
        "the flannel node is everyone's peer",
        weft_tests::scaled(T),
        || {
            c.nodes
                .iter()
                .all(|n| n.peer_subnets().contains(&fsub))
                .then_some(())
        },
    );
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let (ca, cb) = (
        Counters::open(a.pins.pins()).unwrap(),
        Counters::open(b.pins.pins()).unwrap(),
    );
    let (sa, sb) = (Snapshot::of(&ca), Snapshot::of(&cb));
    let (pa, pb) = (&a.node.pods[0], &b.node.pods[0]);
    let bytes = ((20 << 20) as f64 / weft_tests::time_scale()) as usize;
    let (n, intact) = tcp_transfer(&pb.ns, pb.ip, 5231, &pa.ns, bytes);
    assert!(n == bytes && intact, "the transfer arrived whole");
    let (ea, eb) = (Snapshot::of(&ca), Snapshot::of(&cb));
    let paths = Paths {
        sent_bypass: ea.since(&sa, Reason::EncapBypass),
        sent_stack: ea.since(&sa, Reason::Encapsulated),
        received_bypass: eb.since(&sb, Reason::DecapBypass),
        received_stack: eb.since(&sb, Reason::Decapsulated),
    };
    println!(
        "{extra:?}: sent {} bypassing, {} through the stack; received {} bypassing, {} through the stack",
        paths.sent_bypass, paths.sent_stack, paths.received_bypass, paths.received_stack
    );

    // The flannel node's pod, both ways, counted by the Weft node on each
    // side (the peer probes cross too, so these are lower bounds).
    let fpod = &flannel.pods[0];
    let (sa, sb) = (Snapshot::of(&ca), Snapshot::of(&cb));
    assert!(ping(&pa.ns, fpod.ip, 3), "weft pod -> flannel pod");
    assert!(ping(&fpod.ns, pb.ip, 3), "flannel pod -> weft pod");
    let (ea, eb) = (Snapshot::of(&ca), Snapshot::of(&cb));
    let to_flannel = (
        ea.since(&sa, Reason::EncapBypass),
        ea.since(&sa, Reason::Encapsulated),
    );
    let from_flannel = (
        eb.since(&sb, Reason::DecapBypass),
        eb.since(&sb, Reason::Decapsulated),
    );
    println!(
        "{extra:?}: to the flannel node {} bypassing, {} through the stack; from it {} bypassing, {} through the stack",
        to_flannel.0, to_flannel.1, from_flannel.0, from_flannel.1
    );
    assert!(to_flannel.0 + to_flannel.1 >= 3, "{to_flannel:?}");
    assert!(from_flannel.0 + from_flannel.1 >= 3, "{from_flannel:?}");

    // Hostile VXLAN at node b, each kind the uplink refuses: from an
    // unknown VTEP, another VNI, cut short, without the VNI flag, not IP
    // inside, an inner source of another node's subnet, and a congestion
    // mark on a packet that is not ECN-capable.
    let attacker = Netns::new("kfx").unwrap();
    c.underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    let before = Snapshot::of(&cb);
    let spoofed = fsub.hosts().nth(9).unwrap();
    let own = c.nodes[0].subnet.hosts().nth(9).unwrap();
    let script = format!(
        r#"
from scapy.all import Ether, IP, UDP, Raw, ARP, sendp, conf
conf.verb = 0
def vx(outer_src, inner_src, vni=1, flags=0x08, inner=None, outer_tos=0, inner_tos=0):
    vxlan = bytes([flags, 0, 0, 0]) + vni.to_bytes(3, "big") + b"\x00"
    if inner is None:
        inner = Ether(dst="{vtep_b}", src="{vtep_a}")/IP(src=inner_src, dst="{pod}", tos=inner_tos)/UDP(sport=5555, dport=7777)/Raw(b"x")
    return Ether(dst="{mac}")/IP(src=outer_src, dst="{node}", tos=outer_tos)/UDP(sport=40000, dport=8472)/Raw(vxlan + bytes(inner))
sendp([
    vx("198.18.0.66", "{own}"),
    vx("{node_a}", "{own}", vni=7),
    Ether(dst="{mac}")/IP(src="{node_a}", dst="{node}")/UDP(sport=40000, dport=8472)/Raw(b"\x08\x00\x00\x00"),
    vx("{node_a}", "{own}", flags=0x00),
    vx("{node_a}", "", inner=Ether(dst="{vtep_b}", src="{vtep_a}")/ARP(psrc="{own}", pdst="{pod}")),
    vx("{node_a}", "{spoofed}"),
    vx("{node_a}", "{own}", outer_tos=3, inner_tos=0),
], iface="eth0")
"#,
        vtep_b = c.nodes[1].vtep_mac(),
        vtep_a = c.nodes[0].vtep_mac(),
        pod = pb.ip,
        mac = c.nodes[1].node.mac(),
        node = c.nodes[1].node.ip,
        node_a = c.nodes[0].node.ip,
    );
    attacker.exec("/usr/bin/python3", &["-c", &script]).unwrap();
    let want = [
        (Reason::DropUnknownVtep, 1),
        (Reason::DropWrongVni, 1),
        (Reason::DropMalformed, 3),
        (Reason::DropSpoofed, 1),
        (Reason::DropEcn, 1),
    ];
    let mut got = Vec::new();
    let counted = weft_tests::agent::poll(T, || {
        let after = Snapshot::of(&cb);
        got = want.map(|(r, _)| (r, after.since(&before, r))).to_vec();
        (got == want).then_some(())
    });
    assert!(
        counted.is_some(),
        "hostile frames counted {got:?}, want {want:?}"
    );
    drop(flannel);
    (c, paths)
}

/// Whether the tests' host routing bypasses the host stack on a kernel
/// without the conntrack kfuncs: only under `bpf`.
fn bypasses_without_conntrack() -> bool {
    weft_tests::host_routing() == "bpf"
}

#[test]
fn without_xdp_decapsulation_tc_decapsulates_and_keeps_the_fast_path() {
    let (c, p) = carries_interoperates_and_drops(&[
        "--xdp-mode",
        "native",
        "--kernel-feature-off",
        "xdp_decap",
    ]);
    let b = &c.nodes[1];
    let status = b.weft(&["status"]).unwrap();
    assert!(status.contains("decapsulation: tc"), "{status}");
    let link = b.node.ns.ip(&["-d", "link", "show", "eth0"]).unwrap();
    assert!(!link.contains("prog/xdp"), "no XDP program: {link}");
    if weft_tests::bypasses() {
        assert!(p.received_bypass > 100 && p.sent_bypass > 100);
    } else {
        assert!(p.received_bypass == 0 && p.received_stack > 100);
    }
}

#[test]
fn without_the_xdp_mark_frames_xdp_decapsulates_take_the_host_stack() {
    let (c, p) = carries_interoperates_and_drops(&[
        "--xdp-mode",
        "native",
        "--kernel-feature-off",
        "xdp_decap_mark",
    ]);
    let b = &c.nodes[1];
    let status = b.weft(&["status"]).unwrap();
    assert!(
        status.contains("decapsulation: xdp-native") && status.contains("take the host stack"),
        "{status}"
    );
    // XDP decapsulated every frame; none was delivered by the fast path.
    assert_eq!(p.received_bypass, 0);
    assert!(p.received_stack > 100);
    // Sending is not XDP's: it bypasses where host routing does.
    assert_eq!(p.sent_bypass > 100, weft_tests::bypasses());
}

#[test]
fn without_the_conntrack_kfuncs_auto_sends_every_flow_through_the_stack() {
    let (_c, p) = carries_interoperates_and_drops(&["--kernel-feature-off", "conntrack_kfuncs"]);
    let fast = bypasses_without_conntrack();
    assert_eq!(p.sent_bypass > 0, fast);
    assert_eq!(p.received_bypass > 0, fast);
    if !fast {
        assert!(p.sent_stack > 100 && p.received_stack > 100);
    }
}

#[test]
fn without_netkit_the_node_carries_interoperates_and_drops_as_before() {
    let (c, p) = carries_interoperates_and_drops(&["--kernel-feature-off", "netkit"]);
    let status = c.nodes[1].weft(&["status"]).unwrap();
    let line = status
        .lines()
        .find(|l| l.split_whitespace().next() == Some("netkit"))
        .unwrap_or_else(|| panic!("no netkit line: {status}"));
    assert!(line.contains("unavailable"), "{line}");
    // netkit serves pods' devices only: the uplink's paths are as they are
    // with it (the plugin's refusal: netkit.rs).
    assert_eq!(p.sent_bypass > 100, weft_tests::bypasses());
    assert_eq!(p.received_bypass > 100, weft_tests::bypasses());
}

#[test]
fn a_required_feature_cannot_be_turned_off_and_an_unknown_one_is_named() {
    for (f, want) in [
        ("tcx", "a required feature cannot be turned off"),
        ("warp_drive", "no such kernel feature"),
    ] {
        let c = WeftCluster::new(0, &[]).unwrap();
        let node = Node::new(&c.underlay, 1).unwrap();
        let started = c
            .start_agent(
                node,
                weft_tests::pins::TestPins::new(),
                &["--kernel-feature-off", f],
            )
            .unwrap();
        eventually("the agent to exit", weft_tests::scaled(T), || {
            (!started.agent.running()).then_some(())
        });
        let log = started.agent.log();
        assert!(log.contains(want), "{f}: {log}");
    }
}
