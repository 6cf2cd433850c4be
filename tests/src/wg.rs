//! WireGuard as flannel's `wireguard` backend sets it up (`wg` from
//! wireguard-tools), and the keys both sides use.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::{Context as _, Result, bail};
use ipnet::{Ipv4Net, Ipv6Net};

use crate::cluster::Node;

/// flannel's ports and device names.
pub const PORT: u16 = 51820;
pub const PORT6: u16 = 51821;
pub const DEVICE: &str = "flannel-wg";
pub const DEVICE6: &str = "flannel-wg-v6";

/// A private key made by `wg genkey` into `path` (mode 0400, base64, as
/// flannel keeps it); returns its public key.
pub fn genkey(path: &Path) -> Result<String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 277; wg genkey > '{p}' && wg pubkey < '{p}'",
            p = path.display()
        ))
        .output()
        .context("running wg (wireguard-tools)")?;
    if !out.status.success() {
        bail!("wg genkey: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// flannel's devices on `node` in `Mode` separate: `flannel-wg` (IPv4,
/// port 51820) holding `subnet`'s network address, and `flannel-wg-v6`
/// (port 51821) holding `subnet6`'s where given; MTU `mtu`; the cluster
/// networks routed to them.
pub fn kernel_devices(
    node: &Node,
    key_file: &Path,
    mtu: u32,
    subnet: Ipv4Net,
    subnet6: Option<Ipv6Net>,
) -> Result<()> {
    let ns = &node.ns;
    let key = key_file.to_str().context("a key path in UTF-8")?;
    let mtu = mtu.to_string();
    let mut devices = vec![(DEVICE, PORT)];
    if subnet6.is_some() {
        devices.push((DEVICE6, PORT6));
    }
    for (dev, port) in devices {
        ns.ip(&["link", "add", dev, "type", "wireguard"])?;
        ns.ip(&["link", "set", dev, "mtu", &mtu])?;
        ns.exec(
            "wg",
            &[
                "set",
                dev,
                "private-key",
                key,
                "listen-port",
                &port.to_string(),
            ],
        )?;
        ns.ip(&["link", "set", dev, "up"])?;
    }
    ns.ip(&[
        "addr",
        "add",
        &format!("{}/32", subnet.network()),
        "dev",
        DEVICE,
    ])?;
    ns.ip(&["route", "replace", "10.244.0.0/16", "dev", DEVICE])?;
    ns.sysctl("net.ipv4.ip_forward", "1")?;
    if let Some(s6) = subnet6 {
        ns.add_addr6(DEVICE6, s6.network(), 128)?;
        ns.ip(&["-6", "route", "replace", "fd00:10:244::/56", "dev", DEVICE6])?;
        ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    }
    Ok(())
}

/// A peer on the devices of [`kernel_devices`], as flannel's backend adds a
/// lease's node: its key, its public address at the local port, its
/// subnets as allowed IPs.
pub fn kernel_peer(
    node: &Node,
    key: &str,
    (ip, subnet): (Ipv4Addr, Ipv4Net),
    v6: Option<(Ipv6Addr, Ipv6Net)>,
) -> Result<()> {
    let set = |dev: &str, endpoint: String, allowed: String| {
        node.ns.exec(
            "wg",
            &[
                "set",
                dev,
                "peer",
                key,
                "endpoint",
                &endpoint,
                "allowed-ips",
                &allowed,
            ],
        )
    };
    set(DEVICE, format!("{ip}:{PORT}"), subnet.to_string())?;
    if let Some((ip6, s6)) = v6 {
        set(DEVICE6, format!("[{ip6}]:{PORT6}"), s6.to_string())?;
    }
    Ok(())
}
