//! Paths of different MTUs on one underlay: nodes 1 and 2 on a 9000-byte
//! segment, node 3 on another 9000-byte segment behind a router whose link
//! between the two carries 1500 bytes. No `Backend.MTU`: pods get 8950.
//!
//! Each agent measures each peer's path MTU through the tunnel (probes
//! whose outer header says don't-fragment): 9000 between nodes 1 and 2,
//! 1500 to and from node 3, with the router's ICMP on or dropped (the
//! search does not need it). The route to node 3's pods then carries MTU
//! 1450: a pod's don't-fragment packet too big for it is answered with
//! "fragmentation needed" (mtu 1450) by its own node, on the fast path as
//! on the host-stack path, while jumbo frames go through to node 2. Bulk
//! TCP crosses both ways, from a pod (the fast path) and from the node
//! itself (the host-stack path).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use dataplane_common::Reason;
use weft::dataplane::Counters;
use weft_tests::{
    agent::{eventually, weft_bin},
    cluster::{Node, Underlay, ping},
    iperf::{intervals, report},
    netns::{Netns, veth},
    traffic::tcp_transfer,
    weft_cluster::{ETCD_IP, WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);
const JUMBO: &str = "9000";

fn packets(n: &WeftNode, r: Reason) -> u64 {
    Counters::open(n.pins.pins())
        .unwrap()
        .get(r)
        .unwrap()
        .packets
}

/// Raises every port of `bridge` in `ns`, then the bridge, to `mtu`.
fn jumbo_bridge(ns: &Netns, bridge: &str) {
    let ports = ns.ip(&["-o", "link", "show", "master", bridge]).unwrap();
    for line in ports.lines() {
        let name = line.split(": ").nth(1).unwrap().split('@').next().unwrap();
        ns.ip(&["link", "set", name, "mtu", JUMBO]).unwrap();
    }
    ns.ip(&["link", "set", bridge, "mtu", JUMBO]).unwrap();
}

/// The router: a namespace holding the second segment's bridge (`br1`,
/// 198.18.1.254/24), linked to the underlay namespace by a 1500-byte veth
/// (198.18.9.0/30). Returns it with node 3 (198.18.1.3) on `br1`.
fn behind_a_small_link(underlay: &Underlay) -> (Netns, Node) {
    let router = Netns::new("wr").unwrap();
    veth(&underlay.ns, "small", &router, "small").unwrap();
    underlay
        .ns
        .ip(&["addr", "add", "198.18.9.1/30", "dev", "small"])
        .unwrap();
    router
        .ip(&["addr", "add", "198.18.9.2/30", "dev", "small"])
        .unwrap();
    underlay
        .ns
        .ip(&["route", "add", "198.18.1.0/24", "via", "198.18.9.2"])
        .unwrap();
    underlay.ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
    router.sysctl("net.ipv4.ip_forward", "1").unwrap();
    router
        .ip(&["link", "add", "br1", "type", "bridge"])
        .unwrap();
    router.ip(&["link", "set", "br1", "up"]).unwrap();
    router
        .ip(&["addr", "add", "198.18.1.254/24", "dev", "br1"])
        .unwrap();
    router
        .ip(&["route", "add", "default", "via", "198.18.9.1"])
        .unwrap();
    let ns = Netns::new("wn").unwrap();
    veth(&ns, "eth0", &router, "p3").unwrap();
    router.ip(&["link", "set", "p3", "master", "br1"]).unwrap();
    ns.ip(&["addr", "add", "198.18.1.3/24", "dev", "eth0"])
        .unwrap();
    ns.ip(&["link", "set", "eth0", "mtu", JUMBO]).unwrap();
    ns.ip(&["route", "add", "default", "via", "198.18.1.254"])
        .unwrap();
    jumbo_bridge(&router, "br1");
    (router, Node::in_ns(ns, 3, Ipv4Addr::new(198, 18, 1, 3)))
}

fn mtu(ns: &Netns, dev: &str) -> u32 {
    let out = ns.ip(&["-o", "link", "show", dev]).unwrap();
    let at = out.find(" mtu ").unwrap() + 5;
    out[at..].split(' ').next().unwrap().parse().unwrap()
}

/// A don't-fragment ping of `size` bytes of payload.
fn ping_df(from: &Netns, to: Ipv4Addr, size: u32) -> bool {
    from.command("ping")
        .args(["-c", "2", "-W", "2", "-M", "do", "-s", &size.to_string()])
        .arg(to.to_string())
        .output()
        .unwrap()
        .status
        .success()
}

/// 32 MiB over TCP from `from` to `to`: intact, within 60 s.
fn bulk(what: &str, to: (&Netns, Ipv4Addr), from: &Netns, port: u16) {
    let t = Instant::now();
    let (got, ok) = tcp_transfer(to.0, to.1, port, from, 32 << 20);
    assert!(got == 32 << 20 && ok, "{what}: {got} bytes, intact: {ok}");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(60), "{what} took {took:?}");
    println!("{what}: 32 MiB in {took:.1?}");
}

