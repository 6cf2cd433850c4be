//! The peer table: what the peer maps hold, the routes that send remote
//! subnets into the overlay, and the peers that could not be programmed
//! (retried with backoff). Both families in one table: a peer's family
//! picks its map and its device, nothing else differs.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    time::Duration,
};

use anyhow::Result;
use ipnet::IpNet;
use tokio::time::Instant;

use super::devices::Devices;
use crate::dataplane::maps;
use crate::dataplane::maps::PeerMaps;
use crate::dataplane::types::Family;
use crate::dataplane::types::Peer;
use crate::dataplane::types::PeerUpdate;
use crate::sys::netlink::Netlink;
use crate::sys::netlink::Route;
use crate::{backoff::Backoff, lease::Subnets};

/// Retries of a peer that could not be programmed: 1 s, 2 s, ... 30 s.
const PROBLEM_RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// What keeps a peer from being fully programmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProblemKind {
    /// The peer map is full (`--max-peers`): the peer is not in it.
    MapFull,
    /// The map entry failed for another reason.
    Map,
    /// The peer is in the map but its route is not installed.
    Route,
}

impl ProblemKind {
    pub(crate) const ALL: [ProblemKind; 3] =
        [ProblemKind::MapFull, ProblemKind::Map, ProblemKind::Route];

    pub(crate) fn name(self) -> &'static str {
        match self {
            ProblemKind::MapFull => "map_full",
            ProblemKind::Map => "map",
            ProblemKind::Route => "route",
        }
    }
}

/// A peer that could not be programmed fully, retried with backoff.
#[derive(Clone, Debug)]
pub struct Problem {
    pub peer: Peer,
    pub kind: ProblemKind,
    pub error: String,
    attempts: u32,
    retry_at: Instant,
}

/// What routing a peer depends on: the devices, our own subnets (each
/// family's network address is its routes' source) and DirectRouting.
pub(super) struct Routing<'a> {
    pub(super) nl: &'a Netlink,
    pub(super) devices: &'a Devices,
    pub(super) subnets: Subnets,
    pub(super) direct_routing: bool,
}

impl Routing<'_> {
    /// Whether `p` is reached without encapsulation: DirectRouting is on
    /// and its (IPv4) VTEP is on one of the uplink's subnets (as flannel
    /// decides).
    fn is_direct(&self, p: &Peer) -> bool {
        let IpAddr::V4(vtep) = p.vtep else {
            return false;
        };
        self.direct_routing && self.devices.uplink_nets.iter().any(|n| n.contains(&vtep))
    }

    /// Whether `subnet` overlaps this node's own subnet of its family
    /// (the lease view refuses such a peer first; this guards the map).
    fn overlaps_own(&self, subnet: &IpNet) -> bool {
        self.subnets.overlaps_net(subnet)
    }
}

/// The peer table of one node.
pub(crate) struct PeerTable {
    pub(super) maps: PeerMaps,
    /// What the peer maps hold (mirror), both families.
    peers: HashMap<IpNet, Peer>,
    /// Peers not (fully) programmed, by subnet.
    problems: BTreeMap<IpNet, Problem>,
    /// Peers reached without encapsulation (DirectRouting), by subnet.
    direct: HashSet<IpNet>,
    /// Per-peer path MTU is on, and the paths measured (IPv4 VTEP ->
    /// largest outer packet).
    path_mtu: bool,
    paths: HashMap<std::net::Ipv4Addr, u32>,
}

impl PeerTable {
    /// The table as the (possibly adopted) maps hold it.
    pub(super) fn adopt(mut maps: PeerMaps) -> Result<Self> {
        let peers = maps.peers()?;
        let direct = maps.direct_subnets()?;
        maps.rebuild_vteps(&peers)?;
        Ok(Self {
            maps,
            peers,
            problems: BTreeMap::new(),
            direct,
            path_mtu: false,
            paths: HashMap::new(),
        })
    }

    pub(super) fn peers(&self) -> &HashMap<IpNet, Peer> {
        &self.peers
    }

    /// Per-peer path MTU on or off, with the paths measured so far.
    pub(super) fn set_path_mtu(&mut self, on: bool, paths: HashMap<std::net::Ipv4Addr, u32>) {
        self.path_mtu = on;
        self.paths = paths;
    }

