//! The conntrack gate of `--host-routing auto`: a flow bypasses the host
//! stack only once the stack has let it through and conntrack holds it as
//! the stack would have kept it, and only if nothing in netfilter rewrites
//! it. conntrack must never turn against a fast-path flow: its entry must
//! not expire while the flow runs, and a packet of it that takes the stack
//! later must not be INVALID.
//!
//! - The stack sees every flow until conntrack holds it firmly: for TCP,
//!   the handshake and the ACK that makes the entry ESTABLISHED and
//!   ASSURED (the SYN, SYN-ACK and third ACK all take the stack; the
//!   SYN-ACK starts the flow's wait for the marking below); for UDP, the first
//!   packet, and in the reply direction every packet until the stack has
//!   seen a reply (SEEN_REPLY: a reply that bypassed would leave the entry
//!   UNREPLIED, and a server's stream would be taken for a new flow once
//!   it expired). A one-way UDP stream bypasses at its originator, its
//!   entry kept UNREPLIED as the stack keeps it. A flow that FORWARD rules
//!   drop is never confirmed and never bypasses.
//! - TCP then bypasses only once its entry is liberal in both directions
//!   (`IP_CT_TCP_FLAG_BE_LIBERAL`): conntrack no longer sees the window
//!   move, so a packet that takes the stack later (a FIN or RST, a segment
//!   too big for the fast path, a flow whose endpoint changed) would be out
//!   of window, hence INVALID, to a strict conntrack (`tcp_loose=0`,
//!   `ct state invalid drop`). No kfunc can write those flags; the agent
//!   does, over ctnetlink, when the programs ask (the `WEFT_CT_REQUESTS`
//!   ring buffer for a bulk flow, read by a realtime thread, and
//!   `WEFT_CT_EARNED` for a flow that lasted, read by a normal one), as the
//!   kernel's flowtable does when it offloads a flow.
//!   Until then the flow's packets take the stack, which keeps the window
//!   current; with the agent away new flows simply stay on the stack.
//! - A flow earns the marking by lasting: it is asked for only once one
//!   of its packets comes [`EARN_NS`] after the flow's first was seen
//!   here, or at once by a GSO packet, which only a bulk flow sends. A
//!   short connection (a health check, an HTTP/1.0 request, DNS over
//!   TCP) is over by then and costs the agent nothing: asking at
//!   once cost each connection a ring-buffer wake-up (an interrupt to
//!   itself, a VM exit where the guest's APIC is emulated), a wake-up of
//!   the agent's marker and a netlink round trip, and halved the
//!   connection rate (`cargo xtask bench datapath`, `crr_per_s`).
//! - FIN and RST always take the stack, and so does every packet of an
//!   entry that is no longer ESTABLISHED: conntrack's own state machine
//!   ends the flow (a half-closed connection streams on through the stack,
//!   which keeps its timeouts), so no closing flow outlives what the stack
//!   gives it.
//! - UDP entries that have seen a reply are marked ASSURED (as conntrack
//!   does after two seconds of a stream), so early_drop spares them.
//! - While a flow bypasses, its entry's timeout is refreshed to the
//!   sysctl's (`nf_conntrack_tcp_timeout_established`,
//!   `nf_conntrack_udp_timeout_stream`, `nf_conntrack_udp_timeout` for
//!   UDP without a reply, passed in by the agent), but only
//!   once less than half of it is left: the entry's cache line is read on
//!   every packet and written about once per half timeout.
//! - Flows with NAT (a Service's DNAT, a hostPort) always take the stack,
//!   so their replies are translated back.
//!
//! conntrack is reached through the kernel's kfuncs (`bpf_skb_ct_lookup`,
//! `bpf_ct_release`, `bpf_ct_change_timeout`, `bpf_ct_change_status`, Linux
//! 6.0); the agent resolves the calls against the kernel's BTF when it
//! loads the programs, and the offsets of the `nf_conn` fields read here
//! with them.

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::generated::{bpf_jiffies64, bpf_ktime_get_ns},
    programs::TcContext,
};
use dataplane_common::{CtRequest, DataplaneConfig};

