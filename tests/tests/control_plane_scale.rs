//! A hundred real agents (`--datapath none`: the real lease code) on a
//! 3-member etcd, through what a large cluster's control plane meets:
//! counts, not times (the times are `cargo xtask bench scale`'s).
//!
//! - All start at once: a hundred distinct subnets.
//! - Steady state: etcd receives fewer than 0.02 messages per agent per
//!   second.
//! - Every member restarted, then the leader killed: no agent lists the
//!   leases again (each starts its watch after the revision it had), and
//!   their reconnections are spread out, not all within one step.
//! - A compaction past the agents' revision while they are cut off from
//!   etcd: each lists exactly once.
//! - Agents restarted: they resume from the leases they kept (no list) and
//!   keep their subnets.
//! - At the end, every agent's view is etcd's, lease for lease.

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant},
};

use weft_tests::{
    agent::eventually,
    cluster::{Node, Underlay},
    etcd_cluster::{EtcdCluster, Options},
    etcd_fill::{messages, revisions},
    swarm::{Swarm, log_time},
    weft_cluster::{CONFIG, PREFIX},
};

const AGENTS: usize = 100;
const T: Duration = Duration::from_secs(60);

/// Messages every member received, summed.
fn received(ec: &EtcdCluster) -> f64 {
    ec.members
        .iter()
        .filter_map(|m| messages(&m.ns, m.ip.parse().unwrap()).ok())
        .map(|(r, _)| r)
        .sum()
}

/// When each agent's watch last reconnected (seconds of the day), from its
/// log: the `n`-th reconnection of each.
fn reconnections(s: &Swarm, n: usize) -> Vec<f64> {
    s.agents
        .iter()
        .filter_map(|a| {
            a.log()
                .lines()
                .filter(|l| l.contains("lease watch reconnected"))
                .nth(n - 1)
                .and_then(log_time)
        })
        .collect()
}

/// The most reconnections within any 100 ms.
fn densest(times: &[f64]) -> usize {
    let mut t = times.to_vec();
    t.sort_by(f64::total_cmp);
    (0..t.len())
        .map(|i| t[i..].iter().take_while(|x| **x - t[i] < 0.1).count())
        .max()
        .unwrap_or(0)
}

fn all<T: PartialEq + std::fmt::Debug>(what: &str, got: &[Option<T>], want: T) -> Option<()> {
    let off: Vec<usize> = (0..got.len())
        .filter(|i| got[*i].as_ref() != Some(&want))
        .collect();
    if off.is_empty() {
        return Some(());
    }
    println!(
        "{what}: {} agents off (first: {:?})",
        off.len(),
        got[off[0]]
    );
    None
}

fn put_lease(ec: &EtcdCluster, i: u32) {
    let key = format!("{PREFIX}/subnets/10.244.{}.0-24", 250 + i);
    let value = format!(
        r#"{{"PublicIP":"192.168.77.{}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:00:{:02x}"}}}}"#,
        i + 1,
        i + 1
    );
    // Retried: right after a member dies the others may still be electing.
    eventually(&format!("putting {key}"), T, || {
        ec.etcdctl(&["put", &key, &value]).ok()
    });
}

