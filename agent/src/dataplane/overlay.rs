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
//! Routes `10.244.7.0/24 via 10.244.7.0 dev weft.1 onlink src 10.244.3.0`
//! send remote-subnet traffic (pods' and the node's own) into weft.1, whose
//! MTU makes the kernel answer oversized packets with ICMP "fragmentation
//! needed" before the program sees them.

use std::{collections::HashMap, net::Ipv4Addr, sync::Arc};

use anyhow::{Context as _, Result, bail};
use dataplane_common::{CONFIG_F_READY, DataplaneConfig, VXLAN_OVERHEAD, program_names};
use futures::{StreamExt as _, TryStreamExt as _};

use super::{
    bpffs::PinDir,
    loader::{self, Attachment, Hook, Loaded, XdpModeName},
    maps::{Counters, PeerMaps},
    netlink::{Link, Netlink, Route},
    sysctl,
};
use crate::{
    lease::subnet::Ipv4Net,
    mac::MacAddr,
    peers::{Peer, PeerUpdate},
};

/// Where decapsulation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecapMode {
    /// XDP, native if the driver has it, else generic.
    XdpAuto,
    XdpNative,
    XdpGeneric,
    /// TC ingress on the uplink.
    Tc,
}

/// What the overlay is built from.
#[derive(Clone, Debug)]
pub struct OverlaySpec {
    pub uplink: String,
    pub public_ip: Ipv4Addr,
    pub vni: u32,
    pub port: u16,
    pub vtep_mac: MacAddr,
    pub subnet: Ipv4Net,
    pub decap: DecapMode,
    pub pins: PinDir,
}

/// The overlay device's name for a VNI (flannel: `flannel.<VNI>`).
pub fn device_name(vni: u32) -> String {
    format!("weft.{vni}")
}

/// The other end of the overlay device's veth pair.
pub fn device_peer_name(vni: u32) -> String {
    format!("weft.{vni}.p")
}

pub struct Overlay {
    spec: OverlaySpec,
    nl: Netlink,
    maps: PeerMaps,
    counters: Arc<Counters>,
    /// What the peer map holds (mirror).
    peers: HashMap<Ipv4Net, Peer>,
    device_index: u32,
    uplink: Link,
    attachments: Vec<Attachment>,
}

impl Overlay {
    /// Sets up (or converges) everything; adopts pinned programs and maps
    /// from an earlier run without detaching them.
    pub async fn setup(spec: OverlaySpec) -> Result<Self> {
        let nl = Netlink::new()?;
        let uplink = nl.require_link(&spec.uplink).await?;
        if uplink.mtu <= VXLAN_OVERHEAD + 68 {
            bail!(
                "uplink {} has MTU {}: too small for VXLAN",
                uplink.name,
                uplink.mtu
            );
        }
        let dev = device_name(spec.vni);
        let mtu = uplink.mtu - VXLAN_OVERHEAD;

        // The overlay device, whose egress TC program does the work.
        let peer = device_peer_name(spec.vni);
        // IPv4 only: no IPv6 link-local chatter into the encapsulation path
        // (set on the default before creating, and on both ends after).
        let device_index = nl
            .ensure_overlay_device(&dev, &peer, spec.vtep_mac.0, mtu)
            .await?;
        for d in [&dev, &peer] {
            let _ = sysctl::write_iface("ipv6", d, "disable_ipv6", "1");
        }
        nl.ensure_only_address(device_index, spec.subnet.addr(), 32)
            .await?;
        host_sysctls(&spec.uplink)?;

        if spec.decap != DecapMode::Tc {
            match super::ethtool::ensure_gro(&spec.uplink) {
                Ok(true) => tracing::info!(uplink = %spec.uplink, "turned GRO on for the uplink"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(uplink = %spec.uplink, error = %e, "cannot turn GRO on for the uplink")
                }
            }
        }

        // Programs and maps.
        let adopting = spec.pins.has_pins();
        let attachments = {
            let pins = spec.pins.clone();
            let uplink_name = spec.uplink.clone();
            let dev = dev.clone();
            let decap = spec.decap;
            off_runtime(move || attach(&pins, &uplink_name, &dev, decap))?
        };
        for a in &attachments {
            tracing::info!(
                program = a.program,
                iface = %a.iface,
                hook = a.hook.name(),
                xdp_mode = a.xdp_mode.map(|m| m.as_str()).unwrap_or("-"),
                adopted = a.adopted,
                "program attached"
            );
        }
        let mut maps = PeerMaps::open(&spec.pins)?;
        let counters = Arc::new(Counters::open(&spec.pins)?);
        let peers = maps.peers()?;
        if adopting {
            tracing::info!(
                peers = peers.len(),
                "adopted the pinned dataplane of an earlier run"
            );
        }
        maps.rebuild_vteps(&peers)?;
        let mut o = Self {
            spec,
            nl,
            maps,
            counters,
            peers,
            device_index,
            uplink,
            attachments,
        };
        o.write_config()?;
        o.reconcile_routes().await?;
        Ok(o)
    }