    /// `vtep`'s path MTU is now `mtu` (None: not measured); returns the
    /// peers whose route changes with it.
    pub(super) fn set_path(&mut self, vtep: std::net::Ipv4Addr, mtu: Option<u32>) -> Vec<Peer> {
        match mtu {
            Some(m) => self.paths.insert(vtep, m),
            None => self.paths.remove(&vtep),
        };
        self.peers
            .values()
            .filter(|p| p.vtep == IpAddr::V4(vtep))
            .copied()
            .collect()
    }

    /// The MTU of the route to `p`: its path's (measured, or the base
    /// size where not) less VXLAN's overhead, where that is below the
    /// overlay device's; None where the device's applies (IPv6 subnets,
    /// whose outer headers the kernel's vxlan device writes and sizes).
    fn route_mtu(&self, r: &Routing<'_>, p: &Peer) -> Option<u32> {
        let (IpNet::V4(_), IpAddr::V4(vtep)) = (p.subnet, p.vtep) else {
            return None;
        };
        if !self.path_mtu {
            return None;
        }
        let uplink = r.devices.uplink.mtu;
        let path = self
            .paths
            .get(&vtep)
            .copied()
            .unwrap_or(uplink.min(dataplane_common::DEFAULT_PATH_MTU))
            .min(uplink);
        let device = Family::V4.overlay_mtu(uplink);
        let mtu = path.saturating_sub(dataplane_common::VXLAN_OVERHEAD);
        (mtu < device).then_some(mtu)
    }

    pub(super) fn direct(&self) -> &HashSet<IpNet> {
        &self.direct
    }

