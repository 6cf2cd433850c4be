//! `--trace-drops`: one log record per dropped packet.
//!
//! aya-log checks its level, a constant the agent sets when it loads the
//! programs (0 unless `--trace-drops`), before doing anything: with the
//! trace off the verifier removes this code, so it costs nothing.

use aya_ebpf::EbpfContext;
use aya_log_ebpf::warn;

use aya_ebpf::programs::{TcContext, XdpContext};

use crate::{packet::read, verdict::Dropped};

/// The packet's bounds and device, for the programs' contexts.
pub(crate) trait Frame: EbpfContext {
    fn bounds(&self) -> (usize, usize);
    /// The device the frame arrived on.
    fn ifindex(&self) -> u32;
}

impl Frame for TcContext {
    fn bounds(&self) -> (usize, usize) {
        (self.data(), self.data_end())
    }
    fn ifindex(&self) -> u32 {
        // SAFETY: the context's __sk_buff is valid for the program's run.
        unsafe { (*self.skb.skb).ifindex }
    }
}

impl Frame for XdpContext {
    fn bounds(&self) -> (usize, usize) {
        (self.data(), self.data_end())
    }
    fn ifindex(&self) -> u32 {
        // SAFETY: the context's xdp_md is valid for the program's run.
        unsafe { (*self.ctx).ingress_ifindex }
    }
}

#[inline(always)]
pub(crate) fn dropped<C: Frame>(ctx: &C, d: &Dropped) {
    if d.ip6_at != 0 {
        let (data, end) = ctx.bounds();
        // Bounded for the verifier (a header offset is always below 128).
        let at = (d.ip6_at & 0x7f) as usize;
        let src = read::<[u8; 16]>(data, end, at + 8);
        let dst = read::<[u8; 16]>(data, end, at + 24);
        if let (Some(src), Some(dst)) = (src, dst) {
            warn!(ctx, "dropped ({}): {:i} -> {:i}", d.reason.name(), src, dst);
            return;
        }
    }
    warn!(
        ctx,
        "dropped ({}): {:i} -> {:i}",
        d.reason.name(),
        u32::from_be(d.src),
        u32::from_be(d.dst)
    );
}

/// A drop in brief: the reason, and the addresses of an IPv4 packet (an
/// IPv6 packet's are not read).
#[inline(always)]
pub(crate) fn dropped_brief<C: Frame>(ctx: &C, d: &Dropped) {
    if d.ip6_at != 0 {
        warn!(ctx, "dropped ({}): an IPv6 packet", d.reason.name());
        return;
    }
    warn!(
        ctx,
        "dropped ({}): {:i} -> {:i}",
        d.reason.name(),
        u32::from_be(d.src),
        u32::from_be(d.dst)
    );
}
