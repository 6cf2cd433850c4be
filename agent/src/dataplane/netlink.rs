//! rtnetlink: the host state the dataplane relies on (devices, addresses,
//! routes), and what is attached where.
//!
//! Every call works in the network namespace of the thread that created the
//! [`Netlink`] handle.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use std::collections::HashMap;

use super::types::XdpMode;
use anyhow::{Context as _, Result, anyhow, bail};
use futures::TryStreamExt as _;
use rtnetlink::{
    Handle, LinkUnspec, LinkVeth, LinkVxlan, LinkWireguard, RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        address::{AddressAttribute, AddressMessage},
        link::{
            InfoData, InfoKind, InfoNetkit, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
            LinkXdp, XdpAttached as Attached,
        },
        route::{
            RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
        },
    },
};

/// How long a route request may wait for the kernel's answer.
const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long listing the routes may take.
const LIST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// Somebody else's route: what it is, and its (device, gateway).
type Foreign = (String, Option<(u32, Option<IpAddr>)>);

fn failed(route: &Route, e: rtnetlink::Error) -> anyhow::Error {
    anyhow::Error::new(e).context(format!(
        "installing the route to {}/{}",
        route.dst, route.prefix_len
    ))
}

/// Routes Weft installs carry this protocol number (`ip route ... proto 44`),
/// so they can be told apart from everyone else's and removed on teardown.
pub(super) const ROUTE_PROTOCOL: u8 = 44;

/// What the dataplane needs to know about one network device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) mtu: u32,
    pub(crate) mac: [u8; 6],
    pub(crate) up: bool,
    /// ARP enabled (IFF_NOARP clear).
    pub(crate) arp: bool,
    /// "dummy", "veth", "vxlan", ... (None for physical devices).
    pub(crate) kind: Option<String>,
    /// The XDP program attached, if any.
    pub(crate) xdp: Option<XdpAttached>,
    /// The network namespace (its id here) of the device's peer, for a
    /// veth whose other end lives elsewhere (a pod's).
    pub(crate) peer_netns: Option<i32>,
    /// A netkit pair's primary (its host side, through which both its
    /// hooks are managed).
    pub(crate) netkit_primary: bool,
}

/// An XDP program attached to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XdpAttached {
    pub(crate) program: u32,
    /// Native or generic; None for hardware offload or several programs.
    pub(crate) mode: Option<XdpMode>,
}

/// The kernel's main routing table.
const MAIN_TABLE: u8 = 254;

/// Why a route was not installed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RouteError {
    /// Somebody else's route to the same prefix is in the way.
    #[error("{0}")]
    Conflict(String),
    #[error("{0:#}")]
    Other(anyhow::Error),
}

/// A route Weft manages (IPv4 or IPv6; a gateway is of the same family).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Route {
    pub dst: IpAddr,
    pub prefix_len: u8,
    pub gateway: Option<IpAddr>,
    pub oif: u32,
    pub onlink: bool,
    /// The route's MTU (a peer's path MTU less VXLAN's overhead, where it
    /// is below the device's); None: the device's.
    pub mtu: Option<u32>,
}

impl Route {
    /// The destination as a network.
    pub(crate) fn net(&self) -> Option<ipnet::IpNet> {
        ipnet::IpNet::new(self.dst, self.prefix_len).ok()
    }
}

/// A route message of ours for `route`, with source address `src` when it
/// is of the route's family. One macro for both families' builders.
macro_rules! route_message {
    ($addr:ty, $dst:expr, $route:expr, $src:expr, $gw:pat => $gwv:expr, $s:pat => $sv:expr, $v6:expr) => {{
        let route: &Route = $route;
        let mut b = RouteMessageBuilder::<$addr>::new()
            .destination_prefix($dst, route.prefix_len)
            .output_interface(route.oif)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
        match route.gateway {
            Some($gw) => b = b.gateway($gwv),
            _ if !$v6 => b = b.scope(RouteScope::Link),
            _ => {}
        }
        if route.onlink {
            b = b.onlink();
        }
        if let Some($s) = $src {
            b = b.pref_source($sv);
        }
        let mut m = b.build();
        if let Some(mtu) = route.mtu {
            m.attributes
                .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
        }
        m
    }};
}

