//! The wireguard backend, receive: a decrypted packet arrives at the
//! WireGuard device without an Ethernet header; one for a local pod gets
//! one pushed (the pod's and its gateway's MACs) and goes straight into
//! the pod.

use aya_ebpf::{helpers::generated::bpf_skb_change_head, programs::TcContext};
use dataplane_common::{DataplaneConfig, Reason};

use crate::{
    family::{V4, V6},
    headers::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV6_LEN},
    packet::{linear, write},
    pod::deliver,
    verdict::{Done, Verdict},
};

/// Receive: what the WireGuard device decrypted (an IP packet at the start
/// of the frame) goes into a local pod, counted as delivered, or takes the
/// host stack untouched, counted as passed; one changed that cannot go on
/// is dropped.
#[inline(always)]
pub(crate) fn receive(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    let len = ctx.len();
    match into_local_pod(ctx, cfg) {
        Ok(Some(action)) => Ok(Done::new(action, Reason::DecapBypass, len)),
        Ok(None) => Ok(Done::pass(len)),
        Err(()) => Err(Reason::DropError.into()),
    }
}

/// `Ok(Some(action))`: the packet went into a local pod; `Ok(None)`: it
/// takes the host stack, untouched; `Err`: it was changed and cannot go on.
#[inline(always)]
fn into_local_pod(ctx: &TcContext, cfg: &DataplaneConfig) -> Result<Option<i32>, ()> {
    if !(cfg.wireguard() && cfg.bypass()) {
        return Ok(None);
    }
    // SAFETY: reading a field of the context's own sk_buff.
    let proto = unsafe { (*ctx.skb.skb).protocol };
    let v6 = if proto == u32::from(ETH_P_IP.to_be()) && cfg.ipv4() {
        false
    } else if proto == u32::from(ETH_P_IPV6.to_be()) && cfg.ipv6() {
        true
    } else {
        return Ok(None);
    };
    let Ok((data, end)) = linear(ctx, IPV6_LEN) else {
        return Ok(None);
    };
    let ep = if v6 {
        deliver::endpoint::<V6>(ctx, cfg, data, end, 0)
    } else {
        deliver::endpoint::<V4>(ctx, cfg, data, end, 0)
    };
    let Some(ep) = ep else {
        return Ok(None);
    };
    // Room for the Ethernet header. The kernel refuses it for a packet
    // that is not GSO and would then exceed the device's MTU (a full-size
    // packet GRO did not merge): that one takes the stack, unchanged.
    // SAFETY: the helper only grows the context's own sk_buff's head.
    if unsafe { bpf_skb_change_head(ctx.skb.skb, ETH_LEN as u32, 0) } != 0 {
        return Ok(None);
    }
    let (data, end) = (ctx.data(), ctx.data_end());
    let ether = if v6 { ETH_P_IPV6 } else { ETH_P_IP };
    if !write(data, end, 12, ether.to_be()) {
        return Err(());
    }
    deliver::into_pod(ctx, data, end, &ep, v6)
        .map(Some)
        .ok_or(())
}
