//! etcd as it runs in production: a 3-member cluster whose members die,
//! lose their peers, vanish from the network, all stop, and get compacted,
//! while nodes join; then mutual TLS with auth and the minimal role. A
//! history recorded by etcd itself is checked at the end: no key changes
//! owner without a delete or an expiry in between, no two live keys
//! overlap, and no two agents ever name overlapping subnets at once.

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipnet::Ipv4Net;
use weft_tests::{
    agent::eventually,
    etcd_cluster::{EtcdCluster, Options},
    traffic::{ping_outcome, ping_run},
    weft_cluster::{CONFIG, PREFIX, WeftCluster, WeftNode, http_get},
};

const T: Duration = Duration::from_secs(30);

/// Waits until every node programs every other node.
fn converged(c: &WeftCluster, within: Duration) {
    let n = c.nodes.len();
    eventually(&format!("{n} nodes converge"), within, || {
        c.nodes
            .iter()
            .all(|x| x.peer_subnets().len() == n - 1)
            .then_some(())
    });
}

/// Samples every agent's subnet.env every 50 ms; records any moment two of
/// them name overlapping subnets.
struct SubnetFiles {
    stop: Arc<AtomicBool>,
    overlaps: Arc<Mutex<Vec<String>>>,
    paths: Arc<Mutex<Vec<std::path::PathBuf>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SubnetFiles {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(Mutex::new(Vec::new()));
        let paths: Arc<Mutex<Vec<std::path::PathBuf>>> = Arc::new(Mutex::new(Vec::new()));
        let thread = std::thread::spawn({
            let (stop, overlaps, paths) = (stop.clone(), overlaps.clone(), paths.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let subnets: Vec<(String, Ipv4Net)> = paths
                        .lock()
                        .unwrap()
                        .iter()
                        .filter_map(|p| {
                            let env = std::fs::read_to_string(p).ok()?;
                            let s = env
                                .lines()
                                .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))?;
                            Some((p.display().to_string(), s.parse::<Ipv4Net>().ok()?.trunc()))
                        })
                        .collect();
                    for (i, (pa, a)) in subnets.iter().enumerate() {
                        for (pb, b) in &subnets[i + 1..] {
                            if a.contains(b) || b.contains(a) {
                                overlaps
                                    .lock()
                                    .unwrap()
                                    .push(format!("{pa}: {a} and {pb}: {b}"));
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Self {
            stop,
            overlaps,
            paths,
            thread: Some(thread),
        }
    }

    fn watch(&self, n: &WeftNode) {
        self.paths.lock().unwrap().push(n.agent.subnet_file());
    }

    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.overlaps.lock().unwrap().clone()
    }
}

/// Replays every change under the subnets prefix from revision 1 and checks
/// the history: a key's owner (node id, public IP) never changes without a
/// delete (or an expiry, which etcd records as a delete) in between, and no
/// two keys alive at one revision overlap.
async fn check_history(endpoints: &str) {
    let eps: Vec<&str> = endpoints.split(',').collect();
    let mut client = etcd_client::Client::connect(eps, None).await.unwrap();
    let now = client
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let mut stream = client
        .watch(
            format!("{PREFIX}/subnets/"),
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(1),
            ),
        )
        .await
        .unwrap();
    let mut alive: HashMap<String, (Ipv4Net, String)> = HashMap::new();
    let mut changes = 0;
    'read: while let Some(resp) = stream.message().await.unwrap() {
        // The first response only says the watch exists (at the current
        // revision, with no events): the history follows it.
        if resp.created() {
            continue;
        }
        for ev in resp.events() {
            let kv = ev.kv().unwrap();
            let key = String::from_utf8_lossy(kv.key()).to_string();
            changes += 1;
            match ev.event_type() {
                etcd_client::EventType::Delete => {
                    alive.remove(&key);
                }
                etcd_client::EventType::Put => {
                    let v: serde_json::Value = serde_json::from_slice(kv.value()).unwrap();
                    let owner = format!("{} {}", v["WeftNodeID"], v["PublicIP"]);
                    let subnet: Ipv4Net = key
                        .rsplit('/')
                        .next()
                        .unwrap()
                        .replacen('-', "/", 1)
                        .parse()
                        .unwrap();
                    if let Some((_, was)) = alive.get(&key) {
                        assert_eq!(
                            was,
                            &owner,
                            "{key} changed owner without a delete in between (revision {})",
                            kv.mod_revision()
                        );
                    }
                    for (other, (s, o)) in &alive {
                        if other != &key {
                            assert!(
                                !s.contains(&subnet) && !subnet.contains(s),
                                "{key} ({owner}) overlaps {other} ({o}) at revision {}",
                                kv.mod_revision()
                            );
                        }
                    }
                    alive.insert(key, (subnet, owner));
                }
            }
            if kv.mod_revision() >= now {
                break 'read;
            }
        }
        if resp.header().is_some_and(|h| h.revision() >= now) && resp.events().is_empty() {
            break;
        }
    }
    println!(
        "history: {changes} changes checked, {} keys alive",
        alive.len()
    );
    assert!(changes > 0);
}

/// The member index whose id the agent's watch last heard from.
fn watch_member(c: &WeftNode, ec: &EtcdCluster) -> Option<usize> {
    let m = c.metrics();
    let id = m.keys().find_map(|k| {
        k.strip_prefix("weft_etcd_watch_member{member=\"")
            .and_then(|r| r.strip_suffix("\"}"))
            .and_then(|h| u64::from_str_radix(h, 16).ok())
    })?;
    ec.member_ids().iter().position(|m| *m == Some(id))
}

fn add_node(c: &mut WeftCluster, i: u8, files: &SubnetFiles) {
    let n = c.start_node(i, &[]).unwrap();
    files.watch(n);
    n.use_cni();
    n.node.add_pod().unwrap();
}

/// Node `i` leaves as an operator removes one: its agent stopped, its lease
/// deleted. Returns its subnet.
fn node_leaves(c: &mut WeftCluster, i: usize, ec: &EtcdCluster) -> Ipv4Net {
    let gone = c.nodes.remove(i);
    let subnet = gone.subnet;
    drop(gone);
    ec.etcdctl(&[
        "del",
        &format!("{PREFIX}/subnets/{}", weft::lease::to_key(&subnet)),
    ])
    .unwrap();
    subnet
}

/// Applies `fault` to the member node 1's watch is on, adds node `i`, and
/// checks that node 1 programs it within 15 s (etcd ends a watch on a member without a leader after a few election timeouts, the agent then moves it off that member); then reconnects the member.
fn joiner_seen_despite(
    c: &mut WeftCluster,
    ec: &EtcdCluster,
    files: &SubnetFiles,
    i: u8,
    what: &str,
    fault: fn(&EtcdCluster, usize) -> anyhow::Result<()>,
) {
    let m = eventually("node 1's watch member", T, || watch_member(&c.nodes[0], ec));
    fault(ec, m).unwrap();
    let t = Instant::now();
    add_node(c, i, files);
    let new = c.nodes.last().unwrap().subnet;
    let seen = weft_tests::agent::poll(Duration::from_secs(15), || {
        c.nodes[0].peer_subnets().contains(&new).then_some(())
    });
    assert!(
        seen.is_some(),
        "node 1 did not see node {i} within 15 s ({what}); its log:\n{}",
        c.nodes[0].agent.log()
    );
    println!("{what}: node {i} seen after {:?}", t.elapsed());
    ec.reconnect(m).unwrap();
}

#[test]
fn a_three_member_cluster_through_member_faults() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    let mut ec = EtcdCluster::start(&c.underlay, 3, Options::default()).unwrap();
    ec.etcdctl(&["put", &format!("{PREFIX}/config"), CONFIG])
        .unwrap();
    c.etcd_args = vec!["--etcd-endpoints".into(), ec.endpoints()];
    let files = SubnetFiles::start();
    for i in 1..=3 {
        add_node(&mut c, i, &files);
    }
    converged(&c, T);

