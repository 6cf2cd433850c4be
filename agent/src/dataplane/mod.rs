//! The dataplane: the eBPF programs and their maps, the host configuration
//! they rely on, and the one seam the agent drives them through.
//!
//! The seam is [`Dataplane`], built from a [`DataplaneSpec`] (uplink, VNI,
//! port, VTEP MAC, hook choice) and told three things: our subnet
//! ([`Dataplane::set_subnet`]), peer changes ([`Dataplane::apply`]), and
//! that the peer set is complete ([`Dataplane::synced`]). Of leases it
//! knows only the node's subnets (`lease::Subnets`); of the command line,
//! only that `XdpMode` and `HostRouting` are its values (`clap::ValueEnum`).

mod backend_switch;
mod bpffs;
mod bpffs_hold;
mod btf;
mod config;
mod conntrack;
mod endpoints;
mod events;
mod generations;
mod host;
mod kernel;
mod kfuncs;
mod load_programs;
mod loader;
mod maps;
mod names;
mod netfilter;
pub(crate) mod netkit;
mod netlink;
mod nfnetlink;
mod nftables;
mod object;
mod overlay;
mod program_ids;
pub(crate) mod selftest;
mod sysctl;
mod teardown;
pub(crate) mod trace;
mod types;
pub mod wireguard;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use anyhow::Result;
use ipnet::IpNet;

pub use bpffs::{DEFAULT_DIR as DEFAULT_PIN_DIR, PinDir, is_bpffs};
pub(crate) use endpoints::pod_ifs;
pub use endpoints::{EndpointSpec, EndpointSync};
pub use kernel::ProgramKernel;
pub use loader::{Attachment, Hook, LoadOptions, Loaded, detach, ifindex};
pub use maps::{Counters, EndpointMap, PeerMaps};
pub(crate) use names::{device_name, device6_name};
pub(crate) use overlay::{Healed, Overlay, ProgramsState, Verified};
pub use types::{DataplaneSpec, HostRouting, Peer, PeerUpdate, XdpMode};
pub(crate) use types::{DecapChoice, DecapHook, Family};

pub(crate) use conntrack::LiberalStats;
pub(crate) use events::watch as watch_changes;
pub use generations::Swapped;
pub(crate) use kernel::{KernelFeatures, names as kernel_features};
pub(crate) use loader::{link_pin_path, pinned_links, pinned_program};
pub(crate) use netlink::{Link, Netlink};
pub use overlay::{Problem, ProblemKind};
pub(crate) use sysctl::{read as read_sysctl, read_iface as read_iface_sysctl};
pub(crate) use teardown::teardown;

/// Puts back the previous generation of programs (see
/// [`generations::rollback`]).
pub fn rollback(pins: &PinDir) -> Result<Vec<Swapped>> {
    generations::rollback(pins)
}

use crate::lease::Subnets;

/// The dataplane as the agent drives it: the eBPF datapath, or none at all
/// (control plane only: the peer table is kept and logged). The seam the
/// integration tests and benchmarks drive too.
pub struct Dataplane {
    kind: Kind,
    /// Whether the peer set has been complete once: the first time, pinned
    /// peers that are not in it go (leases that vanished while the agent
    /// was away).
    first_sync_done: bool,
}

enum Kind {
    Off {
        peers: HashMap<IpNet, Peer>,
    },
    Ebpf {
        spec: DataplaneSpec,
        overlay: Option<Box<Overlay>>,
    },
    /// The wireguard backend: the kernel's WireGuard devices.
    Wireguard {
        spec: wireguard::WgSpec,
        wg: Option<Box<wireguard::WgOverlay>>,
    },
}

/// Whether at least half of the sampled peers `targets` (overlay address,
/// VTEP) that are up answer through the tunnel within the grace a swap
/// gets (blocking; see [`Dataplane::unverified_targets`]).
pub(crate) fn check_reach(
    targets: &[(std::net::IpAddr, std::net::IpAddr)],
) -> Result<usize, String> {
    overlay::check_reach(targets)
}

