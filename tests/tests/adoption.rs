//! Pods Weft's plugin did not attach (flannel's plugin, or `bridge` +
//! `host-local` configured like it, with no `weft` line: a node just moved
//! from flannel whose pods keep running) are adopted from the runtime's
//! CNI result cache: their flows take the fast path without recreating
//! them, and a pod deleted afterwards leaves no entry.

use std::{net::Ipv4Addr, time::Duration};

use dataplane_common::Reason;
use weft::dataplane::{Counters, EndpointMap};
use weft_tests::{
    agent::eventually,
    cluster::ping,
    netns::Netns,
    weft_cluster::{WeftCluster, WeftNode},
};

fn t() -> Duration {
    weft_tests::scaled(Duration::from_secs(30))
}

fn endpoints(n: &WeftNode) -> Vec<Ipv4Addr> {
    EndpointMap::open(n.pins.pins())
        .unwrap()
        .all()
        .unwrap()
        .into_keys()
        .filter_map(|ip| match ip {
            std::net::IpAddr::V4(a) => Some(a),
            std::net::IpAddr::V6(_) => None,
        })
        .collect()
}

fn count(n: &WeftNode, r: Reason) -> u64 {
    Counters::open(n.pins.pins())
        .unwrap()
        .get(r)
        .unwrap()
        .packets
}

/// Bytes an iperf3 flow from `client` to `server_ip` moved in `secs`.
fn iperf(client: &Netns, server: &Netns, server_ip: Ipv4Addr, secs: u32) -> f64 {
    let _srv = server.spawn("iperf3", &["-s", "-1", "-p", "5201"]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (ip, t) = (server_ip.to_string(), secs.to_string());
    let out = client
        .command("iperf3")
        .args(["-c", &ip, "-p", "5201", "-t", &t, "-J"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0)
}

#[test]
fn pods_attached_without_weft_are_adopted_for_the_fast_path() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    for i in 1..=2 {
        c.start_node(i, &[]).unwrap();
    }
    // Pods attached as flannel's plugin attaches them: bridge cni0 +
    // host-local, no `weft` line; the runtime keeps their results in its
    // cache. Then the agents start (again) and find them there.
    for n in c.nodes.iter_mut() {
        let subnet = n.subnet;
        n.node.use_subnet(subnet, 1450);
        for _ in 0..2 {
            n.node.add_pod().unwrap();
        }
        n.agent.restart().unwrap();
    }
    eventually("the pods are adopted", t(), || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 1 && endpoints(n).len() == 2)
            .then_some(())
    });
    for n in &c.nodes {
        assert!(
            !n.agent.state_dir().join("endpoints").exists()
                || std::fs::read_dir(n.agent.state_dir().join("endpoints"))
                    .unwrap()
                    .next()
                    .is_none(),
            "no pod was registered by Weft's plugin"
        );
        // The agent reports after it has programmed the endpoints, so the
        // status line may trail the endpoint map by a moment.
        let mut last = String::new();
        let said = weft_tests::agent::poll(t(), || {
            last = n.weft(&["status"]).unwrap();
            last.contains("adopted: 2 pod attachment(s)").then_some(())
        });
        assert!(said.is_some(), "weft status says so: {last}");
    }

    // Their flows take the fast path where the kernel lets host routing
    // ask conntrack (else every flow takes the host stack, as for pods
    // Weft's plugin attached).
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let before = [
        count(a, Reason::EncapBypass),
        count(a, Reason::Encapsulated),
        count(b, Reason::DecapBypass),
        count(b, Reason::Decapsulated),
    ];
    let bytes = iperf(&a.node.pods[0].ns, &b.node.pods[0].ns, b.node.pods[0].ip, 3);
    let enough = 1e8 / weft_tests::time_scale();
    assert!(bytes > enough, "the flow moved {bytes} bytes");
    let after = [
        count(a, Reason::EncapBypass),
        count(a, Reason::Encapsulated),
        count(b, Reason::DecapBypass),
        count(b, Reason::Decapsulated),
    ];
    let d: Vec<f64> = after
        .iter()
        .zip(before)
        .map(|(x, y)| (x - y) as f64)
        .collect();
    let (tx, rx) = (d[0] / (d[0] + d[1]), d[2] / (d[2] + d[3]));
    println!(
        "fast path: {:.4} of the sent packets, {:.4} of the received",
        tx, rx
    );
    if weft_tests::bypasses() {
        assert!(tx >= 0.99, "sent on the fast path: {tx:.4}");
        assert!(rx >= 0.99, "received on the fast path: {rx:.4}");
    } else {
        assert_eq!(d[0] + d[2], 0.0, "nothing bypasses without the kfuncs");
    }

    // A pod deleted afterwards (CNI DEL by flannel's chain; libcni drops
    // its cache entry) leaves no entry.
    let n2 = &mut c.nodes[1];
    let gone = n2.node.del_pod(1).unwrap();
    let ip = gone.ip;
    drop(gone);
    eventually("the deleted pod's endpoint is removed", t(), || {
        (!endpoints(&c.nodes[1]).contains(&ip)).then_some(())
    });
    assert_eq!(endpoints(&c.nodes[1]).len(), 1);
    let left = c.nodes[1].node.pods[0].ip;
    assert!(
        ping(&c.nodes[0].node.pods[0].ns, left, 3),
        "the remaining pod is reached"
    );
}
