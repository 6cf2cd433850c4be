//! flannel's `--ip-masq` and `--iptables-forward-rules`: pods reach the
//! world outside the cluster network as their node, reach each other as
//! themselves, and keep working where the host's FORWARD policy is DROP.

use std::{net::Ipv4Addr, time::Duration};

use weft_tests::{
    agent::eventually,
    cluster::{Node, ping},
    netns::Netns,
    traffic::{ping_outcome, ping_run, udp_seen_source},
    weft_cluster::{WeftCluster, WeftNode, http_get},
};

const T: Duration = Duration::from_secs(30);
/// An address outside the cluster network, on the underlay.
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 200);

/// A namespace on the underlay at [`OUTSIDE`] that knows no route to the
/// pods: only a masqueraded packet can be answered.
fn outside(c: &WeftCluster) -> Netns {
    let ns = Netns::new("wo").unwrap();
    c.underlay.plug(&ns, "eth0", &OUTSIDE.to_string()).unwrap();
    ns
}

fn peers_programmed(c: &WeftCluster) {
    c.wait_meshed(T);
}

fn forward_rules(n: &WeftNode) -> usize {
    n.node
        .ns
        .exec("iptables", &["-S", "FORWARD"])
        .unwrap()
        .lines()
        .filter(|l| l.contains("weft: forward pod traffic"))
        .count()
}

/// With `--ip-masq`, a pod's datagram to the outside arrives from its
/// node's address and is answered; one to a pod on another node keeps the
/// pod's address. subnet.env says FLANNEL_IPMASQ=true. A SIGKILL and
/// restart of the agent loses no packet of a flow to the outside (the
/// rules stay, and are replaced in one transaction), and teardown removes
/// them.
#[test]
fn pods_reach_the_outside_as_their_node_and_each_other_as_themselves() {
    let mut c = WeftCluster::new(2, &["--ip-masq"]).unwrap();
    peers_programmed(&c);
    let out = outside(&c);
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let (pod1, pod2) = (&n1.node.pods[0], &n2.node.pods[0]);
    let env = std::fs::read_to_string(n1.agent.subnet_file()).unwrap();
    assert!(env.contains("FLANNEL_IPMASQ=true\n"), "{env}");

    assert_eq!(
        udp_seen_source(&out, OUTSIDE, 7000, &pod1.ns),
        Some(n1.node.ip),
        "the outside sees the node's address (and its answer comes back)"
    );
    assert_eq!(
        udp_seen_source(&pod2.ns, pod2.ip, 7001, &pod1.ns),
        Some(pod1.ip),
        "a pod on another node sees the pod's own address"
    );
    // Routed to node 1 for its pods, as an outside router would be.
    out.ip(&[
        "route",
        "add",
        &n1.subnet.to_string(),
        "via",
        &n1.node.ip.to_string(),
    ])
    .unwrap();
    assert_eq!(
        udp_seen_source(&pod1.ns, pod1.ip, 7002, &out),
        Some(OUTSIDE),
        "traffic from outside to a pod keeps its source"
    );

    // A flow to the outside across a SIGKILL and restart.
    let pinger = ping_run(&pod1.ns, OUTSIDE, 400);
    std::thread::sleep(Duration::from_millis(1000));
    c.nodes[0].agent.restart().unwrap();
    let n1 = &c.nodes[0];
    eventually("the restarted agent is ready", T, || {
        http_get(&n1.node.ns, n1.node.ip, 9090, "/readyz")
            .ok()
            .filter(|(s, _)| s.contains("200"))
    });
    assert_eq!(
        ping_outcome(pinger),
        (400, 400),
        "no packet lost across the restart"
    );
    let n1 = &c.nodes[0];
    assert_eq!(
        udp_seen_source(&out, OUTSIDE, 7003, &n1.node.pods[0].ns),
        Some(n1.node.ip)
    );

    let nft = n1
        .node
        .ns
        .exec("nft", &["list", "table", "ip", "weft"])
        .unwrap();
    assert!(nft.contains("masquerade fully-random"), "{nft}");
    // Stopped first: a running agent puts back what is removed.
    c.nodes[0].agent.stop().unwrap();
    let n1 = &c.nodes[0];
    let removed = n1.weft(&["teardown"]).unwrap();
    assert!(removed.contains("nftables table ip weft"), "{removed}");
    assert!(
        n1.node
            .ns
            .exec("nft", &["list", "table", "ip", "weft"])
            .is_err(),
        "teardown removed the table"
    );
}