impl Dataplane {
    pub(crate) fn off() -> Self {
        Self::with(Kind::Off {
            peers: HashMap::new(),
        })
    }

    pub fn ebpf(spec: DataplaneSpec) -> Self {
        Self::with(Kind::Ebpf {
            spec,
            overlay: None,
        })
    }

    pub fn wireguard(spec: wireguard::WgSpec) -> Self {
        Self::with(Kind::Wireguard { spec, wg: None })
    }

    fn with(kind: Kind) -> Self {
        Self {
            kind,
            first_sync_done: false,
        }
    }

    /// Our subnets are (now) `subnets` (IPv4, IPv6): the first call sets
    /// the dataplane up around them, later calls move it to new ones.
    pub async fn set_subnet(&mut self, subnets: Subnets) -> Result<()> {
        match &mut self.kind {
            Kind::Off { .. } => {
                tracing::debug!(?subnets, "own subnets (no datapath)");
                Ok(())
            }
            Kind::Ebpf { spec, overlay } => match overlay {
                Some(o) => o.set_subnet(subnets).await,
                None => {
                    backend_switch::remove_other(backend_switch::Backend::Vxlan, &spec.pins)
                        .await?;
                    let o = Overlay::setup(spec, subnets).await?;
                    tracing::info!(
                        device = %device_name(spec.vni),
                        subnet = ?subnets.v4,
                        subnet6 = ?subnets.v6,
                        peers = o.peers().len(),
                        "dataplane up"
                    );
                    *overlay = Some(Box::new(o));
                    // Loading parsed the kernel's BTF: give that back.
                    crate::sys::memory::give_back();
                    Ok(())
                }
            },
            Kind::Wireguard { spec, wg } => match wg {
                Some(w) => w.set_subnet(subnets).await,
                None => {
                    backend_switch::remove_other(backend_switch::Backend::Wireguard, &spec.pins)
                        .await?;
                    let w = wireguard::WgOverlay::setup(spec.clone(), subnets).await?;
                    tracing::info!(
                        devices = ?w.devices(),
                        public_key = %w.public_key(),
                        subnet = ?subnets.v4,
                        subnet6 = ?subnets.v6,
                        "dataplane up (wireguard)"
                    );
                    *wg = Some(Box::new(w));
                    Ok(())
                }
            },
        }
    }

