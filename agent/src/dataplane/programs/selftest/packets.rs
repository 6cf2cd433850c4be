//! Frames for the self-test, built byte by byte as RFC 7348 (VXLAN), RFC
//! 791/8200 (IPv4/IPv6) and RFC 768 (UDP) lay them out. Nothing here comes
//! from the eBPF crate: the programs are checked against the wire format,
//! not against themselves.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::mac::MacAddr;

pub(super) const ETH_P_IP: u16 = 0x0800;
pub(super) const ETH_P_IPV6: u16 = 0x86dd;
pub(super) const ETH_P_ARP: u16 = 0x0806;
pub(super) const IPPROTO_UDP: u8 = 17;
pub(super) const ETH_LEN: usize = 14;
pub(super) const IPV4_LEN: usize = 20;
pub(super) const IPV6_LEN: usize = 40;
/// What VXLAN over IPv4 puts after the outer Ethernet header: IPv4, UDP,
/// VXLAN and the inner Ethernet header.
pub(super) const ENCAP4: usize = IPV4_LEN + 8 + 8 + ETH_LEN;
/// The same over IPv6.
pub(super) const ENCAP6: usize = IPV6_LEN + 8 + 8 + ETH_LEN;

/// An Ethernet header.
pub(super) fn eth(dst: MacAddr, src: MacAddr, proto: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(ETH_LEN);
    b.extend_from_slice(&dst.0);
    b.extend_from_slice(&src.0);
    b.extend_from_slice(&proto.to_be_bytes());
    b
}

/// An IP packet: header and a UDP datagram of `payload` bytes (ports 5000
/// to 6000).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ip {
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    /// Traffic class / TOS byte (its low two bits are ECN).
    pub(super) tos: u8,
    pub(super) ttl: u8,
    /// IPv4: the flags and fragment offset field (0x2000: more fragments).
    pub(super) frag: u16,
    pub(super) payload: usize,
}

impl Ip {
    pub(super) fn udp(src: IpAddr, dst: IpAddr) -> Self {
        Self {
            src,
            dst,
            tos: 0,
            ttl: 64,
            frag: 0,
            payload: 32,
        }
    }

    pub(super) fn tos(self, tos: u8) -> Self {
        Self { tos, ..self }
    }

    pub(super) fn payload(self, payload: usize) -> Self {
        Self { payload, ..self }
    }

    pub(super) fn frag(self, frag: u16) -> Self {
        Self { frag, ..self }
    }

    pub(super) fn ethertype(&self) -> u16 {
        if self.src.is_ipv4() {
            ETH_P_IP
        } else {
            ETH_P_IPV6
        }
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        let body: Vec<u8> = (0..self.payload).map(|i| (i * 7 + 3) as u8).collect();
        udp_packet(self, 5000, 6000, &body, false)
    }
}

/// An IP packet carrying `body` in UDP from `sport` to `dport`; the UDP
/// checksum is left zero unless `checksum` (IPv6 requires one).
fn udp_packet(ip: &Ip, sport: u16, dport: u16, body: &[u8], checksum: bool) -> Vec<u8> {
    let mut udp = Vec::with_capacity(8 + body.len());
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&((8 + body.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(body);
    match (ip.src, ip.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut p = ipv4_header(s, d, ip.tos, ip.ttl, ip.frag, udp.len());
            p.extend_from_slice(&udp);
            p
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            if checksum {
                let c = udp6_checksum(s, d, &udp);
                udp[6..8].copy_from_slice(&c.to_be_bytes());
            }
            let mut p = ipv6_header(s, d, ip.tos, ip.ttl, udp.len());
            p.extend_from_slice(&udp);
            p
        }
        _ => panic!("an IP packet with addresses of two families"),
    }
}

fn ipv4_header(s: Ipv4Addr, d: Ipv4Addr, tos: u8, ttl: u8, frag: u16, payload: usize) -> Vec<u8> {
    let mut h = vec![0x45, tos];
    h.extend_from_slice(&((IPV4_LEN + payload) as u16).to_be_bytes());
    h.extend_from_slice(&0x1234u16.to_be_bytes());
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[ttl, IPPROTO_UDP, 0, 0]);
    h.extend_from_slice(&s.octets());
    h.extend_from_slice(&d.octets());
    let c = checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

fn ipv6_header(s: Ipv6Addr, d: Ipv6Addr, tclass: u8, hops: u8, payload: usize) -> Vec<u8> {
    let mut h = vec![0x60 | (tclass >> 4), tclass << 4, 0, 0];
    h.extend_from_slice(&(payload as u16).to_be_bytes());
    h.extend_from_slice(&[IPPROTO_UDP, hops]);
    h.extend_from_slice(&s.octets());
    h.extend_from_slice(&d.octets());
    h
}

pub(super) use crate::checksum::internet as checksum;

fn udp6_checksum(s: Ipv6Addr, d: Ipv6Addr, udp: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + udp.len());
    pseudo.extend_from_slice(&s.octets());
    pseudo.extend_from_slice(&d.octets());
    pseudo.extend_from_slice(&(udp.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, IPPROTO_UDP]);
    pseudo.extend_from_slice(udp);
    match checksum(&pseudo) {
        0 => 0xffff,
        c => c,
    }
}

