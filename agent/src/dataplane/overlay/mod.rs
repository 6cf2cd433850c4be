//! The node's overlay: the overlay devices ([`devices`]), the peer table
//! and its routes ([`peers`]), the programs ([`programs`]), and the host
//! settings they need, composed here. One API for the lease watch to drive
//! (`apply_batch`, `upsert`), idempotent setup that adopts what an earlier
//! run left in place, and a `heal` that puts back what something else
//! removed.
//!
//! Layout on a dual-stack node (VNI 1, subnets 10.244.3.0/24 and
//! fd00:10:244:3::/64, uplink eth0):
//!
//! ```text
//!  pod ─ veth ─ cni0 ─ routing ─┬─ weft.1    (10.244.3.0/32, MTU eth0-50; a veth pair)
//!                               │    TC egress: weft_encap ─► redirect_neigh ─► eth0 ─► wire
//!                               └─ weft-v6.1 (fd00:10:244:3::/128, MTU eth0-70; vxlan, external)
//!                                    TC egress: weft_encap6 (tunnel key) ─► vxlan ─► eth0 ─► wire
//!  wire ─► eth0 XDP: weft_decap (either outer family; strip, XDP_PASS) ─► routing ─► cni0 ─► pod
//! ```
//!
//! Routes `10.244.7.0/24 dev weft.1 src 10.244.3.0 proto 44` (IPv6:
//! `fd00:10:244:7::/64 dev weft-v6.1 proto 44`) send remote-subnet traffic
//! (pods' and the node's own) into the overlay, whose MTU makes the kernel
//! answer oversized packets with ICMP before the program sees them.

mod backend;
mod devices;
mod peers;
mod programs;
mod swap_check;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use anyhow::Result;
use ipnet::IpNet;

pub use peers::{Problem, ProblemKind};

use self::{
    devices::{Devices, all_device_names},
    peers::{PeerTable, Routing},
    programs::Programs,
};
use crate::dataplane::endpoints::EndpointSpec;
use crate::dataplane::endpoints::EndpointSync;
use crate::dataplane::endpoints::Endpoints;
use crate::dataplane::endpoints::Scope;
use crate::dataplane::host;
use crate::dataplane::maps::Counters;
use crate::dataplane::maps::EndpointMap;
use crate::dataplane::maps::PathMtuMap;
use crate::dataplane::maps::PeerMaps;
use crate::dataplane::netfilter;
use crate::dataplane::netfilter::NetfilterSpec;
use crate::dataplane::programs::generations;
use crate::dataplane::programs::loader;
use crate::dataplane::programs::loader::Attachment;
use crate::dataplane::teardown::teardown;
use crate::dataplane::types::DataplaneSpec;
use crate::dataplane::types::DecapChoice;
use crate::dataplane::types::DecapHook;
use crate::dataplane::types::Family;
use crate::dataplane::types::HostRouting;
use crate::dataplane::types::Peer;
use crate::dataplane::types::PeerUpdate;
use crate::dataplane::{conntrack, marker};
use crate::lease::Subnets;
use crate::sys::bpffs_hold::BpffsHold;
use crate::sys::netlink::Netlink;

/// The eBPF datapath on one node.
pub(crate) struct Overlay {
    spec: DataplaneSpec,
    subnets: Subnets,
    nl: Netlink,
    devices: Devices,
    table: PeerTable,
    programs: Programs,
    counters: Arc<Counters>,
    endpoint_map: EndpointMap,
    /// Measured path MTUs for the programs (per-peer path MTU on).
    path_map: Option<PathMtuMap>,
    endpoints: Endpoints,
    /// Makes fast-path TCP flows liberal in conntrack when the programs ask
    /// (`--host-routing auto`); stopped with the overlay.
    _marker: Option<marker::Marker>,
    liberal: Arc<conntrack::LiberalStats>,
    /// The pin directory, held open (see [`BpffsHold`]).
    bpffs: Option<BpffsHold>,
}

