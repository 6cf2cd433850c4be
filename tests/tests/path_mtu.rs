//! Paths of different MTUs on one underlay: nodes 1 and 2 on a 9000-byte
//! segment, node 3 on another 9000-byte segment behind a router whose link
//! between the two carries 1500 bytes. No `Backend.MTU`: pods get 8950.
//!
//! Weft's outer packets do not set don't-fragment (as flannel's do not), so
//! the router fragments what is too big for its link. Those fragments are
//! no black hole: node 3's uplink programs pass them, the kernel
//! reassembles them and the node's vxlan device decapsulates them, checked
//! as the rest. Bulk TCP crosses both ways, from a pod (the fast path) and
//! from the node itself (the host-stack path), and `weft doctor` names the
//! smaller hop where the fragments arrive.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use dataplane_common::Reason;
use weft::dataplane::Counters;
use weft_tests::{
    agent::{eventually, weft_bin},
    cluster::{Node, Underlay, ping},
    netns::{Netns, veth},
    traffic::tcp_transfer,
    weft_cluster::{ETCD_IP, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
const JUMBO: &str = "9000";

fn packets(n: &WeftNode, r: Reason) -> u64 {
    Counters::open(n.pins.pins())
        .unwrap()
        .get(r)
        .unwrap()
        .packets
}

/// Raises every port of `bridge` in `ns`, then the bridge, to `mtu`.
fn jumbo_bridge(ns: &Netns, bridge: &str) {
    let ports = ns.ip(&["-o", "link", "show", "master", bridge]).unwrap();
    for line in ports.lines() {
        let name = line.split(": ").nth(1).unwrap().split('@').next().unwrap();
        ns.ip(&["link", "set", name, "mtu", JUMBO]).unwrap();
    }
    ns.ip(&["link", "set", bridge, "mtu", JUMBO]).unwrap();
}

/// The router: a namespace holding the second segment's bridge (`br1`,
/// 198.18.1.254/24), linked to the underlay namespace by a 1500-byte veth
/// (198.18.9.0/30). Returns it with node 3 (198.18.1.3) on `br1`.
fn behind_a_small_link(underlay: &Underlay) -> (Netns, Node) {
    let router = Netns::new("wr").unwrap();
    veth(&underlay.ns, "small", &router, "small").unwrap();
    underlay
        .ns
        .ip(&["addr", "add", "198.18.9.1/30", "dev", "small"])
        .unwrap();
    router
        .ip(&["addr", "add", "198.18.9.2/30", "dev", "small"])
        .unwrap();
    underlay
        .ns
        .ip(&["route", "add", "198.18.1.0/24", "via", "198.18.9.2"])
        .unwrap();
    underlay.ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
    router.sysctl("net.ipv4.ip_forward", "1").unwrap();
    router
        .ip(&["link", "add", "br1", "type", "bridge"])
        .unwrap();
    router.ip(&["link", "set", "br1", "up"]).unwrap();
    router
        .ip(&["addr", "add", "198.18.1.254/24", "dev", "br1"])
        .unwrap();
    router
        .ip(&["route", "add", "default", "via", "198.18.9.1"])
        .unwrap();
    let ns = Netns::new("wn").unwrap();
    veth(&ns, "eth0", &router, "p3").unwrap();
    router.ip(&["link", "set", "p3", "master", "br1"]).unwrap();
    ns.ip(&["addr", "add", "198.18.1.3/24", "dev", "eth0"])
        .unwrap();
    ns.ip(&["link", "set", "eth0", "mtu", JUMBO]).unwrap();
    ns.ip(&["route", "add", "default", "via", "198.18.1.254"])
        .unwrap();
    jumbo_bridge(&router, "br1");
    (router, Node::in_ns(ns, 3, Ipv4Addr::new(198, 18, 1, 3)))
}

fn mtu(ns: &Netns, dev: &str) -> u32 {
    let out = ns.ip(&["-o", "link", "show", dev]).unwrap();
    let at = out.find(" mtu ").unwrap() + 5;
    out[at..].split(' ').next().unwrap().parse().unwrap()
}

/// A don't-fragment ping of `size` bytes of payload.
fn ping_df(from: &Netns, to: Ipv4Addr, size: u32) -> bool {
    from.command("ping")
        .args(["-c", "2", "-W", "2", "-M", "do", "-s", &size.to_string()])
        .arg(to.to_string())
        .output()
        .unwrap()
        .status
        .success()
}

/// 32 MiB over TCP from `from` to `to`: intact, within 60 s.
fn bulk(what: &str, to: (&Netns, Ipv4Addr), from: &Netns, port: u16) {
    let t = Instant::now();
    let (got, ok) = tcp_transfer(to.0, to.1, port, from, 32 << 20);
    assert!(got == 32 << 20 && ok, "{what}: {got} bytes, intact: {ok}");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(60), "{what} took {took:?}");
    println!("{what}: 32 MiB in {took:.1?}");
}

/// `weft doctor`'s line for `check` on node `n`.
fn doctor_line(n: &WeftNode, check: &str) -> String {
    let out = n
        .node
        .ns
        .command(weft_bin().to_str().unwrap())
        .args(["doctor", "--bpffs-dir"])
        .arg(n.pins.path())
        .arg("--state-dir")
        .arg(n.agent.state_dir())
        .arg("--subnet-file")
        .arg(n.agent.subnet_file())
        .args(["--etcd-endpoints", &format!("http://{ETCD_IP}:2379")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.get(6..).is_some_and(|r| r.starts_with(check)))
        .unwrap_or_else(|| panic!("no {check} line:\n{text}"))
        .to_string()
}

#[test]
fn a_smaller_hop_on_the_underlay_is_no_black_hole() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    for i in 1..=2 {
        let node = Node::new(&c.underlay, i).unwrap();
        node.ns.ip(&["link", "set", "eth0", "mtu", JUMBO]).unwrap();
        node.ns
            .ip(&["route", "add", "198.18.1.0/24", "via", "198.18.0.254"])
            .unwrap();
        c.start_node_on(node, &[]).unwrap();
    }
    jumbo_bridge(&c.underlay.ns, "br0");
    let (_router, node) = behind_a_small_link(&c.underlay);
    c.start_node_on(node, &[]).unwrap();
    for n in c.nodes.iter_mut() {
        n.use_cni();
        n.node.add_pod().unwrap();
    }
    eventually("every peer programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 2)
            .then_some(())
    });
    let (n1, n2, n3) = (&c.nodes[0], &c.nodes[1], &c.nodes[2]);
    let (p1, p2, p3) = (&n1.node.pods[0], &n2.node.pods[0], &n3.node.pods[0]);
    for n in &c.nodes {
        assert_eq!(mtu(&n.node.pods[0].ns, "eth0"), 8950, "pods' MTU");
    }

    // Jumbo frames where the path carries them.
    assert!(ping_df(&p1.ns, p2.ip, 8900), "jumbo pod 1 -> pod 2");
    let fragmented = packets(n3, Reason::Fragmented);
    assert!(ping_df(&p1.ns, p3.ip, 8900), "jumbo pod 1 -> pod 3");
    assert!(
        packets(n3, Reason::Fragmented) >= fragmented + 2,
        "node 3 got them as fragments, and counted them"
    );
    // Doctor names it on node 3, not on node 2. (Node 2 first: doctor's
    // full-size probes to its peers come back fragmented from node 3.)
    let line = doctor_line(n2, "fragments");
    assert!(line.starts_with("ok"), "{line}");
    let line = doctor_line(n3, "fragments");
    assert!(
        line.starts_with("warn") && line.contains("arrived as outer fragments"),
        "{line}"
    );
    assert!(ping(&p3.ns, p1.ip, 2), "small pod 3 -> pod 1");
    assert!(ping_df(&p3.ns, p1.ip, 8900), "jumbo pod 3 -> pod 1");

    // Bulk TCP both ways across the small hop: from the pods (the fast
    // path) and from the nodes (the host-stack path).
    bulk("pod 1 -> pod 3", (&p3.ns, p3.ip), &p1.ns, 5301);
    bulk("pod 3 -> pod 1", (&p1.ns, p1.ip), &p3.ns, 5302);
    bulk("node 1 -> pod 3", (&p3.ns, p3.ip), &n1.node.ns, 5303);
    bulk("node 3 -> pod 1", (&p1.ns, p1.ip), &n3.node.ns, 5304);
    bulk("pod 1 -> pod 2", (&p2.ns, p2.ip), &p1.ns, 5305);
    assert_eq!(
        packets(n3, Reason::DropMalformed) + packets(n1, Reason::DropMalformed),
        0
    );
}