    fn write_config(&mut self) -> Result<()> {
        let c = DataplaneConfig {
            vni: self.spec.vni,
            port: self.spec.port,
            _pad0: 0,
            local_addr_be: u32::from_ne_bytes(self.spec.public_ip.octets()),
            uplink_ifindex: self.uplink.index,
            uplink_mtu: self.uplink.mtu,
            vtep_mac: self.spec.vtep_mac.0,
            uplink_mac: self.uplink.mac,
            flags: CONFIG_F_READY,
        };
        self.maps.set_config(&c)
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    pub fn peers(&self) -> &HashMap<Ipv4Net, Peer> {
        &self.peers
    }

    pub fn device_index(&self) -> u32 {
        self.device_index
    }

    /// Our own subnet changed (the lease was lost and re-acquired).
    pub async fn set_subnet(&mut self, subnet: Ipv4Net) -> Result<()> {
        if subnet == self.spec.subnet {
            return Ok(());
        }
        self.spec.subnet = subnet;
        self.nl
            .ensure_only_address(self.device_index, subnet.addr(), 32)
            .await?;
        // Routes carry the device's address as their source: rewrite them.
        for p in self.peers.values() {
            self.nl
                .replace_route(&route_for(p, self.device_index), Some(subnet.addr()))
                .await?;
        }
        Ok(())
    }

    /// Installs or replaces one peer: the map entry is replaced in place, so
    /// no packet sees the subnet without a VTEP or with a half-written one.
    pub async fn upsert(&mut self, p: Peer) -> Result<()> {
        if p.subnet.overlaps(&self.spec.subnet) {
            bail!(
                "refusing peer {} at {}: it overlaps this node's own subnet",
                p.subnet,
                p.vtep
            );
        }
        self.apply_batch(&[PeerUpdate::Upsert(p)]).await
    }

    /// Applies many updates at once: map entries one by one, in order, and
    /// the routes of new peers concurrently (the slow part when thousands
    /// of leases arrive together).
    pub async fn apply_batch(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        let mut new_routes: HashMap<Ipv4Net, Route> = HashMap::new();
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    if p.subnet.overlaps(&self.spec.subnet) {
                        tracing::error!(subnet = %p.subnet, vtep = %p.vtep, "refusing a peer that overlaps this node's own subnet");
                        continue;
                    }
                    let old = self.peers.get(&p.subnet).copied();
                    self.maps.upsert(p, old.as_ref())?;
                    if old.is_none() {
                        new_routes.insert(p.subnet, route_for(p, self.device_index));
                    }
                    self.peers.insert(p.subnet, *p);
                }
                PeerUpdate::Remove(s) => {
                    new_routes.remove(s);
                    self.remove(*s).await?;
                }
            }
        }
        let src = self.spec.subnet.addr();
        let nl = &self.nl;
        futures::stream::iter(new_routes.values())
            .map(|r| nl.replace_route(r, Some(src)))
            .buffer_unordered(64)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    pub async fn remove(&mut self, subnet: Ipv4Net) -> Result<()> {
        let Some(old) = self.peers.remove(&subnet) else {
            return Ok(());
        };
        // Route first, so the kernel stops sending into the overlay, then
        // the map entry.
        self.nl
            .del_route(&route_for(&old, self.device_index))
            .await?;
        self.maps.remove(&old)
    }

    /// Removes every peer not in `keep` (after adopting a pinned map, for
    /// leases that vanished while the agent was away).
    pub async fn retain(&mut self, keep: &std::collections::HashSet<Ipv4Net>) -> Result<usize> {
        let gone: Vec<Ipv4Net> = self
            .peers
            .keys()
            .filter(|s| !keep.contains(s))
            .copied()
            .collect();
        for s in &gone {
            self.remove(*s).await?;
        }
        Ok(gone.len())
    }

    /// Makes the kernel's Weft routes match the peer table.
    async fn reconcile_routes(&mut self) -> Result<()> {
        let want: Vec<Route> = self
            .peers
            .values()
            .map(|p| route_for(p, self.device_index))
            .collect();
        for r in self.nl.weft_routes().await? {
            if !want.contains(&r) {
                self.nl.del_route(&r).await?;
            }
        }
        for r in &want {
            self.nl
                .replace_route(r, Some(self.spec.subnet.addr()))
                .await?;
        }
        Ok(())
    }
}

