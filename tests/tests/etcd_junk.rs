//! Keys etcd accepts that no Weft node wrote, as anyone with write access
//! to the prefix can put them: they never stop an agent, and what they cost
//! is bounded.
//!
//! - 1,001 keys holding a byte no UTF-8 has, then 1,001 keys of 1,100
//!   bytes that share their first 1,024 (each read page once ended where
//!   the next began, forever): a fresh agent takes a subnet within 30 s,
//!   stays under 100 MiB, and reads etcd a bounded number of times.
//! - 150,000 values of 4,000 bytes (600 MB): an agent under the
//!   DaemonSet's 512 MiB limit becomes ready, under 150 MiB at its peak.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use weft_tests::{
    agent::eventually,
    cgroup::{MemCgroup, peak_rss},
    cluster::Node,
    etcd_fill::{put_all, served},
    pins::TestPins,
    weft_cluster::{PREFIX, WeftCluster, WeftNode, http_get},
};

const T: Duration = Duration::from_secs(30);

fn ready(n: &WeftNode) -> bool {
    http_get(&n.node.ns, n.node.ip, 9090, "/readyz")
        .is_ok_and(|(status, _)| status == "HTTP/1.1 200 OK")
}

fn lease_value(ip: Ipv4Addr, mac: u32) -> String {
    format!(
        r#"{{"PublicIP":"{ip}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:{:02x}:{:02x}:{:02x}:{:02x}"}}}}"#,
        mac >> 24,
        (mac >> 16) & 0xff,
        (mac >> 8) & 0xff,
        mac & 0xff
    )
}

/// Starts node `i`'s agent under a 512 MiB limit, and waits (at most
/// `within`) until it is ready and programs `peers` peers; returns it,
/// its peak RSS and how many Range requests etcd served meanwhile.
fn join(c: &mut WeftCluster, i: u8, peers: usize, within: Duration) -> (u64, f64) {
    let ranges = served(&c.underlay.ns, "Range").unwrap();
    let limit = MemCgroup::new(512 << 20).unwrap();
    let node = Node::new(&c.underlay, i).unwrap();
    let started = Instant::now();
    let s = c
        .start_agent_in_cgroup(node, TestPins::new(), &[], limit.path())
        .unwrap();
    let n = c.adopt(s).unwrap();
    let pid = n.agent.pid();
    n.agent.wait_subnet(within).unwrap();
    println!("node {i} took a subnet after {:?}", started.elapsed());
    eventually(
        &format!("node {i} ready with {peers} peers"),
        within,
        || (ready(n) && n.peer_subnets().len() == peers).then_some(()),
    );
    let peak = peak_rss(pid).unwrap();
    assert!(n.agent.running(), "{}", n.agent.log());
    assert!(!limit.oom_killed().unwrap(), "OOM-killed");
    let ranges = served(&c.underlay.ns, "Range").unwrap() - ranges;
    println!(
        "node {i}: peak RSS {} MiB, {ranges} Range requests",
        peak >> 20
    );
    (peak, ranges)
}

