//! Who this node is: its node id, its uplink and its public IP.

use std::{net::Ipv4Addr, path::Path};

use anyhow::{Context as _, Result, bail};

use crate::dataplane::netlink::{Link, Netlink};

/// The node id: given, or /etc/machine-id.
pub fn node_id(given: Option<&str>, machine_id: &Path) -> Result<String> {
    if let Some(id) = given {
        let id = id.trim();
        if id.is_empty() {
            bail!("--node-id is empty");
        }
        return Ok(id.to_string());
    }
    let id = std::fs::read_to_string(machine_id).with_context(|| {
        format!(
            "no --node-id given and {} cannot be read; pass --node-id",
            machine_id.display()
        )
    })?;
    let id = id.trim();
    if id.is_empty() {
        bail!("{} is empty; pass --node-id", machine_id.display());
    }
    Ok(id.to_string())
}

/// The uplink and the public IP: `--iface` and `--public-ip` when given;
/// otherwise the device that carries the public IP, or the device of the
/// default route and its first IPv4 address.
pub async fn uplink(
    nl: &Netlink,
    iface: Option<&str>,
    public_ip: Option<Ipv4Addr>,
) -> Result<(Link, Ipv4Addr)> {
    let link = match (iface, public_ip) {
        (Some(name), _) => nl.require_link(name).await?,
        (None, Some(ip)) => match nl.link_with_address(ip).await? {
            Some(l) => l,
            None => bail!("no device carries --public-ip {ip}; pass --iface too"),
        },
        (None, None) => {
            let Some(oif) = nl.default_route_oif().await? else {
                bail!("no --iface given and there is no default route to pick the uplink from");
            };
            nl.link_by_index(oif)
                .await?
                .context("the default route's device vanished")?
        }
    };
    let ip = match public_ip {
        Some(ip) => ip,
        None => match nl.addresses(link.index).await?.first() {
            Some((ip, _)) => *ip,
            None => bail!(
                "{} has no IPv4 address to use as the public IP; pass --public-ip",
                link.name
            ),
        },
    };
    Ok((link, ip))
}
