//! A pod's packet as both backends' transmit programs read it at the host
//! side of the pod's veth: its source checked, and, where host routing may
//! take it, the remote node it is for, handed to the backend's transmit.

use aya_ebpf::{maps::lpm_trie::Key, programs::TcContext};
use dataplane_common::{DataplaneConfig, PodIf, Reason, Vtep, Vtep6};

use crate::{
    headers::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, EthHdr, IPV6_LEN, Ipv4Hdr, Ipv6Hdr},
    maps::{
        WEFT_ENDPOINTS, WEFT_ENDPOINTS6, WEFT_PEERS, WEFT_PEERS6, WEFT_POD_IFS, WEFT_VTEPS,
        WEFT_VTEPS6,
    },
    packet::{eq16, in_subnet4, in_subnet6, linear, read},
    verdict::{Done, Dropped, Verdict},
};

/// Reads the packet at a pod's veth for the backend the program is for
/// (`wireguard`) and hands one host routing may take to that backend's
/// transmit of its family (`send4`, `send6`): from the pod's own address,
/// to a remote pod (its node's VTEP in the peer table, given), with a hop
/// to spare; an IPv6 one only where the node has its IPv6 device. They get
/// the frame's linear part `[data, end)` with the IP header right after
/// the Ethernet header. Anything else takes the host stack (not this
/// backend's, not IP of a family the node carries, another source, not
/// for a remote pod, or only checked); a packet whose source is another's
/// (spoofed) is dropped.
///
/// The packet is handed on by reference, not returned: a copied-out
/// packet pointer is filled back in pieces, which the verifier refuses.
#[inline(always)]
pub(crate) fn transmit(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    wireguard: bool,
    send4: impl FnOnce(usize, usize, &Ipv4Hdr, &Vtep) -> Verdict<i32>,
    send6: impl FnOnce(usize, usize, &Ipv6Hdr, &Vtep6) -> Verdict<i32>,
) -> Verdict<i32> {
    let pass = Done::pass(ctx.len());
    if !cfg.checks_pods() || cfg.wireguard() != wireguard {
        return Ok(pass);
    }
    let Ok((data, end)) = linear(ctx, ETH_LEN + IPV6_LEN) else {
        return Ok(pass);
    };
    let Some(eth) = read::<EthHdr>(data, end, 0) else {
        return Ok(pass);
    };
    if eth.proto == ETH_P_IP.to_be() && cfg.ipv4() {
        let Some(ip) = read::<Ipv4Hdr>(data, end, ETH_LEN) else {
            return Ok(pass);
        };
        if ip.ver_ihl >> 4 != 4 {
            return Ok(pass);
        }
        match source4(ctx, cfg, ip.saddr) {
            Source::Endpoint => {}
            Source::Spoofed => {
                return Err(Dropped::at(Reason::DropInvalidSource, ip.saddr, ip.daddr));
            }
            Source::Other => return Ok(pass),
        }
        // Checked only (no conntrack kfuncs under `auto`): the stack
        // carries it; and a TTL the host stack must answer.
        if !cfg.bypass() || ip.ttl <= 1 {
            return Ok(pass);
        }
        let Some(vtep) = WEFT_PEERS.get(Key::new(32, ip.daddr)) else {
            return Ok(pass);
        };
        let vtep = *vtep;
        return send4(data, end, &ip, &vtep);
    }
    if eth.proto == ETH_P_IPV6.to_be() && cfg.ipv6() {
        let Some(ip) = read::<Ipv6Hdr>(data, end, ETH_LEN) else {
            return Ok(pass);
        };
        if ip.version() != 6 {
            return Ok(pass);
        }
        match source6(ctx, cfg, &ip.saddr) {
            Source::Endpoint => {}
            Source::Spoofed => return Err(Dropped::at6(Reason::DropInvalidSource, ETH_LEN)),
            Source::Other => return Ok(pass),
        }
        // No IPv6 device (yet): the stack reports why; and a hop limit
        // the stack must answer.
        if !cfg.bypass() || cfg.overlay6_ifindex == 0 || ip.hop_limit <= 1 {
            return Ok(pass);
        }
        let Some(vtep) = WEFT_PEERS6.get(Key::new(128, ip.daddr)) else {
            return Ok(pass);
        };
        let vtep = *vtep;
        return send6(data, end, &ip, &vtep);
    }
    Ok(pass)
}

/// What the source of a pod's packet is, seen from the veth it came from.
enum Source {
    /// The address of the pod behind this veth: the fast path may take it.
    Endpoint,
    /// Another local pod's address, one of the node's pod subnets that is
    /// not this pod's, the node's own address, a remote pod's address or
    /// another node's: dropped (the host stack would forward some of them,
    /// and deliver them to local pods where rp_filter is off; none may
    /// reach anyone as if this pod were someone else).
    Spoofed,
    /// Anything else (a pod that routes for others, a link-local source),
    /// or a veth host routing does not know (yet): the host stack decides,
    /// never the fast path.
    Other,
}

/// The addresses of the pod behind the veth the packet came in on, if
/// host routing knows that veth.
#[inline(always)]
fn pod_if(ctx: &TcContext) -> Option<PodIf> {
    // SAFETY: reading a field of the context's own sk_buff.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: a plain hash lookup; the value is copied out at once.
    unsafe { WEFT_POD_IFS.get(ifindex) }.copied()
}

#[inline(always)]
fn source4(ctx: &TcContext, cfg: &DataplaneConfig, saddr: u32) -> Source {
    // An unknown veth (the agent is programming it): the stack decides.
    let Some(pod) = pod_if(ctx) else {
        return Source::Other;
    };
    if pod.ip4() == Some(saddr) {
        return Source::Endpoint;
    }
    let own = in_subnet4(saddr, cfg.subnet4_be, cfg.mask4_be);
    // SAFETY: a plain hash lookup; the value is not used.
    let other_pod = unsafe { WEFT_ENDPOINTS.get(saddr) }.is_some();
    if own || other_pod || saddr == cfg.local_addr_be {
        return Source::Spoofed;
    }
    // A remote pod's address, or another node's: the stack would deliver
    // it to a local pod where rp_filter is off.
    // SAFETY: a plain hash lookup; the value is not used.
    let remote =
        WEFT_PEERS.get(Key::new(32, saddr)).is_some() || unsafe { WEFT_VTEPS.get(saddr) }.is_some();
    if remote {
        Source::Spoofed
    } else {
        Source::Other
    }
}

#[inline(always)]
fn source6(ctx: &TcContext, cfg: &DataplaneConfig, saddr: &[u8; 16]) -> Source {
    let Some(pod) = pod_if(ctx) else {
        return Source::Other;
    };
    if pod.has_ip6() && eq16(&pod.ip6, saddr) {
        return Source::Endpoint;
    }
    // SAFETY: a plain hash lookup; the value is not used.
    let other_pod = unsafe { WEFT_ENDPOINTS6.get(saddr) }.is_some();
    if in_subnet6(saddr, &cfg.subnet6, &cfg.mask6) || other_pod || eq16(saddr, &cfg.local_addr6) {
        return Source::Spoofed;
    }
    // SAFETY: a plain hash lookup; the value is not used.
    let remote = WEFT_PEERS6.get(Key::new(128, *saddr)).is_some()
        || unsafe { WEFT_VTEPS6.get(saddr) }.is_some();
    if remote {
        Source::Spoofed
    } else {
        Source::Other
    }
}
