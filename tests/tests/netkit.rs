//! Pods on netkit (`"podDevice": "netkit"` in Weft's standalone plugin):
//! the pod's device is a netkit pair and Weft's transmit program runs at
//! its peer hook, in the pod's own transmit; veth and netkit pods live side
//! by side on one node.
//!
//! The tests whose names end in `over_netkit` need a kernel with netkit
//! (Linux 6.7 or later; Debian's 6.12 has it built in). `cargo xtask test`
//! runs them in the 6.12 VM and skips them on the host, whose kernel has
//! none; on a kernel without netkit they fail, never pass. The last test
//! runs on every kernel: what ADD does when it cannot make a netkit pod.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use dataplane_common::Reason;
use serde_json::json;
use weft_tests::{
    agent::eventually,
    cni::{ConfList, cni_error, weft_standalone},
    counters::Snapshot,
    dual::{DUAL, DualCluster, DualNode},
    netns::Netns,
    traffic::{ping_outcome, ping_run, tcp_transfer},
};

const T: Duration = Duration::from_secs(60);

/// Whether this kernel has netkit (the tests' own check, which fails
/// where the VM runner says the kernel has it and it is not found).
fn kernel_has_netkit() -> bool {
    weft_tests::kernel::netkit_devices()
}

fn require_netkit() {
    assert!(
        kernel_has_netkit(),
        "this kernel ({}) has no netkit: the tests over netkit need Linux 6.7 or later with CONFIG_NETKIT (cargo xtask vm-test --kernel 6.12 netkit)",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
}

/// The host routing that puts pods' flows on the fast path: the default,
/// `auto` (the conntrack gate, with the kfuncs of vmlinux or of the
/// nf_conntrack module).
fn fast_path_mode() -> &'static str {
    "auto"
}

/// Weft's standalone plugin on `n`, making netkit pods.
fn netkit_conf(n: &DualNode) -> ConfList {
    let mut c = weft_standalone(
        &n.agent.subnet_file(),
        &n.agent.state_dir(),
        &n.node.ipam_dir,
    );
    c.plugins[0]["podDevice"] = json!("netkit");
    c
}

/// Adds a netkit pod to `n`, retrying as a runtime does while the plugin
/// answers "try again later" (the agent has not installed its programs
/// yet).
fn add_netkit_pod(n: &mut DualNode) -> usize {
    let veth = n.node.cni.replace(netkit_conf(n));
    eventually("a netkit pod added", T, || match n.node.add_pod() {
        Ok(_) => Some(()),
        Err(e) if cni_error(&e).is_some_and(|v| v["code"] == 11) => None,
        Err(e) => panic!("netkit ADD failed: {e:#}"),
    });
    n.node.cni = veth;
    n.node.pods.len() - 1
}

/// Two dual-stack nodes, each with two veth pods (the standalone plugin's
/// default) and two netkit pods (pods 2 and 3).
fn mixed_cluster() -> DualCluster {
    require_netkit();
    let mut c = DualCluster::new(2, DUAL, &["--host-routing", fast_path_mode()]).unwrap();
    for n in &mut c.nodes {
        for _ in 0..2 {
            add_netkit_pod(n);
        }
    }
    c.wait_meshed(T);
    c
}

fn driver(ns: &Netns, iface: &str) -> String {
    ns.exec("ethtool", &["-i", iface])
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("driver: ").map(str::to_string))
        .unwrap_or_default()
}

/// The pins of links at netkit peer hooks on `n`.
fn netkit_link_pins(n: &DualNode) -> Vec<String> {
    std::fs::read_dir(n.pins.pins().links())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.starts_with("netkit_peer-"))
                .collect()
        })
        .unwrap_or_default()
}

fn endpoint_ips(n: &DualNode) -> Vec<IpAddr> {
    weft::dataplane::EndpointMap::open(n.pins.pins())
        .and_then(|m| m.all())
        .map(|m| m.into_keys().collect())
        .unwrap_or_default()
}

