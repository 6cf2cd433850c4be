//! `cargo xtask bench egress [--rounds N] [--seconds S]`
//!
//! A pod's traffic to a host outside the cluster network, through a Weft
//! node, two ways in one run, alternating round by round:
//!
//! - `routed`: no NAT; the outside host has a route back to the pod subnet
//!   through the node (the limit).
//! - `masquerade`: Weft's `--ip-masq` (nftables masquerade, fully random
//!   ports); the outside host knows nothing of the pods.
//!
//! Metrics: `tcp_gbps` (1 stream), `conn_per_s` (new TCP connections per
//! second, each opened and closed: the cost of conntrack and NAT setup),
//! `rr_p50_us` (request/response round trip). Reported: medians and the
//! ratio masquerade/routed.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cluster::Node,
    netns::{Netns, veth},
    overlay::{install, spec, subnet_of},
    pins::TestPins,
};

const CONFIGS: [&str; 2] = ["routed", "masquerade"];
const METRICS: [&str; 3] = ["tcp_gbps", "conn_per_s", "rr_p50_us"];
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

pub async fn run(args: &[String]) -> Result<()> {
    crate::require_root();
    let rounds: usize = super::flag(args, "--rounds").unwrap_or(5);
    let secs: u64 = super::flag(args, "--seconds").unwrap_or(5);
    let mut samples: BTreeMap<&str, BTreeMap<&str, Vec<f64>>> = BTreeMap::new();
    for round in 1..=rounds {
        for cfg in CONFIGS {
            eprintln!("round {round}/{rounds}: {cfg}");
            let m = tokio::task::block_in_place(|| measure(cfg, secs))
                .with_context(|| format!("measuring {cfg}"))?;
            eprintln!(
                "  tcp {:.2} Gbit/s, {:.0} connections/s, rr p50 {:.1} us",
                m[0], m[1], m[2]
            );
            for (i, name) in METRICS.iter().enumerate() {
                samples
                    .entry(cfg)
                    .or_default()
                    .entry(name)
                    .or_default()
                    .push(m[i]);
            }
        }
    }
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("\negress benchmark: medians of {rounds} rounds, {secs} s per measurement");
    println!(
        "{:<11} {:>12} {:>12} {:>18}",
        "metric", "routed", "masquerade", "masquerade/routed"
    );
    for name in METRICS {
        let r = median(&samples["routed"][name]);
        let m = median(&samples["masquerade"][name]);
        println!("{name:<11} {r:>12.2} {m:>12.2} {:>18.3}", m / r);
    }
    println!("(rr: lower is better)");
    Ok(())
}

/// A Weft node with one pod, joined by a veth pair to an outside host.
fn measure(cfg: &str, secs: u64) -> Result<[f64; 3]> {
    let mut node = Node::in_ns(Netns::new("wb")?, 1, Ipv4Addr::new(198, 18, 0, 1));
    let outside = Netns::new("wb")?;
    veth(&node.ns, "eth0", &outside, "eth0")?;
    node.ns
        .ip(&["addr", "add", "198.18.0.1/24", "dev", "eth0"])?;
    outside.ip(&["addr", "add", &format!("{OUTSIDE}/24"), "dev", "eth0"])?;
    let pins = TestPins::new();
    let mut s = spec(&node, subnet_of(1), &pins, weft::dataplane::XdpMode::Auto);
    if cfg == "masquerade" {
        s.spec.masquerade = Some(true);
    } else {
        outside.ip(&[
            "route",
            "add",
            &subnet_of(1).to_string(),
            "via",
            "198.18.0.1",
        ])?;
    }
    install(&node, s, Vec::new())?;
    node.use_subnet_weft(subnet_of(1), 1450, &pins.state_dir());
    node.add_pod()?;
    let pod = &node.pods[0].ns;
    if !crate::cluster::ping(pod, OUTSIDE, 2) {
        bail!("{cfg}: the pod cannot reach the outside");
    }
    let _iperf = outside.spawn("iperf3", &["-s", "-p", "5201"])?;
    let _sockperf = outside.spawn(
        "sockperf",
        &["sr", "--tcp", "-i", &OUTSIDE.to_string(), "-p", "11111"],
    )?;
    std::thread::sleep(Duration::from_millis(500));
    let tcp = super::datapath::iperf_tcp(pod, OUTSIDE, 1, secs)?;
    let cps = connections_per_second(&outside, pod, secs)?;
    let (p50, _) = super::datapath::rr(pod, OUTSIDE, secs)?;
    Ok([tcp, cps, p50])
}

/// Opens and closes TCP connections from `client` to the outside host for
/// `secs`; returns how many completed per second.
fn connections_per_second(server: &Netns, client: &Netns, secs: u64) -> Result<f64> {
    let until = Instant::now() + Duration::from_secs(secs + 2);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = server.spawn_thread(move || -> Result<()> {
        let l = TcpListener::bind((OUTSIDE, 7100))?;
        l.set_nonblocking(true)?;
        ready_tx.send(())?;
        while Instant::now() < until {
            match l.accept() {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    });
    ready_rx.recv_timeout(Duration::from_secs(5))?;
    let n = client.run(move || -> Result<u64> {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut n = 0;
        while Instant::now() < end {
            let s = TcpStream::connect_timeout(&(OUTSIDE, 7100).into(), Duration::from_secs(3))
                .with_context(|| format!("connection {n}"))?;
            // Closed with a reset: no TIME_WAIT piling up on either side.
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: setsockopt on a socket we own, with a valid linger
            // struct of its size.
            unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as u32,
                )
            };
            drop(s);
            n += 1;
        }
        Ok(n)
    })??;
    srv.join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))??;
    Ok(n as f64 / secs as f64)
}
