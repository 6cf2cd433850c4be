//! Host routing: a pod's packet to a remote pod is encapsulated at the host
//! side of the pod's veth and sent straight to the uplink; a decapsulated
//! packet for a local pod goes straight into the pod. Both skip the bridge,
//! the host's routing and netfilter, and a device queue each. Anything the
//! fast path cannot handle (or is not allowed to) goes on through the host
//! stack, as without host routing.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    helpers::generated::{bpf_redirect, bpf_redirect_peer, bpf_skb_change_type},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::{
    CONFIG_F_BYPASS, CONFIG_F_CT_GATE, CONFIG_F_IPV4, CONFIG_F_IPV6, CONFIG_F_SOURCE_CHECK,
    CONFIG_F_WIREGUARD, DataplaneConfig, Endpoint, POD_IF_V4, POD_IF_V6, PodIf, Reason,
    VTEP_F_DIRECT, Vtep,
};

use crate::{
    ct,
    encap::{encapsulate, outer_len, path, redirect_direct, redirect_to_uplink, too_big},
    encap6::{set_inner_macs, set_tunnel, too_big6},
    family::{Family, V4, V6},
    headers::{
        ENCAP_LEN, ENCAP6_LEN, ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, IPPROTO_UDP, IPV4_LEN,
        IPV6_LEN, Ipv4Hdr, Ipv6Hdr, csum_replace,
    },
    maps::{
        WEFT_ENDPOINTS, WEFT_ENDPOINTS6, WEFT_PEERS, WEFT_PEERS6, WEFT_POD_IFS, WEFT_VTEPS,
        WEFT_VTEPS6,
    },
    packet::{eq16, in_subnet4, in_subnet6, linear, read, write},
    verdict::{Done, Dropped},
};

