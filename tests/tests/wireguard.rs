//! flannel's `wireguard` backend: two Weft nodes and a node set up exactly
//! as flannel's backend sets one up (`wg` from wireguard-tools, its lease in
//! flannel's JSON) share one encrypted network.
//!
//! The test whose name ends in `over_wireguard` needs a kernel with
//! WireGuard (Debian's 6.12 has it as a module). `cargo xtask test` runs it
//! in the 6.12 VM and skips it on the host, whose kernel has none; on a
//! kernel without WireGuard it fails, never passes.

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use ipnet::Ipv4Net;
use weft_tests::{
    agent::eventually,
    cluster::{Node, ping},
    traffic::{capture_count, ping_outcome, ping_run, tcp_transfer},
    weft_cluster::{PREFIX, WeftCluster},
};

const T: Duration = Duration::from_secs(60);
const CONFIG: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#;

/// A key made by `wg genkey` into `path`; returns its public key.
fn wg_key(path: &std::path::Path) -> String {
    weft_tests::wg::genkey(path).expect("wg genkey (wireguard-tools)")
}

/// A Weft agent's arguments: its key file, and host routing as the agent
/// runs it by default (`auto`: the conntrack gate, with the kfuncs of
/// vmlinux or of the nf_conntrack module).
fn agent_args(key_file: &std::path::Path) -> [&str; 4] {
    [
        "--wireguard-key-file",
        key_file.to_str().unwrap(),
        "--host-routing",
        "auto",
    ]
}

/// A Weft node's public key, from its lease in etcd.
fn lease_key(c: &WeftCluster, subnet: Ipv4Net) -> String {
    let v = c
        .etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("{PREFIX}/subnets/{}", weft::lease::to_key(&subnet)),
        ])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(v.trim()).unwrap();
    assert_eq!(v["BackendType"], "wireguard", "{v}");
    v["BackendData"]["PublicKey"].as_str().unwrap().to_string()
}

/// `wg show <dev> dump` of `ns`: (public key, endpoint, allowed IPs) per
/// peer.
fn wg_peers(ns: &weft_tests::netns::Netns, dev: &str) -> Vec<(String, String, String)> {
    let out = ns.exec("wg", &["show", dev, "dump"]).unwrap_or_default();
    out.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() >= 4).then(|| (f[0].to_string(), f[2].to_string(), f[3].to_string()))
        })
        .collect()
}

/// The flannel node: `flannel-wg` as flannel's backend makes it (MTU 1500
/// less 80, its subnet's network address /32, the cluster network routed to
/// it, port 51820), its lease in flannel's JSON, and a peer per Weft node.
struct Flannel {
    node: Node,
    subnet: Ipv4Net,
    key_file: PathBuf,
    etcd_lease: String,
}

impl Flannel {
    fn up(c: &WeftCluster, index: u8, subnet: Ipv4Net) -> Self {
        let mut node = Node::new(&c.underlay, index).unwrap();
        node.pods_for(subnet, 1, 1420).unwrap();
        let key_file = std::env::temp_dir().join(weft_tests::unique("weft-flannel-wgkey-"));
        let public = wg_key(&key_file);
        let ns = &node.ns;
        ns.ip(&["link", "add", "flannel-wg", "type", "wireguard"])
            .unwrap();
        ns.ip(&["link", "set", "flannel-wg", "mtu", "1420"])
            .unwrap();
        ns.exec(
            "wg",
            &[
                "set",
                "flannel-wg",
                "private-key",
                key_file.to_str().unwrap(),
                "listen-port",
                "51820",
            ],
        )
        .unwrap();
        ns.ip(&[
            "addr",
            "add",
            &format!("{}/32", subnet.network()),
            "dev",
            "flannel-wg",
        ])
        .unwrap();
        ns.ip(&["link", "set", "flannel-wg", "up"]).unwrap();
        ns.ip(&[
            "route",
            "replace",
            "10.244.0.0/16",
            "dev",
            "flannel-wg",
            "scope",
            "link",
        ])
        .unwrap();
        ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
        let lease = c.etcd.etcdctl(&["lease", "grant", "86400"]).unwrap();
        let etcd_lease = lease.split_whitespace().nth(1).unwrap().to_string();
        let f = Self {
            node,
            subnet,
            key_file,
            etcd_lease,
        };
        f.write_lease(c, &public);
        for n in &c.nodes {
            f.add_peer(&lease_key(c, n.subnet), n.node.ip, n.subnet);
        }
        f
    }