use crate::{
    headers::{IPPROTO_TCP, IPPROTO_UDP},
    maps::{WEFT_CT_ASKED, WEFT_CT_EARNED, WEFT_CT_REQUESTS},
};

/// `struct bpf_sock_tuple` for IPv4 (the kernel's is a union; 12 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
struct SockTupleV4 {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
}

/// `struct bpf_sock_tuple` for IPv6 (36 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
struct SockTupleV6 {
    saddr: [u8; 16],
    daddr: [u8; 16],
    sport: u16,
    dport: u16,
}

/// `struct bpf_sock_tuple`: the kfunc takes its size, which says which.
#[repr(C)]
union SockTuple {
    v4: SockTupleV4,
    v6: SockTupleV6,
}

/// What the gate asks conntrack about: a packet's addresses.
#[derive(Clone, Copy)]
pub(crate) enum Flow {
    V4 { saddr: u32, daddr: u32 },
    V6 { saddr: [u8; 16], daddr: [u8; 16] },
}

/// `struct bpf_ct_opts`: `netns_id`, `error`, then `l4proto`, `dir` and
/// what follows as one little-endian word with `l4proto` in its low byte
/// (as separate zero bytes LLVM clears them with a call to memset, and the
/// verifier and LLVM disagree about the registers around that call). The
/// kernel reads the first `CT_OPTS_SZ` bytes of it: 12 (`reserved[2]`
/// after `dir`, every kernel with the kfuncs) or 16 (zone fields, Linux
/// 6.11 and later, which take 12 as well).
#[repr(C)]
struct CtOpts {
    netns_id: i32,
    error: i32,
    /// `l4proto` (byte 0); direction, zone and reserved bytes zero.
    l4proto_rest: u64,
}

/// The conntrack entry of `tuple` (`len` bytes: which family), or null,
/// and whether the tuple is the entry's reply direction.
#[inline(always)]
fn lookup(skb: *mut __sk_buff, tuple: &mut SockTuple, len: u32, proto: u8) -> (*mut NfConn, bool) {
    let mut opts = CtOpts {
        netns_id: CURRENT_NETNS,
        error: 0,
        l4proto_rest: proto as u64,
    };
    // SAFETY: the kfunc reads `len` bytes of the tuple (the variant that
    // size names) and writes the options, both valid for their sizes; it
    // returns a referenced nf_conn or null.
    let ct = unsafe { bpf_skb_ct_lookup(skb, tuple, len, &mut opts, ct_opts_size()) };
    // The lookup writes the tuple's direction into `dir` (byte 1).
    (ct, (opts.l4proto_rest >> 8) & 0xff == IP_CT_DIR_REPLY)
}

/// How many bytes of [`CtOpts`] the lookup is given: a constant of the
/// loaded object, the size the agent's probe found this kernel accepts.
#[unsafe(no_mangle)]
static CT_OPTS_SZ: u32 = 12;

#[inline(always)]
fn ct_opts_size() -> u32 {
    // SAFETY: a read of a constant the loader may have set.
    let n = unsafe { core::ptr::read_volatile(&CT_OPTS_SZ) };
    // The verifier checks the size against the options' memory; bounded
    // here whatever the constant says.
    if n as usize > core::mem::size_of::<CtOpts>() {
        core::mem::size_of::<CtOpts>() as u32
    } else {
        n
    }
}

/// `struct nf_conn`, only ever behind a pointer.
#[repr(C)]
struct NfConn {
    _opaque: [u8; 0],
}

