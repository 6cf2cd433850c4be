//! The build chain end to end: the agent's loader attaches the real eBPF
//! programs inside a network namespace, packets are sent, and the counters
//! read back from userspace match what was sent.

use std::{net::UdpSocket, time::Duration};

use dataplane_common::{Reason, program_names};
use weft::dataplane::{Counters, Hook, LoadOptions, Loaded, XdpMode};
use weft_tests::{
    netns::{Netns, mac, veth},
    pins::TestPins,
    require_root,
};

const NODE_IP: &str = "198.18.0.1";
const PEER_IP: &str = "198.18.0.2";

/// Two namespaces joined by a veth pair, static neighbours both ways so no
/// ARP shows up in what the programs count.
fn pair() -> (Netns, Netns) {
    let node = Netns::new("wn").unwrap();
    let peer = Netns::new("wp").unwrap();
    veth(&node, "eth0", &peer, "eth0").unwrap();
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"])
        .unwrap();
    peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "eth0"])
        .unwrap();
    let node_mac = mac(&node, "eth0").unwrap();
    let peer_mac = mac(&peer, "eth0").unwrap();
    node.ip(&[
        "neigh",
        "replace",
        PEER_IP,
        "lladdr",
        &peer_mac,
        "dev",
        "eth0",
        "nud",
        "permanent",
    ])
    .unwrap();
    peer.ip(&[
        "neigh",
        "replace",
        NODE_IP,
        "lladdr",
        &node_mac,
        "dev",
        "eth0",
        "nud",
        "permanent",
    ])
    .unwrap();
    (node, peer)
}

/// Sends `n` UDP datagrams from `from` (inside `ns`) to `to:port`.
fn send_udp(ns: &Netns, from: &'static str, to: &'static str, port: u16, n: usize) {
    ns.run(move || {
        let sock = UdpSocket::bind((from, 0)).unwrap();
        for i in 0..n {
            sock.send_to(format!("packet {i}").as_bytes(), (to, port))
                .unwrap();
        }
    })
    .unwrap();
}

/// A UDP socket in `ns` bound to `ip:port`; returns how many datagrams it
/// received once `quiet` passes without one.
fn receiver(ns: &Netns, ip: &'static str, port: u16) -> std::thread::JoinHandle<usize> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = ns.path();
    let handle = std::thread::spawn(move || {
        let f = std::fs::File::open(path).unwrap();
        use std::os::fd::AsRawFd as _;
        // SAFETY: setns on a valid netns fd for this thread only.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let sock = UdpSocket::bind((ip, port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(700)))
            .unwrap();
        tx.send(()).unwrap();
        let mut buf = [0u8; 2048];
        let mut got = 0;
        while sock.recv(&mut buf).is_ok() {
            got += 1;
        }
        got
    });
    rx.recv().unwrap();
    handle
}