    fn write_lease(&self, c: &WeftCluster, public: &str) {
        c.etcd
            .etcdctl(&[
                "put",
                &format!("--lease={}", self.etcd_lease),
                &format!("{PREFIX}/subnets/{}", weft::lease::to_key(&self.subnet)),
                &serde_json::json!({
                    "PublicIP": self.node.ip.to_string(), "PublicIPv6": null,
                    "BackendType": "wireguard",
                    "BackendData": {"PublicKey": public, "Port": 51820},
                })
                .to_string(),
            ])
            .unwrap();
    }

    fn add_peer(&self, key: &str, ip: Ipv4Addr, subnet: Ipv4Net) {
        self.node
            .ns
            .exec(
                "wg",
                &[
                    "set",
                    "flannel-wg",
                    "peer",
                    key,
                    "endpoint",
                    &format!("{ip}:51820"),
                    "allowed-ips",
                    &subnet.to_string(),
                ],
            )
            .unwrap();
    }

    /// A new key, as a flannel node whose key file was lost makes one: the
    /// device's key replaced and the lease rewritten.
    fn rekey(&self, c: &WeftCluster) -> String {
        std::fs::remove_file(&self.key_file).unwrap();
        let public = wg_key(&self.key_file);
        self.node
            .ns
            .exec(
                "wg",
                &[
                    "set",
                    "flannel-wg",
                    "private-key",
                    self.key_file.to_str().unwrap(),
                ],
            )
            .unwrap();
        self.write_lease(c, &public);
        public
    }
}

impl Drop for Flannel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.key_file);
    }
}

