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
use weft::dataplane::EndpointMap;
use weft_tests::{
    agent::eventually,
    containerd::{Containerd, Sandbox},
    dual::{DUAL, DualCluster, DualNode},
};

fn t() -> Duration {
    weft_tests::scaled(Duration::from_secs(30))
}

/// The network config `weft install-cni` writes (and the plugin it
/// installs), with this node's paths: the tests' nodes share one host, so
/// each agent's files are under a directory of its own.
fn installed_network(dir: &Path, n: &DualNode) -> (Value, PathBuf) {
    let (bin, conf) = (dir.join("cni-bin"), dir.join("cni-conf"));
    let (ok, _, err) = weft_tests::agent::weft(&[
        "install-cni",
        "--bin-dir",
        bin.to_str().unwrap(),
        "--conf-dir",
        conf.to_str().unwrap(),
    ]);
    assert!(ok, "install-cni: {err}");
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(conf.join("10-weft.conflist")).unwrap())
            .unwrap();
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
        &dir.join("containerd"),
        &n.node.ns.path(),
        &n.node.cni_cache_dir,
        &[&bin, Path::new(weft_tests::cni::SYSTEM_PLUGINS)],
    )
    .unwrap();
    c.set_network(&net).unwrap();
    c
}

fn endpoints(n: &DualNode) -> BTreeSet<IpAddr> {
    EndpointMap::open(n.pins.pins())
        .unwrap()
        .all()
        .unwrap()
        .into_keys()
        .collect()
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

fn count(n: &DualNode, r: Reason) -> f64 {
    n.counters().get(r).unwrap().packets as f64
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
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let counts = || {
        [
            count(a, Reason::EncapBypass),
            count(a, Reason::Encapsulated),
            count(b, Reason::DecapBypass),
            count(b, Reason::Decapsulated),
        ]
    };
    let before_flow = counts();
    let server = &pods[1][0];
    let bytes = iperf(&pods[0][0], server, server.ip(false).unwrap());
    assert!(
        bytes > 1e7 / weft_tests::time_scale(),
        "the flow moved {bytes} bytes"
    );
    let d: Vec<f64> = counts()
        .iter()
        .zip(before_flow)
        .map(|(x, y)| x - y)
        .collect();
    let (tx, rx) = (d[0] / (d[0] + d[1]), d[2] / (d[2] + d[3]));
    println!("fast path: {tx:.4} of the sent packets, {rx:.4} of the received");
    if weft_tests::bypasses() {
        assert!(tx >= 0.99, "sent on the fast path: {tx:.4}");
        assert!(rx >= 0.99, "received on the fast path: {rx:.4}");
    } else {
        assert_eq!(d[0] + d[2], 0.0, "nothing bypasses without the kfuncs");
    }

    // StopPodSandbox and RemovePodSandbox leave nothing behind: no record,
    // endpoint, address, device, cache entry or pinned namespace.
    for (r, ps) in runtimes.iter().zip(&pods) {
        for p in ps {
            r.remove_pod(&p.id).unwrap();
        }
        assert!(r.sandboxes().unwrap().is_empty());
    }
    for (n, was) in c.nodes.iter().zip(&before) {
        let mut now = held(n);
        weft_tests::agent::poll(t(), || {
            now = held(n);
            (&now == was).then_some(())
        });
        assert_eq!(&now, was, "what the node held before the pods");
    }
    for p in pods.iter().flatten() {
        if let Some(ns) = &p.netns_path {
            assert!(!Path::new(ns).exists(), "{ns} is left");
        }
    }
}
