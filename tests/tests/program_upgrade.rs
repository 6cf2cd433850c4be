//! Upgrades of the programs that test themselves: an agent whose programs
//! fail the self-test leaves the running ones in the links; one whose
//! programs pass swaps them in; `weft rollback` puts the previous ones
//! back. Under a 100 pps ping and a paced UDP stream between pods on two
//! nodes, nothing is lost at any step. A node never reports Ready with
//! programs that do not reach its peers: not after an agent killed within
//! its swap's grace, not after a restart with nothing pinned.

use std::{collections::BTreeMap, path::Path, time::Duration};

use dataplane_common::Reason;
use weft::dataplane::Counters;
use weft_tests::{
    agent::eventually,
    proc::run,
    traffic::{StreamOutcome, ping_outcome, ping_run, udp_stream},
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

/// The program id in each of a node's pinned links, by link pin name.
fn link_programs(n: &WeftNode) -> BTreeMap<String, u64> {
    let dir = n.pins.path().join("links");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        out.insert(
            path.file_name().unwrap().to_string_lossy().into_owned(),
            prog_id(&path),
        );
    }
    assert!(!out.is_empty(), "no pinned links in {}", dir.display());
    out
}

fn prog_id(link: &Path) -> u64 {
    let out = run(
        "bpftool",
        &["-j", "link", "show", "pinned", link.to_str().unwrap()],
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["prog_id"].as_u64().unwrap()
}

/// Pod-to-pod traffic for one step: a 100 pps ping from node 1's pod to
/// node 2's, and a UDP stream of 50 datagrams a second the other way.
struct Traffic {
    ping: std::process::Child,
    udp: std::thread::JoinHandle<StreamOutcome>,
    /// Each node's counters when the step began, to say where a loss went.
    counters: Vec<NodeCounters>,
}

/// A node's name, its counters, and their packets when a step began.
type NodeCounters = (String, Counters, Vec<(Reason, u64)>);

impl Traffic {
    fn start(c: &WeftCluster, port: u16) -> Self {
        let counters = c
            .nodes
            .iter()
            .map(|n| {
                let k = Counters::open(n.pins.pins()).unwrap();
                let at = packets(&k);
                (n.agent.name.clone(), k, at)
            })
            .collect();
        let (a, b) = (&c.nodes[0].node.pods[0], &c.nodes[1].node.pods[0]);
        let ping = ping_run(&a.ns, b.ip, 800);
        let udp = udp_stream(&a.ns, a.ip, port, &b.ns, 400, Duration::from_millis(20));
        Self {
            ping,
            udp,
            counters,
        }
    }

    /// Waits for both to end; fails if anything was lost, naming what each
    /// node's programs counted during the step.
    fn none_lost(self, step: &str) {
        let (pings, answered) = ping_outcome(self.ping);
        let udp = self.udp.join().unwrap();
        let counted: Vec<String> = self
            .counters
            .iter()
            .map(|(name, k, before)| {
                let moved: Vec<String> = packets(k)
                    .iter()
                    .zip(before)
                    .filter(|((_, a), (_, b))| a != b)
                    .map(|((r, a), (_, b))| format!("{} +{}", r.name(), a - b))
                    .collect();
                format!("{name}: {}", moved.join(", "))
            })
            .collect();
        assert_eq!(
            (pings, answered),
            (800, 800),
            "{step}: pings sent, answered; counted {counted:?}"
        );
        assert_eq!(
            udp.counts(),
            (400, 400),
            "{step}: datagrams sent, received ({udp:?}); counted {counted:?}"
        );
        println!(
            "{step}: the UDP stream's longest silence: {:?}",
            udp.longest_gap
        );
    }
}

/// Every reason's packet count.
fn packets(k: &Counters) -> Vec<(Reason, u64)> {
    k.all()
        .unwrap()
        .into_iter()
        .map(|(r, c)| (r, c.packets))
        .collect()
}

fn restart(c: &mut WeftCluster, fault: bool) {
    for n in c.nodes.iter_mut() {
        let args = n.agent.args_mut();
        args.retain(|a| a != "--inject-fault" && a != "decap");
        if fault {
            args.extend(["--inject-fault".to_string(), "decap".to_string()]);
        }
        n.agent.restart().unwrap();
    }
    for n in &c.nodes {
        n.wait_dataplane_up(T);
    }
}

#[test]
fn a_faulty_upgrade_is_refused_a_good_one_swapped_and_rolled_back_without_loss() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let first: Vec<_> = c.nodes.iter().map(link_programs).collect();

    // Programs whose decapsulation drops what it should decapsulate: the
    // self-test catches it, the programs running keep running.
    let traffic = Traffic::start(&c, 7001);
    std::thread::sleep(Duration::from_millis(500));
    restart(&mut c, true);
    for (n, ids) in c.nodes.iter().zip(&first) {
        n.wait_metric("weft_upgrade_refused", |v| v == 1.0, T);
        assert!(
            n.metric("weft_selftest_cases{result=\"failed\"}") > 0.0,
            "the failed cases are counted"
        );
        assert_eq!(
            &link_programs(n),
            ids,
            "the old programs are still attached"
        );
        let status = n.weft(&["status"]).unwrap();
        assert!(
            status.contains("UPGRADE REFUSED") && status.contains("failed: weft_decap"),
            "{status}"
        );
        let log = n.agent.log();
        let case = log
            .lines()
            .find(|l| l.contains("failed a self-test case"))
            .unwrap_or_else(|| panic!("the log names the failing cases: {log}"));
        println!("{case}");
        assert!(log.contains("upgrade refused"), "the log says so");
    }
    traffic.none_lost("a refused upgrade");

    // Correct programs: self-tested, swapped into every link.
    let traffic = Traffic::start(&c, 7002);
    std::thread::sleep(Duration::from_millis(500));
    restart(&mut c, false);
    let mut second = Vec::new();
    for (n, ids) in c.nodes.iter().zip(&first) {
        n.wait_metric("weft_upgrade_refused", |v| v == 0.0, T);
        assert_eq!(n.metric("weft_selftest_cases{result=\"failed\"}"), 0.0);
        let now = link_programs(n);
        for (link, id) in ids {
            assert_ne!(now.get(link), Some(id), "{link}: the new program is in");
        }
        second.push(now);
    }
    traffic.none_lost("an upgrade");

    // Rollback: the previous programs back in every link; the agent
    // follows instead of attaching its own again.
    let traffic = Traffic::start(&c, 7003);
    std::thread::sleep(Duration::from_millis(500));
    for n in &c.nodes {
        let out = n.weft(&["rollback"]).unwrap();
        assert!(out.contains("rolled back"), "{out}");
    }
    for (n, ids) in c.nodes.iter().zip(&first) {
        assert_eq!(&link_programs(n), ids, "the previous programs are back");
        n.wait_metric("weft_programs_rolled_back", |v| v == 1.0, T);
    }
    std::thread::sleep(weft_tests::scaled(Duration::from_secs(3)));
    for (n, ids) in c.nodes.iter().zip(&first) {
        assert_eq!(&link_programs(n), ids, "the agent keeps the rollback");
    }
    traffic.none_lost("a rollback");

    // Rolling back again undoes the rollback.
    for (n, ids) in c.nodes.iter().zip(&second) {
        n.weft(&["rollback"]).unwrap();
        assert_eq!(&link_programs(n), ids, "rolled forward again");
    }
    assert!(c.all_pairs_reach().is_ok());
}

