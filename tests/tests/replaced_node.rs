//! A machine replaced at the same address (reinstalled, a cloud instance
//! whose private IP is reused, a host that regenerates /etc/machine-id at
//! boot) comes back with a new node id: it takes back the lease of its
//! address, so it keeps its subnet and every node keeps reaching it. Two
//! live agents that claim one address do not take it from each other
//! forever: both report the conflict and the lease stops moving.

use std::time::Duration;

use weft_tests::{
    agent::{Agent, eventually},
    cluster::ping,
    weft_cluster::{ETCD_IP, PREFIX, WeftCluster, http_get},
};

const T: Duration = Duration::from_secs(30);

/// The keys under the subnets prefix whose value names `ip`, with their
/// values and versions.
fn leases_of(c: &WeftCluster, ip: &str) -> Vec<(String, String, i64)> {
    let out = c
        .etcd
        .etcdctl(&[
            "get",
            "--prefix",
            &format!("{PREFIX}/subnets/"),
            "-w",
            "json",
        ])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let b64 = |s: &str| {
        String::from_utf8(
            std::process::Command::new("base64")
                .arg("-d")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut ch| {
                    use std::io::Write as _;
                    ch.stdin.take().unwrap().write_all(s.as_bytes())?;
                    ch.wait_with_output()
                })
                .unwrap()
                .stdout,
        )
        .unwrap()
    };
    v["kvs"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            (
                b64(kv["key"].as_str().unwrap()),
                b64(kv["value"].as_str().unwrap()),
                kv["version"].as_i64().unwrap(),
            )
        })
        .filter(|(_, v, _)| v.contains(&format!("\"PublicIP\":\"{ip}\"")))
        .collect()
}

#[test]
fn a_replaced_machine_keeps_its_subnet_and_its_peers() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let old_subnet = c.nodes[1].subnet;
    // The machine dies and comes back reinstalled: no agent, no datapath,
    // no subnet file, a new machine id; the same address.
    c.nodes[1].agent.kill();
    c.nodes[1].weft(&["teardown"]).unwrap();
    let _ = std::fs::remove_file(c.nodes[1].agent.subnet_file());
    let args = {
        let n = &c.nodes[1];
        c.agent_args(&n.node, &n.pins, &["--node-id", "node-2-reinstalled"])
    };
    let n2 = &mut c.nodes[1];
    n2.agent = Agent::start("node2-new", Some(&n2.node.ns), &args).unwrap();
    let line = n2.agent.wait_subnet(T).unwrap();
    assert_eq!(
        line.split('/').next().unwrap().rsplit_once('.').unwrap().0,
        old_subnet.network().to_string().rsplit_once('.').unwrap().0,
        "it got its old subnet {old_subnet} back: {line}"
    );
    // Exactly one lease names its address, under its new id.
    let mine = leases_of(&c, "198.18.0.2");
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert!(mine[0].1.contains("node-2-reinstalled"), "{mine:?}");
    // Pods on both nodes reach each other both ways.
    eventually("pods reach each other across the replaced node", T, || {
        let ok = c.nodes[0].node.pods.iter().all(|a| {
            c.nodes[1]
                .node
                .pods
                .iter()
                .all(|b| ping(&a.ns, b.ip, 1) && ping(&b.ns, a.ip, 1))
        });
        ok.then_some(())
    });
    // And the old node's lease was taken over in place, not left beside.
    assert_eq!(c.nodes[0].peer_subnets(), [old_subnet]);
}

/// The `weft_public_ip_conflict` gauge of the agent in `ns` at `ip`.
fn conflict(ns: &weft_tests::netns::Netns, ip: std::net::Ipv4Addr) -> Option<bool> {
    let (_, body) = http_get(ns, ip, 9090, "/metrics").ok()?;
    let line = body
        .lines()
        .find(|l| l.starts_with("weft_public_ip_conflict "))?;
    Some(line.ends_with(" 1"))
}

#[test]
fn two_live_agents_with_one_public_ip_report_the_conflict_and_stop() {
    let c = WeftCluster::new(0, &[]).unwrap();
    let nodes: Vec<weft_tests::cluster::Node> = (1..=2)
        .map(|i| weft_tests::cluster::Node::new(&c.underlay, i).unwrap())
        .collect();
    let mut agents = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let args: Vec<String> = [
            "--etcd-endpoints",
            &format!("http://{ETCD_IP}:2379"),
            "--datapath",
            "none",
            "--public-ip",
            "198.18.0.77",
            "--node-id",
            &format!("clone-{i}"),
            "--healthz-port",
            "9090",
            "--healthz-ip",
            "0.0.0.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        agents.push(Agent::start(&format!("clone{i}"), Some(&n.ns), &args).unwrap());
        // One after the other, as a cloned machine boots after its origin.
        agents[i].wait_subnet(T).ok();
    }
    eventually("both agents report the conflict", T, || {
        nodes
            .iter()
            .all(|n| conflict(&n.ns, n.ip) == Some(true))
            .then_some(())
    });
    // The lease stops moving: a few changes, then none.
    let versions = || -> Vec<i64> {
        leases_of(&c, "198.18.0.77")
            .into_iter()
            .map(|(_, _, v)| v)
            .collect()
    };
    let first = versions();
    std::thread::sleep(Duration::from_secs(10));
    let later = versions();
    assert_eq!(first.len(), 1, "one lease for the address: {first:?}");
    assert_eq!(first, later, "the lease stopped changing");
    assert!(later[0] <= 4, "changed {} times", later[0]);
    for (i, (n, a)) in nodes.iter().zip(&agents).enumerate() {
        assert!(a.running(), "{}", n.ns.name());
        let (status, _) = http_get(&n.ns, n.ip, 9090, "/readyz").unwrap();
        assert!(
            status.contains("503"),
            "not ready while in conflict: {status}"
        );
        // The status report names the other node.
        let report: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(a.state_dir().join("status.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            report["conflict"]["node"].as_str(),
            Some(format!("clone-{}", 1 - i).as_str()),
            "the status report names the other clone: {report}"
        );
    }
}
