//! `cargo xtask bench control-plane [--changes N] [--leases N] [--json FILE]`
//!
//! Three real agents (eBPF datapath) in namespaces, one etcd.
//! - Propagation: a lease is added, changed (new PublicIP and VtepMAC) and
//!   removed in etcd, N times; each time, the latency until every agent's
//!   pinned peer map shows it. p50/p99/max.
//! - Scale: 5000 leases written at once; the time until one agent's map
//!   holds all of them; that agent's RSS with 5000 peers, when they are
//!   in, over the next 5 s, and settled (the largest over the 25 s after).
//!
//! Goals: p99 < 50 ms, 5000 leases < 1 s, settled RSS < 20 MiB (< 64 MiB
//! with `--leases 50000`).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use etcd_client::{Client, Txn, TxnOp};
use ipnet::Ipv4Net;
use serde_json::json;
use weft::dataplane::PeerMaps;

use crate::weft_cluster::{ETCD_IP, PREFIX, WeftCluster};

const CONFIG: &str = r#"{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;

fn lease_json(ip: Ipv4Addr, mac_last: u16) -> String {
    format!(
        r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:bb:00:00:{:02x}:{:02x}"}}}}"#,
        mac_last >> 8,
        mac_last & 0xff
    )
}

/// The k-th /24 of 10.0.0.0/8 (k < 65536); the agents take theirs from the
/// first 256 free ones, below the bench's (k >= 1000).
fn subnet(k: u32) -> Ipv4Net {
    assert!(k < 1 << 16, "10.0.0.0/8 has 65536 /24s");
    Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (k << 8)), 24).expect("valid")
}

