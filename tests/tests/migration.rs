//! Moving a running node from flannel to Weft in place, and back, as
//! `docs/migrating-from-flannel.md` tells an operator to: the node keeps
//! its subnet, its running pods keep their addresses, a ping between a pod
//! on it and a pod elsewhere loses at most a handful of packets each way,
//! and a pod created after the move gets an address no running pod holds.

use std::{net::Ipv4Addr, time::Duration};

use ipnet::Ipv4Net;
use serde_json::json;
use weft_tests::{
    agent::{Agent, eventually},
    cluster::{Node, ping},
    cni::ConfList,
    pins::TestPins,
    traffic::{ping_outcome, ping_run},
    weft_cluster::{ETCD_IP, PREFIX, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
/// "A handful": packets a ping (one every 10 ms) may lose while a node
/// changes hands.
const HANDFUL: u32 = 10;

/// Pings from `from` to `to` every 10 ms (1500 of them), from 2 s before
/// what follows.
fn start_pinging(from: &weft_tests::netns::Netns, to: Ipv4Addr) -> std::process::Child {
    let pinger = ping_run(from, to, 1500);
    std::thread::sleep(Duration::from_secs(2));
    pinger
}

/// The packets the ping lost.
fn packets_lost(pinger: std::process::Child) -> u32 {
    let (sent, received) = ping_outcome(pinger);
    assert_eq!(sent, 1500);
    sent - received
}

#[test]
fn a_flannel_node_moves_to_weft_and_back() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    for n in &mut c.nodes {
        n.use_cni();
        n.node.add_pod().unwrap();
    }

    // Node 3 runs flannel: its device, lease, routes, and two pods attached
    // as flannel's plugin attaches them (bridge + host-local, network cbr0).
    let subnet: Ipv4Net = c.free_subnets(1)[0];
    let mut f = Node::new(&c.underlay, 3).unwrap();
    c.flannel_up(&f, subnet);
    f.use_subnet(subnet, 1450);
    f.add_pod().unwrap();
    f.add_pod().unwrap();
    let pods_before: Vec<Ipv4Addr> = f.pods.iter().map(|p| p.ip).collect();
    eventually("the Weft nodes program the flannel node", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().contains(&subnet))
            .then_some(())
    });
    let far = c.nodes[0].node.pods[0].ip;
    assert!(ping(&f.pods[0].ns, far, 5), "flannel pod -> Weft pod");

    // Migration: flanneld stopped (its device and routes stay), Weft
    // started with the same etcd, uplink and subnet file.
    let pins = TestPins::new();
    let args: Vec<String> = [
        "--etcd-endpoints",
        &format!("http://{ETCD_IP}:2379"),
        "--node-id",
        "node-3",
        "--bpffs-dir",
        pins.path().to_str().unwrap(),
        "--healthz-port",
        "9090",
        "--cni-ipam-dir",
        f.ipam_dir.to_str().unwrap(),
        "--cni-cache-dir",
        f.cni_cache_dir.to_str().unwrap(),
        "--iface",
        "eth0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let pinger = start_pinging(&f.pods[0].ns, far);
    let agent = Agent::start_seeded(
        "node3",
        Some(&f.ns),
        &args,
        Some(&format!(
            "{}/24",
            Ipv4Addr::from(u32::from(subnet.network()) + 1)
        )),
    )
    .unwrap();
    // Up once its status report names the subnet (written after
    // subnet.env, which the agent writes once its dataplane is up).
    eventually("Weft is up on the flannel node", T, || {
        let text = std::fs::read_to_string(agent.state_dir().join("status.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["subnet"].as_str().map(str::to_string)
    });
    // Weft is up: flannel's device goes.
    f.ns.ip(&["link", "del", "flannel.1"]).unwrap();
    let lost = packets_lost(pinger);
    println!("flannel -> Weft: {lost} of 1500 pings lost");
    assert!(lost <= HANDFUL, "flannel -> Weft lost {lost} packets");
    let env = std::fs::read_to_string(agent.subnet_file()).unwrap();
    assert!(
        env.contains("FLANNEL_SUBNET=10.244.200.1/24"),
        "the subnet is kept: {env}"
    );
    let lease = c
        .etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("{PREFIX}/subnets/10.244.200.0-24"),
        ])
        .unwrap();
    assert!(
        lease.contains("\"WeftNodeID\":\"node-3\""),
        "Weft holds the lease: {lease}"
    );
    assert_eq!(
        f.pods.iter().map(|p| p.ip).collect::<Vec<_>>(),
        pods_before,
        "running pods keep their addresses"
    );
    let routes = f.ns.ip(&["route", "show", "proto", "44"]).unwrap();
    for n in &c.nodes {
        assert!(
            routes.contains(&n.subnet.to_string()),
            "Weft's route to {}: {routes}",
            n.subnet
        );
    }

    // A new pod, through Weft's plugin standalone under flannel's network
    // name: host-local goes on from flannel's allocations.
    f.cni = Some(ConfList {
        name: "cbr0".into(),
        cni_version: "1.0.0".into(),
        plugins: vec![json!({
            "type": "weft",
            "subnetFile": agent.subnet_file(),
            "stateDir": agent.state_dir(),
            "dataDir": f.ipam_dir,
        })],
        path: vec![
            weft_tests::agent::weft_bin()
                .parent()
                .unwrap()
                .to_path_buf(),
            weft_tests::cni::SYSTEM_PLUGINS.into(),
        ],
    });
    let new_ip = f.add_pod().unwrap().ip;
    assert!(
        subnet.contains(&new_ip) && !pods_before.contains(&new_ip),
        "new pod {new_ip}"
    );
    let mut f = WeftNode {
        node: f,
        agent,
        pins,
        subnet,
        acquired_at: std::time::Instant::now(),
    };
    eventually("every pod reaches every other", T, || {
        let all: Vec<(&weft_tests::netns::Netns, Ipv4Addr)> = c
            .nodes
            .iter()
            .chain(std::iter::once(&f))
            .flat_map(|n| n.node.pods.iter().map(|p| (&p.ns, p.ip)))
            .collect();
        all.iter()
            .all(|(ns, _)| all.iter().all(|(_, ip)| ping(ns, *ip, 1)))
            .then_some(())
    });

    // Rollback: Weft stopped (its datapath stays), flanneld started again
    // (its device, lease and routes), then `weft teardown`.
    let pinger = start_pinging(&f.node.pods[0].ns, far);
    f.agent.stop().unwrap();
    c.flannel_up(&f.node, subnet);
    f.weft(&["teardown"]).unwrap();
    let lost = packets_lost(pinger);
    println!("Weft -> flannel: {lost} of 1500 pings lost");
    assert!(lost <= HANDFUL, "Weft -> flannel lost {lost} packets");
    assert!(
        f.node.ns.ip(&["link", "show", "weft.1"]).is_err(),
        "weft.1 is gone"
    );
    let routes = f
        .node
        .ns
        .ip(&["route", "show", "dev", "flannel.1"])
        .unwrap();
    for n in &c.nodes {
        assert!(
            routes.contains(&n.subnet.to_string()),
            "flannel's route to {}: {routes}",
            n.subnet
        );
    }
    for p in &f.node.pods {
        assert!(
            ping(&p.ns, far, 5),
            "{} reaches {far} through flannel",
            p.ip
        );
    }
}
