//! The overlay MTU: the uplink's less 50, following the uplink's changes,
//! or `Backend.MTU` less 50 when the network config sets it (flannel's
//! meaning: the underlay MTU).

use std::time::Duration;

use weft_tests::{
    agent::eventually,
    cluster::ping,
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

fn device_mtu(n: &WeftNode) -> u32 {
    let out = n.node.ns.ip(&["-j", "link", "show", "weft.1"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["mtu"].as_u64().unwrap() as u32
}

fn env_mtu(n: &WeftNode) -> u32 {
    let env = std::fs::read_to_string(n.agent.subnet_file()).unwrap();
    env.lines()
        .find_map(|l| l.strip_prefix("FLANNEL_MTU="))
        .unwrap()
        .parse()
        .unwrap()
}

/// The uplink's MTU goes from 1500 to 1400 and back: within seconds the
/// overlay device and subnet.env say 1350, then 1450 again; a full-size
/// packet for the new overlay MTU crosses.
#[test]
fn the_overlay_mtu_follows_the_uplink() {
    let c = WeftCluster::new(2, &[]).unwrap();
    let n1 = &c.nodes[0];
    assert_eq!((device_mtu(n1), env_mtu(n1)), (1450, 1450));
    for n in &c.nodes {
        n.node
            .ns
            .ip(&["link", "set", "eth0", "mtu", "1400"])
            .unwrap();
    }
    eventually(
        "the overlay follows to 1350",
        Duration::from_secs(5),
        || (device_mtu(n1) == 1350 && env_mtu(n1) == 1350).then_some(()),
    );
    let status = n1.weft(&["status", "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["agent"]["mtu"], 1350, "{status}");
    // A 1350-byte packet (1322 bytes of ICMP payload) fits, encapsulated, in 1400.
    let dst = c.nodes[1].node.pods[0].ip.to_string();
    eventually("peers programmed", T, || {
        (n1.peer_subnets().len() == 1).then_some(())
    });
    n1.node.pods[0]
        .ns
        .ip(&["link", "set", "eth0", "mtu", "1350"])
        .unwrap();
    n1.node.pods[0]
        .ns
        .exec(
            "ping",
            &["-c", "2", "-W", "2", "-M", "do", "-s", "1322", &dst],
        )
        .unwrap();
    for n in &c.nodes {
        n.node
            .ns
            .ip(&["link", "set", "eth0", "mtu", "1500"])
            .unwrap();
    }
    eventually(
        "the overlay follows back to 1450",
        Duration::from_secs(5),
        || (device_mtu(n1) == 1450 && env_mtu(n1) == 1450).then_some(()),
    );
    assert!(ping(&n1.node.pods[0].ns, c.nodes[1].node.pods[0].ip, 2));
}

/// `Backend.MTU` 1400 on a 1500 uplink: the overlay is 1350, and stays
/// there when the uplink's MTU changes.
#[test]
fn backend_mtu_is_the_underlay_mtu() {
    let cfg = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","MTU":1400}}"#;
    let c = WeftCluster::with_config(1, cfg, &[]).unwrap();
    let n1 = &c.nodes[0];
    assert_eq!((device_mtu(n1), env_mtu(n1)), (1350, 1350));
    n1.node
        .ns
        .ip(&["link", "set", "eth0", "mtu", "1450"])
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!((device_mtu(n1), env_mtu(n1)), (1350, 1350));
    assert!(
        !n1.agent.log().contains("ignoring"),
        "Backend.MTU is not reported as ignored"
    );
}
