//! rtnetlink: the host state the dataplane relies on (devices, addresses,
//! routes), and what is attached where.
//!
//! Every call works in the network namespace of the thread that created the
//! [`Netlink`] handle.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result, anyhow, bail};
use futures::TryStreamExt as _;
use rtnetlink::{
    Handle, LinkUnspec, LinkVeth, RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        address::{AddressAttribute, AddressMessage},
        link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, LinkXdp, XdpAttached},
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope},
    },
};

/// Routes Weft installs carry this protocol number (`ip route ... proto 44`),
/// so they can be told apart from everyone else's and removed on teardown.
pub const ROUTE_PROTOCOL: u8 = 44;

/// What the dataplane needs to know about one network device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: [u8; 6],
    pub up: bool,
    /// ARP enabled (IFF_NOARP clear).
    pub arp: bool,
    /// "dummy", "veth", "vxlan", ... (None for physical devices).
    pub kind: Option<String>,
    /// The XDP program attached, and in which mode.
    pub xdp: Option<(u32, XdpModeState)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpModeState {
    Native,
    Generic,
    Offload,
    Multiple,
}

impl XdpModeState {
    pub fn as_str(self) -> &'static str {
        match self {
            XdpModeState::Native => "native",
            XdpModeState::Generic => "generic",
            XdpModeState::Offload => "offload",
            XdpModeState::Multiple => "multiple",
        }
    }
}

/// An IPv4 route Weft manages.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    pub dst: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    pub oif: u32,
    pub onlink: bool,
}

pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens a netlink socket in the current thread's network namespace. Must
    /// be called inside a tokio runtime.
    pub fn new() -> Result<Self> {
        let (conn, handle, _) =
            rtnetlink::new_connection().context("opening an rtnetlink socket")?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Runs `f` with a fresh handle on a private current-thread runtime, for
    /// callers outside async code (CLI commands, tests).
    pub fn blocking<T>(f: impl AsyncFnOnce(&Netlink) -> Result<T>) -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a tokio runtime for netlink")?;
        rt.block_on(async {
            let nl = Netlink::new()?;
            f(&nl).await
        })
    }

    pub async fn link(&self, name: &str) -> Result<Option<Link>> {
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

    pub async fn require_link(&self, name: &str) -> Result<Link> {
        self.link(name)
            .await?
            .ok_or_else(|| anyhow!("no network interface named {name:?} in this network namespace"))
    }

    pub async fn links(&self) -> Result<Vec<Link>> {
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
    /// `mtu`, both ends up. Returns the device's index.
    ///
    /// A veth pair rather than a dummy device because every kernel with
    /// network namespaces has veth, while dummy is optional (and missing on
    /// some minimal kernels). The TC egress program redirects every IPv4
    /// packet before the veth transmits it.
    pub async fn ensure_overlay_device(
        &self,
        name: &str,
        peer: &str,
        mac: [u8; 6],
        mtu: u32,
    ) -> Result<u32> {
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
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, Some(mac), mtu).await?;
        if let Some(p) = self.link(peer).await? {
            self.converge_noarp(&p, None, mtu).await?;
        }
        Ok(link.index)
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

    pub async fn delete_link(&self, name: &str) -> Result<bool> {
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

    /// The IPv4 addresses on device `index`, with their prefix lengths.
    pub async fn addresses(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
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
            .filter(|m| m.header.family == AddressFamily::Inet)
            .filter_map(|m| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(std::net::IpAddr::V4(ip)) => {
                        Some((*ip, m.header.prefix_len))
                    }
                    _ => None,
                })
            })
            .collect())
    }

    /// Makes `addr/prefix_len` the only IPv4 address on device `index`.
    pub async fn ensure_only_address(
        &self,
        index: u32,
        addr: Ipv4Addr,
        prefix_len: u8,
    ) -> Result<()> {
        let current = self.addresses(index).await?;
        if !current.contains(&(addr, prefix_len)) {
            self.handle
                .address()
                .add(index, addr.into(), prefix_len)
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

    async fn del_address(&self, index: u32, addr: Ipv4Addr, prefix_len: u8) -> Result<()> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(addr.into())
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

    /// Adds or replaces a route (protocol [`ROUTE_PROTOCOL`]).
    pub async fn replace_route(&self, route: &Route, src: Option<Ipv4Addr>) -> Result<()> {
        let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(route.dst, route.prefix_len)
            .output_interface(route.oif)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
        if let Some(gw) = route.gateway {
            b = b.gateway(gw);
        } else {
            b = b.scope(RouteScope::Link);
        }
        if route.onlink {
            b = b.onlink();
        }
        if let Some(src) = src {
            b = b.pref_source(src);
        }
        self.handle
            .route()
            .add(b.build())
            .replace()
            .execute()
            .await
            .with_context(|| format!("installing the route to {}/{}", route.dst, route.prefix_len))
    }

    /// Deletes a route (a route that is already gone is not an error).
    pub async fn del_route(&self, route: &Route) -> Result<()> {
        let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(route.dst, route.prefix_len)
            .output_interface(route.oif)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
        if let Some(gw) = route.gateway {
            b = b.gateway(gw);
        }
        match self.handle.route().del(b.build()).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            Err(e) => Err(e).with_context(|| {
                format!("removing the route to {}/{}", route.dst, route.prefix_len)
            }),
        }
    }

    /// The device of the IPv4 default route, if any.
    pub async fn default_route_oif(&self) -> Result<Option<u32>> {
        Ok(self
            .route_messages()
            .await?
            .iter()
            .filter(|m| m.header.destination_prefix_length == 0 && m.header.table == 254)
            .find_map(parse_route)
            .map(|r| r.oif))
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut stream = self.handle.link().get().match_index(index).execute();
        match stream.try_next().await {
            Ok(m) => Ok(m.as_ref().map(parse_link)),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {index}")),
        }
    }

    /// The device that carries `ip`, if any.
    pub async fn link_with_address(&self, ip: Ipv4Addr) -> Result<Option<Link>> {
        for l in self.links().await? {
            if self.addresses(l.index).await?.iter().any(|(a, _)| *a == ip) {
                return Ok(Some(l));
            }
        }
        Ok(None)
    }

    /// The IPv4 routes Weft installed (by protocol), in the main table.
    pub async fn weft_routes(&self) -> Result<Vec<Route>> {
        Ok(self
            .route_messages()
            .await?
            .iter()
            .filter(|m| m.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL))
            .filter_map(parse_route)
            .collect())
    }

    async fn route_messages(&self) -> Result<Vec<RouteMessage>> {
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        self.handle
            .route()
            .get(req)
            .execute()
            .try_collect()
            .await
            .context("listing routes")
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
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::Address(a) if a.len() == 6 => link.mac.copy_from_slice(a),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        link.kind = Some(match k {
                            InfoKind::Other(s) => s.clone(),
                            k => k.to_string(),
                        });
                    }
                }
            }
            LinkAttribute::Xdp(xdp) => {
                let mut mode = None;
                let mut prog = None;
                for x in xdp {
                    match x {
                        LinkXdp::Attached(XdpAttached::Driver) => mode = Some(XdpModeState::Native),
                        LinkXdp::Attached(XdpAttached::SocketBuffer) => {
                            mode = Some(XdpModeState::Generic)
                        }
                        LinkXdp::Attached(XdpAttached::Hardware) => {
                            mode = Some(XdpModeState::Offload)
                        }
                        LinkXdp::Attached(XdpAttached::Multiple) => {
                            mode = Some(XdpModeState::Multiple)
                        }
                        LinkXdp::ProgId(id) => prog = Some(*id),
                        _ => {}
                    }
                }
                if let (Some(m), Some(p)) = (mode, prog) {
                    link.xdp = Some((p, m));
                }
            }
            _ => {}
        }
    }
    link
}

fn parse_route(m: &RouteMessage) -> Option<Route> {
    if m.header.address_family != AddressFamily::Inet {
        return None;
    }
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(*ip),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(*ip),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some(Route {
        dst: dst.unwrap_or(Ipv4Addr::UNSPECIFIED),
        prefix_len: m.header.destination_prefix_length,
        gateway,
        oif: oif?,
        onlink: m
            .header
            .flags
            .contains(rtnetlink::packet_route::route::RouteFlags::Onlink),
    })
}
