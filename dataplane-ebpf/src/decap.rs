//! Decapsulation: which frames are ours, and whether they may pass.
//!
//! Shared by the XDP program and its TC fallback: both see the outer
//! Ethernet frame at `data` and only differ in how they strip the headers.

use aya_ebpf::maps::lpm_trie::Key;
use dataplane_common::{CONFIG_F_IPV4, CONFIG_F_IPV6, DataplaneConfig, Reason};

use crate::{
    headers::{
        ENCAP_LEN, ENCAP6_LEN, ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, INNER_ETH, INNER_ETH6,
        IPPROTO_UDP, IPV4_LEN, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, UDP_LEN, VXLAN_FLAG_VNI, VxlanHdr,
        csum_replace,
    },
    maps::{WEFT_PEERS, WEFT_PEERS6, WEFT_VTEPS, WEFT_VTEPS6},
    packet::{eq16, in_subnet4, in_subnet6, read, write},
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

const ECN_MASK: u8 = 0x03;
const ECN_NOT_ECT: u8 = 0x00;
const ECN_CE: u8 = 0x03;

/// Classifies the frame at `[data, end)`: `Ok(None)` when it is not overlay
/// traffic for us (pass it on untouched), `Ok(Some(_))` when it is our
/// VXLAN from a known peer carrying a packet of that peer's subnet (or the
/// peer's own address: strip the outer headers), `Err` when it is our
/// VXLAN and refused.
#[inline(always)]
pub(crate) fn classify(
    data: usize,
    end: usize,
    cfg: &DataplaneConfig,
) -> Result<Option<Decap>, Dropped> {
    let Some(eth) = read::<EthHdr>(data, end, 0) else {
        return Ok(None);
    };
    if eth.proto == ETH_P_IP.to_be() && cfg.flags & CONFIG_F_IPV4 != 0 {
        classify4(data, end, cfg)
    } else if eth.proto == ETH_P_IPV6.to_be() && cfg.flags & CONFIG_F_IPV6 != 0 {
        classify6(data, end, cfg)
    } else {
        Ok(None)
    }
}

/// [`classify`] for VXLAN over IPv4.
#[inline(always)]
fn classify4(data: usize, end: usize, cfg: &DataplaneConfig) -> Result<Option<Decap>, Dropped> {
    // The outer headers: anything that is not UDP to our address and VXLAN
    // port (no IP options) is not ours.
    let Some(ip) = read::<Ipv4Hdr>(data, end, ETH_LEN) else {
        return Ok(None);
    };
    if ip.ver_ihl != 0x45 || ip.proto != IPPROTO_UDP || ip.daddr != cfg.local_addr_be {
        return Ok(None);
    }
    let frag = u16::from_be(ip.frag_off);
    if frag & 0x1fff != 0 {
        // A later fragment: no UDP header to tell whose it is.
        return Ok(None);
    }
    let Some(dport) = read::<u16>(data, end, ETH_LEN + IPV4_LEN + 2) else {
        return Ok(None);
    };
    if dport != cfg.port.to_be() {
        return Ok(None);
    }
    if frag & 0x2000 != 0 {
        // The first fragment of a VXLAN packet: fragments cannot be
        // decapsulated one by one, and there is no socket to reassemble
        // them for. Counted, so a path with a smaller MTU shows.
        return Err(Dropped::at(Reason::DropFragment, ip.saddr, ip.daddr));
    }

    // From here on it is VXLAN addressed to us.
    let refuse = |r: Reason| Dropped::at(r, ip.saddr, ip.daddr);
    let vx = read::<VxlanHdr>(data, end, ETH_LEN + IPV4_LEN + UDP_LEN)
        .ok_or(refuse(Reason::DropMalformed))?;
    if vx.flags & VXLAN_FLAG_VNI == 0 {
        return Err(refuse(Reason::DropMalformed));
    }
    if u32::from_be(vx.vni_reserved) >> 8 != cfg.vni {
        return Err(refuse(Reason::DropWrongVni));
    }
    let ieth = read::<EthHdr>(data, end, INNER_ETH).ok_or(refuse(Reason::DropMalformed))?;
    if ieth.proto != ETH_P_IP.to_be() {
        return Err(refuse(Reason::DropMalformed));
    }
    let iip =
        read::<Ipv4Hdr>(data, end, INNER_ETH + ETH_LEN).ok_or(refuse(Reason::DropMalformed))?;
    if iip.ver_ihl >> 4 != 4 || iip.ver_ihl & 0x0f < 5 {
        return Err(refuse(Reason::DropMalformed));
    }

    // ECN (RFC 6040): a congestion mark on the outer header goes to the
    // inner packet, unless the inner packet is not ECN-capable.
    let inner_ecn = iip.tos & ECN_MASK;
    let set_ce = ip.tos & ECN_MASK == ECN_CE && inner_ecn != ECN_CE;
    if set_ce && inner_ecn == ECN_NOT_ECT {
        return Err(Dropped::at(Reason::DropEcn, iip.saddr, iip.daddr));
    }

    // Anti-spoofing: the inner source must lie in a subnet whose VTEP is the
    // outer source (one LPM lookup on the happy path), or be that VTEP's
    // own address (the remote node itself talking to a pod).
    let outer_src = ip.saddr;
    let ok = Decap {
        set_ce,
        len: ENCAP_LEN as u32,
        v6: false,
    };
    match check_source4(outer_src, iip.saddr) {
        Ok(()) => {}
        Err(r) if r == Reason::DropUnknownVtep => return Err(Dropped::at(r, outer_src, ip.daddr)),
        Err(r) => return Err(Dropped::at(r, iip.saddr, iip.daddr)),
    }
    // And it is for this node: a pod here (or the overlay address).
    if !in_subnet4(iip.daddr, cfg.subnet4_be, cfg.mask4_be) {
        return Err(Dropped::at(
            Reason::DropForeignDestination,
            iip.saddr,
            iip.daddr,
        ));
    }
    Ok(Some(ok))
}

/// [`classify`] for VXLAN over IPv6 (`flannel-v6.<VNI>`'s traffic): IPv6
/// pod packets between IPv6 VTEPs. A frame with extension headers (an IPv6
/// fragment among them) is passed: the kernel reassembles it and its
/// vxlan device decapsulates it, checked by `weft_tunnel_rx`.
#[inline(always)]
fn classify6(data: usize, end: usize, cfg: &DataplaneConfig) -> Result<Option<Decap>, Dropped> {
    let Some(ip) = read::<Ipv6Hdr>(data, end, ETH_LEN) else {
        return Ok(None);
    };
    if ip.version() != 6 || ip.next_header != IPPROTO_UDP || !eq16(&ip.daddr, &cfg.local_addr6) {
        return Ok(None);
    }
    let Some(dport) = read::<u16>(data, end, ETH_LEN + IPV6_LEN + 2) else {
        return Ok(None);
    };
    if dport != cfg.port.to_be() {
        return Ok(None);
    }
    let refuse = |r: Reason| Dropped::at6(r, ETH_LEN);
    let vx = read::<VxlanHdr>(data, end, ETH_LEN + IPV6_LEN + UDP_LEN)
        .ok_or(refuse(Reason::DropMalformed))?;
    if vx.flags & VXLAN_FLAG_VNI == 0 {
        return Err(refuse(Reason::DropMalformed));
    }
    if u32::from_be(vx.vni_reserved) >> 8 != cfg.vni {
        return Err(refuse(Reason::DropWrongVni));
    }
    let ieth = read::<EthHdr>(data, end, INNER_ETH6).ok_or(refuse(Reason::DropMalformed))?;
    if ieth.proto != ETH_P_IPV6.to_be() {
        return Err(refuse(Reason::DropMalformed));
    }
    let iip =
        read::<Ipv6Hdr>(data, end, INNER_ETH6 + ETH_LEN).ok_or(refuse(Reason::DropMalformed))?;
    if iip.version() != 6 {
        return Err(refuse(Reason::DropMalformed));
    }
    let inner_ecn = iip.ecn();
    let set_ce = ip.ecn() == ECN_CE && inner_ecn != ECN_CE;
    if set_ce && inner_ecn == ECN_NOT_ECT {
        return Err(Dropped::at6(Reason::DropEcn, INNER_ETH6 + ETH_LEN));
    }
    let ok = Decap {
        set_ce,
        len: ENCAP6_LEN as u32,
        v6: true,
    };
    match check_source6(&ip.saddr, &iip.saddr) {
        Ok(()) => {}
        Err(r) if r == Reason::DropUnknownVtep => return Err(Dropped::at6(r, ETH_LEN)),
        Err(r) => return Err(Dropped::at6(r, INNER_ETH6 + ETH_LEN)),
    }
    if !in_subnet6(&iip.daddr, &cfg.subnet6, &cfg.mask6) {
        return Err(Dropped::at6(
            Reason::DropForeignDestination,
            INNER_ETH6 + ETH_LEN,
        ));
    }
    Ok(Some(ok))
}

/// Anti-spoofing over IPv6: the inner source must lie in a subnet whose
/// VTEP is `outer_src`, or be that VTEP's own address.
#[inline(always)]
pub(crate) fn check_source6(outer_src: &[u8; 16], inner_src: &[u8; 16]) -> Result<(), Reason> {
    if let Some(v) = WEFT_PEERS6.get(Key::new(128, *inner_src))
        && eq16(&v.addr, outer_src)
    {
        return Ok(());
    }
    // SAFETY: a plain hash lookup; the value is not used.
    if unsafe { WEFT_VTEPS6.get(outer_src) }.is_none() {
        return Err(Reason::DropUnknownVtep);
    }
    if eq16(inner_src, outer_src) {
        return Ok(());
    }
    Err(Reason::DropSpoofed)
}

/// Anti-spoofing over IPv4, as [`check_source6`] (addresses in network
/// order).
#[inline(always)]
pub(crate) fn check_source4(outer_src: u32, inner_src: u32) -> Result<(), Reason> {
    if let Some(v) = WEFT_PEERS.get(Key::new(32, inner_src))
        && v.addr_be == outer_src
    {
        return Ok(());
    }
    // SAFETY: a plain hash lookup; the value is not used.
    if unsafe { WEFT_VTEPS.get(outer_src) }.is_none() {
        return Err(Reason::DropUnknownVtep);
    }
    if inner_src == outer_src {
        return Ok(());
    }
    Err(Reason::DropSpoofed)
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
