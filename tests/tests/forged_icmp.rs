//! Forged ICMP cannot steer or stall the agent. Anyone on the underlay,
//! and any pod with CAP_NET_RAW, can send a node echo replies with any id
//! from a peer's overlay address, errors about any flow, and
//! "fragmentation needed" quoting the node's own VXLAN packets. Sent from
//! an underlay host and from a pod, at a trickle and at thousands a
//! second: the agent still becomes ready after a restart (its swap check
//! answered by its own probes only), still sees a real cut within its
//! probe interval, keeps every path MTU (a hint only makes the size in
//! use be checked again), and its CPU stays bounded.

use std::{net::Ipv4Addr, time::Duration};

use ipnet::Ipv4Net;
use weft_tests::{
    agent::eventually,
    cluster::ping_df,
    flood::{self, Forged},
    netns::{ChildGuard, Netns},
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
/// One flood at a time: two would share this machine's two cores with
/// twice the flooders.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// The probe interval the agents run with here.
const INTERVAL: u64 = 2;

fn peer(n: &WeftNode, subnet: Ipv4Net) -> Option<serde_json::Value> {
    n.status_json()?["peer_health"]
        .as_array()?
        .iter()
        .find(|p| p["subnet"].as_str() == Some(&subnet.to_string()))
        .cloned()
}

fn wait_state(n: &WeftNode, subnet: Ipv4Net, want: &str, within: Duration) {
    eventually(
        &format!("{}: peer {subnet} {want}", n.agent.name),
        within,
        || (peer(n, subnet)?["state"].as_str() == Some(want)).then_some(()),
    );
}

/// Drops VXLAN between `a` and `b` on the underlay's switch; returns what
/// lifts it.
fn cut<'a>(switch: &'a Netns, a: Ipv4Addr, b: Ipv4Addr) -> impl FnOnce() + 'a {
    switch
        .exec("nft", &["add", "table", "bridge", "icmpcut"])
        .unwrap();
    let chain = format!(
        "{{ type filter hook forward priority 0; policy accept; ip saddr {a} ip daddr {b} udp dport 8472 drop; ip saddr {b} ip daddr {a} udp dport 8472 drop; }}"
    );
    switch
        .exec("nft", &["add", "chain", "bridge", "icmpcut", "cut", &chain])
        .unwrap();
    move || {
        switch
            .exec("nft", &["delete", "table", "bridge", "icmpcut"])
            .unwrap();
    }
}

/// Every kind of forged ICMP at node 1, at `rate` a second each from an
/// underlay host (`attacker`) and at a tenth of it from one of node 1's
/// pods: echo replies with every id from node 2's overlay address,
/// "fragmentation needed" naming 1280 about node 1's VXLAN packets to
/// node 2, and port unreachable about any flow.
fn forge(c: &WeftCluster, attacker: &Netns, rate: u32) -> Vec<ChildGuard> {
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let node1 = n1.node.ip.to_string();
    let echo = Forged::EchoReplies {
        from: n2.subnet.network().to_string(),
        to: node1.clone(),
    };
    let hint = |router: String| Forged::FragNeeded {
        router,
        to: node1.clone(),
        quoted_src: node1.clone(),
        quoted_dst: n2.node.ip.to_string(),
        dport: 8472,
        mtu: 1280,
    };
    let unreachable = Forged::Unreachable {
        router: "198.18.0.66".into(),
        to: node1.clone(),
    };
    let pod = &n1.node.pods[1];
    let mut g = Vec::new();
    for (ns, what, r) in [
        (attacker, echo.clone(), rate),
        (attacker, hint("198.18.0.66".into()), rate),
        (attacker, unreachable, rate),
        (&pod.ns, echo, (rate / 10).max(1)),
        (&pod.ns, hint(pod.ip.to_string()), (rate / 10).max(1)),
    ] {
        g.push(flood::start(ns, &what, r).unwrap());
    }
    // The flooders build their packets first (scapy): let them start.
    std::thread::sleep(Duration::from_secs(3));
    g
}

