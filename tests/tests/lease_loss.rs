//! A node that loses its lease to another node: the new owner becomes its
//! peer, and it moves to another subnet, not ready while its pods still
//! hold addresses of the old one.

use std::time::Duration;

use ipnet::Ipv4Net;
use weft_tests::{
    agent::eventually,
    cluster::ping,
    weft_cluster::{PREFIX, WeftCluster, http_get},
};

const T: Duration = Duration::from_secs(30);

#[test]
fn a_lost_subnet_taken_by_another_node_is_programmed_and_the_old_pods_hold_readiness() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    c.add_node(1, &["--subnet-lease-ttl", "4"]).unwrap();
    c.add_node(2, &[]).unwrap();
    c.wait_meshed(T);
    let old = c.nodes[0].subnet;
    let old_key = c.nodes[0].lease_key();

    // Node 1 is paused past its TTL; its key expires; an operator reserves
    // that subnet for node 3, which takes it.
    c.nodes[0].agent.pause();
    eventually("node 1's key expires", T, || {
        c.etcd
            .etcdctl(&["get", &old_key, "--print-value-only"])
            .ok()
            .filter(|v| v.trim().is_empty())
    });
    c.etcd
        .etcdctl(&["put", &old_key, r#"{"PublicIP":"198.18.0.3"}"#])
        .unwrap();
    c.add_node(3, &[]).unwrap();
    assert_eq!(c.nodes[2].subnet, old, "node 3 took node 1's old subnet");

    // Node 1 comes back: it notices, moves to another subnet, and programs
    // node 3 as the owner of its old subnet.
    c.nodes[0].agent.resume();
    eventually("node 1 counts its lease lost", T, || {
        (c.nodes[0].metric("weft_lease_lost_total") >= 1.0).then_some(())
    });
    let line = c.nodes[0].agent.wait_subnet_written(2, T).unwrap();
    let new: Ipv4Net = {
        let (ip, len) = line.split_once('/').unwrap();
        Ipv4Net::new(ip.parse().unwrap(), len.parse().unwrap())
            .unwrap()
            .trunc()
    };
    assert_ne!(new, old);
    eventually("node 1 has node 3's subnet in its map", T, || {
        c.nodes[0].peer_subnets().contains(&old).then_some(())
    });
    let n1 = &c.nodes[0];
    // Its two pods still have addresses of the old subnet: not ready.
    let get = |p: &str| http_get(&n1.node.ns, n1.node.ip, 9090, p).unwrap();
    eventually("node 1 reports its pods on the old subnet", T, || {
        get("/metrics")
            .1
            .lines()
            .any(|l| l == "weft_old_subnet_pods 2")
            .then_some(())
    });
    assert!(get("/readyz").0.contains("503"), "not ready");
    let status = n1.weft(&["status"]).unwrap();
    println!("{status}");
    assert!(status.contains("NOT READY"), "{status}");
    assert!(
        status.contains(&format!("2 local pod(s) to leave the old subnet {old}")),
        "{status}"
    );
    // Its old pods' subnet is still on cni0: the route to node 3's subnet
    // would replace that connected route, so Weft leaves it and says why.
    assert!(
        status.contains(&old.to_string()) && status.contains("route"),
        "{status}"
    );
    // Node 2 reaches node 3's pods (the new owner), in place of node 1's.
    let p3 = c.nodes[2].node.pods[0].ip;
    assert!(ping(&c.nodes[1].node.pods[0].ns, p3, 2), "node 2 -> node 3");

    // The operator does what the README says: recreate the pods (CNI DEL,
    // then ADD on the new subnet) and drop the old gateway from cni0.
    let n1 = &mut c.nodes[0];
    n1.node.del_pod(1).unwrap();
    n1.node.del_pod(0).unwrap();
    n1.node.ns.ip(&["addr", "flush", "dev", "cni0"]).unwrap();
    eventually("node 1 is ready again", T, || {
        (http_get(&n1.node.ns, n1.node.ip, 9090, "/readyz")
            .map(|(s, _)| s.contains("200"))
            .unwrap_or(false))
        .then_some(())
    });
    n1.subnet = new;
    n1.use_cni();
    n1.node.add_pod().unwrap();
    let p1 = c.nodes[0].node.pods[0].ip;
    assert!(new.contains(&p1));
    eventually("node 1's pod reaches node 3's pod", T, || {
        ping(&c.nodes[0].node.pods[0].ns, p3, 1).then_some(())
    });
    assert!(ping(&c.nodes[2].node.pods[0].ns, p1, 2), "node 3 -> node 1");
    assert!(ping(&c.nodes[1].node.pods[0].ns, p1, 2), "node 2 -> node 1");
    let leases = c
        .etcd
        .etcdctl(&[
            "get",
            "--prefix",
            &format!("{PREFIX}/subnets/"),
            "--keys-only",
        ])
        .unwrap();
    assert_eq!(leases.lines().filter(|l| !l.is_empty()).count(), 3);
}

/// Acquiring again after a loss runs beside the event loop: a node whose
/// lease is gone while the pool is full goes on following the peers (one
/// leaving, one joining), is not ready, and exits promptly on SIGTERM.
#[test]
fn a_node_acquiring_again_goes_on_serving() {
    // Three subnets: 10.250.1.0/24 to 10.250.3.0/24.
    let config = r#"{"Network":"10.250.0.0/22","Backend":{"Type":"vxlan"}}"#;
    let mut c = WeftCluster::with_config(0, config, &[]).unwrap();
    // The retry after "out of subnets" comes long after this test.
    c.add_node(1, &["--retry-interval", "600"]).unwrap();
    c.add_node(2, &[]).unwrap();
    c.wait_meshed(T);
    let (mine, theirs) = (c.nodes[0].subnet, c.nodes[1].subnet);
    let free = (1..=3u8)
        .map(|i| Ipv4Net::new(std::net::Ipv4Addr::new(10, 250, i, 0), 24).unwrap())
        .find(|s| *s != mine && *s != theirs)
        .unwrap();
    let key = |s: Ipv4Net| format!("{PREFIX}/subnets/{}", weft::lease::to_key(&s));
    // The pool fills (an operator reserves the free subnet), and node 1's
    // subnet is reserved for another machine: node 1 has lost its lease
    // and finds none free.
    c.etcd
        .etcdctl(&["put", &key(free), r#"{"PublicIP":"198.18.0.8"}"#])
        .unwrap();
    c.etcd
        .etcdctl(&["put", &key(mine), r#"{"PublicIP":"198.18.0.9"}"#])
        .unwrap();
    let n1 = &c.nodes[0];
    eventually("node 1 lost its lease and finds the pool full", T, || {
        (n1.metric("weft_lease_held") == 0.0
            && n1.metric("weft_lease_lost_total") >= 1.0
            && n1.metric("weft_out_of_subnets_total") >= 1.0)
            .then_some(())
    });
    let ready = |n: &weft_tests::weft_cluster::WeftNode| {
        http_get(&n.node.ns, n.node.ip, 9090, "/readyz")
            .map(|(s, _)| s.contains("200"))
            .unwrap_or(false)
    };
    assert!(!ready(n1), "not ready without a lease");

    // Node 2 leaves (stopped, its key deleted) and a node joins on its
    // subnet: node 1, still acquiring, follows both.
    c.nodes[1].agent.stop().unwrap();
    c.etcd.etcdctl(&["del", &key(theirs)]).unwrap();
    let n1 = &c.nodes[0];
    let vtep_of = |s: Ipv4Net| {
        weft::dataplane::PeerMaps::open(n1.pins.pins())
            .unwrap()
            .get(&s.into())
            .unwrap()
            .map(|p| p.vtep)
    };
    eventually("node 1 removes the node that left", T, || {
        vtep_of(theirs).is_none().then_some(())
    });
    c.etcd
        .etcdctl(&[
            "put",
            &key(theirs),
            r#"{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:00:00:00:00:07"}}"#,
        ])
        .unwrap();
    eventually("node 1 programs the node that joined", T, || {
        (vtep_of(theirs) == Some("198.18.0.7".parse().unwrap())).then_some(())
    });
    assert_eq!(n1.metric("weft_lease_held"), 0.0, "still acquiring");
    assert!(!ready(n1));

    // SIGTERM while acquiring: out within 5 s.
    let asked = std::time::Instant::now();
    c.nodes[0].agent.signal(libc::SIGTERM);
    eventually("node 1 exits", Duration::from_secs(10), || {
        (!c.nodes[0].agent.running()).then_some(())
    });
    let took = asked.elapsed();
    println!("exited {took:?} after SIGTERM");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