/// `--ip-masq-fully-random-disable` masquerades with random ports (not
/// fully random); without `--ip-masq` nothing is masqueraded: the outside
/// cannot answer a pod.
#[test]
fn masquerade_flags_are_honoured() {
    let c = WeftCluster::new(2, &["--ip-masq", "--ip-masq-fully-random-disable"]).unwrap();
    peers_programmed(&c);
    let out = outside(&c);
    let n1 = &c.nodes[0];
    let nft = n1
        .node
        .ns
        .exec("nft", &["list", "table", "ip", "weft"])
        .unwrap();
    assert!(
        nft.contains("masquerade random") && !nft.contains("fully-random"),
        "{nft}"
    );
    assert_eq!(
        udp_seen_source(&out, OUTSIDE, 7000, &n1.node.pods[0].ns),
        Some(n1.node.ip)
    );
    drop(c);

    let c = WeftCluster::new(1, &[]).unwrap();
    let out = outside(&c);
    let n1 = &c.nodes[0];
    let env = std::fs::read_to_string(n1.agent.subnet_file()).unwrap();
    assert!(env.contains("FLANNEL_IPMASQ=false\n"), "{env}");
    assert_eq!(
        udp_seen_source(&out, OUTSIDE, 7000, &n1.node.pods[0].ns),
        None,
        "without --ip-masq the outside has no way back to a pod"
    );
}

/// With the FORWARD policy DROP (as Docker sets it), set before one agent
/// starts and after the other is running, pods on two nodes still reach
/// each other: Weft's two accept rules are appended to iptables' FORWARD
/// chain (an explicit drop before them still decides; see host_routing.rs). A node started with `--iptables-forward-rules=false` adds none,
/// and its pods are cut off. Teardown removes the rules.
#[test]
fn pods_reach_each_other_when_forward_policy_is_drop() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    let node = Node::new(&c.underlay, 1).unwrap();
    node.ns
        .exec("iptables", &["-P", "FORWARD", "DROP"])
        .unwrap();
    c.start_node_on(node, &[]).unwrap();
    c.add_node(2, &[]).unwrap();
    for n in c.nodes.iter_mut() {
        n.use_cni();
        while n.node.pods.len() < 2 {
            n.node.add_pod().unwrap();
        }
    }
    // Docker starts after the agent on node 2.
    c.nodes[1]
        .node
        .ns
        .exec("iptables", &["-P", "FORWARD", "DROP"])
        .unwrap();
    peers_programmed(&c);
    eventually("forward rules on both nodes", T, || {
        c.nodes.iter().all(|n| forward_rules(n) == 2).then_some(())
    });
    assert!(
        c.nodes[1].metric("weft_repairs_total{what=\"forward_rules\"}") >= 1.0,
        "the FORWARD chain that appeared later was found"
    );
    c.all_pairs_reach().unwrap();

    // A third node told to leave the FORWARD chain alone: dropped.
    let node = Node::new(&c.underlay, 3).unwrap();
    node.ns
        .exec("iptables", &["-P", "FORWARD", "DROP"])
        .unwrap();
    c.start_node_on(node, &["--iptables-forward-rules=false"])
        .unwrap();
    let n3 = c.nodes.last_mut().unwrap();
    n3.use_cni();
    n3.node.add_pod().unwrap();
    peers_programmed(&c);
    let n3 = &c.nodes[2];
    assert_eq!(forward_rules(n3), 0);
    assert!(
        !ping(&n3.node.pods[0].ns, c.nodes[0].node.pods[0].ip, 2),
        "the DROP policy stops forwarded pod traffic without the rules"
    );

    c.nodes[0].agent.stop().unwrap();
    let removed = c.nodes[0].weft(&["teardown"]).unwrap();
    assert!(removed.contains("FORWARD"), "{removed}");
    assert_eq!(forward_rules(&c.nodes[0]), 0);
    assert!(
        c.nodes[0]
            .node
            .ns
            .exec("iptables", &["-S", "FORWARD"])
            .unwrap()
            .starts_with("-P FORWARD DROP"),
        "the chain and its policy are left as they were"
    );
}

/// Another tool writing iptables' FORWARD chain all the while (as
/// kube-proxy does): an agent starts, and Weft's rules removed under it
/// are put back, without a fatal error and without duplicates, because
/// each replacement applies only at the ruleset generation it was computed
/// at and is computed again when another writer came in between.
#[test]
fn forward_rules_hold_while_another_tool_writes_the_chain() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    let node = Node::new(&c.underlay, 1).unwrap();
    node.ns
        .exec("iptables", &["-P", "FORWARD", "DROP"])
        .unwrap();
    let _writer = node
        .ns
        .spawn(
            "sh",
            &[
                "-c",
                "while true; do iptables -I FORWARD -s 10.99.0.1 -j ACCEPT; iptables -D FORWARD -s 10.99.0.1 -j ACCEPT; done",
            ],
        )
        .unwrap();
    c.start_node_on(node, &[]).unwrap();
    let n = &c.nodes[0];
    eventually("Weft's forward rules", T, || {
        (forward_rules(n) == 2).then_some(())
    });
    // Removed under it, again and again, while the other tool writes.
    for _ in 0..5 {
        let _ = n.node.ns.exec(
            "iptables",
            &[
                "-D",
                "FORWARD",
                "-s",
                "10.244.0.0/16",
                "-m",
                "comment",
                "--comment",
                "weft: forward pod traffic",
                "-j",
                "ACCEPT",
            ],
        );
        eventually("put back", T, || (forward_rules(n) == 2).then_some(()));
    }
    assert!(n.agent.running(), "the agent kept running");
    assert!(
        n.metric("weft_repairs_total{what=\"forward_rules\"}") >= 5.0,
        "each removal was repaired"
    );
}
