//! The agent end to end: real `weft agent` processes in node namespaces, a
//! real etcd, real programs, real packets.

use std::time::Duration;

use weft_tests::{
    agent::eventually,
    cluster::ping,
    weft_cluster::{PREFIX, WeftCluster, http_get},
};

const T: Duration = Duration::from_secs(30);

/// 3 nodes from cold: all pods reach each other. A 4th node joins: within a
/// second every agent has it in its map, and all 4 reach each other. A
/// node's lease is deleted: the others drop it and its pods are unreachable;
/// the node re-acquires and is reachable again.
#[test]
fn cluster_from_cold_join_and_lease_deletion() {
    let mut c = WeftCluster::new(3, &[]).unwrap();
    eventually("all 3 nodes see each other", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 2)
            .then_some(())
    });
    c.all_pairs_reach().unwrap();
    for n in &c.nodes {
        n.agent.wait_log("acquired the subnet lease", T).unwrap();
        assert!(!n.agent.log().contains("ERROR"), "{}", n.agent.log());
    }

    // A 4th node joins.
    c.start_node(4, &[]).unwrap();
    let joined_at = c.nodes[3].acquired_at;
    let s4 = c.nodes[3].subnet;
    eventually(
        "every agent programs the new peer",
        Duration::from_secs(5),
        || {
            c.nodes[..3]
                .iter()
                .all(|n| n.peer_subnets().contains(&s4))
                .then_some(())
        },
    );
    let took = joined_at.elapsed();
    println!("every agent programmed the 4th node {took:?} after it took its lease");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let n4 = &mut c.nodes[3];
    n4.node.pods_for(n4.subnet.addr(), 24, 2, 1450).unwrap();
    c.all_pairs_reach().unwrap();
    println!(
        "and all 4 nodes' pods reach each other {:?} after",
        joined_at.elapsed()
    );

    // Node 2's lease is deleted while its agent is paused (so the window in
    // which it holds no lease can be observed).
    let n2 = &c.nodes[1];
    n2.agent.pause();
    c.etcd.etcdctl(&["del", &n2.lease_key()]).unwrap();
    eventually("the others drop node 2", T, || {
        [0, 2, 3]
            .iter()
            .all(|i| !c.nodes[*i].peer_subnets().contains(&c.nodes[1].subnet))
            .then_some(())
    });
    let p2 = c.nodes[1].node.pods[0].ip;
    assert!(
        !ping(&c.nodes[0].node.pods[0].ns, p2, 1),
        "node 2's pods are unreachable"
    );
    c.nodes[1].agent.resume();
    c.nodes[1].agent.wait_log("SUBNET LEASE LOST", T).unwrap();
    c.nodes[1]
        .agent
        .wait_log_count("acquired the subnet lease", 2, T)
        .unwrap();
    eventually("node 2 is back in every map", T, || {
        [0, 2, 3]
            .iter()
            .all(|i| c.nodes[*i].peer_subnets().contains(&c.nodes[1].subnet))
            .then_some(())
    });
    assert!(
        ping(&c.nodes[0].node.pods[0].ns, p2, 2),
        "reachable again (same subnet: it was free)"
    );
}

