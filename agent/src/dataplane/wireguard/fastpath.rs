//! Host routing for the wireguard backend: the programs that take pods'
//! packets to remote pods straight to the WireGuard device, and decrypted
//! packets straight into local pods (see `CONFIG_F_WIREGUARD`).
//!
//! ```text
//!  pod ─ veth ─ TC ingress: weft_from_pod ──redirect──► flannel-wg ─► (encrypted) ─► eth0
//!  eth0 ─► flannel-wg (decrypted) ─ TC ingress: weft_from_wg ─ Ethernet pushed ─► pod
//! ```
//!
//! What the programs do not take (a pod host routing does not know, a flow
//! conntrack does not let through under `auto`, node traffic) goes the way
//! it goes without them: bridge, routing, netfilter, the device.
//!
//! The programs' maps hold the peers' subnets (`WEFT_PEERS`, `WEFT_PEERS6`):
//! a subnet is there only while its peer is on the device, so the programs
//! never send to a key the device does not have.

use std::{collections::HashMap, sync::Arc};

use anyhow::{Context as _, Result};
use dataplane_common::{
    CONFIG_F_IPV4, CONFIG_F_IPV6, CONFIG_F_WIREGUARD, DataplaneConfig, program_names,
};
use ipnet::IpNet;

use crate::dataplane::Peer;
use crate::dataplane::config;
use crate::dataplane::endpoints::EndpointSpec;
use crate::dataplane::endpoints::EndpointSync;
use crate::dataplane::endpoints::Endpoints;
use crate::dataplane::endpoints::Scope;
use crate::dataplane::maps::Counters;
use crate::dataplane::maps::EndpointMap;
use crate::dataplane::maps::PeerMaps;
use crate::dataplane::programs::kernel::ProgramKernel;
use crate::dataplane::programs::links::Hook;
use crate::dataplane::programs::loader;
use crate::dataplane::programs::loader::Attachment;
use crate::dataplane::programs::loader::LoadOptions;
use crate::dataplane::programs::loader::Loaded;
use crate::dataplane::programs::loader::off_runtime;
use crate::dataplane::types::HostRouting;
use crate::dataplane::{conntrack, marker};
use crate::lease::Subnets;
use crate::sys::bpffs::PinDir;
use crate::sys::netlink::Netlink;

/// A WireGuard device as the programs use it.
#[derive(Clone, Debug)]
pub(crate) struct FastDevice {
    pub name: &'static str,
    pub index: u32,
    pub mtu: u32,
    pub v4: bool,
    pub v6: bool,
}

pub(crate) struct FastPath {
    pins: PinDir,
    host_routing: HostRouting,
    loaded: Loaded,
    maps: PeerMaps,
    endpoint_map: EndpointMap,
    endpoints: Endpoints,
    counters: Arc<Counters>,
    attachments: Vec<Attachment>,
    /// The peers the maps hold.
    peers: HashMap<IpNet, Peer>,
    /// Marks fast-path TCP flows liberal in conntrack (`auto`).
    _marker: Option<marker::Marker>,
    liberal: Arc<conntrack::LiberalStats>,
    /// Forwards the drop trace to the log.
    _trace: Option<crate::dataplane::trace::DropTrace>,
}

impl FastPath {
    /// Loads the programs (reusing pinned maps of the right layout),
    /// attaches `weft_from_wg` to each device and writes the config. The
    /// pods' programs come with [`FastPath::sync_endpoints`].
    pub(crate) fn setup(
        pins: &PinDir,
        state_dir: &std::path::Path,
        host_routing: HostRouting,
        max_peers: u32,
        kernel: ProgramKernel,
        subnets: &Subnets,
        devices: &[FastDevice],
    ) -> Result<Self> {
        let opts = LoadOptions {
            max_peers,
            ..LoadOptions::for_kernel(kernel)
        };
        let p = pins.clone();
        let (loaded, logger) = off_runtime(move || -> Result<_> {
            let mut l = Loaded::load(&p, &opts)?;
            l.install()?;
            let logger = l.drop_logger()?;
            Ok((l, logger))
        })?;
        pins.announce(state_dir)?;
        let maps = PeerMaps::open(pins)?;
        let peers = maps.peers()?;
        let mut f = Self {
            pins: pins.clone(),
            host_routing,
            endpoint_map: EndpointMap::open(pins)?,
            counters: Arc::new(Counters::open(pins)?),
            loaded,
            maps,
            endpoints: Endpoints::with_program(program_names::FROM_POD_WG),
            attachments: Vec::new(),
            peers,
            _marker: None,
            liberal: Arc::default(),
            _trace: Some(crate::dataplane::trace::DropTrace::start(logger)?),
        };
        f.write_config(subnets, devices)?;
        for d in devices {
            f.attachments.push(f.loaded.attach_tc(
                program_names::FROM_WG,
                d.name,
                Hook::TcIngress,
            )?);
        }
        if host_routing == HostRouting::Auto && f.loaded.has_conntrack() {
            f._marker = Some(marker::spawn_marker(pins, f.liberal.clone())?);
        }
        loader::remove_other_versions(pins)?;
        tracing::info!(
            host_routing = host_routing.as_str(),
            conntrack_gate = f.gated(),
            devices = devices.len(),
            adopted_peers = f.peers.len(),
            "host routing into and out of WireGuard"
        );
        Ok(f)
    }

