//! The wireguard backend's fast path (`CONFIG_F_WIREGUARD`): the kernel's
//! WireGuard device encrypts and decrypts; the programs only shorten the
//! way to and from it.
//!
//! - Transmit: a pod's packet to a remote pod goes from the pod's veth
//!   straight to the WireGuard device of its family (an L3 device: the
//!   redirect strips the Ethernet header), past the bridge, the host's
//!   routing and netfilter, under host routing's rules (its source checked,
//!   conntrack's gate under `auto`, the hop counted).
//! - Receive: a decrypted packet arrives at the WireGuard device without an
//!   Ethernet header; one for a local pod gets one pushed (the pod's and
//!   its gateway's MACs) and goes straight into the pod.
//!
//! Anything else takes the host stack, as without host routing.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    helpers::generated::{bpf_redirect, bpf_skb_change_head},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::{
    CONFIG_F_BYPASS, CONFIG_F_CT_GATE, CONFIG_F_IPV4, CONFIG_F_IPV6, CONFIG_F_SOURCE_CHECK,
    CONFIG_F_WIREGUARD, DataplaneConfig, Reason,
};

use crate::{
    bypass::{Source, dec_ttl, endpoint, gate, into_pod, outer_segment, source4, source6},
    family::{V4, V6},
    headers::{ENCAP_LEN, ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, IPV6_LEN, Ipv4Hdr, Ipv6Hdr},
    maps::{WEFT_PEERS, WEFT_PEERS6},
    packet::{linear, read, write},
    verdict::{Done, Dropped},
};

/// Whether the programs run for the wireguard backend with host routing.
#[inline(always)]
pub(crate) fn on(cfg: &DataplaneConfig) -> bool {
    cfg.flags & (CONFIG_F_WIREGUARD | CONFIG_F_BYPASS) == CONFIG_F_WIREGUARD | CONFIG_F_BYPASS
}

/// Transmit: a pod's packet at the host side of its veth (TC ingress, the
/// program `weft_from_pod_wg`: a program of its own, so that neither it
/// nor VXLAN's `weft_from_pod` goes past the verifier's 512 bytes of
/// stack).
#[inline(always)]
pub(crate) fn from_pod(ctx: &TcContext, cfg: &DataplaneConfig) -> Result<Done<i32>, Dropped> {
    let len = ctx.len();
    let pass = Done {
        action: TC_ACT_OK,
        reason: Reason::Passed,
        bytes: len,
    };
    if cfg.flags & CONFIG_F_WIREGUARD == 0
        || cfg.flags & (CONFIG_F_BYPASS | CONFIG_F_SOURCE_CHECK) == 0
    {
        return Ok(pass);
    }
    let Ok((data, end)) = linear(ctx, ETH_LEN + IPV6_LEN) else {
        return Ok(pass);
    };
    let Some(eth) = read::<EthHdr>(data, end, 0) else {
        return Ok(pass);
    };
    if eth.proto == ETH_P_IP.to_be() && cfg.flags & CONFIG_F_IPV4 != 0 {
        let Some(ip) = read::<Ipv4Hdr>(data, end, ETH_LEN) else {
            return Ok(pass);
        };
        if ip.ver_ihl >> 4 != 4 {
            return Ok(pass);
        }
        match source4(ctx, cfg, ip.saddr) {
            Source::Endpoint => {}
            Source::Spoofed => {
                return Err(Dropped::at(Reason::DropInvalidSource, ip.saddr, ip.daddr));
            }
            Source::Other => return Ok(pass),
        }
        // Checked only (no conntrack kfuncs under `auto`); a TTL the host
        // stack must answer; not a remote pod's.
        if cfg.flags & CONFIG_F_BYPASS == 0
            || ip.ttl <= 1
            || WEFT_PEERS.get(Key::new(32, ip.daddr)).is_none()
        {
            return Ok(pass);
        }
        return send4(ctx, cfg, data, end, &ip);
    }
    if eth.proto == ETH_P_IPV6.to_be() && cfg.flags & CONFIG_F_IPV6 != 0 {
        let Some(ip) = read::<Ipv6Hdr>(data, end, ETH_LEN) else {
            return Ok(pass);
        };
        if ip.version() != 6 {
            return Ok(pass);
        }
        match source6(ctx, cfg, &ip.saddr) {
            Source::Endpoint => {}
            Source::Spoofed => return Err(Dropped::at6(Reason::DropInvalidSource, ETH_LEN)),
            Source::Other => return Ok(pass),
        }
        if cfg.flags & CONFIG_F_BYPASS == 0
            || cfg.overlay6_ifindex == 0
            || ip.hop_limit <= 1
            || WEFT_PEERS6.get(Key::new(128, ip.daddr)).is_none()
        {
            return Ok(pass);
        }
        return send6(ctx, cfg, data, end, &ip);
    }
    Ok(pass)
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
) -> Result<Done<i32>, Dropped> {
    let len = ctx.len();
    let pass = Done {
        action: TC_ACT_OK,
        reason: Reason::Passed,
        bytes: len,
    };
    // Larger than the device (the packet, or a GSO packet's segment): the
    // stack answers with ICMP, or segments it.
    let Some(segment) = outer_segment(ctx, data, end, len, ip) else {
        return Ok(pass);
    };
    if segment - ENCAP_LEN as u32 > cfg.uplink_mtu || cfg.uplink_ifindex == 0 {
        return Ok(pass);
    }
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate::<V4>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    // The hop through this node, as routing would count it.
    if !dec_ttl(data, end, ETH_LEN) {
        return Err(Dropped::at(Reason::DropError, ip.saddr, ip.daddr));
    }
    // SAFETY: a helper without pointer arguments.
    let action = unsafe { bpf_redirect(cfg.uplink_ifindex, 0) } as i32;
    Ok(Done {
        action,
        reason: Reason::EncapBypass,
        bytes: len - ETH_LEN as u32,
    })
}

