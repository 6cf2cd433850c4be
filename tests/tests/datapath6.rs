//! The IPv6 half of the datapath, through the library API with static
//! peers: a Weft node and a node configured exactly as flannel configures a
//! dual-stack node (kernel vxlan devices `flannel.1` and `flannel-v6.1`),
//! IPv6 pod traffic between IPv6 VTEPs both ways, outer UDP checksums on
//! the wire, hostile IPv6 packets, and Packet Too Big.

use std::net::Ipv6Addr;

use dataplane_common::Reason;
use weft::dataplane::{Counters, Peer, XdpMode};
use weft_tests::{
    cluster::{Node, Underlay, flannel_device, flannel_device6, flannel_peer, flannel_peer6, ping},
    counters::Snapshot,
    dual::underlay6,
    netns::Netns,
    overlay::{install, spec, subnet_of, subnet6_of, vtep_mac, vtep6_mac, with_ipv6, with_overlay},
    pins::TestPins,
    require_root,
    traffic::tcp_transfer,
};

const NETWORK4: &str = "10.244.0.0/16";
const NETWORK6: &str = "fd00:10:244::/56";

struct Pair {
    weft: Node,
    flannel: Node,
    pins: TestPins,
    underlay: Underlay,
}

/// Turns segmentation and checksum offloads off on `iface` in `ns`: what
/// crosses the veth is then what a wire would carry (segments, with the
/// checksums computed).
fn offloads_off(ns: &Netns, iface: &str) {
    ns.exec(
        "ethtool",
        &[
            "-K", iface, "tso", "off", "gso", "off", "tx", "off", "gro", "off",
        ],
    )
    .unwrap();
}

/// Node 1 runs Weft's datapath (IPv4 and IPv6), node 2 is set up as
/// flannel sets up a dual-stack node; one pod each, with an address of both
/// families.
fn pair(wire_offloads: bool) -> Pair {
    require_root();
    let underlay = Underlay::new().unwrap();
    underlay.ns.enable_ipv6().unwrap();
    let mut nodes: Vec<Node> = (1..=2)
        .map(|i| {
            let mut n = Node::new(&underlay, i).unwrap();
            n.ns.enable_ipv6().unwrap();
            n.ipv6 = true;
            n.ns.add_addr6("eth0", underlay6(i), 64).unwrap();
            n
        })
        .collect();
    if !wire_offloads {
        for n in &nodes {
            offloads_off(&n.ns, "eth0");
        }
        let ports = underlay.ns.ip(&["-o", "link", "show"]).unwrap();
        for p in ports
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n))
            .filter(|n| n.starts_with('p'))
        {
            offloads_off(&underlay.ns, p);
        }
    }
    let flannel = nodes.pop().unwrap();
    let mut weft = nodes.pop().unwrap();
    let mut flannel = flannel;
    let nets = (NETWORK4.parse().unwrap(), NETWORK6.parse().unwrap());

    let fmac4 = flannel_device(&flannel, subnet_of(2)).unwrap();
    let fmac6 = flannel_device6(&flannel, underlay6(2), subnet6_of(2)).unwrap();
    flannel_peer(&flannel, subnet_of(1), weft.ip, vtep_mac(1)).unwrap();
    flannel_peer6(&flannel, subnet6_of(1), underlay6(1), vtep6_mac(1)).unwrap();
    flannel.cni = Some(weft_tests::cni::flannel_like_dual(
        (subnet_of(2), subnet6_of(2)),
        nets,
        1450,
        &flannel.ipam_dir,
    ));
    flannel.add_pod().unwrap();

    let pins = TestPins::new();
    let setup = |weft: &Node| {
        with_ipv6(
            spec(weft, subnet_of(1), &pins, XdpMode::Auto),
            underlay6(1),
            subnet6_of(1),
        )
    };
    let att = install(
        &weft,
        setup(&weft),
        vec![
            Peer::v4(subnet_of(2), flannel.ip, fmac4),
            Peer::v6(subnet6_of(2), underlay6(2), fmac6),
        ],
    )
    .unwrap();
    println!("weft node: {att:?}");
    // Pods attached as flannel's plugin attaches them, Weft's plugin
    // chained; the endpoints it registered programmed as the agent does.
    let mut cni = weft_tests::cni::flannel_like_dual(
        (subnet_of(1), subnet6_of(1)),
        nets,
        1430,
        &weft.ipam_dir,
    );
    weft_tests::cni::chain_weft(&mut cni, &pins.state_dir());
    weft.cni = Some(cni);
    weft.add_pod().unwrap();
    let state = pins.state_dir();
    with_overlay(&weft, setup(&weft), async move |o| {
        o.sync_endpoints(&weft::endpoint_records(&state)).await
    })
    .unwrap();
    Pair {
        weft,
        flannel,
        pins,
        underlay,
    }
}

