//! Host routing, transmit (VXLAN): a pod's packet to a remote pod is
//! encapsulated at the host side of the pod's veth and sent straight to
//! the uplink (IPv4), or given its tunnel key and sent to the IPv6 overlay
//! device, whose kernel vxlan driver writes the outer headers; a direct
//! peer's (DirectRouting) goes to it as it is. All skip the bridge, the
//! host's routing and netfilter, and a device queue each. Anything the
//! fast path cannot handle (or is not allowed to) goes on through the host
//! stack, as without host routing.

use aya_ebpf::{helpers::generated::bpf_redirect, programs::TcContext};
use dataplane_common::{DataplaneConfig, Reason, Vtep, Vtep6};

use crate::{
    family::{V4, V6},
    headers::{ENCAP_LEN, ENCAP6_LEN, ETH_LEN, Ipv4Hdr, Ipv6Hdr},
    overlay::{
        encap::{encapsulate, outer_segment, path, redirect_direct, redirect_to_uplink, too_big},
        encap6::{set_inner_macs, set_tunnel, too_big6},
    },
    packet::{dec_ttl, write},
    pod::gate,
    pod::parsed,
    verdict::{Done, Dropped, Verdict},
};

/// Transmit: a pod's packet at the host side of its veth (TC ingress).
/// The wireguard backend's pods have `weft_from_pod_wg`; this one never
/// encapsulates for it (a netkit pod the plugin attached it to before the
/// agent swapped the program).
#[inline(always)]
pub(crate) fn from_pod(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    parsed::transmit(
        ctx,
        cfg,
        false,
        |data, end, ip, vtep| send4(ctx, cfg, data, end, ip, vtep),
        |data, end, ip, vtep| send6(ctx, cfg, data, end, ip, vtep),
    )
}

/// Transmit, IPv4: encapsulated here and sent to the uplink.
#[inline(always)]
fn send4(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    ip: &Ipv4Hdr,
    vtep: &Vtep,
) -> Verdict<i32> {
    let len = ctx.len();
    let pass = Done::pass(len);
    if vtep.direct() {
        return direct(ctx, cfg, data, end, ip, vtep);
    }
    // Too big for the uplink, or a BIG TCP aggregate whose outer length
    // would not fit; or a packet (a GSO packet's segment) larger than the
    // peer's path: the stack answers with ICMP, or segments it.
    if too_big(ctx, cfg, len) {
        return Ok(pass);
    }
    let Some(outer) = outer_segment(ctx, data, end, len, ip) else {
        return Ok(pass);
    };
    let path = path(ctx, cfg, vtep, outer);
    if outer > path.mtu {
        return Ok(pass);
    }
    if cfg.ct_gate() && !gate::allows::<V4>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    // An skb that cannot be encapsulated (one that already is) is left
    // untouched for the stack.
    let Ok(new_len) = encapsulate(ctx, cfg, ip, vtep, path.df) else {
        return Ok(pass);
    };
    // The hop through this node, as routing would count it.
    if !dec_ttl(ctx.data(), ctx.data_end(), ETH_LEN + ENCAP_LEN) {
        return Err(Dropped::at(Reason::DropError, ip.saddr, ip.daddr));
    }
    Ok(Done::new(
        redirect_to_uplink(cfg),
        Reason::EncapBypass,
        new_len,
    ))
}

/// Transmit, IPv6: the pod's packet gets the tunnel key and the inner MACs
/// here and goes straight to the IPv6 overlay device, whose kernel vxlan
/// driver writes the outer headers (checksummed, per segment for GSO).
#[inline(always)]
fn send6(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    ip: &Ipv6Hdr,
    vtep: &Vtep6,
) -> Verdict<i32> {
    let len = ctx.len();
    let pass = Done::pass(len);
    // Too big for the overlay (the stack answers with Packet Too Big), or
    // an aggregate whose outer length would not fit.
    if too_big6(ctx, cfg, len) {
        return Ok(pass);
    }
    if cfg.ct_gate() && !gate::allows::<V6>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    // The hop through this node, as routing would count it.
    let drop = || Dropped::at6(Reason::DropError, ETH_LEN);
    if !write(data, end, ETH_LEN + 7, ip.hop_limit - 1) || !set_inner_macs(data, end, cfg, vtep) {
        return Err(drop());
    }
    if set_tunnel(ctx, cfg, vtep).is_err() {
        return Err(drop());
    }
    // SAFETY: a helper without pointer arguments.
    let action = unsafe { bpf_redirect(cfg.overlay6_ifindex, 0) } as i32;
    Ok(Done::new(
        action,
        Reason::EncapBypass,
        len + ENCAP6_LEN as u32,
    ))
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
) -> Verdict<i32> {
    let len = ctx.len();
    let pass = Done::pass(len);
    // Too big for the uplink: the stack answers with ICMP.
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 && len - ETH_LEN as u32 > cfg.uplink_mtu {
        return Ok(pass);
    }
    if cfg.ct_gate() && !gate::allows::<V4>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    if !dec_ttl(ctx.data(), ctx.data_end(), ETH_LEN) {
        return Err(Dropped::at(Reason::DropError, ip.saddr, ip.daddr));
    }
    Ok(Done::new(
        redirect_direct(cfg, vtep.addr_be),
        Reason::DirectTx,
        len,
    ))
}
