//! Weft's eBPF programs: VXLAN encapsulation (TC) and decapsulation (XDP,
//! with a TC fallback), byte-compatible with the kernel's vxlan device.
//!
//! Each program is an entry point here that calls one fallible body and
//! counts its outcome exactly once: a verdict under its reason, or a drop
//! under the drop's reason (and, with `--trace-drops`, a log record).
#![no_std]
#![no_main]

mod bypass;
mod ct;
mod decap;
mod encap;
mod encap6;
mod family;
mod headers;
mod maps;
mod packet;
mod strip;
mod trace;
mod verdict;
mod wireguard;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT, xdp_action},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    maps::{config, count},
    verdict::{Done, Dropped},
};

/// Encapsulation: TC egress on the overlay device.
#[classifier]
fn weft_encap(ctx: TcContext) -> i32 {
    tc(&ctx, Unconfigured::Drop, Extras::None, encap::encap)
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
    tc(&ctx, Unconfigured::Drop, Extras::None, encap6::encap6)
}

/// What the kernel decapsulated itself: TC ingress on the vxlan device
/// that receives (the IPv6 overlay device, or the receive device of a node
/// without IPv6).
///
/// Its drops are traced in brief (the reason, and IPv4 addresses): beside
/// the tunnel key, the full record of an IPv6 drop takes the program past
/// the verifier's 512 bytes of stack.
#[classifier]
fn weft_tunnel_rx(ctx: TcContext) -> i32 {
    let len = ctx.len();
    let r = match config() {
        Some(cfg) => encap6::tunnel_rx(&ctx, cfg),
        None => Err(Dropped::from(Reason::DropError)),
    };
    match r {
        Ok(d) if d.reason != Reason::Passed && fault_on(&ctx) => {
            count(Reason::DropError, len);
            TC_ACT_SHOT
        }
        Ok(d) => {
            count(d.reason, d.bytes);
            d.action
        }
        Err(d) => {
            count(d.reason, len);
            trace::dropped_brief(&ctx, &d);
            TC_ACT_SHOT
        }
    }
}

/// Decapsulation: XDP on the uplink.
///
/// The decapsulated packet is handed to the stack (XDP_PASS) as if it had
/// arrived on the uplink, addressed to the uplink's MAC; the kernel then
/// routes it to the pod bridge. Passing keeps GRO: on the receive path the
/// inner TCP segments are coalesced again before routing.
#[xdp]
fn weft_decap(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u32;
    let r = match config() {
        Some(cfg) => strip::xdp(&ctx, cfg),
        None => Ok(Done {
            action: xdp_action::XDP_PASS,
            reason: Reason::Passed,
            bytes: len,
        }),
    };
    finish(&ctx, r, len, xdp_action::XDP_DROP, Extras::Decap)
}

/// Decapsulation fallback: TC ingress on the uplink, for when XDP cannot be
/// attached (`--xdp-mode off`).
#[classifier]
fn weft_decap_tc(ctx: TcContext) -> i32 {
    tc(&ctx, Unconfigured::Pass, Extras::Decap, strip::tc)
}

/// Host routing, transmit: TC ingress on the host side of each pod's veth.
#[classifier]
fn weft_from_pod(ctx: TcContext) -> i32 {
    tc(&ctx, Unconfigured::Pass, Extras::Untraced, bypass::from_pod)
}

/// Host routing, receive, after XDP decapsulation: TC ingress on the
/// uplink, after GRO. Frames XDP decapsulated (it marks them) for a local
/// pod go straight into the pod, and so do a direct peer's unencapsulated
/// ones (DirectRouting); the rest pass untouched and uncounted (XDP counted
/// them).
#[classifier]
fn weft_deliver(ctx: TcContext) -> i32 {
    let Some(cfg) = config() else {
        return TC_ACT_OK;
    };
    let len = ctx.len();
    let (delivered, reason) = if strip::marked_by_xdp(&ctx) {
        (bypass::deliver(&ctx, cfg), Reason::DecapBypass)
    } else {
        (bypass::deliver_direct(&ctx, cfg), Reason::DirectRx)
    };
    match delivered {
        Some(action) => {
            count(reason, len);
            action
        }
        None => TC_ACT_OK,
    }
}

