//! The kubelet's path: pods made by containerd's CRI plugin, which calls
//! the CNI plugins through go-cni and libcni (its own result cache, its own
//! network namespace paths, the K8S_POD_* arguments, parallel ADDs, DEL on
//! sandbox stop), on nodes of a Weft cluster. One containerd per node
//! (tests/src/containerd.rs); a small CRI client does what the kubelet does.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use dataplane_common::Reason;
use serde_json::{Value, json};
use weft::dataplane::{Counters, EndpointMap};
use weft_tests::{
    agent::eventually,
    containerd::{Containerd, Sandbox},
    dual::{DUAL, DualCluster, DualNode},
    pins::TestPins,
    weft_cluster::WeftCluster,
};

fn t() -> Duration {
    weft_tests::scaled(Duration::from_secs(30))
}

/// `weft install-cni` into `dir/cni-bin` and `dir/cni-conf`, with the
/// network config `conflist` (else its default): the network config it
/// wrote and the plugins' directory.
fn install_cni(dir: &Path, conflist: Option<&Path>) -> (Value, PathBuf) {
    let (bin, conf) = (dir.join("cni-bin"), dir.join("cni-conf"));
    let mut args = vec![
        "install-cni",
        "--bin-dir",
        bin.to_str().unwrap(),
        "--conf-dir",
        conf.to_str().unwrap(),
    ];
    if let Some(c) = conflist {
        args.extend(["--conflist", c.to_str().unwrap()]);
    }
    let (ok, _, err) = weft_tests::agent::weft(&args);
    assert!(ok, "install-cni: {err}");
    let v = serde_json::from_str(&std::fs::read_to_string(conf.join("10-weft.conflist")).unwrap())
        .unwrap();
    (v, bin)
}

/// The network config `weft install-cni` writes (and the plugin it
/// installs), with this node's paths: the tests' nodes share one host, so
/// each agent's files are under a directory of its own.
fn installed_network(dir: &Path, n: &DualNode) -> (Value, PathBuf) {
    let (mut v, bin) = install_cni(dir, None);
    let weft = v["plugins"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["type"] == "weft")
        .expect("a weft line");
    weft["stateDir"] = json!(n.agent.state_dir());
    weft["subnetFile"] = json!(n.agent.subnet_file());
    weft["dataDir"] = json!(n.node.ipam_dir);
    (v, bin)
}

/// A containerd on node `n` with the network install-cni writes.
fn runtime(n: &DualNode) -> Containerd {
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-cri-"));
    std::fs::create_dir_all(&dir).unwrap();
    let (net, bin) = installed_network(&dir, n);
    let c = Containerd::start(
        &dir,
        &n.node.ns.path(),
        &n.node.cni_cache_dir,
        &[&bin, Path::new(weft_tests::cni::SYSTEM_PLUGINS)],
    )
    .unwrap();
    c.set_network(&net).unwrap();
    c
}

/// `weft endpoints --json` on a node: address -> (pod, attached by,
/// programmed).
fn listed(
    node: &weft_tests::cluster::Node,
    agent: &weft_tests::agent::Agent,
    pins: &TestPins,
) -> std::collections::BTreeMap<IpAddr, (String, String, bool)> {
    let out = node
        .ns
        .exec(
            weft_tests::agent::weft_bin().to_str().unwrap(),
            &[
                "endpoints",
                "--json",
                "--state-dir",
                agent.state_dir().to_str().unwrap(),
                "--bpffs-dir",
                pins.path().to_str().unwrap(),
                "--cni-ipam-dir",
                node.ipam_dir.to_str().unwrap(),
                "--cni-cache-dir",
                node.cni_cache_dir.to_str().unwrap(),
            ],
        )
        .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["address"].as_str().unwrap().parse().unwrap(),
                (
                    e["pod"].as_str().unwrap_or("-").to_string(),
                    e["attached_by"].as_str().unwrap().to_string(),
                    e["programmed"].as_bool().unwrap(),
                ),
            )
        })
        .collect()
}

/// The addresses in a node's endpoint map.
fn endpoints_at(pins: &TestPins) -> BTreeSet<IpAddr> {
    EndpointMap::open(pins.pins())
        .unwrap()
        .all()
        .unwrap()
        .into_keys()
        .collect()
}

