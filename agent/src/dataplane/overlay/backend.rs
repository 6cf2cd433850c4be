//! The VXLAN overlay behind the backend boundary.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use anyhow::Result;
use ipnet::IpNet;

use super::{Healed, Overlay, Problem, ProgramsState, Verified};
use crate::{
    dataplane::{
        Attachment, Counters, DecapChoice, EndpointSpec, EndpointSync, HostRouting, LiberalStats,
        Peer, PeerUpdate,
        backend::{Backend, Op},
    },
    lease::Subnets,
};

impl Backend for Overlay {
    fn set_subnet(&mut self, subnets: Subnets) -> Op<'_, ()> {
        Box::pin(Overlay::set_subnet(self, subnets))
    }

    fn apply<'a>(&'a mut self, updates: &'a [PeerUpdate]) -> Op<'a, ()> {
        Box::pin(self.apply_batch(updates))
    }

    fn retain<'a>(&'a mut self, keep: &'a HashSet<IpNet>) -> Op<'a, usize> {
        Box::pin(Overlay::retain(self, keep))
    }

    fn peers(&self) -> &HashMap<IpNet, Peer> {
        Overlay::peers(self)
    }

    fn sync_endpoints<'a>(&'a mut self, want: &'a [EndpointSpec]) -> Op<'a, EndpointSync> {
        if self.spec.host_routing == HostRouting::Legacy {
            return Box::pin(async { Ok(EndpointSync::default()) });
        }
        Box::pin(Overlay::sync_endpoints(self, want))
    }

    fn heal(&mut self) -> Op<'_, Healed> {
        Box::pin(Overlay::heal(self))
    }

    fn attachments(&self) -> &[Attachment] {
        Overlay::attachments(self)
    }

    fn write_config(&mut self) -> Result<()> {
        Overlay::write_config(self)
    }

    fn mtu(&self) -> Option<u32> {
        Some(Overlay::mtu(self))
    }

    fn counters(&self) -> Option<Arc<Counters>> {
        Some(Overlay::counters(self))
    }

    fn liberal(&self) -> Option<Arc<LiberalStats>> {
        Some(Overlay::liberal(self))
    }

    fn retry_problems(&mut self) -> Op<'_, ()> {
        Box::pin(Overlay::retry_problems(self))
    }

    fn problems(&self) -> Vec<Problem> {
        Overlay::problems(self).cloned().collect()
    }

    fn release_port(&mut self) -> Op<'_, ()> {
        Box::pin(Overlay::release_port(self))
    }

    fn unverified_targets(&self) -> Option<Vec<(IpAddr, IpAddr)>> {
        Overlay::unverified_targets(self)
    }

    fn verify(&mut self, checked: Result<usize, String>) -> Result<Verified> {
        Overlay::verify(self, checked)
    }

    fn programs(&self) -> Option<ProgramsState> {
        Some(self.generation())
    }

    fn decap(&self) -> Option<DecapChoice> {
        Some(Overlay::decap(self))
    }

    fn path_mtu_ceiling(&self) -> Option<u32> {
        Overlay::path_mtu_ceiling(self)
    }

    fn set_path_mtus<'a>(&'a mut self, changes: &'a [(Ipv4Addr, Option<u32>)]) -> Op<'a, ()> {
        Box::pin(Overlay::set_path_mtus(self, changes))
    }

    fn direct(&self) -> Vec<IpNet> {
        let mut v: Vec<IpNet> = Overlay::direct(self).iter().copied().collect();
        v.sort();
        v
    }
}