    /// Whether only flows conntrack lets through take the fast path.
    pub(crate) fn gated(&self) -> bool {
        self.host_routing == HostRouting::Auto && self.loaded.has_conntrack()
    }

    /// The programs' config: the devices of each family, this node's
    /// subnets, the host routing mode.
    pub(crate) fn write_config(&mut self, subnets: &Subnets, devices: &[FastDevice]) -> Result<()> {
        let v4 = devices.iter().find(|d| d.v4);
        let v6 = devices.iter().find(|d| d.v6);
        let node = config::node_config(subnets, self.host_routing, self.loaded.has_conntrack());
        let c = DataplaneConfig {
            uplink_ifindex: v4.map_or(0, |d| d.index),
            uplink_mtu: v4.map_or(0, |d| d.mtu),
            overlay6_ifindex: v6.map_or(0, |d| d.index),
            overlay6_mtu: v6.map_or(0, |d| d.mtu),
            flags: node.flags
                | CONFIG_F_WIREGUARD
                | if v4.is_some() && subnets.v4.is_some() {
                    CONFIG_F_IPV4
                } else {
                    0
                }
                | if v6.is_some() && subnets.v6.is_some() {
                    CONFIG_F_IPV6
                } else {
                    0
                },
            ..node
        };
        self.maps.set_config(&c)
    }

    /// Peers removed from the devices: out of the maps first.
    pub(crate) fn remove(&mut self, subnets: &[IpNet]) -> Result<()> {
        for s in subnets {
            if let Some(old) = self.peers.remove(s) {
                self.maps
                    .remove(&old)
                    .with_context(|| format!("removing {s} from the programs' peers"))?;
            }
        }
        Ok(())
    }

    /// Peers on the devices now: into the maps after.
    pub(crate) fn upsert(&mut self, peers: &[Peer]) -> Result<()> {
        for p in peers {
            let old = self.peers.get(&p.subnet).copied();
            if old.is_some_and(|o| o.vtep == p.vtep) {
                continue;
            }
            self.maps
                .upsert(p, old.as_ref(), false)
                .with_context(|| format!("adding {} to the programs' peers", p.subnet))?;
            self.peers.insert(p.subnet, *p);
        }
        Ok(())
    }

    /// Makes the maps hold exactly `want` (after a complete sync).
    pub(crate) fn retain(&mut self, want: &HashMap<IpNet, Peer>) -> Result<()> {
        let gone: Vec<IpNet> = self
            .peers
            .keys()
            .filter(|s| !want.contains_key(s))
            .copied()
            .collect();
        self.remove(&gone)?;
        let all: Vec<Peer> = want.values().copied().collect();
        self.upsert(&all)?;
        self.maps.rebuild_vteps(&self.peers)
    }

    /// Makes the local pods host routing reaches match the registered
    /// endpoints `want`.
    pub(crate) async fn sync_endpoints(
        &mut self,
        want: &[EndpointSpec],
        subnets: Subnets,
        not_pods: &[String],
    ) -> Result<EndpointSync> {
        let nl = Netlink::new()?;
        let scope = Scope { not_pods, subnets };
        self.endpoints
            .sync(
                want,
                &mut self.endpoint_map,
                &mut self.loaded,
                &self.pins,
                &nl,
                &scope,
            )
            .await
    }

    /// Attaches the programs again where they went (a device recreated, a
    /// link removed); returns whether any was.
    pub(crate) fn heal(&mut self, devices: &[FastDevice]) -> Result<bool> {
        let mut healed = false;
        for d in devices {
            let a = Attachment {
                program: program_names::FROM_WG,
                iface: d.name.to_string(),
                hook: Hook::TcIngress,
                xdp_mode: None,
                adopted: false,
            };
            if !self.loaded.is_attached(&a)? {
                self.loaded
                    .attach_tc(program_names::FROM_WG, d.name, Hook::TcIngress)?;
                healed = true;
            }
        }
        if self.host_routing != HostRouting::Legacy && self.endpoints.heal(&mut self.loaded) > 0 {
            healed = true;
        }
        Ok(healed)
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub(crate) fn liberal(&self) -> Arc<conntrack::LiberalStats> {
        self.liberal.clone()
    }

    pub(crate) fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }
}
