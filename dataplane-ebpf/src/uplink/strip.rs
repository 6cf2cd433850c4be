//! Stripping the outer headers of a frame `decap::classify` accepted: in
//! XDP (move the packet head) and in TC (shrink the room at the MAC layer).

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_FIXED_GSO, TC_ACT_OK, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, xdp_action,
    },
    helpers::generated::{bpf_ktime_get_ns, bpf_xdp_adjust_head, bpf_xdp_adjust_meta},
    programs::{TcContext, XdpContext},
};
use dataplane_common::{DataplaneConfig, Reason, XDP_DECAP_MARK};

use crate::{
    family::{Family, V4, V6},
    headers::{ETH_LEN, IPV4_LEN, IPV6_LEN},
    maps::WEFT_WHOLE_RX,
    packet::{linear, read, write},
    pod::deliver,
    uplink::decap::{CLASSIFY_LEN4, Classified, Decap, classify, classify_len, set_ce},
    verdict::{Done, Dropped, Verdict},
};

/// The reason a frame the programs pass on is counted under.
#[inline(always)]
fn passed(c: Classified) -> Reason {
    match c {
        Classified::Fragment => Reason::Fragmented,
        _ => Reason::Passed,
    }
}

#[inline(always)]
pub(crate) fn xdp(ctx: &XdpContext, cfg: &DataplaneConfig) -> Verdict<u32> {
    let (data, end) = (ctx.data(), ctx.data_end());
    let len = (end - data) as u32;
    let decap = match classify(data, end, cfg)? {
        Classified::Ours(d) => d,
        other => {
            return Ok(Done::new(xdp_action::XDP_PASS, passed(other), len));
        }
    };
    // SAFETY: the helper checks the new head against the buffer.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, decap.len as i32) } != 0 {
        return Err(Reason::DropError.into());
    }
    // The inner frame is addressed to our VTEP MAC; readdress it to the
    // uplink so the stack takes it as PACKET_HOST.
    let (data, end) = (ctx.data(), ctx.data_end());
    if !write(data, end, 0, cfg.uplink_mac) || decap.set_ce && !set_ce(data, end, decap.v6) {
        return Err(Reason::DropError.into());
    }
    if cfg.bypass() && xdp_mark() {
        mark(ctx);
    }
    Ok(Done::new(
        xdp_action::XDP_PASS,
        Reason::Decapsulated,
        len - decap.len,
    ))
}

#[inline(always)]
pub(crate) fn tc(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    let len = ctx.len();
    let (data, end) = linear(ctx, CLASSIFY_LEN4)?;
    let (data, end) = linear(ctx, classify_len(data, end))?;
    let decap = match classify(data, end, cfg)? {
        Classified::Ours(d) => d,
        Classified::Fragment => {
            return Ok(Done::new(TC_ACT_OK, Reason::Fragmented, len));
        }
        Classified::NotOurs => {
            // Not VXLAN: a direct peer's pod may be sending to one of ours.
            if let Some(action) = deliver::deliver_direct(ctx, cfg) {
                return Ok(Done::new(action, Reason::DirectRx, len));
            }
            return Ok(Done::pass(len));
        }
    };
    if cfg.kernel_rx() {
        return to_pod_or_kernel(ctx, cfg, decap, len);
    }
    strip_tc(ctx, decap)?;
    if let Some(action) = deliver::deliver(ctx, cfg) {
        return Ok(Done::new(action, Reason::DecapBypass, len - decap.len));
    }
    Ok(Done::new(TC_ACT_OK, Reason::Decapsulated, len - decap.len))
}

/// A checked frame with the kernel's vxlan device behind the uplink
/// ([`CONFIG_F_KERNEL_RX`]): stripped here and delivered if it goes
/// straight into a local pod (chosen from its inner headers before
/// stripping); anything else is for the host stack ([`stack`]): passed on
/// whole for the kernel to decapsulate (counted there, by
/// `weft_tunnel_rx`), or stripped here.
#[inline(always)]
fn to_pod_or_kernel(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    decap: Decap,
    len: u32,
) -> Verdict<i32> {
    // The inner IP header and the transport header's ports and flags.
    let ip_len = if decap.v6 { IPV6_LEN } else { IPV4_LEN };
    let (data, end) = linear(ctx, ETH_LEN + decap.len as usize + ip_len + 14)?;
    let ep = if decap.v6 {
        deliver::endpoint::<V6>(ctx, cfg, data, end, ETH_LEN + V6::ENCAP_LEN)
    } else {
        deliver::endpoint::<V4>(ctx, cfg, data, end, ETH_LEN + V4::ENCAP_LEN)
    };
    let Some(ep) = ep else {
        return stack(ctx, decap, len);
    };
    strip_tc(ctx, decap)?;
    let (data, end) = linear(ctx, ETH_LEN + IPV6_LEN)?;
    let Some(action) = deliver::into_pod(ctx, data, end, &ep, decap.v6) else {
        return Err(Reason::DropError.into());
    };
    Ok(Done::new(action, Reason::DecapBypass, len - decap.len))
}