unsafe extern "C" {
    fn bpf_skb_ct_lookup(
        skb: *mut __sk_buff,
        tuple: *mut SockTuple,
        tuple_len: u32,
        opts: *mut CtOpts,
        opts_len: u32,
    ) -> *mut NfConn;
    fn bpf_ct_release(ct: *mut NfConn);
    fn bpf_ct_change_timeout(ct: *mut NfConn, timeout: u32) -> i32;
    fn bpf_ct_change_status(ct: *mut NfConn, status: u32) -> i32;
}

/// Byte offsets of the `nf_conn` fields read here, in this kernel's layout:
/// set by the agent from the kernel's BTF when it loads the programs
/// (constants of the loaded object, so the verifier sees fixed field
/// accesses). `status` (8 bytes), `timeout` (4), and in `proto.tcp` the
/// TCP state and each direction's `seen[].flags` (1 each).
#[unsafe(no_mangle)]
static NF_CONN_STATUS_OFF: u32 = 0;
#[unsafe(no_mangle)]
static NF_CONN_TIMEOUT_OFF: u32 = 0;
#[unsafe(no_mangle)]
static NF_CONN_TCP_STATE_OFF: u32 = 0;
#[unsafe(no_mangle)]
static NF_CONN_TCP_FLAGS0_OFF: u32 = 0;
#[unsafe(no_mangle)]
static NF_CONN_TCP_FLAGS1_OFF: u32 = 0;

/// `IP_CT_DIR_REPLY`.
const IP_CT_DIR_REPLY: u64 = 1;
/// `BPF_F_CURRENT_NETNS`.
const CURRENT_NETNS: i32 = -1;
const IPS_SEEN_REPLY: u64 = 1 << 1;
const IPS_ASSURED: u64 = 1 << 2;
const IPS_CONFIRMED: u64 = 1 << 3;
/// `IPS_SRC_NAT | IPS_DST_NAT`.
const IPS_NAT_MASK: u64 = (1 << 4) | (1 << 5);
/// `TCP_CONNTRACK_ESTABLISHED`.
const TCP_CONNTRACK_ESTABLISHED: u8 = 3;
/// `IP_CT_TCP_FLAG_BE_LIBERAL`.
const TCP_FLAG_BE_LIBERAL: u8 = 0x08;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
/// A flow not yet liberal is asked about again after this long (the
/// request or its answer was lost: a full ring, the agent away).
const ASK_AGAIN_NS: u64 = 200_000_000;
/// How long a flow (one direction of it, as the packet names it) must
/// have been seen before it asks to be made liberal: longer than a short
/// connection lives, short beside a flow that gains from the fast path.
const EARN_NS: u64 = 10_000_000;
/// In a `WEFT_CT_ASKED` value: the flow has asked (its time is when);
/// without it the time is when the flow was first seen.
const ASKED: u64 = 1;
/// `BPF_RB_FORCE_WAKEUP`.
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Reads the `T` at byte `off` of the entry.
#[inline(always)]
fn field<T: Copy>(ct: *mut NfConn, off: &'static u32) -> T {
    // SAFETY: a constant of the loaded object.
    let off = unsafe { core::ptr::read_volatile(off) } as usize;
    // SAFETY: ct is a valid, referenced nf_conn and `off` is the offset of
    // a field of type T in this kernel's layout (from its BTF); the
    // verifier checks the access against that BTF.
    unsafe { core::ptr::read_volatile((ct as *const u8).add(off) as *const T) }
}

