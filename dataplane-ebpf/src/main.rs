//! Weft's eBPF programs.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{TC_ACT_SHOT, xdp_action},
    macros::{classifier, map, xdp},
    maps::PerCpuArray,
    programs::{TcContext, XdpContext},
};
use dataplane_common::{Counter, Reason};

#[map]
static WEFT_COUNTERS: PerCpuArray<Counter> = PerCpuArray::pinned(Reason::COUNT, 0);

#[inline(always)]
fn count(reason: Reason, bytes: u32) {
    if let Some(c) = WEFT_COUNTERS.get_ptr_mut(reason as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while we run.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes as u64;
        }
    }
}

#[xdp]
pub fn weft_decap(ctx: XdpContext) -> u32 {
    count(Reason::Passed, (ctx.data_end() - ctx.data()) as u32);
    xdp_action::XDP_PASS
}

/// Encapsulation, with no peer table yet: nothing can be routed.
#[classifier]
pub fn weft_encap(ctx: TcContext) -> i32 {
    count(Reason::DropNoRoute, ctx.len());
    TC_ACT_SHOT
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