/// Runs blocking loader code (which may start its own netlink runtime) on a
/// fresh thread: it inherits this thread's network namespace, which a pooled
/// blocking thread might not.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("loader thread panicked"))
}

fn route_for(p: &Peer, device_index: u32) -> Route {
    Route {
        dst: p.subnet.addr(),
        prefix_len: p.subnet.prefix_len(),
        gateway: Some(p.subnet.addr()),
        oif: device_index,
        onlink: true,
    }
}

fn attach(pins: &PinDir, uplink: &str, dev: &str, decap: DecapMode) -> Result<Vec<Attachment>> {
    let mut loaded = Loaded::load(pins)?;
    let mut out = vec![loaded.attach_tc(program_names::ENCAP, dev, Hook::TcEgress)?];
    let xdp_modes: &[XdpModeName] = match decap {
        DecapMode::XdpAuto => &[XdpModeName::Native, XdpModeName::Generic],
        DecapMode::XdpNative => &[XdpModeName::Native],
        DecapMode::XdpGeneric => &[XdpModeName::Generic],
        DecapMode::Tc => &[],
    };
    if xdp_modes.is_empty() {
        loader::detach(pins, Hook::Xdp, uplink)?;
        out.push(loaded.attach_tc(program_names::DECAP_TC, uplink, Hook::TcIngress)?);
    } else {
        out.push(loaded.attach_xdp(program_names::DECAP_XDP, uplink, xdp_modes)?);
        loader::detach(pins, Hook::TcIngress, uplink)?;
    }
    Ok(out)
}

/// Forwarding on; loose reverse-path filtering on the uplink, where
/// decapsulated packets from remote pods arrive (their route back is via
/// the overlay device, which strict mode would reject).
fn host_sysctls(uplink: &str) -> Result<()> {
    if sysctl::read("net.ipv4.ip_forward")? != "1" {
        sysctl::write("net.ipv4.ip_forward", "1")?;
        tracing::info!("enabled net.ipv4.ip_forward");
    }
    let all: u8 = sysctl::read_iface("ipv4", "all", "rp_filter")?
        .parse()
        .unwrap_or(0);
    let dev: u8 = sysctl::read_iface("ipv4", uplink, "rp_filter")?
        .parse()
        .unwrap_or(0);
    if all.max(dev) == 1 {
        sysctl::write_iface("ipv4", uplink, "rp_filter", "2")?;
        if all == 1 {
            sysctl::write_iface("ipv4", "all", "rp_filter", "2")?;
        }
        tracing::info!(
            uplink,
            "set loose reverse-path filtering (rp_filter=2) on the uplink"
        );
    }
    Ok(())
}

/// Removes everything Weft created on this node: the programs (links), the
/// pinned maps, the overlay device and with it its routes. Safe to run
/// twice; returns what it removed.
pub async fn teardown(pins: &PinDir, vni: u32) -> Result<Vec<String>> {
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
    if nl.delete_link(&dev).await? {
        removed.push(format!("device {dev}"));
    }
    let maps_dir = pins.maps();
    if maps_dir.exists() {
        for e in std::fs::read_dir(&maps_dir)
            .with_context(|| format!("reading {}", maps_dir.display()))?
        {
            let e = e?;
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
            removed.push(format!("map {}", e.file_name().to_string_lossy()));
        }
    }
    for d in [pins.links(), pins.maps()] {
        let _ = std::fs::remove_dir(&d);
    }
    Ok(removed)
}