    // The leader dies; a node joins; everyone converges; it comes back.
    let leader = ec.leader().unwrap();
    ec.kill(leader);
    add_node(&mut c, 4, &files);
    converged(&c, T);
    ec.restart(leader, None).unwrap();

    // The member node 1's watch is on loses its peers: it still answers
    // clients, without a leader. A node joining is seen within 15 s.
    joiner_seen_despite(
        &mut c,
        &ec,
        &files,
        5,
        "its member lost its leader",
        EtcdCluster::cut_from_peers,
    );
    // The member node 1's watch is on vanishes from the network.
    joiner_seen_despite(
        &mut c,
        &ec,
        &files,
        6,
        "its member vanished",
        EtcdCluster::cut_off,
    );
    for l in c.nodes[0]
        .agent
        .log()
        .lines()
        .filter(|l| l.contains("etcd member") || l.contains("lease watch"))
    {
        println!("  node-1: {l}");
    }
    converged(&c, T);

    // Node 3 leaves (stopped, its lease deleted as an operator does).
    node_leaves(&mut c, 2, &ec);
    converged(&c, T);

    // Every member stops for 60 s: not one packet lost between pods, and
    // the leases are kept.
    let subnets: Vec<Ipv4Net> = c.nodes.iter().map(|n| n.subnet).collect();
    let far = c.nodes.last().unwrap().node.pods[0].ip;
    let pinger = ping_run(&c.nodes[0].node.pods[0].ns, far, 6500);
    let readyz = |n: &WeftNode| http_get(&n.node.ns, n.node.ip, 9090, "/readyz").unwrap().0;
    for n in &c.nodes {
        // A node that joined last checks its programs against the peers
        // once its peer table is complete: ready a moment after.
        eventually(&format!("{} ready before", n.agent.name), T, || {
            (readyz(n) == "HTTP/1.1 200 OK").then_some(())
        });
    }
    ec.pause_all(true);
    // Past 15 s without news from the watch, every node says it is not
    // ready (its view of the leases may be stale), and keeps forwarding.
    std::thread::sleep(Duration::from_secs(20));
    for n in &c.nodes {
        assert!(
            readyz(n).contains("503"),
            "{} not ready with etcd stopped",
            n.agent.name
        );
    }
    std::thread::sleep(Duration::from_secs(40));
    ec.pause_all(false);
    // The watches' retries back off to at most 30 s apart, at random.
    for n in &c.nodes {
        eventually(&format!("{} ready again", n.agent.name), 2 * T, || {
            (readyz(n) == "HTTP/1.1 200 OK").then_some(())
        });
    }
    assert_eq!(
        ping_outcome(pinger),
        (6500, 6500),
        "no packet lost while etcd was down"
    );
    for n in &c.nodes {
        assert!(n.agent.running(), "{} runs", n.agent.name);
        let env = std::fs::read_to_string(n.agent.subnet_file()).unwrap();
        let first = Ipv4Addr::from(u32::from(n.subnet.network()) + 1);
        assert!(
            env.contains(&format!("FLANNEL_SUBNET={first}/")),
            "{} kept its subnet: {env}",
            n.agent.name
        );
    }
    let keys = ec
        .etcdctl(&[
            "get",
            "--prefix",
            "--keys-only",
            &format!("{PREFIX}/subnets/"),
        ])
        .unwrap();
    for s in &subnets {
        assert!(
            keys.contains(&weft::lease::to_key(s)),
            "the lease of {s} is kept: {keys}"
        );
    }