/// Counts ping replies from `from` to `to` at 100 per second for `secs`.
fn ping_run(
    from: &weft_tests::netns::Netns,
    to: std::net::Ipv4Addr,
    count: u32,
) -> std::process::Child {
    from.command("ping")
        .args([
            "-i",
            "0.01",
            "-c",
            &count.to_string(),
            "-W",
            "1",
            "-q",
            &to.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn loss(out: std::process::Output) -> (u32, u32) {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_default();
    let nums: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    (nums[0], nums[1])
}

/// SIGKILL and restart of the agents under a continuous 100 pps ping: the
/// pinned programs and maps keep forwarding, the restarted agents adopt
/// them, and nothing is lost. SIGTERM leaves the dataplane in place too.
#[test]
fn agent_restarts_lose_no_packets() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    eventually("peers programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 1)
            .then_some(())
    });
    let dst = c.nodes[1].node.pods[1].ip;
    assert!(ping(&c.nodes[0].node.pods[0].ns, dst, 2));
    let pinger = ping_run(&c.nodes[0].node.pods[0].ns, dst, 800);
    std::thread::sleep(Duration::from_millis(500));
    let key_before = c
        .etcd
        .etcdctl(&["get", &c.nodes[1].lease_key(), "-w", "json"])
        .unwrap();
    for n in c.nodes.iter_mut() {
        n.agent.kill();
    }
    std::thread::sleep(Duration::from_millis(1500));
    for n in c.nodes.iter_mut() {
        n.agent.restart().unwrap();
    }
    for n in &c.nodes {
        n.agent.wait_log_count("dataplane up", 2, T).unwrap();
        n.agent.wait_log("adopted the pinned dataplane", T).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1000));
    // SIGTERM: the dataplane stays.
    c.nodes[0].agent.stop().unwrap();
    let out = pinger.wait_with_output().unwrap();
    let (sent, received) = loss(out);
    assert_eq!(
        (sent, received),
        (800, 800),
        "no packet lost across SIGKILL, restart and SIGTERM"
    );
    for n in &c.nodes[1..] {
        assert_eq!(
            n.agent.subnet().unwrap(),
            format!("{}/{}", n.subnet.first_host(), n.subnet.prefix_len())
        );
    }
    let key_after = c
        .etcd
        .etcdctl(&["get", &c.nodes[1].lease_key(), "-w", "json"])
        .unwrap();
    let create = |j: &str| {
        serde_json::from_str::<serde_json::Value>(j).unwrap()["kvs"][0]["create_revision"].clone()
    };
    assert_eq!(
        create(&key_before),
        create(&key_after),
        "the restarted agent kept its lease key"
    );
    assert!(
        ping(&c.nodes[0].node.pods[0].ns, dst, 2),
        "still forwarding with node 1's agent stopped"
    );
}

/// A peer whose lease vanished while the agent was down is removed when the
/// restarted agent resynchronises from etcd.
#[test]
fn restart_resyncs_vanished_peers() {
    let mut c = WeftCluster::new(3, &[]).unwrap();
    eventually("peers programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 2)
            .then_some(())
    });
    c.nodes[0].agent.kill();
    // Node 3 goes away for good while node 1's agent is down.
    c.nodes[2].agent.kill();
    c.etcd.etcdctl(&["del", &c.nodes[2].lease_key()]).unwrap();
    assert!(
        c.nodes[0].peer_subnets().contains(&c.nodes[2].subnet),
        "the pinned map still has it"
    );
    c.nodes[0].agent.restart().unwrap();
    c.nodes[0]
        .agent
        .wait_log("removed peers whose leases vanished", T)
        .unwrap();
    assert_eq!(c.nodes[0].peer_subnets(), vec![c.nodes[1].subnet]);
    assert!(ping(
        &c.nodes[0].node.pods[0].ns,
        c.nodes[1].node.pods[0].ip,
        2
    ));
}