#[test]
fn xdp_and_tc_programs_count_what_was_sent() {
    require_root();
    let (node, peer) = pair();
    let pins = TestPins::new();

    // Attach through the agent's loader, inside the node's namespace.
    let p = pins.pins().clone();
    let attached = node
        .run(move || -> anyhow::Result<_> {
            let mut loaded = Loaded::load(
                &p,
                &LoadOptions::for_kernel(weft::dataplane::ProgramKernel::probe()),
            )?;
            loaded.install()?;
            let xdp = loaded.attach_xdp(
                program_names::DECAP_XDP,
                "eth0",
                &[XdpMode::Native, XdpMode::Generic],
            )?;
            let tc = loaded.attach_tc(program_names::ENCAP, "eth0", Hook::TcEgress)?;
            // A configured dataplane with an empty peer table.
            let mut maps = weft::dataplane::PeerMaps::open(&p)?;
            maps.set_config(&dataplane_common::DataplaneConfig {
                vni: 1,
                port: 8472,
                local_addr_be: u32::from_ne_bytes(NODE_IP.parse::<std::net::Ipv4Addr>()?.octets()),
                uplink_ifindex: weft::dataplane::ifindex("eth0")?,
                uplink_mtu: 1500,
                flags: dataplane_common::CONFIG_F_READY,
                ..Default::default()
            })?;
            Ok((xdp, tc))
            // `loaded` drops here: only the pinned links keep the programs attached.
        })
        .unwrap()
        .unwrap();
    println!("attached: {attached:?}");
    assert_eq!(
        attached.0.xdp_mode,
        Some(XdpMode::Native),
        "veth supports native XDP"
    );
    assert!(!attached.0.adopted && !attached.1.adopted);

    let counters = Counters::open(pins.pins()).unwrap();
    let passed0 = counters.get(Reason::Passed).unwrap().packets;
    let noroute0 = counters.get(Reason::DropNoRoute).unwrap().packets;
    assert_eq!((passed0, noroute0), (0, 0), "fresh maps start at zero");

    // Peer -> node: XDP sees and passes every packet; the node receives them.
    const N: usize = 137;
    let rx = receiver(&node, NODE_IP, 9999);
    send_udp(&peer, PEER_IP, NODE_IP, 9999, N);
    let received = rx.join().unwrap();
    assert_eq!(received, N, "XDP_PASS delivers every datagram");
    let passed = counters.get(Reason::Passed).unwrap();
    assert_eq!(
        passed.packets, N as u64,
        "the XDP counter equals what was sent"
    );
    assert!(passed.bytes >= (N * (14 + 20 + 8)) as u64);

    // Node -> peer: the TC egress program has no peer to encapsulate to, so
    // it drops and counts every packet; nothing reaches the peer.
    const M: usize = 61;
    let peer_rx0 = peer.link_stat("eth0", "rx_packets").unwrap();
    let rx = receiver(&peer, PEER_IP, 9998);
    send_udp(&node, NODE_IP, PEER_IP, 9998, M);
    assert_eq!(rx.join().unwrap(), 0, "TC dropped everything");
    assert_eq!(
        counters.get(Reason::DropNoRoute).unwrap().packets,
        M as u64,
        "the TC counter equals what was sent"
    );
    assert_eq!(peer.link_stat("eth0", "rx_packets").unwrap(), peer_rx0);
    assert_eq!(counters.get(Reason::Passed).unwrap().packets, N as u64);

    // A second load adopts the pinned links (swapping the programs in place)
    // and the pinned maps keep their counts.
    let p = pins.pins().clone();
    let again = node
        .run(move || -> anyhow::Result<_> {
            let mut loaded = Loaded::load(
                &p,
                &LoadOptions::for_kernel(weft::dataplane::ProgramKernel::probe()),
            )?;
            loaded.install()?;
            let xdp = loaded.attach_xdp(program_names::DECAP_XDP, "eth0", &[XdpMode::Native])?;
            let tc = loaded.attach_tc(program_names::ENCAP, "eth0", Hook::TcEgress)?;
            Ok((xdp.adopted, tc.adopted))
        })
        .unwrap()
        .unwrap();
    assert_eq!(again, (true, true));
    let rx = receiver(&node, NODE_IP, 9997);
    send_udp(&peer, PEER_IP, NODE_IP, 9997, 5);
    assert_eq!(rx.join().unwrap(), 5);
    assert_eq!(counters.get(Reason::Passed).unwrap().packets, N as u64 + 5);

    // Detaching removes the programs: traffic flows and is no longer counted.
    let p = pins.pins().clone();
    node.run(move || {
        assert!(weft::dataplane::detach(&p, Hook::Xdp, "eth0").unwrap());
        assert!(weft::dataplane::detach(&p, Hook::TcEgress, "eth0").unwrap());
    })
    .unwrap();
    let rx = receiver(&peer, PEER_IP, 9996);
    send_udp(&node, NODE_IP, PEER_IP, 9996, 3);
    assert_eq!(rx.join().unwrap(), 3, "no TC program drops after detach");
    assert_eq!(counters.get(Reason::DropNoRoute).unwrap().packets, M as u64);
}

/// With nothing mounted at the pin directory, the agent mounts a bpffs there.
#[test]
fn the_pin_directory_gets_a_bpffs_when_it_has_none() {
    require_root();
    let t = TestPins::unmounted();
    assert!(!weft::dataplane::is_bpffs(t.path()).unwrap());
    t.pins().ensure().unwrap();
    assert!(weft::dataplane::is_bpffs(t.path()).unwrap());
    assert!(t.pins().maps().is_dir() && t.pins().links().is_dir());
    // Idempotent.
    t.pins().ensure().unwrap();
}