    pub(super) fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.problems.values()
    }

    /// The route to `p`'s subnet: through its family's overlay device, or
    /// (direct) through the uplink to the peer's public IP, as flannel
    /// installs it. None when that device does not exist.
    fn route_for(&self, r: &Routing<'_>, p: &Peer) -> Option<Route> {
        if self.direct.contains(&p.subnet) {
            return Some(Route {
                dst: p.subnet.network(),
                prefix_len: p.subnet.prefix_len(),
                gateway: Some(p.vtep),
                oif: r.devices.uplink.index,
                onlink: false,
                mtu: None,
            });
        }
        let oif = r.devices.index(Family::of(p.subnet.addr()))?;
        Some(device_route(p, oif, self.route_mtu(r, p)))
    }

    /// Applies many updates at once: map entries one by one, in order, and
    /// the routes of new peers concurrently (the slow part when thousands
    /// of leases arrive together). A peer that cannot be programmed (map
    /// full, a route in the way) is recorded as a problem and retried; it
    /// never stops the others.
    pub(super) async fn apply(&mut self, r: &Routing<'_>, updates: &[PeerUpdate]) -> Result<()> {
        let mut new_routes: HashMap<IpNet, Peer> = HashMap::new();
        let mut freed = false;
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    if r.overlaps_own(&p.subnet) {
                        tracing::error!(subnet = %p.subnet, vtep = %p.vtep, "refusing a peer that overlaps this node's own subnet");
                        continue;
                    }
                    let route_missing = self
                        .problems
                        .remove(&p.subnet)
                        .is_some_and(|pr| pr.kind == ProblemKind::Route);
                    match self.program(r, p) {
                        Some(fresh) if fresh || route_missing => {
                            new_routes.insert(p.subnet, *p);
                        }
                        _ => {}
                    }
                }
                PeerUpdate::Remove(s) => {
                    new_routes.remove(s);
                    self.problems.remove(s);
                    freed |= self.remove(r, *s).await;
                }
            }
        }
        // Peers already routed keep their route; the new ones get one.
        let peers: Vec<Peer> = new_routes.into_values().collect();
        self.install_routes(r, &peers).await?;
        if freed {
            // Room in the map: peers that did not fit are tried again now.
            self.retry_now(|pr| pr.kind == ProblemKind::MapFull);
        }
        Ok(())
    }

    /// Makes the problems `which` selects due now.
    pub(super) fn retry_now(&mut self, which: impl Fn(&Problem) -> bool) {
        let now = Instant::now();
        for pr in self.problems.values_mut() {
            if which(pr) {
                pr.retry_at = now;
            }
        }
    }

    /// Writes `p` into the peer map: `Some(true)` for a peer new to the
    /// map (it needs its route), `Some(false)` for one replaced in place,
    /// `None` (and a recorded problem) if it could not be written.
    fn program(&mut self, r: &Routing<'_>, p: &Peer) -> Option<bool> {
        let old = self.peers.get(&p.subnet).copied();
        let direct = r.is_direct(p);
        let was_direct = self.direct.contains(&p.subnet);
        if old == Some(*p) && direct == was_direct {
            return Some(false);
        }
        match self.maps.upsert(p, old.as_ref(), direct) {
            Ok(()) => {
                self.peers.insert(p.subnet, *p);
                if direct {
                    self.direct.insert(p.subnet);
                } else {
                    self.direct.remove(&p.subnet);
                }
                // A direct route names the VTEP: it changes with it.
                let vtep_moved = old.is_some_and(|o| o.vtep != p.vtep);
                Some(old.is_none() || direct != was_direct || direct && vtep_moved)
            }
            Err(e) => {
                let kind = if maps::is_full(&e) {
                    ProblemKind::MapFull
                } else {
                    ProblemKind::Map
                };
                self.record(*p, kind, format!("{e:#}"));
                None
            }
        }
    }

    fn record(&mut self, peer: Peer, kind: ProblemKind, error: String) {
        let attempts = self
            .problems
            .get(&peer.subnet)
            .filter(|pr| pr.kind == kind)
            .map_or(0, |pr| pr.attempts + 1);
        let wait = PROBLEM_RETRY.delay(attempts);
        if attempts == 0 {
            let hint = match kind {
                ProblemKind::MapFull => "; raise --max-peers",
                _ => "",
            };
            tracing::error!(subnet = %peer.subnet, vtep = %peer.vtep, problem = kind.name(), retry_in = ?wait, "peer not programmed: {error}{hint}");
        } else {
            tracing::debug!(subnet = %peer.subnet, problem = kind.name(), attempts, retry_in = ?wait, "peer still not programmed: {error}");
        }
        self.problems.insert(
            peer.subnet,
            Problem {
                peer,
                kind,
                error,
                attempts,
                retry_at: Instant::now() + wait,
            },
        );
    }

    /// Installs the routes of `peers` (each family with its device's
    /// address as source); failures become problems.
    pub(super) async fn install_routes(&mut self, r: &Routing<'_>, peers: &[Peer]) -> Result<()> {
        for family in Family::ALL {
            let src = family.subnet(&r.subnets).map(|s| s.network());
            let mut routes = Vec::new();
            let mut routed = Vec::new();
            for p in peers
                .iter()
                .filter(|p| Family::of(p.subnet.addr()) == family)
            {
                match self.route_for(r, p) {
                    Some(route) => {
                        routes.push(route);
                        routed.push(*p);
                    }
                    None => self.record(
                        *p,
                        ProblemKind::Route,
                        "its family's overlay device does not exist yet".into(),
                    ),
                }
            }
            if routes.is_empty() {
                continue;
            }
            let results =
                r.nl.install_routes(&routes, src, r.devices.flannel_index)
                    .await?;
            for (p, res) in routed.iter().zip(results) {
                match res {
                    Ok(()) => {
                        if self.problems.remove(&p.subnet).is_some() {
                            tracing::info!(subnet = %p.subnet, "peer programmed after all");
                        }
                    }
                    Err(e) => self.record(*p, ProblemKind::Route, e.to_string()),
                }
            }
        }
        Ok(())
    }

    /// Installs every peer's route again (our address, their source, moved).
    pub(super) async fn reroute(&mut self, r: &Routing<'_>) -> Result<()> {
        let peers: Vec<Peer> = self.peers.values().copied().collect();
        self.install_routes(r, &peers).await
    }

    /// Tries again the peers whose retry time has come.
    pub(super) async fn retry(&mut self, r: &Routing<'_>) -> Result<()> {
        let now = Instant::now();
        let due: Vec<Problem> = self
            .problems
            .values()
            .filter(|pr| pr.retry_at <= now)
            .cloned()
            .collect();
        let mut routes = Vec::new();
        for pr in due {
            match pr.kind {
                ProblemKind::Route => routes.push(pr.peer),
                ProblemKind::MapFull | ProblemKind::Map => {
                    if self.program(r, &pr.peer).is_some() {
                        routes.push(pr.peer);
                    }
                }
            }
        }
        self.install_routes(r, &routes).await
    }

    /// Removes the peer of `subnet`; returns whether the map had it. A
    /// route or map entry that cannot be removed is logged, not fatal: a
    /// route of ours to no peer is removed by the next heal, and a map
    /// entry of a peer that is gone is only ever a stale destination.
    pub(super) async fn remove(&mut self, r: &Routing<'_>, subnet: IpNet) -> bool {
        let Some(old) = self.peers.remove(&subnet) else {
            return false;
        };
        // Route first, so the kernel stops sending into the overlay, then
        // the map entry. Only our own route (protocol 44) is ever deleted.
        if let Some(route) = self.route_for(r, &old)
            && let Err(e) = r.nl.del_route(&route).await
        {
            tracing::warn!(%subnet, error = %format!("{e:#}"), "cannot remove a peer's route; the next check removes it");
        }
        self.direct.remove(&subnet);
        if let Err(e) = self.maps.remove(&old) {
            tracing::warn!(%subnet, error = %format!("{e:#}"), "cannot remove a peer from the map");
        }
        true
    }

    /// Removes every peer not in `keep` (after adopting a pinned map, for
    /// leases that vanished while the agent was away).
    pub(super) async fn retain(&mut self, r: &Routing<'_>, keep: &HashSet<IpNet>) -> usize {
        let gone: HashSet<IpNet> = self
            .peers
            .keys()
            .chain(self.problems.keys())
            .filter(|s| !keep.contains(s))
            .copied()
            .collect();
        for s in &gone {
            self.problems.remove(s);
            self.remove(r, *s).await;
        }
        gone.len()
    }

    /// Puts back the routes of programmed peers that are missing (those
    /// with a route problem are retried on their own schedule) and removes
    /// Weft's routes to no peer; returns whether any were missing.
    pub(super) async fn heal_routes(&mut self, r: &Routing<'_>) -> Result<bool> {
        // Tens of thousands of peers are checked every few seconds: each
        // route is compared with its peer's as the dump is read, and only
        // the subnets whose route is right are kept (a set of the routes
        // themselves, built from a list of them, held 6-9 MB at 50,000
        // peers for a moment each time).
        let mut right: HashSet<IpNet> = HashSet::with_capacity(self.peers.len());
        let mut stray: Vec<Route> = Vec::new();
        r.nl.each_weft_route(|route| match route.net().and_then(|n| self.peers.get(&n)) {
            Some(p) => {
                if self.route_for(r, p).is_some_and(|want| want == route) {
                    right.insert(p.subnet);
                }
            }
            None => stray.push(route),
        })
        .await?;
        let missing: Vec<Peer> = self
            .peers
            .values()
            .filter(|p| {
                !self.problems.contains_key(&p.subnet)
                    && !right.contains(&p.subnet)
                    && self.route_for(r, p).is_some()
            })
            .copied()
            .collect();
        drop(right);
        for route in &stray {
            tracing::info!(dst = %route.dst, prefix_len = route.prefix_len, "removing a route of Weft's to no peer");
            r.nl.del_route(route).await?;
        }
        if missing.is_empty() {
            return Ok(false);
        }
        tracing::debug!(routes = missing.len(), "reinstalling missing routes");
        self.install_routes(r, &missing).await?;
        Ok(true)
    }

    /// Makes the kernel's Weft routes match the table (at setup).
    pub(super) async fn reconcile_routes(&mut self, r: &Routing<'_>) -> Result<()> {
        // Routes to no peer go; a peer's route in another form (an older
        // version's, a peer that became direct) is replaced in place below,
        // never deleted first, so its traffic does not stop.
        for route in r.nl.weft_routes().await? {
            if !route.net().is_some_and(|s| self.peers.contains_key(&s)) {
                r.nl.del_route(&route).await?;
            }
        }
        self.reroute(r).await
    }
}

/// A peer's route through its overlay device: `<subnet> dev weft.1 scope
/// link` (IPv6: `dev weft-v6.1`), without flannel's `via <subnet>.0
/// onlink`. The encapsulation finds the peer from the packet's
/// destination, so no gateway is needed, and the kernel shares one nexthop
/// among all such routes; with a gateway each route gets a nexthop of its
/// own, and the kernel's nexthop table hashes them all into one chain (the
/// gateway is not in its hash): adding 20,000 such routes took 5.7 s
/// against 0.24 s without gateways, and quadratically more beyond.
fn device_route(p: &Peer, device_index: u32, mtu: Option<u32>) -> Route {
    Route {
        dst: p.subnet.network(),
        prefix_len: p.subnet.prefix_len(),
        gateway: None,
        oif: device_index,
        onlink: false,
        mtu,
    }
}
