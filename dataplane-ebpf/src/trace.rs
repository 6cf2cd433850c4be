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
    warn!(
        ctx,
        "dropped ({}): {:i} -> {:i}",
        d.reason.name(),
        u32::from_be(d.src),
        u32::from_be(d.dst)
    );
}
