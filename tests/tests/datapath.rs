//! The eBPF VXLAN datapath in real namespaces: 3 nodes on an underlay
//! bridge, pods on cni0, programs and maps driven through the library API
//! with static peers.

use dataplane_common::Reason;
use weft::dataplane::{Counters, XdpMode};
use weft_tests::{
    cluster::{Node, Underlay, flannel_device, flannel_peer, ping},
    counters::Snapshot,
    overlay::{install, peer, spec, subnet_of},
    pins::TestPins,
    require_root,
    traffic::{tcp_transfer, udp_transfer},
};

struct Cluster {
    nodes: Vec<Node>,
    pins: Vec<TestPins>,
    _underlay: Underlay,
}

fn cluster(n: u8, decap: XdpMode) -> Cluster {
    require_root();
    let underlay = Underlay::new().unwrap();
    let mut nodes: Vec<Node> = (1..=n).map(|i| Node::new(&underlay, i).unwrap()).collect();
    for node in nodes.iter_mut() {
        let s = subnet_of(node.index);
        node.pods_for(s, 2, 1450).unwrap();
    }
    let pins: Vec<TestPins> = nodes.iter().map(|_| TestPins::new()).collect();
    for (i, node) in nodes.iter().enumerate() {
        let peers = nodes
            .iter()
            .filter(|o| o.index != node.index)
            .map(|o| peer(o, subnet_of(o.index)))
            .collect();
        let att = install(
            node,
            spec(node, subnet_of(node.index), &pins[i], decap),
            peers,
        )
        .unwrap();
        println!("node {}: {att:?}", node.index);
    }
    Cluster {
        nodes,
        pins,
        _underlay: underlay,
    }
}

#[test]
fn every_pod_reaches_every_other_pod_and_nodes_reach_remote_pods() {
    let c = cluster(3, XdpMode::Auto);
    let all: Vec<_> = c
        .nodes
        .iter()
        .flat_map(|n| n.pods.iter().map(|p| p.ip))
        .collect();
    for node in &c.nodes {
        for pod in &node.pods {
            for dst in &all {
                if *dst != pod.ip {
                    assert!(ping(&pod.ns, *dst, 2), "{} cannot reach {dst}", pod.ip);
                }
            }
        }
    }
    // A node reaches a remote pod (host-originated traffic is encapsulated too).
    assert!(ping(&c.nodes[0].ns, c.nodes[1].pods[0].ip, 2));
    assert!(ping(&c.nodes[2].ns, c.nodes[0].pods[1].ip, 2));
    let counters = Counters::open(c.pins[0].pins()).unwrap();
    assert!(counters.get(Reason::Encapsulated).unwrap().packets > 0);
    assert!(counters.get(Reason::Decapsulated).unwrap().packets > 0);
}

#[test]
fn a_100_mb_tcp_stream_arrives_intact_and_udp_arrives() {
    let c = cluster(2, XdpMode::Auto);
    let (a, b) = (&c.nodes[0].pods[0], &c.nodes[1].pods[1]);
    let t = std::time::Instant::now();
    let (n, intact) = tcp_transfer(&b.ns, b.ip, 5201, &a.ns, 100 << 20);
    println!("100 MiB in {:?}", t.elapsed());
    assert_eq!(n, 100 << 20);
    assert!(intact, "checksum of the received stream matches");
    // And back, node 2 -> node 1.
    let (n, intact) = tcp_transfer(&a.ns, a.ip, 5202, &b.ns, 10 << 20);
    assert!(n == 10 << 20 && intact);
    assert_eq!(udp_transfer(&b.ns, b.ip, 5300, &a.ns, 200, 1000), 200);
    // Large datagrams (fragmented by the pod, reassembled by the receiver).
    assert_eq!(udp_transfer(&a.ns, a.ip, 5301, &b.ns, 20, 4000), 20);
}

