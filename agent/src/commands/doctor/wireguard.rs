//! The wireguard backend's checks: each device's UDP port open, and the
//! peers that carry traffic handshaking.

use super::findings::Findings;
use crate::dataplane::wireguard::{DeviceView, HANDSHAKE_RECENT_SECS, age};

/// Whether a UDP socket is bound to `port` in this network namespace
/// (WireGuard's sockets are the kernel's own, listed with the rest).
fn udp_listening(port: u16) -> bool {
    ["/proc/net/udp", "/proc/net/udp6"].iter().any(|p| {
        std::fs::read_to_string(p).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|local| local.rsplit(':').next())
                    .and_then(|h| u16::from_str_radix(h, 16).ok())
                    == Some(port)
            })
        })
    })
}

pub(super) fn check(f: &mut Findings, devices: &[DeviceView]) {
    for d in devices {
        let key = d
            .public_key
            .map_or_else(|| "none".into(), |k| k.to_string());
        if d.public_key.is_none() {
            f.fail(
                "wireguard",
                format!("{} has no private key", d.name),
                "restart the agent: it sets the key from its key file",
            );
        } else {
            f.ok(
                "wireguard",
                format!(
                    "{} on UDP {} with public key {key}, {} peer(s)",
                    d.name,
                    d.port,
                    d.peers.len()
                ),
            );
        }
        if udp_listening(d.port) {
            f.ok("wg port", format!("UDP {} is open ({})", d.port, d.name));
        } else {
            f.fail(
                "wg port",
                format!("nothing listens on UDP {} ({} is down?)", d.port, d.name),
                format!("ip link set {} up, or restart the agent", d.name),
            );
        }
        // A peer we sent to whose handshake is old or never came: it does
        // not answer (a firewall on the port, a key in its lease that is
        // not its device's).
        let silent: Vec<String> = d
            .peers
            .iter()
            .filter(|p| p.tx_bytes > 0)
            .filter(|p| age(p.last_handshake).is_none_or(|a| a > HANDSHAKE_RECENT_SECS))
            .map(|p| {
                format!(
                    "{} ({})",
                    p.endpoint.map_or_else(|| "-".into(), |e| e.to_string()),
                    age(p.last_handshake).map_or_else(|| "never".into(), |a| format!("{a}s ago"))
                )
            })
            .collect();
        if silent.is_empty() {
            f.ok(
                "handshake",
                format!(
                    "every peer {} sent to handshook within {HANDSHAKE_RECENT_SECS} s",
                    d.name
                ),
            );
        } else {
            let shown: Vec<&str> = silent.iter().take(5).map(String::as_str).collect();
            f.warn(
                "handshake",
                format!(
                    "{} of {} peer(s) of {} sent to without a handshake in {HANDSHAKE_RECENT_SECS} s: {}",
                    silent.len(),
                    d.peers.len(),
                    d.name,
                    shown.join(", ")
                ),
                format!(
                    "check that UDP {} reaches those nodes, and that their leases' PublicKey is their device's (weft status there)",
                    d.port
                ),
            );
        }
    }
}
