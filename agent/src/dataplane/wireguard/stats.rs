//! A WireGuard device's peers as the agent reports them (`weft status`,
//! `/metrics`): their handshakes and transfers.

use std::{net::SocketAddr, time::SystemTime};

use ipnet::IpNet;

use super::genl;
use crate::wgkey::WgKey;

/// A peer as the agent sees it, for status and metrics.
#[derive(Clone, Debug)]
pub(crate) struct WgPeerStats {
    pub device: &'static str,
    pub key: WgKey,
    pub endpoint: Option<SocketAddr>,
    pub allowed: Vec<IpNet>,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// A device's peer, as reported.
pub(super) fn stats(device: &'static str, p: genl::PeerState) -> WgPeerStats {
    WgPeerStats {
        device,
        key: p.key,
        endpoint: p.endpoint,
        allowed: p.allowed,
        last_handshake: p.last_handshake,
        rx_bytes: p.rx_bytes,
        tx_bytes: p.tx_bytes,
    }
}

/// Seconds since `t` (None: never).
pub(crate) fn age(t: Option<SystemTime>) -> Option<u64> {
    t.map(|t| {
        SystemTime::now()
            .duration_since(t)
            .map_or(0, |d| d.as_secs())
    })
}

/// WireGuard drops a session this long after its handshake, and a peer
/// with traffic makes a new one every 2 minutes: a handshake older than
/// this means the peer is not talking to us (or nobody sent it anything).
pub(crate) const HANDSHAKE_RECENT_SECS: u64 = 180;
