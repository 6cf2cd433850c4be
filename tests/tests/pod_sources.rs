//! What a pod may pretend to be, with real agents and real packets sent
//! with scapy from a pod: another node's pods and nodes (whose packets the
//! stack would deliver to local pods where rp_filter is off), and a peer's
//! VXLAN sent to the pod's gateway (the kernel's collect-metadata device
//! listens on every address of the node).

use std::{
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use dataplane_common::Reason;
use weft::dataplane::{Counters, EndpointMap};
use weft_tests::{
    agent::eventually,
    cluster::Pod,
    counters::Snapshot,
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(30);

fn counters(n: &WeftNode) -> Counters {
    Counters::open(n.pins.pins()).unwrap()
}

fn two_nodes(extra: &[&str]) -> WeftCluster {
    let c = WeftCluster::new(2, extra).unwrap();
    eventually("peers programmed", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 1)
            .then_some(())
    });
    // The stack's own source check off, as on many hosts: only the
    // programs stand between a pod's forged source and a local pod.
    let ns = &c.nodes[0].node.ns;
    for k in ["all", "default", "cni0"] {
        ns.sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")
            .unwrap();
    }
    for p in &c.nodes[0].node.pods {
        ns.sysctl(&format!("net.ipv4.conf.{}.rp_filter", p.host_if), "0")
            .unwrap();
    }
    c
}

/// Listens in `pod` on UDP `port` until a second of silence after `sent`
/// is set; returns (source, payload) of each datagram.
fn listen(
    pod: &Pod,
    port: u16,
    sent: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Ipv4Addr, String)>> {
    let ip = pod.ip;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = pod.ns.spawn_thread(move || {
        let s = std::net::UdpSocket::bind((ip, port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        let deadline = std::time::Instant::now() + weft_tests::scaled(Duration::from_secs(60));
        while std::time::Instant::now() < deadline {
            match s.recv_from(&mut buf) {
                Ok((k, std::net::SocketAddr::V4(from))) => {
                    got.push((*from.ip(), String::from_utf8_lossy(&buf[..k]).into_owned()))
                }
                Ok(_) => {}
                Err(_) if sent.load(Ordering::SeqCst) => break,
                Err(_) => {}
            }
        }
        got
    });
    ready_rx.recv().unwrap();
    h
}

fn scapy(pod: &Pod, script: &str) {
    let script = format!("from scapy.all import *\nconf.verb = 0\n{script}");
    pod.ns.exec("/usr/bin/python3", &["-c", &script]).unwrap();
}

/// Under `auto`: pod X on node 1 sends UDP to pod Y on node 1 with a pod
/// of node 2 as its source, and with node 2's address. Y receives none of
/// them, each counted as `drop_invalid_source`; X's own datagrams arrive.
#[test]
fn a_pod_cannot_send_as_a_remote_pod_or_node() {
    let c = two_nodes(&["--host-routing", "auto"]);
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    eventually("node 1's pods registered for host routing", T, || {
        (EndpointMap::open(n1.pins.pins())
            .unwrap()
            .all()
            .unwrap()
            .len()
            == 2)
            .then_some(())
    });
    let (x, y, z) = (&n1.node.pods[0], &n1.node.pods[1], &n2.node.pods[0]);
    let sent = Arc::new(AtomicBool::new(false));
    let recv = listen(y, 7777, sent.clone());
    let counters = counters(n1);
    let before = Snapshot::of(&counters);
    let gw = weft_tests::netns::mac(&n1.node.ns, "cni0").unwrap();
    scapy(
        x,
        &format!(
            r#"
def udp(src, payload):
    return Ether(dst="{gw}")/IP(src=src, dst="{y}")/UDP(sport=40001, dport=7777)/Raw(payload)
sendp([udp("{z}", b"as-remote-pod") for _ in range(5)], iface="eth0")
sendp([udp("{node2}", b"as-node-2") for _ in range(5)], iface="eth0")
sendp([udp("{x}", b"genuine") for _ in range(5)], iface="eth0")
"#,
            y = y.ip,
            z = z.ip,
            x = x.ip,
            node2 = n2.node.ip,
        ),
    );
    sent.store(true, Ordering::SeqCst);
    let got = recv.join().unwrap();
    let after = Snapshot::of(&counters);
    let from = |payload: &str| got.iter().filter(|(_, p)| p == payload).count();
    assert_eq!(from("as-remote-pod"), 0, "{got:?}");
    assert_eq!(from("as-node-2"), 0, "{got:?}");
    assert_eq!(from("genuine"), 5, "X's own datagrams arrive: {got:?}");
    assert_eq!(
        after.since(&before, Reason::DropInvalidSource),
        10,
        "each forged datagram counted as drop_invalid_source"
    );
}

/// Under `legacy` (no program on the pods' veths): pod X on node 1 sends
/// VXLAN to its gateway's port 8472 with node 2's address as the outer
/// source and a pod of node 2 inside, to pod Y on node 1. The kernel's
/// device decapsulates it (it listens on every address); the program on
/// it drops it as sent to an address not the node's VTEP address.
#[test]
fn vxlan_from_a_pod_to_its_gateway_reaches_no_pod() {
    let c = two_nodes(&["--host-routing", "legacy"]);
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let (x, y, z) = (&n1.node.pods[0], &n1.node.pods[1], &n2.node.pods[0]);
    let gw_ip = weft::lease::first_host(&n1.subnet);
    let gw = weft_tests::netns::mac(&n1.node.ns, "cni0").unwrap();
    let rx_mac = weft_tests::netns::mac(&n1.node.ns, "weft-rx.1").unwrap();
    let sent = Arc::new(AtomicBool::new(false));
    let recv = listen(y, 7777, sent.clone());
    let counters = counters(n1);
    let before = Snapshot::of(&counters);
    scapy(
        x,
        &format!(
            r#"
inner = Ether(dst="{rx_mac}", src="02:00:00:00:00:02")/IP(src="{z}", dst="{y}")/UDP(sport=40005, dport=7777)/Raw(b"via-gateway")
p = Ether(dst="{gw}")/IP(src="{node2}", dst="{gw_ip}")/UDP(sport=40000, dport=8472)/VXLAN(vni=1, flags=0x08)/inner
sendp([p for _ in range(5)], iface="eth0")
"#,
            y = y.ip,
            z = z.ip,
            node2 = n2.node.ip,
        ),
    );
    // Genuine traffic from Z still arrives (the check is on the outer
    // destination only).
    let y_ip = y.ip;
    z.ns.run(move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..5 {
            s.send_to(b"genuine", (y_ip, 7777)).unwrap();
        }
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    sent.store(true, Ordering::SeqCst);
    let got = recv.join().unwrap();
    let after = Snapshot::of(&counters);
    let from = |payload: &str| got.iter().filter(|(_, p)| p == payload).count();
    assert_eq!(from("via-gateway"), 0, "{got:?}");
    assert_eq!(from("genuine"), 5, "Z's own datagrams arrive: {got:?}");
    assert_eq!(
        after.since(&before, Reason::DropForeignDestination),
        5,
        "each counted as drop_foreign_destination"
    );
}