fn route_message(route: &Route, src: Option<IpAddr>) -> RouteMessage {
    match route.dst {
        IpAddr::V4(dst) => route_message!(
            Ipv4Addr, dst, route, src,
            IpAddr::V4(gw) => gw,
            IpAddr::V4(s) => s,
            false
        ),
        IpAddr::V6(dst) => route_message!(
            Ipv6Addr, dst, route, src,
            IpAddr::V6(gw) => gw,
            IpAddr::V6(s) => s,
            true
        ),
    }
}

pub(crate) struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens a netlink socket in the current thread's network namespace. Must
    /// be called inside a tokio runtime.
    pub(crate) fn new() -> Result<Self> {
        let (conn, handle, _) =
            rtnetlink::new_connection().context("opening an rtnetlink socket")?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Runs `f` with a fresh handle on a private current-thread runtime, for
    /// callers outside async code (CLI commands, tests).
    pub(crate) fn blocking<T>(f: impl AsyncFnOnce(&Netlink) -> Result<T>) -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a tokio runtime for netlink")?;
        rt.block_on(async {
            let nl = Netlink::new()?;
            f(&nl).await
        })
    }

    pub(crate) async fn link(&self, name: &str) -> Result<Option<Link>> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(parse_link(&msg))),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
        }
    }

    pub(crate) async fn require_link(&self, name: &str) -> Result<Link> {
        self.link(name)
            .await?
            .ok_or_else(|| anyhow!("no network interface named {name:?} in this network namespace"))
    }

    pub(crate) async fn links(&self) -> Result<Vec<Link>> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .context("listing links")?;
        Ok(msgs.iter().map(parse_link).collect())
    }

    /// Creates (or converges) the overlay device `name`: one end of a veth
    /// pair (the other end, `peer`, only exists because a veth comes in
    /// pairs; nothing is ever delivered to it), with ARP off, `mac` and
    /// `mtu`, both ends up. Returns the device's index, and whether it was
    /// created now.
    ///
    /// A veth pair rather than a dummy device because every kernel with
    /// network namespaces has veth, while dummy is optional (and missing on
    /// some minimal kernels). The TC egress program redirects every IPv4
    /// packet before the veth transmits it.
    pub(crate) async fn ensure_overlay_device(
        &self,
        name: &str,
        peer: &str,
        mac: [u8; 6],
        mtu: u32,
    ) -> Result<(u32, bool)> {
        let mut created = false;
        let link = match self.link(name).await? {
            Some(l) if l.kind.as_deref() == Some("veth") => l,
            Some(l) => bail!(
                "a device named {name} exists but is a {} device, not Weft's overlay device; remove it",
                l.kind.as_deref().unwrap_or("physical")
            ),
            None => {
                let msg = LinkVeth::new(name, peer).build();
                self.handle
                    .link()
                    .add(msg)
                    .execute()
                    .await
                    .with_context(|| {
                        format!("creating the overlay device {name} (veth, peer {peer})")
                    })?;
                created = true;
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, Some(mac), mtu).await?;
        if let Some(p) = self.link(peer).await? {
            self.converge_noarp(&p, None, mtu).await?;
        }
        Ok((link.index, created))
    }

    /// Sets `link` up with ARP off, `mtu` and (if given) `mac`, unless it
    /// already is.
    async fn converge_noarp(&self, link: &Link, mac: Option<[u8; 6]>, mtu: u32) -> Result<()> {
        if mac.is_none_or(|m| m == link.mac) && link.mtu == mtu && link.up && !link.arp {
            return Ok(());
        }
        let mut b = LinkUnspec::new_with_index(link.index)
            .mtu(mtu)
            .arp(false)
            .up();
        if let Some(m) = mac {
            b = b.address(m.to_vec());
        }
        self.handle
            .link()
            .set(b.build())
            .execute()
            .await
            .with_context(|| format!("configuring {}", link.name))
    }

    /// Creates (or converges) a vxlan device `name`: the kernel's vxlan
    /// driver in collect-metadata mode on UDP `port` (`ip link add NAME type
    /// vxlan external dstport PORT [local LOCAL] nolearning`), ARP off, `mac`
    /// and `mtu`, up. It decapsulates both families (its sockets listen on
    /// IPv4 and IPv6); to send, the TC programs give every packet its tunnel
    /// key and the driver writes the outer headers, with UDP checksums, from
    /// the IPv6 address `local`. Returns the device's index, and whether it
    /// was created now.
    pub(crate) async fn ensure_vxlan_device(
        &self,
        name: &str,
        port: u16,
        local: Option<Ipv6Addr>,
        mac: [u8; 6],
        mtu: u32,
    ) -> Result<(u32, bool)> {
        let mut created = false;
        let link = match self.link(name).await? {
            Some(l) if l.kind.as_deref() == Some("vxlan") => l,
            Some(l) => bail!(
                "a device named {name} exists but is a {} device, not Weft's vxlan device; remove it",
                l.kind.as_deref().unwrap_or("physical")
            ),
            None => {
                let mut msg = LinkVxlan::new(name, 0).port(port);
                if let Some(local) = local {
                    msg = msg.local6(local);
                }
                let msg = msg
                    .collect_metadata(true)
                    .learning(false)
                    .udp_zero_csum6_rx(false)
                    .udp_zero_csum6_tx(false)
                    .build();
                self.handle
                    .link()
                    .add(msg)
                    .execute()
                    .await
                    .with_context(|| {
                        format!(
                            "creating the vxlan device {name} (collect-metadata, UDP {port}; another vxlan device on UDP {port}, such as flannel's, must be removed first)"
                        )
                    })?;
                created = true;
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, Some(mac), mtu).await?;
        Ok((link.index, created))
    }

    /// Creates (or adopts, as it is) the WireGuard device `name`, with
    /// `mtu`, up. Returns its index, and whether it was created now.
    pub(crate) async fn ensure_wireguard_device(
        &self,
        name: &str,
        mtu: u32,
    ) -> Result<(u32, bool)> {
        let mut created = false;
        let link = match self.link(name).await? {
            Some(l) if l.kind.as_deref() == Some("wireguard") => l,
            Some(l) => bail!(
                "a device named {name} exists but is a {} device, not a WireGuard device; remove it",
                l.kind.as_deref().unwrap_or("physical")
            ),
            None => {
                self.handle
                    .link()
                    .add(LinkWireguard::new(name).build())
                    .execute()
                    .await
                    .with_context(|| {
                        format!("creating the WireGuard device {name} (does this kernel have WireGuard?)")
                    })?;
                created = true;
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, None, mtu).await?;
        Ok((link.index, created))
    }

    /// Sets device `index` down.
    pub(crate) async fn set_down(&self, index: u32) -> Result<()> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).down().build())
            .execute()
            .await
            .with_context(|| format!("setting device {index} down"))
    }

    pub(crate) async fn delete_link(&self, name: &str) -> Result<bool> {
        let Some(l) = self.link(name).await? else {
            return Ok(false);
        };
        self.handle
            .link()
            .del(l.index)
            .execute()
            .await
            .with_context(|| format!("deleting device {name}"))?;
        Ok(true)
    }

    /// The addresses on device `index`, with their prefix lengths: the
    /// IPv4 ones and the IPv6 ones of global scope (not the kernel's
    /// link-local ones).
    async fn all_addresses(&self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .context("listing addresses")?;
        Ok(msgs
            .iter()
            .filter_map(|m| {
                m.attributes
                    .iter()
                    .find_map(|a| match (m.header.family, a) {
                        (AddressFamily::Inet, AddressAttribute::Local(ip @ IpAddr::V4(_))) => {
                            Some((*ip, m.header.prefix_len))
                        }
                        (AddressFamily::Inet6, AddressAttribute::Address(ip @ IpAddr::V6(v6)))
                            if v6.segments()[0] & 0xffc0 != 0xfe80 =>
                        {
                            Some((*ip, m.header.prefix_len))
                        }
                        _ => None,
                    })
            })
            .collect())
    }

    /// The IPv4 addresses on device `index`, with their prefix lengths.
    pub(crate) async fn addresses(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
        Ok(self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter_map(|(a, len)| match a {
                IpAddr::V4(a) => Some((a, len)),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    /// The addresses of one family on device `index` (IPv6: of global
    /// scope), with their prefix lengths.
    pub(crate) async fn family_addresses(&self, index: u32, v6: bool) -> Result<Vec<(IpAddr, u8)>> {
        Ok(self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter(|(a, _)| a.is_ipv6() == v6)
            .collect())
    }

    /// The IPv6 addresses of global scope on device `index`, with their
    /// prefix lengths.
    pub(crate) async fn addresses6(&self, index: u32) -> Result<Vec<(Ipv6Addr, u8)>> {
        Ok(self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter_map(|(a, len)| match a {
                IpAddr::V6(a) => Some((a, len)),
                IpAddr::V4(_) => None,
            })
            .collect())
    }

    /// Makes `addr/prefix_len` the only address of its family on device
    /// `index` (IPv6: the only one of global scope; flannel gives
    /// `flannel-v6.<VNI>` its subnet's first address, /128).
    pub(crate) async fn ensure_only_address(
        &self,
        index: u32,
        addr: impl Into<IpAddr>,
        prefix_len: u8,
    ) -> Result<()> {
        let addr = addr.into();
        let current: Vec<(IpAddr, u8)> = self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter(|(a, _)| a.is_ipv4() == addr.is_ipv4())
            .collect();
        if !current.contains(&(addr, prefix_len)) {
            self.handle
                .address()
                .add(index, addr, prefix_len)
                .replace()
                .execute()
                .await
                .with_context(|| format!("adding {addr}/{prefix_len}"))?;
        }
        for (other, len) in current {
            if (other, len) != (addr, prefix_len) {
                self.del_address(index, other, len).await?;
            }
        }
        Ok(())
    }

    async fn del_address(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(addr)
            .set_prefix_length_filter(prefix_len)
            .execute()
            .try_collect()
            .await?;
        for m in msgs {
            self.handle
                .address()
                .del(m)
                .execute()
                .await
                .with_context(|| format!("removing {addr}/{prefix_len}"))?;
        }
        Ok(())
    }

    /// Installs `routes` (protocol [`ROUTE_PROTOCOL`]), each with source
    /// address `src`, concurrently, and returns one result per route.
    ///
    /// A route is only ever replaced if Weft owns it (protocol 44), it
    /// goes through `adopt` (flannel's own device, taken over when a node
    /// moves from flannel to Weft), or it already says what Weft's would
    /// (same device and gateway: flannel's DirectRouting routes). Any other
    /// route to the same prefix in the main table, whatever its metric, is
    /// somebody else's: the route is not installed and the conflict is
    /// reported.
    pub(crate) async fn install_routes(
        &self,
        routes: &[Route],
        src: Option<IpAddr>,
        adopt: Option<u32>,
    ) -> Result<Vec<Result<(), RouteError>>> {
        use futures::StreamExt as _;
        // Most routes are new: create them, failing where any route to the
        // prefix exists. Only those are looked at further (a full listing
        // per batch would cost O(routes) each time tens of thousands of
        // leases arrive).
        let created: Vec<Result<(), rtnetlink::Error>> = futures::stream::iter(routes)
            .map(|r| self.route_request(r, src, false))
            .buffered(64)
            .collect()
            .await;
        let exists = |e: &rtnetlink::Error| matches!(e, rtnetlink::Error::NetlinkError(n) if n.raw_code() == -libc::EEXIST);
        if !created.iter().any(|r| r.as_ref().is_err_and(exists)) {
            return Ok(created
                .into_iter()
                .zip(routes)
                .map(|(r, route)| r.map_err(|e| RouteError::Other(failed(route, e))))
                .collect());
        }
        let clashes = created
            .iter()
            .filter(|r| r.as_ref().is_err_and(exists))
            .count();
        tracing::debug!(clashes, "routes exist already: looking at who owns them");
        let foreign = match tokio::time::timeout(LIST_DEADLINE, self.foreign_routes(adopt)).await {
            Ok(f) => f?,
            Err(_) => {
                // Those routes stay problems and are tried again later.
                tracing::warn!(clashes, "listing the routes took over {LIST_DEADLINE:?}");
                return Ok(created
                    .into_iter()
                    .zip(routes)
                    .map(|(r, route)| r.map_err(|e| RouteError::Other(failed(route, e))))
                    .collect());
            }
        };
        let mut results = Vec::with_capacity(routes.len());
        for (r, route) in created.into_iter().zip(routes) {
            results.push(match r {
                Ok(()) => Ok(()),
                Err(e) if exists(&e) => {
                    let conflict = foreign
                        .get(&(route.dst, route.prefix_len))
                        .filter(|(_, via)| *via != Some((route.oif, route.gateway)))
                        .map(|(what, _)| what.clone());
                    match conflict {
                        Some(other) => Err(RouteError::Conflict(format!(
                            "a route to {}/{} that Weft does not own exists ({other})",
                            route.dst, route.prefix_len
                        ))),
                        // Ours (or flannel's, adopted): replace it.
                        None => self
                            .route_request(route, src, true)
                            .await
                            .map_err(|e| RouteError::Other(failed(route, e))),
                    }
                }
                Err(e) => Err(RouteError::Other(failed(route, e))),
            });
        }
        Ok(results)
    }

    /// Routes in the main table that are not Weft's (nor through `adopt`):
    /// what they are, and their (device, gateway), by (destination, length).
    async fn foreign_routes(&self, adopt: Option<u32>) -> Result<HashMap<(IpAddr, u8), Foreign>> {
        let mut foreign: HashMap<(IpAddr, u8), Foreign> = HashMap::new();
        let names: HashMap<u32, String> = self
            .links()
            .await?
            .into_iter()
            .map(|l| (l.index, l.name))
            .collect();
        let mut visit = |m: &RouteMessage| {
            if m.header.table != MAIN_TABLE
                || m.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL)
            {
                return;
            }
            let Some(r) = parse_route(m) else {
                // No output device: a blackhole, unreachable or multipath
                // route; somebody else's either way.
                if let Some(dst) = route_dst(m) {
                    foreign.insert(
                        (dst, m.header.destination_prefix_length),
                        (
                            format!(
                                "{:?} route, protocol {:?}",
                                m.header.kind, m.header.protocol
                            ),
                            None,
                        ),
                    );
                }
                return;
            };
            if Some(r.oif) == adopt {
                return;
            }
            let dev = names
                .get(&r.oif)
                .cloned()
                .unwrap_or_else(|| r.oif.to_string());
            foreign.insert(
                (r.dst, r.prefix_len),
                (
                    format!("dev {dev}, protocol {:?}", m.header.protocol),
                    Some((r.oif, r.gateway)),
                ),
            );
        };
        self.every_route(&mut visit).await?;
        Ok(foreign)
    }

    /// Creates (`replace`: adds or replaces) a route of ours (protocol
    /// [`ROUTE_PROTOCOL`]).
    async fn route_request(
        &self,
        route: &Route,
        src: Option<IpAddr>,
        replace: bool,
    ) -> Result<(), rtnetlink::Error> {
        let req = self.handle.route().add(route_message(route, src));
        let req = if replace { req.replace() } else { req };
        // A request whose answer never comes (seen under tens of thousands
        // of route changes) must not stall the agent: it fails, and the peer
        // is retried as a route problem.
        match tokio::time::timeout(REQUEST_DEADLINE, req.execute()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(dst = %route.dst, prefix_len = route.prefix_len, "no answer from netlink within {REQUEST_DEADLINE:?}");
                Err(rtnetlink::Error::RequestFailed)
            }
        }
    }

    /// Deletes a route (a route that is already gone is not an error).
    pub(crate) async fn del_route(&self, route: &Route) -> Result<()> {
        let mut msg = route_message(route, None);
        // Any scope: the kernel matches a delete's scope unless it is
        // RT_SCOPE_NOWHERE (what `ip route del` sends), and an IPv4 device
        // route is scope link.
        msg.header.scope = RouteScope::NoWhere;
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            Err(e) => Err(e).with_context(|| {
                format!("removing the route to {}/{}", route.dst, route.prefix_len)
            }),
        }
    }

    /// The device of the IPv4 default route, if any.
    pub(crate) async fn default_route_oif(&self) -> Result<Option<u32>> {
        self.default_oif(false).await
    }

    /// The device of the IPv6 default route, if any.
    pub(crate) async fn default_route6_oif(&self) -> Result<Option<u32>> {
        self.default_oif(true).await
    }

    /// The device of one family's default route in the main table.
    async fn default_oif(&self, v6: bool) -> Result<Option<u32>> {
        let mut oif = None;
        self.each_route(v6, &mut |m: &RouteMessage| {
            if oif.is_none()
                && m.header.destination_prefix_length == 0
                && m.header.table == MAIN_TABLE
            {
                oif = parse_route(m).map(|r| r.oif);
            }
        })
        .await?;
        Ok(oif)
    }

    pub(crate) async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut stream = self.handle.link().get().match_index(index).execute();
        match stream.try_next().await {
            Ok(m) => Ok(m.as_ref().map(parse_link)),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {index}")),
        }
    }

    /// The routes Weft installed (by protocol), IPv4 and IPv6.
    pub(crate) async fn weft_routes(&self) -> Result<Vec<Route>> {
        let mut out = Vec::new();
        self.each_weft_route(|r| out.push(r)).await?;
        Ok(out)
    }

    /// Calls `f` on each route Weft installed, IPv4 then IPv6, as the dump
    /// is read (none of them held by this call).
    pub(crate) async fn each_weft_route(&self, mut f: impl FnMut(Route)) -> Result<()> {
        let mut visit = |m: &RouteMessage| {
            if m.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL)
                && let Some(r) = parse_route(m)
            {
                f(r);
            }
        };
        self.every_route(&mut visit).await
    }

    /// Calls `f` on each route, IPv4 then IPv6, as [`Netlink::each_route`].
    async fn every_route<F: FnMut(&RouteMessage)>(&self, f: &mut F) -> Result<()> {
        self.each_route(false, f).await?;
        self.each_route(true, f).await
    }

    /// Calls `f` on each route of one family as the dump is read: a node
    /// with 50,000 peers has as many routes. They are read from a socket
    /// of their own, one datagram at a time, each message parsed and let
    /// go before the next: through the handle's connection, which decodes
    /// a whole dump into its queue before the first message is looked at,
    /// every check of the routes held 8 MB of messages at once (the
    /// agent's resident set stayed 6 MB above what it kept). The dump is
    /// read in place, bounded by the socket's read timeout (`ip route
    /// show` of 50,000 routes takes 0.07-0.11 s here, dump and print).
    async fn each_route<F: FnMut(&RouteMessage)>(&self, v6: bool, f: &mut F) -> Result<()> {
        use rtnetlink::packet_core::Parseable as _;
        const RTM_NEWROUTE: u16 = 24;
        const RTM_GETROUTE: u16 = 26;
        let family = if v6 { "IPv6" } else { "IPv4" };
        let socket = super::nfnetlink::Socket::open_route(REQUEST_DEADLINE)?;
        // nlmsghdr, then rtmsg: only its family set (every table, type).
        let mut request = Vec::with_capacity(28);
        request.extend(28u32.to_ne_bytes());
        request.extend(RTM_GETROUTE.to_ne_bytes());
        request
            .extend((super::nfnetlink::NLM_F_REQUEST | super::nfnetlink::NLM_F_DUMP).to_ne_bytes());
        request.extend(1u32.to_ne_bytes());
        request.extend(0u32.to_ne_bytes());
        request.push(if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8);
        request.extend([0u8; 11]);
        socket
            .send(&request)
            .with_context(|| format!("asking for the {family} routes"))?;
        let mut malformed = 0usize;
        socket
            .dump_each(|ty, m| {
                if ty != RTM_NEWROUTE {
                    return;
                }
                match m.get(16..).and_then(|body| RouteMessage::parse(body).ok()) {
                    Some(route) => f(&route),
                    None => malformed += 1,
                }
            })
            .with_context(|| format!("listing {family} routes"))?;
        if malformed > 0 {
            tracing::warn!(
                malformed,
                family,
                "route messages that did not parse were skipped"
            );
        }
        Ok(())
    }
}