/// The node itself (its host namespace) to a remote pod, and a remote pod
/// to the node (at its overlay address, through the tunnel both ways):
/// checksummed streams arrive whole.
#[test]
fn node_to_remote_pod_and_back_arrive_intact() {
    let c = cluster(2, XdpMode::Auto);
    let (node1, pod2) = (&c.nodes[0], &c.nodes[1].pods[0]);
    // 50 MiB each way (less in an emulated guest, which moves less).
    let bytes = ((50 << 20) as f64 / weft_tests::time_scale()) as usize;
    let (n, intact) = tcp_transfer(&pod2.ns, pod2.ip, 5203, &node1.ns, bytes);
    assert_eq!(n, bytes, "node -> remote pod");
    assert!(intact, "node -> remote pod: the checksum matches");
    let overlay1 = subnet_of(node1.index).network();
    let (n, intact) = tcp_transfer(&node1.ns, overlay1, 5204, &pod2.ns, bytes);
    assert_eq!(n, bytes, "remote pod -> node");
    assert!(intact, "remote pod -> node: the checksum matches");
}

#[test]
fn tc_decapsulation_fallback_carries_traffic_too() {
    let c = cluster(2, XdpMode::Off);
    assert!(ping(&c.nodes[0].pods[0].ns, c.nodes[1].pods[1].ip, 3));
    assert!(ping(&c.nodes[1].ns, c.nodes[0].pods[0].ip, 2));
    let (a, b) = (&c.nodes[0].pods[0], &c.nodes[1].pods[0]);
    let (n, intact) = tcp_transfer(&b.ns, b.ip, 5201, &a.ns, 20 << 20);
    assert!(n == 20 << 20 && intact);
    let counters = Counters::open(c.pins[1].pins()).unwrap();
    assert!(counters.get(Reason::Decapsulated).unwrap().packets > 100);
    // No XDP program on the uplink in this mode.
    let xdp = c.nodes[1].ns.ip(&["-d", "link", "show", "eth0"]).unwrap();
    assert!(!xdp.contains("prog/xdp"), "{xdp}");
}

/// With the kernel's vxlan device behind a veth uplink, a small frame for
/// the host stack is stripped in TC while no frame went whole to the device
/// on that CPU lately (pings: `decapsulated`; a frame passed whole counts
/// as `passed` on the uplink and `decapsulated` on the device, and
/// `passed` counts the uplink's ARP too), and a bulk stream's frames, with
/// the small ones right behind them on the same CPU, pass whole to the
/// device, in order, and the stream arrives intact.
#[test]
fn the_host_stack_path_strips_quiet_frames_and_passes_bulk_ones_whole() {
    let c = cluster(2, XdpMode::Auto);
    let counters = Counters::open(c.pins[1].pins()).unwrap();
    let now = || {
        let get = |r| counters.get(r).unwrap().packets;
        (get(Reason::Decapsulated), get(Reason::Passed))
    };
    let (d0, p0) = now();
    assert!(ping(&c.nodes[0].pods[0].ns, c.nodes[1].pods[0].ip, 5));
    let (d1, p1) = now();
    println!("pings: {} stripped, {} passed whole", d1 - d0, p1 - p0);
    assert!(
        d1 - d0 >= 5 && p1 - p0 < d1 - d0,
        "pings: {} stripped, {} passed whole",
        d1 - d0,
        p1 - p0
    );
    let (a, b) = (&c.nodes[0].pods[0], &c.nodes[1].pods[0]);
    let (n, intact) = tcp_transfer(&b.ns, b.ip, 5201, &a.ns, 50 << 20);
    assert!(n == 50 << 20 && intact);
    let (d2, p2) = now();
    println!("bulk: {} stripped, {} passed whole", d2 - d1, p2 - p1);
    assert!(
        p2 - p1 > 100,
        "bulk: {} stripped, {} passed whole",
        d2 - d1,
        p2 - p1
    );
}

