//! Continuous peer health: every agent probes every peer through the
//! tunnel, always. A node cut off from another (VXLAN dropped on the
//! underlay's switch between the two) is reported unreachable by both
//! within the probe interval and its retries, and reachable again once the
//! drop is lifted; a flannel node is probed too; with 1,000 peers the
//! probes stay within their rate bound and the agent's CPU stays low.

use std::{net::Ipv4Addr, time::Duration};

use ipnet::Ipv4Net;
use weft_tests::{
    agent::eventually,
    cluster::Node,
    netns::Netns,
    weft_cluster::{ETCD_IP, PREFIX, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
/// The probe interval the agents run with here.
const INTERVAL: u64 = 4;

/// Drops VXLAN between `a` and `b` (both ways) on the underlay's switch;
/// returns what lifts it.
fn cut<'a>(switch: &'a Netns, a: Ipv4Addr, b: Ipv4Addr) -> impl FnOnce() + 'a {
    switch
        .exec("nft", &["add", "table", "bridge", "health"])
        .unwrap();
    let chain = format!(
        "{{ type filter hook forward priority 0; policy accept; ip saddr {a} ip daddr {b} udp dport 8472 drop; ip saddr {b} ip daddr {a} udp dport 8472 drop; }}"
    );
    switch
        .exec("nft", &["add", "chain", "bridge", "health", "cut", &chain])
        .unwrap();
    move || {
        switch
            .exec("nft", &["delete", "table", "bridge", "health"])
            .unwrap();
    }
}

/// The state `n`'s status report gives the peer `subnet`.
fn state(n: &WeftNode, subnet: Ipv4Net) -> Option<String> {
    let r = n.status_json()?;
    r["peer_health"]
        .as_array()?
        .iter()
        .find(|p| p["subnet"].as_str() == Some(&subnet.to_string()))
        .and_then(|p| p["state"].as_str().map(str::to_string))
}

fn wait_state(n: &WeftNode, subnet: Ipv4Net, want: &str, within: Duration) {
    eventually(
        &format!("{}: peer {subnet} {want}", n.agent.name),
        within,
        || (state(n, subnet).as_deref() == Some(want)).then_some(()),
    );
}

#[test]
fn a_cut_between_two_nodes_is_seen_by_both_and_its_end_too() {
    let interval = INTERVAL.to_string();
    let c = WeftCluster::new(3, &["--peer-probe-interval", &interval]).unwrap();
    c.wait_meshed(T);
    // A flannel node (its kernel vxlan device answers for its subnet).
    let flannel = Node::new(&c.underlay, 4).unwrap();
    let fsub = c.free_subnets(1)[0];
    c.flannel_up(&flannel, fsub);
    let subnets: Vec<Ipv4Net> = c.nodes.iter().map(|n| n.subnet).collect();
    for n in &c.nodes {
        n.wait_metric("weft_peers_reachable", |v| v == 3.0, T);
        wait_state(n, fsub, "reachable", T);
        assert!(
            n.metric("weft_peer_rtt_seconds_count") > 0.0,
            "round trips are measured"
        );
        assert_eq!(n.metric("weft_peers_unreachable"), 0.0);
        // Aggregates only, by default.
        assert!(n.series("weft_peer_reachable{").is_none());
    }
    let status = c.nodes[0].weft(&["status"]).unwrap();
    let line = status
        .lines()
        .find(|l| l.contains(&fsub.to_string()))
        .unwrap_or_else(|| panic!("the flannel peer is listed: {status}"));
    assert!(line.contains("reachable") && line.contains(" ms"), "{line}");
    // Its path MTU is measured through its kernel vxlan device too.
    eventually("the flannel peer's path MTU", T, || {
        let s = c.nodes[0].weft(&["status"]).ok()?;
        s.lines()
            .find(|l| l.contains(&fsub.to_string()))?
            .contains("1500 (measured")
            .then_some(())
    });

    // VXLAN between nodes 1 and 2 dropped on the way: both see it within
    // the interval and the retries of three timed-out probes.
    let lift = cut(&c.underlay.ns, c.nodes[0].node.ip, c.nodes[1].node.ip);
    let within = Duration::from_secs(INTERVAL + 6);
    let t0 = std::time::Instant::now();
    wait_state(&c.nodes[0], subnets[1], "unreachable", within);
    wait_state(&c.nodes[1], subnets[0], "unreachable", within);
    println!("cut seen by both in {:?}", t0.elapsed());
    for n in &c.nodes[..2] {
        n.wait_metric("weft_peers_unreachable", |v| v == 1.0, T);
        assert_eq!(n.metric("weft_peers_reachable"), 2.0);
    }
    assert_eq!(
        c.nodes[2].metric("weft_peers_unreachable"),
        0.0,
        "node 3 is not cut"
    );
    let status = c.nodes[0].weft(&["status"]).unwrap();
    assert!(
        status.contains("unreachable") && status.contains("last probe: no answer"),
        "{status}"
    );
    assert!(c.nodes[0].metric("weft_peer_probes_total{result=\"lost\"}") >= 3.0);

    lift();
    wait_state(&c.nodes[0], subnets[1], "reachable", within);
    wait_state(&c.nodes[1], subnets[0], "reachable", within);
    for n in &c.nodes {
        n.wait_metric("weft_peers_reachable", |v| v == 3.0, T);
    }
}