/// Whether the packet (its `flow`, L4 protocol `proto`, ports and TCP
/// flags) may bypass the host stack; keeps its entry current if so.
#[inline(always)]
pub(crate) fn allows(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    flow: Flow,
    proto: u8,
    ports: (u16, u16),
    tcp_flags: u8,
) -> bool {
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return false;
    }
    // A connection being opened or closed is for the stack to see. Its
    // SYN-ACK starts the wait before it may ask to be made liberal.
    let syn_ack = proto == IPPROTO_TCP
        && tcp_flags & (TCP_SYN | TCP_ACK | TCP_FIN | TCP_RST) == TCP_SYN | TCP_ACK;
    if proto == IPPROTO_TCP && tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0 && !syn_ack {
        return false;
    }
    let (mut tuple, len) = match flow {
        Flow::V4 { saddr, daddr } => (
            SockTuple {
                v4: SockTupleV4 {
                    saddr,
                    daddr,
                    sport: ports.0,
                    dport: ports.1,
                },
            },
            core::mem::size_of::<SockTupleV4>(),
        ),
        Flow::V6 { saddr, daddr } => (
            SockTuple {
                v6: SockTupleV6 {
                    saddr,
                    daddr,
                    sport: ports.0,
                    dport: ports.1,
                },
            },
            core::mem::size_of::<SockTupleV6>(),
        ),
    };
    let (ct, reply) = lookup(ctx.skb.skb, &mut tuple, len as u32, proto);
    if ct.is_null() {
        return false;
    }
    let ok = match entry(ct, cfg, proto, syn_ack, reply) {
        Entry::Firm {
            timeout_ms,
            refresh,
        } => {
            refresh_timeout(ct, timeout_ms, refresh);
            true
        }
        Entry::NotLiberal => {
            // SAFETY: reading a field of the context's own sk_buff.
            let bulk = unsafe { (*ctx.skb.skb).gso_size } != 0;
            ask(&flow, proto, ports, bulk);
            false
        }
        Entry::Stack => false,
    };
    // SAFETY: releasing the reference the lookup took, once.
    unsafe { bpf_ct_release(ct) };
    ok
}

/// What an entry says of its flow's next packet.
enum Entry {
    /// Held as the stack would: bypass, and keep it current (the timeout
    /// in ms to refresh to, and when: fewer jiffies left than this).
    Firm { timeout_ms: u32, refresh: u32 },
    /// An established TCP flow whose window conntrack must stop checking
    /// before it leaves the stack.
    NotLiberal,
    /// Not (yet, or no longer) for the fast path.
    Stack,
}

/// `syn_ack`: the packet is a SYN-ACK (it takes the stack whatever this
/// says; only whether to ask matters); `reply`: it goes the entry's reply
/// direction.
#[inline(always)]
fn entry(ct: *mut NfConn, cfg: &DataplaneConfig, proto: u8, syn_ack: bool, reply: bool) -> Entry {
    let status: u64 = field(ct, &NF_CONN_STATUS_OFF);
    if status & IPS_CONFIRMED == 0 || status & IPS_NAT_MASK != 0 {
        return Entry::Stack;
    }
    if proto == IPPROTO_TCP {
        // Counted from the SYN-ACK on; asked once the flow has lasted.
        let original: u8 = field(ct, &NF_CONN_TCP_FLAGS0_OFF);
        let reply: u8 = field(ct, &NF_CONN_TCP_FLAGS1_OFF);
        if original & reply & TCP_FLAG_BE_LIBERAL == 0 {
            return Entry::NotLiberal;
        }
        let state: u8 = field(ct, &NF_CONN_TCP_STATE_OFF);
        if syn_ack || state != TCP_CONNTRACK_ESTABLISHED || status & IPS_ASSURED == 0 {
            return Entry::Stack;
        }
        return Entry::Firm {
            timeout_ms: cfg.ct_tcp_timeout_ms,
            refresh: cfg.ct_tcp_refresh_jiffies,
        };
    }
    if status & IPS_SEEN_REPLY == 0 {
        // No reply seen: a reply goes to the stack, which marks it; the
        // originator's one-way stream bypasses, kept as the stack keeps it.
        if reply {
            return Entry::Stack;
        }
        return Entry::Firm {
            timeout_ms: cfg.ct_udp_unreplied_ms,
            refresh: cfg.ct_udp_unreplied_refresh_jiffies,
        };
    }
    if status & IPS_ASSURED == 0 {
        // The kfunc sets the status whole (unchangeable bits ignored), and
        // SEEN_REPLY and ASSURED can only be set: nothing is lost.
        // SAFETY: ct is the referenced entry from the lookup.
        unsafe { bpf_ct_change_status(ct, (status | IPS_ASSURED) as u32) };
    }
    Entry::Firm {
        timeout_ms: cfg.ct_udp_timeout_ms,
        refresh: cfg.ct_udp_refresh_jiffies,
    }
}

