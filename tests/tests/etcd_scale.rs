//! 50,000 leases (over 4 MiB of them, past gRPC's message limit for one
//! response) and a 1.2 MiB junk value under the prefix: an agent lists them
//! page by page, programs every lease, and rejects the junk as malformed.

use std::time::{Duration, Instant};

use weft_tests::{
    agent::{Agent, eventually},
    cluster::Node,
    weft_cluster::{PREFIX, WeftCluster, http_get},
};

const LEASES: u32 = 50_000;

fn metric(node: &Node, name: &str) -> f64 {
    http_get(&node.ns, node.ip, 9090, "/metrics")
        .ok()
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(-1.0)
}

#[test]
fn fifty_thousand_leases_sync() {
    let config = r#"{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;
    let c = WeftCluster::with_config(0, config, &[]).unwrap();
    let endpoint = format!("http://{}:2379", weft_tests::weft_cluster::ETCD_IP);
    // Written in transactions of 100 puts, from inside the underlay.
    let written = c
        .underlay
        .ns
        .run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut client = etcd_client::Client::connect([endpoint], None).await.unwrap();
                let mut ops = Vec::new();
                for i in 0..LEASES {
                    // 10.(i/256).(i%256).0/24 from 10.1.0.0, public IPs in
                    // 172.16.0.0/12, all distinct.
                    let n = i + 256;
                    let key = format!("{PREFIX}/subnets/10.{}.{}.0-24", n >> 8, n & 0xff);
                    let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(172, 16, 0, 1)) + i);
                    let value = format!(
                        r#"{{"PublicIP":"{ip}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:{:02x}:{:02x}:{:02x}"}}}}"#,
                        i >> 16,
                        (i >> 8) & 0xff,
                        i & 0xff
                    );
                    ops.push(etcd_client::TxnOp::put(key, value, None));
                    if ops.len() == 100 {
                        client
                            .txn(etcd_client::Txn::new().and_then(std::mem::take(&mut ops)))
                            .await
                            .unwrap();
                    }
                }
                let junk = vec![b'x'; 1_200_000];
                client
                    .put(format!("{PREFIX}/subnets/10.255.255.0-24"), junk, None)
                    .await
                    .unwrap();
                LEASES
            })
        })
        .unwrap();
    assert_eq!(written, LEASES);

    let node = Node::new(&c.underlay, 1).unwrap();
    let args: Vec<String> = [
        "--etcd-endpoints",
        &format!("http://{}:2379", weft_tests::weft_cluster::ETCD_IP),
        "--node-id",
        "node-1",
        "--datapath",
        "none",
        "--public-ip",
        "198.18.0.1",
        "--healthz-port",
        "9090",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let started = Instant::now();
    let a = Agent::start("node-1", Some(&node.ns), &args).unwrap();
    a.wait_subnet(Duration::from_secs(60)).unwrap();
    println!("subnet acquired {:?} after start", started.elapsed());
    eventually("every lease programmed", Duration::from_secs(120), || {
        (metric(&node, "weft_peers") == LEASES as f64).then_some(())
    });
    println!("{LEASES} leases synced {:?} after start", started.elapsed());
    assert!(
        metric(&node, "weft_malformed_leases_total") >= 1.0,
        "the junk value is skipped"
    );
    assert!(
        a.log().contains("10.255.255.0-24") && a.log().contains("a value of more than 4096 bytes"),
        "and named"
    );
    assert!(a.running());
}