/// The programs in use and how they came to be (see [`Overlay::generation`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProgramsState {
    /// Self-test cases this build's programs were run through.
    pub selftest_cases: usize,
    /// The cases they failed (`program: case: why`).
    pub selftest_failed: Vec<String>,
    /// They failed, and the programs that ran before this agent still run.
    pub upgrade_refused: bool,
    /// `weft rollback` put the previous generation back since, or the
    /// agent did.
    pub rolled_back: bool,
    /// Why the agent rolled back itself.
    pub rollback_reason: Option<String>,
    /// The programs in the links have reached the peers.
    pub verified: bool,
    /// The programs attaches use, by name: their kernel ids.
    pub ids: std::collections::BTreeMap<String, u32>,
}

/// Whether the programs reach the sampled peers `targets` (see
/// [`swap_check::reach`]).
pub(crate) fn check_reach(
    targets: &[(std::net::IpAddr, std::net::IpAddr)],
) -> Result<usize, String> {
    swap_check::reach(targets)
}

/// What a check of the programs in the links found (see
/// [`Overlay::verify`]).
#[derive(Debug)]
pub(crate) enum Verified {
    /// They reached this many of the sampled peers.
    Reached(usize),
    /// They did not (why); the verified previous generation is back.
    RolledBack(String),
    /// They did not (why), and there is nothing verified to roll back to.
    Lost(String),
}

/// What one pass of [`Overlay::heal`] did.
#[derive(Debug, Default)]
pub(crate) struct Healed {
    /// What was found missing and put back (`bpffs`, `device`, `address`,
    /// `programs`, `routes`, `sysctls`, `nftables`, `forward_rules`).
    pub repairs: Vec<&'static str>,
    /// The overlay MTU changed (it follows the uplink's).
    pub mtu_changed: bool,
}

/// Borrows what routing needs from an overlay's fields (a macro, so that
/// the peer table can be borrowed mutably beside it).
macro_rules! routing {
    ($o:expr) => {
        Routing {
            nl: &$o.nl,
            devices: &$o.devices,
            subnets: $o.subnets,
            direct_routing: $o.spec.direct_routing,
        }
    };
}

