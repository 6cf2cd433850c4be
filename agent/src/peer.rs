//! Peers: a remote subnet and the node (VTEP) that serves it, and the
//! changes to the set of them. The vocabulary the leases produce, the
//! dataplane programs and peer health probes: it depends on none of them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::{mac::MacAddr, wgkey::WgKey};

/// One remote subnet and the VTEP that serves it: an IPv4 subnet behind an
/// IPv4 VTEP, or an IPv6 subnet behind an IPv6 VTEP. Of the wireguard
/// backend, the VTEP is the node's endpoint and `key` its public key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    pub subnet: IpNet,
    pub vtep: IpAddr,
    pub mac: MacAddr,
    /// The node's WireGuard public key (the wireguard backend only).
    pub key: Option<WgKey>,
    /// The create revision of the lease it came from (0 where none): of
    /// two leases of one node (a node whose address changed keeps its
    /// old lease until it expires), the newer says where it is now.
    pub since: i64,
}

impl Peer {
    /// An IPv4 peer.
    pub fn v4(subnet: Ipv4Net, vtep: Ipv4Addr, mac: MacAddr) -> Self {
        Self {
            subnet: IpNet::V4(subnet),
            vtep: IpAddr::V4(vtep),
            mac,
            key: None,
            since: 0,
        }
    }

    /// An IPv6 peer.
    pub fn v6(subnet: Ipv6Net, vtep: Ipv6Addr, mac: MacAddr) -> Self {
        Self {
            subnet: IpNet::V6(subnet),
            vtep: IpAddr::V6(vtep),
            mac,
            key: None,
            since: 0,
        }
    }
}

/// A change to the peer table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerUpdate {
    /// Install, or replace in place, the peer of this subnet.
    Upsert(Peer),
    /// Remove the peer of this subnet.
    Remove(IpNet),
}
