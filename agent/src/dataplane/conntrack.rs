//! conntrack as host routing's gate relies on it (`--host-routing auto`;
//! the programs' side is `ct.rs` in the eBPF crate): the timeouts fast-path
//! flows' entries are refreshed to, the kernel tick rate those entries
//! count in, and the marking of fast-path TCP flows as liberal.
//!
//! A TCP flow leaves the host stack only once conntrack stops checking its
//! window (`IP_CT_TCP_FLAG_BE_LIBERAL` in both directions), so a packet of
//! it that returns to the stack later is not INVALID to a conntrack that no
//! longer saw the window move. No kfunc can set those flags; ctnetlink can
//! (as conntrackd does). The programs ask through two ring buffers, which
//! `marker.rs` reads, and the flow stays on the stack until the flags are
//! set: with the agent away, new flows keep the stack, old ones their fast
//! path.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    sync::{OnceLock, atomic::AtomicU64},
    time::{Duration, Instant},
};

use dataplane_common::CtRequest;

use crate::sys::nfnetlink::Attr;
use crate::sys::nfnetlink::NLM_F_ACK;
use crate::sys::nfnetlink::NLM_F_REQUEST;
use crate::sys::nfnetlink::Socket;
use crate::sys::nfnetlink::message;

/// What the programs refresh a fast-path flow's entry to, and when.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Refresh {
    /// TCP (ESTABLISHED), UDP (a stream) and UDP without a reply
    /// timeouts, in milliseconds.
    pub(crate) tcp_ms: u32,
    pub(crate) udp_ms: u32,
    pub(crate) udp_unreplied_ms: u32,
    /// Refresh once fewer jiffies than these are left: half the timeout.
    pub(crate) tcp_jiffies: u32,
    pub(crate) udp_jiffies: u32,
    pub(crate) udp_unreplied_jiffies: u32,
}

impl Refresh {
    /// From this network namespace's conntrack sysctls, as the stack would
    /// set them on each packet it saw (defaults where unreadable).
    pub(crate) fn read() -> Self {
        let secs = |name: &str, default: u64| {
            crate::sys::sysctl::read(&format!("net.netfilter.{name}"))
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(default)
        };
        Self::from_secs(
            secs("nf_conntrack_tcp_timeout_established", 432_000),
            secs("nf_conntrack_udp_timeout_stream", 120),
            secs("nf_conntrack_udp_timeout", 30),
            hz(),
        )
    }

    fn from_secs(tcp: u64, udp: u64, udp_unreplied: u64, hz: u32) -> Self {
        // The kfunc takes milliseconds in a u32 (49 days).
        let ms = |s: u64| (s.saturating_mul(1000)).min(u32::MAX as u64) as u32;
        let half = |s: u64| (s.saturating_mul(hz as u64) / 2).min(i32::MAX as u64) as u32;
        Self {
            tcp_ms: ms(tcp),
            udp_ms: ms(udp),
            udp_unreplied_ms: ms(udp_unreplied),
            tcp_jiffies: half(tcp),
            udp_jiffies: half(udp),
            udp_unreplied_jiffies: half(udp_unreplied),
        }
    }
}

/// The kernel's tick rate (`CONFIG_HZ`): conntrack's timeouts count in
/// jiffies. From the kernel's config when `/boot` has it, else measured
/// from `/proc/timer_list` over 200 ms (once).
fn hz() -> u32 {
    static HZ: OnceLock<u32> = OnceLock::new();
    *HZ.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let from_config = std::fs::read_to_string(format!("/boot/config-{}", release.trim()))
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("CONFIG_HZ="))
                    .and_then(|v| v.trim().parse().ok())
            });
        let hz = from_config.or_else(measure_hz).unwrap_or(100);
        tracing::debug!(hz, "kernel tick rate");
        hz
    })
}

fn measure_hz() -> Option<u32> {
    let jiffies = || -> Option<u64> {
        let t = std::fs::read_to_string("/proc/timer_list").ok()?;
        t.lines()
            .find_map(|l| l.trim().strip_prefix("jiffies:"))
            .and_then(|v| v.trim().parse().ok())
    };
    let (t0, j0) = (Instant::now(), jiffies()?);
    std::thread::sleep(Duration::from_millis(200));
    let (j1, dt) = (jiffies()?, t0.elapsed().as_secs_f64());
    let rate = j1.checked_sub(j0)? as f64 / dt;
    // The rates Linux is built with.
    [100u32, 250, 300, 1000].into_iter().min_by(|a, b| {
        (*a as f64 - rate)
            .abs()
            .total_cmp(&(*b as f64 - rate).abs())
    })
}

/// What the marking did, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct LiberalStats {
    /// Flows made liberal.
    pub(crate) marked: AtomicU64,
    /// Flows gone before they could be (ENOENT).
    pub(crate) gone: AtomicU64,
    /// Requests that failed otherwise.
    pub(crate) failed: AtomicU64,
    /// Times a marker thread spent its CPU budget and paused
    /// (`marker.rs`).
    pub(crate) paused: AtomicU64,
}

/// ctnetlink's constants for an update of an entry's TCP flags.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_PROTOINFO: u16 = 4;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;
/// `IP_CT_TCP_FLAG_BE_LIBERAL`.
const TCP_FLAG_BE_LIBERAL: u8 = 0x08;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// `IPCTNL_MSG_CT_GET`.
const IPCTNL_MSG_CT_GET: u16 = 1;

