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
pub(crate) fn print(
    devices: &[DeviceView],
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
    if let Some(r) = agent {
        println!("\nAgent");
        println!("  ready      {}", r.ready);
        for rj in &r.rejected {
            println!("  rejected   {} ({}): {}", rj.key, rj.reason, rj.detail);
        }
        for h in &r.peer_health {
            println!("  probe      {} via {}: {}", h.subnet, h.vtep, h.state);
        }
    }
    Ok(())
}