/// The wireguard backend, transmit: TC ingress on the host side of each
/// pod's veth (in place of `weft_from_pod`).
#[classifier]
fn weft_from_pod_wg(ctx: TcContext) -> i32 {
    tc(
        &ctx,
        Unconfigured::Pass,
        Extras::Untraced,
        wireguard::from_pod,
    )
}

/// The wireguard backend, receive: TC ingress on a WireGuard device. A
/// decrypted packet for a local pod goes straight into the pod; the rest
/// pass on to the host stack, counted as passed.
#[classifier]
fn weft_from_wg(ctx: TcContext) -> i32 {
    let Some(cfg) = config() else {
        return TC_ACT_OK;
    };
    let len = ctx.len();
    match wireguard::receive(&ctx, cfg) {
        Ok(Some(action)) => {
            count(Reason::DecapBypass, len);
            action
        }
        Ok(None) => {
            count(Reason::Passed, len);
            TC_ACT_OK
        }
        Err(()) => {
            count(Reason::DropError, len);
            TC_ACT_SHOT
        }
    }
}

/// A fault put in on purpose at load time (`dataplane_common::FAULT_*`,
/// set by the agent's hidden `--inject-fault`): a constant of the loaded
/// object, so without it the verifier removes the check.
#[unsafe(no_mangle)]
static FAULT: u32 = dataplane_common::FAULT_NONE;

/// Whether a decapsulation fault is set for a frame on `ctx`'s device.
/// Read at the verdict, from the context: nothing more is kept on the
/// stack across the program's body (the programs run close to the
/// verifier's 512 bytes with `--trace-drops`).
#[inline(always)]
fn fault_on<C: trace::Frame>(ctx: &C) -> bool {
    // SAFETY: a read of a static the loader may have set.
    let fault = unsafe { core::ptr::read_volatile(&FAULT) };
    fault == dataplane_common::FAULT_DECAP
        || (fault == dataplane_common::FAULT_DECAP_LIVE && ctx.ifindex() != LOOPBACK)
}

/// What the shared wrappers do for a program beyond counting its outcome.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extras {
    None,
    /// Decapsulation: its verdicts are subject to `FAULT` (what it would
    /// have decapsulated is dropped).
    Decap,
    /// Its drops are counted, not traced: with the trace record
    /// `weft_from_pod` (conntrack's lookups beside it) goes past the
    /// verifier's 512 bytes of stack under `--trace-drops`.
    Untraced,
}

/// The loopback device's index in every network namespace.
const LOOPBACK: u32 = 1;

/// What a program does before the agent has written a config.
#[derive(Clone, Copy)]
enum Unconfigured {
    /// Pass the frame on (it is not the programs' yet).
    Pass,
    /// Drop it (nothing to encapsulate with).
    Drop,
}

/// Runs a TC program's body with the config and counts its outcome once.
#[inline(always)]
fn tc(
    ctx: &TcContext,
    unconfigured: Unconfigured,
    extras: Extras,
    body: impl FnOnce(&TcContext, &DataplaneConfig) -> Result<Done<i32>, Dropped>,
) -> i32 {
    let len = ctx.len();
    let r = match (config(), unconfigured) {
        (Some(cfg), _) => body(ctx, cfg),
        (None, Unconfigured::Pass) => Ok(Done {
            action: TC_ACT_OK,
            reason: Reason::Passed,
            bytes: len,
        }),
        (None, Unconfigured::Drop) => Err(Dropped::from(Reason::DropError)),
    };
    finish(ctx, r, len, TC_ACT_SHOT, extras)
}

/// Counts the outcome of a program body once and returns its action.
#[inline(always)]
fn finish<C: trace::Frame, A>(
    ctx: &C,
    r: Result<Done<A>, Dropped>,
    len: u32,
    drop: A,
    extras: Extras,
) -> A {
    match r {
        Ok(d) if extras == Extras::Decap && d.reason != Reason::Passed && fault_on(ctx) => {
            count(Reason::DropError, len);
            drop
        }
        Ok(d) => {
            count(d.reason, d.bytes);
            d.action
        }
        Err(d) => {
            count(d.reason, len);
            if extras != Extras::Untraced {
                trace::dropped(ctx, &d);
            }
            drop
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
