//! Subnet leases against a real etcd, with real `weft agent` processes
//! (`--datapath none`): the safety claims of the lease protocol, one test each.

use std::{collections::HashMap, time::Duration};

use etcd_client::{Client, GetOptions, PutOptions};
use weft_tests::{
    agent::{Agent, eventually, poll, weft},
    etcd::Etcd,
    weft_cluster::PREFIX,
};

const CONFIG: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;
const T: Duration = Duration::from_secs(30);

fn args(etcd: &Etcd, node: &str, ip: &str, ttl: u64) -> Vec<String> {
    [
        "--datapath",
        "none",
        "--etcd-endpoints",
        &etcd.endpoint,
        "--node-id",
        node,
        "--public-ip",
        ip,
        "--subnet-lease-ttl",
        &ttl.to_string(),
        "--retry-interval",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn key_of(subnet_env_value: &str) -> String {
    // FLANNEL_SUBNET=10.5.13.1/24 -> <prefix>/subnets/10.5.13.0-24
    let (ip, len) = subnet_env_value.split_once('/').unwrap();
    let mut o: Vec<u8> = ip.split('.').map(|x| x.parse().unwrap()).collect();
    o[3] -= 1;
    format!("{PREFIX}/subnets/{}.{}.{}.{}-{len}", o[0], o[1], o[2], o[3])
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Kv {
    value: String,
    lease: i64,
    create_revision: i64,
    mod_revision: i64,
    version: i64,
}

async fn get(c: &mut Client, key: &str) -> Option<Kv> {
    let r = c.get(key, None).await.unwrap();
    r.kvs().first().map(|kv| Kv {
        value: kv.value_str().unwrap().to_string(),
        lease: kv.lease(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
    })
}

async fn all_leases(c: &mut Client) -> HashMap<String, Kv> {
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
                kv.key_str().unwrap().to_string(),
                Kv {
                    value: kv.value_str().unwrap().to_string(),
                    lease: kv.lease(),
                    create_revision: kv.create_revision(),
                    mod_revision: kv.mod_revision(),
                    version: kv.version(),
                },
            )
        })
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

/// flannel #1289, exactly: A acquires; A's key is deleted; B starts with a
/// subnet file naming A's subnet and gets it; A starts again with its subnet
/// file: A gets a different subnet, and B's key keeps its value, etcd lease
/// id and create revision.
#[tokio::test(flavor = "multi_thread")]
async fn seed_scenario_a_stale_subnet_file_never_overwrites_another_nodes_lease() {
    let (etcd, mut c) = setup(CONFIG).await;
    let mut a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.1", 600)).unwrap();
    let sa = a.wait_subnet(T).unwrap();
    a.kill();
    let a_key = key_of(&sa);
    assert!(get(&mut c, &a_key).await.is_some());
    c.delete(a_key.as_str(), None).await.unwrap();

    // B's subnet file names A's subnet (say, the file was copied).
    let b = Agent::start_seeded(
        "b",
        None,
        &args(&etcd, "node-b", "198.18.0.2", 600),
        Some(&sa),
    )
    .unwrap();
    b.wait_acquired(1, T).unwrap();
    // B took the free subnet it preferred: the key names B.
    let b_before = get(&mut c, &a_key).await.unwrap();
    assert!(b_before.value.contains("\"WeftNodeID\":\"node-b\""));

    // A comes back with its subnet file still naming that subnet.
    assert_eq!(
        a.subnet().as_deref(),
        Some(sa.as_str()),
        "A's subnet file is stale"
    );
    a.restart().unwrap();
    let sa2 = a.wait_subnet_written(2, T).unwrap();
    assert_ne!(sa2, sa, "A got a different subnet");

    let b_after = get(&mut c, &a_key).await.unwrap();
    assert_eq!(
        b_after, b_before,
        "B's key kept its value, etcd lease, create and mod revision"
    );
    assert_eq!(b_after.version, 1, "B's key was never written again");
    let a2 = get(&mut c, &key_of(&sa2)).await.unwrap();
    assert!(a2.value.contains("\"WeftNodeID\":\"node-a\""));
    drop(b);
}

/// A is paused past its TTL; B takes the subnet; A resumes, notices the
/// loss, re-acquires a different subnet, and never writes B's key.
#[tokio::test(flavor = "multi_thread")]
async fn expiry_while_paused_never_writes_the_new_owners_key() {
    let (etcd, mut c) = setup(CONFIG).await;
    let a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.1", 3)).unwrap();
    let sa = a.wait_subnet(T).unwrap();
    let key = key_of(&sa);
    a.pause();
    // etcd expires A's lease and deletes the key.
    for _ in 0..200 {
        if get(&mut c, &key).await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        get(&mut c, &key).await.is_none(),
        "A's key expired while A was paused"
    );

    let b = Agent::start_seeded(
        "b",
        None,
        &args(&etcd, "node-b", "198.18.0.2", 600),
        Some(&sa),
    )
    .unwrap();
    b.wait_acquired(1, T).unwrap();
    let b_key = get(&mut c, &key).await.expect("B holds A's old subnet");
    assert!(b_key.value.contains("node-b"));

    a.resume();
    a.wait_metric("weft_lease_lost_total", |n| n == 1.0, T)
        .unwrap();
    let sa2 = eventually("A moves to another subnet", T, || {
        a.subnet().filter(|s| *s != sa)
    });
    a.wait_acquired(2, T).unwrap();
    let a2 = get(&mut c, &key_of(&sa2)).await.unwrap();
    assert!(a2.value.contains("node-a"));

    let b_now = get(&mut c, &key).await.unwrap();
    assert_eq!(b_now, b_key, "B's key is untouched");
    assert_eq!(b_now.version, 1);
    assert_eq!(
        b_now.mod_revision, b_now.create_revision,
        "no write since B created it"
    );
    drop(b);
}

/// Waits until `held` agents hold a subnet, returning (name, subnet) of
/// each; fails naming the agents without one, their state and the end of
/// their logs.
fn wait_held(agents: &[Agent], held: usize) -> Vec<(String, String)> {
    let got = poll(Duration::from_secs(60), || {
        let with: Vec<_> = agents
            .iter()
            .filter_map(|a| a.subnet().map(|s| (a.name.clone(), s)))
            .collect();
        (with.len() == held).then_some(with)
    });
    got.unwrap_or_else(|| {
        let mut report = String::new();
        let mut without = 0;
        for a in agents.iter().filter(|a| a.subnet().is_none()) {
            without += 1;
            let log = a.log();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            report += &format!(
                "--- {} (running: {}) ---\n{}\n",
                a.name,
                a.running(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        panic!(
            "{} of {} agents hold a subnet after 60 s, {held} should; those without:\n{report}",
            agents.len() - without,
            agents.len()
        )
    })
}

fn race(etcd: &Etcd, n: usize) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            Agent::start(
                &format!("r{i}"),
                None,
                &args(
                    etcd,
                    &format!("race-{i}"),
                    &format!("198.18.1.{}", i + 1),
                    600,
                ),
            )
            .unwrap()
        })
        .collect()
}

/// 50 agents with their own etcd clients start at once on a network with
/// fewer subnets than agents: every held subnet has exactly one owner, the
/// rest report "out of subnets", none crashes.
#[tokio::test(flavor = "multi_thread")]
async fn race_of_50_agents_for_31_subnets() {
    let (etcd, mut c) =
        setup(r#"{"Network":"10.6.0.0/22","SubnetLen":27,"Backend":{"Type":"vxlan"}}"#).await;
    let mut agents = race(&etcd, 50);
    let held = wait_held(&agents, 31);
    let without: Vec<&Agent> = agents.iter().filter(|a| a.subnet().is_none()).collect();
    assert_eq!(without.len(), 19);
    for a in &without {
        a.wait_metric("weft_out_of_subnets_total", |n| n >= 1.0, T)
            .unwrap();
        assert_eq!(a.metric("weft_lease_held"), Some(0.0));
    }
    // Exactly one owner per subnet: distinct subnet files, and each key in
    // etcd names the agent whose file names it.
    let mut seen = std::collections::HashSet::new();
    let leases = all_leases(&mut c).await;
    assert_eq!(leases.len(), 31);
    for (name, s) in &held {
        assert!(seen.insert(s.clone()), "{s} held twice");
        let i: usize = name[1..].parse().unwrap();
        let kv = &leases[&key_of(s)];
        assert!(
            kv.value.contains(&format!("\"WeftNodeID\":\"race-{i}\"")),
            "{s} in etcd names {name}"
        );
    }
    for a in agents.iter_mut() {
        assert!(a.running(), "{} is still running", a.name);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn race_of_50_agents_with_enough_subnets_all_distinct() {
    let (etcd, mut c) = setup(CONFIG).await;
    let agents = race(&etcd, 50);
    let subnets: Vec<String> = wait_held(&agents, 50).into_iter().map(|(_, s)| s).collect();
    let distinct: std::collections::HashSet<_> = subnets.iter().collect();
    assert_eq!(distinct.len(), 50);
    assert_eq!(
        all_leases(&mut c).await.len(),
        50,
        "no node left a second key behind"
    );
}

/// Same node id and PublicIP keep their subnet across a restart within the
/// TTL, even without the subnet file. A clone (same PublicIP, other node
/// id, copied subnet file) never shares it: it takes the lease of its
/// address over as a replaced machine would, A takes it back, both report
/// the conflict, and the clone stops: one key, A's, and no second subnet
/// for the address (every other node would reject one).
#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_the_subnet_and_a_clone_never_shares_it() {
    let (etcd, mut c) = setup(CONFIG).await;
    let mut a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.1", 600)).unwrap();
    let sa = a.wait_subnet(T).unwrap();
    let key = key_of(&sa);
    let before = get(&mut c, &key).await.unwrap();

    a.kill();
    std::fs::remove_file(a.subnet_file()).unwrap();
    a.restart().unwrap();
    assert_eq!(a.wait_subnet(T).unwrap(), sa, "same subnet after a restart");
    let after = get(&mut c, &key).await.unwrap();
    assert_eq!(
        after.create_revision, before.create_revision,
        "the key was reclaimed in place"
    );
    assert_eq!(all_leases(&mut c).await.len(), 1);

    // The clone: same PublicIP, another node id, a copy of A's subnet file.
    let clone = Agent::start_seeded(
        "clone",
        None,
        &args(&etcd, "node-a-clone", "198.18.0.1", 600),
        Some(&sa),
    )
    .unwrap();
    for agent in [&a, &clone] {
        agent
            .wait_metric("weft_public_ip_conflict", |v| v == 1.0, T)
            .unwrap();
    }
    let leases = all_leases(&mut c).await;
    assert_eq!(leases.len(), 1, "one key for the address: {leases:?}");
    let a_now = get(&mut c, &key).await.unwrap();
    assert_eq!(a_now.create_revision, before.create_revision);
    assert!(
        a_now.value.contains("\"WeftNodeID\":\"node-a\""),
        "A holds its key again: {}",
        a_now.value
    );
    assert!(a.running() && clone.running());
    drop(clone);
}

/// A reservation (a key without an etcd lease) is used as is by the node
/// whose PublicIP it names, without a TTL, and never given to anyone else.
#[tokio::test(flavor = "multi_thread")]
async fn reservations_are_honoured() {
    // A /28 split in /30s: 3 subnets (10.9.0.4, .8, .12).
    let (etcd, mut c) = setup(r#"{"Network":"10.9.0.0/28","Backend":{"Type":"vxlan"}}"#).await;
    let r_key = format!("{PREFIX}/subnets/10.9.0.8-30");
    c.put(r_key.as_str(), r#"{"PublicIP":"198.18.0.7"}"#, None)
        .await
        .unwrap();
    let other_key = format!("{PREFIX}/subnets/10.9.0.12-30");
    c.put(other_key.as_str(), r#"{"PublicIP":"198.18.0.99"}"#, None)
        .await
        .unwrap();

    let r = Agent::start("r", None, &args(&etcd, "node-r", "198.18.0.7", 600)).unwrap();
    assert_eq!(r.wait_subnet(T).unwrap(), "10.9.0.9/30");
    let kv = get(&mut c, &r_key).await.unwrap();
    assert_eq!(kv.lease, 0, "no TTL attached to a reservation");
    assert!(
        kv.value.contains("\"VtepMAC\""),
        "the node's backend data was written: {}",
        kv.value
    );

    // Q prefers the reserved subnet (stale file): it gets the free one.
    let q = Agent::start_seeded(
        "q",
        None,
        &args(&etcd, "node-q", "198.18.0.5", 600),
        Some("10.9.0.13/30"),
    )
    .unwrap();
    assert_eq!(
        q.wait_subnet_change("10.9.0.13/30", T).unwrap(),
        "10.9.0.5/30"
    );
    // A third node finds nothing: reservations are not free subnets.
    let z = Agent::start("z", None, &args(&etcd, "node-z", "198.18.0.6", 600)).unwrap();
    z.wait_log("out of subnets: all 3 subnets from 10.9.0.4 to 10.9.0.12 are taken (1 by leases, 2 by reservations", T)
        .unwrap();
    assert_eq!(
        get(&mut c, &other_key).await.unwrap().value,
        r#"{"PublicIP":"198.18.0.99"}"#,
        "the other reservation is untouched"
    );

    // Restarting R keeps the reservation, still without a TTL.
    let mut r = r;
    r.restart().unwrap();
    r.wait_acquired(1, T).unwrap();
    assert_eq!(get(&mut c, &r_key).await.unwrap().lease, 0);
    drop(q);
}

/// A malformed config gives an error naming the field, and the agent keeps
/// retrying until it is fixed; malformed lease values are skipped with a
/// warning naming the key, never taken and never overwritten.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_config_and_lease_values() {
    let (etcd, mut c) =
        setup(r#"{"Network":"10.5.0.0/16","SubnetLen":"24","Backend":{"Type":"vxlan"}}"#).await;
    let garbage_key = format!("{PREFIX}/subnets/10.5.3.0-24");
    c.put(garbage_key.as_str(), "{not json", None)
        .await
        .unwrap();
    let badkey = format!("{PREFIX}/subnets/banana");
    c.put(badkey.as_str(), "whatever", None).await.unwrap();

    let m = Agent::start_seeded(
        "m",
        None,
        &args(&etcd, "node-m", "198.18.0.3", 600),
        Some("10.5.3.1/24"),
    )
    .unwrap();
    m.wait_log(
        "network config: SubnetLen: must be a number, found \"24\"",
        T,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(m.running(), "a bad config is not fatal");
    assert_eq!(
        (
            m.metric("weft_lease_held"),
            m.metric("weft_lease_acquire_seconds_count")
        ),
        (Some(0.0), Some(0.0)),
        "nothing acquired with a bad config"
    );
    assert_eq!(all_leases(&mut c).await.len(), 2, "nothing written");

    c.put(format!("{PREFIX}/config"), CONFIG, None)
        .await
        .unwrap();
    let s = m.wait_subnet_written(1, T).unwrap();
    assert_ne!(
        s, "10.5.3.1/24",
        "a key with a garbage value is still taken"
    );
    // Both malformed keys skipped (`weft leases` below names them).
    m.wait_metric("weft_malformed_leases_total", |n| n == 2.0, T)
        .unwrap();
    let g = get(&mut c, &garbage_key).await.unwrap();
    assert_eq!(
        (g.value.as_str(), g.version),
        ("{not json", 1),
        "never overwritten"
    );

    // A malformed value arriving on the watch does not stop it: a good lease
    // after it is still seen.
    c.put(format!("{PREFIX}/subnets/10.5.4.0-24").as_str(), "[]", None)
        .await
        .unwrap();
    c.put(
        format!("{PREFIX}/subnets/10.5.5.0-24").as_str(),
        r#"{"PublicIP":"198.18.0.50","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:01"}}"#,
        None,
    )
    .await
    .unwrap();
    m.wait_metric("weft_malformed_leases_total", |n| n == 3.0, T)
        .unwrap();
    m.wait_log(
        "peer subnet=10.5.5.0/24 vtep=198.18.0.50 mac=aa:bb:cc:dd:ee:01",
        T,
    )
    .unwrap();

    let (ok, out, _) = weft(&["leases", "--etcd-endpoints", &etcd.endpoint]);
    assert!(ok);
    for key in [&garbage_key, &badkey] {
        assert!(out.contains(&format!("malformed: {key}")), "{out}");
    }
    assert!(
        out.contains("10.5.5.0/24")
            && out.contains("aa:bb:cc:dd:ee:01")
            && out.contains("(flannel)"),
        "{out}"
    );
}

/// An agent started before etcd keeps retrying with a clear log line and
/// acquires once etcd is up.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_started_late() {
    weft_tests::require_root();
    let mut etcd = Etcd::prepare().unwrap();
    let a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.1", 600)).unwrap();
    a.wait_metric("weft_etcd_errors_total", |n| n >= 1.0, T)
        .unwrap();
    assert!(a.subnet().is_none());
    etcd.launch().unwrap();
    let mut c = etcd.client().await;
    c.put(format!("{PREFIX}/config"), CONFIG, None)
        .await
        .unwrap();
    let s = a.wait_subnet(T).unwrap();
    assert!(get(&mut c, &key_of(&s)).await.is_some());
}

/// Our lease is flannel's JSON byte for byte plus one field flannel ignores,
/// and a lease flannel wrote is read as a peer.
#[tokio::test(flavor = "multi_thread")]
async fn lease_json_is_flannels_both_ways() {
    let (etcd, mut c) = setup(CONFIG).await;
    let flannel_key = format!("{PREFIX}/subnets/10.5.200.0-24");
    let flannel_json = r#"{"PublicIP":"198.18.0.200","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put(
        flannel_key.as_str(),
        flannel_json,
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();

    let a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.1", 600)).unwrap();
    let s = a.wait_subnet(T).unwrap();
    let ours = get(&mut c, &key_of(&s)).await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&ours.value).unwrap();
    let mac = v["BackendData"]["VtepMAC"].as_str().unwrap();
    assert_eq!(
        ours.value,
        format!(
            r#"{{"PublicIP":"198.18.0.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac}"}},"WeftNodeID":"node-a"}}"#
        )
    );
    a.wait_log(
        "peer subnet=10.5.200.0/24 vtep=198.18.0.200 mac=c6:d2:32:6f:8f:44",
        T,
    )
    .unwrap();
    // The flannel lease is read, never rewritten.
    let f = get(&mut c, &flannel_key).await.unwrap();
    assert_eq!((f.value.as_str(), f.version), (flannel_json, 1));

    // Removal is seen with the full previous value.
    c.delete(flannel_key.as_str(), None).await.unwrap();
    a.wait_metric("weft_peers", |n| n == 0.0, T).unwrap();
}

/// Deleting a node's key (an operator, a bad script) is noticed at once:
/// the node re-acquires through the fenced path, the same subnet if free.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_key_is_reacquired() {
    let (etcd, mut c) = setup(CONFIG).await;
    let a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.1", 600)).unwrap();
    let s = a.wait_subnet(T).unwrap();
    let key = key_of(&s);
    let before = get(&mut c, &key).await.unwrap();
    c.delete(key.as_str(), None).await.unwrap();
    a.wait_metric("weft_lease_lost_total", |n| n == 1.0, T)
        .unwrap();
    let after = eventually("A re-creates its key", T, || {
        let mut c2 = futures_block(etcd.client());
        futures_block(get(&mut c2, &key)).filter(|kv| kv.create_revision != before.create_revision)
    });
    assert!(after.value.contains("node-a"));
    assert_eq!(a.subnet().unwrap(), s, "same subnet, it was free");
}

/// Keys of a quarter of the network each (the widest a config of this
/// network could hand out) with junk values and no etcd lease, anyone's
/// to write, do not take the pool: an agent acquires a subnet beside
/// them, and leaves them as they are. A reservation of another length
/// whose value is a lease still takes what it overlaps (the first free
/// subnets are drawn from, so a reservation ignored would be drawn).
#[tokio::test(flavor = "multi_thread")]
async fn junk_keys_of_another_length_do_not_take_the_pool() {
    let (etcd, mut c) = setup(CONFIG).await;
    let junk: Vec<String> = [0, 64, 128, 192]
        .iter()
        .map(|o| format!("{PREFIX}/subnets/10.5.{o}.0-18"))
        .collect();
    for k in &junk {
        c.put(k.as_str(), "junk", None).await.unwrap();
    }
    // A valid reservation of another length: 10.5.0.0/19 stays taken.
    let reserved = format!("{PREFIX}/subnets/10.5.0.0-19");
    c.put(reserved.as_str(), r#"{"PublicIP":"198.18.0.99"}"#, None)
        .await
        .unwrap();
    let a = Agent::start("a", None, &args(&etcd, "node-a", "198.18.0.3", 600)).unwrap();
    let line = a.wait_subnet(T).unwrap();
    let third: u8 = line.split('.').nth(2).unwrap().parse().unwrap();
    assert!(
        third >= 32,
        "a subnet outside the valid reservation's 10.5.0.0/19: {line}"
    );
    for k in &junk {
        assert_eq!(get(&mut c, k).await.unwrap().value, "junk", "{k} untouched");
    }
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}