#[test]
fn interop_with_a_flannel_dual_stack_node() {
    let p = pair(true);
    let (w, f) = (&p.weft.pods[0], &p.flannel.pods[0]);
    let (w6, f6) = (w.ip6.unwrap(), f.ip6.unwrap());
    assert!(subnet6_of(1).contains(&w6) && subnet6_of(2).contains(&f6));
    for (from, to) in [(&w.ns, f6), (&f.ns, w6)] {
        assert!(ping(from, to, 3), "no IPv6 path to {to}");
    }
    for (from, to) in [(&w.ns, f.ip), (&f.ns, w.ip)] {
        assert!(ping(from, to, 3), "no IPv4 path to {to}");
    }
    // Bulk TCP both ways over IPv6.
    let (n, intact) = tcp_transfer(&f.ns, f6, 5201, &w.ns, 40 << 20);
    assert!(n == 40 << 20 && intact, "to flannel's pod: {n}");
    let (n, intact) = tcp_transfer(&w.ns, w6, 5202, &f.ns, 40 << 20);
    assert!(n == 40 << 20 && intact, "to Weft's pod: {n}");

    // As flannel configures it, its IPv6 device carries 1430 bytes.
    let mtu = p.flannel.ns.ip(&["link", "show", "flannel-v6.1"]).unwrap();
    assert!(mtu.contains("mtu 1430"), "{mtu}");
}

/// VXLAN over IPv6 that arrives as fragments of outer IPv6 (Linux senders
/// do not fragment their tunnel packets, but other VTEPs and middle boxes
/// may): the uplink's programs pass the fragments, the kernel reassembles
/// them, Weft's IPv6 overlay device decapsulates them, and
/// `weft_tunnel_rx` checks them as the uplink's programs check the rest:
/// the honest one arrives, the spoofed one is dropped and counted.
#[test]
fn vxlan_over_ipv6_that_arrives_as_fragments_is_delivered_and_checked() {
    let p = pair(true);
    let pod = &p.weft.pods[0];
    let counters = Counters::open(p.pins.pins()).unwrap();
    let (decap, spoofed) = (
        counters.get(Reason::Decapsulated).unwrap().packets,
        counters.get(Reason::DropSpoofed).unwrap().packets,
    );
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = weft_tests::traffic::udp_payloads(&pod.ns, pod.ip6.unwrap(), 7777, sent.clone());
    let script = format!(
        r#"
from scapy.all import Ether, IPv6, IPv6ExtHdrFragment, UDP, Raw, sendp, fragment6, conf
conf.verb = 0
def frags(inner_src, payload):
    vxlan = bytes([0x08, 0, 0, 0]) + (1).to_bytes(3, "big") + b"\x00"
    inner = Ether(dst="{vtep}", src="02:00:00:00:00:02")/IPv6(src=inner_src, dst="{pod}")/UDP(sport=5555, dport=7777)/Raw(payload)
    outer = IPv6(src="{flannel}", dst="{node}")/IPv6ExtHdrFragment()/UDP(sport=40000, dport=8472)/Raw(vxlan + bytes(inner))
    outer = IPv6(bytes(outer))
    return [Ether(dst="{dst_mac}")/f for f in fragment6(outer, 600)]
sendp(frags("{peer}50", b"fragmented" + b"." * 900) + frags("{other}50", b"spoofed" + b"." * 900), iface="eth0")
"#,
        vtep = vtep6_mac(1),
        pod = pod.ip6.unwrap(),
        dst_mac = p.weft.mac(),
        node = underlay6(1),
        flannel = underlay6(2),
        peer = subnet6_of(2).network(),
        other = subnet6_of(3).network(),
    );
    let r = p.flannel.ns.exec("/usr/bin/python3", &["-c", &script]);
    sent.store(true, std::sync::atomic::Ordering::SeqCst);
    r.unwrap();
    let got = listener.join().unwrap();
    assert_eq!(
        got,
        vec!["fragmented".to_string()],
        "only the honest packet arrived"
    );
    // Reassembled by the kernel (by conntrack's defragmentation where
    // host routing has conntrack track flows, else by IPv6 itself), then
    // counted once, by weft_tunnel_rx.
    assert_eq!(
        counters.get(Reason::Decapsulated).unwrap().packets,
        decap + 1
    );
    assert_eq!(
        counters.get(Reason::DropSpoofed).unwrap().packets,
        spoofed + 1
    );
}

