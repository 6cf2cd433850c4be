//! The boundary every backend sits behind: the VXLAN overlay
//! ([`super::Overlay`], eBPF encapsulation), the kernel's WireGuard
//! devices ([`super::wireguard::WgOverlay`]), and none at all ([`Off`]: the
//! peer table kept, nothing forwarded). [`super::Dataplane`] holds one, made
//! when the node first holds its subnets; the agent, the integration tests
//! and the benchmarks see only the dataplane.
//!
//! What only one backend has (the programs' generations and their check,
//! decapsulation's hook, per-peer path MTU, peers retried with backoff,
//! WireGuard's peer statistics) has a default that says "none here".

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use anyhow::Result;
use futures::future::LocalBoxFuture;
use ipnet::IpNet;

use super::{
    Attachment, Counters, DecapChoice, EndpointSpec, EndpointSync, Healed, LiberalStats, Peer,
    PeerUpdate, Problem, ProgramsState, Verified, wireguard::WgPeerStats,
};
use crate::lease::Subnets;

/// A future of a backend's that borrows it.
pub(crate) type Op<'a, T> = LocalBoxFuture<'a, Result<T>>;

/// A backend, once up around this node's subnets.
pub(crate) trait Backend: Send {
    /// Our subnets moved (a lease lost and acquired again).
    fn set_subnet(&mut self, subnets: Subnets) -> Op<'_, ()>;
    /// Peer updates, in order.
    fn apply<'a>(&'a mut self, updates: &'a [PeerUpdate]) -> Op<'a, ()>;
    /// Removes the peers not in `keep` (leases that vanished while the
    /// agent was away); how many went.
    fn retain<'a>(&'a mut self, keep: &'a HashSet<IpNet>) -> Op<'a, usize>;
    /// The peers programmed.
    fn peers(&self) -> &HashMap<IpNet, Peer>;
    /// Makes host routing's local pods match the registered endpoints.
    fn sync_endpoints<'a>(&'a mut self, want: &'a [EndpointSpec]) -> Op<'a, EndpointSync>;
    /// Puts back what something else removed.
    fn heal(&mut self) -> Op<'_, Healed>;
    /// The programs in links, and where.
    fn attachments(&self) -> &[Attachment];
    /// Writes the programs' config again (the drop trace was switched).
    fn write_config(&mut self) -> Result<()>;
    /// The pods' MTU.
    fn mtu(&self) -> Option<u32>;
    /// The programs' packet counters.
    fn counters(&self) -> Option<Arc<Counters>>;
    /// What marking fast-path flows liberal in conntrack did.
    fn liberal(&self) -> Option<Arc<LiberalStats>>;

    /// Tries again the peers that could not be programmed.
    fn retry_problems(&mut self) -> Op<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    /// Peers not (fully) programmed.
    fn problems(&self) -> Vec<Problem> {
        Vec::new()
    }
    /// The agent is stopping.
    fn release_port(&mut self) -> Op<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    /// The peers to reach before the programs in the links count as
    /// verified (None: they are, or there are no generations).
    fn unverified_targets(&self) -> Option<Vec<(IpAddr, IpAddr)>> {
        None
    }
    /// What a check over [`Backend::unverified_targets`] found.
    fn verify(&mut self, _checked: Result<usize, String>) -> Result<Verified> {
        Ok(Verified::Reached(0))
    }
    /// The programs' generations and how they came to be.
    fn programs(&self) -> Option<ProgramsState> {
        None
    }
    /// Where decapsulation runs, and why.
    fn decap(&self) -> Option<DecapChoice> {
        None
    }
    /// The uplink's MTU, where per-peer path MTU is on.
    fn path_mtu_ceiling(&self) -> Option<u32> {
        None
    }
    /// Paths measured or lost, to the programs and routes.
    fn set_path_mtus<'a>(&'a mut self, _changes: &'a [(Ipv4Addr, Option<u32>)]) -> Op<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    /// The subnets of the peers reached without encapsulation.
    fn direct(&self) -> Vec<IpNet> {
        Vec::new()
    }
    /// WireGuard's peers as the kernel reports them.
    fn wireguard_peers(&self) -> Option<Result<Vec<WgPeerStats>>> {
        None
    }
}

/// No datapath (`--datapath none`): the peer table is kept and logged.
#[derive(Default)]
pub(crate) struct Off {
    peers: HashMap<IpNet, Peer>,
}

impl Backend for Off {
    fn set_subnet(&mut self, subnets: Subnets) -> Op<'_, ()> {
        tracing::debug!(target: "weft::dataplane", ?subnets, "own subnets (no datapath)");
        Box::pin(async { Ok(()) })
    }

    fn apply<'a>(&'a mut self, updates: &'a [PeerUpdate]) -> Op<'a, ()> {
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    self.peers.insert(p.subnet, *p);
                }
                PeerUpdate::Remove(s) => {
                    self.peers.remove(s);
                }
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn retain<'a>(&'a mut self, _keep: &'a HashSet<IpNet>) -> Op<'a, usize> {
        Box::pin(async { Ok(0) })
    }

    fn peers(&self) -> &HashMap<IpNet, Peer> {
        &self.peers
    }

    fn sync_endpoints<'a>(&'a mut self, _want: &'a [EndpointSpec]) -> Op<'a, EndpointSync> {
        Box::pin(async { Ok(EndpointSync::default()) })
    }

    fn heal(&mut self) -> Op<'_, Healed> {
        Box::pin(async { Ok(Healed::default()) })
    }

    fn attachments(&self) -> &[Attachment] {
        &[]
    }

    fn write_config(&mut self) -> Result<()> {
        Ok(())
    }

    fn mtu(&self) -> Option<u32> {
        None
    }

    fn counters(&self) -> Option<Arc<Counters>> {
        None
    }

    fn liberal(&self) -> Option<Arc<LiberalStats>> {
        None
    }
}
