//! What a program body returns: a verdict to count (`Done`), or a drop to
//! count and trace (`Dropped`). `run` counts it.

use aya_ebpf::bindings::TC_ACT_OK;
use dataplane_common::Reason;

/// A packet handled: the action to return, the counter it goes to (none:
/// another program counts it) and the bytes to count.
#[derive(Clone, Copy)]
pub(crate) struct Done<A> {
    pub(crate) action: A,
    pub(crate) reason: Option<Reason>,
    pub(crate) bytes: u32,
}

impl<A> Done<A> {
    /// `action`, counted under `reason` with `bytes`.
    #[inline(always)]
    pub(crate) const fn new(action: A, reason: Reason, bytes: u32) -> Self {
        Self {
            action,
            reason: Some(reason),
            bytes,
        }
    }

    /// `action`, counted by no counter (another program counts the packet,
    /// or it is the device's own housekeeping).
    #[inline(always)]
    pub(crate) const fn uncounted(action: A) -> Self {
        Self {
            action,
            reason: None,
            bytes: 0,
        }
    }

    /// Whether the packet was taken (not passed on as it came).
    #[inline(always)]
    pub(crate) fn taken(&self) -> bool {
        matches!(self.reason, Some(r) if !matches!(r, Reason::Passed))
    }
}

impl Done<i32> {
    /// A TC program passes the `len`-byte packet on, counted as passed.
    #[inline(always)]
    pub(crate) const fn pass(len: u32) -> Self {
        Self::new(TC_ACT_OK, Reason::Passed, len)
    }
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

/// What a body returns.
pub(crate) type Verdict<A> = Result<Done<A>, Dropped>;