impl Overlay {
    /// Sets up (or converges) everything around our `subnets`; adopts
    /// pinned programs and maps from an earlier run without detaching them.
    ///
    /// A failure leaves the node as it was: a node that had no Weft
    /// dataplane has nothing left behind; one that had a running dataplane
    /// keeps it (still forwarding with the programs it had).
    pub(crate) async fn setup(spec: &DataplaneSpec, subnets: Subnets) -> Result<Self> {
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

    async fn setup_inner(spec: DataplaneSpec, subnets: Subnets) -> Result<Self> {
        let nl = Netlink::new()?;
        let devices = Devices::setup(&nl, &spec, subnets).await?;
        host::apply(&spec.uplink, &spec.state_dir, subnets.v6.is_some())?;
        if programs::tries_xdp(&spec, &devices.uplink) {
            match crate::sys::ethtool::ensure_gro(&spec.uplink) {
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
        let (programs, replaced) = Programs::load(&spec, adopting)?;
        spec.pins.announce(&spec.state_dir)?;
        let mut maps = PeerMaps::open(&spec.pins)?;
        programs::carry_over(&mut maps, replaced);
        let mut table = PeerTable::adopt(maps)?;
        // Paths measured before a restart stay in use until measured again.
        let path_map = if spec.path_mtu {
            let m = PathMtuMap::open(&spec.pins)?;
            table.set_path_mtu(true, m.all()?);
            Some(m)
        } else {
            None
        };
        let mut o = Self {
            path_map,
            endpoint_map: EndpointMap::open(&spec.pins)?,
            counters: Arc::new(Counters::open(&spec.pins)?),
            spec,
            subnets,
            nl,
            devices,
            table,
            programs,
            endpoints: Endpoints::default(),
            _marker: None,
            liberal: Arc::default(),
            bpffs: None,
        };
        // Held from now on: an unmount under the agent loses no pin.
        o.bpffs = Some(BpffsHold::new(&o.spec.pins)?);
        netfilter::apply(&o.netfilter())?;
        o.write_config()?;
        // New programs going into running links: which peers answer
        // through the ones there now.
        let swapping = adopting && !o.programs.gate.kept_running;
        let answered = if swapping {
            let peers = o.table.peers();
            loader::off_runtime(move || swap_check::before(peers.values()))
        } else {
            Vec::new()
        };
        o.programs.attach(&o.spec, &o.devices)?;
        // Only now may frames be left to the kernel's vxlan device.
        o.write_config()?;
        if !answered.is_empty() {
            let before = answered.clone();
            match loader::off_runtime(move || swap_check::after(&before, swap_check::GRACE)) {
                Ok(n) => {
                    tracing::info!(
                        answered = n,
                        before = answered.len(),
                        "the new programs reach the peers that answered before the swap"
                    );
                    o.programs.verified()?;
                }
                Err(why) => {
                    tracing::error!(%why, "the new programs lose peers: rolling back to the programs that ran before");
                    o.programs.roll_back(why)?;
                    // They answered before the swap.
                    o.programs.verified()?;
                }
            }
        } else if o.programs.gate.kept_running {
            o.programs.verified = generations::current_verified(&o.spec.pins);
        }
        // Otherwise nothing answered before (broken programs in the links,
        // or none: a reboot): the agent checks once its peer table is
        // complete (see `verify`).
        o.programs.log(o.spec.host_routing);
        if o.spec.host_routing == HostRouting::Auto && o.programs.has_conntrack() {
            o._marker = Some(marker::spawn_marker(&o.spec.pins, o.liberal.clone())?);
        }
        loader::remove_other_versions(&o.spec.pins)?;
        if adopting {
            tracing::info!(
                peers = o.table.peers().len(),
                "adopted the pinned dataplane of an earlier run"
            );
        }
        o.programs.start_trace()?;
        o.table.reconcile_routes(&routing!(o)).await?;
        Ok(o)
    }

    /// What netfilter should hold.
    fn netfilter(&self) -> NetfilterSpec {
        NetfilterSpec {
            network: self.spec.network,
            subnet: self.subnets.v4,
            network6: self.spec.network6,
            subnet6: self.subnets.v6,
            // The gate asks conntrack: make sure it tracks here.
            track: self.spec.host_routing == HostRouting::Auto && self.programs.has_conntrack(),
            masquerade: self.spec.masquerade,
            forward_rules: self.spec.forward_rules,
            clamp_mss: self.spec.path_mtu,
        }
    }

    /// Writes the programs' config (also when the drop trace is switched).
    pub(crate) fn write_config(&mut self) -> Result<()> {
        let c = programs::config(
            &self.spec,
            &self.subnets,
            &self.devices,
            self.programs.has_conntrack(),
            self.kernel_rx(),
        );
        self.table.maps.set_config(&c)
    }

    /// Whether the kernel's vxlan device may decapsulate: it is up and
    /// `weft_tunnel_rx` checks what comes out of it.
    fn kernel_rx(&self) -> bool {
        self.devices.kernel_rx().is_some_and(|d| {
            self.programs.attachments.iter().any(|a| {
                a.iface == d.name && a.program == dataplane_common::program_names::TUNNEL_RX
            })
        })
    }

    /// The agent is stopping: the receive device of a node without IPv6
    /// gives its UDP port back (so flannel's device can take it when a node
    /// moves back), and TC strips every frame itself until an agent runs
    /// again. Nothing else changes: the dataplane stays.
    pub(crate) async fn release_port(&mut self) -> Result<()> {
        let Some(index) = self.devices.stand_down_receive() else {
            return Ok(());
        };
        self.write_config()?;
        // Frames already passed on reach the device before it goes.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        self.nl.set_down(index).await
    }

    /// The pods' MTU: the smallest of the overlay devices' (IPv6 needs 20
    /// bytes more than IPv4, and one pod interface carries both).
    pub(crate) fn mtu(&self) -> u32 {
        self.devices.pods_mtu(&self.spec, &self.subnets)
    }

    /// The largest outer packet a path can be measured at (the uplink's
    /// MTU), where per-peer path MTU is on.
    pub(crate) fn path_mtu_ceiling(&self) -> Option<u32> {
        self.spec.path_mtu.then_some(self.devices.uplink.mtu)
    }

    /// Paths measured (or lost): each VTEP's MTU goes to the programs
    /// and the routes of its subnets. A route that cannot be changed is
    /// retried as a route problem.
    pub(crate) async fn set_path_mtus(
        &mut self,
        changes: &[(std::net::Ipv4Addr, Option<u32>)],
    ) -> Result<()> {
        let Some(map) = &mut self.path_map else {
            return Ok(());
        };
        let mut peers = Vec::new();
        for (vtep, mtu) in changes {
            map.set(*vtep, *mtu)?;
            peers.extend(self.table.set_path(*vtep, *mtu));
        }
        let r = routing!(self);
        self.table.install_routes(&r, &peers).await
    }

    /// The subnets of the peers reached without encapsulation.
    pub(crate) fn direct(&self) -> &HashSet<IpNet> {
        self.table.direct()
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// What the marking of fast-path flows as liberal did.
    pub(crate) fn liberal(&self) -> Arc<conntrack::LiberalStats> {
        self.liberal.clone()
    }

    /// The peers to reach before the programs in the links count as
    /// verified: None when they are (or the check is not for now); empty
    /// when there are no peers.
    pub(crate) fn unverified_targets(&self) -> Option<Vec<(std::net::IpAddr, std::net::IpAddr)>> {
        (!self.programs.verified).then(|| swap_check::sample(self.table.peers().values()))
    }

    /// What the check of the programs in the links found (see
    /// [`Self::unverified_targets`]): reached, they are marked verified;
    /// not, the previous generation is put back where it is verified (and
    /// checked in turn), else they stay unverified and the node not ready.
    /// With no peer up to ask, the node may be ready, but the generation is
    /// not marked: the next start checks it again.
    pub(crate) fn verify(&mut self, checked: Result<usize, String>) -> Result<Verified> {
        match checked {
            Ok(0) => {
                self.programs.verified = true;
                Ok(Verified::Reached(0))
            }
            Ok(n) => {
                self.programs.verified()?;
                Ok(Verified::Reached(n))
            }
            Err(why) if self.programs.can_roll_back() => {
                self.programs.roll_back(why.clone())?;
                Ok(Verified::RolledBack(why))
            }
            Err(why) => Ok(Verified::Lost(why)),
        }
    }

    /// What the self-test said of this build's programs, whether the
    /// earlier ones were kept or rolled back to, and the ids in use.
    pub(crate) fn generation(&self) -> ProgramsState {
        ProgramsState {
            selftest_cases: self.programs.gate.cases,
            selftest_failed: self.programs.gate.failed.clone(),
            upgrade_refused: self.programs.gate.kept_running,
            rolled_back: self.programs.rolled_back,
            rollback_reason: self.programs.rollback_reason.clone(),
            verified: self.programs.verified,
            ids: self.programs.loaded.active_ids().into_iter().collect(),
        }
    }

    pub(crate) fn attachments(&self) -> &[Attachment] {
        &self.programs.attachments
    }

    pub(crate) fn peers(&self) -> &HashMap<IpNet, Peer> {
        self.table.peers()
    }

    /// Where decapsulation runs, and why; with TC, who strips what takes
    /// the host stack.
    pub(crate) fn decap(&self) -> DecapChoice {
        let mut d = self.programs.decap.clone();
        if d.hook == DecapHook::Tc {
            match self.devices.kernel_rx() {
                Some(dev) if self.kernel_rx() => d.why.push_str(&format!(
                    "; frames for the host stack are decapsulated by the kernel's vxlan device {}",
                    dev.name
                )),
                _ => d.why.push_str(
                    "; no vxlan device of Weft's holds the port: TC strips every frame (slower on the host stack)",
                ),
            }
        }
        d
    }

    /// Peers not (fully) programmed.
    pub(crate) fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.table.problems()
    }

    /// Makes the local pods host routing reaches match the registered
    /// endpoints `want`.
    pub(crate) async fn sync_endpoints(&mut self, want: &[EndpointSpec]) -> Result<EndpointSync> {
        let mut not_pods = all_device_names(self.spec.vni).to_vec();
        not_pods.push(self.spec.uplink.clone());
        let scope = Scope {
            not_pods: &not_pods,
            subnets: self.subnets,
        };
        self.endpoints
            .sync(
                want,
                &mut self.endpoint_map,
                &mut self.programs.loaded,
                &self.spec.pins,
                &self.nl,
                &scope,
            )
            .await
    }

    /// Our own subnets changed (the lease was lost and re-acquired).
    pub(crate) async fn set_subnet(&mut self, subnets: Subnets) -> Result<()> {
        if subnets == self.subnets {
            return Ok(());
        }
        self.subnets = subnets;
        self.devices.set_subnets(&self.nl, &subnets).await?;
        netfilter::apply(&self.netfilter())?;
        // Routes carry the device's address as their source: rewrite them.
        self.table.reroute(&routing!(self)).await
    }

    /// Applies many updates at once (see [`PeerTable`]): a peer that cannot
    /// be programmed is recorded as a problem and retried; it never stops
    /// the others.
    pub(crate) async fn apply_batch(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        self.table.apply(&routing!(self), updates).await
    }

    /// Tries again the peers whose retry time has come.
    pub(crate) async fn retry_problems(&mut self) -> Result<()> {
        self.table.retry(&routing!(self)).await
    }

    /// Removes every peer not in `keep` (after adopting a pinned map, for
    /// leases that vanished while the agent was away).
    pub(crate) async fn retain(&mut self, keep: &HashSet<IpNet>) -> Result<usize> {
        Ok(self.table.retain(&routing!(self), keep).await)
    }

    /// Checks everything the datapath relies on and puts back what
    /// something else removed: the overlay devices (up, no ARP, their MAC
    /// and MTU), their addresses, the attached programs, the sysctls,
    /// Weft's routes and its netfilter rules. Also follows the uplink's
    /// MTU. Cheap when nothing is missing (a few netlink requests), so it
    /// runs every few seconds and whenever rtnetlink reports a change.
    pub(crate) async fn heal(&mut self) -> Result<Healed> {
        let mut h = Healed::default();
        // The pins first: the programs' and endpoints' checks use them.
        if let Some(b) = &mut self.bpffs
            && matches!(b.heal(), Ok(true))
        {
            h.repairs.push("bpffs");
        }
        let pods_mtu = self.mtu();
        let dh = self
            .devices
            .heal(&self.nl, &self.spec, &self.subnets)
            .await?;
        if self.mtu() != pods_mtu {
            tracing::info!(from = pods_mtu, to = self.mtu(), "the overlay MTU follows");
            h.mtu_changed = true;
        }
        h.repairs.extend(dh.repairs);
        // Peers waiting for a device that is back get their routes now.
        for family in dh.converged {
            self.table
                .retry_now(|pr| Family::of(pr.peer.subnet.addr()) == family);
        }
        // The config names the devices and MTUs: keep it current.
        self.write_config()?;

        if self
            .programs
            .heal(&self.spec, &self.devices, dh.recreated)?
        {
            h.repairs.push("programs");
            self.write_config()?;
        }
        if self.spec.host_routing != HostRouting::Legacy
            && self.endpoints.heal(&mut self.programs.loaded) > 0
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
        if self.table.heal_routes(&routing!(self)).await? {
            h.repairs.push("routes");
        }
        h.repairs.extend(netfilter::heal(&self.netfilter())?);
        Ok(h)
    }
}
