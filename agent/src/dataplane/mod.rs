//! The dataplane: the eBPF programs and their maps, the host configuration
//! they rely on, and the one seam the agent drives them through.
//!
//! The seam is [`Dataplane`], built from a [`DataplaneSpec`] (uplink, VNI,
//! port, VTEP MAC, hook choice) or a WireGuard spec, holding one backend
//! behind [`backend::Backend`] (the VXLAN overlay, WireGuard, or none), and
//! told three things: our subnet
//! ([`Dataplane::set_subnet`]), peer changes ([`Dataplane::apply`]), and
//! that the peer set is complete ([`Dataplane::synced`]). Of leases it
//! knows only the node's subnets (`lease::Subnets`); of the command line,
//! only that `XdpMode` and `HostRouting` are its values (`clap::ValueEnum`).

mod backend;
mod backend_switch;
mod config;
mod conntrack;
mod endpoints;
mod host;
mod maps;
mod marker;
mod names;
mod netfilter;
pub(crate) mod netkit;
mod overlay;
pub(crate) mod programs;
mod teardown;
pub(crate) mod trace;
pub(crate) mod types;
pub mod wireguard;

use std::{collections::HashSet, sync::Arc};

use anyhow::Result;
use ipnet::IpNet;

pub use crate::sys::bpffs::{DEFAULT_DIR as DEFAULT_PIN_DIR, PinDir, is_bpffs};
pub(crate) use endpoints::pod_ifs;
pub use endpoints::{EndpointSpec, EndpointSync};
pub use maps::{Counters, EndpointMap, PeerMaps};
pub(crate) use names::{device_name, device6_name};
pub(crate) use overlay::{Healed, Overlay, ProgramsState, Verified};
pub use programs::kernel::ProgramKernel;
pub use programs::links::{Hook, detach, ifindex};
pub use programs::loader::{Attachment, LoadOptions, Loaded};
pub use types::{DataplaneSpec, HostRouting, Peer, PeerUpdate, XdpMode};
pub(crate) use types::{DecapChoice, DecapHook, Family};

pub(crate) use crate::sys::netlink::events::watch as watch_changes;
pub(crate) use crate::sys::netlink::{Link, Netlink};
pub(crate) use crate::sys::sysctl::{read as read_sysctl, read_iface as read_iface_sysctl};
pub(crate) use conntrack::LiberalStats;
pub use overlay::{Problem, ProblemKind};
pub use programs::generations::Swapped;
pub(crate) use programs::kernel::{KernelFeatures, names as kernel_features};
pub(crate) use programs::links::{link_pin_path, pinned_links, pinned_program};
pub(crate) use teardown::teardown;

/// Puts back the previous generation of programs (see
/// [`programs::generations::rollback`]).
pub fn rollback(pins: &PinDir) -> Result<Vec<Swapped>> {
    programs::generations::rollback(pins)
}

use self::backend::Backend;
use crate::lease::Subnets;

/// The dataplane as the agent drives it: one [`Backend`] (the VXLAN
/// overlay, WireGuard, or none at all), set up when the node first holds
/// its subnets. The seam the integration tests and benchmarks drive too.
pub struct Dataplane {
    /// What sets the backend up at the first subnets (None once it is up,
    /// and without a datapath).
    pending: Option<Pending>,
    /// The backend, once up.
    backend: Option<Box<dyn Backend>>,
    /// VXLAN's UDP port and VTEP address (what peer health probes
    /// through), kept from its spec.
    vxlan: Option<(u16, Option<std::net::Ipv4Addr>)>,
    /// Whether the peer set has been complete once: the first time, pinned
    /// peers that are not in it go (leases that vanished while the agent
    /// was away).
    first_sync_done: bool,
}

