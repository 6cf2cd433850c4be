//! Host routing: a pod's packet to a remote pod is encapsulated at the host
//! side of the pod's veth and sent straight to the uplink; a decapsulated
//! packet for a local pod goes straight into the pod. Both skip the bridge,
//! the host's routing and netfilter, and a device queue each. Anything the
//! fast path cannot handle (or is not allowed to) goes on through the host
//! stack, as without host routing.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    helpers::generated::{bpf_redirect_peer, bpf_skb_change_type},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::{
    CONFIG_F_BYPASS, CONFIG_F_CT_GATE, DataplaneConfig, Reason, VTEP_F_DIRECT, Vtep,
};

use crate::{
    ct,
    encap::{encapsulate, redirect_direct, redirect_to_uplink, too_big},
    headers::{ENCAP_LEN, ETH_LEN, ETH_P_IP, EthHdr, IPV4_LEN, Ipv4Hdr, csum_replace},
    maps::{WEFT_ENDPOINTS, WEFT_PEERS},
    packet::{linear, read, write},
    verdict::{Done, Dropped},
};

/// `PACKET_HOST`: what a frame addressed to the receiving device is.
const PACKET_HOST: u32 = 0;

/// Transmit: a pod's packet at the host side of its veth (TC ingress).
#[inline(always)]
pub(crate) fn from_pod(ctx: &TcContext, cfg: &DataplaneConfig) -> Result<Done<i32>, Dropped> {
    let len = ctx.len();
    let pass = Done {
        action: TC_ACT_OK,
        reason: Reason::Passed,
        bytes: len,
    };
    if cfg.flags & CONFIG_F_BYPASS == 0 {
        return Ok(pass);
    }
    let Ok((data, end)) = linear(ctx, ETH_LEN + IPV4_LEN) else {
        return Ok(pass);
    };
    let Some(eth) = read::<EthHdr>(data, end, 0) else {
        return Ok(pass);
    };
    let Some(ip) = read::<Ipv4Hdr>(data, end, ETH_LEN) else {
        return Ok(pass);
    };
    // Not IPv4, or a TTL the host stack must answer: its business.
    if eth.proto != ETH_P_IP.to_be() || ip.ver_ihl >> 4 != 4 || ip.ttl <= 1 {
        return Ok(pass);
    }
    let Some(vtep) = WEFT_PEERS.get(Key::new(32, ip.daddr)) else {
        return Ok(pass);
    };
    let vtep = *vtep;
    if vtep.flags & VTEP_F_DIRECT != 0 {
        return direct(ctx, cfg, data, end, &ip, &vtep);
    }
    // Too big for the uplink (the stack answers with ICMP), or a BIG TCP
    // aggregate whose outer length would not fit.
    if too_big(ctx, cfg, len) {
        return Ok(pass);
    }
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate(ctx, data, end, &ip) {
        return Ok(pass);
    }
    // An skb that cannot be encapsulated (one that already is) is left
    // untouched for the stack.
    let Ok(new_len) = encapsulate(ctx, cfg, &ip, &vtep) else {
        return Ok(pass);
    };
    // The hop through this node, as routing would count it.
    if !dec_ttl(ctx.data(), ctx.data_end(), ETH_LEN + ENCAP_LEN) {
        return Err(Dropped::at(Reason::DropError, ip.saddr, ip.daddr));
    }
    Ok(Done {
        action: redirect_to_uplink(cfg),
        reason: Reason::EncapBypass,
        bytes: new_len,
    })
}

/// Transmit, DirectRouting: the peer is on the uplink's own subnet; the
/// packet goes to it as it is, without encapsulation.
#[inline(always)]
fn direct(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    ip: &Ipv4Hdr,
    vtep: &Vtep,
) -> Result<Done<i32>, Dropped> {
    let len = ctx.len();
    let pass = Done {
        action: TC_ACT_OK,
        reason: Reason::Passed,
        bytes: len,
    };
    // Too big for the uplink: the stack answers with ICMP.
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 && len - ETH_LEN as u32 > cfg.uplink_mtu {
        return Ok(pass);
    }
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate(ctx, data, end, ip) {
        return Ok(pass);
    }
    if !dec_ttl(ctx.data(), ctx.data_end(), ETH_LEN) {
        return Err(Dropped::at(Reason::DropError, ip.saddr, ip.daddr));
    }
    Ok(Done {
        action: redirect_direct(cfg, vtep.addr_be),
        reason: Reason::DirectTx,
        bytes: len,
    })
}

