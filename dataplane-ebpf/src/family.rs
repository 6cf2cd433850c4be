//! The two address families as the programs see them, behind one trait: a
//! check written once (the inner packet of a VXLAN frame, whose it is)
//! serves VXLAN over IPv4 and over IPv6. Everything is inlined and
//! monomorphised: the verifier sees the same code as if written twice.

use aya_ebpf::maps::lpm_trie::Key;
use dataplane_common::{DataplaneConfig, Endpoint, Reason};

use crate::{
    ct::Flow,
    headers::{ENCAP_LEN, ENCAP6_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_LEN, IPV6_LEN, Ipv4Hdr, Ipv6Hdr},
    maps::{WEFT_ENDPOINTS, WEFT_ENDPOINTS6, WEFT_PEERS, WEFT_PEERS6, WEFT_VTEPS, WEFT_VTEPS6},
    packet::{eq16, in_subnet4, in_subnet6},
    verdict::Dropped,
};

pub(crate) trait Family {
    /// The fixed IP header.
    type Hdr: Copy;
    /// An address as the header holds it.
    type Addr: Copy;
    /// The Ethernet type of the family's packets.
    const ETH_P: u16;
    const HDR_LEN: usize;
    /// What VXLAN over this family puts after the outer Ethernet header.
    const ENCAP_LEN: usize;
    const V6: bool;

    fn saddr(h: &Self::Hdr) -> Self::Addr;
    fn daddr(h: &Self::Hdr) -> Self::Addr;
    /// The header's ECN bits.
    fn ecn(h: &Self::Hdr) -> u8;
    /// Whether an inner header is a plausible one of this family (its
    /// version, and for IPv4 a header length of at least 20 bytes).
    fn well_formed(h: &Self::Hdr) -> bool;
    fn eq(a: &Self::Addr, b: &Self::Addr) -> bool;
    /// The VTEP of the peer subnet holding `a`, if any.
    fn peer_vtep(a: &Self::Addr) -> Option<Self::Addr>;
    /// Whether `a` is a known peer's VTEP.
    fn is_vtep(a: &Self::Addr) -> bool;
    /// Whether `a` lies in this node's pod subnet of the family.
    fn is_own(cfg: &DataplaneConfig, a: &Self::Addr) -> bool;
    /// A drop of the packet whose header `h` lies at `off` in the frame,
    /// with what `--trace-drops` needs to show its addresses.
    fn dropped(r: Reason, h: &Self::Hdr, off: usize) -> Dropped;
    /// The protocol right after the fixed header.
    fn proto(h: &Self::Hdr) -> u8;
    /// Whether the transport header follows the fixed header at once and
    /// whole: IPv4 without options and unfragmented (IPv6 extension
    /// headers show as another protocol).
    fn plain(h: &Self::Hdr) -> bool;
    /// The flow's addresses, for a conntrack lookup.
    fn flow(h: &Self::Hdr) -> Flow;
    /// Whether the packet may be forwarded once more (TTL or hop limit
    /// above 1).
    fn forwardable(h: &Self::Hdr) -> bool;
    /// The local pod registered for address `a`, if any.
    fn endpoint(a: &Self::Addr) -> Option<Endpoint>;
}

pub(crate) struct V4;
pub(crate) struct V6;

impl Family for V4 {
    type Hdr = Ipv4Hdr;
    /// Network order.
    type Addr = u32;
    const ETH_P: u16 = ETH_P_IP;
    const HDR_LEN: usize = IPV4_LEN;
    const ENCAP_LEN: usize = ENCAP_LEN;
    const V6: bool = false;

    #[inline(always)]
    fn saddr(h: &Ipv4Hdr) -> u32 {
        h.saddr
    }
    #[inline(always)]
    fn daddr(h: &Ipv4Hdr) -> u32 {
        h.daddr
    }
    #[inline(always)]
    fn ecn(h: &Ipv4Hdr) -> u8 {
        h.tos & 0x03
    }
    #[inline(always)]
    fn well_formed(h: &Ipv4Hdr) -> bool {
        h.ver_ihl >> 4 == 4 && h.ver_ihl & 0x0f >= 5
    }
    #[inline(always)]
    fn eq(a: &u32, b: &u32) -> bool {
        a == b
    }
    #[inline(always)]
    fn peer_vtep(a: &u32) -> Option<u32> {
        WEFT_PEERS.get(Key::new(32, *a)).map(|v| v.addr_be)
    }
    #[inline(always)]
    fn is_vtep(a: &u32) -> bool {
        // SAFETY: a plain hash lookup; the value is not used.
        unsafe { WEFT_VTEPS.get(a) }.is_some()
    }
    #[inline(always)]
    fn is_own(cfg: &DataplaneConfig, a: &u32) -> bool {
        in_subnet4(*a, cfg.subnet4_be, cfg.mask4_be)
    }
    #[inline(always)]
    fn dropped(r: Reason, h: &Ipv4Hdr, _off: usize) -> Dropped {
        Dropped::at(r, h.saddr, h.daddr)
    }
    #[inline(always)]
    fn proto(h: &Ipv4Hdr) -> u8 {
        h.proto
    }
    #[inline(always)]
    fn plain(h: &Ipv4Hdr) -> bool {
        h.ver_ihl == 0x45 && u16::from_be(h.frag_off) & 0x3fff == 0
    }
    #[inline(always)]
    fn flow(h: &Ipv4Hdr) -> Flow {
        Flow::V4 {
            saddr: h.saddr,
            daddr: h.daddr,
        }
    }
    #[inline(always)]
    fn forwardable(h: &Ipv4Hdr) -> bool {
        h.ttl > 1
    }
    #[inline(always)]
    fn endpoint(a: &u32) -> Option<Endpoint> {
        // SAFETY: a plain hash lookup; the value is copied out at once.
        unsafe { WEFT_ENDPOINTS.get(a) }.copied()
    }
}