/// A backend not yet set up.
enum Pending {
    Vxlan(DataplaneSpec),
    Wireguard(wireguard::WgSpec),
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
        Self {
            pending: None,
            backend: Some(Box::new(backend::Off::default())),
            vxlan: None,
            first_sync_done: false,
        }
    }

    pub fn ebpf(spec: DataplaneSpec) -> Self {
        Self {
            vxlan: Some((spec.port, spec.public_ip)),
            pending: Some(Pending::Vxlan(spec)),
            backend: None,
            first_sync_done: false,
        }
    }

    pub fn wireguard(spec: wireguard::WgSpec) -> Self {
        Self {
            pending: Some(Pending::Wireguard(spec)),
            backend: None,
            vxlan: None,
            first_sync_done: false,
        }
    }

    /// Our subnets are (now) `subnets` (IPv4, IPv6): the first call sets
    /// the backend up around them (removing what another backend left),
    /// later calls move it to new ones.
    pub async fn set_subnet(&mut self, subnets: Subnets) -> Result<()> {
        if let Some(b) = &mut self.backend {
            return b.set_subnet(subnets).await;
        }
        let backend: Box<dyn Backend> = match &self.pending {
            None => anyhow::bail!("no backend to set up"),
            Some(Pending::Vxlan(spec)) => {
                backend_switch::remove_other(backend_switch::Backend::Vxlan, &spec.pins).await?;
                let o = Overlay::setup(spec, subnets).await?;
                tracing::info!(
                    device = %device_name(spec.vni),
                    subnet = ?subnets.v4,
                    subnet6 = ?subnets.v6,
                    peers = o.peers().len(),
                    "dataplane up"
                );
                Box::new(o)
            }
            Some(Pending::Wireguard(spec)) => {
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
                Box::new(w)
            }
        };
        self.backend = Some(backend);
        self.pending = None;
        // Loading parsed the kernel's BTF: give that back.
        crate::sys::memory::give_back();
        Ok(())
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
        let Some(b) = self.backend.as_mut() else {
            anyhow::bail!("peer update before the dataplane is up");
        };
        b.apply(updates).await
    }

    /// The updates so far add up to etcd's state at `revision`, whose
    /// peers are `peers`.
    pub(crate) async fn synced(&mut self, revision: i64, peers: &HashSet<IpNet>) -> Result<()> {
        let removed = match &mut self.backend {
            Some(b) if !self.first_sync_done => b.retain(peers).await?,
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
        self.backend.as_ref().map_or_else(Vec::new, |b| {
            b.peers().values().map(|p| (p.subnet, p.vtep)).collect()
        })
    }

    pub(crate) fn peer_count(&self) -> usize {
        self.backend.as_ref().map_or(0, |b| b.peers().len())
    }

    /// Makes host routing's local pods match the registered endpoints.
    pub async fn sync_endpoints(&mut self, want: &[EndpointSpec]) -> Result<EndpointSync> {
        match &mut self.backend {
            Some(b) => b.sync_endpoints(want).await,
            None => Ok(EndpointSync::default()),
        }
    }

    /// The programs attached, and where (once the backend is up).
    pub fn attachments(&self) -> &[Attachment] {
        self.backend.as_ref().map_or(&[], |b| b.attachments())
    }

    /// The peers to reach before the programs in the links count as
    /// verified (None: they are, or there are no programs).
    pub(crate) fn unverified_targets(&self) -> Option<Vec<(std::net::IpAddr, std::net::IpAddr)>> {
        self.backend.as_ref()?.unverified_targets()
    }

    /// Whether the programs in the links have reached the peers (always
    /// where there are no program generations).
    pub(crate) fn verified(&self) -> bool {
        self.programs().is_none_or(|p| p.verified)
    }

    /// What a check over [`Self::unverified_targets`] found.
    pub(crate) fn verify(&mut self, checked: Result<usize, String>) -> Result<overlay::Verified> {
        match &mut self.backend {
            Some(b) => b.verify(checked),
            None => Ok(overlay::Verified::Reached(0)),
        }
    }

    /// The programs in use and how they came to be (the VXLAN backend's).
    pub(crate) fn programs(&self) -> Option<ProgramsState> {
        self.backend.as_ref()?.programs()
    }

    /// Where decapsulation runs, and why (the VXLAN backend's).
    pub(crate) fn decap(&self) -> Option<DecapChoice> {
        self.backend.as_ref()?.decap()
    }

    /// Tries again the peers that could not be programmed, when their time
    /// has come.
    pub(crate) async fn retry_problems(&mut self) -> Result<()> {
        match &mut self.backend {
            Some(b) => b.retry_problems().await,
            None => Ok(()),
        }
    }

    /// Peers not (fully) programmed.
    pub fn problems(&self) -> Vec<Problem> {
        self.backend
            .as_ref()
            .map_or_else(Vec::new, |b| b.problems())
    }

    /// The agent is stopping: see [`Overlay::release_port`].
    pub(crate) async fn release_port(&mut self) {
        if let Some(b) = &mut self.backend
            && let Err(e) = b.release_port().await
        {
            tracing::warn!(error = %format!("{e:#}"), "cannot set the receive device down");
        }
    }

    /// Writes the programs' config again: the drop trace was switched.
    pub(crate) fn write_config(&mut self) -> Result<()> {
        match &mut self.backend {
            Some(b) => b.write_config(),
            None => Ok(()),
        }
    }

    /// Puts back what something else removed and follows the uplink's MTU
    /// (see [`Overlay::heal`]).
    pub(crate) async fn heal(&mut self) -> Result<Healed> {
        match &mut self.backend {
            Some(b) => b.heal().await,
            None => Ok(Healed::default()),
        }
    }

    /// The pods' MTU (the smallest overlay device's), once the backend is
    /// up.
    pub(crate) fn mtu(&self) -> Option<u32> {
        self.backend.as_ref()?.mtu()
    }

    /// The VXLAN UDP port (0 without the VXLAN backend).
    pub(crate) fn vxlan_port(&self) -> u16 {
        self.vxlan.map_or(0, |v| v.0)
    }

    /// This node's IPv4 VTEP address (the outer source of what it
    /// encapsulates), with the VXLAN backend.
    pub(crate) fn vtep4(&self) -> Option<std::net::Ipv4Addr> {
        self.vxlan.and_then(|v| v.1)
    }

    /// The uplink's MTU, where per-peer path MTU is on (see
    /// [`overlay::Overlay::path_mtu_ceiling`]).
    pub(crate) fn path_mtu_ceiling(&self) -> Option<u32> {
        self.backend.as_ref()?.path_mtu_ceiling()
    }

    /// Paths measured or lost, to the programs and routes.
    pub(crate) async fn set_path_mtus(
        &mut self,
        changes: &[(std::net::Ipv4Addr, Option<u32>)],
    ) -> Result<()> {
        match &mut self.backend {
            Some(b) => b.set_path_mtus(changes).await,
            None => Ok(()),
        }
    }

    /// The subnets of the peers reached without encapsulation.
    pub(crate) fn direct_peers(&self) -> Vec<IpNet> {
        self.backend.as_ref().map_or_else(Vec::new, |b| b.direct())
    }

    /// What the marking of fast-path flows as liberal in conntrack did,
    /// once the backend is up.
    pub(crate) fn liberal(&self) -> Option<Arc<LiberalStats>> {
        self.backend.as_ref()?.liberal()
    }

    /// The WireGuard peers as the kernel reports them (the wireguard
    /// backend, once up).
    pub(crate) fn wireguard_peers(&self) -> Option<Result<Vec<wireguard::WgPeerStats>>> {
        self.backend.as_ref()?.wireguard_peers()
    }

    /// The packet counters, once the backend is up.
    pub(crate) fn counters(&self) -> Option<Arc<Counters>> {
        self.backend.as_ref()?.counters()
    }
}
