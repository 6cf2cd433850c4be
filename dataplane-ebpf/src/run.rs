//! The one way into and out of every program: `run(ctx, RULES, body)`
//! gives the body the config and counts what it returns exactly once,
//! under its reason, applying what the entry point's [`Rules`] say beyond
//! that (before the config, the decapsulation fault, the drop trace).

use aya_ebpf::bindings::{TC_ACT_OK, TC_ACT_SHOT, xdp_action};
use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    maps::{config, count},
    trace::{self, Frame},
    verdict::{Done, Dropped, Verdict},
};

/// What an entry point does beyond counting its outcome.
#[derive(Clone, Copy)]
pub(crate) struct Rules {
    /// Before the agent has written a config.
    pub(crate) unconfigured: Unconfigured,
    /// Decapsulation: its verdicts are subject to `FAULT` (what it would
    /// have taken is dropped).
    pub(crate) fault: bool,
    /// How its drops are traced under `--trace-drops`.
    pub(crate) trace: Trace,
}

/// What a program does before the agent has written a config.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unconfigured {
    /// Pass the frame on, counted as passed (it is not the programs' yet).
    Pass,
    /// Pass the frame on, uncounted (another program counts it).
    PassUncounted,
    /// Drop it (nothing to encapsulate with).
    Drop,
}

/// How a program's drops are traced.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trace {
    /// The reason and the addresses, IPv6 ones read from the frame.
    Full,
    /// The reason and IPv4 addresses: beside the tunnel key, the full
    /// record of an IPv6 drop takes `weft_tunnel_rx` past the verifier's
    /// 512 bytes of stack.
    Brief,
    /// Counted, not traced: with the trace record the pod programs
    /// (conntrack's lookups beside it) go past the verifier's 512 bytes
    /// of stack under `--trace-drops`.
    Off,
}

/// A program's actions: TC's or XDP's.
pub(crate) trait Actions: Copy {
    const PASS: Self;
    const DROP: Self;
}

impl Actions for i32 {
    const PASS: Self = TC_ACT_OK;
    const DROP: Self = TC_ACT_SHOT;
}

impl Actions for u32 {
    const PASS: Self = xdp_action::XDP_PASS;
    const DROP: Self = xdp_action::XDP_DROP;
}

/// Runs an entry point's body with the config and counts its outcome once.
#[inline(always)]
pub(crate) fn run<C: Frame, A: Actions>(
    ctx: &C,
    rules: Rules,
    body: impl FnOnce(&C, &DataplaneConfig) -> Verdict<A>,
) -> A {
    let len = ctx.frame_len();
    let r = match config() {
        Some(cfg) => body(ctx, cfg),
        None => unconfigured(rules, len),
    };
    finish(ctx, r, len, rules)
}

/// The verdict before the agent has written a config.
#[inline(always)]
fn unconfigured<A: Actions>(rules: Rules, len: u32) -> Verdict<A> {
    match rules.unconfigured {
        Unconfigured::Pass => Ok(Done::new(A::PASS, Reason::Passed, len)),
        Unconfigured::PassUncounted => Ok(Done::uncounted(A::PASS)),
        Unconfigured::Drop => Err(Dropped::from(Reason::DropError)),
    }
}

/// Counts the outcome of a program body once and returns its action.
#[inline(always)]
fn finish<C: Frame, A: Actions>(ctx: &C, r: Verdict<A>, len: u32, rules: Rules) -> A {
    match r {
        Ok(d) if rules.fault && d.taken() && fault_on(ctx) => {
            count(Reason::DropError, len);
            A::DROP
        }
        Ok(d) => {
            if let Some(reason) = d.reason {
                count(reason, d.bytes);
            }
            d.action
        }
        Err(d) => {
            count(d.reason, len);
            match rules.trace {
                Trace::Full => trace::dropped(ctx, &d),
                Trace::Brief => trace::dropped_brief(ctx, &d),
                Trace::Off => {}
            }
            A::DROP
        }
    }
}

/// A fault put in on purpose at load time (`dataplane_common::FAULT_*`,
/// set by the agent's hidden `--inject-fault`): a constant of the loaded
/// object, so without it the verifier removes the check.
#[unsafe(no_mangle)]
static FAULT: u32 = dataplane_common::FAULT_NONE;

/// The loopback device's index in every network namespace.
const LOOPBACK: u32 = 1;

/// Whether a decapsulation fault is set for a frame on `ctx`'s device.
/// Read at the verdict, from the context: nothing more is kept on the
/// stack across the program's body (the programs run close to the
/// verifier's 512 bytes with `--trace-drops`).
#[inline(always)]
fn fault_on<C: Frame>(ctx: &C) -> bool {
    // SAFETY: a read of a static the loader may have set.
    let fault = unsafe { core::ptr::read_volatile(&FAULT) };
    fault == dataplane_common::FAULT_DECAP
        || (fault == dataplane_common::FAULT_DECAP_LIVE && ctx.ifindex() != LOOPBACK)
}