#[test]
fn weft_and_flannel_nodes_share_one_encrypted_network_over_wireguard() {
    weft_tests::require_root();
    let mut c = WeftCluster::with_config(0, CONFIG, &[]).unwrap();
    let keys: Vec<PathBuf> = (1..=2)
        .map(|i| std::env::temp_dir().join(weft_tests::unique(&format!("weft-wgkey-{i}-"))))
        .collect();
    for (i, k) in (1..=2).zip(&keys) {
        c.add_node(i, &agent_args(k)).unwrap();
    }
    // Each key file is flannel's form: base64, mode 0400.
    for k in &keys {
        use std::os::unix::fs::PermissionsExt as _;
        let m = std::fs::metadata(k).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o400, "{}", k.display());
    }
    let subnet3 = c.free_subnets(1)[0];
    let f = Flannel::up(&c, 3, subnet3);
    let key3 = lease_key(&c, subnet3);

    // Every node has the others as WireGuard peers: the Weft nodes as
    // flannel's backend would set them (its endpoint at the public IP and
    // port 51820, its subnet as allowed IPs).
    for (i, n) in c.nodes.iter().enumerate() {
        let other = &c.nodes[1 - i];
        eventually(&format!("{} has both peers", n.agent.name), T, || {
            let peers = wg_peers(&n.node.ns, "flannel-wg");
            let want = [
                (
                    lease_key(&c, other.subnet),
                    format!("{}:51820", other.node.ip),
                    other.subnet.to_string(),
                ),
                (
                    key3.clone(),
                    format!("{}:51820", f.node.ip),
                    subnet3.to_string(),
                ),
            ];
            want.iter().all(|w| peers.contains(w)).then_some(())
        });
        // flannel's device as flannel makes it: MTU 1420, /32 of the
        // subnet's network address, the network routed to it.
        let link = n.node.ns.ip(&["-d", "link", "show", "flannel-wg"]).unwrap();
        assert!(
            link.contains("mtu 1420") && link.contains("wireguard"),
            "{link}"
        );
        let addr = n.node.ns.ip(&["-4", "addr", "show", "flannel-wg"]).unwrap();
        assert!(
            addr.contains(&format!("{}/32", n.subnet.network())),
            "{addr}"
        );
        let route = n.node.ns.ip(&["route", "show", "10.244.0.0/16"]).unwrap();
        assert!(route.contains("dev flannel-wg"), "{route}");
        assert_eq!(n.subnet_file_mtu(), 1420, "subnet.env has flannel's MTU");
    }

    // Every pod reaches every other pod (the flannel node's included).
    let mut pods: Vec<(&weft_tests::netns::Netns, Ipv4Addr)> = c
        .nodes
        .iter()
        .flat_map(|n| n.node.pods.iter().map(|p| (&p.ns, p.ip)))
        .collect();
    pods.extend(f.node.pods.iter().map(|p| (&p.ns, p.ip)));
    for (ns, from) in &pods {
        for (_, to) in &pods {
            if from != to {
                assert!(ping(ns, *to, 1), "{from} -> {to}");
            }
        }
    }

    // TCP intact both ways, Weft to Weft and Weft to flannel; meanwhile the
    // underlay carries WireGuard only: no pod address in clear.
    let (a, b) = (&c.nodes[0].node.pods[0], &c.nodes[1].node.pods[0]);
    let fp = &f.node.pods[0];
    // The pods (attached by bridge + host-local, as flannel's plugin does)
    // are adopted for host routing: their flows go straight to and from
    // the WireGuard device.
    let n0 = &c.nodes[0];
    eventually("node 1's pods adopted", T, || {
        let st: serde_json::Value =
            serde_json::from_str(&n0.weft(&["status", "--json"]).ok()?).ok()?;
        (st["host_routing"]["endpoints"].as_u64() == Some(n0.node.pods.len() as u64)).then_some(())
    });
    let bytes = |reason: &str| {
        n0.series(&format!(
            "weft_dataplane_bytes_total{{reason=\"{reason}\"}}"
        ))
        .unwrap_or(0.0)
    };
    let (sent0, delivered0) = (bytes("encap_bypass"), bytes("decap_bypass"));
    let clear = capture_count(&c.nodes[0].node.ns, "eth0", "net 10.244.0.0/16", || {
        for (srv, ip, port, cli) in [
            (&b.ns, b.ip, 5201, &a.ns),
            (&a.ns, a.ip, 5202, &b.ns),
            (&fp.ns, fp.ip, 5203, &a.ns),
            (&a.ns, a.ip, 5204, &fp.ns),
        ] {
            let (n, ok) = tcp_transfer(srv, ip, port, cli, 10 << 20);
            assert!(n == 10 << 20 && ok, "TCP {ip}:{port}");
        }
    });
    assert_eq!(
        clear, 0,
        "packets with a pod address in clear on the underlay"
    );
    // Node 1's pod sent 20 MiB (to node 2's pod and the flannel node's) and
    // received 20 MiB: nearly all of each took the fast path (a flow's
    // first packets take the stack until conntrack has confirmed it under
    // `auto`, and a full-size packet WireGuard's GRO did not merge may not
    // take an Ethernet header on the device). Measured in the 6.12 VM
    // (`bpf`): 20.2 MiB sent and 20.5 MiB delivered, pings included.
    let (sent, delivered) = (
        bytes("encap_bypass") - sent0,
        bytes("decap_bypass") - delivered0,
    );
    eprintln!(
        "fast path on node 1: {:.1} MiB sent straight to WireGuard, {:.1} MiB delivered straight from it",
        sent / 1048576.0,
        delivered / 1048576.0
    );
    assert!(
        sent > 19.0 * 1048576.0,
        "sent on the fast path: {sent} bytes"
    );
    assert!(
        delivered > 19.0 * 1048576.0,
        "delivered on the fast path: {delivered} bytes"
    );
    let sealed = capture_count(&c.nodes[0].node.ns, "eth0", "udp port 51820", || {
        assert!(ping(&a.ns, fp.ip, 5));
    });
    assert!(
        sealed >= 10,
        "the pings went over WireGuard ({sealed} packets)"
    );

    // weft status shows the device and its peers as the kernel has them,
    // the metrics count the peers by handshake and their bytes, and weft
    // doctor finds the port open.
    let n1 = &c.nodes[0];
    let st: serde_json::Value =
        serde_json::from_str(&n1.weft(&["status", "--json"]).unwrap()).unwrap();
    assert_eq!(st["backend"], "wireguard", "{st}");
    let dev = &st["devices"][0];
    assert_eq!(
        (&dev["name"], &dev["port"]),
        (&"flannel-wg".into(), &51820.into()),
        "{st}"
    );
    assert_eq!(
        dev["public_key"].as_str(),
        Some(lease_key(&c, n1.subnet).as_str())
    );
    let peers = dev["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2, "{st}");
    for p in peers {
        assert!(
            p["handshake_age_s"].as_u64().is_some(),
            "a handshake with {p}"
        );
        assert!(p["rx_bytes"].as_u64().unwrap() > 1 << 20, "{p}");
    }
    eventually(
        "the WireGuard metrics",
        weft_tests::scaled(Duration::from_secs(20)),
        || {
            (n1.series("weft_wireguard_peers{handshake=\"recent\"}") == Some(2.0)
                && n1
                    .series("weft_wireguard_received_bytes_total")
                    .is_some_and(|b| b > (20 << 20) as f64))
            .then_some(())
        },
    );
    let doctor = n1
        .node
        .ns
        .exec(
            weft_tests::agent::weft_bin().to_str().unwrap(),
            &["doctor", "--bpffs-dir", n1.pins.path().to_str().unwrap()],
        )
        .unwrap();
    assert!(doctor.contains("UDP 51820 is open"), "{doctor}");
    assert!(doctor.contains("handshook within 180 s"), "{doctor}");

    // A lease with a malformed key is rejected, with the reason.
    let bad_subnet = c.free_subnets(2)[1];
    let bad_key = format!("{PREFIX}/subnets/{}", weft::lease::to_key(&bad_subnet));
    c.etcd
        .etcdctl(&[
            "put",
            &bad_key,
            r#"{"PublicIP":"198.18.0.77","BackendType":"wireguard","BackendData":{"PublicKey":"not-a-key"}}"#,
        ])
        .unwrap();
    for n in &c.nodes {
        eventually(&format!("{} rejects the bad key", n.agent.name), T, || {
            n.rejected()
                .contains(&(bad_key.clone(), "public_key".to_string()))
                .then_some(())
        });
        assert_eq!(wg_peers(&n.node.ns, "flannel-wg").len(), 2);
    }

    // The flannel node re-keys: traffic to it resumes within 5 s, and
    // traffic between the Weft nodes goes on untouched meanwhile.
    let count = 100 * weft_tests::scaled(Duration::from_secs(8)).as_secs() as u32;
    let steady = ping_run(&a.ns, b.ip, count);
    std::thread::sleep(Duration::from_secs(1));
    let key3_new = f.rekey(&c);
    let since = std::time::Instant::now();
    let resumed = weft_tests::agent::poll(Duration::from_secs(5), || {
        ping(&a.ns, fp.ip, 1).then_some(())
    });
    let took = since.elapsed();
    assert!(
        resumed.is_some(),
        "traffic to the re-keyed node did not resume within 5 s"
    );
    println!("traffic to the re-keyed node resumed after {took:?}");
    for n in &c.nodes {
        let peers = wg_peers(&n.node.ns, "flannel-wg");
        assert!(
            peers.iter().any(|p| p.0 == key3_new),
            "{} has the new key",
            n.agent.name
        );
        assert!(
            !peers.iter().any(|p| p.0 == key3),
            "{} dropped the old key",
            n.agent.name
        );
    }
    let (sent, got) = ping_outcome(steady);
    assert_eq!(
        (sent, got),
        (count, count),
        "Weft-to-Weft pings lost while a peer re-keyed"
    );

    // An agent restarts under 100 pings a second: none lost, its key (and
    // device) unchanged.
    let key1 = lease_key(&c, c.nodes[0].subnet);
    let count = 100 * weft_tests::scaled(Duration::from_secs(10)).as_secs() as u32;
    let to_weft = ping_run(&a.ns, b.ip, count);
    let to_flannel = ping_run(&a.ns, fp.ip, count);
    std::thread::sleep(Duration::from_secs(1));
    let peer_writes = |c: &WeftCluster| c.nodes[0].agent.log().matches(" WireGuard peer ").count();
    let writes = peer_writes(&c);
    c.nodes[0].agent.restart().unwrap();
    c.nodes[0]
        .agent
        .wait_log_count("dataplane up (wireguard)", 2, weft_tests::scaled(T))
        .unwrap();
    for (what, p) in [("Weft", to_weft), ("flannel", to_flannel)] {
        let (sent, got) = ping_outcome(p);
        assert_eq!(
            (sent, got),
            (count, count),
            "pings to the {what} pod lost across the restart"
        );
    }
    assert!(
        c.nodes[0]
            .agent
            .log()
            .contains("adopted the WireGuard device as it is"),
        "the restarted agent adopted its device"
    );
    assert_eq!(
        lease_key(&c, c.nodes[0].subnet),
        key1,
        "the key changed across the restart"
    );
    assert_eq!(wg_peers(&c.nodes[0].node.ns, "flannel-wg").len(), 2);
    // The adopted peers were not written again (a write replaces a peer's
    // allowed IPs, and for that moment its subnet has no peer).
    assert_eq!(
        peer_writes(&c),
        writes,
        "the restarted agent wrote peers the device already had"
    );
    for k in &keys {
        let _ = std::fs::remove_file(k);
    }
}