/// Reads the first frame of a pcap file.
fn first_frame(pcap: &[u8]) -> &[u8] {
    assert!(pcap.len() > 40, "empty capture");
    let magic = u32::from_le_bytes(pcap[0..4].try_into().unwrap());
    assert!(
        magic == 0xa1b2c3d4 || magic == 0xa1b23c4d,
        "little-endian pcap"
    );
    let incl = u32::from_le_bytes(pcap[24 + 8..24 + 12].try_into().unwrap()) as usize;
    &pcap[40..40 + incl]
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// What goes on the wire: UDP 8472, VXLAN flags 0x08 and the configured VNI,
/// outer addresses the node addresses, a valid outer IPv4 checksum, UDP
/// checksum 0, and the inner frame intact.
#[test]
fn wire_format_is_rfc_7348_as_linux_sends_it() {
    require_root();
    let underlay = Underlay::new().unwrap();
    let mut nodes: Vec<Node> = (1..=2).map(|i| Node::new(&underlay, i).unwrap()).collect();
    for n in nodes.iter_mut() {
        n.pods_for(subnet_of(n.index), 1, 1450).unwrap();
    }
    let pins: Vec<TestPins> = nodes.iter().map(|_| TestPins::new()).collect();
    const VNI: u32 = 4242;
    for (i, n) in nodes.iter().enumerate() {
        let other = &nodes[1 - i];
        let mut s = spec(n, subnet_of(n.index), &pins[i], XdpMode::Auto);
        s.spec.vni = VNI;
        install(n, s, vec![peer(other, subnet_of(other.index))]).unwrap();
    }
    let pcap = std::env::temp_dir()
        .join(weft_tests::unique("weft-wire-"))
        .with_extension("pcap");
    // Node 1's frames only: a capture that starts mid-ping must not take
    // the reply for the request.
    let from_a = nodes[0].ip.to_string();
    let mut dump = underlay
        .ns
        .spawn(
            "tcpdump",
            &[
                "-i",
                "br0",
                "-c",
                "1",
                "-U",
                "-w",
                pcap.to_str().unwrap(),
                "udp",
                "dst",
                "port",
                "8472",
                "and",
                "src",
                "host",
                &from_a,
            ],
        )
        .unwrap();
    // tcpdump's start is not awaited (under emulation it takes seconds):
    // the ping repeats until the capture has its frame.
    let (a, b) = (&nodes[0], &nodes[1]);
    let deadline =
        std::time::Instant::now() + weft_tests::scaled(std::time::Duration::from_secs(10));
    let mut replied = false;
    while dump.child_mut().try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        replied |= a.pods[0]
            .ns
            .exec(
                "ping",
                &[
                    "-c",
                    "1",
                    "-W",
                    "2",
                    "-p",
                    "c0ffee",
                    &b.pods[0].ip.to_string(),
                ],
            )
            .is_ok();
    }
    assert!(replied, "no ping was answered");
    let raw = std::fs::read(&pcap).unwrap();
    let _ = std::fs::remove_file(&pcap);
    let f = first_frame(&raw);

    // Outer Ethernet: node 1's uplink to node 2's uplink.
    assert_eq!(hex(&f[0..6]), b.mac().replace(':', ""));
    assert_eq!(hex(&f[6..12]), a.mac().replace(':', ""));
    assert_eq!(be16(f, 12), 0x0800);
    // Outer IPv4.
    let ip = &f[14..34];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[8], 64, "TTL 64");
    assert_eq!(ip[9], 17, "UDP");
    assert_eq!(&ip[12..16], &a.ip.octets());
    assert_eq!(&ip[16..20], &b.ip.octets());
    assert_eq!(be16(ip, 2) as usize, f.len() - 14, "total length");
    let sum: u32 = (0..10).map(|i| be16(ip, i * 2) as u32).sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    assert_eq!(folded, 0xffff, "valid IPv4 header checksum");
    // UDP.
    let udp = &f[34..42];
    assert!(
        (32768..61000).contains(&be16(udp, 0)),
        "source port from the flow hash"
    );
    assert_eq!(be16(udp, 2), 8472);
    assert_eq!(be16(udp, 4) as usize, f.len() - 34);
    assert_eq!(be16(udp, 6), 0, "UDP checksum 0");
    // VXLAN.
    let vx = &f[42..50];
    assert_eq!(vx[0], 0x08, "flags: VNI valid");
    assert_eq!(&vx[1..4], &[0, 0, 0]);
    assert_eq!(u32::from_be_bytes([0, vx[4], vx[5], vx[6]]), VNI);
    assert_eq!(vx[7], 0);
    // Inner frame: VTEP MACs, the pods' packet, the ping pattern intact.
    let inner = &f[50..];
    assert_eq!(&inner[0..6], &weft_tests::overlay::vtep_mac(2).0);
    assert_eq!(&inner[6..12], &weft_tests::overlay::vtep_mac(1).0);
    assert_eq!(be16(inner, 12), 0x0800);
    assert_eq!(&inner[14 + 12..14 + 16], &a.pods[0].ip.octets());
    assert_eq!(&inner[14 + 16..14 + 20], &b.pods[0].ip.octets());
    assert_eq!(inner[14 + 9], 1, "ICMP");
    assert!(
        hex(&inner[14 + 20 + 8..]).contains("c0ffeec0ffee"),
        "payload intact"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Oversized packets are handled visibly: the kernel answers DF packets too
/// big for the overlay with ICMP "fragmentation needed" (mtu 1450); and a
/// frame that would still exceed the uplink is dropped and counted.
#[test]
fn oversized_packets_get_icmp_or_a_counted_drop() {
    let c = cluster(2, XdpMode::Auto);
    let pod = &c.nodes[0].pods[0];
    // A pod whose MTU is wrong (1500): DF pings of 1488 bytes.
    pod.ns.ip(&["link", "set", "eth0", "mtu", "1500"]).unwrap();
    c.nodes[0]
        .ns
        .ip(&["link", "set", &pod.host_if, "mtu", "1500"])
        .unwrap();
    let out = pod
        .ns
        .command("ping")
        .args([
            "-c",
            "1",
            "-W",
            "2",
            "-M",
            "do",
            "-s",
            "1460",
            &c.nodes[1].pods[0].ip.to_string(),
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("mtu = 1450"),
        "ICMP fragmentation needed with the overlay MTU: {text}"
    );
    // Without DF the node fragments and the packet arrives.
    assert!(
        pod.ns
            .exec(
                "ping",
                &[
                    "-c",
                    "1",
                    "-W",
                    "2",
                    "-s",
                    "1460",
                    &c.nodes[1].pods[0].ip.to_string()
                ]
            )
            .is_ok()
    );

    // Make the overlay MTU wrong on purpose: the program refuses frames that
    // would not fit the uplink, and counts them.
    let counters = Counters::open(c.pins[0].pins()).unwrap();
    let before = counters.get(Reason::DropTooBig).unwrap().packets;
    c.nodes[0]
        .ns
        .ip(&["link", "set", "weft.1", "mtu", "1500"])
        .unwrap();
    // One DF datagram of 1460 + 28 bytes from the node itself.
    let dst = c.nodes[1].pods[0].ip;
    c.nodes[0]
        .ns
        .run(move || {
            use std::os::fd::AsRawFd as _;
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let v: libc::c_int = libc::IP_PMTUDISC_DO;
            // SAFETY: setsockopt with a valid int option.
            let rc = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    &v as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            };
            assert_eq!(rc, 0);
            // The drop is reported to the sender as ENOBUFS; either way, once.
            let _ = s.send_to(&[0u8; 1460], (dst, 9));
        })
        .unwrap();
    assert_eq!(
        counters.get(Reason::DropTooBig).unwrap().packets,
        before + 1
    );
}

/// A Weft node and a node configured exactly as flannel configures one:
/// their pods exchange ICMP and TCP in both directions.
#[test]
fn interop_with_a_flannel_node_using_the_kernel_vxlan_device() {
    require_root();
    let underlay = Underlay::new().unwrap();
    let mut weft_node = Node::new(&underlay, 1).unwrap();
    let mut flannel = Node::new(&underlay, 2).unwrap();
    weft_node.pods_for(subnet_of(1), 1, 1450).unwrap();
    flannel.pods_for(subnet_of(2), 1, 1450).unwrap();
    let flannel_mac = flannel_device(&flannel, subnet_of(2)).unwrap();
    flannel_peer(
        &flannel,
        subnet_of(1),
        weft_node.ip,
        weft_tests::overlay::vtep_mac(1),
    )
    .unwrap();
    let pins = TestPins::new();
    let flannel_peer = weft::dataplane::Peer::v4(subnet_of(2), flannel.ip, flannel_mac);
    install(
        &weft_node,
        spec(&weft_node, subnet_of(1), &pins, XdpMode::Auto),
        vec![flannel_peer],
    )
    .unwrap();

    let (w, f) = (&weft_node.pods[0], &flannel.pods[0]);
    assert!(ping(&w.ns, f.ip, 3), "weft pod -> flannel pod");
    assert!(ping(&f.ns, w.ip, 3), "flannel pod -> weft pod");
    assert!(ping(&flannel.ns, w.ip, 2), "flannel node -> weft pod");
    assert!(ping(&weft_node.ns, f.ip, 2), "weft node -> flannel pod");
    let (n, ok) = tcp_transfer(&f.ns, f.ip, 5201, &w.ns, 30 << 20);
    assert!(n == 30 << 20 && ok, "TCP weft -> flannel");
    let (n, ok) = tcp_transfer(&w.ns, w.ip, 5202, &f.ns, 30 << 20);
    assert!(n == 30 << 20 && ok, "TCP flannel -> weft");
    let counters = Counters::open(pins.pins()).unwrap();
    // Counted per skb: GRO aggregates more where the receiver is slower (a
    // busy or emulated host), so the floor is well below 30 MB's segments.
    assert!(
        counters.get(Reason::Decapsulated).unwrap().packets > 100,
        "flannel's frames were decapsulated by Weft"
    );
}

/// Hostile VXLAN, crafted with scapy from a namespace on the underlay:
/// unknown outer source, wrong VNI, truncated, no VNI flag, non-IP inner,
/// spoofed inner source. Each is dropped and counted; nothing reaches the
/// pod; a well-formed packet sent the same way does.
#[test]
fn hostile_packets_are_dropped_and_counted() {
    let c = cluster(3, XdpMode::Auto);
    let attacker = weft_tests::netns::Netns::new("wx").unwrap();
    c._underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    let target = &c.nodes[0];
    let pod = &target.pods[0];
    let counters = Counters::open(c.pins[0].pins()).unwrap();
    let before = Snapshot::of(&counters);

    // A UDP listener in the target pod records what gets through, until a
    // second of silence after the sender is done (however long scapy takes
    // to start).
    let (tx, rx) = std::sync::mpsc::channel();
    let pod_ip = pod.ip;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = pod.ns.spawn_thread({
        let sent = sent.clone();
        move || {
            let s = std::net::UdpSocket::bind((pod_ip, 7777)).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(1)))
                .unwrap();
            tx.send(()).unwrap();
            let mut got = Vec::new();
            let deadline =
                std::time::Instant::now() + weft_tests::scaled(std::time::Duration::from_secs(60));
            while std::time::Instant::now() < deadline {
                match weft_tests::traffic::recv_with_tos(&s) {
                    Some((payload, tos)) => {
                        got.push((String::from_utf8_lossy(&payload).into_owned(), tos))
                    }
                    None if sent.load(std::sync::atomic::Ordering::SeqCst) => break,
                    None => {}
                }
            }
            got
        }
    });
    rx.recv().unwrap();

    let script = format!(
        r#"
from scapy.all import Ether, IP, UDP, Raw, ARP, sendp, conf
conf.verb = 0
dst_mac = "{dst_mac}"
def vx(outer_src, vni, inner_src, payload, flags=0x08, inner=None, outer_tos=0, inner_tos=0):
    vxlan = bytes([flags, 0, 0, 0]) + vni.to_bytes(3, "big") + b"\x00"
    if inner is None:
        inner = Ether(dst="{vtep1}", src="{vtep2}")/IP(src=inner_src, dst="{pod}", tos=inner_tos)/UDP(sport=5555, dport=7777)/Raw(payload)
    return Ether(dst=dst_mac)/IP(src=outer_src, dst="{node}", tos=outer_tos)/UDP(sport=40000, dport=8472)/Raw(vxlan + bytes(inner))
pkts = [
    vx("198.18.0.66", 1, "10.244.2.50", b"unknown-vtep"),
    vx("198.18.0.2", 7, "10.244.2.50", b"wrong-vni"),
    Ether(dst=dst_mac)/IP(src="198.18.0.2", dst="{node}")/UDP(sport=40000, dport=8472)/Raw(b"\x08\x00\x00\x00"),
    vx("198.18.0.2", 1, "10.244.2.50", b"no-flag", flags=0x00),
    vx("198.18.0.2", 1, "", b"", inner=Ether(dst="{vtep1}", src="{vtep2}")/ARP(psrc="10.244.2.50", pdst="{pod}")),
    vx("198.18.0.2", 1, "10.244.3.50", b"spoofed-inner"),
    vx("198.18.0.2", 1, "10.244.2.50", b"valid"),
    vx("198.18.0.2", 1, "10.244.2.50", b"not-ect-under-ce", outer_tos=3, inner_tos=0),
    vx("198.18.0.2", 1, "10.244.2.50", b"ect-under-ce", outer_tos=3, inner_tos=2),
]
sendp(pkts, iface="eth0")
"#,
        dst_mac = target.mac(),
        vtep1 = weft_tests::overlay::vtep_mac(1),
        vtep2 = weft_tests::overlay::vtep_mac(2),
        pod = pod.ip,
        node = target.ip,
    );
    let r = attacker.exec("/usr/bin/python3", &["-c", &script]);
    sent.store(true, std::sync::atomic::Ordering::SeqCst);
    r.unwrap();
    let got = listener.join().unwrap();
    assert_eq!(
        got,
        vec![("valid".to_string(), 0), ("ect-under-ce".to_string(), 3)],
        "only the well-formed packets reached the pod; the congestion mark went inside (RFC 6040)"
    );

    let after = Snapshot::of(&counters);
    let delta = |r: Reason| after.since(&before, r);
    assert_eq!(delta(Reason::DropUnknownVtep), 1);
    assert_eq!(delta(Reason::DropWrongVni), 1);
    assert_eq!(
        delta(Reason::DropMalformed),
        3,
        "truncated, no VNI flag, non-IP inner"
    );
    assert_eq!(delta(Reason::DropSpoofed), 1);
    assert_eq!(
        delta(Reason::DropEcn),
        1,
        "CE on a packet that is not ECN-capable"
    );
    assert_eq!(delta(Reason::Decapsulated), 2);
    // Still forwarding normally.
    assert!(ping(&c.nodes[1].pods[0].ns, pod.ip, 2));
}