/// Sends ctnetlink one request (a get without a tuple, which it refuses):
/// where conntrack is a module not loaded yet, the kernel loads it to
/// answer (`nfnetlink-subsys-1`, `nf_conntrack_netlink`, which needs
/// `nf_conntrack`), as it would for `conntrack -L`. The answer itself is
/// not needed.
pub(crate) fn poke_ctnetlink() {
    let Ok(sock) = Socket::open() else {
        return;
    };
    let mut buf = Vec::new();
    message(
        &mut buf,
        1,
        (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET,
        NLM_F_REQUEST | NLM_F_ACK,
        AF_INET,
        0,
        &[],
    );
    if sock.send(&buf).is_ok() {
        let _ = sock.acks(1);
    }
}

/// The ctnetlink update that makes `req`'s entry liberal both ways (an
/// update only: without NLM_F_CREATE nothing is created). The tuple may be
/// either direction's: the lookup finds both.
pub(super) fn liberal_update(req: &CtRequest, seq: u32) -> Option<Vec<u8>> {
    let (family, ip) = match req.family {
        4 => {
            let a = |b: &[u8; 16]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            (
                AF_INET,
                vec![
                    Attr::U32(CTA_IP_V4_SRC, a(&req.saddr)),
                    Attr::U32(CTA_IP_V4_DST, a(&req.daddr)),
                ],
            )
        }
        6 => (
            AF_INET6,
            vec![
                Attr::Bytes(CTA_IP_V6_SRC, req.saddr.to_vec()),
                Attr::Bytes(CTA_IP_V6_DST, req.daddr.to_vec()),
            ],
        ),
        _ => return None,
    };
    let flags = || vec![TCP_FLAG_BE_LIBERAL, TCP_FLAG_BE_LIBERAL];
    let attrs = [
        Attr::Nested(
            CTA_TUPLE_ORIG,
            vec![
                Attr::Nested(CTA_TUPLE_IP, ip),
                Attr::Nested(
                    CTA_TUPLE_PROTO,
                    vec![
                        Attr::U8(CTA_PROTO_NUM, req.proto),
                        Attr::U16(CTA_PROTO_SRC_PORT, u16::from_be(req.sport)),
                        Attr::U16(CTA_PROTO_DST_PORT, u16::from_be(req.dport)),
                    ],
                ),
            ],
        ),
        Attr::Nested(
            CTA_PROTOINFO,
            vec![Attr::Nested(
                CTA_PROTOINFO_TCP,
                vec![
                    // struct nf_ct_tcp_flags { flags, mask }
                    Attr::Bytes(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, flags()),
                    Attr::Bytes(CTA_PROTOINFO_TCP_FLAGS_REPLY, flags()),
                ],
            )],
        ),
    ];
    let mut buf = Vec::new();
    message(
        &mut buf,
        seq,
        (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        0,
        &attrs,
    );
    Some(buf)
}

/// A flow's request, readable in logs.
pub(super) fn describe(req: &CtRequest) -> String {
    let port = |p: u16| u16::from_be(p);
    match req.family {
        6 => format!(
            "[{}]:{} -> [{}]:{}",
            Ipv6Addr::from(req.saddr),
            port(req.sport),
            Ipv6Addr::from(req.daddr),
            port(req.dport)
        ),
        _ => format!(
            "{}:{} -> {}:{}",
            Ipv4Addr::new(req.saddr[0], req.saddr[1], req.saddr[2], req.saddr[3]),
            port(req.sport),
            Ipv4Addr::new(req.daddr[0], req.daddr[1], req.daddr[2], req.daddr[3]),
            port(req.dport)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_at_half_the_sysctls_in_jiffies() {
        let r = Refresh::from_secs(432_000, 120, 30, 250);
        assert_eq!(r.tcp_ms, 432_000_000);
        assert_eq!(r.udp_ms, 120_000);
        assert_eq!(r.udp_unreplied_ms, 30_000);
        assert_eq!(r.tcp_jiffies, 432_000 * 250 / 2);
        assert_eq!(r.udp_jiffies, 120 * 250 / 2);
        assert_eq!(r.udp_unreplied_jiffies, 30 * 250 / 2);
        // Past the kfunc's u32 of milliseconds: clamped, not wrapped.
        let r = Refresh::from_secs(10_000_000, 0, 30, 1000);
        assert_eq!(r.tcp_ms, u32::MAX);
        assert_eq!(r.udp_ms, 0);
    }

    #[test]
    fn this_kernels_tick_rate_is_one_linux_builds() {
        assert!([100, 250, 300, 1000].contains(&hz()));
    }

    #[test]
    fn the_update_names_the_flow_and_sets_both_directions_liberal() {
        let mut req = CtRequest {
            family: 4,
            proto: 6,
            sport: 40000u16.to_be(),
            dport: 5201u16.to_be(),
            ..Default::default()
        };
        req.saddr[..4].copy_from_slice(&[10, 244, 1, 2]);
        req.daddr[..4].copy_from_slice(&[10, 244, 2, 3]);
        let m = liberal_update(&req, 7).unwrap();
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x100);
        assert_eq!(m[16], AF_INET);
        let body = &m[20..];
        let w = |b: &[u8]| body.windows(b.len()).any(|x| x == b);
        assert!(w(&[10, 244, 1, 2]) && w(&[10, 244, 2, 3]));
        assert!(w(&40000u16.to_be_bytes()) && w(&5201u16.to_be_bytes()));
        // Both flag attributes: {flags, mask} = {BE_LIBERAL, BE_LIBERAL}.
        assert!(w(&[6, 0, 4, 0, 8, 8]) && w(&[6, 0, 5, 0, 8, 8]));
        req.family = 5;
        assert!(liberal_update(&req, 8).is_none());
    }
}