fn cluster() -> WeftCluster {
    let c = WeftCluster::new(2, &["--peer-probe-interval", &INTERVAL.to_string()]).unwrap();
    c.wait_meshed(weft_tests::scaled(T));
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    wait_state(n1, n2.subnet, "reachable", weft_tests::scaled(T));
    eventually(
        "node 2's path MTU measured at 1500",
        weft_tests::scaled(T),
        || (peer(n1, n2.subnet)?["path_mtu"].as_u64()? == 1500).then_some(()),
    );
    c
}

/// A restart of an agent whose programs are pinned (its swap check asks
/// the peers that answer before the new programs go in, and again after),
/// running as PID 1 as in its container, under a trickle of echo replies
/// with every id and 200 a second with each id an agent of PID 1 would
/// take if its ids came from its PID: it becomes ready.
#[test]
fn an_agent_restarted_under_forged_echo_replies_becomes_ready() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = cluster();
    let attacker = Netns::new("ix").unwrap();
    c.underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    let mut floods = forge(&c, &attacker, 200);
    let echo = Forged::EchoIds {
        from: c.nodes[1].subnet.network().to_string(),
        to: c.nodes[0].node.ip.to_string(),
        ids: vec![1, 1 ^ 0x4000, 1 ^ 0x8000],
    };
    floods.push(flood::start(&attacker, &echo, 600).unwrap());
    std::thread::sleep(Duration::from_secs(3));
    let n1 = &mut c.nodes[0];
    n1.agent.in_pid_namespace();
    n1.agent.restart().unwrap();
    // Ready, as the restarted agent says (the one before is gone).
    if weft_tests::agent::poll(T, || (n1.series("weft_ready")? == 1.0).then_some(())).is_none() {
        let log = n1.agent.log();
        let tail: Vec<&str> = log.lines().filter(|l| !l.contains("DEBUG")).collect();
        panic!(
            "node 1 not ready within {T:?} of its restart; its log ends:\n{}",
            tail[tail.len().saturating_sub(25)..].join("\n")
        );
    }
    let log = n1.agent.log();
    let restarted = log
        .rfind(" starting node_id")
        .map_or(&log[..], |at| &log[at..]);
    assert!(
        restarted.contains("the new programs reach the peers that answered before the swap"),
        "the swap check ran and passed on real answers: {}",
        restarted
            .lines()
            .filter(|l| !l.contains("DEBUG"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Steady state under thousands of forged messages a second: the path MTU
/// stays, a real cut is seen within the probe interval and its end too,
/// and the agent's CPU stays bounded.
#[test]
fn under_a_flood_of_forged_icmp_paths_stay_cuts_are_seen_and_cpu_is_bounded() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = cluster();
    let attacker = Netns::new("iy").unwrap();
    c.underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let pid = n1.agent.pid();
    let flood = forge(&c, &attacker, 2000);

    // CPU over 10 s of the flood.
    let (cpu0, t0) = (flood::cpu_seconds(pid), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let share = (flood::cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    println!("agent CPU under the flood: {:.1}% of a core", share * 100.0);
    assert!(
        share < 0.25,
        "the agent used {:.1}% of a core",
        share * 100.0
    );

    // The path MTU stays 1500, and a 1400-byte DF packet crosses.
    let p = peer(n1, n2.subnet).unwrap();
    assert_eq!(p["path_mtu"].as_u64(), Some(1500), "{p}");
    assert!(
        ping_df(&n1.node.pods[0].ns, n2.node.pods[0].ip, 1372, 3),
        "1400-byte DF packets cross between the pods"
    );

    // A real cut is seen within the interval and its retries, and its
    // end.
    let lift = cut(&c.underlay.ns, n1.node.ip, n2.node.ip);
    let within = weft_tests::scaled(Duration::from_secs(INTERVAL * 4 + 5));
    wait_state(n1, n2.subnet, "unreachable", within);
    lift();
    wait_state(n1, n2.subnet, "reachable", within);
    // The cut took the measured size with it; the path is measured again
    // at 1500, not at the size the forged messages name.
    if weft_tests::agent::poll(within, || {
        (peer(n1, n2.subnet)?["path_mtu"].as_u64()? == 1500).then_some(())
    })
    .is_none()
    {
        panic!(
            "the path was not measured again at 1500: {}; the agent says:\n{}",
            peer(n1, n2.subnet).unwrap_or_default(),
            n1.agent
                .log()
                .lines()
                .filter(|l| l.contains("path MTU"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    drop(flood);
}
