//! What a program body returns: a verdict to count, or a drop to count and
//! trace. The entry points count exactly once.

use dataplane_common::Reason;

/// A packet handled: the action to return, the counter it goes to, and the
/// bytes to count.
#[derive(Clone, Copy)]
pub(crate) struct Done<A> {
    pub(crate) action: A,
    pub(crate) reason: Reason,
    pub(crate) bytes: u32,
}

/// A packet refused: why, and its addresses for `--trace-drops` (every
/// byte initialised, whichever family: the verifier refuses copies of
/// uninitialised stack).
#[derive(Clone, Copy)]
pub(crate) struct Dropped {
    pub(crate) reason: Reason,
    /// 4 or 6; 0 when the addresses are unknown.
    pub(crate) family: u8,
    /// IPv4 addresses (network order) in the first four bytes.
    pub(crate) src: [u8; 16],
    pub(crate) dst: [u8; 16],
}

impl Dropped {
    pub(crate) fn at(reason: Reason, src: u32, dst: u32) -> Self {
        let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
        let (sb, db) = (src.to_ne_bytes(), dst.to_ne_bytes());
        let mut i = 0;
        while i < 4 {
            s[i] = sb[i];
            d[i] = db[i];
            i += 1;
        }
        Self {
            reason,
            family: 4,
            src: s,
            dst: d,
        }
    }

    pub(crate) const fn at6(reason: Reason, src: [u8; 16], dst: [u8; 16]) -> Self {
        Self {
            reason,
            family: 6,
            src,
            dst,
        }
    }
}

impl From<Reason> for Dropped {
    fn from(reason: Reason) -> Self {
        Self {
            reason,
            family: 0,
            src: [0; 16],
            dst: [0; 16],
        }
    }
}
