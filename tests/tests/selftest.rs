//! `weft selftest`: every eBPF program, run by the kernel on golden frames
//! with maps of its own, gives the verdict, counter and bytes the wire
//! format says; and doing so on a node that carries traffic leaves that
//! node's dataplane alone.

use std::time::Duration;

use weft_tests::{agent::weft_bin, cluster::ping, pins::TestPins, weft_cluster::WeftCluster};

const T: Duration = Duration::from_secs(30);

/// The programs the object carries: each must have golden cases.
const PROGRAMS: [&str; 7] = [
    "weft_encap",
    "weft_encap6",
    "weft_tunnel_rx",
    "weft_decap",
    "weft_decap_tc",
    "weft_from_pod",
    "weft_deliver",
];

fn leftover_pins() -> Vec<String> {
    std::fs::read_dir("/sys/fs/bpf")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("weft-selftest-"))
        .collect()
}

#[test]
fn every_program_passes_its_golden_frames() {
    let before = leftover_pins();
    let out = std::process::Command::new(weft_bin())
        .args(["selftest", "--verbose"])
        .output()
        .expect("running weft selftest");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "weft selftest failed");
    let passed: Vec<&str> = text.lines().filter(|l| l.starts_with("ok ")).collect();
    assert!(
        passed.len() >= 50,
        "only {} cases passed: the golden set shrank",
        passed.len()
    );
    assert!(
        text.contains(&format!("all {} golden-frame cases passed", passed.len())),
        "{text}"
    );
    assert!(!text.contains("FAIL"), "{text}");
    for p in PROGRAMS {
        assert!(
            passed
                .iter()
                .any(|l| l.split_whitespace().nth(1) == Some(p)),
            "no golden case ran {p}"
        );
    }
    // Each hostile kind is among them, for both decapsulation programs.
    for hostile in [
        "another VNI",
        "no VTEP",
        "another peer's subnet",
        "no pod here",
        "fragment",
        "not ECN-capable",
        "cut short",
    ] {
        for p in ["weft_decap ", "weft_decap_tc "] {
            assert!(
                passed.iter().any(|l| l.contains(p) && l.contains(hostile)),
                "no {hostile:?} case for {p}"
            );
        }
    }
    assert_eq!(
        leftover_pins(),
        before,
        "the self-test left its pins behind"
    );
}

/// On a meshed node: the node's counters and peer map are the same after
/// the self-test, and its pods still reach the other node's.
#[test]
fn a_node_carrying_traffic_is_left_alone() {
    // No peer probes: their packets through the tunnel would move the
    // counters this compares.
    let c = WeftCluster::new(2, &["--peer-probe-interval", "0"]).unwrap();
    c.wait_meshed(T);
    let n1 = &c.nodes[0];
    // The agent checks once that its programs reach the new peer (a probe
    // through the tunnel, counted): after that the node is quiet.
    n1.agent
        .wait_log("the programs in the links reach the peers: verified", T)
        .unwrap();
    let peers = n1.peer_subnets();
    let counters = || {
        weft::dataplane::Counters::open(n1.pins.pins())
            .unwrap()
            .all()
            .unwrap()
            .into_iter()
            // Frames that are not the overlay's (neighbour discovery on the
            // uplink) pass and count on their own.
            .filter(|(r, _)| r.name() != "passed")
            .map(|(r, c)| (r.name(), c.packets))
            .collect::<Vec<_>>()
    };
    let before = counters();
    // `ip netns exec` mounts a fresh /sys: the self-test gets a bpffs of
    // its own.
    let bpffs = TestPins::new();
    let entries = || std::fs::read_dir(bpffs.path()).unwrap().count();
    let empty = entries();
    let out = n1
        .node
        .ns
        .command(weft_bin().to_str().unwrap())
        .args(["selftest", "--bpffs-root"])
        .arg(bpffs.path())
        .output()
        .expect("running weft selftest");
    println!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "weft selftest failed on a live node");
    assert_eq!(
        counters(),
        before,
        "the self-test counted on the node's counters"
    );
    assert_eq!(n1.peer_subnets(), peers);
    assert!(ping(&n1.node.pods[0].ns, c.nodes[1].node.pods[0].ip, 2));
    assert!(n1.agent.running());
    assert_eq!(entries(), empty, "the self-test left its pins behind");
}
