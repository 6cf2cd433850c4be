//! The Internet checksum (RFC 1071): for the ICMP probes `weft doctor`
//! sends and the frames the self-test builds.

/// The ones' complement of the ones' complement sum of `b`'s 16-bit words
/// (an odd last byte padded with zero). Over data that carries its own
/// correct checksum, it is 0.
pub(crate) fn internet(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_1071() {
        // An echo request with id 1, seq 1 and no payload.
        let mut p = vec![8, 0, 0, 0, 0, 1, 0, 1];
        let c = internet(&p);
        assert_eq!(c, 0xf7fd);
        p[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(internet(&p), 0);
        // An odd length pads with zero.
        assert_eq!(internet(&[0xff]), !0xff00);
    }
}
