//! Wire headers, laid out exactly as on the wire (packed, network order).
//!
//! Packed structs have alignment 1: they are only ever read and written by
//! value (`read_unaligned`/`write_unaligned`), never through references
//! into the packet.

pub(crate) const ETH_LEN: usize = 14;
pub(crate) const IPV4_LEN: usize = 20;
pub(crate) const UDP_LEN: usize = 8;
pub(crate) const VXLAN_LEN: usize = 8;
/// Outer IPv4 + UDP + VXLAN + inner Ethernet: what encapsulation inserts
/// after the outer Ethernet header.
pub(crate) const ENCAP_LEN: usize = IPV4_LEN + UDP_LEN + VXLAN_LEN + ETH_LEN;
/// Offset of the inner Ethernet header in an encapsulated frame.
pub(crate) const INNER_ETH: usize = ETH_LEN + IPV4_LEN + UDP_LEN + VXLAN_LEN;

pub(crate) const IPV6_LEN: usize = 40;
/// Outer IPv6 + UDP + VXLAN + inner Ethernet.
pub(crate) const ENCAP6_LEN: usize = IPV6_LEN + UDP_LEN + VXLAN_LEN + ETH_LEN;
/// Offset of the inner Ethernet header in a frame encapsulated over IPv6.
pub(crate) const INNER_ETH6: usize = ETH_LEN + IPV6_LEN + UDP_LEN + VXLAN_LEN;

pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
/// RFC 7348: the I flag, "VNI valid".
pub(crate) const VXLAN_FLAG_VNI: u8 = 0x08;

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub(crate) struct EthHdr {
    pub(crate) dst: [u8; 6],
    pub(crate) src: [u8; 6],
    pub(crate) proto: u16,
}

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub(crate) struct Ipv4Hdr {
    pub(crate) ver_ihl: u8,
    pub(crate) tos: u8,
    pub(crate) tot_len: u16,
    pub(crate) id: u16,
    pub(crate) frag_off: u16,
    pub(crate) ttl: u8,
    pub(crate) proto: u8,
    pub(crate) csum: u16,
    pub(crate) saddr: u32,
    pub(crate) daddr: u32,
}

/// The fixed IPv6 header (no extension headers).
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub(crate) struct Ipv6Hdr {
    /// Version (4 bits), traffic class (8), flow label (20).
    pub(crate) vtc_flow: [u8; 4],
    pub(crate) payload_len: u16,
    pub(crate) next_header: u8,
    pub(crate) hop_limit: u8,
    pub(crate) saddr: [u8; 16],
    pub(crate) daddr: [u8; 16],
}

impl Ipv6Hdr {
    pub(crate) fn version(&self) -> u8 {
        self.vtc_flow[0] >> 4
    }

    /// The traffic class's ECN bits.
    pub(crate) fn ecn(&self) -> u8 {
        (self.vtc_flow[1] >> 4) & 0x03
    }
}

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub(crate) struct UdpHdr {
    pub(crate) source: u16,
    pub(crate) dest: u16,
    pub(crate) len: u16,
    pub(crate) csum: u16,
}

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub(crate) struct VxlanHdr {
    pub(crate) flags: u8,
    pub(crate) reserved1: [u8; 3],
    /// VNI in the upper 24 bits, network order.
    pub(crate) vni_reserved: u32,
}

/// Everything encapsulation writes after the outer Ethernet header.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub(crate) struct EncapHdr {
    pub(crate) ip: Ipv4Hdr,
    pub(crate) udp: UdpHdr,
    pub(crate) vxlan: VxlanHdr,
    pub(crate) inner_eth: EthHdr,
}

const _: () = assert!(core::mem::size_of::<EncapHdr>() == ENCAP_LEN);
const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_LEN);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == IPV4_LEN);
const _: () = assert!(core::mem::size_of::<Ipv6Hdr>() == IPV6_LEN);

/// One's complement sum fold (RFC 1624): the header checksum `csum` after
/// the 16-bit word `old` became `new` (all as they are in memory).
#[inline(always)]
pub(crate) fn csum_replace(csum: u16, old: u16, new: u16) -> u16 {
    let mut sum = (!csum as u32 & 0xffff) + (!old as u32 & 0xffff) + new as u32;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The IPv4 header checksum of a header whose csum field is zero.
#[inline(always)]
pub(crate) fn ipv4_csum(ip: Ipv4Hdr) -> u16 {
    // A copy of the header as bytes: no reference into the packed struct.
    // SAFETY: Ipv4Hdr is 20 bytes of plain data with no padding.
    let b: [u8; IPV4_LEN] = unsafe { core::mem::transmute(ip) };
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < IPV4_LEN {
        sum += u16::from_ne_bytes([b[i], b[i + 1]]) as u32;
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
