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
        BPF_F_ADJ_ROOM_FIXED_GSO, TC_ACT_OK, TC_ACT_SHOT, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    helpers::generated::{bpf_get_hash_recalc, bpf_get_prandom_u32, bpf_redirect_neigh},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use dataplane_common::Reason;

use crate::{
    headers::{
        ENCAP_LEN, ETH_LEN, ETH_P_IP, EncapHdr, EthHdr, IPPROTO_UDP, IPV4_LEN, Ipv4Hdr, UdpHdr,
        VXLAN_FLAG_VNI, VxlanHdr, ipv4_csum,
    },
    maps::{WEFT_PEERS, config, count},
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

#[inline(always)]
pub fn encap(ctx: &TcContext) -> i32 {
    let Some(cfg) = config() else {
        count(Reason::DropError, ctx.len());
        return TC_ACT_SHOT;
    };
    let mut data = ctx.data();
    let mut end = ctx.data_end();
    if data + ETH_LEN + IPV4_LEN > end {
        // Headers not in the linear part: pull them in.
        if ctx.pull_data((ETH_LEN + IPV4_LEN) as u32).is_err() {
            count(Reason::DropMalformed, ctx.len());
            return TC_ACT_SHOT;
        }
        data = ctx.data();
        end = ctx.data_end();
        if data + ETH_LEN + IPV4_LEN > end {
            count(Reason::DropMalformed, ctx.len());
            return TC_ACT_SHOT;
        }
    }
    // SAFETY: bounds checked above.
    let eth = unsafe { *(data as *const EthHdr) };
    if eth.proto != ETH_P_IP.to_be() {
        // The overlay device carries IPv4 only; the device itself drops it.
        count(Reason::Passed, ctx.len());
        return TC_ACT_OK;
    }
    let inner = unsafe { *((data + ETH_LEN) as *const Ipv4Hdr) };
    let Some(vtep) = WEFT_PEERS.get(Key::new(32, inner.daddr)) else {
        count(Reason::DropNoRoute, ctx.len());
        return TC_ACT_SHOT;
    };
    let vtep = *vtep;

    let len = ctx.len();
    // SAFETY: reading the context's own fields.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 && len - ETH_LEN as u32 + ENCAP_LEN as u32 > cfg.uplink_mtu {
        count(Reason::DropTooBig, len);
        return TC_ACT_SHOT;
    }

    // The source port spreads receivers' load by inner flow, as the kernel does.
    let hash = unsafe { bpf_get_hash_recalc(ctx.skb.skb) };
    let hash = hash ^ (hash << 16);
    let sport = (((hash as u64) * (SPORT_MAX - SPORT_MIN) as u64) >> 32) as u32 + SPORT_MIN;

    if ctx
        .adjust_room(ENCAP_LEN as i32, BPF_ADJ_ROOM_MAC, ENCAP_FLAGS)
        .is_err()
    {
        count(Reason::DropError, len);
        return TC_ACT_SHOT;
    }
    let new_len = len + ENCAP_LEN as u32;
    let data = ctx.data();
    let end = ctx.data_end();
    if data + ETH_LEN + ENCAP_LEN > end {
        count(Reason::DropError, new_len);
        return TC_ACT_SHOT;
    }

    let ip_len = (new_len - ETH_LEN as u32) as u16;
    let mut hdr = EncapHdr {
        ip: Ipv4Hdr {
            ver_ihl: 0x45,
            // Outer ECN follows the inner packet (RFC 6040 normal mode).
            tos: inner.tos & 0x03,
            tot_len: ip_len.to_be(),
            id: (unsafe { bpf_get_prandom_u32() } as u16).to_be(),
            frag_off: 0,
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
    hdr.ip.csum = ipv4_csum(&hdr.ip);
    // SAFETY: bounds checked above; packed types have alignment 1.
    unsafe {
        let outer = data as *mut EthHdr;
        (*outer).proto = ETH_P_IP.to_be();
        core::ptr::write_unaligned((data + ETH_LEN) as *mut EncapHdr, hdr);
    }
    count(Reason::Encapsulated, new_len);
    // Outer Ethernet addresses come from the neighbour entry of the route
    // to the remote VTEP on the uplink.
    unsafe { bpf_redirect_neigh(cfg.uplink_ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}
