//! The wireguard backend, transmit: a pod's packet to a remote pod goes
//! from the pod's veth straight to the WireGuard device of its family (an
//! L3 device: the redirect strips the Ethernet header), past the bridge,
//! the host's routing and netfilter, under host routing's rules (its
//! source checked, conntrack's gate under `auto`, the hop counted).

use aya_ebpf::{helpers::generated::bpf_redirect, programs::TcContext};
use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    family::{V4, V6},
    headers::{ENCAP_LEN, ETH_LEN, Ipv4Hdr, Ipv6Hdr},
    overlay::encap::outer_segment,
    packet::{dec_ttl, write},
    pod::gate,
    pod::parsed,
    verdict::{Done, Dropped, Verdict},
};

/// Transmit: a pod's packet at the host side of its veth (TC ingress, the
/// program `weft_from_pod_wg`: a program of its own, so that neither it
/// nor VXLAN's `weft_from_pod` goes past the verifier's 512 bytes of
/// stack).
#[inline(always)]
pub(crate) fn from_pod(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    parsed::transmit(
        ctx,
        cfg,
        true,
        |data, end, ip, _| send4(ctx, cfg, data, end, ip),
        |data, end, ip, _| send6(ctx, cfg, data, end, ip),
    )
}

/// Transmit, IPv4: the pod's packet `ip` (after the Ethernet header of
/// `[data, end)`), to a remote pod, goes to the IPv4 WireGuard device.
#[inline(always)]
fn send4(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    ip: &Ipv4Hdr,
) -> Verdict<i32> {
    let len = ctx.len();
    let pass = Done::pass(len);
    // Larger than the device (the packet, or a GSO packet's segment): the
    // stack answers with ICMP, or segments it.
    let Some(segment) = outer_segment(ctx, data, end, len, ip) else {
        return Ok(pass);
    };
    if segment - ENCAP_LEN as u32 > cfg.wg4_mtu() || cfg.wg4_ifindex() == 0 {
        return Ok(pass);
    }
    if cfg.ct_gate() && !gate::allows::<V4>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    // The hop through this node, as routing would count it.
    if !dec_ttl(data, end, ETH_LEN) {
        return Err(Dropped::at(Reason::DropError, ip.saddr, ip.daddr));
    }
    // SAFETY: a helper without pointer arguments.
    let action = unsafe { bpf_redirect(cfg.wg4_ifindex(), 0) } as i32;
    Ok(Done::new(action, Reason::EncapBypass, len - ETH_LEN as u32))
}

/// Transmit, IPv6: as [`send4`], to the IPv6 WireGuard device.
#[inline(always)]
fn send6(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    ip: &Ipv6Hdr,
) -> Verdict<i32> {
    let len = ctx.len();
    let pass = Done::pass(len);
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 && len - ETH_LEN as u32 > cfg.wg6_mtu() {
        return Ok(pass);
    }
    if cfg.ct_gate() && !gate::allows::<V6>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    if !write(data, end, ETH_LEN + 7, ip.hop_limit - 1) {
        return Err(Dropped::at6(Reason::DropError, ETH_LEN));
    }
    // SAFETY: a helper without pointer arguments.
    let action = unsafe { bpf_redirect(cfg.wg6_ifindex(), 0) } as i32;
    Ok(Done::new(action, Reason::EncapBypass, len - ETH_LEN as u32))
}
