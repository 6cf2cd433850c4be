//! The node's overlay: the programs attached, the overlay device, routes to
//! remote subnets, the peer table, and the sysctls they need. One API for the
//! lease watch to drive (`upsert`, `remove`), idempotent setup that adopts
//! what an earlier run left in place, and `teardown`.
//!
//! Layout on a node (VNI 1, subnet 10.244.3.0/24, uplink eth0):
//!
//! ```text
//!  pod ─ veth ─ cni0 (10.244.3.1/24) ─ routing ─ weft.1 (10.244.3.0/32, MTU eth0-50)
//!                                                   │ TC egress: weft_encap
//!                                                   └─► redirect_neigh ─► eth0 ─► wire
//!  wire ─► eth0 XDP: weft_decap (strip 50 bytes, XDP_PASS) ─► routing ─► cni0 ─► pod
//! ```
//!
//! Routes `10.244.7.0/24 dev weft.1 src 10.244.3.0 proto 44` send
//! remote-subnet traffic (pods' and the node's own) into weft.1, whose MTU
//! makes the kernel answer oversized packets with ICMP "fragmentation
//! needed" before the program sees them.
//!
//! With IPv6 (dual-stack or IPv6-only), `weft-v6.<VNI>` is the IPv6
//! overlay device: the kernel's vxlan driver in collect-metadata mode, with
//! `weft_encap6` at its TC egress (see `encap6.rs` in the eBPF crate) and
//! routes `fd00:10:244:7::/64 dev weft-v6.1 proto 44`. Decapsulation of
//! both families runs in the uplink's programs.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use dataplane_common::{
    CONFIG_F_BYPASS, CONFIG_F_CT_GATE, CONFIG_F_IPV4, CONFIG_F_IPV6, CONFIG_F_READY,
    DataplaneConfig, VXLAN_OVERHEAD, VXLAN6_OVERHEAD, map_names, program_names,
};
use ipnet::{IpNet, Ipv4Net};
use tokio::time::Instant;

use super::{
    DataplaneSpec, HostRouting, OwnSubnets, Peer, PeerUpdate, XdpMode,
    bpffs::PinDir,
    conntrack,
    endpoints::{EndpointSpec, EndpointSync, Endpoints, Scope},
    host,
    loader::{self, Attachment, Hook, LoadOptions, Loaded, Replaced},
    maps::{Counters, EndpointMap, PeerMaps},
    netfilter::{self, NetfilterSpec},
    netlink::{Link, Netlink, Route},
    sysctl, trace,
};
use crate::backoff::Backoff;

/// The overlay device's name for a VNI (flannel: `flannel.<VNI>`).
pub fn device_name(vni: u32) -> String {
    format!("weft.{vni}")
}

/// The IPv6 overlay device's name for a VNI (flannel: `flannel-v6.<VNI>`).
pub fn device6_name(vni: u32) -> String {
    format!("weft-v6.{vni}")
}

/// The other end of the overlay device's veth pair.
fn device_peer_name(vni: u32) -> String {
    format!("weft.{vni}.p")
}

/// flannel's device for a VNI: routes through it are taken over when a node
/// moves from flannel to Weft.
fn flannel_device_name(vni: u32) -> String {
    format!("flannel.{vni}")
}

/// Retries of a peer that could not be programmed: 1 s, 2 s, ... 30 s.
const PROBLEM_RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// What keeps a peer from being fully programmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ProblemKind {
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
pub(crate) struct Problem {
    pub(crate) peer: Peer,
    pub(crate) kind: ProblemKind,
    pub(crate) error: String,
    attempts: u32,
    retry_at: Instant,
}

/// The eBPF datapath on one node.
pub struct Overlay {
    spec: DataplaneSpec,
    subnets: OwnSubnets,
    nl: Netlink,
    maps: PeerMaps,
    counters: Arc<Counters>,
    /// What the peer maps hold (mirror), both families.
    peers: HashMap<IpNet, Peer>,
    /// Peers not (fully) programmed, by subnet.
    problems: BTreeMap<IpNet, Problem>,
    /// The IPv4 overlay device (`weft.<VNI>`), on a node with IPv4.
    device_index: Option<u32>,
    /// The IPv6 overlay device (`weft-v6.<VNI>`), once it exists.
    device6_index: Option<u32>,
    /// flannel's device for our VNI, if the node has one.
    flannel_index: Option<u32>,
    uplink: Link,
    attachments: Vec<Attachment>,
    /// Where decapsulation runs, and why.
    decap: DecapChoice,
    /// The loaded programs, for the pods' veths as they come.
    loaded: Loaded,
    endpoint_map: EndpointMap,
    endpoints: Endpoints,
    /// Forwards the programs' drop trace to the log (`--trace-drops`).
    _trace: Option<trace::DropTrace>,
    /// Peers reached without encapsulation (DirectRouting), by subnet.
    direct: HashSet<IpNet>,
    /// The subnets the uplink's addresses are on: a peer whose VTEP is on
    /// one of them is on our L2 segment.
    uplink_nets: Vec<Ipv4Net>,
    /// The IPv4 overlay device's MTU.
    mtu: u32,
    /// The IPv6 overlay device's MTU.
    mtu6: u32,
    /// Makes fast-path TCP flows liberal in conntrack when the programs ask
    /// (`--host-routing auto`); stopped with the overlay.
    _marker: Option<conntrack::Marker>,
    liberal: Arc<conntrack::LiberalStats>,
}

