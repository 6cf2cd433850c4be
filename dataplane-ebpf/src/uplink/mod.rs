//! The node's uplink: decapsulation in XDP (or at TC ingress where XDP
//! cannot attach), and after GRO the delivery of what XDP decapsulated,
//! or a direct peer sent unencapsulated, straight into a local pod.

mod decap;
mod strip;

use aya_ebpf::{
    bindings::TC_ACT_OK,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    pod::deliver,
    run::{Rules, Trace, Unconfigured, run},
    verdict::{Done, Verdict},
};

/// Decapsulation: XDP on the uplink.
///
/// The decapsulated packet is handed to the stack (XDP_PASS) as if it had
/// arrived on the uplink, addressed to the uplink's MAC; the kernel then
/// routes it to the pod bridge. Passing keeps GRO: on the receive path the
/// inner TCP segments are coalesced again before routing.
#[xdp]
fn weft_decap(ctx: XdpContext) -> u32 {
    run(&ctx, DECAP, strip::xdp)
}

/// Decapsulation fallback: TC ingress on the uplink, for when XDP cannot be
/// attached (`--xdp-mode off`).
#[classifier]
fn weft_decap_tc(ctx: TcContext) -> i32 {
    run(&ctx, DECAP, strip::tc)
}

/// Host routing, receive, after XDP decapsulation: TC ingress on the
/// uplink, after GRO. Frames XDP decapsulated (it marks them) for a local
/// pod go straight into the pod, and so do a direct peer's unencapsulated
/// ones (DirectRouting); the rest pass untouched and uncounted (XDP counted
/// them).
#[classifier]
fn weft_deliver(ctx: TcContext) -> i32 {
    run(&ctx, DELIVER, to_pod)
}

#[inline(always)]
fn to_pod(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    let (delivered, reason) = if strip::marked_by_xdp(ctx) {
        (deliver::deliver(ctx, cfg), Reason::DecapBypass)
    } else {
        (deliver::deliver_direct(ctx, cfg), Reason::DirectRx)
    };
    Ok(match delivered {
        Some(action) => Done::new(action, reason, ctx.len()),
        None => Done::uncounted(TC_ACT_OK),
    })
}

/// Decapsulation: frames pass before the config (they are not the
/// programs' yet); its verdicts are subject to the decapsulation fault.
const DECAP: Rules = Rules {
    unconfigured: Unconfigured::Pass,
    fault: true,
    trace: Trace::Full,
};

/// Delivery: what it does not deliver, XDP counted already.
const DELIVER: Rules = Rules {
    unconfigured: Unconfigured::PassUncounted,
    fault: false,
    trace: Trace::Off,
};