/// A remote node's own address as the inner source (its host talking to a
/// pod from that address) is not taken for spoofing.
#[test]
fn a_remote_nodes_own_address_reaches_a_pod() {
    let c = cluster(2, XdpMode::Auto);
    let counters = Counters::open(c.pins[0].pins()).unwrap();
    let spoofed = counters.get(Reason::DropSpoofed).unwrap().packets;
    let pod = c.nodes[0].pods[0].ip.to_string();
    let out = c.nodes[1]
        .ns
        .command("ping")
        .args(["-c", "3", "-W", "2", "-I", "198.18.0.2", &pod])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(counters.get(Reason::DropSpoofed).unwrap().packets, spoofed);
}

/// VXLAN packets that arrive as outer IPv4 fragments (an underlay hop with
/// a smaller MTU fragments them: the outer header has no DF) are no black
/// hole: the uplink's programs pass them, the kernel reassembles them, the
/// node's vxlan device decapsulates them, and `weft_tunnel_rx` checks them
/// as the uplink's programs check the rest. Each counts once under its own
/// reason, so the smaller hop shows.
#[test]
fn vxlan_that_arrives_as_fragments_is_reassembled_checked_and_counted() {
    require_root();
    let router = weft_tests::netns::Netns::new("wr").unwrap();
    let (n1, n2) = (
        weft_tests::netns::Netns::new("wn").unwrap(),
        weft_tests::netns::Netns::new("wn").unwrap(),
    );
    weft_tests::netns::veth(&n1, "eth0", &router, "r1").unwrap();
    weft_tests::netns::veth(&n2, "eth0", &router, "r2").unwrap();
    router.sysctl("net.ipv4.ip_forward", "1").unwrap();
    router
        .ip(&["addr", "add", "198.18.1.254/24", "dev", "r1"])
        .unwrap();
    router
        .ip(&["addr", "add", "198.18.2.254/24", "dev", "r2"])
        .unwrap();
    // The hop to node 2 carries at most 1400 bytes.
    router.ip(&["link", "set", "r2", "mtu", "1400"]).unwrap();
    n2.ip(&["link", "set", "eth0", "mtu", "1400"]).unwrap();
    n1.ip(&["addr", "add", "198.18.1.1/24", "dev", "eth0"])
        .unwrap();
    n2.ip(&["addr", "add", "198.18.2.1/24", "dev", "eth0"])
        .unwrap();
    n1.ip(&["route", "add", "default", "via", "198.18.1.254"])
        .unwrap();
    n2.ip(&["route", "add", "default", "via", "198.18.2.254"])
        .unwrap();
    let mut nodes = [
        Node::in_ns(n1, 1, "198.18.1.1".parse().unwrap()),
        Node::in_ns(n2, 2, "198.18.2.1".parse().unwrap()),
    ];
    nodes[0].pods_for(subnet_of(1), 1, 1450).unwrap();
    nodes[1].pods_for(subnet_of(2), 1, 1350).unwrap();
    let pins = [TestPins::new(), TestPins::new()];
    for (a, b) in [(0, 1), (1, 0)] {
        install(
            &nodes[a],
            spec(
                &nodes[a],
                subnet_of(nodes[a].index),
                &pins[a],
                XdpMode::Auto,
            ),
            vec![peer(&nodes[b], subnet_of(nodes[b].index))],
        )
        .unwrap();
    }
    let (src, dst) = (&nodes[0].pods[0], nodes[1].pods[0].ip);
    assert!(ping(&src.ns, dst, 2), "small packets cross");
    let counters = Counters::open(pins[1].pins()).unwrap();
    let before = Snapshot::of(&counters);
    // 1380 + 28 bytes inside, 1458 outside: more than the 1400-byte hop.
    let out = src
        .ns
        .command("ping")
        .args([
            "-c",
            "3",
            "-W",
            "2",
            "-s",
            "1380",
            "-M",
            "dont",
            &dst.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fragmented VXLAN is delivered: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let after = Snapshot::of(&counters);
    assert_eq!(
        after.since(&before, Reason::Fragmented),
        3,
        "one count per fragmented packet"
    );
    assert!(
        after.since(&before, Reason::Decapsulated) >= 3,
        "the reassembled packets are decapsulated and counted"
    );

    // The same checks as for whole packets: fragments crafted on node 1
    // (a real peer VTEP), one honest, one with an inner source of a subnet
    // node 1 does not hold.
    let pod = &nodes[1].pods[0];
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = weft_tests::traffic::udp_payloads(&pod.ns, pod.ip, 7777, sent.clone());
    let script = format!(
        r#"
from scapy.all import Ether, IP, UDP, Raw, send, fragment, conf
conf.verb = 0
def frags(inner_src, payload):
    vxlan = bytes([0x08, 0, 0, 0]) + (1).to_bytes(3, "big") + b"\x00"
    inner = Ether(dst="{vtep2}", src="{vtep1}")/IP(src=inner_src, dst="{pod}")/UDP(sport=5555, dport=7777)/Raw(payload)
    outer = IP(src="198.18.1.1", dst="198.18.2.1")/UDP(sport=40000, dport=8472)/Raw(vxlan + bytes(inner))
    return fragment(IP(bytes(outer)), fragsize=600)
send(frags("10.244.1.50", b"fragmented" + b"." * 900) + frags("10.244.3.50", b"spoofed" + b"." * 900))
"#,
        vtep1 = weft_tests::overlay::vtep_mac(1),
        vtep2 = weft_tests::overlay::vtep_mac(2),
        pod = pod.ip,
    );
    let before = Snapshot::of(&counters);
    nodes[0]
        .ns
        .exec("/usr/bin/python3", &["-c", &script])
        .unwrap();
    sent.store(true, std::sync::atomic::Ordering::SeqCst);
    let got = listener.join().unwrap();
    assert_eq!(
        got,
        vec!["fragmented".to_string()],
        "only the honest packet arrived"
    );
    let after = Snapshot::of(&counters);
    assert_eq!(after.since(&before, Reason::Fragmented), 2);
    assert_eq!(
        after.since(&before, Reason::DropSpoofed),
        1,
        "the spoofed one is dropped after reassembly"
    );
    assert!(ping(&src.ns, dst, 2), "small packets still cross");
}
