//! Encapsulation (TC egress on the overlay device).
//!
//! The kernel routes pod traffic for remote subnets (and the node's own
//! traffic to remote pods) into the overlay device `weft.<VNI>`, whose MTU
//! leaves room for the 50 bytes of VXLAN: the kernel's own MTU checks (and
//! ICMP "fragmentation needed") happen before this program runs. Here the
//! remote VTEP is found with one LPM lookup, the outer headers are built,
//! and the frame is redirected to the uplink with `bpf_redirect_neigh`,
//! which fills the outer Ethernet addresses from the neighbour table.
//!
//! GSO: `bpf_skb_adjust_room` is told what it inserts (UDP tunnel over IPv4,
//! with a 14-byte inner L2) so GSO packets become UDP-tunnel GSO packets that
//! the uplink (or software GSO) segments correctly, each segment getting its
//! own outer headers. `BPF_F_ADJ_ROOM_FIXED_GSO` keeps gso_size: the overlay
//! MTU already left the 50 bytes, so every segment fits the uplink MTU.

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L2_ETH, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP,
        BPF_F_ADJ_ROOM_FIXED_GSO, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_redir_neigh,
        bpf_redir_neigh__bindgen_ty_1,
    },
    helpers::generated::{bpf_get_hash_recalc, bpf_get_prandom_u32, bpf_redirect_neigh},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::{DEFAULT_PATH_MTU, DataplaneConfig, PROBE_MARK, Reason, Vtep};

use crate::{
    headers::{
        ENCAP_LEN, ETH_LEN, ETH_P_IP, EncapHdr, EthHdr, IPPROTO_TCP, IPPROTO_UDP, IPV4_LEN,
        Ipv4Hdr, UdpHdr, VXLAN_FLAG_VNI, VxlanHdr, ipv4_csum,
    },
    maps::{WEFT_PATH_MTU, WEFT_PEERS},
    packet::{linear, read, write},
    verdict::{Done, Dropped, Verdict},
};

/// `BPF_F_ADJ_ROOM_ENCAP_L2(len)`: the inner L2 header length.
const fn encap_l2(len: u64) -> u64 {
    (len & 0xff) << 56
}

const ENCAP_FLAGS: u64 = BPF_F_ADJ_ROOM_FIXED_GSO as u64
    | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 as u64
    | BPF_F_ADJ_ROOM_ENCAP_L4_UDP as u64
    | BPF_F_ADJ_ROOM_ENCAP_L2_ETH as u64
    | encap_l2(ETH_LEN as u64);

/// The kernel's ephemeral port range, as `udp_flow_src_port` uses it.
const SPORT_MIN: u32 = 32768;
const SPORT_MAX: u32 = 60999;

/// Encapsulation on the overlay device: the host stack routed the packet
/// here (a pod's packet on the legacy path, or the node's own).
#[inline(always)]
pub(crate) fn encap(ctx: &TcContext, cfg: &DataplaneConfig) -> Verdict<i32> {
    let (data, end) = linear(ctx, ETH_LEN + IPV4_LEN)?;
    let eth = read::<EthHdr>(data, end, 0).ok_or(Reason::DropMalformed)?;
    if eth.proto != ETH_P_IP.to_be() {
        // The overlay device carries IPv4 only; the device itself drops it.
        return Ok(Done::pass(ctx.len()));
    }
    let inner = read::<Ipv4Hdr>(data, end, ETH_LEN).ok_or(Reason::DropMalformed)?;
    let drop = |r: Reason| Dropped::at(r, inner.saddr, inner.daddr);
    let vtep = *WEFT_PEERS
        .get(Key::new(32, inner.daddr))
        .ok_or(drop(Reason::DropNoRoute))?;
    let len = ctx.len();
    if too_big(ctx, cfg, len) {
        return Err(drop(Reason::DropTooBig));
    }
    // The route to the peer carries its path MTU: the stack has checked
    // the size against it.
    let df = path(ctx, cfg, &vtep, outer_len(len)).df;
    let new_len = encapsulate(ctx, cfg, &inner, &vtep, df).map_err(drop)?;
    Ok(Done::new(
        redirect_to_uplink(cfg),
        Reason::Encapsulated,
        new_len,
    ))
}

