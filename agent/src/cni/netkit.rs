//! Standalone pods on netkit (`"podDevice": "netkit"`): the plugin creates
//! the pod's device itself instead of delegating to `bridge`.
//!
//! - IPAM: `host-local` over the node's subnets, exactly as the bridge
//!   delegate would run it (same ranges, routes and data directory, so
//!   veth and netkit pods of one node share one pool).
//! - The device: a netkit pair in L3 mode, the primary (host side) named
//!   `nk` + a hash of the attachment, the peer created directly in the
//!   pod's namespace under `CNI_IFNAME`; both ends get subnet.env's MTU.
//!   The peer's default policy is *blackhole*: nothing the pod sends goes
//!   anywhere until Weft's transmit program runs at the peer hook.
//! - The program: attached here, at ADD, from the agent's pins (the current
//!   generation's `weft_from_pod`), its link pinned where the agent keeps
//!   its links, so the agent adopts it (and swaps in a new program on an
//!   upgrade) as any other. With no agent pins on the node (the agent has
//!   never run here) ADD fails and changes nothing: the runtime retries,
//!   as it does while the node's network is not ready.
//! - Addresses and routes: the pod's addresses on the peer, a default route
//!   per family via the subnet's gateway (no ARP or neighbour discovery on
//!   an L3 netkit: the gateway is just a next hop), IPAM's routes; on the
//!   host a route per pod address to the primary (the stack still carries
//!   each flow's first packets, and everything the fast path passes).
//!
//! DEL removes the pair (the peer and the link go with it), the link's pin
//! and the addresses from IPAM; it is safe to repeat.

use std::{
    net::IpAddr,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use futures::TryStreamExt as _;
use ipnet::IpNet;
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkNetkit, LinkUnspec, RouteMessageBuilder,
    packet_route::{
        address::{AddressAttribute, AddressFlags},
        link::{
            InfoData, InfoNetkit, LinkAttribute, LinkInfo, LinkMessage, NetkitMode, NetkitPolicy,
        },
        route::{RouteAddress, RouteAttribute, RouteScope},
    },
};
use serde_json::{Value, json};

use super::{
    Env, delegate,
    error::{CniError, Code},
    proxy,
};
use crate::dataplane::{Hook, PinDir, kernel_features::NETKIT, netkit as nk};
use dataplane_common::program_names;

/// The host side's name for the attachment `owner`: `nk` and 12 hex
/// digits of a hash of it (15 bytes at most, as interface names are).
pub(crate) fn primary_name(owner: &str) -> String {
    // FNV-1a: stable across releases, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in owner.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("nk{:012x}", h & 0xffff_ffff_ffff)
}

fn plugin_err(msg: impl Into<String>, e: impl std::fmt::Display) -> CniError {
    CniError::new(Code::Plugin, msg).with_details(format!("{e:#}"))
}

/// The IPAM config the bridge delegate would get, as a config of its own.
pub(crate) fn ipam_config(delegate_config: &Value) -> Value {
    json!({
        "cniVersion": delegate_config["cniVersion"],
        "name": delegate_config["name"],
        "type": delegate_config["ipam"]["type"],
        "ipam": delegate_config["ipam"],
    })
}

