//! Neighbour proxies on the pod bridge for netkit pods, so veth and netkit
//! pods of one node reach each other.
//!
//! A veth pod takes its whole subnet (the `/24`) as on-link through the
//! bridge and asks for a neighbour's MAC there (ARP, neighbour discovery);
//! a netkit pod is not on the bridge, so nobody would answer for it. The
//! host answers in its place: a proxy entry per netkit pod address on the
//! bridge (`ip neigh add proxy ADDR dev cni0`; IPv6 also needs the bridge's
//! `proxy_ndp`), and the host route to the pod's netkit takes the packet
//! from there. ADD of a netkit pod adds its entries where the bridge
//! exists; ADD of a veth pod (which may have just made the bridge) adds
//! those of every netkit pod registered; DEL of a netkit pod removes its
//! own.

use std::net::IpAddr;

use futures::TryStreamExt as _;
use rtnetlink::{Handle, packet_route::neighbour::NeighbourFlags};

use super::error::{CniError, Code};

/// Adds (or, with `add` false, removes) proxy entries for `ips` on
/// `bridge`; nothing if there is no such device.
pub(crate) async fn set(
    h: &Handle,
    bridge: &str,
    ips: &[IpAddr],
    add: bool,
) -> Result<(), CniError> {
    let found = h
        .link()
        .get()
        .match_name(bridge.to_string())
        .execute()
        .try_next()
        .await;
    let index = match found {
        Ok(Some(l)) => l.header.index,
        Ok(None) => return Ok(()),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => return Ok(()),
        Err(e) => {
            return Err(CniError::new(Code::Plugin, format!("looking up {bridge}"))
                .with_details(e.to_string()));
        }
    };
    if add {
        // Answer at once, not after the default random delay of up to
        // 0.8 s; and IPv6 proxies only where proxy_ndp is on.
        let mut keys = vec![format!("/proc/sys/net/ipv4/neigh/{bridge}/proxy_delay")];
        if ips.iter().any(IpAddr::is_ipv6) {
            keys.push(format!("/proc/sys/net/ipv6/neigh/{bridge}/proxy_delay"));
            keys.push(format!("/proc/sys/net/ipv6/conf/{bridge}/proxy_ndp"));
        }
        for key in keys {
            let v = if key.ends_with("proxy_ndp") { "1" } else { "0" };
            std::fs::write(&key, v).map_err(|e| {
                CniError::new(Code::Io, format!("setting {key}")).with_details(e.to_string())
            })?;
        }
    }
    for ip in ips {
        let mut req = h.neighbours().add(index, *ip).flags(NeighbourFlags::Proxy);
        let r = if add {
            req.replace().execute().await
        } else {
            let msg = req.message_mut().clone();
            match h.neighbours().del(msg).execute().await {
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => Ok(()),
                r => r,
            }
        };
        r.map_err(|e| {
            CniError::new(
                Code::Plugin,
                format!(
                    "{} the neighbour proxy for {ip} on {bridge}",
                    if add { "adding" } else { "removing" }
                ),
            )
            .with_details(e.to_string())
        })?;
    }
    Ok(())
}
