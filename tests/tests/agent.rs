//! The agent end to end: real `weft agent` processes in node namespaces, a
//! real etcd, real programs, real packets.

use std::time::Duration;

use dataplane_common::Reason;

use weft_tests::{
    agent::eventually,
    cluster::ping,
    traffic::{ping_outcome, ping_run, udp_stream},
    weft_cluster::{WeftCluster, http_get},
};

const T: Duration = Duration::from_secs(30);

/// 3 nodes from cold: all pods reach each other. A 4th node joins: within a
/// second every agent has it in its map, and all 4 reach each other. A
/// node's lease is deleted: the others drop it and its pods are unreachable;
/// the node re-acquires and is reachable again.
#[test]
fn cluster_from_cold_join_and_lease_deletion() {
    let mut c = WeftCluster::new(3, &[]).unwrap();
    c.wait_meshed(T);
    c.all_pairs_reach().unwrap();
    for n in &c.nodes {
        assert_eq!(n.metric("weft_lease_held"), 1.0);
        assert_eq!(n.metric("weft_lease_acquire_seconds_count"), 1.0);
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
    n4.use_cni();
    n4.node.add_pod().unwrap();
    n4.node.add_pod().unwrap();
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
    // From their maps and their routes (an IPv4 device route is scope
    // link, which a delete must match).
    let s2 = c.nodes[1].subnet.to_string();
    let routes = |i: usize| {
        c.nodes[i]
            .node
            .ns
            .ip(&["route", "show", "proto", "44"])
            .unwrap()
    };
    eventually("the others drop node 2", T, || {
        [0, 2, 3]
            .iter()
            .all(|i| {
                !c.nodes[*i].peer_subnets().contains(&c.nodes[1].subnet)
                    && !routes(*i).contains(&s2)
            })
            .then_some(())
    });
    let p2 = c.nodes[1].node.pods[0].ip;
    assert!(
        !ping(&c.nodes[0].node.pods[0].ns, p2, 1),
        "node 2's pods are unreachable"
    );
    c.nodes[1].agent.resume();
    c.nodes[1].wait_metric("weft_lease_lost_total", |n| n == 1.0, T);
    c.nodes[1].wait_metric("weft_lease_acquire_seconds_count", |n| n == 2.0, T);
    c.nodes[1].wait_metric("weft_lease_held", |v| v == 1.0, T);
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

/// SIGKILL and restart of the agents under a continuous 100 pps ping (the
/// host stack's path) and a 100 pps UDP stream between registered pods
/// (the fast path, with host routing): the pinned programs, maps and
/// endpoints keep forwarding, the restarted agents adopt them, and nothing
/// is lost. SIGTERM leaves the dataplane in place too.
#[test]
fn agent_restarts_lose_no_packets() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let dst = c.nodes[1].node.pods[1].ip;
    assert!(ping(&c.nodes[0].node.pods[0].ns, dst, 2));
    let bypassed = |c: &WeftCluster| {
        let n = |i: usize, r| {
            weft::dataplane::Counters::open(c.nodes[i].pins.pins())
                .unwrap()
                .get(r)
                .unwrap()
                .packets
        };
        (n(0, Reason::EncapBypass), n(1, Reason::DecapBypass))
    };
    let before = bypassed(&c);
    let stream = udp_stream(
        &c.nodes[1].node.pods[1].ns,
        dst,
        7300,
        &c.nodes[0].node.pods[0].ns,
        800,
        Duration::from_millis(10),
    );
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
        n.wait_dataplane_up(T);
        n.agent.wait_log("adopted the pinned dataplane", T).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1000));
    // SIGTERM: the dataplane stays.
    c.nodes[0].agent.stop().unwrap();
    let (sent, received) = ping_outcome(pinger);
    assert_eq!(
        (sent, received),
        (800, 800),
        "no packet lost across SIGKILL, restart and SIGTERM"
    );
    let stream = stream.join().unwrap();
    assert_eq!(
        stream.counts(),
        (800, 800),
        "no datagram lost across SIGKILL, restart and SIGTERM: {stream:?}"
    );
    let after = bypassed(&c);
    let fast = (after.0 - before.0, after.1 - before.1);
    println!("bypassed (sender, receiver): {fast:?} of 800 datagrams");
    if !weft_tests::bypasses() {
        assert_eq!(fast, (0, 0));
    } else {
        // All but the first (conntrack confirms the flow on the host stack).
        assert!(fast.0 >= 795 && fast.1 >= 795, "{fast:?}");
    }
    for n in &c.nodes[1..] {
        assert_eq!(
            n.agent.subnet().unwrap(),
            format!(
                "{}/{}",
                weft::lease::first_host(&n.subnet),
                n.subnet.prefix_len()
            )
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
    c.wait_meshed(T);
    c.nodes[0].agent.kill();
    // Node 3 goes away for good while node 1's agent is down.
    c.nodes[2].agent.kill();
    c.etcd.etcdctl(&["del", &c.nodes[2].lease_key()]).unwrap();
    assert!(
        c.nodes[0].peer_subnets().contains(&c.nodes[2].subnet),
        "the pinned map still has it"
    );
    c.nodes[0].agent.restart().unwrap();
    eventually("the restarted agent removes the vanished peer", T, || {
        (c.nodes[0].peer_subnets() == vec![c.nodes[1].subnet]).then_some(())
    });
    let routes = c.nodes[0]
        .node
        .ns
        .ip(&["route", "show", "proto", "44"])
        .unwrap();
    assert!(
        !routes.contains(&c.nodes[2].subnet.to_string())
            && routes.contains(&c.nodes[1].subnet.to_string()),
        "the vanished peer's route ({}) goes too, the other's ({}) stays: {routes}",
        c.nodes[2].subnet,
        c.nodes[1].subnet
    );
    assert_eq!(c.nodes[0].metric("weft_peers"), 1.0);
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
    c.wait_meshed(T);
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
    let (sent, received) = ping_outcome(pinger);
    assert_eq!(sent, received, "traffic kept flowing through the outage");
    // The agents noticed the outage and came back, same subnets, no loss.
    for n in &c.nodes {
        // The agents saw the outage (the watch broke) and started their
        // watches again where they were: no list. Their retries back off
        // to at most 30 s apart (at random), so the last may come that long
        // after etcd's return.
        n.wait_metric("weft_watch_resumes_total", |r| r >= 1.0, T);
        n.wait_metric(
            "weft_etcd_watch_lag_seconds",
            |lag| (0.0..5.0).contains(&lag),
            2 * T,
        );
        assert_eq!(
            n.metric("weft_watch_lists_total"),
            1.0,
            "the first list only: {}",
            n.agent.log()
        );
        assert_eq!(n.metric("weft_peers"), 1.0);
        assert_eq!(n.metric("weft_lease_lost_total"), 0.0, "{}", n.agent.log());
        // With a 120 s TTL and a 60 s outage, more than 60 s left means a
        // keep-alive went through after etcd came back.
        eventually("the lease is renewed after the outage", T, || {
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
        assert_eq!(
            n.agent.subnet().unwrap(),
            format!("{}/24", weft::lease::first_host(&n.subnet))
        );
    }
    // And the control plane works again: a new node joins, and the agents
    // that lived through the outage program it.
    let mut c = c;
    c.start_node(3, &[]).unwrap();
    let s3 = c.nodes[2].subnet;
    eventually("both agents program the node that joined", T, || {
        c.nodes[..2]
            .iter()
            .all(|n| n.peer_subnets().contains(&s3))
            .then_some(())
    });
}

/// /metrics parses as Prometheus text and its counters move with the
/// traffic; /healthz and /readyz answer; `weft status` shows the node;
/// `weft teardown` removes everything.
#[test]
fn metrics_status_and_teardown() {
    let c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
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
    // Pings take the host stack (conntrack's gate only lets TCP and UDP
    // bypass it), or bypass it with --host-routing bpf: either way each is
    // counted once on each side.
    let sent = |m: &std::collections::HashMap<String, f64>| {
        m["weft_dataplane_packets_total{reason=\"encapsulated\"}"]
            + m["weft_dataplane_packets_total{reason=\"encap_bypass\"}"]
    };
    let received = |m: &std::collections::HashMap<String, f64>| {
        m["weft_dataplane_packets_total{reason=\"decapsulated\"}"]
            + m["weft_dataplane_packets_total{reason=\"decap_bypass\"}"]
    };
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
        sent(&after) >= sent(&before) + 25.0,
        "{} -> {}",
        sent(&before),
        sent(&after)
    );
    assert!(
        received(&after) >= received(&before) + 25.0,
        "{} -> {}",
        received(&before),
        received(&after)
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
        status.contains("weft_decap_tc")
            && status.contains("decapsulation: tc (the uplink is a veth"),
        "TC decapsulation on a veth uplink, and why: {status}"
    );
    assert!(status.contains("TTL"), "the lease's TTL left");
    let json = n1.weft(&["status", "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["peers"].as_array().unwrap().len(), 1);
    let counted = |r: &str| v["counters"][r]["packets"].as_u64().unwrap();
    assert!(counted("encapsulated") + counted("encap_bypass") >= 25);

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

/// `--trace-drops`: a VXLAN packet from an unknown sender is dropped and the
/// agent logs it with its reason and addresses; an agent without the flag
/// logs nothing for the same packet (but counts it). `weft trace-drops
/// on|off` switches the trace of a running agent, without a restart.
#[test]
fn dropped_packets_are_traced_on_request() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    c.add_node(1, &["--trace-drops"]).unwrap();
    c.add_node(2, &[]).unwrap();
    for n in &c.nodes {
        n.wait_dataplane_up(T);
    }
    c.nodes[0]
        .agent
        .wait_log("tracing dropped packets", T)
        .unwrap();
    let attacker = weft_tests::netns::Netns::new("wx").unwrap();
    c.underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    // VXLAN (VNI 1) carrying an IPv4 packet 10.99.0.1 -> 10.244.x.10.
    let mut vxlan = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    vxlan.extend([0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[3] = 20;
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 99, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 244, 1, 10]);
    vxlan.extend(ip);
    let send = || {
        let vxlan = vxlan.clone();
        attacker
            .run(move || {
                let s = std::net::UdpSocket::bind("198.18.0.66:40000").unwrap();
                for dst in ["198.18.0.1:8472", "198.18.0.2:8472"] {
                    s.send_to(&vxlan, dst).unwrap();
                }
            })
            .unwrap();
    };
    let dropped = |n: &weft_tests::weft_cluster::WeftNode| -> f64 {
        let (_, body) = http_get(&n.node.ns, n.node.ip, 9090, "/metrics").unwrap();
        body.lines()
            .find(|l| l.starts_with("weft_dataplane_packets_total{reason=\"drop_unknown_vtep\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let traced = |n: &weft_tests::weft_cluster::WeftNode, to: &str| {
        let line = format!("dropped (drop_unknown_vtep): 198.18.0.66 -> {to}");
        n.agent.log().matches(&line).count()
    };
    // Sends one packet to each node and waits until both counted it.
    let send_counted = |c: &WeftCluster| {
        let before: Vec<f64> = c.nodes.iter().map(dropped).collect();
        send();
        for (n, b) in c.nodes.iter().zip(before) {
            eventually("the node counts the drop", T, || {
                (dropped(n) > b).then_some(())
            });
        }
    };
    send_counted(&c);
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    n1.agent
        .wait_log("dropped (drop_unknown_vtep): 198.18.0.66 -> 198.18.0.1", T)
        .unwrap();
    assert_eq!(
        traced(n2, "198.18.0.2"),
        0,
        "no trace without --trace-drops"
    );

    // Switched at run time: on for node 2, off for node 1.
    let switch = |n: &weft_tests::weft_cluster::WeftNode, how: &str| {
        let state = n.agent.state_dir();
        let (ok, out, err) =
            weft_tests::agent::weft(&["trace-drops", how, "--state-dir", state.to_str().unwrap()]);
        assert!(ok, "weft trace-drops {how}: {err}");
        assert!(out.contains(&format!("drop trace is {how}")), "{out}");
    };
    switch(n2, "on");
    switch(n1, "off");
    n2.agent.wait_log("the drop trace is switched", T).unwrap();
    n1.agent.wait_log("the drop trace is switched", T).unwrap();
    let status = n2.weft(&["status"]).unwrap();
    assert!(status.contains("drop trace: on"), "{status}");
    let status = n1.weft(&["status"]).unwrap();
    assert!(!status.contains("drop trace: on"), "{status}");
    let was = traced(n1, "198.18.0.1");
    send_counted(&c);
    n2.agent
        .wait_log("dropped (drop_unknown_vtep): 198.18.0.66 -> 198.18.0.2", T)
        .unwrap();
    // The ring buffer is read as soon as it is readable: a record node 1
    // still logged would be there by the time node 2's is.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(traced(n1, "198.18.0.1"), was, "no trace once switched off");
    let bad = weft_tests::agent::weft(&[
        "trace-drops",
        "maybe",
        "--state-dir",
        n1.agent.state_dir().to_str().unwrap(),
    ]);
    assert!(!bad.0, "only on or off");

    // Every program loads with the trace's records: a restart's self-test
    // loads them all, as the installed generation does.
    let n1 = &mut c.nodes[0];
    n1.agent.restart().unwrap();
    n1.wait_dataplane_up(T);
    let log = n1.agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("self-test of this build's programs") && l.contains("failed=0")),
        "{log}"
    );
}

/// rp_filter is loosened only on the uplink, where decapsulated packets
/// enter, and only if it was strict; `all` is left as it was; teardown puts
/// the uplink's value back.
#[test]
fn rp_filter_is_changed_only_where_needed_and_restored() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    let node = weft_tests::cluster::Node::new(&c.underlay, 1).unwrap();
    for key in [
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.eth0.rp_filter",
    ] {
        node.ns.sysctl(key, "1").unwrap();
    }
    c.start_node_on(node, &[]).unwrap();
    let read = |n: &weft_tests::weft_cluster::WeftNode, k: &str| {
        n.node
            .ns
            .exec("sysctl", &["-n", k])
            .unwrap()
            .trim()
            .to_string()
    };
    let n1 = &c.nodes[0];
    n1.wait_dataplane_up(T);
    assert_eq!(read(n1, "net.ipv4.conf.eth0.rp_filter"), "2");
    assert_eq!(
        read(n1, "net.ipv4.conf.all.rp_filter"),
        "1",
        "all untouched"
    );
    c.nodes[0].agent.stop().unwrap();
    let out = c.nodes[0].weft(&["teardown"]).unwrap();
    println!("{out}");
    assert!(
        out.contains("sysctl net.ipv4.conf.eth0.rp_filter=1"),
        "{out}"
    );
    assert_eq!(read(&c.nodes[0], "net.ipv4.conf.eth0.rp_filter"), "1");
}

/// A setup that fails on a node that had no Weft dataplane is rolled back:
/// no device, no programs, no pins, no subnet.env; the same agent with a
/// working setting then comes up.
#[test]
fn a_failed_setup_is_rolled_back() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    // An uplink that has no native XDP: a bridge holding the underlay port.
    let node = weft_tests::cluster::Node::new(&c.underlay, 1).unwrap();
    let ns = &node.ns;
    ns.ip(&["addr", "flush", "dev", "eth0"]).unwrap();
    ns.ip(&["link", "add", "up0", "type", "bridge"]).unwrap();
    ns.ip(&["link", "set", "eth0", "master", "up0"]).unwrap();
    ns.ip(&["link", "set", "up0", "up"]).unwrap();
    ns.ip(&["addr", "add", "198.18.0.1/24", "dev", "up0"])
        .unwrap();
    let s = c
        .start_agent(
            node,
            weft_tests::pins::TestPins::new(),
            &["--iface", "up0", "--xdp-mode", "native"],
        )
        .unwrap();
    let agent = s.agent;
    eventually("the agent gives up", T, || (!agent.running()).then_some(()));
    let log = agent.log();
    assert!(log.contains("dataplane setup failed"), "{log}");
    assert!(log.contains("rolled back"), "{log}");
    let links = s.node.ns.ip(&["-d", "link", "show"]).unwrap();
    assert!(
        !links.contains("weft.1") && !links.contains("prog/"),
        "{links}"
    );
    assert!(
        agent.subnet().is_none(),
        "no subnet.env before the dataplane is up"
    );
    assert_eq!(
        std::fs::read_dir(s.pins.path().join("links"))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "no link pins left"
    );
    drop(agent);
    // The same node with a setting that works comes up.
    let s = c
        .start_agent(s.node, s.pins, &["--iface", "up0", "--xdp-mode", "off"])
        .unwrap();
    c.adopt(s).unwrap();
    c.nodes[0].wait_dataplane_up(T);
}
