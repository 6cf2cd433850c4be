//! Agents started over pinned maps of another layout: from the previous
//! layout version (an upgrade), of a higher version (a downgrade), or of
//! this version with another shape. Maps that do not fit are replaced and
//! filled again; traffic keeps flowing and nothing crash-loops.

use std::{path::Path, time::Duration};

use weft_tests::{
    agent::eventually,
    cluster::ping,
    proc::run,
    traffic::{ping_outcome, ping_run},
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

fn bpftool(args: &[&str]) {
    run("bpftool", args).unwrap();
}

/// (type, key size, value size, max entries) of a pinned map.
fn layout(pin: &Path) -> (String, u64, u64, u64) {
    let out = run(
        "bpftool",
        &["-j", "map", "show", "pinned", pin.to_str().unwrap()],
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (
        v["type"].as_str().unwrap().to_string(),
        v["bytes_key"].as_u64().unwrap(),
        v["bytes_value"].as_u64().unwrap(),
        v["max_entries"].as_u64().unwrap(),
    )
}

fn wait_up(n: &WeftNode, times: usize) {
    n.agent.wait_log_count("dataplane up", times, T).unwrap();
}

/// The pin directory of this layout version.
fn maps_dir() -> String {
    format!("maps-v{}", dataplane_common::LAYOUT_VERSION)
}

/// From the previous layout version (2: maps pinned in `maps-v2/`, a
/// smaller config entry, no IPv6 maps) to this version, under a running
/// ping: the peers are carried over before the new programs go in, so
/// nothing is lost. Pins of a higher version are removed.
#[test]
fn an_upgrade_from_the_previous_layout_loses_no_packet() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let dst = c.nodes[1].node.pods[0].ip;
    let peers: Vec<_> = c.nodes.iter().map(|n| n.peer_subnets()[0]).collect();
    for n in c.nodes.iter_mut() {
        n.agent.kill();
    }
    // What version 2 left behind: the same peer maps in `maps-v2/`, its
    // 36-byte config entry, no IPv6 maps; and pins of a layout from the
    // future.
    for n in &c.nodes {
        let root = n.pins.path();
        std::fs::rename(root.join(maps_dir()), root.join("maps-v2")).unwrap();
        for m in ["WEFT_PEERS6", "WEFT_VTEPS6", "WEFT_ENDPOINTS6"] {
            std::fs::remove_file(root.join("maps-v2").join(m)).unwrap();
        }
        let config = root.join("maps-v2/WEFT_CONFIG");
        std::fs::remove_file(&config).unwrap();
        bpftool(&[
            "map",
            "create",
            config.to_str().unwrap(),
            "type",
            "array",
            "key",
            "4",
            "value",
            "36",
            "entries",
            "1",
            "name",
            "WEFT_CONFIG",
        ]);
        std::fs::create_dir(root.join("maps-v99")).unwrap();
        bpftool(&[
            "map",
            "create",
            root.join("maps-v99/WEFT_PEERS").to_str().unwrap(),
            "type",
            "hash",
            "key",
            "4",
            "value",
            "64",
            "entries",
            "8",
            "name",
            "WEFT_PEERS",
        ]);
    }
    // Routes of versions before this one may name a gateway (flannel's
    // `via <subnet>.0 onlink`); this version's do not.
    for (n, peer) in c.nodes.iter().zip(&peers) {
        n.node
            .ns
            .ip(&[
                "route",
                "replace",
                &peer.to_string(),
                "via",
                &peer.network().to_string(),
                "dev",
                "weft.1",
                "onlink",
                "proto",
                "44",
            ])
            .unwrap();
    }
    let pinger = ping_run(&c.nodes[0].node.pods[0].ns, dst, 500);
    std::thread::sleep(Duration::from_millis(500));
    for n in c.nodes.iter_mut() {
        n.agent.restart().unwrap();
    }
    for n in &c.nodes {
        wait_up(n, 2);
        n.agent
            .wait_log("carrying the map over from layout version 2", T)
            .unwrap();
        n.agent.wait_log("carried the peers over", T).unwrap();
    }
    let (sent, got) = ping_outcome(pinger);
    assert_eq!((sent, got), (500, 500), "no packet lost across the upgrade");
    for n in c.nodes.iter_mut() {
        let root = n.pins.path();
        assert!(!root.join("maps-v2").exists(), "version 2's pins are gone");
        assert!(
            !root.join("maps-v99").exists(),
            "version 99's pins are gone"
        );
        assert_eq!(
            layout(&root.join(maps_dir()).join("WEFT_CONFIG")).2,
            std::mem::size_of::<dataplane_common::DataplaneConfig>() as u64
        );
        assert!(root.join(maps_dir()).join("WEFT_PEERS6").exists());
        assert_eq!(n.peer_subnets().len(), 1);
        let peer = n.peer_subnets()[0].to_string();
        eventually("the route in this version's form", T, || {
            let r = n.node.ns.ip(&["route", "show", &peer]).unwrap();
            (r.contains("dev weft.1") && !r.contains("via")).then_some(())
        });
        assert!(n.agent.running(), "{} keeps running", n.agent.name);
        assert_eq!(
            n.agent.log().matches("weft::agent: starting").count(),
            2,
            "no crash loop"
        );
    }
    assert!(ping(
        &c.nodes[1].node.pods[0].ns,
        c.nodes[0].node.pods[0].ip,
        2
    ));
}

/// A map of this version's name with another shape (another value size) is
/// replaced, not reused, and filled again from etcd.
#[test]
fn a_pinned_map_of_another_shape_is_replaced() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let n1 = &mut c.nodes[0];
    n1.agent.kill();
    let peers = n1.pins.path().join(maps_dir()).join("WEFT_PEERS");
    std::fs::remove_file(&peers).unwrap();
    bpftool(&[
        "map",
        "create",
        peers.to_str().unwrap(),
        "type",
        "lpm_trie",
        "key",
        "8",
        "value",
        "16",
        "entries",
        "16",
        "name",
        "WEFT_PEERS",
        "flags",
        "1",
    ]);
    assert_eq!(layout(&peers), ("lpm_trie".into(), 8, 16, 16));
    n1.agent.restart().unwrap();
    wait_up(n1, 2);
    n1.agent.wait_log("has another layout", T).unwrap();
    let want = (
        "lpm_trie".to_string(),
        8,
        std::mem::size_of::<dataplane_common::Vtep>() as u64,
        dataplane_common::MAX_PEERS as u64,
    );
    assert_eq!(layout(&peers), want);
    eventually("node 1 programs its peer again", T, || {
        (c.nodes[0].peer_subnets().len() == 1).then_some(())
    });
    assert!(ping(
        &c.nodes[0].node.pods[0].ns,
        c.nodes[1].node.pods[0].ip,
        2
    ));
    std::thread::sleep(Duration::from_secs(2));
    let n1 = &mut c.nodes[0];
    assert!(n1.agent.running());
    assert_eq!(
        n1.agent.log().matches("weft::agent: starting").count(),
        2,
        "no crash loop"
    );
}