/// With 1,000 peers (leases of nodes that do not exist), probes stay under
/// the rate bound, the period stretches to fit it, and the agent's CPU
/// stays low; per-peer series exist where asked for.
#[test]
fn a_thousand_peers_are_probed_within_the_rate_bound() {
    const RATE: f64 = 20.0;
    let config = r#"{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;
    let c = WeftCluster::with_config(1, config, &["--peer-probe-rate", "20", "--peer-metrics"])
        .unwrap();
    let n = &c.nodes[0];
    c.underlay
        .ns
        .run(|| -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let mut client =
                    etcd_client::Client::connect([format!("http://{ETCD_IP}:2379")], None).await?;
                let keys: Vec<u32> = (1000..2000).collect();
                for chunk in keys.chunks(100) {
                    let ops: Vec<etcd_client::TxnOp> = chunk
                        .iter()
                        .map(|k| {
                            let s = Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (k << 8)), 24)
                                .unwrap();
                            let vtep = Ipv4Addr::from(0xc615_0000u32 + k);
                            etcd_client::TxnOp::put(
                                format!("{PREFIX}/subnets/{}", weft::lease::to_key(&s)),
                                format!(
                                    r#"{{"PublicIP":"{vtep}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:bb:00:00:{:02x}:{:02x}"}}}}"#,
                                    k >> 8,
                                    k & 0xff
                                ),
                                None,
                            )
                        })
                        .collect();
                    client.txn(etcd_client::Txn::new().and_then(ops)).await?;
                }
                anyhow::Ok(())
            })
        })
        .unwrap()
        .unwrap();
    n.wait_metric("weft_peers", |v| v == 1000.0, T);
    // Path MTU probes take a quarter of the bound: the health probes'
    // period stretches to 1000 / 15 s.
    n.wait_metric(
        "weft_peer_probe_period_seconds",
        |v| (v - 1000.0 / 15.0).abs() < 0.01,
        T,
    );
    // Every probe: health's, and the path MTU search's (the fake peers
    // answer neither).
    let probes = |n: &WeftNode| {
        ["answered", "lost", "failed"]
            .iter()
            .map(|r| n.metric(&format!("weft_peer_probes_total{{result=\"{r}\"}}")))
            .sum::<f64>()
            + ["answered", "unanswered"]
                .iter()
                .map(|r| n.metric(&format!("weft_path_mtu_probes_total{{result=\"{r}\"}}")))
                .sum::<f64>()
    };
    let cpu = |pid: i32| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        // utime and stime, fields 14 and 15 (11 and 12 after the name).
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        ticks / 100.0
    };
    std::thread::sleep(Duration::from_secs(2));
    let (p0, c0, t0) = (probes(n), cpu(n.agent.pid()), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let (p1, c1, secs) = (probes(n), cpu(n.agent.pid()), t0.elapsed().as_secs_f64());
    let rate = (p1 - p0) / secs;
    let busy = (c1 - c0) / secs;
    println!(
        "1000 peers: {rate:.1} probes/s (bound {RATE}), agent CPU {:.1}%",
        busy * 100.0
    );
    assert!(rate <= RATE * 1.1, "{rate:.1} probes a second");
    assert!(rate >= RATE * 0.5, "the probes go on: {rate:.1} a second");
    assert!(busy < 0.10, "agent CPU {:.1}% of one core", busy * 100.0);
    // Per-peer series, as asked: the peers that do not exist are not
    // reachable.
    assert_eq!(
        n.series("weft_peer_reachable{subnet=\"10.3.232.0/24\",vtep=\"198.21.3.232\"}")
            .map(|v| v < 1.0),
        Some(true)
    );
    assert_eq!(n.metric("weft_peers_reachable"), 0.0);
}