/// What ADD made: the CNI result (interfaces, addresses, routes).
pub(crate) fn add(
    ipam: &Value,
    mtu: u32,
    state_dir: &Path,
    bridge: &str,
    env: &Env,
    owner: &str,
) -> Result<Value, CniError> {
    // The program first: without it the pod's device would drop all it
    // sends, so without the agent's pins nothing is created.
    let pins = PinDir::announced(state_dir).ok_or_else(|| {
        CniError::new(
            Code::TryAgainLater,
            format!(
                "the Weft agent has not installed its programs on this node yet ({} names none): a netkit pod's device would drop everything it sends; try again once the agent runs",
                state_dir.join("bpffs-dir").display()
            ),
        )
    })?;
    let program = pins.root().join("programs").join(program_names::FROM_POD);
    let prog = aya::programs::SchedClassifier::from_pin(&program).map_err(|e| {
        CniError::new(
            Code::TryAgainLater,
            format!(
                "cannot open the agent's transmit program at {}: try again once the agent runs",
                program.display()
            ),
        )
        .with_details(e.to_string())
    })?;
    let prog_fd = prog
        .fd()
        .map_err(|e| plugin_err("the agent's transmit program has no descriptor", e))?
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| plugin_err("duplicating the program's descriptor", e))?;

    refuse_without_netkit(state_dir)?;

    let result = delegate::exec(ipam, "ADD", env, None)?;
    let name = primary_name(owner);
    let made = (|| {
        let addrs = addresses(&result)?;
        let index = runtime(async |h| create(h, &name, &env.ifname, &env.netns, mtu).await)?;
        let pin = crate::dataplane::link_pin_path(&pins, Hook::NetkitPeer, &name, index);
        nk::attach_pinned(&prog_fd, index, nk::NetkitHook::Peer, &pin).map_err(|e| {
            plugin_err(
                format!("attaching Weft's transmit program to netkit {name}"),
                e,
            )
        })?;
        in_netns(&env.netns, || {
            runtime(async |h| configure_pod(h, &env.ifname, &addrs, &result).await)
        })?;
        runtime(async |h| configure_host(h, index, &addrs).await)?;
        let ips: Vec<IpAddr> = addrs.iter().map(|a| a.net.addr()).collect();
        runtime(async |h| proxy::set(h, bridge, &ips, true).await)?;
        Ok::<_, CniError>(index)
    })();
    if let Err(e) = made {
        // Nothing half-made stays: the pair (and its link) and the
        // addresses go.
        let _ = runtime(async |h| delete(h, &name).await);
        remove_link_pins(&pins, &name);
        let _ = delegate::exec(ipam, "DEL", env, None);
        return Err(e);
    }
    Ok(cni_result(&result, &name, &env.ifname, &env.netns))
}

/// DEL: the bridge's proxies for the pod's addresses `ips` and for those
/// the host routes through its pair (an ADD that died before its record
/// left proxies nobody else names), the pair and its link's pin go, then
/// the addresses.
pub(crate) fn del(
    ipam: &Value,
    state_dir: &Path,
    bridge: &str,
    ips: &[IpAddr],
    env: &Env,
    owner: &str,
) -> Result<(), CniError> {
    let name = primary_name(owner);
    let mut ips = ips.to_vec();
    for ip in runtime(async |h| routed_through(h, &name).await)? {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    runtime(async |h| proxy::set(h, bridge, &ips, false).await)?;
    runtime(async |h| delete(h, &name).await)?;
    if let Some(pins) = PinDir::announced(state_dir) {
        remove_link_pins(&pins, &name);
    }
    delegate::exec(ipam, "DEL", env, None).map(|_| ())
}

/// Proxies on `bridge` for every registered netkit pod (after a veth ADD,
/// which may have made the bridge). Best effort: a veth pod works without
/// them, only not with the netkit pods of its node.
pub(crate) fn proxy_registered(state_dir: &Path, bridge: &str) {
    let ips: Vec<IpAddr> = super::records(state_dir)
        .iter()
        .filter(|r| r.netkit)
        .flat_map(|r| r.ips())
        .collect();
    if !ips.is_empty() {
        let _ = runtime(async |h| proxy::set(h, bridge, &ips, true).await);
    }
}

/// Removes the link pins of netkit device `name` (whatever its index was).
fn remove_link_pins(pins: &PinDir, name: &str) {
    let prefix = format!("{}-{name}-", Hook::NetkitPeer.pin_prefix());
    if let Ok(entries) = std::fs::read_dir(pins.links()) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The pod's addresses (with their prefixes) and each family's gateway.
struct Addr {
    net: IpNet,
    gateway: Option<IpAddr>,
}

fn addresses(result: &Value) -> Result<Vec<Addr>, CniError> {
    let out: Vec<Addr> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| {
            Some(Addr {
                net: a["address"].as_str()?.parse().ok()?,
                gateway: a["gateway"].as_str().and_then(|g| g.parse().ok()),
            })
        })
        .collect();
    if out.is_empty() {
        return Err(CniError::new(
            Code::Plugin,
            format!("host-local gave no address: {result}"),
        ));
    }
    Ok(out)
}

/// The result a runtime gets: the primary on the host, the peer in the
/// sandbox, IPAM's addresses on the peer (interface 1) and its routes.
fn cni_result(ipam: &Value, primary: &str, ifname: &str, netns: &str) -> Value {
    let mut out = ipam.clone();
    out["interfaces"] = json!([
        {"name": primary, "mac": "00:00:00:00:00:00"},
        {"name": ifname, "mac": "00:00:00:00:00:00", "sandbox": netns},
    ]);
    if let Some(ips) = out["ips"].as_array_mut() {
        for ip in ips {
            ip["interface"] = json!(1);
        }
    }
    out
}

/// Runs `f` with a fresh rtnetlink handle (in the calling thread's network
/// namespace) on a private runtime.
fn runtime<T>(f: impl AsyncFnOnce(&Handle) -> Result<T, CniError>) -> Result<T, CniError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| plugin_err("starting a runtime for netlink", e))?;
    rt.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| plugin_err("opening an rtnetlink socket", e))?;
        tokio::spawn(conn);
        f(&handle).await
    })
}