fn endpoints(n: &DualNode) -> BTreeSet<IpAddr> {
    endpoints_at(&n.pins)
}

/// Waits until node `n` holds again what it held `before` (its pods are
/// gone and nothing of them is left), and fails with the difference.
fn holds_again(n: &DualNode, before: &Held) {
    let mut now = held(n);
    weft_tests::agent::poll(t(), || {
        now = held(n);
        (&now == before).then_some(())
    });
    assert_eq!(&now, before, "what the node held before the sandboxes");
}

fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// What a node holds for its pods: the plugin's records, the endpoints
/// programmed, host-local's addresses, the node's links, libcni's cache.
#[derive(Debug, PartialEq)]
struct Held {
    records: BTreeSet<String>,
    endpoints: BTreeSet<IpAddr>,
    addresses: BTreeSet<String>,
    links: BTreeSet<String>,
    cache: BTreeSet<String>,
}

fn held(n: &DualNode) -> Held {
    let mut addresses = BTreeSet::new();
    for net in listing(&n.node.ipam_dir) {
        for a in listing(&n.node.ipam_dir.join(&net)) {
            if a.parse::<IpAddr>().is_ok() {
                addresses.insert(format!("{net}/{a}"));
            }
        }
    }
    let links = n
        .node
        .ns
        .ip(&["-o", "link", "show"])
        .unwrap()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|s| s.split('@').next().unwrap().to_string())
        .collect();
    Held {
        records: listing(&n.agent.state_dir().join("endpoints")),
        endpoints: endpoints(n),
        addresses,
        links,
        cache: listing(&n.node.cni_cache_dir.join("results")),
    }
}

