//! `--trace-drops`: one log record per dropped packet.
//!
//! aya-log checks its level, a constant the agent sets when it loads the
//! programs (0 unless `--trace-drops`), before doing anything: with the
//! trace off the verifier removes this code, so it costs nothing.

use aya_ebpf::EbpfContext;
use aya_log_ebpf::warn;

use crate::verdict::Dropped;

#[inline(always)]
pub(crate) fn dropped<C: EbpfContext>(ctx: &C, d: &Dropped) {
    if d.family == 6 {
        warn!(
            ctx,
            "dropped ({}): {:i} -> {:i}",
            d.reason.name(),
            d.src,
            d.dst
        );
    } else {
        let v4 = |a: &[u8; 16]| u32::from_be_bytes([a[0], a[1], a[2], a[3]]);
        warn!(
            ctx,
            "dropped ({}): {:i} -> {:i}",
            d.reason.name(),
            v4(&d.src),
            v4(&d.dst)
        );
    }
}
