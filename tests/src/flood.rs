//! Forged ICMP, sent from a namespace the test made (an underlay host, a
//! pod) at a steady rate until dropped: the packets built once with scapy,
//! then sent round-robin from a raw IP socket (IP_HDRINCL: any source),
//! paced to `rate` a second.

use anyhow::Result;

use crate::netns::{ChildGuard, Netns};

/// What to forge.
#[derive(Clone, Debug)]
pub enum Forged {
    /// Echo replies from `from` to `to` with every id (and a sequence
    /// number counting up): whatever id a prober uses is among them.
    EchoReplies { from: String, to: String },
    /// Echo replies from `from` to `to` with the ids `ids` only, each
    /// with every sequence number.
    EchoIds {
        from: String,
        to: String,
        ids: Vec<u16>,
    },
    /// "Fragmentation needed" naming `mtu`, from `router` to `to`, quoting
    /// a UDP datagram from `quoted_src` to `quoted_dst` port `dport` (one
    /// of `to`'s VXLAN packets, when `quoted_src` is `to`'s VTEP).
    FragNeeded {
        router: String,
        to: String,
        quoted_src: String,
        quoted_dst: String,
        dport: u16,
        mtu: u16,
    },
    /// Port unreachable about random UDP flows of `to`'s, from `router`.
    Unreachable { router: String, to: String },
}

impl Forged {
    /// The Python expression of the packets (IP packets, as bytes).
    fn packets(&self) -> String {
        match self {
            // 65,536 of them: built by hand (scapy takes seconds).
            Forged::EchoReplies { from, to } => {
                format!(
                    "[ipv4('{from}', '{to}', 1, icmp(0, 0, i, i, b'x' * 8)) for i in range(65536)]"
                )
            }
            Forged::EchoIds { from, to, ids } => {
                let ids: Vec<String> = ids.iter().map(u16::to_string).collect();
                format!(
                    "[ipv4('{from}', '{to}', 1, icmp(0, 0, i, s, b'x' * 8)) for s in range(65536) for i in [{}]]",
                    ids.join(", ")
                )
            }
            Forged::FragNeeded {
                router,
                to,
                quoted_src,
                quoted_dst,
                dport,
                mtu,
            } => format!(
                "[bytes(IP(src='{router}', dst='{to}')/ICMP(type=3, code=4, nexthopmtu={mtu})/IP(src='{quoted_src}', dst='{quoted_dst}', len=1500, flags='DF')/UDP(sport=32768 + i, dport={dport}, len=1480)) for i in range(256)]"
            ),
            Forged::Unreachable { router, to } => format!(
                "[bytes(IP(src='{router}', dst='{to}')/ICMP(type=3, code=3)/IP(src='{to}', dst=f'10.{{x % 250}}.{{x // 250}}.1')/UDP(sport=1024 + x, dport=53)) for x in range(4096)]"
            ),
        }
    }
}

/// Starts sending `what` from `ns` at `rate` packets a second; stops when
/// the returned guard drops.
pub fn start(ns: &Netns, what: &Forged, rate: u32) -> Result<ChildGuard> {
    let script = format!(
        r#"
import socket, struct, time
from scapy.all import IP, ICMP, UDP
def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff
def ipv4(src, dst, proto, payload):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, proto, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", csum(h)) + h[12:] + payload
def icmp(t, code, ident, seq, data):
    m = struct.pack("!BBHHH", t, code, 0, ident & 0xffff, seq & 0xffff) + data
    return m[:2] + struct.pack("!H", csum(m)) + m[4:]
pkts = {packets}
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
rate = {rate}
start = time.monotonic()
sent = 0
i = 0
while True:
    due = int((time.monotonic() - start) * rate)
    while sent < due:
        p = pkts[i % len(pkts)]
        i += 1
        try:
            s.sendto(p, (socket.inet_ntoa(p[16:20]), 0))
        except OSError:
            pass
        sent += 1
    time.sleep(0.001)
"#,
        packets = what.packets(),
        rate = rate,
    );
    ns.spawn("/usr/bin/python3", &["-c", &script])
}

/// The CPU time (user and system, in seconds) process `pid` used so far.
pub fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime: the 14th and 15th fields, 12th and 13th after the
    // name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf with a constant name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}
