//! The wireguard backend's fast path (`CONFIG_F_WIREGUARD`): the kernel's
//! WireGuard device encrypts and decrypts; the programs only shorten the
//! way to and from it, at the pods' veths and at the WireGuard devices.
//! Anything else takes the host stack, as without host routing.

mod receive;
mod transmit;

use aya_ebpf::{macros::classifier, programs::TcContext};

use crate::{
    pod::FROM_POD,
    run::{Rules, Trace, Unconfigured, run},
};

/// The wireguard backend, transmit: TC ingress on the host side of each
/// pod's veth (in place of `weft_from_pod`).
#[classifier]
fn weft_from_pod_wg(ctx: TcContext) -> i32 {
    run(&ctx, FROM_POD, transmit::from_pod)
}

/// The wireguard backend, receive: TC ingress on a WireGuard device. A
/// decrypted packet for a local pod goes straight into the pod; the rest
/// pass on to the host stack, counted as passed.
#[classifier]
fn weft_from_wg(ctx: TcContext) -> i32 {
    run(&ctx, FROM_WG, receive::receive)
}

/// Before the config, decrypted packets pass uncounted; a drop is counted,
/// not traced.
const FROM_WG: Rules = Rules {
    unconfigured: Unconfigured::PassUncounted,
    fault: false,
    trace: Trace::Off,
};