    // The history so far, as etcd recorded it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let endpoints = ec.endpoints();
    c.underlay
        .ns
        .run(move || rt.block_on(check_history(&endpoints)))
        .unwrap();

    // Node 1 cut off from etcd while a node leaves and one joins, and the
    // history is compacted: on return its watch finds its revision gone,
    // and lists once.
    let resumes = c.nodes[0].metric("weft_watch_resumes_total");
    let lists = c.nodes[0].metric("weft_watch_lists_total");
    c.nodes[0].node.ns.cut_tcp_out(2379).unwrap();
    // Once the connection's keep-alives have ended the watch (until then
    // etcd's changes still arrive: only what node 1 sends is cut).
    eventually("node 1's watch breaks", T, || {
        (c.nodes[0].metric("weft_watch_resumes_total") > resumes).then_some(())
    });
    let gone_subnet = node_leaves(&mut c, 1, &ec);
    add_node(&mut c, 7, &files);
    let rev = ec.etcdctl(&["get", "x", "-w", "json"]).unwrap();
    let rev = serde_json::from_str::<serde_json::Value>(&rev).unwrap()["header"]["revision"]
        .as_i64()
        .unwrap();
    ec.etcdctl(&["compact", &rev.to_string()]).unwrap();
    c.nodes[0].node.ns.uncut().unwrap();
    // Its retries backed off meanwhile (at most 30 s apart, at random).
    converged(&c, 2 * T);
    // Converged counts peers: node 1 still holding the gone node's subnet
    // and not yet the new one's has the count too, until its resync.
    eventually("node 1 drops the gone node's subnet", T, || {
        (!c.nodes[0].peer_subnets().contains(&gone_subnet)).then_some(())
    });
    assert!(
        c.nodes[0].agent.log().contains("was compacted"),
        "node 1 found its revision compacted: {}",
        c.nodes[0]
            .agent
            .log()
            .lines()
            .filter(|l| l.contains("watch"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        c.nodes[0].metric("weft_watch_lists_total"),
        lists + 1.0,
        "and listed once"
    );

    let overlaps = files.finish();
    assert!(overlaps.is_empty(), "subnet files overlapped: {overlaps:?}");
}