/// Runs `f` on a thread of its own moved into the network namespace at
/// `netns` (the plugin's own threads stay where they are).
fn in_netns<T: Send>(
    netns: &str,
    f: impl FnOnce() -> Result<T, CniError> + Send,
) -> Result<T, CniError> {
    let ns = std::fs::File::open(netns).map_err(|e| {
        CniError::new(Code::InvalidEnv, format!("cannot open CNI_NETNS {netns}"))
            .with_details(e.to_string())
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a descriptor we own; it moves only this
            // thread, which ends with `f`.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(plugin_err(
                    format!("entering the pod's network namespace {netns}"),
                    std::io::Error::last_os_error(),
                ));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(CniError::new(Code::Plugin, "the netns thread panicked")))
    })
}

fn nl_err(what: String) -> impl FnOnce(rtnetlink::Error) -> CniError {
    move |e| plugin_err(what, e)
}

/// Creates the pair: `name` here, `ifname` in the namespace at `netns`,
/// L3, both ends with `mtu`, the peer blackholed until a program runs.
/// Returns the primary's index.
async fn create(
    h: &Handle,
    name: &str,
    ifname: &str,
    netns: &str,
    mtu: u32,
) -> Result<u32, CniError> {
    let ns = std::fs::File::open(netns).map_err(|e| {
        CniError::new(Code::InvalidEnv, format!("cannot open CNI_NETNS {netns}"))
            .with_details(e.to_string())
    })?;
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(ifname.to_string())
        .mtu(mtu)
        .setns_by_fd(ns.as_raw_fd())
        .build();
    let mut msg = LinkNetkit::new(name, ifname, NetkitMode::L3)
        .mtu(mtu)
        .policy(NetkitPolicy::Pass)
        .peer_policy(NetkitPolicy::Drop)
        .build();
    // The builder names the peer only: give it its namespace and MTU.
    for attr in &mut msg.attributes {
        if let LinkAttribute::LinkInfo(infos) = attr {
            for info in infos {
                if let LinkInfo::Data(InfoData::Netkit(data)) = info {
                    for d in data.iter_mut() {
                        if let InfoNetkit::Peer(p) = d {
                            *p = peer.clone();
                        }
                    }
                }
            }
        }
    }
    h.link().add(msg).execute().await.map_err(|e| {
        let hint = match &e {
            rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::EOPNOTSUPP => {
                " (this kernel has no netkit: it needs Linux 6.7 or later with CONFIG_NETKIT)"
            }
            _ => "",
        };
        plugin_err(format!("creating the netkit pair {name}/{ifname}{hint}"), e)
    })?;
    let link = h
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await
        .map_err(nl_err(format!("looking up {name}")))?
        .ok_or_else(|| CniError::new(Code::Plugin, format!("{name} vanished once created")))?;
    Ok(link.header.index)
}

