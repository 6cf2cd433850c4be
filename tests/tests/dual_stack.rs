//! Dual-stack and IPv6-only networks with real agents: flannel's etcd keys
//! and JSON for both families, subnet.env's IPv6 lines, pods with an
//! address of each family (Weft's standalone CNI plugin), and IPv6 pod
//! traffic between IPv6 VTEPs in the eBPF datapath.

use std::time::Duration;

use dataplane_common::Reason;
use weft::lease::{LeaseAttrs, parse_key};
use weft_tests::{
    counters::Snapshot,
    dual::{DUAL, DualCluster, DualNode, V6_ONLY, underlay6},
    forwarded::Forwarded,
    netns::Netns,
    traffic::{tcp_transfer, udp_seen_source, udp_seen_source6},
    weft_cluster::PREFIX,
};

const T: Duration = Duration::from_secs(30);

/// One TCP flow's shares of packets that took the fast path: of those
/// sent at the client's node and of those received at the server's. The
/// flow's packets through the stack are counted in the nodes' forward
/// hooks, not by the dataplane's counters, which also count the agents'
/// own probes (a few packets a second, a percent of a short flow's GSO
/// packets).
struct FlowShares<'a> {
    nodes: [&'a DualNode; 2],
    before: [Snapshot; 2],
    forwarded: [Forwarded<'a>; 2],
}

impl<'a> FlowShares<'a> {
    fn watch(client: &'a DualNode, server: &'a DualNode, port: u16) -> Self {
        FlowShares {
            nodes: [client, server],
            before: [client, server].map(|n| Snapshot::of(&n.counters())),
            forwarded: [client, server].map(|n| Forwarded::count(&n.node.ns, port).unwrap()),
        }
    }

    /// (sent, received): the data's packets, which go to the port.
    fn shares(&self) -> (f64, f64) {
        let share = |i: usize, fast: Reason| {
            let fast = Snapshot::of(&self.nodes[i].counters()).since(&self.before[i], fast);
            let (slow, _) = self.forwarded[i].packets().unwrap();
            println!(
                "{}: {fast} bypassed, {slow} forwarded",
                ["sent", "received"][i]
            );
            fast as f64 / (fast + slow).max(1) as f64
        };
        (share(0, Reason::EncapBypass), share(1, Reason::DecapBypass))
    }
}

/// The node's IPv6 peer routes, which must all go through `weft-v6.1`.
fn assert_v6_peer_routes(n: &DualNode, peers: usize) {
    let routes = n
        .node
        .ns
        .ip(&["-6", "route", "show", "proto", "44"])
        .unwrap();
    assert_eq!(routes.lines().count(), peers, "{routes}");
    assert!(routes.contains("dev weft-v6.1"), "{routes}");
}

/// Every key under the subnets prefix, with its value.
fn leases(c: &DualCluster) -> Vec<(String, LeaseAttrs)> {
    let out = c
        .etcd
        .etcdctl(&["get", "--prefix", &format!("{PREFIX}/subnets/")])
        .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .map(|kv| {
            let key = kv[0].strip_prefix(&format!("{PREFIX}/subnets/")).unwrap();
            (
                key.to_string(),
                LeaseAttrs::parse(kv[1].as_bytes()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_dual_stack_cluster_reaches_every_pod_over_both_families() {
    let c = DualCluster::new(3, DUAL, &[]).unwrap();
    c.wait_meshed(T);

    // Leases as flannel writes them for dual-stack: a key naming both
    // subnets, PublicIPv6 and BackendV6Data beside the IPv4 ones.
    let ls = leases(&c);
    assert_eq!(ls.len(), 3, "{ls:?}");
    for n in &c.nodes {
        let key = n.subnets.key();
        let (_, a) = ls.iter().find(|(k, _)| *k == key).expect("the node's key");
        assert!(key.contains('&'), "{key}");
        assert_eq!(parse_key(&key).unwrap(), n.subnets);
        assert_eq!(a.public_ip, n.node.ip);
        assert_eq!(a.public_ipv6, Some(n.ip6));
        assert_ne!(
            a.vxlan_data().unwrap().vtep_mac,
            a.vxlan_v6_data().unwrap().vtep_mac,
            "one VTEP MAC per device, as flannel has"
        );
        // subnet.env with flannel's IPv6 lines; the MTU leaves room for
        // VXLAN over IPv6.
        let env = std::fs::read_to_string(n.agent.subnet_file()).unwrap();
        assert!(
            env.contains("FLANNEL_IPV6_NETWORK=fd00:10:244::/56\n"),
            "{env}"
        );
        let v6 = n.subnets.v6.unwrap();
        assert!(
            env.contains(&format!("FLANNEL_IPV6_SUBNET={}1/64\n", v6.network())),
            "{env}"
        );
        assert!(env.contains("FLANNEL_MTU=1430\n"), "{env}");
        // Pods have one address of each family.
        for p in &n.node.pods {
            assert!(n.subnets.v4.unwrap().contains(&p.ip));
            assert!(v6.contains(&p.ip6.expect("an IPv6 address")));
        }
        // IPv6 peers are routed through the IPv6 overlay device.
        assert_v6_peer_routes(n, 2);
    }

    let failed = c.unreachable_pairs();
    assert!(failed.is_empty(), "unreachable: {failed:?}");

    // TCP both ways over IPv6, intact.
    let (a, b) = (&c.nodes[0].node.pods[0], &c.nodes[1].node.pods[1]);
    let (a6, b6) = (a.ip6.unwrap(), b.ip6.unwrap());
    let flow = FlowShares::watch(&c.nodes[0], &c.nodes[1], 5201);
    let (n, intact) = tcp_transfer(&b.ns, b6, 5201, &a.ns, 50 << 20);
    assert!(n == 50 << 20 && intact, "{n} bytes to {b6}");
    // Without --ip-masq the bridge masquerades what leaves the node's
    // subnet (as flannel's plugin configures it): the conntrack gate keeps
    // a translated flow on the host stack at the sender, and the receiver,
    // which sees the sending node's address, takes the fast path.
    let (tx, rx) = flow.shares();
    println!(
        "IPv6 TCP, bridge masquerade: {tx:.4} of the sent packets bypassed, {rx:.4} of the received"
    );
    if !weft_tests::bypasses() {
        assert!(tx == 0.0 && rx == 0.0, "sent {tx:.4}, received {rx:.4}");
    } else {
        assert!(tx == 0.0 && rx >= 0.99, "sent {tx:.4}, received {rx:.4}");
    }
    drop(flow);
    let (n, intact) = tcp_transfer(&a.ns, a6, 5202, &b.ns, 20 << 20);
    assert!(n == 20 << 20 && intact, "{n} bytes to {a6}");
    // And over IPv4, unchanged.
    let (n, intact) = tcp_transfer(&b.ns, b.ip, 5203, &a.ns, 10 << 20);
    assert!(n == 10 << 20 && intact);

    // Counted by the programs on both sides.
    let sent = c.nodes[0].counters();
    let got = c.nodes[1].counters();
    let n = |c: &weft::dataplane::Counters, r| c.get(r).unwrap().packets;
    for (name, c) in [("sender", &sent), ("receiver", &got)] {
        let all: Vec<String> = c
            .all()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.packets > 0)
            .map(|(r, v)| format!("{}={}", r.name(), v.packets))
            .collect();
        println!("{name}: {}", all.join(" "));
    }
    assert!(n(&sent, Reason::Encapsulated) + n(&sent, Reason::EncapBypass) > 1000);
    assert!(n(&got, Reason::Decapsulated) + n(&got, Reason::DecapBypass) > 1000);

    // A node reaches a remote pod over IPv6 (its own traffic is routed into
    // the IPv6 overlay device).
    assert!(weft_tests::cluster::ping(&c.nodes[2].node.ns, a6, 2));
    // The IPv6 VTEPs are the underlay's addresses.
    assert_eq!(c.nodes[0].ip6, underlay6(1));

    // The IPv6 overlay device, removed by someone else, comes back with its
    // routes, and IPv6 pod traffic with it.
    // The agent may heal before any ping could show the gap (it hears the
    // deletion from netlink), so the device is checked by its index: a new
    // one means it was removed and made again.
    let n0 = &c.nodes[0];
    let index = |n: &DualNode| n.node.ns.ifindex("weft-v6.1");
    let before = index(n0).expect("weft-v6.1 exists");
    n0.node.ns.ip(&["link", "del", "weft-v6.1"]).unwrap();
    let started = std::time::Instant::now();
    weft_tests::agent::eventually("weft-v6.1 made again", T, || {
        index(n0).filter(|i| *i != before).map(|_| ())
    });
    weft_tests::agent::eventually("IPv6 pod traffic recovers", T, || {
        weft_tests::cluster::ping(&a.ns, b6, 1).then_some(())
    });
    println!(
        "weft-v6.1 removed: IPv6 traffic back after {:?}",
        started.elapsed()
    );
    assert_v6_peer_routes(n0, 2);

    // `weft teardown` removes the IPv6 parts too: the device, its routes,
    // table ip6 weft. Without --ip-masq the table holds only the chain that
    // makes conntrack track for `auto`'s gate, so it is there exactly where
    // the gate is (the conntrack kfuncs within reach).
    let mut c = c;
    let had_table = c.nodes[0]
        .node
        .ns
        .exec("nft", &["list", "table", "ip6", "weft"])
        .is_ok();
    assert_eq!(
        had_table,
        weft_tests::host_routing() == "auto" && weft_tests::conntrack_kfuncs(),
        "table ip6 weft is there (to remove) exactly where auto's gate needs it"
    );
    c.nodes[0].agent.stop().unwrap();
    let n0 = &c.nodes[0];
    let (pins, state) = (
        n0.pins.path().to_str().unwrap().to_string(),
        n0.agent.state_dir().to_str().unwrap().to_string(),
    );
    let out = n0
        .node
        .ns
        .exec(
            weft_tests::agent::weft_bin().to_str().unwrap(),
            &["teardown", "--bpffs-dir", &pins, "--state-dir", &state],
        )
        .unwrap();
    println!("{out}");
    let links = n0.node.ns.ip(&["link", "show"]).unwrap();
    assert!(
        !links.contains("weft-v6.1") && !links.contains("weft.1"),
        "{links}"
    );
    let routes = n0
        .node
        .ns
        .ip(&["-6", "route", "show", "proto", "44"])
        .unwrap();
    assert!(routes.trim().is_empty(), "{routes}");
    assert!(
        n0.node
            .ns
            .exec("nft", &["list", "table", "ip6", "weft"])
            .is_err(),
        "table ip6 weft is gone"
    );
}

#[test]
fn an_ipv6_only_cluster() {
    let c = DualCluster::new(3, V6_ONLY, &[]).unwrap();
    c.wait_meshed(T);
    for (key, a) in leases(&c) {
        // flannel's IPv6-only key: an empty IPv4 half.
        assert!(key.starts_with("0.0.0.0-0&fd00:10:244:"), "{key}");
        assert!(a.public_ip.is_unspecified());
        assert!(a.vxlan_data().is_err(), "no IPv4 backend data");
        assert!(a.vxlan_v6_data().is_ok());
    }
    for n in &c.nodes {
        assert_eq!(n.subnets.v4, None);
        let env = std::fs::read_to_string(n.agent.subnet_file()).unwrap();
        assert!(!env.contains("FLANNEL_SUBNET="), "{env}");
        assert!(env.contains("FLANNEL_IPV6_SUBNET="), "{env}");
        assert!(
            n.node.ns.ip(&["link", "show", "weft.1"]).is_err(),
            "no IPv4 overlay device on an IPv6-only node"
        );
        for p in &n.node.pods {
            assert!(p.ip.is_unspecified() && p.ip6.is_some());
        }
    }
    let failed = c.unreachable_pairs();
    assert!(failed.is_empty(), "unreachable: {failed:?}");
    let (a, b) = (&c.nodes[0].node.pods[0], &c.nodes[2].node.pods[0]);
    let (n, intact) = tcp_transfer(&b.ns, b.ip6.unwrap(), 5201, &a.ns, 20 << 20);
    assert!(n == 20 << 20 && intact);
    // A third node's subnet is distinct from the others'.
    let v6: Vec<_> = c.nodes.iter().map(|n| n.subnets.v6.unwrap()).collect();
    assert!(v6[0] != v6[1] && v6[1] != v6[2] && v6[0] != v6[2], "{v6:?}");
}

/// With `--ip-masq` on a dual-stack network, pods reach an IPv6 host
/// outside the cluster's networks as their node (table `ip6 weft`, as
/// flannel's ip6tables rules), and each other as themselves, over both
/// families.
#[test]
fn masquerade_applies_to_ipv6_too() {
    let c = DualCluster::new(2, DUAL, &["--ip-masq"]).unwrap();
    c.wait_meshed(T);
    let out = Netns::new("wo").unwrap();
    out.enable_ipv6().unwrap();
    c.underlay.plug(&out, "eth0", "198.18.0.200").unwrap();
    let outside6: std::net::Ipv6Addr = "fd00:18::c8".parse().unwrap();
    out.add_addr6("eth0", outside6, 64).unwrap();
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let (p1, p2) = (&n1.node.pods[0], &n2.node.pods[0]);
    let table = n1
        .node
        .ns
        .exec("nft", &["list", "table", "ip6", "weft"])
        .unwrap();
    assert!(table.contains("masquerade"), "{table}");

    assert_eq!(
        udp_seen_source6(&out, outside6, 7000, &p1.ns),
        Some(n1.ip6),
        "the outside sees the node's IPv6 address"
    );
    assert_eq!(
        udp_seen_source(&out, "198.18.0.200".parse().unwrap(), 7001, &p1.ns),
        Some(n1.node.ip),
        "and over IPv4 its IPv4 address"
    );
    assert_eq!(
        udp_seen_source6(&p2.ns, p2.ip6.unwrap(), 7002, &p1.ns),
        p1.ip6,
        "a pod on another node sees the pod's own IPv6 address"
    );
    // Untranslated, pod-to-pod IPv6 takes the fast path as IPv4 does: all
    // but a flow's first packets bypass the host stack at both ends. (Its
    // first packets are those before the agent marks the flow liberal in
    // conntrack, a few milliseconds: 50 MiB keeps them under 1 % on a busy
    // machine, as host_routing's flows; 20 MiB measured 1.8 % once, and
    // the agents' probes counted in took 50 MiB to 1.1 % once.)
    let flow = FlowShares::watch(n1, n2, 5204);
    let (n, intact) = tcp_transfer(&p2.ns, p2.ip6.unwrap(), 5204, &p1.ns, 50 << 20);
    assert!(n == 50 << 20 && intact);
    let (tx, rx) = flow.shares();
    println!("IPv6 TCP, --ip-masq: {tx:.4} of the sent packets bypassed, {rx:.4} of the received");
    if !weft_tests::bypasses() {
        assert!(tx == 0.0 && rx == 0.0, "sent {tx:.4}, received {rx:.4}");
    } else {
        assert!(tx >= 0.99 && rx >= 0.99, "sent {tx:.4}, received {rx:.4}");
    }
}