/// Polls until `pred` holds for every map, returns the elapsed time since `t0`.
fn wait_all(
    maps: &[PeerMaps],
    t0: Instant,
    limit: Duration,
    pred: impl Fn(&PeerMaps) -> bool,
) -> Result<Duration> {
    loop {
        if maps.iter().all(&pred) {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            bail!("not propagated within {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

pub async fn run(args: &[String]) -> Result<()> {
    let changes: u32 = super::flag(args, "--changes").unwrap_or(100);
    let n_leases: u32 = super::flag(args, "--leases").unwrap_or(5000);
    if n_leases > 55_000 {
        bail!("--leases {n_leases}: at most 55000 fit in the bench's network");
    }
    let c = tokio::task::block_in_place(|| {
        // WEFT_BENCH_LOG=debug to see every peer the agents program.
        let level = std::env::var("WEFT_BENCH_LOG").unwrap_or_else(|_| "info".into());
        WeftCluster::with_config(3, CONFIG, &["--log-level", &level])
    })?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.nodes.iter().all(|n| n.peer_subnets().len() == 2) {
        if Instant::now() > deadline {
            bail!("agents did not program each other");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pins: Vec<_> = c.nodes.iter().map(|n| n.pins.pins().clone()).collect();
    let agent_pid = c.nodes[0].agent.pid();

    // Everything talking to etcd runs inside the underlay namespace.
    let result = c
        .underlay
        .ns
        .run(move || -> Result<(Vec<f64>, f64, f64, usize)> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let mut client: Client =
                rt.block_on(Client::connect([format!("http://{ETCD_IP}:2379")], None))?;
            let maps: Vec<PeerMaps> = pins.iter().map(PeerMaps::open).collect::<Result<_>>()?;
            let limit = Duration::from_secs(5);
            let mut lat = Vec::new();
            for k in 0..changes {
                let s = subnet(1000 + k);
                let key = format!("{PREFIX}/subnets/{}", weft::lease::to_key(&s));
                let ip1 = Ipv4Addr::new(198, 19, (k >> 8) as u8, k as u8);
                let ip2 = Ipv4Addr::new(198, 20, (k >> 8) as u8, k as u8);
                // Added.
                let t0 = Instant::now();
                rt.block_on(client.put(key.as_str(), lease_json(ip1, k as u16), None))?;
                lat.push(wait_all(&maps, t0, limit, |m| {
                    m.get(&s.into())
                        .ok()
                        .flatten()
                        .is_some_and(|p| p.vtep == ip1)
                })?);
                // Changed: new PublicIP and VtepMAC.
                let t0 = Instant::now();
                rt.block_on(client.put(key.as_str(), lease_json(ip2, k as u16 + 1), None))?;
                lat.push(wait_all(&maps, t0, limit, |m| {
                    m.get(&s.into())
                        .ok()
                        .flatten()
                        .is_some_and(|p| p.vtep == ip2)
                })?);
                // Removed.
                let t0 = Instant::now();
                rt.block_on(client.delete(key.as_str(), None))?;
                lat.push(wait_all(&maps, t0, limit, |m| {
                    m.get(&s.into()).ok().flatten().is_none()
                })?);
            }
            let lat: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1000.0).collect();

            // Scale: n_leases at once, in transactions of 128 puts.
            let t0 = Instant::now();
            let all: Vec<u32> = (10_000..10_000 + n_leases).collect();
            for chunk in all.chunks(128) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|k| {
                        let s = subnet(*k);
                        let ip = Ipv4Addr::from(0xc615_0000u32 + *k);
                        TxnOp::put(
                            format!("{PREFIX}/subnets/{}", weft::lease::to_key(&s)),
                            lease_json(ip, *k as u16),
                            None,
                        )
                    })
                    .collect();
                rt.block_on(client.txn(Txn::new().and_then(ops)))?;
            }
            let wrote = t0.elapsed().as_secs_f64();
            let want = n_leases as usize + 2;
            let took = loop {
                let n = maps[0].peers()?.len();
                if n >= want {
                    break t0.elapsed().as_secs_f64();
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    bail!("only {n} of {want} peers after 60 s");
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            Ok((lat, wrote, took, want))
        })?;
    let (mut lat, wrote, took, want) = match result {
        Ok(r) => r,
        Err(e) => {
            // What the agent said (debug lines left out), to see why.
            let log = c.nodes[0].agent.log();
            let _ = std::fs::write("/tmp/weft-bench-agent-node-1.log", &log);
            eprintln!("the whole agent log: /tmp/weft-bench-agent-node-1.log");
            let said: Vec<&str> = log.lines().filter(|l| !l.contains("DEBUG")).collect();
            eprintln!("--- agent node-1 (last 40 lines of info and above) ---");
            for l in &said[said.len().saturating_sub(40)..] {
                eprintln!("{l}");
            }
            // Busy or waiting: CPU time used over one second, and where
            // the agent's threads sleep.
            let cpu = || -> u64 {
                std::fs::read_to_string(format!("/proc/{agent_pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
                        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
                    })
                    .unwrap_or(0)
            };
            let before = cpu();
            std::thread::sleep(Duration::from_secs(1));
            eprintln!("agent node-1: {} clock ticks of CPU in 1 s", cpu() - before);
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{agent_pid}/task")) {
                for t in tasks.flatten() {
                    let wchan = std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
                    let stack = std::fs::read_to_string(t.path().join("stack")).unwrap_or_default();
                    eprintln!(
                        "thread {}: wchan {wchan}\n{stack}",
                        t.file_name().to_string_lossy()
                    );
                }
            }
            let m = c.nodes[0].metrics();
            let mut series: Vec<_> = m
                .iter()
                .filter(|(k, _)| k.contains("peer") || k.contains("lease") || k.contains("watch"))
                .collect();
            series.sort_by(|a, b| a.0.cmp(b.0));
            for (k, v) in series {
                eprintln!("{k} {v}");
            }
            return Err(e);
        }
    };
    // Let the other agents finish too, then measure memory.
    std::thread::sleep(Duration::from_millis(500));
    let status = std::fs::read_to_string(format!("/proc/{agent_pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .with_context(|| name.to_string())
    };
    let rss_kib = field("VmRSS:")?;
    // Of which the heap and other anonymous memory, and the binary's own
    // pages (its code, shared with nothing here).
    let (anon_kib, file_kib) = (field("RssAnon:")?, field("RssFile:")?);
    // Then while the agent keeps its routes, probes and reports up to
    // date: the largest resident set over the next 5 s, and over the 25 s
    // after (settled: what a node keeps; the goal's figure). Right after
    // the map fills, the prober has just taken the peers and the routes
    // are still going in, so the first figure is a moment, not a state.
    let rss_now = || -> Result<f64> {
        std::fs::read_to_string(format!("/proc/{agent_pid}/status"))?
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .context("VmRSS")
    };
    let (mut after_kib, mut settled_kib) = (rss_kib, 0f64);
    for i in 0..120 {
        std::thread::sleep(Duration::from_millis(250));
        let v = rss_now()?;
        if i < 20 {
            after_kib = after_kib.max(v);
        } else {
            settled_kib = settled_kib.max(v);
        }
    }
    let hwm_kib = std::fs::read_to_string(format!("/proc/{agent_pid}/status"))?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .context("VmHWM")?;
    lat.sort_by(f64::total_cmp);
    let p50 = super::percentile(&lat, 50.0);
    let p99 = super::percentile(&lat, 99.0);
    let max = lat.last().copied().unwrap_or_default();
    println!("control plane: 3 agents (eBPF datapath), one etcd");
    println!(
        "  lease change -> every agent's map   p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms over {} changes (add, change, remove)   goal p99 < 50 ms",
        lat.len()
    );
    println!(
        "  {n_leases} leases written ({wrote:.2} s to write) -> all {want} peers in one agent's map after {took:.2} s   goal < 1 s"
    );
    // The goals: 20 MiB at 5,000 peers, 64 MiB at 50,000.
    let goal = if want > 10_000 { 64 } else { 20 };
    println!(
        "  agent RSS with {want} peers: {:.1} MiB when they are in (anonymous {:.1}, file-backed {:.1})",
        rss_kib / 1024.0,
        anon_kib / 1024.0,
        file_kib / 1024.0
    );
    println!(
        "  then up to {:.1} MiB over 5 s; settled (the 25 s after): up to {:.1} MiB   goal < {goal} MiB; peak since start (VmHWM) {:.1} MiB",
        after_kib / 1024.0,
        settled_kib / 1024.0,
        hwm_kib / 1024.0
    );
    if let Some(path) = super::flag::<String>(args, "--json") {
        let doc = json!({
            "changes": lat.len(), "change_p50_ms": p50, "change_p99_ms": p99, "change_max_ms": max,
            "leases": n_leases, "leases_write_s": wrote, "leases_programmed_s": took,
            "rss_mib": rss_kib / 1024.0,
            "rss_anon_mib": anon_kib / 1024.0, "rss_file_mib": file_kib / 1024.0,
            "rss_next_5s_max_mib": after_kib / 1024.0, "rss_settled_max_mib": settled_kib / 1024.0,
            "rss_peak_mib": hwm_kib / 1024.0,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    }
    drop(c);
    Ok(())
}