/// A dual-stack network: in `separate` mode (flannel's default) each family
/// has its device (`flannel-wg` on 51820 over IPv4, `flannel-wg-v6` on
/// 51821 over IPv6); in `ipv6` mode one `flannel-wg` carries both families
/// with every peer reached over IPv6. Every pod reaches every other over
/// both families either way.
#[test]
fn dual_stack_networks_over_wireguard() {
    weft_tests::require_root();
    for (mode, devices) in [
        (
            "separate",
            vec![
                ("flannel-wg", ":51820", "10.244."),
                ("flannel-wg-v6", "]:51821", "fd00:10:244:"),
            ],
        ),
        ("ipv6", vec![("flannel-wg", "]:51820", "")]),
    ] {
        println!("Mode {mode}");
        let config = format!(
            r#"{{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{{"Type":"wireguard","Mode":"{mode}"}}}}"#
        );
        let mut c = weft_tests::dual::DualCluster::new(0, &config, &[]).unwrap();
        let keys: Vec<PathBuf> = (1..=2)
            .map(|i| std::env::temp_dir().join(weft_tests::unique(&format!("weft-wgkey-{i}-"))))
            .collect();
        // `--ip-masq`, as kube-flannel.yml runs flannel: without it the
        // pods' bridge masquerades what leaves the node's subnet, pod to
        // pod included (flannel's plugin's rule), and a NATed flow never
        // takes the fast path under auto.
        for (i, k) in (1..=2).zip(&keys) {
            let mut args = agent_args(k).to_vec();
            args.push("--ip-masq");
            c.add_node(i, &args).unwrap();
        }
        for (i, n) in c.nodes.iter().enumerate() {
            let other = &c.nodes[1 - i];
            for (dev, endpoint_end, allowed) in &devices {
                eventually(&format!("node {i} has its peer on {dev}"), T, || {
                    let peers = wg_peers(&n.node.ns, dev);
                    (peers.len() == 1
                        && peers[0].1.ends_with(endpoint_end)
                        && peers[0].2.contains(allowed)
                        && (mode != "ipv6" || peers[0].1.contains(&other.ip6.to_string())))
                    .then_some(())
                });
            }
        }
        // The lease as flannel writes it: one key for both families, each
        // with its port.
        let v = c
            .etcd
            .etcdctl(&[
                "get",
                "--print-value-only",
                &format!("{PREFIX}/subnets/{}", c.nodes[0].subnets.key()),
            ])
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(v.trim()).unwrap();
        assert_eq!(v["BackendType"], "wireguard", "{v}");
        assert_eq!(
            v["BackendData"]["PublicKey"], v["BackendV6Data"]["PublicKey"],
            "{v}"
        );
        assert_eq!(
            (&v["BackendData"]["Port"], &v["BackendV6Data"]["Port"]),
            (&51820.into(), &51821.into()),
            "{v}"
        );
        let failed = c.unreachable_pairs();
        assert!(failed.is_empty(), "Mode {mode}: unreachable: {failed:?}");
        // IPv6 pod to pod takes the fast path both ways: sent straight to
        // the device that carries IPv6, delivered straight from it. A TCP
        // flow: under auto's conntrack gate what conntrack does not track
        // to ESTABLISHED (a ping) takes the stack.
        use dataplane_common::Reason;
        let (from, to) = (&c.nodes[0].node.pods[0], &c.nodes[1].node.pods[0]);
        let to6 = to.ip6.expect("a dual-stack pod");
        let packets = |r: Reason| c.nodes[0].counters().get(r).unwrap().packets;
        let mut port = 5400u16;
        let fast = weft_tests::agent::poll(T, || {
            let (sent, delivered) = (packets(Reason::EncapBypass), packets(Reason::DecapBypass));
            port += 1;
            let (n, ok) = weft_tests::traffic::tcp_transfer(
                &to.ns,
                std::net::IpAddr::from(to6),
                port,
                &from.ns,
                1 << 20,
            );
            assert!(n == 1 << 20 && ok, "Mode {mode}: a TCP flow over IPv6");
            (packets(Reason::EncapBypass) >= sent + 5
                && packets(Reason::DecapBypass) >= delivered + 5)
                .then_some(())
        });
        if fast.is_none() {
            let ct = c.nodes[0]
                .node
                .ns
                .command("conntrack")
                .args(["-L", "-f", "ipv6"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let metrics = c.nodes[0]
                .node
                .ns
                .command("curl")
                .args(["-s", "http://127.0.0.1:9090/metrics"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let run = |cmd: &str, args: &[&str]| {
                c.nodes[0]
                    .node
                    .ns
                    .command(cmd)
                    .args(args)
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            };
            eprintln!(
                "nft:\n{}\nip6tables nat:\n{}\naddrs:\n{}\nroutes:\n{}",
                run("nft", &["list", "ruleset"]),
                run("ip6tables-save", &["-t", "nat"]),
                run("ip", &["-6", "addr"]),
                run("ip", &["-6", "route"])
            );
            panic!(
                "Mode {mode}: IPv6 not on the fast path: counters {:?}; metrics: {}; conntrack:\n{ct}",
                c.nodes[0].counters().all().unwrap(),
                metrics
                    .lines()
                    .filter(|l| l.contains("liberal") && !l.starts_with('#'))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        for k in &keys {
            let _ = std::fs::remove_file(k);
        }
    }
}
