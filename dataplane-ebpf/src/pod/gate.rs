//! conntrack's gate (`--host-routing auto`) for a packet host routing
//! would take: the IP packet's transport header read, and `ct::allows`
//! asked.

use aya_ebpf::programs::TcContext;
use dataplane_common::DataplaneConfig;

use crate::{ct, family::Family, headers::IPPROTO_TCP, packet::read};

/// The conntrack gate, for an IP packet at `at` whose transport header
/// follows its fixed header (anything else takes the stack).
#[inline(always)]
pub(crate) fn allows<F: Family>(
    ctx: &TcContext,
    cfg: &DataplaneConfig,
    data: usize,
    end: usize,
    at: usize,
    ip: &F::Hdr,
) -> bool {
    if !F::plain(ip) {
        return false;
    }
    let proto = F::proto(ip);
    let Some((ports, flags)) = transport(data, end, at + F::HDR_LEN, proto) else {
        return false;
    };
    ct::allows(ctx, cfg, F::flow(ip), proto, ports, flags)
}

/// The ports of the transport header at `l4` and, for TCP, its flags; None
/// when they are out of reach (the stack sees such a packet: it may be a
/// SYN).
#[inline(always)]
fn transport(data: usize, end: usize, l4: usize, proto: u8) -> Option<((u16, u16), u8)> {
    let ports = read::<[u16; 2]>(data, end, l4)?;
    let flags = if proto == IPPROTO_TCP {
        read::<u8>(data, end, l4 + 13)?
    } else {
        0
    };
    Some(((ports[0], ports[1]), flags))
}