/// Refuses a netkit pod, before any address is taken, where the agent
/// found (or was told, `--kernel-feature-off`) that this node has no
/// netkit. Without the agent's report the kernel is asked by creating
/// the pair, and its refusal is said then.
fn refuse_without_netkit(state_dir: &Path) -> Result<(), CniError> {
    let Some(kernel) = crate::report::read(state_dir).and_then(|r| r.kernel) else {
        return Ok(());
    };
    match kernel.features.iter().find(|f| f.name == NETKIT) {
        Some(f) if !f.available => Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "no netkit on this node (the agent's kernel features: netkit unavailable: {}): pods here attach with veth, so use \"podDevice\": \"veth\"",
                f.detail
            ),
        )),
        _ => Ok(()),
    }
}

/// The link named `name`, if it exists.
async fn find(h: &Handle, name: &str) -> Result<Option<LinkMessage>, CniError> {
    match h
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await
    {
        Ok(l) => Ok(l),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(plugin_err(format!("looking up {name}"), e)),
    }
}

/// The addresses the host routes to through the netkit device `name`
/// (the host routes [`configure_host`] added): none where it is gone.
async fn routed_through(h: &Handle, name: &str) -> Result<Vec<IpAddr>, CniError> {
    let Some(index) = find(h, name).await?.map(|l| l.header.index) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (msg, full) in [
        (RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(), 32),
        (
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
            128,
        ),
    ] {
        let mut routes = h.route().get(msg).execute();
        while let Some(m) = routes
            .try_next()
            .await
            .map_err(nl_err(format!("listing the routes through {name}")))?
        {
            let through = m
                .attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index));
            let dst = m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
                RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
                _ => None,
            });
            if let Some(dst) = dst
                && through
                && m.header.destination_prefix_length == full
            {
                out.push(dst);
            }
        }
    }
    Ok(out)
}

/// Deletes the pair whose primary is `name`, if it exists.
async fn delete(h: &Handle, name: &str) -> Result<(), CniError> {
    let Some(link) = find(h, name).await? else {
        return Ok(());
    };
    let is_netkit = link.attributes.iter().any(|a| {
        matches!(a, LinkAttribute::LinkInfo(i) if i.iter().any(|i| matches!(i, LinkInfo::Data(InfoData::Netkit(_)))))
    });
    if !is_netkit {
        return Err(CniError::new(
            Code::Plugin,
            format!("{name} exists and is not a netkit device: left alone"),
        ));
    }
    h.link()
        .del(link.header.index)
        .execute()
        .await
        .map_err(nl_err(format!("deleting {name}")))
}

