//! The host side of each pod's veth (host routing): what a pod sends is
//! checked there and, where it may, taken straight to the remote node;
//! and what arrives for a pod is put straight into it.

pub(crate) mod deliver;
pub(crate) mod gate;
pub(crate) mod parsed;
mod transmit;

use aya_ebpf::{macros::classifier, programs::TcContext};

use crate::run::{Rules, Trace, Unconfigured, run};

/// Host routing, transmit: TC ingress on the host side of each pod's veth.
#[classifier]
fn weft_from_pod(ctx: TcContext) -> i32 {
    run(&ctx, FROM_POD, transmit::from_pod)
}

/// A pod's packets before the config: not the programs' yet; drops
/// counted, not traced (see [`Trace::Off`]).
pub(crate) const FROM_POD: Rules = Rules {
    unconfigured: Unconfigured::Pass,
    fault: false,
    trace: Trace::Off,
};