/// The outer IPv4 packet's length for a `len`-byte frame (Ethernet header
/// included).
#[inline(always)]
pub(crate) fn outer_len(len: u32) -> u32 {
    len - ETH_LEN as u32 + ENCAP_LEN as u32
}

/// Outer packets no larger than this never set don't-fragment and need no
/// path lookup: every underlay carries them (IPv6's minimum MTU), and the
/// small packets that dominate packet rates cost nothing more.
const SMALL: u32 = 1280;

/// What the path to a peer allows: its largest outer IPv4 packet, and
/// whether the outer header says don't-fragment.
pub(crate) struct Path {
    pub(crate) mtu: u32,
    pub(crate) df: bool,
}

/// The path to `vtep` for an outer packet (or GSO segment) of `outer`
/// bytes: without per-peer path MTU, the uplink's MTU and no
/// don't-fragment; with it, the measured MTU (and don't-fragment), or for
/// a peer not measured the smaller of the uplink's and
/// [`DEFAULT_PATH_MTU`] (don't-fragment on the prober's packets only).
#[inline(always)]
pub(crate) fn path(ctx: &TcContext, cfg: &DataplaneConfig, vtep: &Vtep, outer: u32) -> Path {
    if !cfg.path_mtu() || outer <= SMALL {
        return Path {
            mtu: cfg.uplink_mtu,
            df: false,
        };
    }
    // SAFETY: a lookup in a map of plain integers; the value is copied.
    match unsafe { WEFT_PATH_MTU.get(vtep.addr_be) } {
        Some(m) => Path {
            mtu: (*m).min(cfg.uplink_mtu),
            df: true,
        },
        None => Path {
            mtu: cfg.uplink_mtu.min(DEFAULT_PATH_MTU),
            // SAFETY: reading a field of the context's own sk_buff.
            df: unsafe { (*ctx.skb.skb).mark } == PROBE_MARK,
        },
    }
}

/// Whether an encapsulated `len`-byte frame could not leave: a packet that
/// is not GSO and would exceed the uplink MTU, or one whose outer IPv4
/// length would not fit in 16 bits (BIG TCP aggregates).
#[inline(always)]
pub(crate) fn too_big(ctx: &TcContext, cfg: &DataplaneConfig, len: u32) -> bool {
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    let outer_ip_len = len - ETH_LEN as u32 + ENCAP_LEN as u32;
    outer_ip_len > u16::MAX as u32 || gso_size == 0 && outer_ip_len > cfg.uplink_mtu
}

