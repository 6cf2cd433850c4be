//! Routes: Weft's own (protocol 44), installed without taking anyone
//! else's, listed, and removed. Log lines keep the module's target
//! (`weft::dataplane::netlink`).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result};
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        route::{
            RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
        },
    },
};

use crate::sys::netlink::{LIST_DEADLINE, Netlink, REQUEST_DEADLINE, ROUTE_PROTOCOL};
use crate::sys::nfnetlink;

/// Somebody else's route: what it is, and its (device, gateway).
type Foreign = (String, Option<(u32, Option<IpAddr>)>);

fn failed(route: &Route, e: rtnetlink::Error) -> anyhow::Error {
    anyhow::Error::new(e).context(format!(
        "installing the route to {}/{}",
        route.dst, route.prefix_len
    ))
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

impl Netlink {
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
        tracing::debug!(target: "weft::dataplane::netlink", clashes, "routes exist already: looking at who owns them");
        let foreign = match tokio::time::timeout(LIST_DEADLINE, self.foreign_routes(adopt)).await {
            Ok(f) => f?,
            Err(_) => {
                // Those routes stay problems and are tried again later.
                tracing::warn!(target: "weft::dataplane::netlink", clashes, "listing the routes took over {LIST_DEADLINE:?}");
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
                tracing::warn!(target: "weft::dataplane::netlink", dst = %route.dst, prefix_len = route.prefix_len, "no answer from netlink within {REQUEST_DEADLINE:?}");
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
        super::events::removing(route.dst, route.prefix_len);
        let r = self.handle.route().del(msg).execute().await;
        if r.is_err() {
            super::events::not_removed(route.dst, route.prefix_len);
        }
        match r {
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
        let socket = nfnetlink::Socket::open_route(REQUEST_DEADLINE)?;
        // nlmsghdr, then rtmsg: only its family set (every table, type).
        let mut request = Vec::with_capacity(28);
        request.extend(28u32.to_ne_bytes());
        request.extend(RTM_GETROUTE.to_ne_bytes());
        request.extend((nfnetlink::NLM_F_REQUEST | nfnetlink::NLM_F_DUMP).to_ne_bytes());
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
            tracing::warn!(target: "weft::dataplane::netlink",
                malformed,
                family,
                "route messages that did not parse were skipped"
            );
        }
        Ok(())
    }
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