/// etcd stopped for 60 s: traffic between existing nodes keeps flowing; the
/// agents recover when etcd is back, keeping their subnets.
#[test]
fn etcd_outage_of_60_seconds() {
    let c = WeftCluster::new(2, &["--subnet-lease-ttl", "120"]).unwrap();
    eventually("peers programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 1)
            .then_some(())
    });
    let (src, dst) = (&c.nodes[0].node.pods[0], c.nodes[1].node.pods[0].ip);
    let pinger = src
        .ns
        .command("ping")
        .args(["-i", "0.2", "-c", "330", "-W", "1", "-q", &dst.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.etcd.pause();
    std::thread::sleep(Duration::from_secs(60));
    c.etcd.resume();
    let (sent, received) = loss(pinger.wait_with_output().unwrap());
    assert_eq!(sent, received, "traffic kept flowing through the outage");
    // The agents noticed the outage and came back, same subnets, no loss.
    for n in &c.nodes {
        // The agents saw the outage (the watch broke) and resynchronised.
        n.agent
            .wait_log("lease watch restarting from a fresh list", T)
            .unwrap();
        n.agent
            .wait_log_count("peer table in step with etcd", 2, T)
            .unwrap();
        assert!(
            !n.agent.log().contains("SUBNET LEASE LOST"),
            "{}",
            n.agent.log()
        );
        let ttl = eventually("the lease is renewed after the outage", T, || {
            let (_, body) = http_get(&n.node.ns, n.node.ip, 9090, "/metrics").ok()?;
            let v: f64 = body
                .lines()
                .find(|l| l.starts_with("weft_lease_ttl_seconds "))?
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            (v > 60.0).then_some(v)
        });
        assert!(ttl <= 120.0);
        assert_eq!(
            n.agent.subnet().unwrap(),
            format!("{}/24", n.subnet.first_host())
        );
    }
    // And the control plane works again: a new node joins.
    let out = c
        .etcd
        .etcdctl(&[
            "get",
            "--prefix",
            &format!("{PREFIX}/subnets/"),
            "--keys-only",
        ])
        .unwrap();
    assert_eq!(out.lines().filter(|l| !l.is_empty()).count(), 2);
}

/// /metrics parses as Prometheus text and its counters move with the
/// traffic; /healthz and /readyz answer; `weft status` shows the node;
/// `weft teardown` removes everything.
#[test]
fn metrics_status_and_teardown() {
    let c = WeftCluster::new(2, &[]).unwrap();
    eventually("peers programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 1)
            .then_some(())
    });
    let n1 = &c.nodes[0];
    let get = |p: &str| http_get(&n1.node.ns, n1.node.ip, 9090, p).unwrap();
    assert_eq!(get("/healthz").0, "HTTP/1.1 200 OK");
    eventually("ready", T, || {
        (get("/readyz").0 == "HTTP/1.1 200 OK").then_some(())
    });
    let scrape = || -> std::collections::HashMap<String, f64> {
        let (status, body) = get("/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let mut m = std::collections::HashMap::new();
        for line in body.lines() {
            if line.starts_with('#') {
                let parts: Vec<&str> = line.splitn(4, ' ').collect();
                assert!(
                    matches!(parts.get(1), Some(&"HELP") | Some(&"TYPE")),
                    "bad comment line {line:?}"
                );
                if parts[1] == "TYPE" {
                    assert!(
                        ["counter", "gauge", "histogram"].contains(&parts[3]),
                        "{line}"
                    );
                }
                continue;
            }
            let (name, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad sample line {line:?}"));
            let v: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}"));
            let bare = name.split('{').next().unwrap();
            assert!(
                bare.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "{name}"
            );
            m.insert(name.to_string(), v);
        }
        m
    };
    let before = scrape();
    assert_eq!(before["weft_peers"], 1.0);
    assert_eq!(before["weft_lease_held"], 1.0);
    assert_eq!(before["weft_ready"], 1.0);
    let enc = "weft_dataplane_packets_total{reason=\"encapsulated\"}";
    let dec = "weft_dataplane_packets_total{reason=\"decapsulated\"}";
    assert!(
        n1.node.pods[0]
            .ns
            .exec(
                "ping",
                &[
                    "-c",
                    "25",
                    "-i",
                    "0.01",
                    "-q",
                    &c.nodes[1].node.pods[0].ip.to_string()
                ]
            )
            .is_ok()
    );
    let after = scrape();
    assert!(
        after[enc] >= before[enc] + 25.0,
        "{} -> {}",
        before[enc],
        after[enc]
    );
    assert!(
        after[dec] >= before[dec] + 25.0,
        "{} -> {}",
        before[dec],
        after[dec]
    );
    assert!(after["weft_lease_acquire_seconds_count"] >= 1.0);

    // weft status, inside node 1.
    let status = n1.weft(&["status"]).unwrap();
    println!("{status}");
    assert!(status.contains(&n1.subnet.to_string()));
    assert!(
        status.contains(&c.nodes[1].subnet.to_string()),
        "the peer is listed"
    );
    assert!(
        status.contains("weft_decap") && status.contains("native"),
        "XDP in native mode"
    );
    assert!(status.contains("TTL"), "the lease's TTL left");
    let json = n1.weft(&["status", "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["peers"].as_array().unwrap().len(), 1);
    assert!(v["counters"]["encapsulated"]["packets"].as_u64().unwrap() >= 25);

    // weft teardown: programs, maps, device and routes are gone.
    let mut c = c;
    c.nodes[0].agent.stop().unwrap();
    let n1 = &c.nodes[0];
    let out = n1.weft(&["teardown"]).unwrap();
    println!("{out}");
    assert!(out.contains("device weft.1"));
    let links = n1.node.ns.ip(&["-d", "link", "show"]).unwrap();
    assert!(
        !links.contains("weft.1") && !links.contains("prog/xdp"),
        "{links}"
    );
    assert!(
        !n1.node
            .ns
            .ip(&["route", "show", "proto", "44"])
            .unwrap()
            .contains("10.244")
    );
    assert!(
        std::fs::read_dir(n1.pins.path().join("maps"))
            .map(|d| d.count())
            .unwrap_or(0)
            == 0
    );
    // A second teardown has nothing left to do.
    let out = n1.weft(&["teardown"]).unwrap();
    assert!(out.contains("nothing to remove"), "{out}");
}
