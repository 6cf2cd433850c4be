//! Everything in etcd is untrusted input: leases that would hijack a route
//! or stop an agent are rejected with a reason, on the eBPF datapath, while
//! honest leases keep working.

use std::time::{Duration, Instant};

use weft_tests::{
    agent::eventually,
    dual::{DUAL, DualCluster},
    weft_cluster::{ETCD_IP, PREFIX, WeftCluster, WeftNode, http_get},
};

const T: Duration = Duration::from_secs(30);

fn lease(ip: &str, mac: &str) -> String {
    format!(
        r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac}"}}}}"#
    )
}

/// Whether Weft routes exactly `prefix` on the node (its protocol, or its
/// device).
fn has_weft_route(n: &WeftNode, prefix: &str) -> bool {
    let routes = n.node.ns.ip(&["route", "show", "exact", prefix]).unwrap();
    routes.contains("proto 44") || routes.contains("weft.1")
}

fn etcd_reachable(n: &WeftNode) -> bool {
    n.node
        .ns
        .command("etcdctl")
        .args([
            "--endpoints",
            &format!("http://{ETCD_IP}:2379"),
            "--command-timeout",
            "3s",
            "endpoint",
            "health",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A table of hostile leases, written one after another into a running
/// 2-node cluster: each is rejected by every agent with its reason; after
/// each, both agents run, both nodes reach etcd, every honest pod pair is
/// reachable, and no route and no map entry exists for the hostile prefix.
/// A node that joins at the end is programmed by both.
#[test]
fn hostile_leases_are_rejected_and_never_stop_the_network() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    c.all_pairs_reach().unwrap();
    let n1_ip = c.nodes[0].node.ip.to_string();
    let n2_subnet = c.nodes[1].subnet;
    let n2_25 = format!("{}-25", n2_subnet.network());
    let good_mac = "02:aa:00:00:00:01";
    // Hostile /24s inside Network that no node holds: a fixed subnet could
    // be one a node drew at random, and writing over an honest lease is a
    // lease loss (tested in lease_loss.rs), not a rejection.
    let free: Vec<String> = c
        .free_subnets(8)
        .iter()
        .map(|s| s.network().to_string())
        .collect();
    let hostile = |i: usize| (format!("{}-24", free[i]), format!("{}/24", free[i]));
    // (key suffix, value, the prefix that must never be routed, reason on
    // node 1, reason on node 2)
    let table: Vec<(String, String, String, &str, &str)> = vec![
        (
            "198.18.0.0-24".into(),
            lease("198.18.0.77", good_mac),
            "198.18.0.0/24".into(),
            "outside_network",
            "outside_network",
        ),
        (
            "0.0.0.0-1".into(),
            lease("198.18.0.77", good_mac),
            "0.0.0.0/1".into(),
            "outside_network",
            "outside_network",
        ),
        (
            "127.0.0.0-8".into(),
            lease("198.18.0.77", good_mac),
            "127.0.0.0/8".into(),
            "outside_network",
            "outside_network",
        ),
        (
            n2_25.clone(),
            lease("198.18.0.77", good_mac),
            n2_25.replace('-', "/"),
            "subnet_len",
            "subnet_len",
        ),
        (
            "10.99.0.0-24".into(),
            lease("198.18.0.77", good_mac),
            "10.99.0.0/24".into(),
            "outside_network",
            "outside_network",
        ),
        (
            hostile(0).0,
            lease("127.0.0.1", good_mac),
            hostile(0).1,
            "public_ip",
            "public_ip",
        ),
        (
            hostile(1).0,
            lease("0.0.0.0", good_mac),
            hostile(1).1,
            "public_ip",
            "public_ip",
        ),
        (
            hostile(2).0,
            lease("224.0.0.5", good_mac),
            hostile(2).1,
            "public_ip",
            "public_ip",
        ),
        (
            hostile(3).0,
            lease(&n1_ip, good_mac),
            hostile(3).1,
            "public_ip_ours",
            "public_ip_taken",
        ),
        (
            hostile(4).0,
            lease("198.18.0.78", "01:00:5e:00:00:01"),
            hostile(4).1,
            "vtep_mac",
            "vtep_mac",
        ),
        (
            "0.0.0.0-0".into(),
            lease("198.18.0.77", good_mac),
            "0.0.0.0/0".into(),
            "outside_network",
            "outside_network",
        ),
    ];
    for (suffix, value, prefix, why1, why2) in &table {
        let key = format!("{PREFIX}/subnets/{suffix}");
        println!("hostile lease {key}: {value}");
        c.etcd.etcdctl(&["put", &key, value]).unwrap();
        for (n, why) in c.nodes.iter().zip([why1, why2]) {
            // Its status report lists the lease as rejected, with why.
            eventually(
                &format!("{} rejects {key} ({why})", n.agent.name),
                T,
                || {
                    n.rejected()
                        .contains(&(key.clone(), why.to_string()))
                        .then_some(())
                },
            );
        }
        for n in c.nodes.iter_mut() {
            assert!(n.agent.running(), "{} stopped after {key}", n.agent.name);
            assert!(etcd_reachable(n), "{} lost etcd after {key}", n.agent.name);
            assert!(
                !has_weft_route(n, prefix),
                "{} routes {prefix}",
                n.agent.name
            );
            assert!(
                !n.peer_subnets().iter().any(|s| s.to_string() == *prefix),
                "{} has {prefix} in its map",
                n.agent.name
            );
            assert_eq!(n.peer_subnets().len(), 1, "only the honest peer");
        }
        // The underlay and etcd are still reached the way they were.
        let via = c.nodes[0].node.ns.ip(&["route", "get", ETCD_IP]).unwrap();
        assert!(via.contains("dev eth0"), "{via}");
        c.all_pairs_reach().unwrap();
    }
    for n in &c.nodes {
        assert!(
            n.series("weft_leases_rejected{reason=\"outside_network\"}")
                .unwrap()
                >= 5.0
        );
    }
    // `weft leases` shows them as rejected.
    let out = c.nodes[0]
        .weft(&[
            "leases",
            "--etcd-endpoints",
            &format!("http://{ETCD_IP}:2379"),
        ])
        .unwrap();
    println!("{out}");
    assert!(out.contains("rejected (outside_network)"), "{out}");
    assert!(out.contains("rejected (vtep_mac)"), "{out}");

    // Three junk values near etcd's 1.5 MiB request limit: together larger
    // than one gRPC response (4 MiB), so a listing must come in smaller
    // pages. Each is skipped as malformed; nothing stops.
    let junk = vec![b'x'; 1400 * 1024];
    for f in &free[5..8] {
        let key = format!("{PREFIX}/subnets/{f}-24");
        let before: Vec<f64> = c
            .nodes
            .iter()
            .map(|n| n.metric("weft_malformed_leases_total"))
            .collect();
        c.etcd.put_large(&key, &junk).unwrap();
        for (n, before) in c.nodes.iter().zip(before) {
            eventually(&format!("{} skips {key}", n.agent.name), T, || {
                (n.metric("weft_malformed_leases_total") > before).then_some(())
            });
        }
    }
    for n in c.nodes.iter_mut() {
        assert!(n.agent.running(), "{} stopped after the junk", n.agent.name);
    }
    let out = c.nodes[0]
        .weft(&[
            "leases",
            "--etcd-endpoints",
            &format!("http://{ETCD_IP}:2379"),
        ])
        .unwrap();
    assert!(out.contains(&free[7]), "{out}");

    // A node that joins afterwards (listing the prefix, junk and all, to
    // acquire) is programmed by both.
    c.add_node(3, &[]).unwrap();
    let s3 = c.nodes[2].subnet;
    eventually("both program the new node", T, || {
        c.nodes[..2]
            .iter()
            .all(|n| n.peer_subnets().contains(&s3))
            .then_some(())
    });
    // The new node's own listing (paged through the junk) programs the
    // other two: a ping before that has no way back.
    c.wait_meshed(T);
    c.all_pairs_reach().unwrap();
}

/// A key no config of the network could have handed out (the IPv4 network
/// itself, a key covering the whole IPv6 network) takes no subnet: nodes
/// still acquire, at once, in a dual-stack network and in an IPv6-only one
/// of 2^32 subnets (which a scan of every subnet would take minutes over).
#[test]
fn keys_covering_the_network_do_not_freeze_acquisition() {
    for (config, keys) in [
        (
            DUAL,
            vec!["10.244.0.0-16", "10.244.0.0-16&fd00:10:244::-56"],
        ),
        (
            r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/32","Backend":{"Type":"vxlan"}}"#,
            vec!["0.0.0.0-0&fd00:10::-32"],
        ),
    ] {
        let mut c = DualCluster::new(0, config, &[]).unwrap();
        for k in &keys {
            c.etcd
                .etcdctl(&[
                    "put",
                    &format!("{PREFIX}/subnets/{k}"),
                    r#"{"PublicIP":"198.18.0.99","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:00:00:00:00:99"}}"#,
                ])
                .unwrap();
        }
        let started = Instant::now();
        c.add_node(1, &[]).unwrap();
        let n = &c.nodes[0];
        println!(
            "{config}: {:?} to subnet.env, {}",
            started.elapsed(),
            n.subnets
        );
        let (_, metrics) = http_get(&n.node.ns, n.node.ip, 9090, "/metrics").unwrap();
        let acquire = metrics
            .lines()
            .find_map(|l| l.strip_prefix("weft_lease_acquire_seconds_sum "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("the acquisition's time is exported");
        println!("acquired in {acquire} s");
        assert!(acquire < 1.0, "{config}: {acquire} s");
        assert!(n.subnets.v6.is_some());
    }
}
