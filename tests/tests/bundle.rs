//! `weft bundle`: one JSON document with what a bug report needs from a
//! node (status, doctor's findings, the leases, the pins, subnet.env, the
//! agent's last log lines), every part there on a healthy node, and a part
//! that cannot be read saying why while the rest is still gathered.

use std::time::Duration;

use serde_json::Value;
use weft_tests::weft_cluster::WeftCluster;

const T: Duration = Duration::from_secs(60);

#[test]
fn a_bundle_gathers_every_part_and_survives_a_missing_one() {
    let c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    c.nodes[0].wait_metric("weft_ready", |v| v == 1.0, T);
    let n = &c.nodes[0];
    let conf = std::env::temp_dir().join(weft_tests::unique("weft-bundle-"));
    std::fs::create_dir_all(&conf).unwrap();
    let out = n
        .weft(&["bundle", "--cni-conf-dir", conf.to_str().unwrap()])
        .unwrap();
    let b: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(b["weft"], env!("CARGO_PKG_VERSION"));
    assert!(b["kernel"].as_str().is_some_and(|k| !k.is_empty()));
    // status: the node's own lease, both peers' subnets known.
    let status = &b["status"]["output"];
    assert_eq!(b["status"]["exit_ok"], true, "{b:#}");
    assert!(status.is_object(), "status as JSON: {b:#}");
    let own = n.subnet.to_string();
    assert!(status.to_string().contains(&own), "status names {own}");
    // doctor: its findings (the CNI check fails: no config in the empty
    // directory given), as JSON, the exit status kept.
    assert_eq!(b["doctor"]["exit_ok"], false, "{b:#}");
    let checks = b["doctor"]["output"]["checks"].as_array().unwrap();
    assert!(
        checks
            .iter()
            .any(|c| c["check"] == "cni" && c["level"] == "fail")
    );
    assert!(
        checks
            .iter()
            .any(|c| c["check"] == "peers" && c["level"] == "ok")
    );
    // leases: both nodes'.
    let leases = b["leases"]["output"].to_string();
    for m in &c.nodes {
        assert!(leases.contains(&m.subnet.network().to_string()), "{leases}");
    }
    let pins: Vec<&str> = b["pins"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(pins.iter().any(|p| p.starts_with("links/")), "{pins:?}");
    assert_eq!(
        b["subnet_env"].as_str().unwrap(),
        std::fs::read_to_string(n.agent.subnet_file()).unwrap()
    );
    let tail: Vec<&str> = b["log_tail"]
        .as_array()
        .unwrap_or_else(|| panic!("log tail: {b:#}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        tail.iter().any(|l| l.contains("acquired the subnet lease")),
        "the agent's own log lines: {tail:?}"
    );

    // etcd gone: the leases part says why, the rest is there.
    c.etcd.pause();
    let n = &c.nodes[0];
    let out = n
        .weft(&[
            "bundle",
            "--cni-conf-dir",
            conf.to_str().unwrap(),
            "--etcd-timeout",
            "2",
        ])
        .unwrap();
    c.etcd.resume();
    let b: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(b["leases"]["exit_ok"], false, "{b:#}");
    assert!(
        b["leases"]["stderr"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{b:#}"
    );
    assert_eq!(b["status"]["exit_ok"], true, "{b:#}");
    assert!(b["log_tail"].as_array().is_some_and(|t| !t.is_empty()));
    let _ = std::fs::remove_dir_all(&conf);
}
