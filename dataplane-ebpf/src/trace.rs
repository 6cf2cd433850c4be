//! `--trace-drops` (`weft trace-drops on|off` at run time): one log record
//! per dropped packet.
//!
//! The agent loads the programs with aya-log's level at `warn`, so the
//! logging code is always there; whether a drop is logged is the config's
//! `CONFIG_F_TRACE_DROPS`, which the agent flips without reloading
//! anything. Off, a drop costs a test of that flag; a packet that is not
//! dropped never comes here.

use aya_ebpf::EbpfContext;
use aya_log_ebpf::warn;

use aya_ebpf::programs::{TcContext, XdpContext};

use crate::{maps::config, packet::read, verdict::Dropped};

/// Whether the agent has the drop trace on.
#[inline(always)]
fn tracing() -> bool {
    config().is_some_and(|c| c.trace_drops())
}

/// The packet's bounds and device, for the programs' contexts.
pub(crate) trait Frame: EbpfContext {
    fn bounds(&self) -> (usize, usize);
    /// The frame's length (TC: the whole packet's, XDP: the buffer's).
    fn frame_len(&self) -> u32;
    /// The device the frame arrived on.
    fn ifindex(&self) -> u32;
}

impl Frame for TcContext {
    fn bounds(&self) -> (usize, usize) {
        (self.data(), self.data_end())
    }
    fn frame_len(&self) -> u32 {
        self.len()
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
    fn frame_len(&self) -> u32 {
        (self.data_end() - self.data()) as u32
    }
    fn ifindex(&self) -> u32 {
        // SAFETY: the context's xdp_md is valid for the program's run.
        unsafe { (*self.ctx).ingress_ifindex }
    }
}

#[inline(always)]
pub(crate) fn dropped<C: Frame>(ctx: &C, d: &Dropped) {
    if !tracing() {
        return;
    }
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
    if !tracing() {
        return;
    }
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