/// Programs that pass the self-test but lose the peers on the node's real
/// devices (a fault the golden frames cannot see) are rolled back by the
/// agent itself: the peers that answered before the swap do not answer
/// after it, so the programs that ran before go back into every link.
#[test]
fn an_upgrade_that_loses_the_peers_is_rolled_back_by_the_agent() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let first = link_programs(&c.nodes[1]);
    let n = &mut c.nodes[1];
    n.agent
        .args_mut()
        .extend(["--inject-fault".to_string(), "decap-live".to_string()]);
    n.agent.restart().unwrap();
    let n = &c.nodes[1];
    n.wait_dataplane_up(T);
    n.wait_metric("weft_programs_rolled_back", |v| v == 1.0, T);
    assert_eq!(
        n.metric("weft_upgrade_refused"),
        0.0,
        "the self-test passed"
    );
    assert_eq!(
        link_programs(n),
        first,
        "the old programs are back in every link"
    );
    let status = n.weft(&["status"]).unwrap();
    assert!(
        status.contains("ROLLED BACK by the agent") && status.contains("did not answer"),
        "{status}"
    );
    // The agent keeps them, and the pods reach each other again.
    std::thread::sleep(weft_tests::scaled(Duration::from_secs(3)));
    assert_eq!(link_programs(n), first);
    assert!(c.all_pairs_reach().is_ok());
}