/// A VXLAN frame as a peer sends it: outer Ethernet (to `to_mac`), outer IP
/// from `outer.src` to `outer.dst` on UDP `port`, the VXLAN header with
/// `vni` (`flags`: 0x08, the I flag, for a valid one), and the inner frame.
#[derive(Clone, Debug)]
pub(super) struct Vxlan {
    pub(super) outer: Ip,
    pub(super) port: u16,
    pub(super) flags: u8,
    pub(super) vni: u32,
    pub(super) inner_dst_mac: MacAddr,
    pub(super) inner_src_mac: MacAddr,
    pub(super) inner: Ip,
}

impl Vxlan {
    /// The whole frame on the wire.
    pub(super) fn frame(&self, to_mac: MacAddr, from_mac: MacAddr) -> Vec<u8> {
        let mut vx = vec![self.flags, 0, 0, 0];
        vx.extend_from_slice(&(self.vni << 8).to_be_bytes());
        vx.extend_from_slice(&self.inner_frame());
        let outer = udp_packet(&self.outer, 40000, self.port, &vx, true);
        let mut f = eth(to_mac, from_mac, self.outer.ethertype());
        f.extend_from_slice(&outer);
        f
    }

    /// The inner frame: Ethernet and the inner IP packet.
    pub(super) fn inner_frame(&self) -> Vec<u8> {
        let mut f = eth(
            self.inner_dst_mac,
            self.inner_src_mac,
            self.inner.ethertype(),
        );
        f.extend_from_slice(&self.inner.bytes());
        f
    }
}

/// An ARP request: not IP at all.
pub(super) fn arp(src: MacAddr) -> Vec<u8> {
    let mut f = eth(MacAddr([0xff; 6]), src, ETH_P_ARP);
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[10, 244, 1, 5]);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&[10, 244, 1, 1]);
    f
}

/// Sets the ECN bits of the IP packet at `off` in `f` to CE, as a router
/// on the way would (IPv4: the header checksum follows).
pub(super) fn mark_ce(f: &mut [u8], off: usize) {
    if f[off] >> 4 == 4 {
        f[off + 1] |= 0x03;
        f[off + 10..off + 12].copy_from_slice(&[0, 0]);
        let c = checksum(&f[off..off + IPV4_LEN]);
        f[off + 10..off + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        f[off + 1] |= 0x03 << 4;
    }
}

/// Decrements the TTL (hop limit) of the IP packet at `off`, as a router.
pub(super) fn hop(f: &mut [u8], off: usize) {
    if f[off] >> 4 == 4 {
        f[off + 8] -= 1;
        f[off + 10..off + 12].copy_from_slice(&[0, 0]);
        let c = checksum(&f[off..off + IPV4_LEN]);
        f[off + 10..off + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        f[off + 7] -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_checksums_to_zero() {
        let p = Ip::udp(
            IpAddr::V4(Ipv4Addr::new(10, 244, 1, 5)),
            IpAddr::V4(Ipv4Addr::new(10, 244, 2, 7)),
        )
        .bytes();
        assert_eq!(checksum(&p[..IPV4_LEN]), 0);
        assert_eq!(p.len(), IPV4_LEN + 8 + 32);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len());
    }

    #[test]
    fn vxlan_frame_layout() {
        let v = Vxlan {
            outer: Ip::udp(
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            ),
            port: 8472,
            flags: 0x08,
            vni: 1,
            inner_dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            inner_src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            inner: Ip::udp(
                IpAddr::V4(Ipv4Addr::new(10, 244, 2, 7)),
                IpAddr::V4(Ipv4Addr::new(10, 244, 1, 5)),
            ),
        };
        let f = v.frame(MacAddr([2; 6]), MacAddr([3; 6]));
        assert_eq!(f.len(), ETH_LEN + ENCAP4 + IPV4_LEN + 8 + 32);
        // UDP destination port, VXLAN flags and VNI (RFC 7348 §5).
        assert_eq!(&f[36..38], &8472u16.to_be_bytes());
        assert_eq!(f[42], 0x08);
        assert_eq!(&f[46..50], &[0, 0, 1, 0]);
        assert_eq!(&f[ETH_LEN + ENCAP4 - ETH_LEN..], &v.inner_frame()[..]);
    }
}
