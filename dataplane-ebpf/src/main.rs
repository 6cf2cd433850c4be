//! Weft's eBPF programs: VXLAN encapsulation (TC) and decapsulation (XDP,
//! with a TC fallback), byte-compatible with the kernel's vxlan device.
#![no_std]
#![no_main]

mod decap;
mod encap;
mod headers;
mod maps;

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_FIXED_GSO, TC_ACT_OK, TC_ACT_SHOT, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
        xdp_action,
    },
    helpers::generated::bpf_xdp_adjust_head,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use dataplane_common::Reason;

use crate::{
    decap::{Verdict, classify},
    headers::{ENCAP_LEN, ETH_LEN, EthHdr},
    maps::{config, count},
};

/// Encapsulation: TC egress on the overlay device.
#[classifier]
pub fn weft_encap(ctx: TcContext) -> i32 {
    encap::encap(&ctx)
}

/// Decapsulation: XDP on the uplink.
///
/// The decapsulated packet is handed to the stack (XDP_PASS) as if it had
/// arrived on the uplink, addressed to the uplink's MAC; the kernel then
/// routes it to the pod bridge. Passing keeps GRO: on the receive path the
/// inner TCP segments are coalesced again before routing, which redirecting
/// frame by frame into the bridge would lose (XDP_REDIRECT into a veth also
/// needs an XDP program on every pod's veth). Measured with
/// `cargo xtask bench datapath`: see the README.
#[xdp]
pub fn weft_decap(ctx: XdpContext) -> u32 {
    let data = ctx.data();
    let end = ctx.data_end();
    let len = (end - data) as u32;
    let Some(cfg) = config() else {
        count(Reason::Passed, len);
        return xdp_action::XDP_PASS;
    };
    match classify(data, end, cfg) {
        Verdict::Pass => {
            count(Reason::Passed, len);
            xdp_action::XDP_PASS
        }
        Verdict::Drop(r) => {
            count(r, len);
            xdp_action::XDP_DROP
        }
        Verdict::Decap => {
            // SAFETY: the helper checks the new head against the buffer.
            if unsafe { bpf_xdp_adjust_head(ctx.ctx, ENCAP_LEN as i32) } != 0 {
                count(Reason::DropError, len);
                return xdp_action::XDP_DROP;
            }
            let data = ctx.data();
            if data + ETH_LEN > ctx.data_end() {
                count(Reason::DropError, len);
                return xdp_action::XDP_DROP;
            }
            // The inner frame is addressed to our VTEP MAC; readdress it to
            // the uplink so the stack takes it as PACKET_HOST.
            unsafe { (*(data as *mut EthHdr)).dst = cfg.uplink_mac };
            count(Reason::Decapsulated, len - ENCAP_LEN as u32);
            xdp_action::XDP_PASS
        }
    }
}

/// Decapsulation fallback: TC ingress on the uplink, for when XDP cannot be
/// attached (`--xdp-mode off`).
#[classifier]
pub fn weft_decap_tc(ctx: TcContext) -> i32 {
    let len = ctx.len();
    let Some(cfg) = config() else {
        count(Reason::Passed, len);
        return TC_ACT_OK;
    };
    let mut data = ctx.data();
    let mut end = ctx.data_end();
    let want = (decap::INNER_ETH + ETH_LEN + headers::IPV4_LEN) as u32;
    if data + want as usize > end && len >= want {
        if ctx.pull_data(want).is_err() {
            count(Reason::DropError, len);
            return TC_ACT_SHOT;
        }
        data = ctx.data();
        end = ctx.data_end();
    }
    match classify(data, end, cfg) {
        Verdict::Pass => {
            count(Reason::Passed, len);
            TC_ACT_OK
        }
        Verdict::Drop(r) => {
            count(r, len);
            TC_ACT_SHOT
        }
        Verdict::Decap => {
            // Remove outer IPv4/UDP/VXLAN and the inner Ethernet header; the
            // outer Ethernet header (already addressed to us) stays.
            if ctx
                .adjust_room(
                    -(ENCAP_LEN as i32),
                    BPF_ADJ_ROOM_MAC,
                    BPF_F_ADJ_ROOM_FIXED_GSO as u64,
                )
                .is_err()
            {
                count(Reason::DropError, len);
                return TC_ACT_SHOT;
            }
            count(Reason::Decapsulated, len - ENCAP_LEN as u32);
            TC_ACT_OK
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