    /// Applies peer updates, in order.
    pub async fn apply(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    tracing::debug!(subnet = %p.subnet, vtep = %p.vtep, mac = %p.mac, "peer");
                }
                PeerUpdate::Remove(s) => tracing::debug!(subnet = %s, "peer removed"),
            }
        }
        match &mut self.kind {
            Kind::Off { peers } => {
                for u in updates {
                    match u {
                        PeerUpdate::Upsert(p) => {
                            peers.insert(p.subnet, *p);
                        }
                        PeerUpdate::Remove(s) => {
                            peers.remove(s);
                        }
                    }
                }
                Ok(())
            }
            Kind::Ebpf { overlay, .. } => {
                let Some(o) = overlay.as_mut() else {
                    anyhow::bail!("peer update before the dataplane is up");
                };
                o.apply_batch(updates).await
            }
            Kind::Wireguard { wg, .. } => {
                let Some(w) = wg.as_mut() else {
                    anyhow::bail!("peer update before the dataplane is up");
                };
                w.apply_batch(updates).await
            }
        }
    }

    /// The updates so far add up to etcd's state at `revision`, whose
    /// peers are `peers`.
    pub(crate) async fn synced(&mut self, revision: i64, peers: &HashSet<IpNet>) -> Result<()> {
        let removed = match &mut self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } if !self.first_sync_done => o.retain(peers).await?,
            Kind::Wireguard { wg: Some(w), .. } if !self.first_sync_done => w.retain(peers).await?,
            _ => 0,
        };
        if removed > 0 {
            tracing::info!(
                removed,
                "removed peers whose leases vanished while the agent was away"
            );
        }
        if !self.first_sync_done {
            // The first sync decoded and programmed every lease at once.
            crate::sys::memory::give_back();
        }
        self.first_sync_done = true;
        tracing::debug!(
            revision,
            peers = self.peer_count(),
            "peer table in step with etcd"
        );
        Ok(())
    }

    /// Each peer's subnet and VTEP (what continuous peer health probes).
    pub(crate) fn peer_targets(&self) -> Vec<(IpNet, std::net::IpAddr)> {
        match &self.kind {
            Kind::Off { peers } => peers.values().map(|p| (p.subnet, p.vtep)).collect(),
            Kind::Ebpf { overlay, .. } => overlay.as_ref().map_or_else(Vec::new, |o| {
                o.peers().values().map(|p| (p.subnet, p.vtep)).collect()
            }),
            Kind::Wireguard { wg, .. } => wg.as_ref().map_or_else(Vec::new, |w| {
                w.peers().values().map(|p| (p.subnet, p.vtep)).collect()
            }),
        }
    }

    pub(crate) fn peer_count(&self) -> usize {
        match &self.kind {
            Kind::Off { peers } => peers.len(),
            Kind::Ebpf { overlay, .. } => overlay.as_ref().map_or(0, |o| o.peers().len()),
            Kind::Wireguard { wg, .. } => wg.as_ref().map_or(0, |w| w.peers().len()),
        }
    }

    /// Makes host routing's local pods match the registered endpoints.
    pub async fn sync_endpoints(&mut self, want: &[EndpointSpec]) -> Result<EndpointSync> {
        match &mut self.kind {
            Kind::Ebpf {
                spec,
                overlay: Some(o),
            } if spec.host_routing != HostRouting::Legacy => o.sync_endpoints(want).await,
            Kind::Wireguard { wg: Some(w), .. } => w.sync_endpoints(want).await,
            _ => Ok(EndpointSync::default()),
        }
    }

    /// The programs attached, and where (once the eBPF dataplane is up).
    pub fn attachments(&self) -> &[Attachment] {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.attachments(),
            Kind::Wireguard { wg: Some(w), .. } => w.attachments(),
            _ => &[],
        }
    }

    /// The peers to reach before the programs in the links count as
    /// verified (None: they are, or there are no programs).
    pub(crate) fn unverified_targets(&self) -> Option<Vec<(std::net::IpAddr, std::net::IpAddr)>> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.unverified_targets(),
            _ => None,
        }
    }

    /// Whether the programs in the links have reached the peers (always
    /// where there are no program generations).
    pub(crate) fn verified(&self) -> bool {
        self.programs().is_none_or(|p| p.verified)
    }

    /// What a check over [`Self::unverified_targets`] found.
    pub(crate) fn verify(&mut self, checked: Result<usize, String>) -> Result<overlay::Verified> {
        match &mut self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.verify(checked),
            _ => Ok(overlay::Verified::Reached(0)),
        }
    }

    /// The programs in use and how they came to be (once the eBPF
    /// dataplane is up).
    pub(crate) fn programs(&self) -> Option<ProgramsState> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => Some(o.generation()),
            _ => None,
        }
    }

    /// Where decapsulation runs, and why (once the eBPF dataplane is up).
    pub(crate) fn decap(&self) -> Option<DecapChoice> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => Some(o.decap()),
            _ => None,
        }
    }

    /// Tries again the peers that could not be programmed, when their time
    /// has come.
    pub(crate) async fn retry_problems(&mut self) -> Result<()> {
        match &mut self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.retry_problems().await,
            _ => Ok(()),
        }
    }

    /// Peers not (fully) programmed.
    pub fn problems(&self) -> Vec<Problem> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.problems().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// The agent is stopping: see [`Overlay::release_port`].
    pub(crate) async fn release_port(&mut self) {
        if let Kind::Ebpf {
            overlay: Some(o), ..
        } = &mut self.kind
            && let Err(e) = o.release_port().await
        {
            tracing::warn!(error = %format!("{e:#}"), "cannot set the receive device down");
        }
    }

    /// Writes the programs' config again: the drop trace was switched.
    pub(crate) fn write_config(&mut self) -> Result<()> {
        match &mut self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.write_config(),
            Kind::Wireguard { wg: Some(w), .. } => w.write_config(),
            _ => Ok(()),
        }
    }

    /// Puts back what something else removed and follows the uplink's MTU
    /// (see [`Overlay::heal`]).
    pub(crate) async fn heal(&mut self) -> Result<Healed> {
        match &mut self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.heal().await,
            Kind::Wireguard { wg: Some(w), .. } => w.heal().await,
            _ => Ok(Healed::default()),
        }
    }

    /// The pods' MTU (the smallest overlay device's), once the eBPF
    /// dataplane is up.
    pub(crate) fn mtu(&self) -> Option<u32> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => Some(o.mtu()),
            Kind::Wireguard { wg: Some(w), .. } => Some(w.mtu()),
            _ => None,
        }
    }

    /// The VXLAN UDP port (0 without the eBPF datapath).
    pub(crate) fn vxlan_port(&self) -> u16 {
        match &self.kind {
            Kind::Ebpf { spec, .. } => spec.port,
            Kind::Off { .. } | Kind::Wireguard { .. } => 0,
        }
    }

    /// This node's IPv4 VTEP address (the outer source of what it
    /// encapsulates), with the VXLAN datapath.
    pub(crate) fn vtep4(&self) -> Option<std::net::Ipv4Addr> {
        match &self.kind {
            Kind::Ebpf { spec, .. } => spec.public_ip,
            Kind::Off { .. } | Kind::Wireguard { .. } => None,
        }
    }

    /// The uplink's MTU, where per-peer path MTU is on (see
    /// [`overlay::Overlay::path_mtu_ceiling`]).
    pub(crate) fn path_mtu_ceiling(&self) -> Option<u32> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.path_mtu_ceiling(),
            _ => None,
        }
    }

    /// Paths measured or lost, to the programs and routes.
    pub(crate) async fn set_path_mtus(
        &mut self,
        changes: &[(std::net::Ipv4Addr, Option<u32>)],
    ) -> Result<()> {
        match &mut self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => o.set_path_mtus(changes).await,
            _ => Ok(()),
        }
    }

    /// The subnets of the peers reached without encapsulation.
    pub(crate) fn direct_peers(&self) -> Vec<IpNet> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => {
                let mut v: Vec<IpNet> = o.direct().iter().copied().collect();
                v.sort();
                v
            }
            _ => Vec::new(),
        }
    }

    /// What the marking of fast-path flows as liberal in conntrack did,
    /// once the eBPF dataplane is up.
    pub(crate) fn liberal(&self) -> Option<Arc<LiberalStats>> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => Some(o.liberal()),
            Kind::Wireguard { wg: Some(w), .. } => w.liberal(),
            _ => None,
        }
    }

    /// The WireGuard peers as the kernel reports them (the wireguard
    /// backend, once up).
    pub(crate) fn wireguard_peers(&self) -> Option<Result<Vec<wireguard::WgPeerStats>>> {
        match &self.kind {
            Kind::Wireguard { wg: Some(w), .. } => Some(w.stats()),
            _ => None,
        }
    }

    /// The packet counters, once the eBPF dataplane is up.
    pub(crate) fn counters(&self) -> Option<Arc<Counters>> {
        match &self.kind {
            Kind::Ebpf {
                overlay: Some(o), ..
            } => Some(o.counters()),
            Kind::Wireguard { wg: Some(w), .. } => w.counters(),
            _ => None,
        }
    }
}
