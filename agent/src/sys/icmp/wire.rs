//! The ICMP and ICMPv6 messages of an echo: their types, the request
//! sent, and what a received message says about it.

use std::net::IpAddr;

pub(super) const IPV4_HEADER: usize = 20;
pub(super) const IPV6_HEADER: usize = 40;
pub(super) const ECHO_REQUEST4: u8 = 8;
pub(super) const ECHO_REPLY4: u8 = 0;
pub(super) const UNREACHABLE4: u8 = 3;
pub(super) const FRAG_NEEDED4: u8 = 4;
pub(super) const ECHO_REQUEST6: u8 = 128;
pub(super) const ECHO_REPLY6: u8 = 129;
pub(super) const TOO_BIG6: u8 = 2;
/// `ICMP_FILTER` (linux/icmp.h), at level `SOL_RAW`.
pub(super) const ICMP_FILTER: libc::c_int = 1;
/// `ICMP6_FILTER` (linux/icmpv6.h), at level `IPPROTO_ICMPV6`.
pub(super) const ICMP6_FILTER: libc::c_int = 1;

/// What every echo request carries after its header: a random nonce of
/// the socket's, which a reply must echo (an id alone is 16 bits anyone
/// can spray; the nonce is 64 no one off the path can guess).
pub(super) const NONCE: usize = 8;
/// The smallest echo message sent: header and nonce.
pub(super) const MIN_ECHO: usize = 8 + NONCE;

/// The sequence number and ICMP length of an echo reply carrying `id` and
/// echoing `nonce`.
pub(super) fn reply_of(v6: bool, msg: &[u8], id: u16, nonce: &[u8; NONCE]) -> Option<(u16, usize)> {
    let icmp = if v6 {
        msg
    } else {
        let ihl = usize::from(msg.first()? & 0x0f) * 4;
        if ihl < IPV4_HEADER {
            return None;
        }
        msg.get(ihl..)?
    };
    let want = if v6 { ECHO_REPLY6 } else { ECHO_REPLY4 };
    (icmp.len() >= MIN_ECHO
        && icmp[0] == want
        && icmp[4..6] == id.to_be_bytes()
        && icmp[8..MIN_ECHO] == nonce[..])
        .then(|| (u16::from_be_bytes([icmp[6], icmp[7]]), icmp.len()))
}

/// An echo request's ICMP message (`len` bytes, at least [`MIN_ECHO`]):
/// `nonce` first in its data. IPv4's checksum is ours to fill; the kernel
/// fills ICMPv6's (it covers a pseudo-header).
pub(super) fn request(v6: bool, id: u16, seq: u16, len: usize, nonce: &[u8; NONCE]) -> Vec<u8> {
    let mut pkt = vec![0u8; len.max(MIN_ECHO)];
    pkt[0] = if v6 { ECHO_REQUEST6 } else { ECHO_REQUEST4 };
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    pkt[8..MIN_ECHO].copy_from_slice(nonce);
    if !v6 {
        let csum = crate::checksum::internet(&pkt);
        pkt[2..4].copy_from_slice(&csum.to_be_bytes());
    }
    pkt
}

pub(super) enum Answer {
    Reply,
    TooBig,
    Other,
}

/// What a received message says about our probe to `to`. An IPv4 raw
/// socket hands back the IP header too; an IPv6 one, the ICMPv6 message
/// alone.
pub(super) fn answer(
    to: IpAddr,
    msg: &[u8],
    from: IpAddr,
    id: u16,
    seq: u16,
    nonce: &[u8; NONCE],
) -> Answer {
    let icmp = match to {
        IpAddr::V4(_) => {
            let ihl = usize::from(msg.first().copied().unwrap_or(0) & 0x0f) * 4;
            match msg.get(ihl..) {
                Some(m) if ihl >= IPV4_HEADER => m,
                _ => return Answer::Other,
            }
        }
        IpAddr::V6(_) => msg,
    };
    if icmp.len() < 8 {
        return Answer::Other;
    }
    let ours = icmp.len() >= MIN_ECHO
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
        && icmp[8..MIN_ECHO] == nonce[..];
    match (to, icmp[0], icmp[1]) {
        (IpAddr::V4(_), ECHO_REPLY4, _) | (IpAddr::V6(_), ECHO_REPLY6, _) => {
            if ours && from == to {
                Answer::Reply
            } else {
                Answer::Other
            }
        }
        (IpAddr::V4(_), UNREACHABLE4, FRAG_NEEDED4) | (IpAddr::V6(_), TOO_BIG6, _) => {
            Answer::TooBig
        }
        _ => Answer::Other,
    }
}
