//! Dual-stack and IPv6-only leases against a real etcd, with real `weft
//! agent` processes (`--datapath none`): the fencing of IPv4 leases holds
//! for both halves of a dual-stack lease (the seed scenario, races, clones,
//! a flannel node's lease taken over), and IPv6-only leases are unique.

use std::{collections::HashSet, time::Duration};

use etcd_client::{Client, GetOptions};
use weft::lease::{LeaseAttrs, Subnets, parse_key};
use weft_tests::{
    agent::{Agent, eventually},
    etcd::Etcd,
    weft_cluster::PREFIX,
};

const DUAL: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:5::/48","Backend":{"Type":"vxlan"}}"#;
const T: Duration = Duration::from_secs(30);

fn args(etcd: &Etcd, node: &str, i: u16, ttl: u64) -> Vec<String> {
    [
        "--datapath",
        "none",
        "--etcd-endpoints",
        &etcd.endpoint,
        "--node-id",
        node,
        "--public-ip",
        &format!("198.18.{}.{}", i >> 8, i & 0xff),
        "--public-ipv6",
        &format!("fd00:18::{i:x}"),
        "--subnet-lease-ttl",
        &ttl.to_string(),
        "--retry-interval",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn setup(config: &str) -> (Etcd, Client) {
    weft_tests::require_root();
    let etcd = Etcd::start().unwrap();
    let mut c = etcd.client().await;
    c.put(format!("{PREFIX}/config"), config, None)
        .await
        .unwrap();
    (etcd, c)
}

/// Every key under the subnets prefix: (key suffix, value, version).
async fn leases(c: &mut Client) -> Vec<(String, String, i64)> {
    let r = c
        .get(
            format!("{PREFIX}/subnets/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    r.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str()
                    .unwrap()
                    .strip_prefix(&format!("{PREFIX}/subnets/"))
                    .unwrap()
                    .to_string(),
                kv.value_str().unwrap().to_string(),
                kv.version(),
            )
        })
        .collect()
}

fn wait_subnets(a: &Agent) -> Subnets {
    eventually(&format!("{} writes its subnet file", a.name), T, || {
        a.subnets().filter(|s| s.v4.is_some() && s.v6.is_some())
    })
}

/// subnet.env naming `s`, as the agent would have left it.
fn subnet_file(s: &Subnets) -> String {
    let (v4, v6) = (s.v4.unwrap(), s.v6.unwrap());
    format!(
        "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET={}/{}\nFLANNEL_IPV6_NETWORK=fd00:5::/48\nFLANNEL_IPV6_SUBNET={}/{}\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=false\n",
        weft::lease::first_host(&v4),
        v4.prefix_len(),
        weft::lease::first_host6(&v6),
        v6.prefix_len()
    )
}

/// flannel #1289 for a dual-stack lease: A acquires; A's key is deleted; B
/// starts with a subnet file naming A's subnets and gets them; A starts
/// again with its stale file: A gets other subnets of both families, and
/// B's key is never written again.
#[tokio::test(flavor = "multi_thread")]
async fn seed_scenario_for_a_dual_stack_lease() {
    let (etcd, mut c) = setup(DUAL).await;
    let mut a = Agent::start("a", None, &args(&etcd, "node-a", 1, 600)).unwrap();
    let sa = wait_subnets(&a);
    a.kill();
    let key = sa.key();
    assert!(key.contains('&'), "{key}");
    c.delete(format!("{PREFIX}/subnets/{key}"), None)
        .await
        .unwrap();

    let b = Agent::start_with_file("b", None, &args(&etcd, "node-b", 2, 600), &subnet_file(&sa))
        .unwrap();
    // The file was seeded: wait for B's own write of it.
    b.wait_log_count("wrote the subnet file", 1, T).unwrap();
    assert_eq!(
        b.subnets(),
        Some(sa),
        "B took the free subnets its file names"
    );
    let before = leases(&mut c).await;
    let (_, b_value, b_version) = before.iter().find(|(k, _, _)| *k == key).unwrap().clone();
    assert!(b_value.contains("\"WeftNodeID\":\"node-b\""), "{b_value}");

    a.restart().unwrap();
    a.wait_log_count("wrote the subnet file", 2, T).unwrap();
    let sa2 = a.subnets().unwrap();
    assert_ne!(sa2.v4, sa.v4, "A got another IPv4 subnet");
    assert_ne!(sa2.v6, sa.v6, "A got another IPv6 subnet");

    let after = leases(&mut c).await;
    let (_, value, version) = after.iter().find(|(k, _, _)| *k == key).unwrap();
    assert_eq!(
        (value, *version),
        (&b_value, b_version),
        "B's key untouched"
    );
    assert_eq!(*version, 1);
    drop(b);
}

/// 40 agents at once on a dual-stack network with 31 subnets of each
/// family: 31 hold a lease, every IPv4 and every IPv6 subnet has exactly
/// one holder, the others report "out of subnets".
#[tokio::test(flavor = "multi_thread")]
async fn race_of_40_agents_for_31_dual_stack_subnets() {
    let (etcd, mut c) = setup(
        r#"{"Network":"10.6.0.0/22","SubnetLen":27,"EnableIPv6":true,"IPv6Network":"fd00:6::/120","IPv6SubnetLen":125,"Backend":{"Type":"vxlan"}}"#,
    )
    .await;
    let agents: Vec<Agent> = (0..40)
        .map(|i| {
            Agent::start(
                &format!("r{i}"),
                None,
                &args(&etcd, &format!("race-{i}"), 256 + i, 600),
            )
            .unwrap()
        })
        .collect();
    let held = eventually("31 leases held", Duration::from_secs(60), || {
        let h: Vec<(usize, Subnets)> = agents
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.subnets().map(|s| (i, s)))
            .collect();
        (h.len() == 31).then_some(h)
    });
    let v4: HashSet<_> = held.iter().map(|(_, s)| s.v4.unwrap()).collect();
    let v6: HashSet<_> = held.iter().map(|(_, s)| s.v6.unwrap()).collect();
    assert_eq!((v4.len(), v6.len()), (31, 31), "no subnet held twice");
    for (i, a) in agents.iter().enumerate() {
        if held.iter().all(|(j, _)| *j != i) {
            a.wait_metric("weft_out_of_subnets_total", |n| n >= 1.0, T)
                .unwrap();
        }
        assert!(a.running(), "{} runs", a.name);
    }
    // Each key in etcd names the agent whose file names its subnets.
    let keys = leases(&mut c).await;
    assert_eq!(keys.len(), 31);
    for (i, s) in &held {
        let (_, value, _) = keys.iter().find(|(k, _, _)| *k == s.key()).unwrap();
        let a = LeaseAttrs::parse(value.as_bytes()).unwrap();
        assert_eq!(a.node_id.as_deref(), Some(format!("race-{i}").as_str()));
    }
}