/// Receive, DirectRouting: an unencapsulated IPv4 packet on the uplink from
/// a pod of a direct peer (its source in a subnet whose peer is marked
/// direct) to a local pod goes straight into the pod.
#[inline(always)]
pub(crate) fn deliver_direct(ctx: &TcContext, cfg: &DataplaneConfig) -> Option<i32> {
    if cfg.flags & CONFIG_F_BYPASS == 0 {
        return None;
    }
    let (data, end) = linear(ctx, ETH_LEN + IPV4_LEN).ok()?;
    let eth = read::<EthHdr>(data, end, 0)?;
    if eth.proto != ETH_P_IP.to_be() {
        return None;
    }
    let ip = read::<Ipv4Hdr>(data, end, ETH_LEN)?;
    let vtep = WEFT_PEERS.get(Key::new(32, ip.saddr))?;
    if vtep.flags & VTEP_F_DIRECT == 0 {
        return None;
    }
    deliver(ctx, cfg)
}

/// Receive: a decapsulated packet (Ethernet + IPv4 at the start of the
/// frame) for a pod on this node goes straight into the pod. Returns the
/// redirect, or None when the packet takes the host stack.
#[inline(always)]
pub(crate) fn deliver(ctx: &TcContext, cfg: &DataplaneConfig) -> Option<i32> {
    if cfg.flags & CONFIG_F_BYPASS == 0 {
        return None;
    }
    let (data, end) = linear(ctx, ETH_LEN + IPV4_LEN).ok()?;
    let ip = read::<Ipv4Hdr>(data, end, ETH_LEN)?;
    if ip.ttl <= 1 {
        return None;
    }
    let dst = ip.daddr;
    // SAFETY: a plain hash lookup; the value is copied out at once.
    let ep = *unsafe { WEFT_ENDPOINTS.get(dst) }?;
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate(ctx, data, end, &ip) {
        return None;
    }
    if !dec_ttl(data, end, ETH_LEN)
        || !write(data, end, 0, ep.pod_mac)
        || !write(data, end, 6, ep.gw_mac)
    {
        return None;
    }
    // SAFETY: the helper only sets the context's sk_buff's packet type.
    unsafe { bpf_skb_change_type(ctx.skb.skb, PACKET_HOST) };
    // SAFETY: a helper without pointer arguments.
    Some(unsafe { bpf_redirect_peer(ep.ifindex, 0) } as i32)
}

/// The conntrack gate, for an IPv4 packet at `ETH_LEN` (no options: the
/// ports are right after the header).
#[inline(always)]
fn gate(ctx: &TcContext, data: usize, end: usize, ip: &Ipv4Hdr) -> bool {
    if ip.ver_ihl != 0x45 || u16::from_be(ip.frag_off) & 0x3fff != 0 {
        return false;
    }
    let l4 = ETH_LEN + IPV4_LEN;
    let Some(ports) = read::<[u16; 2]>(data, end, l4) else {
        return false;
    };
    let flags = read::<u8>(data, end, l4 + 13).unwrap_or(0);
    ct::allows(ctx, ip, (ports[0], ports[1]), flags)
}

/// Decrements the TTL of the IPv4 header at `off`, updating its checksum.
#[inline(always)]
fn dec_ttl(data: usize, end: usize, off: usize) -> bool {
    let (Some(w), Some(csum)) = (
        read::<[u8; 2]>(data, end, off + 8),
        read::<u16>(data, end, off + 10),
    ) else {
        return false;
    };
    let new = [w[0].wrapping_sub(1), w[1]];
    let csum = csum_replace(csum, u16::from_ne_bytes(w), u16::from_ne_bytes(new));
    write(data, end, off + 8, new) && write(data, end, off + 10, csum)
}
