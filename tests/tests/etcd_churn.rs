//! One writer putting and deleting a lease every 5 ms beside 5,000 leases
//! for 60 s (anyone with write access to the prefix can): the agent uses
//! under a quarter of a core, a real new lease is programmed within 2 s,
//! and `/readyz` answers 200 throughout. (Alone in its file: what it
//! measures is CPU.)

use std::{
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use weft_tests::{
    agent::eventually,
    etcd_fill::put_all,
    swarm::cpu_seconds,
    weft_cluster::{ETCD_IP, PREFIX, WeftCluster, WeftNode, http_get},
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

#[test]
fn a_lease_put_and_deleted_every_5_ms_beside_5000_leases() {
    const LEASES: u32 = 5_000;
    let config = r#"{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;
    let c = WeftCluster::with_config(1, config, &[]).unwrap();
    let lease = |i: u32| {
        let n = i + 256;
        (
            format!("{PREFIX}/subnets/10.{}.{}.0-24", n >> 8, n & 0xff).into_bytes(),
            lease_value(Ipv4Addr::from(0xac10_0001 + i), i).into_bytes(),
        )
    };
    put_all(&c.underlay.ns, (0..LEASES).map(lease).collect()).unwrap();
    let n = &c.nodes[0];
    eventually("every lease programmed, the agent ready", 4 * T, || {
        (n.peer_subnets().len() == LEASES as usize && ready(n)).then_some(())
    });

    // The writer: one lease put and deleted, every 5 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let endpoint = format!("http://{ETCD_IP}:2379");
        let (key, value) = lease(LEASES + 1);
        c.underlay.ns.spawn_thread(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .unwrap();
                let mut writes = 0u64;
                let mut tick = tokio::time::interval(Duration::from_micros(2_500));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    client.put(key.clone(), value.clone(), None).await.unwrap();
                    tick.tick().await;
                    client.delete(key.clone(), None).await.unwrap();
                    writes += 2;
                }
                writes
            })
        })
    };

    let pid = n.agent.pid();
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    let mut not_ready = 0;
    let mut seen_after = None;
    let (real_key, real_value) = lease(LEASES + 2);
    let real_subnet: ipnet::Ipv4Net = {
        let n = LEASES + 2 + 256;
        format!("10.{}.{}.0/24", n >> 8, n & 0xff).parse().unwrap()
    };
    while t0.elapsed() < Duration::from_secs(60) {
        if seen_after.is_none() && t0.elapsed() > Duration::from_secs(30) {
            // A real node joins in the middle of it.
            put_all(&c.underlay.ns, vec![(real_key.clone(), real_value.clone())]).unwrap();
            let put = Instant::now();
            while !n.peer_subnets().contains(&real_subnet) {
                assert!(
                    put.elapsed() < Duration::from_secs(10),
                    "the new lease never came"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            seen_after = Some(put.elapsed());
        }
        if !ready(n) {
            not_ready += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let cpu = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    let seen_after = seen_after.unwrap();
    println!(
        "{writes} writes in 60 s: the agent used {:.1}% of a core; the new lease was programmed {seen_after:?} after its put; not ready {not_ready} times",
        cpu * 100.0
    );
    assert!(writes > 6_000, "the writer kept up: {writes}");
    assert!(cpu < 0.25, "{:.1}% of a core", cpu * 100.0);
    assert!(seen_after < Duration::from_secs(2), "{seen_after:?}");
    assert_eq!(not_ready, 0, "/readyz answered other than 200");
    assert!(n.agent.running());
}