/// What one pass of [`Overlay::heal`] did.
#[derive(Debug, Default)]
pub struct Healed {
    /// What was found missing and put back (`device`, `address`,
    /// `programs`, `routes`, `sysctls`, `nftables`, `forward_rules`).
    pub repairs: Vec<&'static str>,
    /// The overlay MTU changed (it follows the uplink's).
    pub mtu_changed: bool,
}

/// Where decapsulation runs on the uplink, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecapChoice {
    /// `xdp-native`, `xdp-generic` or `tc`.
    pub hook: &'static str,
    pub why: String,
}

impl Overlay {
    /// Sets up (or converges) everything around our `subnet`; adopts pinned
    /// programs and maps from an earlier run without detaching them.
    ///
    /// A failure leaves the node as it was: a node that had no Weft
    /// dataplane has nothing left behind; one that had a running dataplane
    /// keeps it (still forwarding with the programs it had).
    pub async fn setup(spec: &DataplaneSpec, subnets: OwnSubnets) -> Result<Self> {
        let fresh = !spec.pins.has_links();
        match Self::setup_inner(spec.clone(), subnets).await {
            Ok(o) => Ok(o),
            Err(e) if fresh => {
                tracing::error!(error = %format!("{e:#}"), "dataplane setup failed; removing what it created");
                match teardown(&spec.pins, spec.vni, &spec.state_dir).await {
                    Ok(removed) => {
                        for r in removed {
                            tracing::info!("rolled back: removed {r}");
                        }
                    }
                    Err(te) => {
                        tracing::error!(error = %format!("{te:#}"), "rolling back the failed setup")
                    }
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    async fn setup_inner(spec: DataplaneSpec, subnets: OwnSubnets) -> Result<Self> {
        let nl = Netlink::new()?;
        let uplink = nl.require_link(&spec.uplink).await?;
        let overhead = if subnets.v6.is_some() {
            VXLAN6_OVERHEAD
        } else {
            VXLAN_OVERHEAD
        };
        if uplink.mtu <= overhead + 68 {
            bail!(
                "uplink {} has MTU {}: too small for VXLAN",
                uplink.name,
                uplink.mtu
            );
        }
        let dev = device_name(spec.vni);
        let mtu = overlay_mtu(&spec, uplink.mtu);
        let mtu6 = overlay_mtu6(&spec, uplink.mtu);
        if let Some(m) = spec.underlay_mtu
            && m > uplink.mtu
        {
            tracing::warn!(
                backend_mtu = m,
                uplink_mtu = uplink.mtu,
                "Backend.MTU is larger than the uplink's MTU: packets that fill the overlay MTU cannot leave"
            );
        }

        // The IPv4 overlay device, whose egress TC program does the work.
        let device_index = match subnets.v4 {
            Some(subnet) if spec.public_ip.is_some() => {
                let peer = device_peer_name(spec.vni);
                let (index, created) = nl
                    .ensure_overlay_device(&dev, &peer, spec.vtep_mac.0, mtu)
                    .await?;
                if created {
                    tracing::info!(device = %dev, mtu, "created the overlay device");
                }
                // IPv4 only: no IPv6 link-local chatter into the
                // encapsulation path.
                for d in [&dev, &peer] {
                    let _ = sysctl::write_iface("ipv6", d, "disable_ipv6", "1");
                }
                nl.ensure_only_address(index, subnet.network(), 32).await?;
                Some(index)
            }
            _ => None,
        };
        // The IPv6 overlay device. Another vxlan device on the port (flannel's,
        // on a node moving from flannel) keeps it from being created: IPv6
        // peers wait, reported, until that device is gone and healing
        // creates this one.
        let device6_index = match subnets.v6 {
            Some(_) if spec.public_ipv6.is_some() => {
                match ensure_device6(&nl, &spec, subnets, mtu6).await {
                    Ok(i) => Some(i),
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "no IPv6 overlay device yet; retrying");
                        None
                    }
                }
            }
            _ => None,
        };
        host::apply(&spec.uplink, &spec.state_dir, subnets.v6.is_some())?;

        let plan = decap_plan(spec.xdp_mode, &uplink);
        if !plan.0.is_empty() {
            match super::ethtool::ensure_gro(&spec.uplink) {
                Ok(true) => tracing::info!(uplink = %spec.uplink, "turned GRO on for the uplink"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(uplink = %spec.uplink, error = %e, "cannot turn GRO on for the uplink")
                }
            }
        }

        // Programs and maps: load (reusing pinned maps of the right
        // layout), fill the maps, and only then swap the programs in, so an
        // upgrade that replaces maps never runs programs on empty ones.
        let adopting = spec.pins.has_links();
        let opts = LoadOptions {
            trace_drops: spec.trace_drops,
            max_peers: spec.max_peers,
        };
        let mut loaded = {
            let pins = spec.pins.clone();
            off_runtime(move || Loaded::load(&pins, &opts))?
        };
        let replaced = loaded.take_replaced();
        spec.pins.announce(&spec.state_dir)?;
        let maps = PeerMaps::open(&spec.pins)?;
        let endpoint_map = EndpointMap::open(&spec.pins)?;
        let counters = Arc::new(Counters::open(&spec.pins)?);
        let flannel_index = nl
            .link(&flannel_device_name(spec.vni))
            .await?
            .map(|l| l.index);
        let uplink_nets = uplink_nets(&nl, uplink.index).await?;
        let mut o = Self {
            spec,
            subnets,
            nl,
            maps,
            counters,
            peers: HashMap::new(),
            problems: BTreeMap::new(),
            device_index,
            device6_index,
            flannel_index,
            uplink,
            attachments: Vec::new(),
            decap: DecapChoice {
                hook: "tc",
                why: String::new(),
            },
            loaded,
            endpoint_map,
            endpoints: Endpoints::default(),
            _trace: None,
            direct: HashSet::new(),
            uplink_nets,
            mtu,
            mtu6,
            _marker: None,
            liberal: Arc::default(),
        };
        netfilter::apply(&o.netfilter())?;
        o.write_config()?;
        o.carry_over(replaced)?;
        o.peers = o.maps.peers()?;
        o.direct = o.maps.direct_subnets()?;
        o.maps.rebuild_vteps(&o.peers)?;

        let (attachments, decap, logger) = {
            let pins = o.spec.pins.clone();
            let uplink_name = o.spec.uplink.clone();
            let devs = o.devices();
            let bypass = o.spec.host_routing != HostRouting::Legacy;
            let loaded = &mut o.loaded;
            off_runtime(move || -> Result<_> {
                let (attachments, decap) =
                    attach(loaded, &pins, &uplink_name, &devs, plan, bypass)?;
                let logger = if loaded.traces_drops() {
                    Some(loaded.drop_logger()?)
                } else {
                    None
                };
                Ok((attachments, decap, logger))
            })?
        };
        tracing::info!(hook = decap.hook, why = %decap.why, host_routing = o.spec.host_routing.as_str(), "decapsulation");
        o.decap = decap;
        for a in &attachments {
            tracing::info!(
                program = a.program,
                iface = %a.iface,
                hook = a.hook.name(),
                xdp_mode = a.xdp_mode.map_or("-", |m| m.as_str()),
                adopted = a.adopted,
                "program attached"
            );
        }
        o.attachments = attachments;
        if o.spec.host_routing == HostRouting::Auto && o.loaded.has_conntrack() {
            o._marker = Some(conntrack::spawn_marker(&o.spec.pins, o.liberal.clone())?);
        }
        loader::remove_other_versions(&o.spec.pins)?;
        if adopting {
            tracing::info!(
                peers = o.peers.len(),
                "adopted the pinned dataplane of an earlier run"
            );
        }
        if let Some(logger) = logger {
            o._trace = Some(trace::DropTrace::start(logger)?);
        }
        o.reconcile_routes().await?;
        Ok(o)
    }

    /// Carries peers over from pinned maps this load replaced (another
    /// capacity, or an older layout with the same entries), so an upgrade
    /// keeps forwarding. Maps whose entries differ are left to be filled
    /// from etcd.
    fn carry_over(&mut self, replaced: Vec<Replaced>) -> Result<()> {
        for r in replaced {
            if r.name != map_names::PEERS && r.name != map_names::PEERS6 {
                continue;
            }
            match PeerMaps::read_peers(&r.name, r.old) {
                Ok(peers) => {
                    let mut n = 0;
                    for p in peers.values() {
                        if self.maps.upsert(p, None, false).is_ok() {
                            n += 1;
                        }
                    }
                    tracing::info!(
                        peers = n,
                        from_version = r.version,
                        "carried the peers over into the new peer map"
                    );
                }
                Err(e) => tracing::warn!(
                    error = %format!("{e:#}"),
                    from_version = r.version,
                    "the replaced peer map cannot be read; its peers come back from etcd"
                ),
            }
        }
        Ok(())
    }

    /// The overlay devices that exist: (name, whether IPv6).
    fn devices(&self) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        if self.device_index.is_some() {
            out.push((device_name(self.spec.vni), false));
        }
        if self.device6_index.is_some() {
            out.push((device6_name(self.spec.vni), true));
        }
        out
    }

    /// What netfilter should hold.
    fn netfilter(&self) -> NetfilterSpec {
        NetfilterSpec {
            network: self.spec.network,
            subnet: self.subnets.v4,
            network6: self.spec.network6,
            subnet6: self.subnets.v6,
            // The gate asks conntrack: make sure it tracks here.
            track: self.spec.host_routing == HostRouting::Auto && self.loaded.has_conntrack(),
            masquerade: self.spec.masquerade,
            forward_rules: self.spec.forward_rules,
        }
    }

    /// The pods' MTU: the smallest of the overlay devices' (IPv6 needs 20
    /// bytes more than IPv4, and one pod interface carries both).
    pub fn mtu(&self) -> u32 {
        match (self.subnets.v4.is_some(), self.subnets.v6.is_some()) {
            (_, false) => self.mtu,
            (false, true) => self.mtu6,
            (true, true) => self.mtu.min(self.mtu6),
        }
    }

    /// The subnets of the peers reached without encapsulation.
    pub fn direct(&self) -> &HashSet<IpNet> {
        &self.direct
    }

    /// Whether `p` is reached without encapsulation: DirectRouting is on
    /// and its (IPv4) VTEP is on one of the uplink's subnets (as flannel
    /// decides).
    fn is_direct(&self, p: &Peer) -> bool {
        let std::net::IpAddr::V4(vtep) = p.vtep else {
            return false;
        };
        self.spec.direct_routing && self.uplink_nets.iter().any(|n| n.contains(&vtep))
    }

    /// The route to `p`'s subnet: through its family's overlay device, or
    /// (direct) through the uplink to the peer's public IP, as flannel
    /// installs it. None when that device does not exist.
    fn route_for(&self, p: &Peer) -> Option<Route> {
        if self.direct.contains(&p.subnet) {
            return Some(Route {
                dst: p.subnet.network(),
                prefix_len: p.subnet.prefix_len(),
                gateway: Some(p.vtep),
                oif: self.uplink.index,
                onlink: false,
            });
        }
        let oif = match p.subnet {
            IpNet::V4(_) => self.device_index?,
            IpNet::V6(_) => self.device6_index?,
        };
        Some(route_for(p, oif))
    }

    fn write_config(&mut self) -> Result<()> {
        let v4 = self.subnets.v4.is_some() && self.spec.public_ip.is_some();
        let v6 = self.subnets.v6.is_some() && self.spec.public_ipv6.is_some();
        let ct = conntrack::Refresh::read();
        let c = DataplaneConfig {
            subnet4_be: self
                .subnets
                .v4
                .map_or(0, |s| u32::from_ne_bytes(s.network().octets())),
            mask4_be: self
                .subnets
                .v4
                .map_or(0, |s| u32::from_ne_bytes(s.netmask().octets())),
            subnet6: self.subnets.v6.map_or([0; 16], |s| s.network().octets()),
            mask6: self.subnets.v6.map_or([0; 16], |s| s.netmask().octets()),
            ct_tcp_timeout_ms: ct.tcp_ms,
            ct_udp_timeout_ms: ct.udp_ms,
            ct_tcp_refresh_jiffies: ct.tcp_jiffies,
            ct_udp_refresh_jiffies: ct.udp_jiffies,
            ct_udp_unreplied_ms: ct.udp_unreplied_ms,
            ct_udp_unreplied_refresh_jiffies: ct.udp_unreplied_jiffies,
            vni: self.spec.vni,
            port: self.spec.port,
            _pad0: 0,
            local_addr_be: self
                .spec
                .public_ip
                .map_or(0, |ip| u32::from_ne_bytes(ip.octets())),
            uplink_ifindex: self.uplink.index,
            uplink_mtu: self.uplink.mtu,
            vtep_mac: self.spec.vtep_mac.0,
            uplink_mac: self.uplink.mac,
            local_addr6: self.spec.public_ipv6.map_or([0; 16], |ip| ip.octets()),
            overlay6_ifindex: self.device6_index.unwrap_or(0),
            overlay6_mtu: self.mtu6,
            vtep6_mac: self.spec.vtep6_mac.0,
            _pad1: [0; 2],
            flags: CONFIG_F_READY
                | if v4 { CONFIG_F_IPV4 } else { 0 }
                | if v6 { CONFIG_F_IPV6 } else { 0 }
                | match self.spec.host_routing {
                    HostRouting::Legacy => 0,
                    HostRouting::Bpf => CONFIG_F_BYPASS,
                    HostRouting::Auto if self.loaded.has_conntrack() => {
                        CONFIG_F_BYPASS | CONFIG_F_CT_GATE
                    }
                    // Without conntrack's kfuncs nothing can tell which flows
                    // netfilter would let through unchanged: no bypass.
                    HostRouting::Auto => 0,
                },
        };
        self.maps.set_config(&c)
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// What the marking of fast-path flows as liberal did.
    pub(crate) fn liberal(&self) -> Arc<conntrack::LiberalStats> {
        self.liberal.clone()
    }

    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    pub fn peers(&self) -> &HashMap<IpNet, Peer> {
        &self.peers
    }

    /// Where decapsulation runs, and why.
    pub fn decap(&self) -> &DecapChoice {
        &self.decap
    }

    /// Makes the local pods host routing reaches match the registered
    /// endpoints `want`.
    pub async fn sync_endpoints(&mut self, want: &[EndpointSpec]) -> Result<EndpointSync> {
        let not_pods = [
            self.spec.uplink.clone(),
            device_name(self.spec.vni),
            device_peer_name(self.spec.vni),
            device6_name(self.spec.vni),
        ];
        let scope = Scope {
            not_pods: &not_pods,
            subnets: self.subnets,
        };
        self.endpoints
            .sync(
                want,
                &mut self.endpoint_map,
                &mut self.loaded,
                &self.spec.pins,
                &self.nl,
                &scope,
            )
            .await
    }

    /// Peers not (fully) programmed.
    pub(crate) fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.problems.values()
    }

    /// Our own subnets changed (the lease was lost and re-acquired).
    pub async fn set_subnet(&mut self, subnets: OwnSubnets) -> Result<()> {
        if subnets == self.subnets {
            return Ok(());
        }
        self.subnets = subnets;
        if let (Some(i), Some(s)) = (self.device_index, subnets.v4) {
            self.nl.ensure_only_address(i, s.network(), 32).await?;
        }
        if let (Some(i), Some(s)) = (self.device6_index, subnets.v6) {
            self.nl.ensure_only_address(i, s.network(), 128).await?;
        }
        netfilter::apply(&self.netfilter())?;
        // Routes carry the device's address as their source: rewrite them.
        let peers: Vec<Peer> = self.peers.values().copied().collect();
        self.install_routes(&peers).await
    }

    /// Installs or replaces one peer: the map entry is replaced in place, so
    /// no packet sees the subnet without a VTEP or with a half-written one.
    pub async fn upsert(&mut self, p: Peer) -> Result<()> {
        self.apply_batch(&[PeerUpdate::Upsert(p)]).await?;
        match self.problems.get(&p.subnet) {
            Some(pr) => bail!("peer {}: {}", p.subnet, pr.error),
            None => Ok(()),
        }
    }

    /// Applies many updates at once: map entries one by one, in order, and
    /// the routes of new peers concurrently (the slow part when thousands
    /// of leases arrive together). A peer that cannot be programmed (map
    /// full, a route in the way) is recorded as a problem and retried; it
    /// never stops the others.
    pub async fn apply_batch(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        let mut new_routes: HashMap<IpNet, Peer> = HashMap::new();
        let mut freed = false;
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    if self.overlaps_own(&p.subnet) {
                        tracing::error!(subnet = %p.subnet, vtep = %p.vtep, "refusing a peer that overlaps this node's own subnet");
                        continue;
                    }
                    let route_missing = self
                        .problems
                        .remove(&p.subnet)
                        .is_some_and(|pr| pr.kind == ProblemKind::Route);
                    match self.program(p) {
                        Some(fresh) if fresh || route_missing => {
                            new_routes.insert(p.subnet, *p);
                        }
                        _ => {}
                    }
                }
                PeerUpdate::Remove(s) => {
                    new_routes.remove(s);
                    self.problems.remove(s);
                    freed |= self.remove(*s).await;
                }
            }
        }
        // Peers already routed keep their route; the new ones get one.
        let peers: Vec<Peer> = new_routes.into_values().collect();
        self.install_routes(&peers).await?;
        if freed {
            // Room in the map: peers that did not fit are tried again now.
            let now = Instant::now();
            for pr in self.problems.values_mut() {
                if pr.kind == ProblemKind::MapFull {
                    pr.retry_at = now;
                }
            }
        }
        Ok(())
    }

    /// Writes `p` into the peer map: `Some(true)` for a peer new to the
    /// map (it needs its route), `Some(false)` for one replaced in place,
    /// `None` (and a recorded problem) if it could not be written.
    fn program(&mut self, p: &Peer) -> Option<bool> {
        let old = self.peers.get(&p.subnet).copied();
        let direct = self.is_direct(p);
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
                let kind = if super::maps::is_full(&e) {
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

    /// Whether `subnet` overlaps this node's own subnet of its family.
    fn overlaps_own(&self, subnet: &IpNet) -> bool {
        match subnet {
            IpNet::V4(s) => self.subnets.v4.is_some_and(|o| crate::net::overlaps(s, &o)),
            IpNet::V6(s) => self
                .subnets
                .v6
                .is_some_and(|o| o.contains(s) || s.contains(&o)),
        }
    }

    /// Installs the routes of `peers` (each family with its device's
    /// address as source); failures become problems.
    async fn install_routes(&mut self, peers: &[Peer]) -> Result<()> {
        if peers.is_empty() {
            return Ok(());
        }
        let (v4, v6): (Vec<Peer>, Vec<Peer>) =
            peers.iter().partition(|p| p.subnet.addr().is_ipv4());
        let src4 = self.subnets.v4.map(|s| s.network().into());
        let src6 = self.subnets.v6.map(|s| s.network().into());
        for (peers, src) in [(v4, src4), (v6, src6)] {
            let mut routes = Vec::new();
            let mut routed = Vec::new();
            for p in peers {
                match self.route_for(&p) {
                    Some(r) => {
                        routes.push(r);
                        routed.push(p);
                    }
                    None => self.record(
                        p,
                        ProblemKind::Route,
                        "its family's overlay device does not exist yet".into(),
                    ),
                }
            }
            if routes.is_empty() {
                continue;
            }
            let results = self
                .nl
                .install_routes(&routes, src, self.flannel_index)
                .await?;
            for (p, r) in routed.iter().zip(results) {
                match r {
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

    /// Tries again the peers whose retry time has come.
    pub(crate) async fn retry_problems(&mut self) -> Result<()> {
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
                    if self.program(&pr.peer).is_some() {
                        routes.push(pr.peer);
                    }
                }
            }
        }
        self.install_routes(&routes).await
    }

    /// Removes the peer of `subnet`; returns whether the map had it. A
    /// route or map entry that cannot be removed is logged, not fatal: a
    /// route of ours to no peer is removed by the next heal, and a map
    /// entry of a peer that is gone is only ever a stale destination.
    pub async fn remove(&mut self, subnet: IpNet) -> bool {
        let Some(old) = self.peers.remove(&subnet) else {
            return false;
        };
        // Route first, so the kernel stops sending into the overlay, then
        // the map entry. Only our own route (protocol 44) is ever deleted.
        if let Some(r) = self.route_for(&old)
            && let Err(e) = self.nl.del_route(&r).await
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
    pub async fn retain(&mut self, keep: &HashSet<IpNet>) -> Result<usize> {
        let gone: Vec<IpNet> = self
            .peers
            .keys()
            .chain(self.problems.keys())
            .filter(|s| !keep.contains(s))
            .copied()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        for s in &gone {
            self.problems.remove(s);
            self.remove(*s).await;
        }
        Ok(gone.len())
    }

    /// Checks everything the datapath relies on and puts back what
    /// something else removed: the overlay device (up, no ARP, its MAC and
    /// MTU), its address, the attached programs, the sysctls, Weft's routes
    /// and its netfilter rules. Also follows the uplink's MTU. Cheap when
    /// nothing is missing (a few netlink requests), so it runs every few
    /// seconds and whenever rtnetlink reports a change.
    pub async fn heal(&mut self) -> Result<Healed> {
        let mut h = Healed::default();
        let Some(uplink) = self.nl.link_by_index(self.uplink.index).await? else {
            bail!("the uplink {} is gone", self.spec.uplink);
        };
        if uplink.mtu != self.uplink.mtu {
            tracing::info!(
                uplink = %uplink.name,
                from = self.uplink.mtu,
                to = uplink.mtu,
                "the uplink's MTU changed"
            );
            self.uplink.mtu = uplink.mtu;
        }
        let (mtu, mtu6) = (
            overlay_mtu(&self.spec, uplink.mtu),
            overlay_mtu6(&self.spec, uplink.mtu),
        );
        let pods_mtu = self.mtu();
        self.mtu = mtu;
        self.mtu6 = mtu6;
        if self.mtu() != pods_mtu {
            tracing::info!(from = pods_mtu, to = self.mtu(), "the overlay MTU follows");
            h.mtu_changed = true;
        }

        // The devices: gone (and their routes and programs with them), or
        // changed.
        let mut recreated = false;
        if let Some(subnet) = self.subnets.v4
            && self.spec.public_ip.is_some()
        {
            let dev = device_name(self.spec.vni);
            let peer = device_peer_name(self.spec.vni);
            let mac = self.spec.vtep_mac.0;
            let link = self.nl.link(&dev).await?;
            let recreate = link
                .as_ref()
                .is_none_or(|l| Some(l.index) != self.device_index);
            let changed = link
                .as_ref()
                .is_none_or(|l| !l.up || l.arp || l.mac != mac || l.mtu != mtu);
            if recreate {
                // The link pinned for the old device is defunct.
                let pins = self.spec.pins.clone();
                let d = dev.clone();
                off_runtime(move || loader::detach(&pins, Hook::TcEgress, &d))?;
                recreated = true;
            }
            if changed {
                let (index, _) = self.nl.ensure_overlay_device(&dev, &peer, mac, mtu).await?;
                self.device_index = Some(index);
                if recreate
                    || link
                        .as_ref()
                        .is_some_and(|l| !l.up || l.arp || l.mac != mac)
                {
                    h.repairs.push("device");
                }
                for d in [&dev, &peer] {
                    let _ = sysctl::write_iface("ipv6", d, "disable_ipv6", "1");
                }
            }
            let index = self.device_index.expect("set above");
            if self.nl.addresses(index).await? != [(subnet.network(), 32)] {
                self.nl
                    .ensure_only_address(index, subnet.network(), 32)
                    .await?;
                h.repairs.push("address");
            }
        }
        if let Some(subnet) = self.subnets.v6
            && self.spec.public_ipv6.is_some()
        {
            let dev = device6_name(self.spec.vni);
            let mac = self.spec.vtep6_mac.0;
            let link = self.nl.link(&dev).await?;
            let recreate = link
                .as_ref()
                .is_none_or(|l| Some(l.index) != self.device6_index);
            let changed = link
                .as_ref()
                .is_none_or(|l| !l.up || l.arp || l.mac != mac || l.mtu != mtu6);
            if recreate {
                let pins = self.spec.pins.clone();
                let d = dev.clone();
                off_runtime(move || -> Result<()> {
                    loader::detach(&pins, Hook::TcEgress, &d)?;
                    loader::detach(&pins, Hook::TcIngress, &d)?;
                    Ok(())
                })?;
                recreated = true;
            }
            if changed {
                match ensure_device6(&self.nl, &self.spec, self.subnets, mtu6).await {
                    Ok(index) => {
                        let first = self.device6_index.is_none();
                        self.device6_index = Some(index);
                        if first {
                            tracing::info!(device = %dev, "the IPv6 overlay device is up");
                        } else if recreate
                            || link
                                .as_ref()
                                .is_some_and(|l| !l.up || l.arp || l.mac != mac)
                        {
                            h.repairs.push("device");
                        }
                        // The IPv6 peers waiting for it get their routes now.
                        for pr in self.problems.values_mut() {
                            if pr.peer.subnet.addr().is_ipv6() {
                                pr.retry_at = Instant::now();
                            }
                        }
                    }
                    Err(e) => {
                        self.device6_index = None;
                        tracing::warn!(error = %format!("{e:#}"), "still no IPv6 overlay device");
                    }
                }
            }
            if let Some(index) = self.device6_index
                && self.nl.addresses6(index).await? != [(subnet.network(), 128)]
            {
                self.nl
                    .ensure_only_address(index, subnet.network(), 128)
                    .await?;
                h.repairs.push("address");
            }
        }
        // The config names the devices and MTUs: keep it current.
        self.write_config()?;

        // The programs.
        let detached = recreated
            || self.devices().len()
                != self
                    .attachments
                    .iter()
                    .filter(|a| a.hook == Hook::TcEgress)
                    .count()
            || {
                let (loaded, attachments) = (&mut self.loaded, &self.attachments);
                // XDP's check asks rtnetlink on a runtime of its own.
                off_runtime(move || -> Result<bool> {
                    for a in attachments {
                        if !loaded.is_attached(a)? {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                })?
            };
        if detached {
            let pins = self.spec.pins.clone();
            let uplink_name = self.spec.uplink.clone();
            let bypass = self.spec.host_routing != HostRouting::Legacy;
            let plan = decap_plan(self.spec.xdp_mode, &uplink);
            let devs = self.devices();
            let loaded = &mut self.loaded;
            let (attachments, decap) =
                off_runtime(move || attach(loaded, &pins, &uplink_name, &devs, plan, bypass))?;
            self.attachments = attachments;
            self.decap = decap;
            h.repairs.push("programs");
        }
        if self.spec.host_routing != HostRouting::Legacy
            && self.endpoints.heal(&mut self.loaded) > 0
            && !h.repairs.contains(&"programs")
        {
            h.repairs.push("programs");
        }

        if host::apply(
            &self.spec.uplink,
            &self.spec.state_dir,
            self.subnets.v6.is_some(),
        )? {
            h.repairs.push("sysctls");
        }

        // Routes: every programmed peer's (those with a route problem are
        // retried on their own schedule), and no stale one of ours.
        let want: HashMap<(std::net::IpAddr, u8), Route> = self
            .peers
            .values()
            .filter(|p| !self.problems.contains_key(&p.subnet))
            .filter_map(|p| self.route_for(p))
            .map(|r| ((r.dst, r.prefix_len), r))
            .collect();
        // Sets: tens of thousands of peers are checked every few seconds.
        let have: HashSet<Route> = self.nl.weft_routes().await?.into_iter().collect();
        let mut missing: Vec<Peer> = Vec::new();
        for p in self.peers.values() {
            if let Some(r) = want.get(&(p.subnet.network(), p.subnet.prefix_len()))
                && !have.contains(r)
            {
                missing.push(*p);
            }
        }
        for r in &have {
            if !r.net().is_some_and(|n| self.peers.contains_key(&n)) {
                tracing::info!(dst = %r.dst, prefix_len = r.prefix_len, "removing a route of Weft's to no peer");
                self.nl.del_route(r).await?;
            }
        }
        if !missing.is_empty() {
            tracing::debug!(routes = missing.len(), "reinstalling missing routes");
            self.install_routes(&missing).await?;
            h.repairs.push("routes");
        }

        h.repairs.extend(netfilter::heal(&self.netfilter())?);
        Ok(h)
    }

    /// Makes the kernel's Weft routes match the peer table.
    async fn reconcile_routes(&mut self) -> Result<()> {
        // Routes to no peer go; a peer's route in another form (an older
        // version's, a peer that became direct) is replaced in place below,
        // never deleted first, so its traffic does not stop.
        for r in self.nl.weft_routes().await? {
            if !r.net().is_some_and(|s| self.peers.contains_key(&s)) {
                self.nl.del_route(&r).await?;
            }
        }
        let peers: Vec<Peer> = self.peers.values().copied().collect();
        self.install_routes(&peers).await
    }
}

/// Creates (or converges) the IPv6 overlay device with its address and
/// settings; returns its index.
async fn ensure_device6(
    nl: &Netlink,
    spec: &DataplaneSpec,
    subnets: OwnSubnets,
    mtu: u32,
) -> Result<u32> {
    let (Some(local), Some(subnet)) = (spec.public_ipv6, subnets.v6) else {
        bail!("no IPv6 VTEP address or subnet");
    };
    let dev = device6_name(spec.vni);
    let (index, created) = nl
        .ensure_vxlan6_device(&dev, spec.port, local, spec.vtep6_mac.0, mtu)
        .await?;
    if created {
        tracing::info!(device = %dev, mtu, "created the IPv6 overlay device");
    }
    // No router advertisements on the overlay; its address is not
    // duplicate-checked (no ARP, no neighbour discovery).
    let _ = sysctl::write_iface("ipv6", &dev, "accept_ra", "0");
    nl.ensure_only_address(index, subnet.network(), 128).await?;
    Ok(index)
}

/// Runs blocking loader code (which may start its own netlink runtime) on a
/// fresh thread: it inherits this thread's network namespace, which a pooled
/// blocking thread might not.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("loader thread panicked"))
}

/// A peer's route through its overlay device: `<subnet> dev weft.1 scope
/// link` (IPv6: `dev weft-v6.1`), without flannel's `via <subnet>.0
/// onlink`. The encapsulation finds
/// the peer from the packet's destination, so no gateway is needed, and the
/// kernel shares one nexthop among all such routes; with a gateway each route
/// gets a nexthop of its own, and the kernel's nexthop table hashes them all
/// into one chain (the gateway is not in its hash): adding 20,000 such
/// routes took 5.7 s against 0.24 s without gateways, and quadratically more
/// beyond.
fn route_for(p: &Peer, device_index: u32) -> Route {
    Route {
        dst: p.subnet.network(),
        prefix_len: p.subnet.prefix_len(),
        gateway: None,
        oif: device_index,
        onlink: false,
    }
}

type Attached = (Vec<Attachment>, DecapChoice);

/// The XDP modes to try for decapsulation (none: TC), and why.
fn decap_plan(mode: XdpMode, uplink: &Link) -> (Vec<XdpMode>, String) {
    match mode {
        XdpMode::Off => (vec![], "--xdp-mode off".into()),
        XdpMode::Native => (vec![XdpMode::Native], "--xdp-mode native".into()),
        XdpMode::Generic => (vec![XdpMode::Generic], "--xdp-mode generic".into()),
        XdpMode::Auto if uplink.kind.as_deref() == Some("veth") => (
            vec![],
            "the uplink is a veth: XDP on a veth strips GSO from its peer and copies every frame, TC keeps the large packets".into(),
        ),
        XdpMode::Auto => (
            vec![XdpMode::Native],
            "native XDP on a device driver: decapsulated before the stack, merged by GRO after".into(),
        ),
    }
}

fn attach(
    loaded: &mut Loaded,
    pins: &PinDir,
    uplink: &str,
    devices: &[(String, bool)],
    (xdp_modes, why): (Vec<XdpMode>, String),
    bypass: bool,
) -> Result<Attached> {
    let mut out = Vec::new();
    for (dev, v6) in devices {
        if *v6 {
            out.push(loaded.attach_tc(program_names::ENCAP6, dev, Hook::TcEgress)?);
            out.push(loaded.attach_tc(program_names::TUNNEL_RX, dev, Hook::TcIngress)?);
        } else {
            out.push(loaded.attach_tc(program_names::ENCAP, dev, Hook::TcEgress)?);
        }
    }
    let xdp = if xdp_modes.is_empty() {
        None
    } else {
        match loaded.attach_xdp(program_names::DECAP_XDP, uplink, &xdp_modes) {
            Ok(a) => Some(a),
            // Auto only tries native XDP, and falls back to TC.
            Err(e) if xdp_modes == [XdpMode::Native] && why.starts_with("native") => {
                tracing::info!(uplink, error = %format!("{e:#}"), "no native XDP on the uplink; decapsulating in TC");
                None
            }
            Err(e) => return Err(e),
        }
    };
    let decap = match xdp {
        Some(a) => {
            let hook = match a.xdp_mode {
                Some(XdpMode::Generic) => "xdp-generic",
                _ => "xdp-native",
            };
            out.push(a);
            // After GRO, XDP-decapsulated frames for local pods go straight
            // into them (host routing); nothing else needs TC.
            if bypass {
                out.push(loaded.attach_tc(program_names::DELIVER, uplink, Hook::TcIngress)?);
            } else {
                loader::detach(pins, Hook::TcIngress, uplink)?;
            }
            DecapChoice { hook, why }
        }
        None => {
            loader::detach(pins, Hook::Xdp, uplink)?;
            out.push(loaded.attach_tc(program_names::DECAP_TC, uplink, Hook::TcIngress)?);
            let why = if xdp_modes.is_empty() {
                why
            } else {
                "the driver has no native XDP".into()
            };
            DecapChoice { hook: "tc", why }
        }
    };
    Ok((out, decap))
}

/// The overlay device's MTU: the underlay's (`Backend.MTU`, else the
/// uplink's) less VXLAN's 50 bytes, as flannel sets it.
fn overlay_mtu(spec: &DataplaneSpec, uplink_mtu: u32) -> u32 {
    spec.underlay_mtu.unwrap_or(uplink_mtu) - VXLAN_OVERHEAD
}

/// The IPv6 overlay device's MTU: the underlay's less VXLAN's 70 bytes over
/// IPv6 (flannel subtracts 50 for both, which leaves a full-size IPv6
/// packet too big for the underlay).
fn overlay_mtu6(spec: &DataplaneSpec, uplink_mtu: u32) -> u32 {
    spec.underlay_mtu
        .unwrap_or(uplink_mtu)
        .saturating_sub(VXLAN6_OVERHEAD)
}

/// The subnets the addresses of device `index` are on.
async fn uplink_nets(nl: &Netlink, index: u32) -> Result<Vec<Ipv4Net>> {
    Ok(nl
        .addresses(index)
        .await?
        .into_iter()
        .filter_map(|(ip, len)| Ipv4Net::new(ip, len).ok().map(|n| n.trunc()))
        .collect())
}

/// Removes everything Weft created on this node: the programs (links), the
/// pinned maps, the overlay device and with it its routes, and puts back
/// the host settings it changed. Safe to run twice; returns what it
/// removed.
pub(crate) async fn teardown(pins: &PinDir, vni: u32, state_dir: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let nl = Netlink::new()?;
    let pinned = loader::pinned_links(pins)?;
    let dev = device_name(vni);
    for (hook, iface, _) in &pinned {
        let pins = pins.clone();
        let (hook, name) = (*hook, iface.clone());
        if off_runtime(move || loader::detach(&pins, hook, &name))? {
            removed.push(format!("{} program on {iface}", hook.name()));
        }
    }
    // Weft routes go with the device; remove any left on other devices.
    for r in nl.weft_routes().await? {
        nl.del_route(&r).await?;
        removed.push(format!("route {}/{}", r.dst, r.prefix_len));
    }
    for dev in [dev, device6_name(vni)] {
        if nl.delete_link(&dev).await? {
            removed.push(format!("device {dev}"));
        }
    }
    let mut dirs: Vec<std::path::PathBuf> = vec![pins.maps()];
    dirs.extend(pins.other_map_versions().into_iter().map(|(_, d)| d));
    for maps_dir in dirs {
        if !maps_dir.exists() {
            continue;
        }
        for e in std::fs::read_dir(&maps_dir)
            .with_context(|| format!("reading {}", maps_dir.display()))?
        {
            let e = e?;
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
            removed.push(format!("map {}", e.file_name().to_string_lossy()));
        }
        let _ = std::fs::remove_dir(&maps_dir);
    }
    let _ = std::fs::remove_dir(pins.links());
    removed.extend(netfilter::remove()?);
    removed.extend(host::restore(state_dir)?);
    PinDir::unannounce(state_dir);
    Ok(removed)
}