fn parse_link(msg: &LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        mac: [0; 6],
        up: msg.header.flags.contains(LinkFlags::Up),
        arp: !msg.header.flags.contains(LinkFlags::Noarp),
        kind: None,
        xdp: None,
        peer_netns: None,
        netkit_primary: false,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::LinkNetNsId(id) => link.peer_netns = Some(*id),
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::Address(a) if a.len() == 6 => link.mac.copy_from_slice(a),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => {
                            link.kind = Some(match k {
                                InfoKind::Other(s) => s.clone(),
                                k => k.to_string(),
                            });
                        }
                        LinkInfo::Data(InfoData::Netkit(nk)) => {
                            link.netkit_primary = nk.contains(&InfoNetkit::Primary(true));
                        }
                        _ => {}
                    }
                }
            }
            LinkAttribute::Xdp(xdp) => {
                let mut mode = None;
                let mut prog = None;
                for x in xdp {
                    match x {
                        LinkXdp::Attached(Attached::Driver) => mode = Some(XdpMode::Native),
                        LinkXdp::Attached(Attached::SocketBuffer) => mode = Some(XdpMode::Generic),
                        LinkXdp::ProgId(id) => prog = Some(*id),
                        _ => {}
                    }
                }
                if let Some(program) = prog.filter(|p| *p != 0) {
                    link.xdp = Some(XdpAttached { program, mode });
                }
            }
            _ => {}
        }
    }
    link
}

/// The route's destination, for the families Weft routes.
fn route_dst(m: &RouteMessage) -> Option<IpAddr> {
    let unspecified: IpAddr = match m.header.address_family {
        AddressFamily::Inet => Ipv4Addr::UNSPECIFIED.into(),
        AddressFamily::Inet6 => Ipv6Addr::UNSPECIFIED.into(),
        _ => return None,
    };
    Some(
        m.attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
                RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
                _ => None,
            })
            .unwrap_or(unspecified),
    )
}

fn parse_route(m: &RouteMessage) -> Option<Route> {
    let dst = route_dst(m)?;
    let mut gateway = None;
    let mut oif = None;
    let mut mtu = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Metrics(ms) => {
                mtu = ms.iter().find_map(|x| match x {
                    RouteMetric::Mtu(v) => Some(*v),
                    _ => None,
                });
            }
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gateway = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some(Route {
        dst,
        prefix_len: m.header.destination_prefix_length,
        gateway,
        oif: oif?,
        onlink: m
            .header
            .flags
            .contains(rtnetlink::packet_route::route::RouteFlags::Onlink),
        mtu,
    })
}
