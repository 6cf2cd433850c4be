//! What something else removes from a running node (a `systemctl restart
//! networking`, an operator's mistake) comes back by itself within
//! seconds: the overlay device, Weft's routes, the attached programs, the
//! sysctls, Weft's nftables table. Each repair is counted.

use std::time::{Duration, Instant};

use weft_tests::{
    agent::eventually,
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
/// How soon traffic must recover.
const RECOVERY: Duration = Duration::from_secs(5);

fn repairs(n: &WeftNode, what: &str) -> f64 {
    n.metric(&format!("weft_repairs_total{{what=\"{what}\"}}"))
}

/// Breaks node 1 with `break_it`, then waits for a pod on node 1 to reach a
/// pod on node 2 again and for the repair `what` to be counted; returns
/// how long recovery took.
fn recovers(c: &WeftCluster, what: &str, break_it: impl FnOnce(&WeftNode)) -> Duration {
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let before = repairs(n1, what);
    let started = Instant::now();
    break_it(n1);
    let (from, to) = (&n1.node.pods[0].ns, n2.node.pods[0].ip);
    // One probe every 200 ms or so, so the time measured is the repair's.
    while from
        .exec("ping", &["-c", "1", "-W", "0.2", "-q", &to.to_string()])
        .is_err()
    {
        assert!(
            started.elapsed() < RECOVERY,
            "traffic did not recover within {RECOVERY:?} after removing the {what}; log:\n{}",
            n1.agent.log()
        );
    }
    let took = started.elapsed();
    eventually(&format!("the {what} repair counted"), T, || {
        (repairs(n1, what) > before).then_some(())
    });
    println!("{what}: traffic back after {took:?}");
    took
}

#[test]
fn removed_parts_of_the_dataplane_come_back_within_seconds() {
    let c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    c.all_pairs_reach().unwrap();

    let index = |c: &WeftCluster| c.nodes[0].node.ns.ifindex("weft.1");
    let old = index(&c).unwrap();
    recovers(&c, "device", |n| {
        // (A heal already under way may put it back within milliseconds:
        // that it is a new device is checked below.)
        n.node.ns.ip(&["link", "del", "weft.1"]).unwrap();
    });
    assert_ne!(index(&c).unwrap(), old, "weft.1 was removed and made again");
    recovers(&c, "routes", |n| {
        n.node.ns.ip(&["route", "flush", "proto", "44"]).unwrap();
    });
    recovers(&c, "programs", |n| {
        // Unpinning the links detaches the programs (nothing else holds
        // them); no rtnetlink event says so.
        for e in std::fs::read_dir(n.pins.path().join("links")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let tc = n
            .node
            .ns
            .exec("bpftool", &["net", "show", "dev", "weft.1"])
            .unwrap();
        assert!(!tc.contains("weft_encap"), "detached: {tc}");
    });
    recovers(&c, "sysctls", |n| {
        n.node.ns.sysctl("net.ipv4.ip_forward", "0").unwrap();
    });
    recovers(&c, "address", |n| {
        n.node.ns.ip(&["addr", "flush", "dev", "weft.1"]).unwrap();
    });

    // Weft's nftables table (host routing's conntrack tracking) too.
    let n1 = &c.nodes[0];
    let before = repairs(n1, "nftables");
    n1.node
        .ns
        .exec("nft", &["delete", "table", "ip", "weft"])
        .unwrap();
    eventually("the table is back", RECOVERY, || {
        n1.node
            .ns
            .exec("nft", &["list", "table", "ip", "weft"])
            .ok()
            .filter(|t| t.contains("chain track"))
    });
    assert!(repairs(n1, "nftables") > before);

    // Nothing was lost or duplicated along the way.
    c.all_pairs_reach().unwrap();
    let status = n1.weft(&["status"]).unwrap();
    assert!(status.contains("weft_encap"), "{status}");
    assert_eq!(n1.peer_subnets(), vec![c.nodes[1].subnet]);
    let routes = n1.node.ns.ip(&["route", "show", "proto", "44"]).unwrap();
    assert_eq!(routes.lines().count(), 1, "{routes}");
    assert!(n1.agent.running());
}