/// One cluster for all that needs one (it takes minutes to build under
/// emulation): pods of both kinds reach each other with TCP intact, a
/// netkit pod's spoofed sources are refused and counted, an agent restart
/// loses nothing, and DEL leaves nothing.
#[test]
fn netkit_pods_beside_veth_pods_over_netkit() {
    let mut c = mixed_cluster();
    reach_with_tcp_intact(&c);
    spoofed_sources_are_dropped_and_counted(&c);
    restart_loses_nothing_and_del_leaves_nothing(&mut c);
}

/// Pings from `p` (in `c`) to every other pod address of `c` (of the
/// families `p` has); the pairs that failed twice.
fn unreachable_from(c: &DualCluster, node: usize, pod: usize) -> Vec<String> {
    let p = &c.nodes[node].node.pods[pod];
    let mut failed = Vec::new();
    for n in &c.nodes {
        for q in &n.node.pods {
            if q.container_id == p.container_id {
                continue;
            }
            for dst in [IpAddr::from(q.ip), IpAddr::from(q.ip6.unwrap())] {
                let ok = weft_tests::cluster::ping(&p.ns, dst, 2) || {
                    std::thread::sleep(Duration::from_secs(1));
                    weft_tests::cluster::ping(&p.ns, dst, 2)
                };
                if !ok {
                    failed.push(format!("{} ({}) -> {dst} ({})", p.ip, p.host_if, q.host_if));
                }
            }
        }
    }
    failed
}

fn reach_with_tcp_intact(c: &DualCluster) {
    for n in &c.nodes {
        for p in &n.node.pods[2..] {
            assert_eq!(driver(&n.node.ns, &p.host_if), "netkit", "{}", p.host_if);
        }
        for p in &n.node.pods[..2] {
            assert_eq!(driver(&n.node.ns, &p.host_if), "veth", "{}", p.host_if);
        }
        // Each netkit pod's program is linked at its peer hook, pinned
        // where the agent keeps its links.
        let pins = netkit_link_pins(n);
        assert_eq!(pins.len(), 2, "{pins:?}");
        for p in &n.node.pods[2..] {
            assert!(
                pins.iter()
                    .any(|f| f.starts_with(&format!("netkit_peer-{}-", p.host_if))),
                "{} in {pins:?}",
                p.host_if
            );
        }
        // The bridge answers for the netkit pods' addresses.
        let proxies = n
            .node
            .ns
            .ip(&["neigh", "show", "proxy"])
            .unwrap_or_default();
        for p in &n.node.pods[2..] {
            for a in [IpAddr::from(p.ip), IpAddr::from(p.ip6.unwrap())] {
                assert!(
                    proxies.contains(&format!("{a} dev cni0")),
                    "no proxy for {a}: {proxies}"
                );
            }
        }
        // The agent takes all four pods' addresses (both families) as
        // endpoints of the fast path.
        eventually("every pod an endpoint", T, || {
            (endpoint_ips(n).len() == 8).then_some(())
        });
    }
    // A veth pod and a netkit pod of each node reach every other pod,
    // both families: netkit to netkit and to veth and back, on one node
    // (through the bridge's neighbour proxies) and across.
    let mut failed = Vec::new();
    for node in 0..c.nodes.len() {
        for pod in [0, 2] {
            failed.extend(unreachable_from(c, node, pod));
        }
    }
    assert!(failed.is_empty(), "unreachable: {failed:?}");

    // TCP intact both ways, both families, netkit pod to netkit pod
    // across the nodes; the fast path carries it where it may.
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let bytes = (8 << 20) / weft_tests::time_scale() as usize;
    let (ca, cb) = (a.counters(), b.counters());
    let (sa, sb) = (Snapshot::of(&ca), Snapshot::of(&cb));
    for (port, (from, to)) in [(5301u16, (a, b)), (5302, (b, a))] {
        let (src, dst) = (&from.node.pods[2], &to.node.pods[3]);
        for (i, dst_ip) in [IpAddr::from(dst.ip), IpAddr::from(dst.ip6.unwrap())]
            .into_iter()
            .enumerate()
        {
            let (n, ok) = tcp_transfer(&dst.ns, dst_ip, port + 10 * i as u16, &src.ns, bytes);
            assert_eq!(n, bytes, "{} -> {dst_ip}: bytes", src.ip);
            assert!(ok, "{} -> {dst_ip}: the bytes arrived changed", src.ip);
        }
    }
    // Packets here are the stack's (GSO aggregates of up to 64 KB): the
    // fast path's share of the bytes both nodes encapsulated. Under auto's
    // conntrack gate each flow's handshake and its first packets, until
    // the agent has made it liberal, take the stack: a few small packets
    // per flow, a large share of the packets of these short transfers,
    // not of their bytes.
    let since = |r| {
        let (a, b) = (Snapshot::of(&ca), Snapshot::of(&cb));
        (
            a.since(&sa, r) + b.since(&sb, r),
            a.bytes_since(&sa, r) + b.bytes_since(&sb, r),
        )
    };
    let ((fast, fast_b), (slow, slow_b)) =
        (since(Reason::EncapBypass), since(Reason::Encapsulated));
    let share = fast_b as f64 / (fast_b + slow_b).max(1) as f64;
    println!(
        "encapsulated during the transfers: {fast} packets ({fast_b} bytes) on the fast path, {slow} ({slow_b} bytes) through the stack ({share:.3} of the bytes)"
    );
    assert!(
        fast > 0 && share >= 0.95,
        "the fast path carried {fast_b} of {} bytes of the transfers",
        fast_b + slow_b
    );
}

