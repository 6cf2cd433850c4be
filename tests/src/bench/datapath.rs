//! `cargo xtask bench datapath [--json FILE] [--rounds N] [--seconds S]
//! [--configs route,kernel_vxlan,weft,weft_tc]`
//!
//! One topology, two nodes joined by a veth pair (the underlay), one pod on
//! each node behind a cni0 bridge; the same traffic through each
//! configuration, alternating configurations round by round:
//!
//! - `route`: plain routing between the nodes, no encapsulation (the limit);
//!   pods at MTU 1500.
//! - `kernel_vxlan`: the kernel vxlan device configured as flannel does
//!   (flannel.1, VNI 1, port 8472, neighbour/FDB/route entries); MTU 1450.
//! - `weft`: Weft's TC encapsulation and XDP decapsulation; MTU 1450.
//! - `weft_tc` (on request): Weft with decapsulation in TC instead of XDP.
//!
//! Metrics: `tcp_gbps` (1 stream), `tcp4_gbps` (4 streams), `udp64_pps`
//! (64-byte UDP payloads received per second), `rr_p50_us`, `rr_p99_us`
//! (request/response round trip, sockperf ping-pong). Medians over rounds.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use weft::dataplane::overlay::DecapMode;

use crate::{
    cluster::{Node, flannel_device, flannel_peer},
    netns::{Netns, veth},
    overlay::{install, peer, spec, subnet_of},
    pins::TestPins,
};

const METRICS: [&str; 5] = [
    "tcp_gbps",
    "tcp4_gbps",
    "udp64_pps",
    "rr_p50_us",
    "rr_p99_us",
];

pub async fn run(args: &[String]) -> Result<()> {
    crate::require_root();
    let rounds: usize = super::flag(args, "--rounds").unwrap_or(3);
    let secs: u64 = super::flag(args, "--seconds").unwrap_or(5);
    let configs: Vec<String> = super::flag::<String>(args, "--configs")
        .unwrap_or_else(|| "route,kernel_vxlan,weft".into())
        .split(',')
        .map(str::to_string)
        .collect();
    for c in &configs {
        if !["route", "kernel_vxlan", "weft", "weft_tc"].contains(&c.as_str()) {
            bail!("unknown config {c:?}");
        }
    }
    let mut samples: BTreeMap<String, BTreeMap<&str, Vec<f64>>> = BTreeMap::new();
    for round in 1..=rounds {
        for cfg in &configs {
            eprintln!("round {round}/{rounds}: {cfg}");
            let m = tokio::task::block_in_place(|| measure(cfg, secs))
                .with_context(|| format!("measuring {cfg}"))?;
            eprintln!(
                "  tcp {:.2} Gbit/s, tcp x4 {:.2} Gbit/s, udp64 {:.0} pps, rr p50 {:.1} us p99 {:.1} us",
                m[0], m[1], m[2], m[3], m[4]
            );
            let entry = samples.entry(cfg.clone()).or_default();
            for (i, name) in METRICS.iter().enumerate() {
                entry.entry(name).or_default().push(m[i]);
            }
        }
    }

    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut result: BTreeMap<String, BTreeMap<&str, f64>> = BTreeMap::new();
    for (cfg, m) in &samples {
        result.insert(
            cfg.clone(),
            m.iter().map(|(k, v)| (*k, median(v))).collect(),
        );
    }
    println!(
        "\ndatapath benchmark: medians of {rounds} rounds, {secs} s per measurement, 2-node veth underlay"
    );
    print!("{:<11}", "metric");
    for c in &configs {
        print!(" {c:>13}");
    }
    let has = |c: &str| result.contains_key(c);
    if has("weft") && has("kernel_vxlan") {
        print!(" {:>18}", "weft/kernel_vxlan");
    }
    if has("weft") && has("route") {
        print!(" {:>11}", "weft/route");
    }
    println!();
    let mut ratios = serde_json::Map::new();
    for name in METRICS {
        print!("{name:<11}");
        for c in &configs {
            print!(" {:>13.2}", result[c][name]);
        }
        let w = result.get("weft").map(|m| m[name]);
        if let (Some(w), Some(k)) = (w, result.get("kernel_vxlan").map(|m| m[name])) {
            print!(" {:>18.3}", w / k);
            ratios.insert(format!("{name}.weft/kernel_vxlan"), json!(w / k));
        }
        if let (Some(w), Some(r)) = (w, result.get("route").map(|m| m[name])) {
            print!(" {:>11.3}", w / r);
            ratios.insert(format!("{name}.weft/route"), json!(w / r));
        }
        println!();
    }
    println!("(latency: lower is better; a latency ratio below 1 means weft is faster)");
    if let Some(path) = super::flag::<String>(args, "--json") {
        let configs: serde_json::Map<String, Value> =
            result.iter().map(|(c, m)| (c.clone(), json!(m))).collect();
        let raw: serde_json::Map<String, Value> =
            samples.iter().map(|(c, m)| (c.clone(), json!(m))).collect();
        let doc = json!({"configs": configs, "ratios": ratios, "rounds": rounds, "seconds": secs, "samples": raw});
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        println!("wrote {path}");
    }
    Ok(())
}

