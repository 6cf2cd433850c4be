//! `cargo xtask demo`: a throwaway Weft cluster, end to end, in under two
//! minutes: etcd, 3 nodes with 2 pods each, 3 agents, the leases, a ping
//! between every pod pair, a short iperf3 across nodes, `weft status` of one
//! node. Everything is removed at the end, and on Ctrl-C.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use weft_tests::{
    agent::weft_bin,
    cluster::ping,
    weft_cluster::{CONFIG, ETCD_IP, WeftCluster},
};

static CANCELLED: AtomicBool = AtomicBool::new(false);

fn check() -> Result<()> {
    if CANCELLED.load(Ordering::Relaxed) {
        bail!("interrupted: cleaning up");
    }
    Ok(())
}

fn main() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "weft-demo: run as root (it creates network namespaces and attaches eBPF programs)"
        );
        std::process::exit(2);
    }
    // Ctrl-C and SIGTERM go to a thread that asks the demo to stop; the demo
    // then unwinds and its guards remove everything it created.
    // SAFETY: plain signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            eprintln!("\nweft-demo: signal {sig}: stopping and cleaning up...");
            CANCELLED.store(true, Ordering::Relaxed);
        });
    }
    let started = Instant::now();
    let r = std::thread::spawn(demo).join();
    match r {
        Ok(Ok(())) => println!("\ndone in {:.0?}; everything removed", started.elapsed()),
        Ok(Err(e)) => {
            eprintln!("weft-demo: {e:#}");
            std::process::exit(1);
        }
        Err(_) => std::process::exit(1),
    }
}

fn step(n: u32, what: &str) -> Result<()> {
    check()?;
    println!("\n[{n}/6] {what}");
    Ok(())
}

fn demo() -> Result<()> {
    println!("Weft demo: etcd + 3 nodes (network namespaces) with 2 pods each, one agent per node");
    step(
        1,
        &format!("etcd at {ETCD_IP}:2379 with the network config {CONFIG}; starting 3 agents"),
    )?;
    let c = WeftCluster::new(3, &["--subnet-lease-ttl", "600"])?;
    for n in &c.nodes {
        let pods: Vec<String> = n.node.pods.iter().map(|p| p.ip.to_string()).collect();
        println!(
            "  node{} {} -> subnet {}  pods {}",
            n.node.index,
            n.node.ip,
            n.subnet,
            pods.join(", ")
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.nodes.iter().all(|n| n.peer_subnets().len() == 2) {
        check()?;
        if Instant::now() > deadline {
            bail!("the agents did not program their peers within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    step(2, "the leases in etcd (weft leases)")?;
    let out = c.underlay.ns.exec(
        weft_bin().to_str().unwrap(),
        &[
            "leases",
            "--etcd-endpoints",
            &format!("http://{ETCD_IP}:2379"),
        ],
    )?;
    print!("{}", indent(&out));

    step(3, "ping between every pair of pods")?;
    let all = c.pod_ips();
    let (mut ok, mut total) = (0, 0);
    for n in &c.nodes {
        for pod in &n.node.pods {
            for dst in &all {
                if *dst != pod.ip {
                    check()?;
                    total += 1;
                    if ping(&pod.ns, *dst, 1) {
                        ok += 1;
                    } else {
                        println!("  {} -> {dst}: FAILED", pod.ip);
                    }
                }
            }
        }
    }
    println!("  {ok}/{total} pairs reachable");
    if ok != total {
        bail!("some pods could not reach each other");
    }

    step(4, "iperf3 for 3 s from a pod on node1 to a pod on node3")?;
    let server = &c.nodes[2].node.pods[0];
    let _srv = server.ns.spawn("iperf3", &["-s", "-1", "-p", "5201"])?;
    std::thread::sleep(Duration::from_millis(300));
    let out = c.nodes[0].node.pods[0].ns.exec(
        "iperf3",
        &["-c", &server.ip.to_string(), "-p", "5201", "-t", "3", "-J"],
    )?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let gbps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9;
    println!("  {gbps:.2} Gbit/s through the eBPF VXLAN datapath");

    step(5, "weft status on node1")?;
    let n1 = &c.nodes[0];
    let out = n1.weft(&["status"])?;
    print!("{}", indent(&out));

    step(6, "removing the agents, namespaces, pins and etcd")?;
    drop(c);
    Ok(())
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}
