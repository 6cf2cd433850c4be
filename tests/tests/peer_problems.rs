//! Peers that cannot be programmed are per-peer problems: skipped, counted,
//! reported, retried; never fatal, never at the expense of a route Weft does
//! not own.

use std::time::Duration;

use weft_tests::{
    agent::eventually,
    cluster::ping,
    weft_cluster::{PREFIX, WeftCluster},
};

const T: Duration = Duration::from_secs(30);

/// `--max-peers 2` on node 1 with three peers: two are programmed, one is
/// skipped and reported; traffic to the two flows; when one of them leaves,
/// the skipped one gets its place.
#[test]
fn a_full_peer_map_skips_counts_reports_and_recovers() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    c.add_node(1, &["--max-peers", "2"]).unwrap();
    for i in 2..=4 {
        c.add_node(i, &[]).unwrap();
    }
    let n1 = &c.nodes[0];
    eventually("node 1 programs two peers and reports the third", T, || {
        (n1.peer_subnets().len() == 2
            && n1.series("weft_peer_problems{problem=\"map_full\"}") == Some(1.0))
        .then_some(())
    });
    let status = n1.weft(&["status"]).unwrap();
    println!("{status}");
    assert!(status.contains("Peers (2 of 2)"), "{status}");
    assert!(status.contains("map_full"), "{status}");
    assert!(n1.agent.log().contains("raise --max-peers"));
    assert!(n1.agent.running());
    let programmed = n1.peer_subnets();
    let skipped = c.nodes[1..]
        .iter()
        .find(|n| !programmed.contains(&n.subnet))
        .unwrap()
        .subnet;
    for n in &c.nodes[1..] {
        let reach = ping(&c.nodes[0].node.pods[0].ns, n.node.pods[0].ip, 1);
        assert_eq!(reach, programmed.contains(&n.subnet), "{}", n.subnet);
    }
    // A programmed peer leaves: the skipped one takes its place.
    let leaving = c.nodes[1..]
        .iter()
        .position(|n| programmed.contains(&n.subnet))
        .unwrap()
        + 1;
    let key = c.nodes[leaving].lease_key();
    c.nodes[leaving].agent.kill();
    c.etcd.etcdctl(&["del", &key]).unwrap();
    let n1 = &c.nodes[0];
    eventually("the skipped peer is programmed", T, || {
        n1.peer_subnets().contains(&skipped).then_some(())
    });
    eventually("no problem left", T, || {
        (n1.series("weft_peer_problems{problem=\"map_full\"}") == Some(0.0)).then_some(())
    });
    let dst = c
        .nodes
        .iter()
        .find(|n| n.subnet == skipped)
        .unwrap()
        .node
        .pods[0]
        .ip;
    assert!(ping(&c.nodes[0].node.pods[0].ns, dst, 2));
}

/// An operator's route to the subnet a lease names is never replaced: the
/// peer is reported (status, metrics) and retried; when the operator's
/// route goes, Weft's takes its place and traffic flows.
#[test]
fn a_route_weft_does_not_own_is_left_alone_and_retried() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    c.add_node(1, &[]).unwrap();
    // Node 2's subnet is fixed by a reservation, and node 1 has a route of
    // its own to it before node 2 shows up.
    let subnet = c.free_subnets(1)[0];
    let reserved = &subnet.to_string();
    c.etcd
        .etcdctl(&[
            "put",
            &format!("{PREFIX}/subnets/{}", weft::lease::to_key(&subnet)),
            r#"{"PublicIP":"198.18.0.2"}"#,
        ])
        .unwrap();
    let n1ns = &c.nodes[0].node.ns;
    n1ns.ip(&["route", "add", reserved, "dev", "eth0", "proto", "static"])
        .unwrap();
    c.add_node(2, &[]).unwrap();
    assert_eq!(c.nodes[1].subnet.to_string(), *reserved);
    let n1 = &c.nodes[0];
    eventually("node 1 reports the route conflict", T, || {
        (n1.series("weft_peer_problems{problem=\"route\"}") == Some(1.0)).then_some(())
    });
    assert!(n1.peer_subnets().contains(&c.nodes[1].subnet), "in the map");
    let route = n1
        .node
        .ns
        .ip(&["route", "show", "exact", reserved])
        .unwrap();
    assert!(
        route.contains("dev eth0") && route.contains("proto static"),
        "the operator's route is untouched: {route}"
    );
    let status = n1.weft(&["status"]).unwrap();
    println!("{status}");
    assert!(
        status.contains("that Weft does not own exists (dev eth0"),
        "{status}"
    );
    assert!(n1.agent.running());

    // The operator removes their route: Weft's replaces it, retried.
    n1.node
        .ns
        .ip(&["route", "del", reserved, "dev", "eth0", "proto", "static"])
        .unwrap();
    eventually("Weft installs its route", T, || {
        let r = n1.node.ns.ip(&["route", "show", "exact", reserved]).ok()?;
        r.contains("dev weft.1").then_some(())
    });
    // The problem is cleared once the retry that installed the route has
    // been booked, a moment after the route shows.
    eventually("the route problem is cleared", T, || {
        (n1.series("weft_peer_problems{problem=\"route\"}") == Some(0.0)).then_some(())
    });
    assert!(ping(&n1.node.pods[0].ns, c.nodes[1].node.pods[0].ip, 2));
}