#[test]
fn a_hundred_agents_through_restarts_a_leader_kill_and_a_compaction() {
    let underlay = Underlay::new().unwrap();
    let mut ec = EtcdCluster::start(&underlay, 3, Options::default()).unwrap();
    ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])
        .unwrap();
    let node = Node::new(&underlay, 1).unwrap();
    let ns = &node.ns;
    let started = Instant::now();
    let mut s = Swarm::start(ns, node.ip, AGENTS, &ec.endpoints(), 20_000, &[]).unwrap();
    eventually("every agent holds a subnet", T, || {
        let subnets: Vec<Option<String>> = s.subnets();
        subnets.iter().all(Option::is_some).then_some(subnets)
    });
    let subnets: HashSet<String> = s.subnets().into_iter().flatten().collect();
    assert_eq!(subnets.len(), AGENTS, "{AGENTS} distinct subnets");
    println!(
        "{AGENTS} agents hold distinct subnets {:?} after start",
        started.elapsed()
    );
    eventually("every agent ready, with every other as a peer", T, || {
        let r = s.ready(ns);
        let peers = s.metric(ns, "weft_peers");
        (r.iter().all(|r| *r) && all("peers", &peers, (AGENTS - 1) as f64).is_some()).then_some(())
    });

    // Steady state.
    let before = received(&ec);
    assert!(before > 0.0, "etcd counts the messages it receives");
    let quiet = Duration::from_secs(60);
    std::thread::sleep(quiet);
    let rate = (received(&ec) - before) / quiet.as_secs_f64() / AGENTS as f64;
    println!("steady state: etcd received {rate:.4} messages per agent per second");
    assert!(rate < 0.02, "{rate} messages per agent per second");

    // Every member restarted.
    for i in 0..3 {
        ec.kill(i);
    }
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..3 {
        ec.restart(i, None).unwrap();
    }
    eventually("every agent ready again after etcd's restart", T, || {
        s.ready(ns).iter().all(|r| *r).then_some(())
    });
    let times = reconnections(&s, 1);
    assert_eq!(times.len(), AGENTS, "every watch reconnected");
    let spread = times.iter().copied().fold(f64::MIN, f64::max)
        - times.iter().copied().fold(f64::MAX, f64::min);
    println!(
        "etcd restarted: reconnections over {spread:.2} s, at most {} in 100 ms",
        densest(&times)
    );
    assert!(spread >= 0.5, "spread over {spread} s only");
    assert!(
        densest(&times) <= AGENTS / 2,
        "{} in 100 ms",
        densest(&times)
    );
    assert!(
        all("lists", &s.metric(ns, "weft_watch_lists_total"), 1.0).is_some(),
        "no list after etcd's restart"
    );

    // The leader killed, and back.
    let leader = ec.leader().unwrap();
    ec.kill(leader);
    put_lease(&ec, 0);
    eventually(
        "every agent sees a new lease with the leader gone",
        T,
        || all("peers", &s.metric(ns, "weft_peers"), AGENTS as f64),
    );
    ec.restart(leader, None).unwrap();
    assert!(
        all("lists", &s.metric(ns, "weft_watch_lists_total"), 1.0).is_some(),
        "no list after the leader's death"
    );

    // Cut off while a lease is put and the history compacted past it.
    let resumes: Vec<Option<f64>> = s.metric(ns, "weft_watch_resumes_total");
    ns.cut_tcp_out(2379).unwrap();
    eventually("every agent's watch broke", T, || {
        let now = s.metric(ns, "weft_watch_resumes_total");
        (0..AGENTS)
            .all(|i| now[i].unwrap_or(0.0) > resumes[i].unwrap_or(0.0))
            .then_some(())
    });
    put_lease(&ec, 1);
    // One more revision: `compact R` keeps R itself.
    ec.etcdctl(&["put", "/weft-test/bump", "1"]).unwrap();
    let rev = eventually("etcd's revision", T, || {
        ec.etcdctl(&["get", "x", "-w", "json"]).ok()
    });
    let rev = serde_json::from_str::<serde_json::Value>(&rev).unwrap()["header"]["revision"]
        .as_i64()
        .unwrap();
    ec.etcdctl(&["compact", &rev.to_string()]).unwrap();
    ns.uncut().unwrap();
    eventually("every agent sees the lease put meanwhile", T, || {
        all("peers", &s.metric(ns, "weft_peers"), (AGENTS + 1) as f64)
    });
    assert!(
        all("lists", &s.metric(ns, "weft_watch_lists_total"), 2.0).is_some(),
        "exactly one list after the compaction"
    );

    // Ten agents restarted: from what they kept.
    std::thread::sleep(Duration::from_secs(31)); // the leases are kept every 30 s
    for a in &mut s.agents[..10] {
        let subnet = a.subnet();
        a.restart().unwrap();
        a.wait_subnet(T).unwrap();
        assert_eq!(a.subnet(), subnet, "{} keeps its subnet", a.name);
    }
    eventually("the restarted agents ready", T, || {
        s.ready(ns).iter().all(|r| *r).then_some(())
    });
    let lists = s.metric(ns, "weft_watch_lists_total");
    assert!(
        lists[..10].iter().all(|l| *l == Some(0.0)),
        "a restart lists nothing: {:?}",
        &lists[..10]
    );
    for a in &s.agents[..10] {
        assert!(
            a.log().contains("holding the subnet held at the last stop"),
            "{} adopted its key",
            a.name
        );
    }

    // Every agent's view is etcd's: what each kept at its stop.
    s.stop();
    let etcd = revisions(ns, &ec.endpoints(), &format!("{PREFIX}/subnets/")).unwrap();
    assert_eq!(etcd.len(), AGENTS + 2);
    for a in &s.agents {
        let kept = std::fs::read_to_string(a.state_dir().join("leases.json")).unwrap();
        let kept: serde_json::Value = serde_json::from_str(&kept).unwrap();
        let view: BTreeMap<String, i64> = kept["leases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["key"].as_str().unwrap().to_string(),
                    l["mod_revision"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(view, etcd, "{}'s view", a.name);
    }
}
