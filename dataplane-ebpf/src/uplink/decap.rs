//! Decapsulation: which frames are ours, and whether they may pass.
//!
//! Shared by the XDP program and its TC fallback: both see the outer
//! Ethernet frame at `data` and only differ in how they strip the headers.

use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    family::{Family, V4, V6, whose},
    headers::{
        ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, INNER_ETH, INNER_ETH6, IPPROTO_UDP, IPV4_LEN,
        IPV6_LEN, Ipv4Hdr, Ipv6Hdr, UDP_LEN, VXLAN_FLAG_VNI, VXLAN_LEN, VxlanHdr, csum_replace,
    },
    packet::{eq16, read, write},
    verdict::Dropped,
};

/// Bytes the classification reads of the common frame: outer IPv4, an
/// inner IPv4 packet.
pub(crate) const CLASSIFY_LEN4: usize = INNER_ETH + ETH_LEN + IPV4_LEN;

/// Bytes the classification reads of the frame at `[data, end)` (at least
/// `CLASSIFY_LEN4` of it in reach): the outer headers and the inner
/// Ethernet and IP headers of the families it has. Asking for no more keeps
/// an IPv4 frame's payload out of its linear part: a GSO frame from a local
/// TCP socket holds only its headers there, and pulling into a cloned skb
/// copies its head.
#[inline(always)]
pub(crate) fn classify_len(data: usize, end: usize) -> usize {
    let proto = |off: usize| read::<u16>(data, end, off + 12);
    if proto(0) == Some(ETH_P_IPV6.to_be()) {
        INNER_ETH6 + ETH_LEN + IPV6_LEN
    } else if proto(INNER_ETH) == Some(ETH_P_IPV6.to_be()) {
        INNER_ETH + ETH_LEN + IPV6_LEN
    } else {
        CLASSIFY_LEN4
    }
}

/// A frame to decapsulate.
#[derive(Clone, Copy)]
pub(crate) struct Decap {
    /// The outer header carried a congestion mark (CE) for an ECN-capable
    /// inner packet: the inner packet gets it too (RFC 6040).
    pub(crate) set_ce: bool,
    /// The bytes after the outer Ethernet header to strip.
    pub(crate) len: u32,
    /// The inner packet is IPv6.
    pub(crate) v6: bool,
}

const ECN_NOT_ECT: u8 = 0x00;
const ECN_CE: u8 = 0x03;

/// What [`classify`] found a frame to be.
#[derive(Clone, Copy)]
pub(crate) enum Classified {
    /// Not overlay traffic for us: pass it on untouched.
    NotOurs,
    /// The first fragment of our VXLAN over IPv4 (a hop on the way has a
    /// smaller MTU and fragmented the outer packet). Fragments cannot be
    /// decapsulated one by one: all of them pass, the kernel reassembles
    /// the packet, and the node's collect-metadata vxlan device
    /// decapsulates it, checked by `weft_tunnel_rx` as here. Counted, so a
    /// path with a smaller MTU shows.
    Fragment,
    /// Our VXLAN from a known peer carrying a packet of that peer's subnet
    /// (or the peer's own address): strip the outer headers.
    Ours(Decap),
}

/// Classifies the frame at `[data, end)` ([`Classified`]); `Err` when it
/// is our VXLAN and refused.
#[inline(always)]
pub(crate) fn classify(
    data: usize,
    end: usize,
    cfg: &DataplaneConfig,
) -> Result<Classified, Dropped> {
    let Some(eth) = read::<EthHdr>(data, end, 0) else {
        return Ok(Classified::NotOurs);
    };
    if eth.proto == ETH_P_IP.to_be() && cfg.ipv4() {
        classify4(data, end, cfg)
    } else if eth.proto == ETH_P_IPV6.to_be() && cfg.ipv6() {
        classify6(data, end, cfg)
    } else {
        Ok(Classified::NotOurs)
    }
}

/// [`classify`] for VXLAN over IPv4: anything that is not UDP to our
/// address and VXLAN port (no IP options) is not ours.
#[inline(always)]
fn classify4(data: usize, end: usize, cfg: &DataplaneConfig) -> Result<Classified, Dropped> {
    let Some(ip) = read::<Ipv4Hdr>(data, end, ETH_LEN) else {
        return Ok(Classified::NotOurs);
    };
    if ip.ver_ihl != 0x45 || ip.proto != IPPROTO_UDP || ip.daddr != cfg.local_addr_be {
        return Ok(Classified::NotOurs);
    }
    let frag = u16::from_be(ip.frag_off);
    if frag & 0x1fff != 0 {
        // A later fragment: no UDP header to tell whose it is. It passes,
        // as the first one does.
        return Ok(Classified::NotOurs);
    }
    if read::<u16>(data, end, ETH_LEN + IPV4_LEN + 2) != Some(cfg.port.to_be()) {
        return Ok(Classified::NotOurs);
    }
    if frag & 0x2000 != 0 {
        return Ok(Classified::Fragment);
    }
    vxlan::<V4>(data, end, cfg, &ip)
}

