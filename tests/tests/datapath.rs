//! The eBPF VXLAN datapath in real namespaces: 3 nodes on an underlay
//! bridge, pods on cni0, programs and maps driven through the library API
//! with static peers.

use std::time::Duration;

use dataplane_common::Reason;
use weft::dataplane::{maps::Counters, overlay::DecapMode};
use weft_tests::{
    cluster::{Node, Underlay, ping},
    overlay::{install, peer, pod_ip, spec, subnet_of},
    pins::TestPins,
    require_root,
};

struct Cluster {
    nodes: Vec<Node>,
    pins: Vec<TestPins>,
    _underlay: Underlay,
}

fn cluster(n: u8, decap: DecapMode) -> Cluster {
    require_root();
    let underlay = Underlay::new().unwrap();
    let mut nodes: Vec<Node> = (1..=n).map(|i| Node::new(&underlay, i).unwrap()).collect();
    for node in nodes.iter_mut() {
        let s = subnet_of(node.index);
        node.pods_for(s.addr(), 24, 2, 1450).unwrap();
    }
    let pins: Vec<TestPins> = nodes.iter().map(|_| TestPins::new()).collect();
    for (i, node) in nodes.iter().enumerate() {
        let peers = nodes
            .iter()
            .filter(|o| o.index != node.index)
            .map(|o| peer(o, subnet_of(o.index)))
            .collect();
        let att = install(
            node,
            spec(node, subnet_of(node.index), pins[i].pins(), decap),
            peers,
        )
        .unwrap();
        println!("node {}: {att:?}", node.index);
    }
    Cluster {
        nodes,
        pins,
        _underlay: underlay,
    }
}

#[test]
fn every_pod_reaches_every_other_pod_and_nodes_reach_remote_pods() {
    let c = cluster(3, DecapMode::XdpAuto);
    let all: Vec<_> = c
        .nodes
        .iter()
        .flat_map(|n| n.pods.iter().map(|p| p.ip))
        .collect();
    for node in &c.nodes {
        for pod in &node.pods {
            for dst in &all {
                if *dst != pod.ip {
                    assert!(ping(&pod.ns, *dst, 2), "{} cannot reach {dst}", pod.ip);
                }
            }
        }
    }
    // A node reaches a remote pod (host-originated traffic is encapsulated too).
    assert!(ping(&c.nodes[0].ns, pod_ip(2, 0), 2));
    assert!(ping(&c.nodes[2].ns, pod_ip(1, 1), 2));
    let counters = Counters::open(c.pins[0].pins()).unwrap();
    assert!(counters.get(Reason::Encapsulated).unwrap().packets > 0);
    assert!(counters.get(Reason::Decapsulated).unwrap().packets > 0);
    let _ = Duration::ZERO;
}
