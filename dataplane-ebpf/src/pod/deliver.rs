//! What is put into a local pod: a decapsulated packet (uplink, after
//! GRO), a direct peer's unencapsulated one (DirectRouting) or what the
//! WireGuard device decrypted, straight to the pod's side of its veth,
//! past the bridge, the host's routing and netfilter.

use aya_ebpf::{
    helpers::generated::{bpf_redirect_peer, bpf_skb_change_type},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::{DataplaneConfig, Endpoint};

use crate::{
    family::{Family, V4, V6},
    headers::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, IPV4_LEN, IPV6_LEN, Ipv4Hdr},
    maps::WEFT_PEERS,
    packet::{dec_ttl, linear, read, write},
    pod::gate,
};

/// `PACKET_HOST`: what a frame addressed to the receiving device is.
const PACKET_HOST: u32 = 0;

/// Receive, DirectRouting: an unencapsulated IPv4 packet on the uplink from
/// a pod of a direct peer (its source in a subnet whose peer is marked
/// direct) to a local pod goes straight into the pod.
#[inline(always)]
pub(crate) fn deliver_direct(ctx: &TcContext, cfg: &DataplaneConfig) -> Option<i32> {
    if !cfg.bypass() {
        return None;
    }
    let (data, end) = linear(ctx, ETH_LEN + IPV4_LEN).ok()?;
    let eth = read::<EthHdr>(data, end, 0)?;
    if eth.proto != ETH_P_IP.to_be() || !cfg.ipv4() {
        return None;
    }
    let ip = read::<Ipv4Hdr>(data, end, ETH_LEN)?;
    let vtep = WEFT_PEERS.get(Key::new(32, ip.saddr))?;
    if !vtep.direct() {
        return None;
    }
    deliver(ctx, cfg)
}

/// Receive: a decapsulated packet (Ethernet + IPv4 or IPv6 at the start of
/// the frame) for a pod on this node goes straight into the pod. Returns
/// the redirect, or None when the packet takes the host stack.
#[inline(always)]
pub(crate) fn deliver(ctx: &TcContext, cfg: &DataplaneConfig) -> Option<i32> {
    if !cfg.bypass() {
        return None;
    }
    let (data, end) = linear(ctx, ETH_LEN + IPV6_LEN).ok()?;
    let eth = read::<EthHdr>(data, end, 0)?;
    let v6 = eth.proto == ETH_P_IPV6.to_be();
    let ep = if v6 {
        endpoint::<V6>(ctx, cfg, data, end, ETH_LEN)?
    } else {
        endpoint::<V4>(ctx, cfg, data, end, ETH_LEN)?
    };
    into_pod(ctx, data, end, &ep, v6)
}

/// The local pod that the IP packet of family `F` at `at` in `[data, end)`
/// may be delivered to on the fast path, or None when it takes the host
/// stack: its destination is a registered endpoint, it may be forwarded
/// (TTL or hop limit above 1), and conntrack lets it through (`auto`).
/// `at` is after the outer headers for a frame not decapsulated yet, so
/// the choice can be made before the outer headers are stripped.
#[inline(always)]
pub(crate) fn endpoint<F: Family>(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    at: usize,
) -> Option<Endpoint> {
    if !cfg.bypass() {
        return None;
    }
    let ip = read::<F::Hdr>(data, end, at)?;
    if !F::forwardable(&ip) {
        return None;
    }
    let ep = F::endpoint(&F::daddr(&ip))?;
    if cfg.ct_gate() && !gate::allows::<F>(ctx, cfg, data, end, at, &ip) {
        return None;
    }
    Some(ep)
}

/// Forwards the frame (Ethernet + IP, IPv6 if `v6`, at the start of
/// `[data, end)`) to endpoint `ep`: decrements its TTL or hop limit,
/// addresses it to the pod and hands it to the pod's side of the veth.
#[inline(always)]
pub(crate) fn into_pod(
    ctx: &TcContext,
    data: usize,
    end: usize,
    ep: &Endpoint,
    v6: bool,
) -> Option<i32> {
    let hops = if v6 {
        read::<u8>(data, end, ETH_LEN + 7)
            .is_some_and(|h| h > 1 && write(data, end, ETH_LEN + 7, h - 1))
    } else {
        dec_ttl(data, end, ETH_LEN)
    };
    if !hops || !write(data, end, 0, ep.pod_mac) || !write(data, end, 6, ep.gw_mac) {
        return None;
    }
    // SAFETY: the helper only sets the context's sk_buff's packet type.
    unsafe { bpf_skb_change_type(ctx.skb.skb, PACKET_HOST) };
    // SAFETY: a helper without pointer arguments.
    Some(unsafe { bpf_redirect_peer(ep.ifindex, 0) } as i32)
}