/// [`classify`] for VXLAN over IPv6 (`flannel-v6.<VNI>`'s traffic): IPv6
/// pod packets between IPv6 VTEPs. A frame with extension headers (an IPv6
/// fragment among them) is passed: the kernel reassembles it and its
/// vxlan device decapsulates it, checked by `weft_tunnel_rx`.
#[inline(always)]
fn classify6(data: usize, end: usize, cfg: &DataplaneConfig) -> Result<Classified, Dropped> {
    let Some(ip) = read::<Ipv6Hdr>(data, end, ETH_LEN) else {
        return Ok(Classified::NotOurs);
    };
    if ip.version() != 6 || ip.next_header != IPPROTO_UDP || !eq16(&ip.daddr, &cfg.local_addr6) {
        return Ok(Classified::NotOurs);
    }
    if read::<u16>(data, end, ETH_LEN + IPV6_LEN + 2) != Some(cfg.port.to_be()) {
        return Ok(Classified::NotOurs);
    }
    vxlan::<V6>(data, end, cfg, &ip)
}

/// The rest of [`classify`], once the outer header `outer` (of family `F`)
/// says VXLAN to our port: the VXLAN header and VNI, an inner frame of the
/// same family, ECN, and whose the inner packet is ([`whose`]).
#[inline(always)]
fn vxlan<F: Family>(
    data: usize,
    end: usize,
    cfg: &DataplaneConfig,
    outer: &F::Hdr,
) -> Result<Classified, Dropped> {
    let refuse = |r: Reason| F::dropped(r, outer, ETH_LEN);
    let at = ETH_LEN + F::HDR_LEN + UDP_LEN;
    let vx = read::<VxlanHdr>(data, end, at).ok_or(refuse(Reason::DropMalformed))?;
    if vx.flags & VXLAN_FLAG_VNI == 0 {
        return Err(refuse(Reason::DropMalformed));
    }
    if u32::from_be(vx.vni_reserved) >> 8 != cfg.vni {
        return Err(refuse(Reason::DropWrongVni));
    }
    let inner_eth = at + VXLAN_LEN;
    let ieth = read::<EthHdr>(data, end, inner_eth).ok_or(refuse(Reason::DropMalformed))?;
    if ieth.proto != F::ETH_P.to_be() {
        return Err(refuse(Reason::DropMalformed));
    }
    let inner_at = inner_eth + ETH_LEN;
    let iip = read::<F::Hdr>(data, end, inner_at).ok_or(refuse(Reason::DropMalformed))?;
    if !F::well_formed(&iip) {
        return Err(refuse(Reason::DropMalformed));
    }

    // ECN (RFC 6040): a congestion mark on the outer header goes to the
    // inner packet, unless the inner packet is not ECN-capable.
    let inner_ecn = F::ecn(&iip);
    let set_ce = F::ecn(outer) == ECN_CE && inner_ecn != ECN_CE;
    if set_ce && inner_ecn == ECN_NOT_ECT {
        return Err(F::dropped(Reason::DropEcn, &iip, inner_at));
    }
    whose::<F>(cfg, &F::saddr(outer), &iip).map_err(|r| match r {
        Reason::DropUnknownVtep => refuse(r),
        r => F::dropped(r, &iip, inner_at),
    })?;
    Ok(Classified::Ours(Decap {
        set_ce,
        len: F::ENCAP_LEN as u32,
        v6: F::V6,
    }))
}

/// Marks the decapsulated packet at `ETH_LEN` (IPv6 if `v6`) as having met
/// congestion (CE).
#[inline(always)]
pub(crate) fn set_ce(data: usize, end: usize, v6: bool) -> bool {
    if v6 {
        // The ECN bits are the low two of the traffic class, which straddles
        // the first two bytes; no header checksum.
        return match read::<u8>(data, end, ETH_LEN + 1) {
            Some(b) => write(data, end, ETH_LEN + 1, b | (ECN_CE << 4)),
            None => false,
        };
    }
    set_ce4(data, end)
}

/// Marks the (decapsulated) IPv4 packet at `ETH_LEN` as having met
/// congestion (CE), updating its header checksum (RFC 1624).
#[inline(always)]
fn set_ce4(data: usize, end: usize) -> bool {
    let Some(first) = read::<[u8; 2]>(data, end, ETH_LEN) else {
        return false;
    };
    let Some(csum) = read::<u16>(data, end, ETH_LEN + 10) else {
        return false;
    };
    let new = [first[0], first[1] | ECN_CE];
    let csum = csum_replace(csum, u16::from_ne_bytes(first), u16::from_ne_bytes(new));
    write(data, end, ETH_LEN, new) && write(data, end, ETH_LEN + 10, csum)
}