/// Transmit, IPv6: as [`send4`], to the IPv6 WireGuard device.
#[inline(always)]
fn send6(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    ip: &Ipv6Hdr,
) -> Result<Done<i32>, Dropped> {
    let len = ctx.len();
    let pass = Done {
        action: TC_ACT_OK,
        reason: Reason::Passed,
        bytes: len,
    };
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 && len - ETH_LEN as u32 > cfg.overlay6_mtu {
        return Ok(pass);
    }
    if cfg.flags & CONFIG_F_CT_GATE != 0 && !gate::<V6>(ctx, cfg, data, end, ETH_LEN, ip) {
        return Ok(pass);
    }
    if !write(data, end, ETH_LEN + 7, ip.hop_limit - 1) {
        return Err(Dropped::at6(Reason::DropError, ETH_LEN));
    }
    // SAFETY: a helper without pointer arguments.
    let action = unsafe { bpf_redirect(cfg.overlay6_ifindex, 0) } as i32;
    Ok(Done {
        action,
        reason: Reason::EncapBypass,
        bytes: len - ETH_LEN as u32,
    })
}

/// Receive: what the WireGuard device decrypted (an IP packet at the start
/// of the frame). `Ok(Some(action))`: it went into a local pod;
/// `Ok(None)`: it takes the host stack, untouched; `Err`: it was changed
/// and cannot go on (dropped).
#[inline(always)]
pub(crate) fn receive(ctx: &TcContext, cfg: &DataplaneConfig) -> Result<Option<i32>, ()> {
    if !on(cfg) {
        return Ok(None);
    }
    // SAFETY: reading a field of the context's own sk_buff.
    let proto = unsafe { (*ctx.skb.skb).protocol };
    let v6 = if proto == u32::from(ETH_P_IP.to_be()) && cfg.flags & CONFIG_F_IPV4 != 0 {
        false
    } else if proto == u32::from(ETH_P_IPV6.to_be()) && cfg.flags & CONFIG_F_IPV6 != 0 {
        true
    } else {
        return Ok(None);
    };
    let Ok((data, end)) = linear(ctx, IPV6_LEN) else {
        return Ok(None);
    };
    let ep = if v6 {
        endpoint::<V6>(ctx, cfg, data, end, 0)
    } else {
        endpoint::<V4>(ctx, cfg, data, end, 0)
    };
    let Some(ep) = ep else {
        return Ok(None);
    };
    // Room for the Ethernet header. The kernel refuses it for a packet
    // that is not GSO and would then exceed the device's MTU (a full-size
    // packet GRO did not merge): that one takes the stack, unchanged.
    // SAFETY: the helper only grows the context's own sk_buff's head.
    if unsafe { bpf_skb_change_head(ctx.skb.skb, ETH_LEN as u32, 0) } != 0 {
        return Ok(None);
    }
    let (data, end) = (ctx.data(), ctx.data_end());
    let ether = if v6 { ETH_P_IPV6 } else { ETH_P_IP };
    if !write(data, end, 12, ether.to_be()) {
        return Err(());
    }
    into_pod(ctx, data, end, &ep, v6).map(Some).ok_or(())
}