/// Inside the pod: loopback and the peer up, the addresses, a default
/// route per family via its gateway, and IPAM's routes.
async fn configure_pod(
    h: &Handle,
    ifname: &str,
    addrs: &[Addr],
    result: &Value,
) -> Result<(), CniError> {
    let index_of = async |n: &str| -> Result<u32, CniError> {
        Ok(h.link()
            .get()
            .match_name(n.to_string())
            .execute()
            .try_next()
            .await
            .map_err(nl_err(format!("looking up {n} in the pod")))?
            .ok_or_else(|| CniError::new(Code::Plugin, format!("no {n} in the pod")))?
            .header
            .index)
    };
    let lo = index_of("lo").await?;
    let dev = index_of(ifname).await?;
    for i in [lo, dev] {
        h.link()
            .set(LinkUnspec::new_with_index(i).up().build())
            .execute()
            .await
            .map_err(nl_err(format!("setting device {i} up in the pod")))?;
    }
    for a in addrs {
        let mut req = h.address().add(dev, a.net.addr(), a.net.prefix_len());
        if a.net.addr().is_ipv6() {
            // No duplicate address detection: the address is the pod's
            // alone (IPAM's), and nothing could answer on a netkit.
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute()
            .await
            .map_err(nl_err(format!("adding {} to {ifname}", a.net)))?;
    }
    // Each family's default route, then IPAM's routes (the cluster
    // network), via that family's gateway.
    let mut routes: Vec<IpNet> = vec![];
    for a in addrs {
        routes.push(match a.net {
            IpNet::V4(_) => "0.0.0.0/0".parse().expect("a prefix"),
            IpNet::V6(_) => "::/0".parse().expect("a prefix"),
        });
    }
    for r in result["routes"].as_array().into_iter().flatten() {
        if let Some(dst) = r["dst"].as_str().and_then(|d| d.parse::<IpNet>().ok())
            && !routes.contains(&dst)
        {
            routes.push(dst);
        }
    }
    for dst in routes {
        let gw = addrs
            .iter()
            .find(|a| a.net.addr().is_ipv6() == dst.addr().is_ipv6())
            .and_then(|a| a.gateway);
        let msg = match (dst, gw) {
            (IpNet::V4(d), Some(IpAddr::V4(g))) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .gateway(g)
                .output_interface(dev)
                .build(),
            (IpNet::V6(d), Some(IpAddr::V6(g))) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .gateway(g)
                .output_interface(dev)
                .build(),
            // No gateway: the device itself.
            (IpNet::V4(d), _) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .output_interface(dev)
                .scope(RouteScope::Link)
                .build(),
            (IpNet::V6(d), _) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(d.addr(), d.prefix_len())
                .output_interface(dev)
                .build(),
        };
        h.route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(nl_err(format!("adding the route to {dst} in the pod")))?;
    }
    Ok(())
}

/// On the host: the primary up and a route to each pod address through it.
async fn configure_host(h: &Handle, index: u32, addrs: &[Addr]) -> Result<(), CniError> {
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(nl_err(format!("setting netkit {index} up")))?;
    for a in addrs {
        let msg = match a.net.addr() {
            IpAddr::V4(ip) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(ip, 32)
                .output_interface(index)
                .scope(RouteScope::Link)
                .build(),
            IpAddr::V6(ip) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(ip, 128)
                .output_interface(index)
                .build(),
        };
        h.route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(nl_err(format!("adding the host route to {}", a.net.addr())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_names_are_interface_names_and_stable() {
        let a = primary_name("0123456789abcdef-eth0");
        assert_eq!(a.len(), 14);
        assert!(a.starts_with("nk"));
        assert_eq!(a, primary_name("0123456789abcdef-eth0"));
        assert_ne!(a, primary_name("0123456789abcdef-eth1"));
        // Pinned: a release that named them otherwise could not find the
        // devices of pods attached before it.
        assert_eq!(primary_name(""), "nk9ce484222325");
    }

    #[test]
    fn the_result_puts_the_addresses_on_the_pod_side() {
        let ipam = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.5.1.2/24", "gateway": "10.5.1.1"}], "routes": [{"dst": "10.5.0.0/16"}]});
        let r = cni_result(&ipam, "nkabc", "eth0", "/run/netns/x");
        assert_eq!(r["interfaces"][1]["sandbox"], "/run/netns/x");
        assert_eq!(r["ips"][0]["interface"], 1);
        assert_eq!(r["routes"][0]["dst"], "10.5.0.0/16");
        let a = addresses(&ipam).unwrap();
        assert_eq!(a[0].net.to_string(), "10.5.1.2/24");
        assert_eq!(a[0].gateway, Some("10.5.1.1".parse().unwrap()));
        assert!(addresses(&json!({"ips": []})).is_err());
    }
}