/// Redirects the encapsulated frame to the uplink. The outer Ethernet
/// addresses come from the neighbour entry of the route to the remote VTEP.
#[inline(always)]
pub(crate) fn redirect_to_uplink(cfg: &DataplaneConfig) -> i32 {
    // SAFETY: a helper with no pointer arguments besides a null parameter
    // block, which it accepts.
    unsafe { bpf_redirect_neigh(cfg.uplink_ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

/// DirectRouting: redirects the frame, as it is, to the uplink toward the
/// peer's public IP `nh_be` (network order); the neighbour table gives the
/// Ethernet addresses, as for an encapsulated frame.
#[inline(always)]
pub(crate) fn redirect_direct(cfg: &DataplaneConfig, nh_be: u32) -> i32 {
    let mut params = bpf_redir_neigh {
        nh_family: AF_INET,
        __bindgen_anon_1: bpf_redir_neigh__bindgen_ty_1 { ipv4_nh: nh_be },
    };
    // SAFETY: the parameter block is a valid, initialised bpf_redir_neigh
    // on this program's stack, passed with its size.
    unsafe {
        bpf_redirect_neigh(
            cfg.uplink_ifindex,
            &mut params,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        ) as i32
    }
}

/// The IPv4 don't-fragment flag (host order).
const IP_DF: u16 = 0x4000;

/// `AF_INET`.
const AF_INET: u32 = 2;

/// Puts the outer headers for `vtep` in front of the frame (whose IPv4
/// header is `inner`); returns the new length. The frame is unchanged when
/// this fails (no room, or an skb that is already encapsulated).
#[inline(always)]
pub(crate) fn encapsulate(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    inner: &Ipv4Hdr,
    vtep: &Vtep,
    df: bool,
) -> Result<u32, Reason> {
    let len = ctx.len();
    // The source port spreads receivers' load by inner flow, as the kernel does.
    // SAFETY: the helper only reads the context's sk_buff.
    let hash = unsafe { bpf_get_hash_recalc(ctx.skb.skb) };
    let hash = hash ^ (hash << 16);
    let sport = (((hash as u64) * (SPORT_MAX - SPORT_MIN) as u64) >> 32) as u32 + SPORT_MIN;

    ctx.adjust_room(ENCAP_LEN as i32, BPF_ADJ_ROOM_MAC, ENCAP_FLAGS)
        .map_err(|_| Reason::DropError)?;
    let new_len = len + ENCAP_LEN as u32;
    let ip_len = (new_len - ETH_LEN as u32) as u16;
    let mut hdr = EncapHdr {
        ip: Ipv4Hdr {
            ver_ihl: 0x45,
            // Outer ECN follows the inner packet (RFC 6040 normal mode).
            tos: inner.tos & 0x03,
            tot_len: ip_len.to_be(),
            // SAFETY: a helper without arguments.
            id: (unsafe { bpf_get_prandom_u32() } as u16).to_be(),
            frag_off: if df { IP_DF.to_be() } else { 0 },
            ttl: 64,
            proto: IPPROTO_UDP,
            csum: 0,
            saddr: cfg.local_addr_be,
            daddr: vtep.addr_be,
        },
        udp: UdpHdr {
            source: (sport as u16).to_be(),
            dest: cfg.port.to_be(),
            len: (ip_len - IPV4_LEN as u16).to_be(),
            csum: 0,
        },
        vxlan: VxlanHdr {
            flags: VXLAN_FLAG_VNI,
            reserved1: [0; 3],
            vni_reserved: (cfg.vni << 8).to_be(),
        },
        inner_eth: EthHdr {
            dst: vtep.mac,
            src: cfg.vtep_mac,
            proto: ETH_P_IP.to_be(),
        },
    };
    hdr.ip.csum = ipv4_csum(hdr.ip);
    let (data, end) = (ctx.data(), ctx.data_end());
    if !(write(data, end, 12, ETH_P_IP.to_be()) && write(data, end, ETH_LEN, hdr)) {
        return Err(Reason::DropError);
    }
    Ok(new_len)
}

/// The outer IPv4 packet's length on the wire once `ip`'s `len`-byte
/// frame is encapsulated: the frame's, or for a GSO packet one segment's
/// (its size, the IPv4 header and the TCP or UDP header). None for a GSO
/// packet whose headers are out of reach or of another kind.
#[inline(always)]
pub(crate) fn outer_segment(
    ctx: &TcContext,
    data: usize,
    end: usize,
    len: u32,
    ip: &Ipv4Hdr,
) -> Option<u32> {
    // SAFETY: reading a field of the context's own sk_buff.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 {
        return Some(outer_len(len));
    }
    let l3 = u32::from(ip.ver_ihl & 0x0f) * 4;
    let l4 = match ip.proto {
        IPPROTO_TCP => {
            let off = read::<u8>(data, end, ETH_LEN + IPV4_LEN + 12)?;
            if l3 != IPV4_LEN as u32 {
                return None;
            }
            u32::from(off >> 4) * 4
        }
        IPPROTO_UDP => 8,
        _ => return None,
    };
    Some(gso_size + l3 + l4 + ENCAP_LEN as u32)
}