/// `weft doctor`'s first line for `check` on node `n` that contains
/// `with`.
fn doctor_line(n: &WeftNode, check: &str, with: &str) -> String {
    let out = n
        .node
        .ns
        .command(weft_bin().to_str().unwrap())
        .args(["doctor", "--bpffs-dir"])
        .arg(n.pins.path())
        .arg("--state-dir")
        .arg(n.agent.state_dir())
        .arg("--subnet-file")
        .arg(n.agent.subnet_file())
        .args(["--etcd-endpoints", &format!("http://{ETCD_IP}:2379")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.get(6..).is_some_and(|r| r.starts_with(check)) && l.contains(with))
        .unwrap_or_else(|| panic!("no {check} line:\n{text}"))
        .to_string()
}

/// The MSS of a TCP connection from `from` to `to:port` (a listener in
/// `to_ns`), as the connecting socket has it once established.
fn mss(from: &Netns, to_ns: &Netns, to: Ipv4Addr, port: u16) -> u32 {
    let (tx, rx) = std::sync::mpsc::channel();
    let server = to_ns.spawn_thread(move || {
        let l = std::net::TcpListener::bind((to, port)).unwrap();
        tx.send(()).unwrap();
        let _ = l.accept();
    });
    rx.recv().unwrap();
    let got = from
        .run(move || {
            use std::os::fd::AsRawFd as _;
            let s = std::net::TcpStream::connect((to, port)).unwrap();
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt into a c_int of its size.
            let rc = unsafe {
                libc::getsockopt(
                    s.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_MAXSEG,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            v as u32
        })
        .unwrap();
    server.join().unwrap();
    got
}

/// The path MTU a don't-fragment UDP socket in `from` learns by sending
/// one 8000-byte datagram to `to:port` (`IP_MTU` once the answer came).
fn udp_df_mtu(from: &Netns, to: Ipv4Addr, port: u16) -> u32 {
    from.run(move || {
        use std::os::fd::AsRawFd as _;
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let fd = s.as_raw_fd();
        let on: libc::c_int = libc::IP_PMTUDISC_DO;
        // SAFETY: setsockopt with a c_int of its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        s.connect((to, port)).unwrap();
        // The pod's own MTU (8950) lets it leave; its node answers.
        s.send(&[0u8; 8000]).unwrap();
        let mut mtu: libc::c_int = 0;
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt into a c_int of its size.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU,
                    (&mut mtu as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            if mtu < 8950 {
                break;
            }
        }
        mtu as u32
    })
    .unwrap()
}

/// The path MTU node `n`'s status reports for `peer`'s subnet.
fn path_mtu(n: &WeftNode, peer: &WeftNode) -> Option<u64> {
    let subnet = peer.subnet;
    let v = n.status_json()?;
    v["peer_health"]
        .as_array()?
        .iter()
        .find(|h| h["subnet"] == subnet.to_string())?["path_mtu"]
        .as_u64()
}

/// A don't-fragment ping's output (both streams).
fn ping_df_output(from: &Netns, to: Ipv4Addr, size: u32) -> String {
    let out = from
        .command("ping")
        .args(["-c", "1", "-W", "2", "-M", "do", "-s", &size.to_string()])
        .arg(to.to_string())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn smaller_hop(router_icmp: bool) {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    for i in 1..=2 {
        let node = Node::new(&c.underlay, i).unwrap();
        node.ns.ip(&["link", "set", "eth0", "mtu", JUMBO]).unwrap();
        node.ns
            .ip(&["route", "add", "198.18.1.0/24", "via", "198.18.0.254"])
            .unwrap();
        c.start_node_on(node, &[]).unwrap();
    }
    jumbo_bridge(&c.underlay.ns, "br0");
    let (router, node) = behind_a_small_link(&c.underlay);
    if !router_icmp {
        // Neither end of the small link (the underlay's router and node
        // 3's) lets a "fragmentation needed" out.
        for (ns, chain) in [&c.underlay.ns, &router]
            .into_iter()
            .flat_map(|ns| [(ns, "OUTPUT"), (ns, "FORWARD")])
        {
            ns.exec(
                "iptables",
                &[
                    "-A",
                    chain,
                    "-p",
                    "icmp",
                    "--icmp-type",
                    "fragmentation-needed",
                    "-j",
                    "DROP",
                ],
            )
            .unwrap();
        }
    }
    c.start_node_on(node, &[]).unwrap();
    for n in c.nodes.iter_mut() {
        n.use_cni();
        n.node.add_pod().unwrap();
    }
    eventually("every peer programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 2)
            .then_some(())
    });
    let (n1, n2, n3) = (&c.nodes[0], &c.nodes[1], &c.nodes[2]);
    let (p1, p2, p3) = (&n1.node.pods[0], &n2.node.pods[0], &n3.node.pods[0]);
    for n in &c.nodes {
        assert_eq!(mtu(&n.node.pods[0].ns, "eth0"), 8950, "pods' MTU");
    }

    // Each path measured, both ways.
    let want = [
        (0, 1, 9000),
        (1, 0, 9000),
        (0, 2, 1500),
        (2, 0, 1500),
        (1, 2, 1500),
        (2, 1, 1500),
    ];
    eventually("every path MTU measured", T, || {
        want.iter()
            .all(|(a, b, m)| path_mtu(&c.nodes[*a], &c.nodes[*b]) == Some(*m))
            .then_some(())
    });
    assert!(n1.metric("weft_peers_path_mtu_measured") == 2.0);
    // TCP between pods (both at MTU 8950): the jumbo MSS to node 2's pod;
    // to node 3's, the SYNs' MSS clamped to its path (before any ICMP
    // could have told the pod).
    let jumbo = mss(&p1.ns, &p2.ns, p2.ip, 5320);
    let small = mss(&p1.ns, &p3.ns, p3.ip, 5321);
    println!("MSS: pod 1 -> pod 2 {jumbo}, pod 1 -> pod 3 {small}");
    assert!(jumbo >= 8800, "pod 1 -> pod 2: MSS {jumbo}");
    assert!(
        (1300..=1410).contains(&small),
        "pod 1 -> pod 3: MSS {small}"
    );
    assert!(n1.metric("weft_peer_path_mtu_min_bytes") == 1500.0);
    let status = n1.weft(&["status"]).unwrap();
    assert!(status.contains("1500 (measured"), "{status}");
    // Doctor names the smaller path (a warning: it is handled).
    let line = doctor_line(n1, "path-mtu", "");
    assert!(
        line.starts_with("warn") && line.contains("1 of 2") && line.contains("198.18.1.3) 1500"),
        "{line}"
    );
    // Its full-size probe to node 3 is the path's size, and passes.
    let line = doctor_line(n1, "peers", &format!("peer {}", n3.subnet));
    assert!(
        line.starts_with("ok") && line.contains("a 1450-byte probe"),
        "{line}"
    );

    // Jumbo frames where the path carries them; "fragmentation needed"
    // with the path's MTU where it does not, from the pod's own node.
    assert!(ping_df(&p1.ns, p2.ip, 8900), "jumbo pod 1 -> pod 2");
    // A UDP sender with don't-fragment (pod 2, which has sent nothing to
    // pod 3 yet): its 8000-byte datagram is answered with "fragmentation
    // needed" naming 1450, which its socket then reports.
    let learnt = udp_df_mtu(&p2.ns, p3.ip, 5330);
    assert_eq!(learnt, 1450, "pod 2 -> pod 3: the socket's path MTU");
    let out = ping_df_output(&p1.ns, p3.ip, 8900);
    assert!(out.contains("mtu = 1450"), "pod 1 -> pod 3: {out}");
    let out = ping_df_output(&p3.ns, p1.ip, 8900);
    assert!(out.contains("mtu = 1450"), "pod 3 -> pod 1: {out}");
    assert!(
        ping_df(&p1.ns, p3.ip, 1422),
        "a full 1450-byte packet pod 1 -> pod 3"
    );
    assert!(ping(&p3.ns, p1.ip, 2), "small pod 3 -> pod 1");

    // Bulk TCP both ways across the small hop: from the pods (the fast
    // path) and from the nodes (the host-stack path).
    bulk("pod 1 -> pod 3", (&p3.ns, p3.ip), &p1.ns, 5301);
    bulk("pod 3 -> pod 1", (&p1.ns, p1.ip), &p3.ns, 5302);
    bulk("node 1 -> pod 3", (&p3.ns, p3.ip), &n1.node.ns, 5303);
    bulk("node 3 -> pod 1", (&p1.ns, p1.ip), &n3.node.ns, 5304);
    bulk("pod 1 -> pod 2", (&p2.ns, p2.ip), &p1.ns, 5305);
    assert_eq!(
        packets(n3, Reason::DropMalformed) + packets(n1, Reason::DropMalformed),
        0
    );
    // Measured paths set don't-fragment: nothing arrived as fragments.
    assert_eq!(
        packets(n3, Reason::Fragmented),
        0,
        "outer fragments at node 3"
    );

    // Mid-flow, the small link drops to 1400 during a 30 s transfer from
    // pod 1 to pod 3. With the router's ICMP, its "fragmentation needed"
    // is confirmed by a probe and used within seconds; without, the next
    // check of the path (every probe interval, 10 s) finds 1500 no longer
    // carried and the search finds 1400.
    let _srv = p3.ns.spawn("iperf3", &["-s", "-1", "-p", "5310"]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let iperf = p1
        .ns
        .command("iperf3")
        .args([
            "-c",
            &p3.ip.to_string(),
            "-p",
            "5310",
            "-t",
            "30",
            "-b",
            "300M",
            "-i",
            "0.5",
            "-J",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    for ns in [&c.underlay.ns, &router] {
        ns.ip(&["link", "set", "small", "mtu", "1400"]).unwrap();
    }
    // The half-second interval the change fell in.
    let changed_at = 16;
    let report = report(iperf, 30);
    let bytes = intervals(&report);
    let mut sorted = bytes.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let worst = longest_stall(&bytes[changed_at.min(bytes.len())..], median);
    let bound = if router_icmp { 5.0 } else { 14.0 };
    println!(
        "mid-flow (router ICMP {router_icmp}): longest stall {worst} s after the change; per half second: {bytes:?}"
    );
    assert!(
        worst <= bound,
        "a stall of {worst} s (bound {bound} s): {bytes:?}"
    );
    assert!(
        bytes.len() >= 58 && bytes[bytes.len() - 4..].iter().all(|b| *b > 0.0),
        "the transfer carries on to its end: {bytes:?}"
    );
    assert_eq!(path_mtu(n1, n3), Some(1400), "node 1's path to node 3");
    let hints = n1.metric("weft_path_mtu_hints_total{result=\"confirmed\"}");
    println!(
        "hints confirmed: {hints}; outer fragments at node 3: {}",
        packets(n3, Reason::Fragmented)
    );
    if router_icmp {
        assert!(hints >= 1.0, "the router's message was used");
    } else {
        assert_eq!(hints, 0.0, "no message passed the router");
    }
}

/// The longest run of half-second intervals carrying under a tenth of
/// `median` (the whole transfer's), in seconds.
fn longest_stall(bytes: &[f64], median: f64) -> f64 {
    let (mut run, mut worst) = (0usize, 0usize);
    for b in bytes {
        if *b < median / 10.0 {
            run += 1;
            worst = worst.max(run);
        } else {
            run = 0;
        }
    }
    worst as f64 * 0.5
}

#[test]
fn a_smaller_hop_on_the_underlay_is_measured_and_enforced() {
    smaller_hop(true);
}

#[test]
fn a_smaller_hop_whose_router_drops_icmp_is_measured_all_the_same() {
    smaller_hop(false);
}