/// How long after a frame went whole to the kernel's vxlan device the
/// frames after it on the same CPU go there too: the device queues what it
/// decapsulates (its GRO cells, served after the uplink's queue), so a
/// frame stripped right behind one would overtake it. Far longer than the
/// queue holds a frame.
const QUEUED_NS: u64 = 1_000_000;

/// Frames up to this long (outer headers included) are a short
/// connection's or a quiet flow's: a handshake, an ACK, a small request or
/// answer. Longer ones are a stream's, which the device's GRO merges.
const SMALL_FRAME: u32 = 320;

/// A checked frame for the host stack, with the kernel's vxlan device
/// behind the uplink. A small frame that is not GSO is stripped here and
/// enters the stack on the uplink, as XDP's do: no outer IP and UDP
/// receive, no conntrack of the tunnel's own packets, no queue in the
/// device (`cargo xtask bench datapath`, connections per second of the
/// host-stack path: 0.93x the kernel device before, 1.09x after). Unless
/// a frame went whole to the device on this CPU within [`QUEUED_NS`]: then
/// it goes whole too, in order behind it. Everything else goes whole: a
/// GSO frame stripped here would keep its tunnel GSO state, which a pod
/// bridge segments in software, and a stream's segments are merged by
/// the device's GRO.
#[inline(always)]
fn stack(ctx: &TcContext, decap: Decap, len: u32) -> Verdict<i32> {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: reading a field of the context's own sk_buff.
    let small = len <= SMALL_FRAME && unsafe { (*ctx.skb.skb).gso_size } == 0;
    let Some(last) = WEFT_WHOLE_RX.get_ptr_mut(0) else {
        return Ok(Done::pass(len));
    };
    // SAFETY: this CPU's slot of the array, only ever used on this CPU.
    let queued = now.wrapping_sub(unsafe { *last }) < QUEUED_NS;
    if !small || queued {
        // SAFETY: as above.
        unsafe { *last = now };
        return Ok(Done::pass(len));
    }
    strip_tc(ctx, decap)?;
    Ok(Done::new(TC_ACT_OK, Reason::Decapsulated, len - decap.len))
}

/// Strips a classified frame in TC, and carries a congestion mark inward.
#[inline(always)]
fn strip_tc(ctx: &TcContext, decap: Decap) -> Result<(), Dropped> {
    // Remove outer IP/UDP/VXLAN and the inner Ethernet header; the outer
    // Ethernet header (already addressed to us, of the inner packet's
    // protocol) stays.
    ctx.adjust_room(
        -(decap.len as i32),
        BPF_ADJ_ROOM_MAC,
        BPF_F_ADJ_ROOM_FIXED_GSO as u64,
    )
    .map_err(|_| Dropped::from(Reason::DropError))?;
    if decap.set_ce {
        let (data, end) = linear(ctx, ETH_LEN + IPV6_LEN)?;
        if !set_ce(data, end, decap.v6) {
            return Err(Reason::DropError.into());
        }
    }
    Ok(())
}

/// Whether this kernel lets XDP programs call `bpf_xdp_adjust_meta`: a
/// constant of the loaded object, set by the agent from its probe of the
/// kernel. Where it is 0 the verifier prunes the call (a kernel that
/// refuses the helper would refuse the whole program for it), and frames
/// XDP decapsulates take the host stack.
#[unsafe(no_mangle)]
static XDP_META: u32 = 1;

#[inline(always)]
fn xdp_mark() -> bool {
    // SAFETY: a read of a constant the loader may have set.
    unsafe { core::ptr::read_volatile(&XDP_META) != 0 }
}

/// Marks a frame XDP decapsulated, in its metadata, for `weft_deliver`.
/// A driver without metadata support leaves it unmarked: it takes the
/// host stack.
#[inline(always)]
fn mark(ctx: &XdpContext) {
    // SAFETY: the helper checks the new metadata start against the buffer.
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -4) } != 0 {
        return;
    }
    // SAFETY: reading the context's own metadata pointer.
    let meta = unsafe { (*ctx.ctx).data_meta } as usize;
    write(meta, ctx.data(), 0, XDP_DECAP_MARK);
}

/// Whether XDP marked this frame as decapsulated.
#[inline(always)]
pub(crate) fn marked_by_xdp(ctx: &TcContext) -> bool {
    // SAFETY: reading the context's own metadata pointer.
    let meta = unsafe { (*ctx.skb.skb).data_meta } as usize;
    read::<u32>(meta, ctx.data(), 0) == Some(XDP_DECAP_MARK)
}
