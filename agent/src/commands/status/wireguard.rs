//! `weft status` on a node of the wireguard backend: its devices and each
//! peer as the kernel reports it (endpoint, allowed IPs, handshake age,
//! bytes), and what the agent says.

use anyhow::Result;
use serde_json::json;

use crate::{
    dataplane::wireguard::{DeviceView, age},
    lease, report,
};

/// Prints the status of the wireguard backend's `devices`.
/// Host routing into and out of the devices, where it runs.
pub(crate) struct FastView {
    pub counters: Vec<(dataplane_common::Reason, dataplane_common::Counter)>,
    /// Local pods in the endpoint map.
    pub endpoints: usize,
}

impl FastView {
    fn packets(&self, r: dataplane_common::Reason) -> u64 {
        self.counters
            .iter()
            .find(|(x, _)| *x == r)
            .map_or(0, |(_, c)| c.packets)
    }
}

pub(crate) fn print(
    devices: &[DeviceView],
    fast: Option<FastView>,
    subnet: Option<lease::Subnets>,
    agent: Option<report::Report>,
    json_out: bool,
) -> Result<()> {
    if json_out {
        let doc = json!({
            "backend": "wireguard",
            "subnet": subnet.and_then(|s| s.v4).map(|s| s.to_string()),
            "subnet6": subnet.and_then(|s| s.v6).map(|s| s.to_string()),
            "devices": devices.iter().map(|d| json!({
                "name": d.name,
                "port": d.port,
                "public_key": d.public_key.map(|k| k.to_string()),
                "peers": d.peers.iter().map(|p| json!({
                    "public_key": p.key.to_string(),
                    "endpoint": p.endpoint.map(|e| e.to_string()),
                    "allowed_ips": p.allowed.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                    "handshake_age_s": age(p.last_handshake),
                    "rx_bytes": p.rx_bytes,
                    "tx_bytes": p.tx_bytes,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "host_routing": fast.as_ref().map(|f| json!({
                "endpoints": f.endpoints,
                "sent_packets": f.packets(dataplane_common::Reason::EncapBypass),
                "delivered_packets": f.packets(dataplane_common::Reason::DecapBypass),
                "passed_packets": f.packets(dataplane_common::Reason::Passed),
            })),
            "agent": agent,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("Node (wireguard backend)");
    println!(
        "  subnet     {}",
        subnet.map_or_else(|| "unknown".into(), |s| s.to_string())
    );
    for d in devices {
        println!(
            "\nDevice {}  UDP {}  public key {}",
            d.name,
            d.port,
            d.public_key
                .map_or_else(|| "none".into(), |k| k.to_string())
        );
        println!(
            "  {:<46} {:<24} {:<14} {:>10} {:>12} {:>12}",
            "peer", "endpoint", "allowed", "handshake", "rx", "tx"
        );
        for p in &d.peers {
            let allowed: Vec<String> = p.allowed.iter().map(|a| a.to_string()).collect();
            println!(
                "  {:<46} {:<24} {:<14} {:>10} {:>12} {:>12}",
                p.key.to_string(),
                p.endpoint.map_or_else(|| "-".into(), |e| e.to_string()),
                allowed.join(","),
                age(p.last_handshake).map_or_else(|| "never".into(), |a| format!("{a}s ago")),
                p.rx_bytes,
                p.tx_bytes,
            );
        }
    }
    match &fast {
        Some(f) => println!(
            "\nHost routing: {} local pod(s); {} packet(s) sent straight to WireGuard, {} delivered straight from it, {} passed to the host stack",
            f.endpoints,
            f.packets(dataplane_common::Reason::EncapBypass),
            f.packets(dataplane_common::Reason::DecapBypass),
            f.packets(dataplane_common::Reason::Passed),
        ),
        None => println!("\nHost routing: off (legacy): every packet takes the host stack"),
    }
    if let Some(r) = agent {
        println!("\nAgent");
        println!("  ready      {}", r.ready);
        for rj in &r.rejected {
            println!("  rejected   {} ({}): {}", rj.key, rj.reason, rj.detail);
        }
        for h in &r.peer_health {
            println!("  probe      {} via {}: {}", h.subnet, h.vtep, h.state);
        }
        if let Some(k) = &r.kernel {
            super::print_kernel(k);
        }
    }
    Ok(())
}
