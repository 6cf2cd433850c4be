//! The socket filters (classic BPF) of the echo sockets: what is not an
//! answer to this socket's own probes is dropped in the kernel.
use std::net::Ipv4Addr;

use libc::sock_filter;

use super::wire::{ECHO_REPLY4, ECHO_REPLY6, FRAG_NEEDED4, NONCE, UNREACHABLE4};

/// An instruction, or a jump whose targets are instruction indices
/// (made relative once the program is whole).
enum Op {
    Stmt(u16, u32),
    Jeq(u32, usize, usize),
}

const LDX_MSH_B: u16 = 0xb1; // X = 4 * (pkt[k] & 0xf)
const LD_B_ABS: u16 = 0x30;
const LD_H_ABS: u16 = 0x28;
const LD_W_ABS: u16 = 0x20;
const LD_B_IND: u16 = 0x50;
const LD_H_IND: u16 = 0x48;
const LD_W_IND: u16 = 0x40;
const JEQ_K: u16 = 0x15;
const RET_K: u16 = 0x06;

/// Takes an echo reply with `id` echoing `nonce`, and where `frag`
/// names a VTEP and port, an IPv4 "fragmentation needed" quoting a UDP
/// datagram from that VTEP to that port; drops the rest. An IPv4 raw
/// socket sees the IP header first, an IPv6 one the ICMPv6 message.
pub(super) fn ours(
    v6: bool,
    id: u16,
    nonce: &[u8; NONCE],
    frag: Option<(Ipv4Addr, u16)>,
) -> Vec<sock_filter> {
    let n0 = u32::from_be_bytes(nonce[0..4].try_into().expect("4 bytes"));
    let n1 = u32::from_be_bytes(nonce[4..8].try_into().expect("4 bytes"));
    // Labels past the end: accept, drop (the last two instructions),
    // and the check of a "fragmentation needed".
    const ACCEPT: usize = usize::MAX;
    const DROP: usize = usize::MAX - 1;
    const FRAG: usize = usize::MAX - 2;
    let mut p = Vec::new();
    if v6 {
        p.push(Op::Stmt(LD_B_ABS, 0));
        p.push(Op::Jeq(u32::from(ECHO_REPLY6), 2, DROP));
        p.push(Op::Stmt(LD_H_ABS, 4));
        p.push(Op::Jeq(u32::from(id), 4, DROP));
        p.push(Op::Stmt(LD_W_ABS, 8));
        p.push(Op::Jeq(n0, 6, DROP));
        p.push(Op::Stmt(LD_W_ABS, 12));
        p.push(Op::Jeq(n1, ACCEPT, DROP));
    } else {
        let other = if frag.is_some() { FRAG } else { DROP };
        p.push(Op::Stmt(LDX_MSH_B, 0));
        p.push(Op::Stmt(LD_B_IND, 0));
        p.push(Op::Jeq(u32::from(ECHO_REPLY4), 3, other));
        p.push(Op::Stmt(LD_H_IND, 4));
        p.push(Op::Jeq(u32::from(id), 5, DROP));
        p.push(Op::Stmt(LD_W_IND, 8));
        p.push(Op::Jeq(n0, 7, DROP));
        p.push(Op::Stmt(LD_W_IND, 12));
        p.push(Op::Jeq(n1, ACCEPT, DROP));
    }
    let frag_at = p.len();
    if let (false, Some((vtep, port))) = (v6, frag) {
        // The message's type is still in A. The quoted datagram
        // follows the 8-byte ICMP header: its protocol at 9, its
        // source at 12, and (a 20-byte header, as the node sends)
        // its UDP destination port at 22.
        let at = |i: usize| frag_at + i;
        p.push(Op::Jeq(u32::from(UNREACHABLE4), at(1), DROP));
        p.push(Op::Stmt(LD_B_IND, 1));
        p.push(Op::Jeq(u32::from(FRAG_NEEDED4), at(3), DROP));
        p.push(Op::Stmt(LD_B_IND, 8 + 9));
        p.push(Op::Jeq(libc::IPPROTO_UDP as u32, at(5), DROP));
        p.push(Op::Stmt(LD_W_IND, 8 + 12));
        p.push(Op::Jeq(u32::from(vtep), at(7), DROP));
        p.push(Op::Stmt(LD_H_IND, 8 + 20 + 2));
        p.push(Op::Jeq(u32::from(port), ACCEPT, DROP));
    }
    let (accept, drop) = (p.len(), p.len() + 1);
    p.push(Op::Stmt(RET_K, 0xffff));
    p.push(Op::Stmt(RET_K, 0));
    let target = |t: usize| match t {
        ACCEPT => accept,
        DROP => drop,
        FRAG => frag_at,
        t => t,
    };
    p.iter()
        .enumerate()
        .map(|(i, op)| match *op {
            Op::Stmt(code, k) => sock_filter {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            Op::Jeq(k, t, f) => sock_filter {
                code: JEQ_K,
                jt: (target(t) - i - 1) as u8,
                jf: (target(f) - i - 1) as u8,
                k,
            },
        })
        .collect()
}
