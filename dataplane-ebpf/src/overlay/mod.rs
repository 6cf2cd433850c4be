//! The overlay devices: encapsulation at TC egress of the IPv4 overlay
//! device (the programs write the outer headers) and of the IPv6 one (the
//! kernel's vxlan driver writes them from the tunnel key set here), and
//! the check of what the kernel's vxlan device decapsulated itself.

pub(crate) mod encap;
pub(crate) mod encap6;

use aya_ebpf::{
    bindings::TC_ACT_OK, bindings::TC_ACT_SHOT, macros::classifier, programs::TcContext,
};

use crate::run::{Rules, Trace, Unconfigured, run};

/// Encapsulation: TC egress on the overlay device.
#[classifier]
fn weft_encap(ctx: TcContext) -> i32 {
    run(&ctx, ENCAP, encap::encap)
}

/// Encapsulation over IPv6: TC egress on the IPv6 overlay device, which
/// writes the outer headers from the tunnel key set here.
#[classifier]
fn weft_encap6(ctx: TcContext) -> i32 {
    // Host routing set the key and counted the packet already.
    if encap6::has_tunnel_key(&ctx) {
        return TC_ACT_OK;
    }
    // The device's own IPv6 housekeeping (MLD reports for its multicast
    // groups): never overlay traffic, never counted.
    if encap6::is_multicast(&ctx) {
        return TC_ACT_SHOT;
    }
    run(&ctx, ENCAP, encap6::encap6)
}

/// What the kernel decapsulated itself: TC ingress on the vxlan device
/// that receives (the IPv6 overlay device, or the receive device of a node
/// without IPv6). Subject to the decapsulation fault, its drops traced in
/// brief.
#[classifier]
fn weft_tunnel_rx(ctx: TcContext) -> i32 {
    run(&ctx, TUNNEL_RX, encap6::tunnel_rx)
}

/// Encapsulation: nothing to encapsulate with before the config.
const ENCAP: Rules = Rules {
    unconfigured: Unconfigured::Drop,
    fault: false,
    trace: Trace::Full,
};

const TUNNEL_RX: Rules = Rules {
    unconfigured: Unconfigured::Drop,
    fault: true,
    trace: Trace::Brief,
};
