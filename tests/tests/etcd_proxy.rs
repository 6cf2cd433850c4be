//! Agents through the etcd gRPC proxy (`etcd grpc-proxy start`, Debian's
//! etcd 3.4) in front of a 3-member cluster, as a cluster past a few
//! thousand nodes runs them (one watch per key range reaches etcd, however
//! many agents): they join with distinct subnets, and a lease change reaches
//! every agent after each fault: a member killed (the leader), the proxy
//! itself restarted, a member back.

use std::{collections::HashSet, time::Duration};

use weft_tests::{
    agent::eventually,
    cluster::{Node, Underlay},
    etcd_cluster::{EtcdCluster, Options},
    etcd_proxy::EtcdProxy,
    swarm::Swarm,
    weft_cluster::{CONFIG, PREFIX},
};

const AGENTS: usize = 20;
const T: Duration = Duration::from_secs(60);

/// A lease of a node outside the swarm, the `i`-th.
fn put_lease(ec: &EtcdCluster, i: u32) {
    let key = format!("{PREFIX}/subnets/10.244.{}.0-24", 200 + i);
    let value = format!(
        r#"{{"PublicIP":"192.168.78.{}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:01:{:02x}"}}}}"#,
        i + 1,
        i + 1
    );
    eventually(&format!("putting {key}"), T, || {
        ec.etcdctl(&["put", &key, &value]).ok()
    });
}

/// Waits until every agent has `n` peers.
fn all_see(s: &Swarm, ns: &weft_tests::netns::Netns, n: usize, after: &str) {
    eventually(&format!("every agent sees {n} peers {after}"), T, || {
        let peers = s.metric(ns, "weft_peers");
        peers.iter().all(|p| *p == Some(n as f64)).then_some(())
    });
}

#[test]
fn agents_through_the_grpc_proxy_see_every_change_after_each_fault() {
    let underlay = Underlay::new().unwrap();
    let mut ec = EtcdCluster::start(&underlay, 3, Options::default()).unwrap();
    ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])
        .unwrap();
    let mut proxy = EtcdProxy::start(&underlay, "198.18.0.250", &ec.endpoints()).unwrap();
    let node = Node::new(&underlay, 1).unwrap();
    let ns = &node.ns;
    let s = Swarm::start(ns, node.ip, AGENTS, &proxy.endpoint(), 21_000, &[]).unwrap();
    eventually("every agent holds a subnet", T, || {
        s.subnets().iter().all(Option::is_some).then_some(())
    });
    let subnets: HashSet<String> = s.subnets().into_iter().flatten().collect();
    assert_eq!(subnets.len(), AGENTS, "distinct subnets through the proxy");
    all_see(&s, ns, AGENTS - 1, "at the start");
    eventually("every agent ready", T, || {
        s.ready(ns).iter().all(|r| *r).then_some(())
    });

    // The leader killed: the proxy moves to another member.
    let leader = ec.leader().unwrap();
    ec.kill(leader);
    put_lease(&ec, 0);
    all_see(&s, ns, AGENTS, "with the leader killed");

    // The proxy restarted: every agent's watch breaks and starts again.
    proxy.restart().unwrap();
    put_lease(&ec, 1);
    all_see(&s, ns, AGENTS + 1, "after the proxy's restart");
    eventually("every agent ready again", T, || {
        s.ready(ns).iter().all(|r| *r).then_some(())
    });

    // The member back, the next one killed.
    ec.restart(leader, None).unwrap();
    ec.kill((leader + 1) % 3);
    put_lease(&ec, 2);
    all_see(&s, ns, AGENTS + 2, "with another member killed");

    let lists = s.metric(ns, "weft_watch_lists_total");
    let resumes = s.metric(ns, "weft_watch_resumes_total");
    println!("lists per agent: {lists:?}\nresumes per agent: {resumes:?}");
    assert!(
        lists.iter().all(|l| *l == Some(1.0)),
        "no agent listed again through the faults: {lists:?}"
    );
    assert!(
        resumes.iter().all(|r| r.is_some_and(|r| r >= 1.0)),
        "the proxy's restart broke every watch: {resumes:?}"
    );
}
