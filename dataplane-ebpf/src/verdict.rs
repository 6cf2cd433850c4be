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

/// A packet refused: why, and where its addresses are for `--trace-drops`:
/// IPv4 addresses themselves (network order), or for IPv6 the offset of
/// the IPv6 header in the frame, read when the drop is traced (sixteen-byte
/// addresses carried here would double the stack every program needs).
#[derive(Clone, Copy)]
pub(crate) struct Dropped {
    pub(crate) reason: Reason,
    pub(crate) src: u32,
    pub(crate) dst: u32,
    /// The offset of the IPv6 header whose addresses to trace; 0: IPv4.
    pub(crate) ip6_at: u32,
}

impl Dropped {
    pub(crate) const fn at(reason: Reason, src: u32, dst: u32) -> Self {
        Self {
            reason,
            src,
            dst,
            ip6_at: 0,
        }
    }

    pub(crate) const fn at6(reason: Reason, ip6_at: usize) -> Self {
        Self {
            reason,
            src: 0,
            dst: 0,
            ip6_at: ip6_at as u32,
        }
    }
}

impl From<Reason> for Dropped {
    fn from(reason: Reason) -> Self {
        Self::at(reason, 0, 0)
    }
}
