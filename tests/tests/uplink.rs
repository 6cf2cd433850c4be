//! Choosing the uplink as flannel does: `--iface` (names or addresses, the
//! first that exists), then `--iface-regex` (addresses, then names), then
//! `--iface-can-reach`, then the default route; a clear error listing the
//! interfaces when nothing fits.

use std::time::Duration;

use weft_tests::{
    agent::Agent,
    cluster::Node,
    netns::{Netns, veth},
    weft_cluster::{ETCD_IP, WeftCluster},
};

const T: Duration = Duration::from_secs(20);

/// Runs `weft agent ARGS` (control plane only) on `node` until it says
/// which uplink it chose; returns (uplink, public IP) from its log, or the
/// error it exited with.
fn chosen(node: &Node, args: &[&str]) -> Result<(String, String), String> {
    let mut full: Vec<String> = [
        "--etcd-endpoints",
        &format!("http://{ETCD_IP}:2379"),
        "--node-id",
        "uplink-test",
        "--datapath",
        "none",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    full.extend(args.iter().map(|s| s.to_string()));
    let mut a = Agent::start("uplink", Some(&node.ns), &full).unwrap();
    let deadline = std::time::Instant::now() + T;
    loop {
        let log = a.log();
        if let Some(line) = log.lines().find(|l| l.contains("weft::agent: starting")) {
            let field = |k: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_string()
            };
            let r = (field("uplink"), field("public_ip"));
            a.kill();
            return Ok(r);
        }
        if !a.running() {
            return Err(log);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no choice made:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_uplink_is_chosen_with_flannels_flags_and_precedence() {
    let c = WeftCluster::new(0, &[]).unwrap();
    let node = Node::new(&c.underlay, 1).unwrap();
    // A second interface, eth1 192.168.77.1/24, toward another namespace.
    let other = Netns::new("wx").unwrap();
    veth(&node.ns, "eth1", &other, "eth0").unwrap();
    node.ns
        .ip(&["addr", "add", "192.168.77.1/24", "dev", "eth1"])
        .unwrap();
    node.ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    node.ns
        .ip(&["route", "add", "default", "via", "198.18.0.254"])
        .unwrap();
    let eth0 = || Ok(("eth0".to_string(), "198.18.0.1".to_string()));
    let eth1 = || Ok(("eth1".to_string(), "192.168.77.1".to_string()));

    // Default: the default route's device.
    assert_eq!(chosen(&node, &[]), eth0());
    // --iface: the first that exists, by name or address.
    assert_eq!(
        chosen(&node, &["--iface", "eth9", "--iface", "192.168.77.1"]),
        eth1()
    );
    assert_eq!(chosen(&node, &["--iface", "eth9,eth0"]), eth0());
    // --iface-regex: addresses first, then names.
    assert_eq!(
        chosen(&node, &["--iface-regex", "^192\\.168\\.77\\."]),
        eth1()
    );
    assert_eq!(
        chosen(
            &node,
            &["--iface-regex", "^nothing$", "--iface-regex", "^eth1$"]
        ),
        eth1()
    );
    // --iface-can-reach: the interface of the route toward it.
    assert_eq!(
        chosen(&node, &["--iface-can-reach", "192.168.77.9"]),
        eth1()
    );
    assert_eq!(chosen(&node, &["--iface-can-reach", "203.0.113.1"]), eth0());
    // Precedence: --iface over --iface-regex over --iface-can-reach.
    assert_eq!(
        chosen(
            &node,
            &[
                "--iface",
                "eth0",
                "--iface-regex",
                "eth1",
                "--iface-can-reach",
                "192.168.77.9"
            ]
        ),
        eth0()
    );
    assert_eq!(
        chosen(
            &node,
            &[
                "--iface-regex",
                "^eth0$",
                "--iface-can-reach",
                "192.168.77.9"
            ]
        ),
        eth0()
    );
    // --public-ip still wins for the address.
    assert_eq!(
        chosen(&node, &["--iface", "eth1", "--public-ip", "192.168.77.1"]),
        eth1()
    );

    // Nothing fits: an error that lists what there is.
    for args in [
        &["--iface", "eth9", "--iface", "10.9.9.9"][..],
        &["--iface-regex", "^wlan"][..],
    ] {
        let err = chosen(&node, args).unwrap_err();
        assert!(
            err.contains("eth0 198.18.0.1/24") && err.contains("eth1 192.168.77.1/24"),
            "{args:?}: {err}"
        );
    }
    let err = chosen(&node, &["--iface-regex", "("]).unwrap_err();
    assert!(err.contains("not a valid regular expression"), "{err}");
}