fn spoofed_sources_are_dropped_and_counted(c: &DualCluster) {
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let (x, y, z) = (&n1.node.pods[2], &n1.node.pods[3], &n2.node.pods[2]);
    let z_ip = z.ip;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let recv = z.ns.spawn_thread({
        let sent = sent.clone();
        move || {
            let s = std::net::UdpSocket::bind((z_ip, 7777)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            ready_tx.send(()).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            let deadline = std::time::Instant::now() + weft_tests::scaled(Duration::from_secs(60));
            while std::time::Instant::now() < deadline {
                match s.recv_from(&mut buf) {
                    Ok((k, from)) => {
                        got.push((from.ip(), String::from_utf8_lossy(&buf[..k]).into_owned()))
                    }
                    Err(_) if sent.load(std::sync::atomic::Ordering::SeqCst) => break,
                    Err(_) => {}
                }
            }
            got
        }
    });
    ready_rx.recv().unwrap();
    let counters = n1.counters();
    let before = Snapshot::of(&counters);
    // From X's netkit device: five datagrams from Y's address (a local
    // pod's), five from the node's, five of X's own. An L3 netkit has no
    // MAC addresses: the frame's are zero.
    let script = format!(
        r#"
import socket
from scapy.all import Ether, IP, UDP, Raw, raw
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
def send(src, sport, payload):
    f = Ether(src="00:00:00:00:00:00", dst="00:00:00:00:00:00")/IP(src=src, dst="{z}")/UDP(sport=sport, dport=7777)/Raw(payload)
    refused = 0
    for _ in range(5):
        try:
            s.send(raw(f))
        except OSError:
            refused += 1
    print(payload.decode(), refused)
send("{y}", 40001, b"spoof-y")
send("{node}", 40003, b"spoof-node")
send("{x}", 40002, b"genuine")
"#,
        z = z.ip,
        y = y.ip,
        x = x.ip,
        node = n1.node.ip,
    );
    let r = x.ns.exec("/usr/bin/python3", &["-c", &script]);
    std::thread::sleep(weft_tests::scaled(Duration::from_secs(1)));
    sent.store(true, std::sync::atomic::Ordering::SeqCst);
    // A netkit runs the program in the sender's own transmit: what it
    // drops, the sender's send() is told (ENOBUFS), unlike on a veth.
    let refused = r.unwrap();
    println!("refused at send: {refused}");
    {
        assert_eq!(
            refused.split_whitespace().collect::<Vec<_>>(),
            ["spoof-y", "5", "spoof-node", "5", "genuine", "0"],
            "the sends the program refused"
        );
    }
    let got = recv.join().unwrap();
    let after = Snapshot::of(&counters);
    let from = |payload: &str| got.iter().filter(|(_, p)| p == payload).count();
    assert_eq!(from("spoof-y"), 0, "{got:?}");
    assert_eq!(from("spoof-node"), 0, "{got:?}");
    assert_eq!(from("genuine"), 5, "X's own datagrams arrive: {got:?}");
    {
        assert_eq!(
            after.since(&before, Reason::DropInvalidSource),
            10,
            "each spoofed datagram counted as drop_invalid_source"
        );
    }
}

/// The id of what is pinned at `path` (a link's program, or a program).
fn pinned_id(what: &str, path: &Path) -> u64 {
    let out = weft_tests::proc::run(
        "bpftool",
        &["-j", what, "show", "pinned", path.to_str().unwrap()],
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[if what == "link" { "prog_id" } else { "id" }]
        .as_u64()
        .unwrap()
}

/// The program ids at node `n`'s netkit links, and the current
/// generation's `weft_from_pod`.
fn netkit_programs(n: &DualNode) -> (Vec<u64>, u64) {
    let links = n.pins.pins().links();
    let ids = netkit_link_pins(n)
        .iter()
        .map(|f| pinned_id("link", &links.join(f)))
        .collect();
    let current = n.pins.path().join("programs").join("weft_from_pod");
    (ids, pinned_id("prog", &current))
}

fn restart_loses_nothing_and_del_leaves_nothing(c: &mut DualCluster) {
    let (before, gen_before) = netkit_programs(&c.nodes[0]);
    assert_eq!(
        before,
        [gen_before, gen_before],
        "the links run the current generation"
    );
    let to = c.nodes[1].node.pods[2].ip;
    // 100 pings a second from a netkit pod on node 1 to one on node 2,
    // through a restart of node 1's agent: 15 s of them (stretched where
    // emulation slows the agent's start), which covers the new agent's
    // swap of its programs into the links.
    let count = 100 * weft_tests::scaled(Duration::from_secs(15)).as_secs() as u32;
    let ping = ping_run(&c.nodes[0].node.pods[2].ns, to, count);
    std::thread::sleep(Duration::from_secs(2));
    c.nodes[0].agent.restart().unwrap();
    let (sent, got) = ping_outcome(ping);
    let swapped_during = netkit_programs(&c.nodes[0]).1 != gen_before;
    println!(
        "{got} of {sent} pings answered across the restart; the programs swapped while they ran: {swapped_during}"
    );
    assert_eq!((sent, got), (count, count), "pings lost across the restart");
    // The restarted agent adopted the links (their pins, the pods' own
    // program) and the pods still reach each other.
    let n = &c.nodes[0];
    eventually("the endpoints back", T, || {
        (endpoint_ips(n).len() == 8).then_some(())
    });
    assert_eq!(netkit_link_pins(n).len(), 2);
    // The restarted agent installs a new generation of programs and swaps
    // it into the pods' netkit links (an upgrade does the same); the
    // endpoints above were back at once (their map is pinned), the new
    // programs come once it has loaded them.
    eventually("the new generation in the netkit links", T, || {
        let (after, gen_after) = netkit_programs(n);
        (gen_after != gen_before && after == [gen_after, gen_after]).then_some(())
    });
    let (sent, got) = ping_outcome(ping_run(&n.node.pods[3].ns, to, 200));
    assert_eq!((sent, got), (200, 200), "pings after the restart");

    // DEL of a netkit pod: its pair, its link's pin, its host routes, its
    // record, its addresses in IPAM and its endpoints go.
    let n = &mut c.nodes[0];
    let gone = n.node.del_pod(2).unwrap();
    let addrs = [IpAddr::from(gone.ip), IpAddr::from(gone.ip6.unwrap())];
    assert!(
        n.node.ns.ifindex(&gone.host_if).is_none(),
        "{} still exists",
        gone.host_if
    );
    let pins = netkit_link_pins(n);
    assert!(!pins.iter().any(|p| p.contains(&gone.host_if)), "{pins:?}");
    for a in addrs {
        let route = n
            .node
            .ns
            .ip(&[
                if a.is_ipv6() { "-6" } else { "-4" },
                "route",
                "show",
                &a.to_string(),
            ])
            .unwrap();
        assert!(route.trim().is_empty(), "a route to {a} stayed: {route}");
        let ipam = walk(&n.node.ipam_dir);
        assert!(
            !ipam.iter().any(|f| f.ends_with(&a.to_string())),
            "host-local still holds {a}: {ipam:?}"
        );
    }
    let proxies = n
        .node
        .ns
        .ip(&["neigh", "show", "proxy"])
        .unwrap_or_default();
    for a in addrs {
        assert!(
            !proxies.contains(&format!("{a} ")),
            "the proxy for {a} stayed: {proxies}"
        );
    }
    let records = walk(&n.agent.state_dir().join("endpoints"));
    assert!(
        !records.iter().any(|r| r.contains(&gone.container_id)),
        "{records:?}"
    );
    eventually("its endpoints removed", T, || {
        let eps = endpoint_ips(n);
        (!addrs.iter().any(|a| eps.contains(a))).then_some(())
    });
    // A second DEL (the runtime retries) finds nothing and succeeds.
    let conf = netkit_conf(n);
    conf.del(
        &n.node.ns,
        &gone.container_id,
        None,
        "eth0",
        Some(&gone.result),
    )
    .unwrap();
    // The other netkit pod is untouched.
    assert!(weft_tests::cluster::ping(&n.node.pods[2].ns, to, 3));

    // An ADD that died after its proxies but before its record (killed
    // by the runtime's timeout): the runtime's DEL, with no result to
    // pass, still removes the pair, its proxies and its addresses.
    let pod = &n.node.pods[2];
    let (cid, addrs) = (
        pod.container_id.clone(),
        [IpAddr::from(pod.ip), IpAddr::from(pod.ip6.unwrap())],
    );
    let record = n
        .agent
        .state_dir()
        .join("endpoints")
        .join(format!("{cid}-eth0.json"));
    std::fs::remove_file(&record).unwrap();
    let proxied = |n: &DualNode| {
        let proxies = n
            .node
            .ns
            .ip(&["neigh", "show", "proxy"])
            .unwrap_or_default();
        addrs
            .iter()
            .filter(|a| proxies.contains(&format!("{a} ")))
            .count()
    };
    assert_eq!(proxied(n), 2, "the ADD left its proxies");
    conf.del(&n.node.ns, &cid, None, "eth0", None).unwrap();
    assert_eq!(proxied(n), 0, "DEL removed the proxies nobody recorded");
    assert!(
        n.node.ns.ifindex(&pod.host_if).is_none(),
        "{} stays",
        pod.host_if
    );
    let ipam = walk(&n.node.ipam_dir);
    for a in addrs {
        assert!(
            !ipam.iter().any(|f| f.ends_with(&a.to_string())),
            "host-local still holds {a}: {ipam:?}"
        );
    }
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(d) = std::fs::read_dir(dir) {
        for e in d.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// What ADD does when it cannot make a netkit pod, on every kernel: with no
/// agent programs on the node it asks the runtime to try again (CNI error
/// 11) before touching anything; on a kernel without netkit it says so
/// and gives back the address it took.
#[test]
fn a_netkit_add_that_cannot_work_fails_clearly_and_leaves_nothing() {
    let mut c = DualCluster::new(1, DUAL, &[]).unwrap();
    let n = &mut c.nodes[0];
    let pod = Netns::new("wp").unwrap();
    pod.enable_ipv6().unwrap();
    let id = weft_tests::cni::container_id(pod.name());
    let allocated = |n: &DualNode| {
        walk(&n.node.ipam_dir)
            .into_iter()
            .filter(|f| f.contains('.') || f.matches(':').count() > 1)
            .filter(|f| !f.contains("last_reserved_ip") && !f.ends_with("lock"))
            .count()
    };
    let before = allocated(n);

    // No programs announced in this state directory.
    let empty = std::env::temp_dir().join(weft_tests::unique("weft-state-"));
    std::fs::create_dir_all(&empty).unwrap();
    let mut conf = netkit_conf(n);
    conf.plugins[0]["stateDir"] = json!(empty);
    let e = conf.add(&n.node.ns, &id, &pod, "eth0").unwrap_err();
    let v = cni_error(&e).unwrap_or_else(|| panic!("not a CNI error: {e:#}"));
    assert_eq!(v["code"], 11, "{v}");
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains("has not installed its programs"),
        "{v}"
    );
    assert_eq!(allocated(n), before, "an address was taken");
    let _ = std::fs::remove_dir_all(&empty);

    // The agent's own state directory: where the kernel has netkit the pod
    // is made; where it has none, ADD says so and gives its address back.
    let conf = netkit_conf(n);
    let r = eventually("the agent's programs installed", T, || {
        match conf.add(&n.node.ns, &id, &pod, "eth0") {
            Err(e) if cni_error(&e).is_some_and(|v| v["code"] == 11) => None,
            r => Some(r),
        }
    });
    let links = n.node.ns.ip(&["-o", "link", "show"]).unwrap();
    if kernel_has_netkit() {
        let a = r.unwrap();
        assert_eq!(driver(&n.node.ns, &a.host_if), "netkit");
        assert!(a.ip != Ipv4Addr::UNSPECIFIED && a.ip6.is_some());
        assert_eq!(allocated(n), before + 2);
        conf.del(&n.node.ns, &id, Some(&pod), "eth0", Some(&a.result))
            .unwrap();
        assert_eq!(allocated(n), before);
    } else {
        // The agent found no netkit: ADD says so before taking an address.
        let e = r.unwrap_err();
        let v = cni_error(&e).unwrap_or_else(|| panic!("not a CNI error: {e:#}"));
        assert_eq!(v["code"], 7, "{v}");
        assert!(
            v["msg"]
                .as_str()
                .unwrap()
                .contains("no netkit on this node"),
            "{v}"
        );
        assert_eq!(allocated(n), before, "the address was not given back");
        assert!(!links.contains(": nk"), "a device stayed: {links}");
        assert!(netkit_link_pins(n).is_empty());
    }
}

/// netkit turned off as if the kernel lacked it (`--kernel-feature-off
/// netkit`, a test's switch; on the host, whose kernel has none, it is off
/// anyway): ADD refuses a netkit pod, naming why, before it takes an
/// address, and veth pods still reach each other across the nodes, both
/// families.
#[test]
fn with_netkit_off_a_netkit_add_is_refused_and_veth_pods_carry_traffic() {
    let c = DualCluster::new(2, DUAL, &["--kernel-feature-off", "netkit"]).unwrap();
    c.wait_meshed(T);
    let n = &c.nodes[0];
    let before = walk(&n.node.ipam_dir).len();
    let pod = Netns::new("wq").unwrap();
    pod.enable_ipv6().unwrap();
    let id = weft_tests::cni::container_id(pod.name());
    let conf = netkit_conf(n);
    let e = eventually("the agent's programs and report", T, || {
        match conf.add(&n.node.ns, &id, &pod, "eth0") {
            Err(e) if cni_error(&e).is_some_and(|v| v["code"] == 11) => None,
            r => Some(r),
        }
    })
    .unwrap_err();
    let v = cni_error(&e).unwrap_or_else(|| panic!("not a CNI error: {e:#}"));
    assert_eq!(v["code"], 7, "{v}");
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.contains("no netkit on this node") && msg.contains("podDevice"),
        "{v}"
    );
    if kernel_has_netkit() {
        assert!(msg.contains("turned off"), "{v}");
    }
    assert_eq!(walk(&n.node.ipam_dir).len(), before, "an address was taken");
    let links = n.node.ns.ip(&["-o", "link", "show"]).unwrap();
    assert!(!links.contains(": nk"), "a netkit device was made: {links}");

    // The node's veth pods are unaffected.
    let failed = unreachable_from(&c, 0, 0);
    assert!(failed.is_empty(), "unreachable: {failed:?}");
}