use crate::ct::IPPROTO_TCP;

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
    // The wireguard backend's pods have `weft_from_pod_wg`; this one never
    // encapsulates for it (a netkit pod the plugin attached it to before
    // the agent swapped the program).
    if cfg.flags & (CONFIG_F_BYPASS | CONFIG_F_SOURCE_CHECK) == 0
        || cfg.flags & CONFIG_F_WIREGUARD != 0
    {
        return Ok(pass);
    }
    let Ok((data, end)) = linear(ctx, ETH_LEN + IPV6_LEN) else {
        return Ok(pass);
    };
    let Some(eth) = read::<EthHdr>(data, end, 0) else {
        return Ok(pass);
    };
    if eth.proto == ETH_P_IPV6.to_be() {
        return from_pod6(ctx, cfg, data, end);
    }
    let Some(ip) = read::<Ipv4Hdr>(data, end, ETH_LEN) else {
        return Ok(pass);
    };
    // Not IPv4: its business.
    if eth.proto != ETH_P_IP.to_be() || cfg.flags & CONFIG_F_IPV4 == 0 || ip.ver_ihl >> 4 != 4 {
        return Ok(pass);
    }
    match source4(ctx, cfg, ip.saddr) {
        Source::Endpoint => {}
        Source::Spoofed => return Err(Dropped::at(Reason::DropInvalidSource, ip.saddr, ip.daddr)),
        Source::Other => return Ok(pass),
    }
    // Checked only (no conntrack kfuncs under `auto`): the stack carries it.
    if cfg.flags & CONFIG_F_BYPASS == 0 {
        return Ok(pass);
    }
    // A TTL the host stack must answer.
    if ip.ttl <= 1 {
        return Ok(pass);
    }
    let Some(vtep) = WEFT_PEERS.get(Key::new(32, ip.daddr)) else {
        return Ok(pass);
    };
    let vtep = *vtep;
    if vtep.flags & VTEP_F_DIRECT != 0 {
        return direct(ctx, cfg, data, end, &ip, &vtep);
    }
    // Too big for the uplink, or a BIG TCP aggregate whose outer length
    // would not fit; or a packet (a GSO packet's segment) larger than the
    // peer's path: the stack answers with ICMP, or segments it.
    if too_big(ctx, cfg, len) {
        return Ok(pass);
    }
    let Some(outer) = outer_segment(ctx, data, end, len, &ip) else {
        return Ok(pass);
    };
    let path = path(ctx, cfg, &vtep, outer);
    if outer > path.mtu {
        return Ok(pass);
    }
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate::<V4>(ctx, cfg, data, end, ETH_LEN, &ip) {
        return Ok(pass);
    }
    // An skb that cannot be encapsulated (one that already is) is left
    // untouched for the stack.
    let Ok(new_len) = encapsulate(ctx, cfg, &ip, &vtep, path.df) else {
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

/// Transmit, IPv6: the pod's packet gets the tunnel key and the inner MACs
/// here and goes straight to the IPv6 overlay device, whose kernel vxlan
/// driver writes the outer headers (checksummed, per segment for GSO).
#[inline(always)]
fn from_pod6(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
) -> Result<Done<i32>, Dropped> {
    let len = ctx.len();
    let pass = Done {
        action: TC_ACT_OK,
        reason: Reason::Passed,
        bytes: len,
    };
    let Some(ip) = read::<Ipv6Hdr>(data, end, ETH_LEN) else {
        return Ok(pass);
    };
    if cfg.flags & CONFIG_F_IPV6 == 0 || ip.version() != 6 {
        return Ok(pass);
    }
    match source6(ctx, cfg, &ip.saddr) {
        Source::Endpoint => {}
        Source::Spoofed => return Err(Dropped::at6(Reason::DropInvalidSource, ETH_LEN)),
        Source::Other => return Ok(pass),
    }
    if cfg.flags & CONFIG_F_BYPASS == 0 {
        return Ok(pass);
    }
    // No IPv6 overlay device (yet): the stack reports why; and a hop
    // limit the stack must answer.
    if cfg.overlay6_ifindex == 0 || ip.hop_limit <= 1 {
        return Ok(pass);
    }
    let Some(vtep) = WEFT_PEERS6.get(Key::new(128, ip.daddr)) else {
        return Ok(pass);
    };
    let vtep = *vtep;
    // Too big for the overlay (the stack answers with Packet Too Big), or
    // an aggregate whose outer length would not fit.
    if too_big6(ctx, cfg, len) {
        return Ok(pass);
    }
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate::<V6>(ctx, cfg, data, end, ETH_LEN, &ip) {
        return Ok(pass);
    }
    // The hop through this node, as routing would count it.
    let drop = || Dropped::at6(Reason::DropError, ETH_LEN);
    if !write(data, end, ETH_LEN + 7, ip.hop_limit - 1) || !set_inner_macs(data, end, cfg, &vtep) {
        return Err(drop());
    }
    if set_tunnel(ctx, cfg, &vtep).is_err() {
        return Err(drop());
    }
    // SAFETY: a helper without pointer arguments.
    let action = unsafe { bpf_redirect(cfg.overlay6_ifindex, 0) } as i32;
    Ok(Done {
        action,
        reason: Reason::EncapBypass,
        bytes: len + ENCAP6_LEN as u32,
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
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate::<V4>(ctx, cfg, data, end, ETH_LEN, ip) {
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
    if eth.proto != ETH_P_IP.to_be() || cfg.flags & CONFIG_F_IPV4 == 0 {
        return None;
    }
    let ip = read::<Ipv4Hdr>(data, end, ETH_LEN)?;
    let vtep = WEFT_PEERS.get(Key::new(32, ip.saddr))?;
    if vtep.flags & VTEP_F_DIRECT == 0 {
        return None;
    }
    deliver(ctx, cfg)
}

/// Receive: a decapsulated packet (Ethernet + IPv4 or IPv6 at the start of
/// the frame) for a pod on this node goes straight into the pod. Returns
/// the redirect, or None when the packet takes the host stack.
#[inline(always)]
pub(crate) fn deliver(ctx: &TcContext, cfg: &DataplaneConfig) -> Option<i32> {
    if cfg.flags & CONFIG_F_BYPASS == 0 {
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
    if cfg.flags & CONFIG_F_BYPASS == 0 {
        return None;
    }
    let ip = read::<F::Hdr>(data, end, at)?;
    if !F::forwardable(&ip) {
        return None;
    }
    let ep = F::endpoint(&F::daddr(&ip))?;
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate::<F>(ctx, cfg, data, end, at, &ip) {
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

/// The conntrack gate, for an IP packet at `at` whose transport header
/// follows its fixed header (anything else takes the stack).
#[inline(always)]
pub(crate) fn gate<F: Family>(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    at: usize,
    ip: &F::Hdr,
) -> bool {
    if !F::plain(ip) {
        return false;
    }
    let proto = F::proto(ip);
    let Some((ports, flags)) = transport(data, end, at + F::HDR_LEN, proto) else {
        return false;
    };
    ct::allows(ctx, cfg, F::flow(ip), proto, ports, flags)
}

/// The outer IPv4 packet's length on the wire once `ip`'s `len`-byte
/// frame is encapsulated: the frame's, or for a GSO packet one segment's
/// (its size, the IPv4 header and the TCP or UDP header). None for a GSO
/// packet whose headers are out of reach or of another kind.
#[inline(always)]
pub(crate) fn outer_segment(
    ctx: &TcContext,
    data: usize,
    end: usize,
    len: u32,
    ip: &Ipv4Hdr,
) -> Option<u32> {
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 {
        return Some(outer_len(len));
    }
    let l3 = u32::from(ip.ver_ihl & 0x0f) * 4;
    let l4 = match ip.proto {
        IPPROTO_TCP => {
            let off = read::<u8>(data, end, ETH_LEN + IPV4_LEN + 12)?;
            if l3 != IPV4_LEN as u32 {
                return None;
            }
            u32::from(off >> 4) * 4
        }
        IPPROTO_UDP => 8,
        _ => return None,
    };
    Some(gso_size + l3 + l4 + ENCAP_LEN as u32)
}

/// The ports of the transport header at `l4` and, for TCP, its flags; None
/// when they are out of reach (the stack sees such a packet: it may be a
/// SYN).
#[inline(always)]
fn transport(data: usize, end: usize, l4: usize, proto: u8) -> Option<((u16, u16), u8)> {
    let ports = read::<[u16; 2]>(data, end, l4)?;
    let flags = if proto == IPPROTO_TCP {
        read::<u8>(data, end, l4 + 13)?
    } else {
        0
    };
    Some(((ports[0], ports[1]), flags))
}

/// What the source of a pod's packet is, seen from the veth it came from.
pub(crate) enum Source {
    /// The address of the pod behind this veth: the fast path may take it.
    Endpoint,
    /// Another local pod's address, one of the node's pod subnets that is
    /// not this pod's, the node's own address, a remote pod's address or
    /// another node's: dropped (the host stack would forward some of them,
    /// and deliver them to local pods where rp_filter is off; none may
    /// reach anyone as if this pod were someone else).
    Spoofed,
    /// Anything else (a pod that routes for others, a link-local source),
    /// or a veth host routing does not know (yet): the host stack decides,
    /// never the fast path.
    Other,
}

/// The addresses of the pod behind the veth the packet came in on, if
/// host routing knows that veth.
#[inline(always)]
fn pod_if(ctx: &TcContext) -> Option<PodIf> {
    // SAFETY: reading a field of the context's own sk_buff.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: a plain hash lookup; the value is copied out at once.
    unsafe { WEFT_POD_IFS.get(ifindex) }.copied()
}

#[inline(always)]
pub(crate) fn source4(ctx: &TcContext, cfg: &DataplaneConfig, saddr: u32) -> Source {
    // An unknown veth (the agent is programming it): the stack decides.
    let Some(pod) = pod_if(ctx) else {
        return Source::Other;
    };
    if pod.flags & POD_IF_V4 != 0 && pod.ip4_be == saddr {
        return Source::Endpoint;
    }
    let own = in_subnet4(saddr, cfg.subnet4_be, cfg.mask4_be);
    // SAFETY: a plain hash lookup; the value is not used.
    let other_pod = unsafe { WEFT_ENDPOINTS.get(saddr) }.is_some();
    if own || other_pod || saddr == cfg.local_addr_be {
        return Source::Spoofed;
    }
    // A remote pod's address, or another node's: the stack would deliver
    // it to a local pod where rp_filter is off.
    // SAFETY: a plain hash lookup; the value is not used.
    let remote =
        WEFT_PEERS.get(Key::new(32, saddr)).is_some() || unsafe { WEFT_VTEPS.get(saddr) }.is_some();
    if remote {
        Source::Spoofed
    } else {
        Source::Other
    }
}

#[inline(always)]
pub(crate) fn source6(ctx: &TcContext, cfg: &DataplaneConfig, saddr: &[u8; 16]) -> Source {
    let Some(pod) = pod_if(ctx) else {
        return Source::Other;
    };
    if pod.flags & POD_IF_V6 != 0 && eq16(&pod.ip6, saddr) {
        return Source::Endpoint;
    }
    // SAFETY: a plain hash lookup; the value is not used.
    let other_pod = unsafe { WEFT_ENDPOINTS6.get(saddr) }.is_some();
    if in_subnet6(saddr, &cfg.subnet6, &cfg.mask6) || other_pod || eq16(saddr, &cfg.local_addr6) {
        return Source::Spoofed;
    }
    // SAFETY: a plain hash lookup; the value is not used.
    let remote = WEFT_PEERS6.get(Key::new(128, *saddr)).is_some()
        || unsafe { WEFT_VTEPS6.get(saddr) }.is_some();
    if remote {
        Source::Spoofed
    } else {
        Source::Other
    }
}

/// Decrements the TTL of the IPv4 header at `off`, updating its checksum.
#[inline(always)]
pub(crate) fn dec_ttl(data: usize, end: usize, off: usize) -> bool {
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
