//! VXLAN over IPv6, between IPv6 VTEPs (flannel's `flannel-v6.<VNI>`).
//!
//! Over IPv6 the outer UDP checksum is mandatory (the kernel's vxlan
//! device drops zero checksums unless told otherwise), and for a GSO packet
//! every segment needs its own. `bpf_skb_adjust_room` can only mark an skb
//! as a UDP tunnel without checksums, so the segments of a packet
//! encapsulated here would all carry one stale checksum. Instead the
//! programs decide everything (the peer, its VTEP, the VNI, the inner MAC
//! addresses, the hop through this node) and set it as the skb's tunnel
//! metadata; the IPv6 overlay device, the kernel's vxlan driver in
//! collect-metadata mode, writes the outer headers from it, checksummed,
//! and marks GSO packets so every segment gets its checksum.
//!
//! - `encap6` runs at the overlay device's TC egress, for what the host
//!   stack routed there (the legacy path, the node's own traffic); a packet
//!   host routing already set up passes through untouched.
//! - `tunnel_rx` runs at its TC ingress, for what the kernel decapsulated
//!   itself: IPv6 fragments of VXLAN, which the uplink's programs pass for
//!   the kernel to reassemble. They get the same checks.

use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::{
        BPF_F_TUNINFO_IPV6, TC_ACT_OK, bpf_tunnel_key, bpf_tunnel_key__bindgen_ty_1,
        bpf_tunnel_key__bindgen_ty_2, bpf_tunnel_key__bindgen_ty_3,
    },
    helpers::generated::{bpf_skb_change_type, bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::{DataplaneConfig, Reason, Vtep6};

use crate::{
    family::{Family as _, V4, V6, whose},
    headers::{ENCAP6_LEN, ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, IPV6_LEN, Ipv4Hdr, Ipv6Hdr},
    maps::WEFT_PEERS6,
    packet::{eq16, linear, read, write},
    verdict::{Done, Dropped, Verdict},
};

/// The outer hop limit, as the kernel's vxlan device sets it by default.
const OUTER_TTL: u8 = 64;

/// `PACKET_HOST`.
const PACKET_HOST: u32 = 0;

/// Whether the frame is IPv6 to a multicast address.
#[inline(always)]
pub(crate) fn is_multicast(ctx: &TcContext) -> bool {
    let Ok((data, end)) = linear(ctx, ETH_LEN + IPV6_LEN) else {
        return false;
    };
    let proto = read::<u16>(data, end, 12);
    let first = read::<u8>(data, end, ETH_LEN + 24);
    proto == Some(ETH_P_IPV6.to_be()) && first == Some(0xff)
}

/// Whether the skb already carries a tunnel key (host routing set it).
#[inline(always)]
pub(crate) fn has_tunnel_key(ctx: &TcContext) -> bool {
    tunnel_key(ctx).is_some()
}

/// The skb's tunnel key (IPv6 first, then IPv4), if it carries one.
#[inline(always)]
fn tunnel_key(ctx: &TcContext) -> Option<(bpf_tunnel_key, bool)> {
    let size = core::mem::size_of::<bpf_tunnel_key>() as u32;
    for (flags, v6) in [(BPF_F_TUNINFO_IPV6 as u64, true), (0, false)] {
        // Filled by the helper (which clears it on failure): no zeroing
        // here, which would compile to a call to memset.
        let mut key = MaybeUninit::<bpf_tunnel_key>::uninit();
        // SAFETY: the helper writes `size` bytes into `key`, on this stack
        // frame, whether it succeeds or not.
        let r = unsafe { bpf_skb_get_tunnel_key(ctx.skb.skb, key.as_mut_ptr(), size, flags) };
        if r == 0 {
            // SAFETY: the helper filled the whole key.
            return Some((unsafe { key.assume_init() }, v6));
        }
    }
    None
}

/// Sets the tunnel key for `vtep`: the kernel's vxlan device encapsulates
/// from it (outer IPv6 from our address to the VTEP's, the VNI, hop limit
/// 64, the UDP checksum on).
#[inline(always)]
pub(crate) fn set_tunnel(ctx: &TcContext, cfg: &DataplaneConfig, vtep: &Vtep6) -> Result<(), ()> {
    let mut key = bpf_tunnel_key {
        tunnel_id: cfg.vni,
        __bindgen_anon_1: bpf_tunnel_key__bindgen_ty_1 {
            remote_ipv6: words(&vtep.addr),
        },
        tunnel_tos: 0,
        tunnel_ttl: OUTER_TTL,
        __bindgen_anon_2: bpf_tunnel_key__bindgen_ty_2 { tunnel_ext: 0 },
        tunnel_label: 0,
        __bindgen_anon_3: bpf_tunnel_key__bindgen_ty_3 {
            local_ipv6: words(&cfg.local_addr6),
        },
    };
    // SAFETY: the helper reads `size` bytes of `key`, on this stack frame.
    let r = unsafe {
        bpf_skb_set_tunnel_key(
            ctx.skb.skb,
            &mut key,
            core::mem::size_of::<bpf_tunnel_key>() as u32,
            BPF_F_TUNINFO_IPV6 as u64,
        )
    };
    if r == 0 { Ok(()) } else { Err(()) }
}

/// An IPv6 address as the tunnel key holds it (its bytes, as four words).
#[inline(always)]
fn words(a: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

/// The inverse of [`words`].
#[inline(always)]
fn bytes(w: &[u32; 4]) -> [u8; 16] {
    let (a, b, c, d) = (
        w[0].to_ne_bytes(),
        w[1].to_ne_bytes(),
        w[2].to_ne_bytes(),
        w[3].to_ne_bytes(),
    );
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

/// The inner frame's MACs: to the peer's VTEP MAC (a flannel node's vxlan
/// device drops frames for any other), from ours.
#[inline(always)]
pub(crate) fn set_inner_macs(data: usize, end: usize, cfg: &DataplaneConfig, vtep: &Vtep6) -> bool {
    write(data, end, 0, vtep.mac) && write(data, end, 6, cfg.vtep6_mac)
}

/// Whether a `len`-byte frame to a remote IPv6 pod cannot go through the
/// overlay as it is: not GSO and over the overlay MTU, or so large that
/// the outer payload length would not fit in 16 bits.
#[inline(always)]
pub(crate) fn too_big6(ctx: &TcContext, cfg: &DataplaneConfig, len: u32) -> bool {
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    let inner = len - ETH_LEN as u32;
    let outer_payload = inner + ENCAP6_LEN as u32 - IPV6_LEN as u32;
    outer_payload > u16::MAX as u32 || gso_size == 0 && inner > cfg.overlay6_mtu
}

/// Encapsulation over IPv6, at the IPv6 overlay device's egress.
#[inline(always)]
pub(crate) fn encap6(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    let len = ctx.len();
    let (data, end) = linear(ctx, ETH_LEN + IPV6_LEN)?;
    let eth = read::<EthHdr>(data, end, 0).ok_or(Reason::DropMalformed)?;
    if eth.proto != ETH_P_IPV6.to_be() {
        // Only IPv6 is routed here; without a key the device drops it.
        return Err(Reason::DropNoRoute.into());
    }
    let ip = read::<Ipv6Hdr>(data, end, ETH_LEN).ok_or(Reason::DropMalformed)?;
    let drop = |r: Reason| Dropped::at6(r, ETH_LEN);
    let vtep = *WEFT_PEERS6
        .get(Key::new(128, ip.daddr))
        .ok_or(drop(Reason::DropNoRoute))?;
    if !set_inner_macs(data, end, cfg, &vtep) {
        return Err(drop(Reason::DropError));
    }
    set_tunnel(ctx, cfg, &vtep).map_err(|()| drop(Reason::DropError))?;
    Ok(Done::new(
        TC_ACT_OK,
        Reason::Encapsulated,
        len + ENCAP6_LEN as u32,
    ))
}

/// What the kernel decapsulated, at the IPv6 overlay device's ingress: our
/// VNI, from a known VTEP, an inner source of that VTEP's subnet (or the
/// VTEP itself), as the uplink's programs check.
#[inline(always)]
pub(crate) fn tunnel_rx(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    let len = ctx.len();
    let Some((key, v6)) = tunnel_key(ctx) else {
        return Err(Reason::DropMalformed.into());
    };
    if key.tunnel_id != cfg.vni {
        return Err(Reason::DropWrongVni.into());
    }
    let (data, end) = linear(ctx, ETH_LEN + IPV6_LEN)?;
    let eth = read::<EthHdr>(data, end, 0).ok_or(Reason::DropMalformed)?;
    // SAFETY: reading the union members the helper filled (IPv6 when `v6`).
    let (remote, local) = unsafe {
        (
            key.__bindgen_anon_1.remote_ipv6,
            key.__bindgen_anon_3.local_ipv6,
        )
    };
    // The device listens on every address: VXLAN sent to another of the
    // node's addresses (a pod's gateway, from inside the node) is not a
    // peer's, whatever its outer source says. The uplink's programs take
    // only what is sent to the node's VTEP address, and so does this.
    // (The helper gives IPv4 addresses in host order.)
    let to_us = if v6 {
        eq16(&bytes(&local), &cfg.local_addr6)
    } else {
        local[0].to_be() == cfg.local_addr_be
    };
    if !to_us {
        return Err(Reason::DropForeignDestination.into());
    }
    if v6 && eth.proto == ETH_P_IPV6.to_be() {
        let ip = read::<Ipv6Hdr>(data, end, ETH_LEN).ok_or(Reason::DropMalformed)?;
        whose::<V6>(cfg, &bytes(&remote), &ip).map_err(|r| V6::dropped(r, &ip, ETH_LEN))?;
    } else if !v6 && eth.proto == ETH_P_IP.to_be() {
        let ip = read::<Ipv4Hdr>(data, end, ETH_LEN).ok_or(Reason::DropMalformed)?;
        // The helper gives IPv4 addresses in host order.
        whose::<V4>(cfg, &remote[0].to_be(), &ip).map_err(|r| V4::dropped(r, &ip, ETH_LEN))?;
    } else {
        return Err(Reason::DropMalformed.into());
    }
    // The frame is addressed to the VTEP MAC of its family's overlay
    // device, not necessarily this one's: take it as ours.
    // SAFETY: the helper only sets the context's sk_buff's packet type.
    unsafe { bpf_skb_change_type(ctx.skb.skb, PACKET_HOST) };
    Ok(Done::new(TC_ACT_OK, Reason::Decapsulated, len))
}
