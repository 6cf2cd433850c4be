//! Wire headers, laid out exactly as on the wire (packed, network order).

pub const ETH_LEN: usize = 14;
pub const IPV4_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
pub const VXLAN_LEN: usize = 8;
/// Outer IPv4 + UDP + VXLAN + inner Ethernet: what encapsulation inserts
/// after the outer Ethernet header.
pub const ENCAP_LEN: usize = IPV4_LEN + UDP_LEN + VXLAN_LEN + ETH_LEN;

pub const ETH_P_IP: u16 = 0x0800;
pub const IPPROTO_UDP: u8 = 17;
/// RFC 7348: the I flag, "VNI valid".
pub const VXLAN_FLAG_VNI: u8 = 0x08;

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub proto: u16,
}

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct Ipv4Hdr {
    pub ver_ihl: u8,
    pub tos: u8,
    pub tot_len: u16,
    pub id: u16,
    pub frag_off: u16,
    pub ttl: u8,
    pub proto: u8,
    pub csum: u16,
    pub saddr: u32,
    pub daddr: u32,
}

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct UdpHdr {
    pub source: u16,
    pub dest: u16,
    pub len: u16,
    pub csum: u16,
}

#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct VxlanHdr {
    pub flags: u8,
    pub reserved1: [u8; 3],
    /// VNI in the upper 24 bits, network order.
    pub vni_reserved: u32,
}

/// Everything encapsulation writes after the outer Ethernet header.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct EncapHdr {
    pub ip: Ipv4Hdr,
    pub udp: UdpHdr,
    pub vxlan: VxlanHdr,
    pub inner_eth: EthHdr,
}

const _: () = assert!(core::mem::size_of::<EncapHdr>() == ENCAP_LEN);
const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_LEN);

/// The IPv4 header checksum of a header whose csum field is zero.
#[inline(always)]
pub fn ipv4_csum(ip: &Ipv4Hdr) -> u16 {
    // SAFETY: Ipv4Hdr is 20 plain bytes.
    let words: &[u16; 10] = unsafe { &*(ip as *const Ipv4Hdr as *const [u16; 10]) };
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < 10 {
        sum += words[i] as u32;
        i += 1;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