/// The outer UDP checksum of every VXLAN-over-IPv6 packet in a capture:
/// (packets, with a bad checksum, with checksum zero, the largest frame).
fn outer_checksums(pcap: &str) -> (u64, u64, u64, u64) {
    let out = std::process::Command::new("tshark")
        .args([
            "-r",
            pcap,
            "-o",
            "udp.check_checksum:TRUE",
            "-Y",
            "ipv6 && udp.dstport == 8472",
            "-T",
            "fields",
            "-e",
            "udp.checksum",
            "-e",
            "udp.checksum.status",
            "-e",
            "frame.len",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut n, mut bad, mut zero, mut largest) = (0, 0, 0, 0);
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split('\t').collect();
        n += 1;
        if f[0] == "0x0000" {
            zero += 1;
        }
        // Wireshark's checksum status: 0 bad, 1 good.
        if f[1] != "1" {
            bad += 1;
        }
        largest = largest.max(f[2].parse().unwrap_or(0));
    }
    (n, bad, zero, largest)
}

#[test]
fn segments_on_the_wire_carry_correct_outer_checksums() {
    let p = pair(false);
    let (w, f) = (&p.weft.pods[0], &p.flannel.pods[0]);
    let (w6, f6) = (w.ip6.unwrap(), f.ip6.unwrap());
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-cap6-"));
    std::fs::create_dir_all(&dir).unwrap();
    let caps = [
        (&p.flannel.ns, dir.join("to-flannel.pcap")),
        (&p.weft.ns, dir.join("to-weft.pcap")),
    ];
    let mut dumps: Vec<_> = caps
        .iter()
        .map(|(ns, file)| {
            ns.command("tcpdump")
                .args(["-i", "eth0", "-s", "0", "-w"])
                .arg(file)
                .args(["-c", "3000", "ip6 and udp port 8472"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let (n, intact) = tcp_transfer(&f.ns, f6, 5201, &w.ns, 10 << 20);
    assert!(n == 10 << 20 && intact, "to flannel's pod: {n}");
    let (n, intact) = tcp_transfer(&w.ns, w6, 5202, &f.ns, 10 << 20);
    assert!(n == 10 << 20 && intact, "to Weft's pod: {n}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    for d in dumps.iter_mut() {
        // SIGINT: tcpdump writes out what it has.
        // SAFETY: signalling a child process we started.
        unsafe { libc::kill(d.id() as i32, libc::SIGINT) };
        let _ = d.wait();
    }
    for (_, file) in &caps {
        let (n, bad, zero, largest) = outer_checksums(file.to_str().unwrap());
        println!(
            "{}: {n} VXLAN/IPv6 packets, {bad} bad checksums, {zero} zero, largest frame {largest}",
            file.display()
        );
        assert!(n > 1000, "{}: only {n} packets", file.display());
        assert_eq!(zero, 0, "{}: zero outer checksums", file.display());
        assert_eq!(bad, 0, "{}: bad outer checksums", file.display());
        assert!(
            largest <= 1514,
            "{}: a {largest}-byte frame: not segmented",
            file.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_ipv6_packets_are_dropped_and_counted() {
    let p = pair(true);
    let attacker = Netns::new("wx").unwrap();
    attacker.enable_ipv6().unwrap();
    p.underlay.plug(&attacker, "eth0", "198.18.0.66").unwrap();
    let evil6: Ipv6Addr = "fd00:18::66".parse().unwrap();
    attacker.add_addr6("eth0", evil6, 64).unwrap();
    let pod = &p.weft.pods[0];
    let pod6 = pod.ip6.unwrap();
    let counters = Counters::open(p.pins.pins()).unwrap();
    let before = Snapshot::of(&counters);

    let (tx, rx) = std::sync::mpsc::channel();
    let listener = pod.ns.spawn_thread(move || {
        let s = std::net::UdpSocket::bind((pod6, 7777)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = s.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        got
    });
    rx.recv().unwrap();
    let peer_subnet = subnet6_of(2).network();
    let other_subnet = subnet6_of(3).network();
    let script = format!(
        r#"
from scapy.all import Ether, IPv6, UDP, Raw, sendp, conf
conf.verb = 0
def vx(outer_src, vni, inner_src, payload, flags=0x08):
    vxlan = bytes([flags, 0, 0, 0]) + vni.to_bytes(3, "big") + b"\x00"
    inner = Ether(dst="{vtep}", src="02:00:00:00:00:02")/IPv6(src=inner_src, dst="{pod}")/UDP(sport=5555, dport=7777)/Raw(payload)
    return Ether(dst="{dst_mac}")/IPv6(src=outer_src, dst="{node}")/UDP(sport=40000, dport=8472)/Raw(vxlan + bytes(inner))
pkts = [
    vx("{evil}", 1, "{peer}50", b"unknown-vtep"),
    vx("{flannel}", 7, "{peer}50", b"wrong-vni"),
    Ether(dst="{dst_mac}")/IPv6(src="{flannel}", dst="{node}")/UDP(sport=40000, dport=8472)/Raw(b"\x08\x00\x00\x00"),
    vx("{flannel}", 1, "{other}50", b"spoofed-inner"),
    vx("{flannel}", 1, "{peer}50", b"valid"),
]
sendp(pkts, iface="eth0")
"#,
        vtep = vtep6_mac(1),
        pod = pod6,
        dst_mac = p.weft.mac(),
        node = underlay6(1),
        evil = evil6,
        flannel = underlay6(2),
        peer = peer_subnet,
        other = other_subnet,
    );
    attacker.exec("/usr/bin/python3", &["-c", &script]).unwrap();
    let got = listener.join().unwrap();
    assert_eq!(
        got,
        vec!["valid".to_string()],
        "only the valid packet reached the pod"
    );
    let after = Snapshot::of(&counters);
    let delta = |r: Reason| after.since(&before, r);
    assert_eq!(delta(Reason::DropUnknownVtep), 1);
    assert_eq!(delta(Reason::DropWrongVni), 1);
    assert_eq!(delta(Reason::DropMalformed), 1, "truncated");
    assert_eq!(delta(Reason::DropSpoofed), 1);
    assert_eq!(delta(Reason::Decapsulated), 1);

    // A pod whose MTU is wrong (1500) sends a packet too big for the IPv6
    // overlay: the node answers with Packet Too Big naming its MTU.
    pod.ns.ip(&["link", "set", "eth0", "mtu", "1500"]).unwrap();
    p.weft
        .ns
        .ip(&["link", "set", &pod.host_if, "mtu", "1500"])
        .unwrap();
    let f6 = p.flannel.pods[0].ip6.unwrap();
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
            "1440",
            &f6.to_string(),
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.to_lowercase().contains("mtu=1430") || text.contains("mtu = 1430"),
        "ICMPv6 Packet Too Big with the IPv6 overlay's MTU: {text}"
    );
    // Still forwarding normally.
    assert!(ping(&p.flannel.pods[0].ns, pod6, 2));
}