/// Bytes an iperf3 flow from pod `client` to pod `server` moved in 3 s.
fn iperf(client: &Sandbox, server: &Sandbox, to: IpAddr) -> f64 {
    let mut srv = server
        .command("iperf3")
        .args(["-s", "-1", "-p", "5201"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = client
        .command("iperf3")
        .args(["-c", &to.to_string(), "-p", "5201", "-t", "3", "-J"])
        .output()
        .unwrap();
    let _ = srv.kill();
    let _ = srv.wait();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0)
}

fn count(pins: &TestPins, r: Reason) -> (f64, f64) {
    let c = Counters::open(pins.pins()).unwrap().get(r).unwrap();
    (c.packets as f64, c.bytes as f64)
}

/// An iperf3 flow from sandbox `a` to sandbox `b` (on the nodes whose pins
/// are given) takes the fast path on both nodes where the kernel lets host
/// routing ask conntrack, and the host stack everywhere else. Shares are
/// of bytes: the first packets of each connection (iperf3 makes two) go
/// through the host stack until conntrack has them, and a slow flow under
/// emulation is only a few hundred GSO packets.
fn fast_path(a: (&TestPins, &Sandbox), b: (&TestPins, &Sandbox)) {
    let counts = || {
        [
            count(a.0, Reason::EncapBypass),
            count(a.0, Reason::Encapsulated),
            count(b.0, Reason::DecapBypass),
            count(b.0, Reason::Decapsulated),
        ]
    };
    let before = counts();
    let bytes = iperf(a.1, b.1, b.1.ip(false).unwrap());
    assert!(
        bytes > 1e7 / weft_tests::time_scale(),
        "the flow moved {bytes} bytes"
    );
    let after = counts();
    let d = |i: usize| (after[i].0 - before[i].0, after[i].1 - before[i].1);
    let share = |f: (f64, f64), s: (f64, f64)| (f.0 / (f.0 + s.0), f.1 / (f.1 + s.1));
    let (tx, rx) = (share(d(0), d(1)), share(d(2), d(3)));
    println!(
        "fast path: {:.4} of the sent bytes ({:.4} of {} packets), {:.4} of the received ({:.4} of {})",
        tx.1,
        tx.0,
        d(0).0 + d(1).0,
        rx.1,
        rx.0,
        d(2).0 + d(3).0
    );
    let (tx, rx) = (tx.1, rx.1);
    let d = [d(0).0, d(1).0, d(2).0, d(3).0];
    if weft_tests::bypasses() {
        assert!(tx >= 0.99, "sent on the fast path: {tx:.4}");
        assert!(rx >= 0.99, "received on the fast path: {rx:.4}");
    } else {
        assert_eq!(d[0] + d[2], 0.0, "nothing bypasses without the kfuncs");
    }
}

#[test]
fn pods_made_through_cri_reach_each_other_across_nodes() {
    // --ip-masq as the DaemonSet's config has it: without it the bridge
    // masquerades every flow leaving the node's subnet, which then takes
    // the host stack (docs/troubleshooting.md).
    let c = DualCluster::new(2, DUAL, &["--ip-masq"]).unwrap();
    c.wait_meshed(t());
    let before: Vec<Held> = c.nodes.iter().map(held).collect();
    let runtimes: Vec<Containerd> = c.nodes.iter().map(runtime).collect();
    let pods: Vec<Vec<Sandbox>> = runtimes
        .iter()
        .map(|r| vec![r.run_pod("web-0").unwrap(), r.run_pod("web-1").unwrap()])
        .collect();

    // The addresses containerd reports lie in the node's subnets, one of
    // each family, and the agent programmed them.
    for (n, ps) in c.nodes.iter().zip(&pods) {
        for p in ps {
            println!("{}: {:?}", p.name, p.ips);
            let (v4, v6) = (p.ip(false).unwrap(), p.ip(true).unwrap());
            let (IpAddr::V4(v4), IpAddr::V6(v6)) = (v4, v6) else {
                unreachable!()
            };
            assert!(
                n.subnets.v4.unwrap().contains(&v4),
                "{v4} in {:?}",
                n.subnets
            );
            assert!(
                n.subnets.v6.unwrap().contains(&v6),
                "{v6} in {:?}",
                n.subnets
            );
            assert_eq!(p.ips.len(), 2, "{:?}", p.ips);
        }
        eventually("the pods are endpoints", t(), || {
            let e = endpoints(n);
            ps.iter()
                .all(|p| p.ips.iter().all(|ip| e.contains(ip)))
                .then_some(())
        });
        // `weft endpoints` names each address's pod as the kubelet's
        // runtime passed it (K8S_POD_NAMESPACE and K8S_POD_NAME).
        let table = n.node.ns.exec(
            weft_tests::agent::weft_bin().to_str().unwrap(),
            &[
                "endpoints",
                "--state-dir",
                n.agent.state_dir().to_str().unwrap(),
                "--bpffs-dir",
                n.pins.path().to_str().unwrap(),
                "--cni-ipam-dir",
                n.node.ipam_dir.to_str().unwrap(),
                "--cni-cache-dir",
                n.node.cni_cache_dir.to_str().unwrap(),
            ],
        );
        println!("{}", table.unwrap());
        let list = listed(&n.node, &n.agent, &n.pins);
        for p in ps {
            for ip in &p.ips {
                assert_eq!(
                    list.get(ip),
                    Some(&(format!("default/{}", p.name), "plugin".to_string(), true)),
                    "{ip} in {list:?}"
                );
            }
        }
    }

    // Every pod reaches every pod on the other node, both families, and the
    // pods the tests' own runtime attached.
    for (i, ps) in pods.iter().enumerate() {
        let other = 1 - i;
        let mut far: Vec<IpAddr> = pods[other].iter().flat_map(|p| p.ips.clone()).collect();
        far.extend(c.nodes[other].pod_addrs());
        for p in ps {
            for dst in &far {
                eventually(&format!("{} reaches {dst}", p.name), t(), || {
                    p.ping(*dst, 1).then_some(())
                });
            }
        }
    }

    // A flow between two of them takes the fast path where the kernel lets
    // host routing ask conntrack.
    fast_path(
        (&c.nodes[0].pins, &pods[0][0]),
        (&c.nodes[1].pins, &pods[1][0]),
    );

    // StopPodSandbox and RemovePodSandbox leave nothing behind: no record,
    // endpoint, address, device, cache entry or pinned namespace.
    for (r, ps) in runtimes.iter().zip(&pods) {
        for p in ps {
            r.remove_pod(&p.id).unwrap();
        }
        assert!(r.sandboxes().unwrap().is_empty());
    }
    for (n, was) in c.nodes.iter().zip(&before) {
        holds_again(n, was);
    }
    for p in pods.iter().flatten() {
        if let Some(ns) = &p.netns_path {
            assert!(!Path::new(ns).exists(), "{ns} is left");
        }
    }
}

/// Every address of the sandboxes `pods` (both families).
fn addresses(pods: &[Sandbox]) -> Vec<IpAddr> {
    pods.iter().flat_map(|p| p.ips.clone()).collect()
}

/// Waits until `from` reaches each of `to`.
fn reaches(from: &DualNode, to: &[IpAddr]) {
    let pod = &from.node.pods[0];
    for dst in to {
        eventually(&format!("a pod reaches {dst}"), t(), || {
            weft_tests::cluster::ping(&pod.ns, *dst, 1).then_some(())
        });
    }
}

#[test]
fn twenty_sandboxes_at_once_while_the_agent_restarts() {
    let mut c = DualCluster::new(2, DUAL, &["--ip-masq"]).unwrap();
    c.wait_meshed(t());
    let before = held(&c.nodes[0]);
    let r = runtime(&c.nodes[0]);
    let names: Vec<String> = (0..20).map(|i| format!("burst-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();

    // The kubelet starts them together; the agent restarts among them (an
    // upgrade of the DaemonSet as pods land).
    let started = std::time::Instant::now();
    let (results, took, restarted) = std::thread::scope(|s| {
        let made = s.spawn(|| {
            let r = r.run_pods(&names);
            (r, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        c.nodes[0].agent.restart().unwrap();
        let restarted = started.elapsed();
        let (results, took) = made.join().unwrap();
        (results, took, restarted)
    });
    println!("20 sandboxes made in {took:?}; the agent restarted at {restarted:?}");
    assert!(restarted < took, "the agent restarted while they were made");
    let pods: Vec<Sandbox> = results
        .into_iter()
        .map(|r| r.expect("every sandbox is made"))
        .collect();
    let all = addresses(&pods);
    let distinct: BTreeSet<IpAddr> = all.iter().copied().collect();
    assert_eq!(all.len(), 40, "an address of each family each: {all:?}");
    assert_eq!(distinct.len(), all.len(), "distinct addresses: {all:?}");
    let n = &c.nodes[0];
    for ip in &all {
        assert!(
            match ip {
                IpAddr::V4(a) => n.subnets.v4.is_some_and(|s| s.contains(a)),
                IpAddr::V6(a) => n.subnets.v6.is_some_and(|s| s.contains(a)),
            },
            "{ip} in {:?}",
            n.subnets
        );
    }
    eventually("every sandbox is an endpoint", t(), || {
        let e = endpoints(n);
        all.iter().all(|ip| e.contains(ip)).then_some(())
    });
    // Reached from the other node, both families.
    reaches(&c.nodes[1], &all);

    for p in &pods {
        r.remove_pod(&p.id).unwrap();
    }
    holds_again(n, &before);
}

#[test]
fn containerd_restarts_under_running_sandboxes() {
    let mut c = DualCluster::new(2, DUAL, &["--ip-masq"]).unwrap();
    c.wait_meshed(t());
    let before = held(&c.nodes[0]);
    let mut r = runtime(&c.nodes[0]);
    let pods = vec![r.run_pod("kept").unwrap(), r.run_pod("gone").unwrap()];
    reaches(&c.nodes[1], &addresses(&pods));

    // containerd restarts (an upgrade of it): the sandboxes run on, keep
    // their network, and containerd finds them again.
    r.restart().unwrap();
    let mut ids = r.sandboxes().unwrap();
    ids.sort();
    let mut want: Vec<String> = pods.iter().map(|p| p.id.clone()).collect();
    want.sort();
    assert_eq!(ids, want, "containerd still knows both sandboxes");
    for p in &pods {
        let now = r.status(&p.id).unwrap();
        assert_eq!(now.ips, p.ips, "{} kept its addresses", p.name);
        assert_eq!(now.pid, p.pid, "{} was not recreated", p.name);
    }
    reaches(&c.nodes[1], &addresses(&pods));

    // A sandbox removed while the agent is down (CNI DEL without it)
    // leaves nothing once the agent is back; the other stays reached.
    c.nodes[0].agent.kill();
    r.remove_pod(&pods[1].id).unwrap();
    c.nodes[0].agent.restart().unwrap();
    let n = &c.nodes[0];
    let kept = &pods[0];
    eventually("the removed sandbox's endpoints are gone", t(), || {
        let e = endpoints(n);
        (pods[1].ips.iter().all(|ip| !e.contains(ip)) && kept.ips.iter().all(|ip| e.contains(ip)))
            .then_some(())
    });
    reaches(&c.nodes[1], &kept.ips);
    r.remove_pod(&kept.id).unwrap();
    holds_again(n, &before);
}

/// An image `cargo xtask image` built, loaded as the docs say for a
/// containerd node (`ctr -n k8s.io images import`), is one the kubelet
/// sees through CRI under the reference the DaemonSet names.
#[test]
fn the_image_imported_with_ctr_is_seen_through_cri() {
    let archive = std::env::var("WEFT_IMAGE").expect(
        "WEFT_IMAGE: the image's OCI archive (cargo xtask test builds it with cargo xtask image)",
    );
    let reference = std::env::var("WEFT_IMAGE_REF").expect("WEFT_IMAGE_REF");
    let ns = weft_tests::netns::Netns::new("wcri").unwrap();
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-cri-image-"));
    let r = Containerd::start(&dir, &ns.path(), &dir.join("cache"), &[]).unwrap();
    assert!(
        !r.images().unwrap().contains(&reference),
        "not there before the import"
    );
    r.import(Path::new(&archive)).unwrap();
    let images = r.images().unwrap();
    assert!(images.contains(&reference), "{reference} in {images:?}");
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml"),
    )
    .unwrap();
    let named: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image:"))
        .map(|s| s.trim().trim_matches('"'))
        .collect();
    assert!(!named.is_empty(), "the DaemonSet names its image");
    for image in named {
        assert_eq!(image, reference, "the DaemonSet's image is the one built");
    }
}

/// A node moved from flannel: its sandboxes were made by containerd with
/// flannel's chain (bridge + host-local, no `weft` line). When Weft's agent
/// starts they keep running, are adopted from the cache containerd's libcni
/// wrote, and their flows take the fast path without being recreated.
#[test]
fn sandboxes_on_flannels_chain_are_adopted_from_containerds_cache() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    for i in 1..=2 {
        c.start_node(i, &[]).unwrap();
    }
    c.wait_meshed(t());
    let mtu = c.nodes[0].subnet_file_mtu();
    let runtimes: Vec<Containerd> = c
        .nodes
        .iter()
        .map(|n| {
            let dir = std::env::temp_dir().join(weft_tests::unique("weft-cri-"));
            let r = Containerd::start(
                &dir,
                &n.node.ns.path(),
                &n.node.cni_cache_dir,
                &[Path::new(weft_tests::cni::SYSTEM_PLUGINS)],
            )
            .unwrap();
            let flannel = weft_tests::cni::flannel_like(
                n.subnet,
                "10.244.0.0/16".parse().unwrap(),
                mtu,
                &n.node.ipam_dir,
            );
            r.set_network(&json!({
                "cniVersion": flannel.cni_version,
                "name": flannel.name,
                "plugins": flannel.plugins,
            }))
            .unwrap();
            r
        })
        .collect();
    let pods: Vec<Sandbox> = runtimes
        .iter()
        .map(|r| r.run_pod("flannel-era").unwrap())
        .collect();
    for (n, p) in c.nodes.iter().zip(&pods) {
        let IpAddr::V4(ip) = p.ip(false).unwrap() else {
            unreachable!()
        };
        assert!(n.subnet.contains(&ip), "{ip} in {}", n.subnet);
        assert!(
            !runtimes_cache_is_empty(&n.node.cni_cache_dir),
            "containerd's libcni wrote the node's cache"
        );
    }

    // Weft's agents start (again) and find them in the cache. The pinned
    // endpoints outlive the agent that wrote them: what counts is that the
    // agent now running is up, ready, and has adopted the sandbox itself.
    for n in c.nodes.iter_mut() {
        n.agent.restart().unwrap();
    }
    for (n, p) in c.nodes.iter().zip(&pods) {
        n.wait_dataplane_up(t());
        n.wait_metric("weft_ready", |v| v == 1.0, t());
        let pid = i64::from(n.agent.pid());
        eventually("the sandbox is adopted by the running agent", t(), || {
            let st = n.status_json()?;
            (st["pid"].as_i64() == Some(pid) && st["endpoints_adopted"].as_u64() == Some(1))
                .then_some(())
        });
        let e = endpoints_at(&n.pins);
        assert!(e.contains(&p.ip(false).unwrap()), "{e:?}");
    }
    for (n, p) in c.nodes.iter().zip(&pods) {
        let list = listed(&n.node, &n.agent, &n.pins);
        assert_eq!(
            list.get(&p.ip(false).unwrap()),
            Some(&(
                "default/flannel-era".to_string(),
                "runtime cache".to_string(),
                true
            )),
            "{list:?}"
        );
    }
    fast_path((&c.nodes[0].pins, &pods[0]), (&c.nodes[1].pins, &pods[1]));
    for (r, p) in runtimes.iter().zip(&pods) {
        let now = r.status(&p.id).unwrap();
        assert_eq!((now.pid, &now.ips), (p.pid, &p.ips), "not recreated");
    }

    // Removed by the kubelet later: its endpoint goes with its cache entry.
    runtimes[1].remove_pod(&pods[1].id).unwrap();
    let gone = pods[1].ip(false).unwrap();
    eventually("the removed sandbox's endpoint is gone", t(), || {
        let e = endpoints_at(&c.nodes[1].pins);
        (!e.contains(&gone)).then_some(())
    });
}

fn runtimes_cache_is_empty(cache_dir: &Path) -> bool {
    listing(&cache_dir.join("results")).is_empty()
}

/// Weft's plugin chained after flannel's (the conflist an operator installs
/// with `weft install-cni --conflist`): containerd's sandboxes are
/// registered by the plugin itself (a record, not an adoption), reach the
/// other node, and leave no record once removed.
#[test]
fn sandboxes_on_a_chain_installed_with_install_cni() {
    let c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(t());
    let n = &c.nodes[0];
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-cri-"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut chain = weft_tests::cni::flannel_like(
        n.subnet,
        "10.244.0.0/16".parse().unwrap(),
        n.subnet_file_mtu(),
        &n.node.ipam_dir,
    );
    weft_tests::cni::chain_weft(&mut chain, &n.agent.state_dir());
    let given = dir.join("chained.conflist");
    std::fs::write(
        &given,
        json!({"cniVersion": chain.cni_version, "name": chain.name, "plugins": chain.plugins})
            .to_string(),
    )
    .unwrap();
    let (installed, bin) = install_cni(&dir, Some(&given));
    let r = Containerd::start(
        &dir,
        &n.node.ns.path(),
        &n.node.cni_cache_dir,
        &[&bin, Path::new(weft_tests::cni::SYSTEM_PLUGINS)],
    )
    .unwrap();
    r.set_network(&installed).unwrap();

    let records = || listing(&n.agent.state_dir().join("endpoints"));
    let before = records();
    let pod = r.run_pod("chained").unwrap();
    let IpAddr::V4(ip) = pod.ip(false).unwrap() else {
        unreachable!()
    };
    assert!(n.subnet.contains(&ip), "{ip} in {}", n.subnet);
    let added: Vec<String> = records().difference(&before).cloned().collect();
    assert_eq!(added.len(), 1, "one record by the plugin: {added:?}");
    assert!(added[0].starts_with(&pod.id), "{added:?} is {}'s", pod.id);
    eventually("the sandbox is an endpoint", t(), || {
        endpoints_at(&n.pins)
            .contains(&IpAddr::V4(ip))
            .then_some(())
    });
    let far = c.nodes[1].node.pods[0].ip;
    eventually("the sandbox reaches the other node's pod", t(), || {
        pod.ping(far.into(), 1).then_some(())
    });
    r.remove_pod(&pod.id).unwrap();
    assert_eq!(records(), before, "DEL removed its record");
}