/// IPv6-only: 20 agents at once, all distinct, keys in flannel's form.
#[tokio::test(flavor = "multi_thread")]
async fn race_of_20_agents_on_an_ipv6_only_network() {
    let (etcd, mut c) = setup(
        r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:7::/56","Backend":{"Type":"vxlan"}}"#,
    )
    .await;
    let agents: Vec<Agent> = (0..20)
        .map(|i| {
            let mut a = args(&etcd, &format!("v6-{i}"), 512 + i, 600);
            // No IPv4 VTEP on an IPv6-only node.
            let p = a.iter().position(|x| x == "--public-ip").unwrap();
            a.drain(p..p + 2);
            Agent::start(&format!("s{i}"), None, &a).unwrap()
        })
        .collect();
    let subnets = eventually("20 leases", Duration::from_secs(60), || {
        let s: Vec<Subnets> = agents.iter().filter_map(|a| a.subnets()).collect();
        (s.len() == 20).then_some(s)
    });
    let distinct: HashSet<_> = subnets.iter().map(|s| s.v6.unwrap()).collect();
    assert_eq!(distinct.len(), 20);
    assert!(subnets.iter().all(|s| s.v4.is_none()));
    let keys = leases(&mut c).await;
    assert_eq!(keys.len(), 20);
    for (k, v, _) in &keys {
        assert!(k.starts_with("0.0.0.0-0&fd00:7:0:"), "{k}");
        assert_eq!(parse_key(k).unwrap().v4, None);
        let a = LeaseAttrs::parse(v.as_bytes()).unwrap();
        assert!(
            a.public_ip.is_unspecified() && a.public_ipv6.is_some(),
            "{v}"
        );
    }
}

/// A clone (same addresses, another node id, a copy of the subnet file)
/// never shares either subnet: it takes the address's lease over, A takes
/// it back, both report the conflict, and A's key is the only one; a
/// restart keeps both subnets.
#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_both_subnets_and_a_clone_shares_neither() {
    let (etcd, mut c) = setup(DUAL).await;
    let mut a = Agent::start("a", None, &args(&etcd, "node-a", 1, 600)).unwrap();
    let sa = wait_subnets(&a);
    a.kill();
    std::fs::remove_file(a.subnet_file()).unwrap();
    a.restart().unwrap();
    assert_eq!(wait_subnets(&a), sa, "same subnets after a restart");
    assert_eq!(leases(&mut c).await.len(), 1);

    let clone = Agent::start_with_file(
        "clone",
        None,
        &args(&etcd, "node-a-clone", 1, 600),
        &subnet_file(&sa),
    )
    .unwrap();
    for agent in [&a, &clone] {
        agent
            .wait_metric("weft_public_ip_conflict", |v| v == 1.0, T)
            .unwrap();
    }
    let keys = leases(&mut c).await;
    assert_eq!(keys.len(), 1, "one key for both subnets: {keys:?}");
    let (k, v, _) = &keys[0];
    assert_eq!(*k, sa.key());
    assert!(v.contains("\"WeftNodeID\":\"node-a\""), "A holds it: {v}");
    drop(clone);
}

/// A dual-stack lease flannel wrote for this node's address (no node id,
/// subnets of another pairing than Weft's) is taken over in place: the node
/// keeps both subnets, as a node moving from flannel to Weft must.
#[tokio::test(flavor = "multi_thread")]
async fn a_flannel_dual_stack_lease_is_taken_over_in_place() {
    let (etcd, mut c) = setup(DUAL).await;
    let key = format!("{PREFIX}/subnets/10.5.77.0-24&fd00:5:0:3::-64");
    c.put(
        key.as_str(),
        r#"{"PublicIP":"198.18.0.1","PublicIPv6":"fd00:18::1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"},"BackendV6Data":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:46"}}"#,
        None,
    )
    .await
    .unwrap();
    let a = Agent::start("a", None, &args(&etcd, "node-a", 1, 600)).unwrap();
    let s = wait_subnets(&a);
    assert_eq!(s.key(), "10.5.77.0-24&fd00:5:0:3::-64");
    let keys = leases(&mut c).await;
    assert_eq!(keys.len(), 1);
    assert!(
        keys[0].1.contains("\"WeftNodeID\":\"node-a\""),
        "{}",
        keys[0].1
    );
}
