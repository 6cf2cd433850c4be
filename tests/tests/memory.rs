//! What etcd holds bounds nothing in an agent: whoever can write the
//! prefix can fill it with junk (values of etcd's 1.5 MiB maximum, a lease
//! key per /24 of the IPv4 space with a huge field), and an agent under the
//! DaemonSet's 512 MiB limit still starts, becomes ready with a small
//! footprint, and programs the honest peers.

use std::time::Duration;

use weft_tests::{
    agent::eventually,
    cgroup::{MemCgroup, peak_rss},
    cluster::Node,
    pins::TestPins,
    weft_cluster::{ETCD_IP, PREFIX, WeftCluster, http_get},
};

const T: Duration = Duration::from_secs(90);

/// Writes the junk with one client, many puts in flight.
fn fill(c: &WeftCluster) {
    let endpoint = format!("http://{ETCD_IP}:2379");
    c.underlay
        .ns
        .run(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = etcd_client::Client::connect([endpoint], None).await.unwrap();
                let big = vec![b'x'; 1400 << 10];
                let field = "y".repeat(60 << 10);
                let mut puts = Vec::new();
                // 200 values of 1.4 MiB under keys that are no leases, a
                // few at a time (etcd on a busy 2-core machine times out
                // under 280 MiB at once), each retried if etcd times out.
                for i in 0..200 {
                    let (mut kv, v) = (client.kv_client(), big.clone());
                    puts.push(tokio::spawn(async move {
                        let key = format!("{PREFIX}/subnets/junk-{i}");
                        let mut tries = 0;
                        while let Err(e) = kv.put(key.as_str(), v.clone(), None).await {
                            tries += 1;
                            assert!(tries < 5, "putting {key}: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        }
                    }));
                    if puts.len() >= 8 {
                        for p in puts.drain(..) {
                            p.await.unwrap();
                        }
                    }
                }
                // 2,000 lease-shaped keys (outside the network) whose
                // BackendType is 60 KiB.
                for i in 0..2000u32 {
                    let (mut kv, f) = (client.kv_client(), field.clone());
                    puts.push(tokio::spawn(async move {
                        let key = format!("{PREFIX}/subnets/1.{}.{}.0-24", i / 250, i % 250);
                        let value = format!(
                            r#"{{"PublicIP":"192.0.2.{}","BackendType":"{f}","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:00:01"}}}}"#,
                            1 + i % 200
                        );
                        kv.put(key, value, None).await.unwrap();
                    }));
                    if puts.len() >= 64 {
                        for p in puts.drain(..) {
                            p.await.unwrap();
                        }
                    }
                }
                for p in puts {
                    p.await.unwrap();
                }
            });
        })
        .unwrap();
}

#[test]
fn junk_in_etcd_does_not_exhaust_an_agents_memory() {
    let mut c = WeftCluster::new(1, &[]).unwrap();
    let started = std::time::Instant::now();
    fill(&c);
    println!("wrote about 400 MB of junk in {:?}", started.elapsed());
    let limit = MemCgroup::new(512 << 20).unwrap();
    let node = Node::new(&c.underlay, 2).unwrap();
    let s = c
        .start_agent_in_cgroup(node, TestPins::new(), &[], limit.path())
        .unwrap();
    let n2 = c.adopt(s).unwrap();
    let pid = n2.agent.pid();
    eventually("node 2 is ready and programs node 1", T, || {
        let ready = http_get(&n2.node.ns, n2.node.ip, 9090, "/readyz")
            .is_ok_and(|(status, _)| status == "HTTP/1.1 200 OK");
        (ready && n2.peer_subnets().len() == 1).then_some(())
    });
    // And node 1 (no limit) programs node 2: the honest peers meet.
    let (n1_subnet, n2_subnet) = (c.nodes[0].subnet, c.nodes[1].subnet);
    eventually("node 1 programs node 2", T, || {
        (c.nodes[0].peer_subnets() == [n2_subnet]).then_some(())
    });
    assert_eq!(c.nodes[1].peer_subnets(), [n1_subnet]);
    let peak = peak_rss(pid).unwrap();
    println!("node 2's agent: peak RSS {} MiB", peak >> 20);
    assert!(c.nodes[1].agent.running(), "the agent is still running");
    assert!(!limit.oom_killed().unwrap(), "nothing was OOM-killed");
    assert!(peak < 100 << 20, "peak RSS {} MiB", peak >> 20);
    let (_, metrics) = http_get(&c.nodes[1].node.ns, c.nodes[1].node.ip, 9090, "/metrics").unwrap();
    println!(
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("weft_malformed_leases_total")
                || l.starts_with("weft_leases_rejected"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