#[test]
fn keys_no_utf8_nor_a_page_can_hold_never_stop_a_joining_agent() {
    let mut c = WeftCluster::new(1, &[]).unwrap();
    let subnets = format!("{PREFIX}/subnets/").into_bytes();
    // 1,001 keys with a 0xFF byte: shown as U+FFFD, they sort below the
    // key itself.
    let junk: Vec<(Vec<u8>, Vec<u8>)> = (0..1001)
        .map(|i| {
            let mut k = subnets.clone();
            k.push(0xff);
            k.extend(format!("{i:04}").bytes());
            (k, b"x".to_vec())
        })
        .collect();
    put_all(&c.underlay.ns, junk).unwrap();
    let (peak, ranges) = join(&mut c, 2, 1, T);
    assert!(peak < 100 << 20, "peak RSS {} MiB", peak >> 20);
    // Two reads of the prefix (the acquisition's and the watch's) of two
    // pages each, and a few more: not thousands.
    assert!(ranges <= 20.0, "{ranges} Range requests");
    let n2 = &c.nodes[1];
    let skipped = n2.metric("weft_etcd_skipped_keys{reason=\"key\"}");
    assert_eq!(skipped, 1001.0, "the junk is counted");
    let status = n2.weft(&["status"]).unwrap();
    assert!(
        status.contains("hold no lease (1001)"),
        "status names the skipped keys: {status}"
    );

    // 1,001 keys of 1,100 bytes sharing their first 1,024 (the agent kept
    // only the first 1,024 of a key).
    let long: Vec<(Vec<u8>, Vec<u8>)> = (0..1001)
        .map(|i| {
            let mut k = subnets.clone();
            k.resize(1024, b'z');
            k.extend(format!("{i:076}").bytes());
            (k, b"y".to_vec())
        })
        .collect();
    put_all(&c.underlay.ns, long).unwrap();
    let (peak, ranges) = join(&mut c, 3, 2, T);
    assert!(peak < 100 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(ranges <= 20.0, "{ranges} Range requests");
    assert_eq!(
        c.nodes[2].metric("weft_etcd_skipped_keys{reason=\"key\"}"),
        2002.0
    );
    // The first nodes program the new ones: nothing stopped.
    eventually("every node programs the others", T, || {
        c.nodes
            .iter()
            .all(|n| n.peer_subnets().len() == 2)
            .then_some(())
    });
}

#[test]
fn a_hundred_fifty_thousand_large_values_fit_under_the_daemonsets_limit() {
    let mut c = WeftCluster::new(1, &[]).unwrap();
    // Keys of subnets outside the network, 4,000 bytes each: half lease
    // JSON padded with a field flannel's format does not have (each a
    // lease, rejected as outside the network), half no JSON at all.
    let started = Instant::now();
    for part in 0..6u32 {
        let kvs: Vec<(Vec<u8>, Vec<u8>)> = (part * 25_000..(part + 1) * 25_000)
            .map(|i| {
                let key = format!(
                    "{PREFIX}/subnets/{}.{}.{}.0-24",
                    11 + (i >> 16),
                    (i >> 8) & 0xff,
                    i & 0xff
                );
                let mut v = if i % 2 == 0 {
                    let lease = lease_value(Ipv4Addr::from(0xc633_0000 + (i & 0xffff)), i);
                    format!(r#"{{"Pad":"{}",{}"#, "p".repeat(3_700), &lease[1..]).into_bytes()
                } else {
                    vec![b'j'; 4_000]
                };
                v.resize(4_000, b' ');
                (key.into_bytes(), v)
            })
            .collect();
        put_all(&c.underlay.ns, kvs).unwrap();
    }
    println!(
        "wrote 150,000 values of 4,000 bytes in {:?}",
        started.elapsed()
    );
    let (peak, _) = join(&mut c, 2, 1, 4 * T);
    assert!(peak < 150 << 20, "peak RSS {} MiB", peak >> 20);
    let n2 = &c.nodes[1];
    assert_eq!(
        n2.metric("weft_etcd_skipped_keys{reason=\"value\"}"),
        75_000.0
    );
    assert_eq!(
        n2.metric("weft_leases_rejected{reason=\"outside_network\"}"),
        75_000.0
    );
    // The report names the first of them, not every one, and counts all
    // (written by the tick after the batch that rejected them).
    let path = n2.agent.state_dir().join("status.json");
    let report: serde_json::Value = eventually("the report counts every rejection", T, || {
        let text = std::fs::read_to_string(&path).ok()?;
        assert!(text.len() < 1 << 20, "status.json is {} bytes", text.len());
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        (v["rejected_total"] == 75_000).then_some(v)
    });
    assert_eq!(report["rejected"].as_array().map(Vec::len), Some(100));
}
