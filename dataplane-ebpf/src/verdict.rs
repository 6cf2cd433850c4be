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

/// A packet refused: why, and its source and destination (network order,
/// 0 where unknown) for `--trace-drops`.
#[derive(Clone, Copy)]
pub(crate) struct Dropped {
    pub(crate) reason: Reason,
    pub(crate) src: u32,
    pub(crate) dst: u32,
}

impl Dropped {
    pub(crate) const fn at(reason: Reason, src: u32, dst: u32) -> Self {
        Self { reason, src, dst }
    }
}

impl From<Reason> for Dropped {
    fn from(reason: Reason) -> Self {
        Self::at(reason, 0, 0)
    }
}
