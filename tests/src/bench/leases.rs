//! `cargo xtask bench leases [--agents N] [--members M] [--json FILE]`: N
//! agents acquire at once against one local etcd, or (`--members 3`) a
//! cluster of M members in network namespaces, the agents given every
//! member.
//!
//! Each agent is a task with its own etcd connection running the real
//! acquisition code (`weft::lease::acquire`), released together by a barrier.
//! Reported: whether all subnets are distinct, wall time, etcd requests per
//! acquisition (mean, max) and lost races.

use std::{net::Ipv4Addr, sync::Arc, time::Instant};

use anyhow::{Result, bail};
use rand::SeedableRng as _;
use weft::{
    lease::{
        AcquireRequest, EtcdOptions, EtcdStore, Identity, LeaseAttrs, NetworkConfig, Store as _,
        acquire,
    },
    mac::MacAddr,
};

use crate::etcd::Etcd;

pub async fn run(args: &[String]) -> Result<()> {
    let members: usize = super::flag(args, "--members").unwrap_or(1);
    if members <= 1 {
        let etcd = Etcd::start()?;
        return measure(args, vec![etcd.endpoint.clone()], "one local etcd (3.4)").await;
    }
    let underlay = crate::cluster::Underlay::new()?;
    // An address on the underlay, so that the members are routable from it.
    underlay.host_addr(crate::weft_cluster::ETCD_IP)?;
    let cluster = crate::etcd_cluster::EtcdCluster::start(
        &underlay,
        members,
        crate::etcd_cluster::Options::default(),
    )?;
    let endpoints: Vec<String> = cluster.endpoints().split(',').map(str::to_string).collect();
    let args = args.to_vec();
    let what = format!("a {members}-member etcd cluster (3.4) in namespaces");
    // The members are only reachable from inside the underlay namespace.
    tokio::task::block_in_place(|| {
        underlay.ns.run(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(measure(&args, endpoints, &what))
        })
    })??;
    drop(cluster);
    Ok(())
}

async fn measure(args: &[String], endpoints: Vec<String>, what: &str) -> Result<()> {
    let n: usize = super::flag(args, "--agents").unwrap_or(200);
    let config_json = r#"{"Network":"10.0.0.0/16","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;
    let config = NetworkConfig::parse(config_json.as_bytes())?;
    let count = config.ipv4.as_ref().map_or(0, |p| p.subnet_count());
    if count < n as u64 {
        bail!("{n} agents need more than {count} subnets");
    }
    let mut c = etcd_client::Client::connect(&endpoints, None).await?;
    c.put("/coreos.com/network/config", config_json, None)
        .await?;
    let opts = EtcdOptions {
        endpoints,
        request_timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    };

    let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = EtcdStore::connect(&opts).await?;
        // Warm the connection so the measurement is the protocol, not TCP setup.
        store.get("/coreos.com/network/config").await?;
        let base = store.requests();
        let barrier = barrier.clone();
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            let me = Identity {
                node_id: format!("bench-{i}"),
                public_ip: Some(Ipv4Addr::from(0xc612_0000u32 + i as u32 + 1)),
                public_ipv6: None,
            };
            let value = LeaseAttrs::vxlan(
                me.public_ip.unwrap(),
                1,
                MacAddr::derived(me.node_id.as_bytes()),
                &me.node_id,
            );
            let req = AcquireRequest {
                subnets_prefix: "/coreos.com/network/subnets/",
                config: &config,
                me: &me,
                value: &value,
                ttl: 600,
                preferred: None,
                lease_id: None,
                not_from: &[],
            };
            let mut rng = rand::rngs::StdRng::from_os_rng();
            barrier.wait().await;
            let t = Instant::now();
            let mut rounds = 0;
            let mut lease = None;
            let mut retries = 0;
            loop {
                rounds += 1;
                let req = AcquireRequest {
                    lease_id: lease,
                    not_from: &[],
                    ..req
                };
                let (r, stats, l) = acquire(&store, &req, &mut rng).await;
                lease = l;
                retries += stats.retries;
                match r {
                    Ok(h) => {
                        return Ok::<_, anyhow::Error>((
                            h.subnet,
                            store.requests() - base,
                            retries,
                            t.elapsed(),
                            rounds,
                        ));
                    }
                    Err(e) if rounds < 5 => eprintln!("agent {i}: {e}; again"),
                    Err(e) => return Err(e.into()),
                }
            }
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await??);
    }
    let wall = started.elapsed();

    let mut subnets: Vec<_> = results.iter().map(|r| r.0).collect();
    subnets.sort();
    subnets.dedup();
    let listing = EtcdStore::connect(&opts)
        .await?
        .list("/coreos.com/network/subnets/")
        .await?;
    let distinct = subnets.len() == n && listing.kvs.len() == n;
    let reqs: Vec<f64> = results.iter().map(|r| r.1 as f64).collect();
    let mean = reqs.iter().sum::<f64>() / n as f64;
    let max = reqs.iter().cloned().fold(0.0, f64::max);
    let retries: u32 = results.iter().map(|r| r.2).sum();
    let mut lat: Vec<f64> = results.iter().map(|r| r.3.as_secs_f64() * 1000.0).collect();
    lat.sort_by(f64::total_cmp);

    println!("lease acquisition: {n} agents at once, {what}, 255 subnets");
    println!(
        "  all distinct        {}",
        if distinct { "yes" } else { "NO" }
    );
    println!("  keys in etcd        {}", listing.kvs.len());
    println!(
        "  wall time           {:.0} ms",
        wall.as_secs_f64() * 1000.0
    );
    println!("  requests/acquire    mean {mean:.2}, max {max:.0}   (goal: mean <= 4)");
    println!(
        "  lost races          {retries} in total, {:.2} per agent",
        retries as f64 / n as f64
    );
    println!(
        "  latency             p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        super::percentile(&lat, 50.0),
        super::percentile(&lat, 99.0),
        lat.last().copied().unwrap_or_default()
    );
    if let Some(path) = super::flag::<String>(args, "--json") {
        let j = serde_json::json!({
            "agents": n, "distinct": distinct, "wall_ms": wall.as_secs_f64() * 1000.0,
            "requests_mean": mean, "requests_max": max, "retries": retries,
            "latency_p50_ms": super::percentile(&lat, 50.0), "latency_p99_ms": super::percentile(&lat, 99.0),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&j)?)?;
    }
    if !distinct {
        bail!("subnets were not distinct");
    }
    Ok(())
}