/// Watches a node's readiness until its agent has rolled back, or until
/// `within`; fails if the node reports Ready before (with programs that
/// do not reach the peers). Returns whether it rolled back.
fn never_ready_before_rollback(n: &WeftNode, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        let ready = n.series("weft_ready");
        let rolled_back = n.series("weft_programs_rolled_back");
        if rolled_back == Some(1.0) {
            return true;
        }
        assert_ne!(
            ready,
            Some(1.0),
            "{}: ready with programs that lose the peers; log:\n{}",
            n.agent.name,
            n.agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// An upgrade to programs that pass the self-test but lose the peers,
/// whose agent is killed between the swap and its check (an OOM kill, a
/// second rollout): the build it replaced stays pinned, and the next
/// start of the same bad build, with nothing answering through the
/// programs in the links, checks them once its peer table is complete,
/// rolls back to the good ones, and only then reports Ready.
#[test]
fn a_kill_within_the_grace_keeps_the_good_programs_to_roll_back_to() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let n = &c.nodes[1];
    // Checked once the peer table was complete.
    n.wait_metric("weft_programs_verified", |v| v == 1.0, T);
    let good = link_programs(n);

    let n = &mut c.nodes[1];
    n.agent
        .args_mut()
        .extend(["--inject-fault".to_string(), "decap-live".to_string()]);
    n.agent.restart().unwrap();
    let n = &mut c.nodes[1];
    eventually("the bad programs are swapped in", T, || {
        (link_programs(n) != good).then_some(())
    });
    n.agent.kill();
    let bad = link_programs(n);

    n.agent.restart().unwrap();
    let n = &c.nodes[1];
    assert!(
        never_ready_before_rollback(n, weft_tests::scaled(Duration::from_secs(60))),
        "the agent rolled back; log:\n{}",
        n.agent.log()
    );
    assert_eq!(
        link_programs(n),
        good,
        "the good programs are back in every link"
    );
    assert_ne!(good, bad);
    n.wait_metric("weft_programs_verified", |v| v == 1.0, T);
    n.wait_metric("weft_ready", |v| v == 1.0, T);
    let status = n.weft(&["status"]).unwrap();
    assert!(status.contains("ROLLED BACK by the agent"), "{status}");
    assert!(c.all_pairs_reach().is_ok());
}

/// A restart with nothing pinned (a reboot) onto programs that pass the
/// self-test but lose the peers: nothing to roll back to, so the node is
/// never ready, says why, and checks again; the good build makes it ready.
#[test]
fn a_bad_build_on_a_rebooted_node_is_never_ready() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let n = &mut c.nodes[1];
    n.agent.stop().unwrap();
    let out = n.weft(&["teardown"]).unwrap();
    println!("{out}");
    n.agent
        .args_mut()
        .extend(["--inject-fault".to_string(), "decap-live".to_string()]);
    n.agent.restart().unwrap();
    let n = &c.nodes[1];
    n.wait_dataplane_up(T);
    n.agent
        .wait_log(
            "no verified programs are pinned to roll back to",
            weft_tests::scaled(T),
        )
        .unwrap();
    // Two more checks' worth of time: never ready.
    let until = std::time::Instant::now() + weft_tests::scaled(Duration::from_secs(12));
    while std::time::Instant::now() < until {
        assert_ne!(
            n.series("weft_ready"),
            Some(1.0),
            "ready without reaching the peers"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(n.metric("weft_programs_verified"), 0.0);
    let status = n.weft(&["status"]).unwrap();
    assert!(status.contains("NOT VERIFIED"), "{status}");

    let n = &mut c.nodes[1];
    n.agent
        .args_mut()
        .retain(|a| a != "--inject-fault" && a != "decap-live");
    n.agent.restart().unwrap();
    let n = &c.nodes[1];
    n.wait_dataplane_up(T);
    n.wait_metric("weft_programs_verified", |v| v == 1.0, T);
    n.wait_metric("weft_ready", |v| v == 1.0, T);
    assert!(c.all_pairs_reach().is_ok());
}

/// A peer that is down (its node powered off, its lease not yet expired)
/// proves nothing either way: a restart with nothing pinned, while the
/// only peer does not answer on the underlay, becomes ready, and says so.
#[test]
fn a_node_whose_peers_are_down_still_becomes_ready() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    c.nodes[0]
        .node
        .ns
        .exec("ip", &["link", "set", "eth0", "down"])
        .unwrap();
    let n = &mut c.nodes[1];
    n.agent.stop().unwrap();
    n.weft(&["teardown"]).unwrap();
    n.agent.restart().unwrap();
    let n = &c.nodes[1];
    n.wait_dataplane_up(T);
    n.agent
        .wait_log(
            "no sampled peer answers on the underlay",
            weft_tests::scaled(T),
        )
        .unwrap();
    n.wait_metric("weft_ready", |v| v == 1.0, T);
    c.nodes[0]
        .node
        .ns
        .exec("ip", &["link", "set", "eth0", "up"])
        .unwrap();
    assert!(c.all_pairs_reach().is_ok());
}

/// A build whose programs fail the self-test and whose maps would not fit
/// the running ones (another capacity here) stands down: the agent exits
/// saying so (a DaemonSet's rolling update stalls on it), and the running
/// programs keep their maps and go on forwarding.
#[test]
fn a_failing_build_that_needs_other_maps_stands_down() {
    let mut c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let first = link_programs(&c.nodes[1]);
    let peers = c.nodes[1]
        .pins
        .path()
        .join(format!("maps-v{}", dataplane_common::LAYOUT_VERSION))
        .join("WEFT_PEERS");
    let capacity = |pin: &Path| {
        let out = run(
            "bpftool",
            &["-j", "map", "show", "pinned", pin.to_str().unwrap()],
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["max_entries"].as_u64().unwrap()
    };
    let before = capacity(&peers);
    let n = &mut c.nodes[1];
    n.agent.args_mut().extend(
        ["--inject-fault", "decap", "--max-peers", "1024"]
            .iter()
            .map(|s| s.to_string()),
    );
    n.agent.restart().unwrap();
    let n = &c.nodes[1];
    eventually("the agent stands down", T, || {
        n.agent
            .log()
            .contains("this agent stands down")
            .then_some(())
    });
    eventually("the agent exits", T, || (!n.agent.running()).then_some(()));
    assert_eq!(link_programs(n), first, "the running programs stay");
    assert_eq!(capacity(&peers), before, "their maps stay as they were");
    assert!(c.all_pairs_reach().is_ok(), "and they forward");
}

/// The self-test's frames carry the node's own VNI and UDP port: on a
/// network on VNI 4096 and UDP 4789 it passes (a frame of another VNI or
/// port would be dropped or passed by the programs, and the cases
/// expecting decapsulation would fail) and the nodes forward. A node's
/// first start has nothing running to protect and runs no self-test; a
/// restart does.
#[test]
fn the_self_test_speaks_the_nodes_vni_and_port() {
    let config = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":4096,"Port":4789}}"#;
    let mut c = WeftCluster::with_config(2, config, &[]).unwrap();
    c.wait_meshed(T);
    for n in c.nodes.iter_mut() {
        n.wait_dataplane_up(T);
        assert!(!n.agent.log().contains("self-test of this build's programs"));
        assert!(n.series("weft_selftest_cases{result=\"passed\"}").is_none());
        n.agent.restart().unwrap();
    }
    for n in &c.nodes {
        n.wait_dataplane_up(T);
        let log = n.agent.log();
        let line = log
            .lines()
            .find(|l| l.contains("self-test of this build's programs"))
            .unwrap_or_else(|| panic!("the self-test is logged: {log}"));
        assert!(
            line.contains("failed=0") && line.contains("vni=4096") && line.contains("port=4789"),
            "{line}"
        );
        assert!(n.metric("weft_selftest_cases{result=\"passed\"}") > 50.0);
    }
    assert!(c.all_pairs_reach().is_ok());
}