impl Family for V6 {
    type Hdr = Ipv6Hdr;
    type Addr = [u8; 16];
    const ETH_P: u16 = ETH_P_IPV6;
    const HDR_LEN: usize = IPV6_LEN;
    const ENCAP_LEN: usize = ENCAP6_LEN;
    const V6: bool = true;

    #[inline(always)]
    fn saddr(h: &Ipv6Hdr) -> [u8; 16] {
        h.saddr
    }
    #[inline(always)]
    fn daddr(h: &Ipv6Hdr) -> [u8; 16] {
        h.daddr
    }
    #[inline(always)]
    fn ecn(h: &Ipv6Hdr) -> u8 {
        h.ecn()
    }
    #[inline(always)]
    fn well_formed(h: &Ipv6Hdr) -> bool {
        h.version() == 6
    }
    #[inline(always)]
    fn eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
        eq16(a, b)
    }
    #[inline(always)]
    fn peer_vtep(a: &[u8; 16]) -> Option<[u8; 16]> {
        WEFT_PEERS6.get(Key::new(128, *a)).map(|v| v.addr)
    }
    #[inline(always)]
    fn is_vtep(a: &[u8; 16]) -> bool {
        // SAFETY: a plain hash lookup; the value is not used.
        unsafe { WEFT_VTEPS6.get(a) }.is_some()
    }
    #[inline(always)]
    fn is_own(cfg: &DataplaneConfig, a: &[u8; 16]) -> bool {
        in_subnet6(a, &cfg.subnet6, &cfg.mask6)
    }
    #[inline(always)]
    fn dropped(r: Reason, _h: &Ipv6Hdr, off: usize) -> Dropped {
        Dropped::at6(r, off)
    }
    #[inline(always)]
    fn proto(h: &Ipv6Hdr) -> u8 {
        h.next_header
    }
    #[inline(always)]
    fn plain(_h: &Ipv6Hdr) -> bool {
        true
    }
    #[inline(always)]
    fn flow(h: &Ipv6Hdr) -> Flow {
        Flow::V6 {
            saddr: h.saddr,
            daddr: h.daddr,
        }
    }
    #[inline(always)]
    fn forwardable(h: &Ipv6Hdr) -> bool {
        h.version() == 6 && h.hop_limit > 1
    }
    #[inline(always)]
    fn endpoint(a: &[u8; 16]) -> Option<Endpoint> {
        // SAFETY: a plain hash lookup; the value is copied out at once.
        unsafe { WEFT_ENDPOINTS6.get(a) }.copied()
    }
}

/// Whose the inner packet of a frame from the VTEP `outer_src` is allowed
/// to be: its source in a subnet whose VTEP is `outer_src` (one LPM lookup
/// on the happy path), or that VTEP's own address (the remote node itself
/// talking to a pod); its destination in this node's pod subnet (a VTEP
/// may not use this node as a relay to anywhere else).
#[inline(always)]
pub(crate) fn whose<F: Family>(
    cfg: &DataplaneConfig,
    outer_src: &F::Addr,
    inner: &F::Hdr,
) -> Result<(), Reason> {
    let src = F::saddr(inner);
    let from_peer = F::peer_vtep(&src).is_some_and(|v| F::eq(&v, outer_src));
    if !from_peer {
        if !F::is_vtep(outer_src) {
            return Err(Reason::DropUnknownVtep);
        }
        if !F::eq(&src, outer_src) {
            return Err(Reason::DropSpoofed);
        }
    }
    if !F::is_own(cfg, &F::daddr(inner)) {
        return Err(Reason::DropForeignDestination);
    }
    Ok(())
}
