//! The wireguard backend behind the backend boundary.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use anyhow::Result;
use ipnet::IpNet;

use super::{WgOverlay, WgPeerStats};
use crate::{
    dataplane::{
        Attachment, Counters, EndpointSpec, EndpointSync, Healed, LiberalStats, Peer, PeerUpdate,
        backend::{Backend, Op},
    },
    lease::Subnets,
};

impl Backend for WgOverlay {
    fn set_subnet(&mut self, subnets: Subnets) -> Op<'_, ()> {
        Box::pin(WgOverlay::set_subnet(self, subnets))
    }

    fn apply<'a>(&'a mut self, updates: &'a [PeerUpdate]) -> Op<'a, ()> {
        Box::pin(self.apply_batch(updates))
    }

    fn retain<'a>(&'a mut self, keep: &'a HashSet<IpNet>) -> Op<'a, usize> {
        Box::pin(WgOverlay::retain(self, keep))
    }

    fn peers(&self) -> &HashMap<IpNet, Peer> {
        WgOverlay::peers(self)
    }

    fn sync_endpoints<'a>(&'a mut self, want: &'a [EndpointSpec]) -> Op<'a, EndpointSync> {
        Box::pin(WgOverlay::sync_endpoints(self, want))
    }

    fn heal(&mut self) -> Op<'_, Healed> {
        Box::pin(WgOverlay::heal(self))
    }

    fn attachments(&self) -> &[Attachment] {
        WgOverlay::attachments(self)
    }

    fn write_config(&mut self) -> Result<()> {
        WgOverlay::write_config(self)
    }

    fn mtu(&self) -> Option<u32> {
        Some(WgOverlay::mtu(self))
    }

    fn counters(&self) -> Option<Arc<Counters>> {
        WgOverlay::counters(self)
    }

    fn liberal(&self) -> Option<Arc<LiberalStats>> {
        WgOverlay::liberal(self)
    }

    fn wireguard_peers(&self) -> Option<Result<Vec<WgPeerStats>>> {
        Some(self.stats())
    }
}
