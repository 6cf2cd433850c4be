//! The conntrack gate of `--host-routing auto`: a flow bypasses the host
//! stack only once the stack has let it through, and only if nothing in
//! netfilter rewrites it.
//!
//! The first packets of every flow take the host stack, so netfilter
//! decides (a FORWARD rule that drops them keeps dropping them: their
//! conntrack entry is never confirmed). Once conntrack holds a confirmed
//! entry without NAT, the flow's packets bypass the stack. Flows with NAT
//! (a Service's DNAT, a hostPort) always take the stack, so their replies
//! are translated back. When a TCP flow ends (FIN or RST bypassing the
//! stack), its entry's timeout is cut short so conntrack forgets it soon,
//! as it would have had it seen the end.
//!
//! conntrack is reached through the kernel's kfuncs `bpf_skb_ct_lookup`,
//! `bpf_ct_release` and `bpf_ct_change_timeout` (Linux 6.0); the agent
//! resolves the calls against the kernel's BTF when it loads the programs.

use aya_ebpf::{bindings::__sk_buff, programs::TcContext};

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

/// What the gate asks conntrack about: a packet's addresses, protocol,
/// ports and TCP flags.
#[derive(Clone, Copy)]
pub(crate) enum Flow {
    V4 { saddr: u32, daddr: u32 },
    V6 { saddr: [u8; 16], daddr: [u8; 16] },
}

/// `struct bpf_ct_opts` (16 bytes since Linux 6.1): `netns_id`, `error`,
/// then `l4proto`, `dir`, `ct_zone_id`, `ct_zone_dir` and three reserved
/// bytes as one little-endian word with `l4proto` in its low byte. As
/// separate zero bytes LLVM clears them with a call to memset, and the
/// verifier and LLVM disagree about the registers around that call.
#[repr(C)]
struct CtOpts {
    netns_id: i32,
    error: i32,
    /// `l4proto` (byte 0); direction, zone and reserved bytes zero.
    l4proto_rest: u64,
}

/// The conntrack entry of `tuple` (`len` bytes: which family), or null.
#[inline(always)]
fn lookup(skb: *mut __sk_buff, tuple: &mut SockTuple, len: u32, proto: u8) -> *mut NfConn {
    let mut opts = CtOpts {
        netns_id: CURRENT_NETNS,
        error: 0,
        l4proto_rest: proto as u64,
    };
    // SAFETY: the kfunc reads `len` bytes of the tuple (the variant that
    // size names) and writes the options, both valid for their sizes; it
    // returns a referenced nf_conn or null.
    unsafe {
        bpf_skb_ct_lookup(
            skb,
            tuple,
            len,
            &mut opts,
            core::mem::size_of::<CtOpts>() as u32,
        )
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
}

/// Byte offset of `status` in this kernel's `struct nf_conn`, set by the
/// agent from the kernel's BTF when it loads the programs (a constant of
/// the loaded object, so the verifier sees a fixed field access).
#[unsafe(no_mangle)]
static NF_CONN_STATUS_OFF: u32 = 0;

/// `BPF_F_CURRENT_NETNS`.
const CURRENT_NETNS: i32 = -1;
const IPS_CONFIRMED: u64 = 1 << 3;
/// `IPS_SRC_NAT | IPS_DST_NAT`.
const IPS_NAT_MASK: u64 = (1 << 4) | (1 << 5);
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
/// How long conntrack keeps a TCP flow once it ended on the fast path (ms).
const CLOSED_TIMEOUT_MS: u32 = 10_000;

/// Whether the packet (its `flow`, L4 protocol `proto`, ports and TCP
/// flags) may bypass the host stack.
#[inline(always)]
pub(crate) fn allows(
    ctx: &TcContext,
    flow: Flow,
    proto: u8,
    ports: (u16, u16),
    tcp_flags: u8,
) -> bool {
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return false;
    }
    // A connection being opened is for the stack to see.
    if proto == IPPROTO_TCP && tcp_flags & TCP_SYN != 0 {
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
    // Decided before the lookup: nothing but the entry lives across the
    // kfunc call.
    let closing = proto == IPPROTO_TCP && tcp_flags & (TCP_FIN | TCP_RST) != 0;
    let ct = lookup(ctx.skb.skb, &mut tuple, len as u32, proto);
    if ct.is_null() {
        return false;
    }
    // SAFETY: a constant of the loaded object.
    let off = unsafe { core::ptr::read_volatile(&NF_CONN_STATUS_OFF) } as usize;
    // SAFETY: ct is a valid nf_conn (checked non-null) and `off` is the
    // offset of its 8-byte `status` field in this kernel.
    let status = unsafe { core::ptr::read_volatile((ct as *const u8).add(off) as *const u64) };
    let ok = status & IPS_CONFIRMED != 0 && status & IPS_NAT_MASK == 0;
    if ok && closing {
        // SAFETY: ct is the referenced entry from the lookup.
        unsafe { bpf_ct_change_timeout(ct, CLOSED_TIMEOUT_MS) };
    }
    // SAFETY: releasing the reference the lookup took, once.
    unsafe { bpf_ct_release(ct) };
    ok
}
