//! Decapsulation: which packets are ours, and whether they may pass.
//!
//! Shared by the XDP program and its TC fallback: both see the outer
//! Ethernet frame at `data` and only differ in how they strip the headers.

use aya_ebpf::maps::lpm_trie::Key;
use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    headers::{
        ETH_LEN, ETH_P_IP, EthHdr, IPPROTO_UDP, IPV4_LEN, Ipv4Hdr, UDP_LEN, UdpHdr, VXLAN_FLAG_VNI,
        VXLAN_LEN, VxlanHdr,
    },
    maps::{WEFT_PEERS, WEFT_VTEPS},
};

/// Offset of the inner Ethernet header.
pub const INNER_ETH: usize = ETH_LEN + IPV4_LEN + UDP_LEN + VXLAN_LEN;

/// What to do with a frame.
pub enum Verdict {
    /// Not overlay traffic for us: let it through untouched.
    Pass,
    /// Our VXLAN, from a known peer, carrying a packet of that peer's
    /// subnet: strip the outer headers.
    Decap,
    /// Our VXLAN, refused.
    Drop(Reason),
}

#[inline(always)]
fn ptr_at<T>(data: usize, end: usize, off: usize) -> Option<*const T> {
    if data + off + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((data + off) as *const T)
}

#[inline(always)]
pub fn classify(data: usize, end: usize, cfg: &DataplaneConfig) -> Verdict {
    // The outer headers: anything that is not UDP to our address and VXLAN
    // port (unfragmented, no IP options) is not ours.
    let Some(eth) = ptr_at::<EthHdr>(data, end, 0) else {
        return Verdict::Pass;
    };
    // SAFETY: bounds checked by ptr_at.
    if unsafe { (*eth).proto } != ETH_P_IP.to_be() {
        return Verdict::Pass;
    }
    let Some(ip) = ptr_at::<Ipv4Hdr>(data, end, ETH_LEN) else {
        return Verdict::Pass;
    };
    let ip = unsafe { *ip };
    if ip.ver_ihl != 0x45 || ip.proto != IPPROTO_UDP || ip.daddr != cfg.local_addr_be {
        return Verdict::Pass;
    }
    // Fragments (MF set or an offset) cannot be decapsulated one by one.
    if u16::from_be(ip.frag_off) & 0x3fff != 0 {
        return Verdict::Pass;
    }
    let Some(udp) = ptr_at::<UdpHdr>(data, end, ETH_LEN + IPV4_LEN) else {
        return Verdict::Pass;
    };
    if unsafe { (*udp).dest } != cfg.port.to_be() {
        return Verdict::Pass;
    }

    // From here on it is VXLAN addressed to us.
    let Some(vx) = ptr_at::<VxlanHdr>(data, end, ETH_LEN + IPV4_LEN + UDP_LEN) else {
        return Verdict::Drop(Reason::DropMalformed);
    };
    let vx = unsafe { *vx };
    if vx.flags & VXLAN_FLAG_VNI == 0 {
        return Verdict::Drop(Reason::DropMalformed);
    }
    if u32::from_be(vx.vni_reserved) >> 8 != cfg.vni {
        return Verdict::Drop(Reason::DropWrongVni);
    }
    let Some(ieth) = ptr_at::<EthHdr>(data, end, INNER_ETH) else {
        return Verdict::Drop(Reason::DropMalformed);
    };
    if unsafe { (*ieth).proto } != ETH_P_IP.to_be() {
        return Verdict::Drop(Reason::DropMalformed);
    }
    let Some(iip) = ptr_at::<Ipv4Hdr>(data, end, INNER_ETH + ETH_LEN) else {
        return Verdict::Drop(Reason::DropMalformed);
    };
    let iip = unsafe { *iip };
    if iip.ver_ihl >> 4 != 4 || iip.ver_ihl & 0x0f < 5 {
        return Verdict::Drop(Reason::DropMalformed);
    }

    // Anti-spoofing: the inner source must lie in a subnet whose VTEP is the
    // outer source. One LPM lookup on the happy path.
    let outer_src = ip.saddr;
    match WEFT_PEERS.get(Key::new(32, iip.saddr)) {
        Some(v) if v.addr_be == outer_src => Verdict::Decap,
        _ => {
            // SAFETY: a plain hash lookup.
            if unsafe { WEFT_VTEPS.get(&outer_src) }.is_none() {
                Verdict::Drop(Reason::DropUnknownVtep)
            } else {
                Verdict::Drop(Reason::DropSpoofed)
            }
        }
    }
}