/// Builds the topology for `cfg`, measures, and tears it down.
fn measure(cfg: &str, secs: u64) -> Result<[f64; 5]> {
    let (n1, n2) = direct_pair()?;
    let mut nodes = [n1, n2];
    let mtu = if cfg == "route" { 1500 } else { 1450 };
    for n in nodes.iter_mut() {
        n.pods_for(subnet_of(n.index).addr(), 24, 1, mtu)?;
    }
    let _pins: Vec<TestPins>;
    match cfg {
        "route" => {
            for (a, b) in [(0, 1), (1, 0)] {
                let (n, o) = (&nodes[a], &nodes[b]);
                n.ns.sysctl("net.ipv4.ip_forward", "1")?;
                n.ns.ip(&[
                    "route",
                    "add",
                    &subnet_of(o.index).to_string(),
                    "via",
                    &o.ip.to_string(),
                ])?;
            }
        }
        "kernel_vxlan" => {
            let macs = [
                flannel_device(&nodes[0], subnet_of(1))?,
                flannel_device(&nodes[1], subnet_of(2))?,
            ];
            for (a, b) in [(0, 1), (1, 0)] {
                flannel_peer(&nodes[a], subnet_of(nodes[b].index), nodes[b].ip, macs[b])?;
            }
        }
        "weft" | "weft_tc" => {
            let decap = if cfg == "weft" {
                DecapMode::XdpAuto
            } else {
                DecapMode::Tc
            };
            let pins = vec![TestPins::new(), TestPins::new()];
            for (a, b) in [(0, 1), (1, 0)] {
                let (n, o) = (&nodes[a], &nodes[b]);
                install(
                    n,
                    spec(n, subnet_of(n.index), pins[a].pins(), decap),
                    vec![peer(o, subnet_of(o.index))],
                )?;
            }
            _pins = pins;
        }
        other => bail!("unknown config {other}"),
    }
    let client = &nodes[0].pods[0].ns;
    let server = &nodes[1].pods[0];
    if !crate::cluster::ping(client, server.ip, 3) {
        bail!("{cfg}: the pods cannot reach each other");
    }
    let _iperf = server.ns.spawn("iperf3", &["-s", "-p", "5201"])?;
    let _sockperf = server.ns.spawn(
        "sockperf",
        &["sr", "-i", &server.ip.to_string(), "-p", "11111"],
    )?;
    std::thread::sleep(Duration::from_millis(500));
    let tcp = iperf_tcp(client, server.ip, 1, secs)?;
    let tcp4 = iperf_tcp(client, server.ip, 4, secs)?;
    let udp = iperf_udp64(client, server.ip, secs)?;
    let (p50, p99) = rr(client, server.ip, secs)?;
    Ok([tcp, tcp4, udp, p50, p99])
}

/// Two nodes joined directly by a veth pair, 198.18.0.1 and .2.
fn direct_pair() -> Result<(Node, Node)> {
    let mk = |i: u8| -> Result<Node> {
        Ok(Node {
            ns: Netns::new("wb")?,
            index: i,
            ip: Ipv4Addr::new(198, 18, 0, i),
            pods: Vec::new(),
        })
    };
    let (a, b) = (mk(1)?, mk(2)?);
    veth(&a.ns, "eth0", &b.ns, "eth0")?;
    a.ns.ip(&["addr", "add", "198.18.0.1/24", "dev", "eth0"])?;
    b.ns.ip(&["addr", "add", "198.18.0.2/24", "dev", "eth0"])?;
    Ok((a, b))
}

fn iperf_json(ns: &Netns, args: &[&str]) -> Result<Value> {
    let out = ns.command("iperf3").args(args).args(["-J"]).output()?;
    let v: Value = serde_json::from_slice(&out.stdout).context("iperf3 JSON")?;
    if let Some(e) = v.get("error") {
        bail!("iperf3: {e}");
    }
    Ok(v)
}

fn iperf_tcp(client: &Netns, ip: Ipv4Addr, streams: u32, secs: u64) -> Result<f64> {
    let v = iperf_json(
        client,
        &[
            "-c",
            &ip.to_string(),
            "-p",
            "5201",
            "-t",
            &secs.to_string(),
            "-P",
            &streams.to_string(),
            "-O",
            "1",
        ],
    )?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3: no sum_received")?;
    Ok(bps / 1e9)
}

fn iperf_udp64(client: &Netns, ip: Ipv4Addr, secs: u64) -> Result<f64> {
    let v = iperf_json(
        client,
        &[
            "-c",
            &ip.to_string(),
            "-p",
            "5201",
            "-u",
            "-b",
            "0",
            "-l",
            "64",
            "-t",
            &secs.to_string(),
        ],
    )?;
    let sum = &v["end"]["sum"];
    let packets = sum["packets"].as_f64().context("iperf3: no packets")?;
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    let seconds = sum["seconds"].as_f64().unwrap_or(secs as f64);
    Ok((packets - lost) / seconds)
}

fn rr(client: &Netns, ip: Ipv4Addr, secs: u64) -> Result<(f64, f64)> {
    let out = client
        .command("sockperf")
        .args([
            "pp",
            "-i",
            &ip.to_string(),
            "-p",
            "11111",
            "-t",
            &secs.to_string(),
            "-m",
            "64",
            "--full-rtt",
        ])
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let pct = |p: &str| -> Result<f64> {
        text.lines()
            .find(|l| l.contains(&format!("percentile {p} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("sockperf gave no percentile {p}: {text}"))
    };
    Ok((pct("50.000")?, pct("99.000")?))
}
