//! `Backend.DirectRouting`: a peer whose public IP is on our uplink's own
//! subnet gets its pods' packets as they are, without VXLAN, in the eBPF
//! datapath; a peer across a router still gets VXLAN. flannel nodes using
//! DirectRouting interoperate.

use std::{net::Ipv4Addr, time::Duration};

use dataplane_common::Reason;
use ipnet::Ipv4Net;
use weft::dataplane::Counters;
use weft_tests::{
    agent::eventually,
    cluster::{Node, flannel_device, flannel_peer, ping},
    traffic::{capture_count, tcp_transfer},
    weft_cluster::{PREFIX, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
const CONFIG: &str =
    r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true}}"#;
/// The second underlay segment, behind the underlay namespace as router.
const ROUTER_1: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 254);

fn packets(n: &WeftNode, r: Reason) -> u64 {
    Counters::open(n.pins.pins())
        .unwrap()
        .get(r)
        .unwrap()
        .packets
}

/// Each peer's path as `weft status --json` shows it.
fn paths(n: &WeftNode) -> Vec<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_str(&n.weft(&["status", "--json"]).unwrap()).unwrap();
    v["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["subnet"].as_str().unwrap().to_string(),
                p["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn same_segment_peers_are_reached_without_vxlan() {
    let mut c = WeftCluster::with_config(0, CONFIG, &[]).unwrap();
    c.underlay
        .add_segment("br1", &ROUTER_1.to_string())
        .unwrap();
    let to_segment_1 = |n: &Node| {
        n.ns.ip(&["route", "add", "198.18.1.0/24", "via", "198.18.0.254"])
            .unwrap();
    };

    // A flannel node on the first segment, using DirectRouting, with its
    // lease in etcd before the Weft nodes come.
    let flannel_subnet: Ipv4Net = "10.244.200.0/24".parse().unwrap();
    let mut flannel = Node::new(&c.underlay, 4).unwrap();
    to_segment_1(&flannel);
    let flannel_mac = flannel_device(&flannel, flannel_subnet).unwrap();
    flannel.use_subnet(flannel_subnet, 1450);
    flannel.add_pod().unwrap();
    c.etcd
        .etcdctl(&[
            "put",
            &format!("{PREFIX}/subnets/10.244.200.0-24"),
            &format!(
                r#"{{"PublicIP":"198.18.0.4","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{flannel_mac}"}}}}"#
            ),
        ])
        .unwrap();

    // Weft nodes 1 and 2 on the first segment, 3 on the second.
    for i in 1..=2 {
        let node = Node::new(&c.underlay, i).unwrap();
        to_segment_1(&node);
        c.start_node_on(node, &[]).unwrap();
    }
    let node = Node::on_segment(
        &c.underlay,
        "br1",
        3,
        Ipv4Addr::new(198, 18, 1, 3),
        ROUTER_1,
    )
    .unwrap();
    c.start_node_on(node, &[]).unwrap();
    for n in c.nodes.iter_mut() {
        n.use_cni();
        n.node.add_pod().unwrap();
    }

    // flannel's routes: straight to the Weft nodes of its segment, VXLAN
    // to the one behind the router.
    for n in &c.nodes[..2] {
        flannel
            .ns
            .ip(&[
                "route",
                "replace",
                &n.subnet.to_string(),
                "via",
                &n.node.ip.to_string(),
                "dev",
                "eth0",
            ])
            .unwrap();
    }
    let n3 = &c.nodes[2];
    flannel_peer(&flannel, n3.subnet, n3.node.ip, n3.vtep_mac()).unwrap();

    eventually("every peer programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 3)
            .then_some(())
    });
    let (n1, n2, n3) = (&c.nodes[0], &c.nodes[1], &c.nodes[2]);

    // Which peers are direct: those on the node's own segment.
    let mut want = vec![
        (n2.subnet.to_string(), "direct".to_string()),
        (n3.subnet.to_string(), "vxlan".to_string()),
        (flannel_subnet.to_string(), "direct".to_string()),
    ];
    want.sort();
    let mut have = paths(n1);
    have.sort();
    assert_eq!(have, want);
    assert!(
        paths(n3).iter().all(|(_, p)| p == "vxlan"),
        "{:?}",
        paths(n3)
    );
    assert_eq!(n1.metric("weft_direct_peers"), 2.0);
    let route = n1
        .node
        .ns
        .ip(&["route", "show", &n2.subnet.to_string()])
        .unwrap();
    assert!(route.contains("via 198.18.0.2 dev eth0"), "{route}");

    // Node 1 to node 2: no VXLAN on the wire, the pods' own packets are.
    let (p1, p2, p3) = (&n1.node.pods[0], &n2.node.pods[0], &n3.node.pods[0]);
    let direct_before = packets(n1, Reason::DirectTx);
    // Node 3 (behind the router) reaches node 2 by VXLAN, its peer health
    // probes included: only VXLAN between nodes 1 and 2 counts here.
    let vxlan_1_2 = format!("udp port 8472 and host {}", n1.node.ip);
    let vxlan = capture_count(&n2.node.ns, "eth0", &vxlan_1_2, || {
        let (got, ok) = tcp_transfer(&p2.ns, p2.ip, 5201, &p1.ns, 20 << 20);
        assert!(got == 20 << 20 && ok, "TCP node 1 -> node 2");
        assert!(ping(&p2.ns, p1.ip, 3));
    });
    assert_eq!(vxlan, 0, "no VXLAN between nodes of one segment");
    let plain = capture_count(
        &n2.node.ns,
        "eth0",
        &format!("host {} and host {}", p1.ip, p2.ip),
        || {
            assert!(ping(&p1.ns, p2.ip, 3));
        },
    );
    assert!(plain >= 6, "the pods' packets cross as they are: {plain}");
    assert!(
        packets(n1, Reason::DirectTx) > direct_before + 100,
        "the flow left node 1 through the eBPF direct path"
    );
    assert!(
        packets(n2, Reason::DirectRx) > 100,
        "and entered node 2's pod through it"
    );

    // Node 1 to node 3, across the router: VXLAN.
    let vxlan = capture_count(&n3.node.ns, "eth0", "udp port 8472", || {
        assert!(ping(&p1.ns, p3.ip, 3));
        assert!(ping(&p3.ns, p1.ip, 3));
    });
    assert!(vxlan >= 12, "VXLAN across segments: {vxlan}");

    // The flannel node: direct both ways with node 1, VXLAN with node 3.
    let fp = &flannel.pods[0];
    let vxlan_1_flannel = format!("udp port 8472 and host {}", n1.node.ip);
    let vxlan = capture_count(&flannel.ns, "eth0", &vxlan_1_flannel, || {
        assert!(ping(&p1.ns, fp.ip, 3), "weft pod -> flannel pod");
        assert!(ping(&fp.ns, p1.ip, 3), "flannel pod -> weft pod");
        let (got, ok) = tcp_transfer(&fp.ns, fp.ip, 5202, &p1.ns, 10 << 20);
        assert!(got == 10 << 20 && ok, "TCP weft -> flannel");
    });
    assert_eq!(vxlan, 0, "direct with a flannel node of the same segment");
    assert!(ping(&p3.ns, fp.ip, 3), "node 3 pod -> flannel pod (VXLAN)");
    assert!(ping(&fp.ns, p3.ip, 3), "flannel pod -> node 3 pod (VXLAN)");
}