/// Refreshes the entry's timeout to `timeout_ms` once fewer than `refresh`
/// jiffies are left of it (the entry's line is only read otherwise).
#[inline(always)]
fn refresh_timeout(ct: *mut NfConn, timeout_ms: u32, refresh: u32) {
    if timeout_ms == 0 {
        return;
    }
    let expires: u32 = field(ct, &NF_CONN_TIMEOUT_OFF);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_jiffies64() } as u32;
    let left = expires.wrapping_sub(now) as i32;
    if left < refresh as i32 {
        // SAFETY: ct is the referenced entry from the lookup.
        unsafe { bpf_ct_change_timeout(ct, timeout_ms) };
    }
}

/// Asks the agent to make the flow's entry liberal once the flow has
/// lasted [`EARN_NS`] (its first packet here only starts the wait), or at
/// once for a GSO packet (`bulk`: a bulk flow's), unless
/// it was asked recently. The request goes to the map helpers by
/// reference: by value it is copied again, on a stack the transmit program
/// already nearly fills.
#[inline(always)]
#[allow(clippy::needless_borrows_for_generic_args)]
fn ask(flow: &Flow, proto: u8, ports: (u16, u16), bulk: bool) {
    let mut req = CtRequest {
        family: 4,
        proto,
        _pad: 0,
        sport: ports.0,
        dport: ports.1,
        saddr: [0; 16],
        daddr: [0; 16],
    };
    match flow {
        Flow::V4 { saddr, daddr } => {
            req.saddr[..4].copy_from_slice(&saddr.to_ne_bytes());
            req.daddr[..4].copy_from_slice(&daddr.to_ne_bytes());
        }
        Flow::V6 { saddr, daddr } => {
            req.family = 6;
            req.saddr = *saddr;
            req.daddr = *daddr;
        }
    }
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a plain hash lookup; the value is copied out at once.
    let seen = unsafe { WEFT_CT_ASKED.get(&req) }.copied();
    let wait = match seen {
        // A GSO packet (segments the sender or GRO aggregated) is a bulk
        // flow's: no short connection sends one, so it asks at once.
        None if bulk => 0,
        // First seen: the wait starts (an entry evicted from the LRU
        // starts it again).
        None => {
            let _ = WEFT_CT_ASKED.insert(&req, &(now & !ASKED), 0);
            return;
        }
        Some(v) if v & ASKED == 0 && bulk => 0,
        Some(v) if v & ASKED == 0 => EARN_NS,
        Some(_) => ASK_AGAIN_NS,
    };
    if let Some(v) = seen
        && now.wrapping_sub(v & !ASKED) < wait
    {
        return;
    }
    let _ = WEFT_CT_ASKED.insert(&req, &(now | ASKED), 0);
    // A full ring: asked again later.
    if bulk {
        // To the agent's realtime thread, woken at once
        // (BPF_RB_FORCE_WAKEUP): a bulk flow waits on the stack for the
        // answer.
        let _ = WEFT_CT_REQUESTS.output::<CtRequest>(&req, BPF_RB_FORCE_WAKEUP);
    } else {
        // To a normal thread, woken only when it has read all before (a
        // flood of connections that lasted is read in batches): these
        // flows have waited EARN_NS already, and a realtime thread serving
        // a flood would starve the node.
        let _ = WEFT_CT_EARNED.output::<CtRequest>(&req, 0);
    }
}
