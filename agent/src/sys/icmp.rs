//! One ICMP echo, either family, from a raw socket: what `weft doctor`
//! probes peers with. The probe has the don't-fragment rule set (IPv4: DF;
//! IPv6 never fragments on the way), so a full-size probe that a path
//! cannot carry comes back as "fragmentation needed" / "packet too big" or
//! not at all.

use std::{
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
const ECHO_REQUEST4: u8 = 8;
const ECHO_REPLY4: u8 = 0;
const UNREACHABLE4: u8 = 3;
const FRAG_NEEDED4: u8 = 4;
const ECHO_REQUEST6: u8 = 128;
const ECHO_REPLY6: u8 = 129;
const TOO_BIG6: u8 = 2;
/// `ICMP_FILTER` (linux/icmp.h), at level `SOL_RAW`.
const ICMP_FILTER: libc::c_int = 1;
/// `ICMP6_FILTER` (linux/icmpv6.h), at level `IPPROTO_ICMPV6`.
const ICMP6_FILTER: libc::c_int = 1;

/// Sends one ICMP echo of `size` bytes on the wire (IP header included)
/// to `to` and waits up to `timeout` for its answer; returns the round
/// trip.
pub(crate) fn echo(to: IpAddr, size: usize, timeout: Duration) -> Result<Duration> {
    let sock = Socket::open(to)?;
    let id = (std::process::id() & 0xffff) as u16;
    let seq = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| (d.subsec_nanos() >> 10) as u16);
    let header = if to.is_ipv4() {
        IPV4_HEADER
    } else {
        IPV6_HEADER
    };
    let pkt = request(to.is_ipv6(), id, seq, size.saturating_sub(header).max(8));
    let started = Instant::now();
    sock.send_to(&pkt, to)?;
    let mut buf = vec![0u8; 65536];
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            bail!("no answer within {timeout:?}");
        }
        let Some((n, from)) = sock.recv_from(&mut buf, left)? else {
            bail!("no answer within {timeout:?}");
        };
        match answer(to, &buf[..n], from, id, seq) {
            Answer::Reply => return Ok(started.elapsed()),
            Answer::TooBig => bail!("fragmentation needed on the way"),
            Answer::Other => continue,
        }
    }
}

/// A long-lived echo socket of one family, for probes many and often
/// (peer health): requests carry `id` and a sequence number; only echo
/// replies (and "too big" answers) reach it.
pub(crate) struct Pinger {
    sock: Socket,
    id: u16,
    buf: Vec<u8>,
}

/// One answer a [`Pinger`] received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Echoed {
    pub from: IpAddr,
    pub seq: u16,
}

impl Pinger {
    pub(crate) fn open(v6: bool, id: u16) -> Result<Self> {
        let any = if v6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let sock = Socket::open(any)?;
        sock.only_replies()?;
        Ok(Self {
            sock,
            id,
            buf: vec![0u8; 2048],
        })
    }

    /// An IPv4 echo socket for path MTU probes: its packets carry `mark`
    /// (the programs set don't-fragment on their outer header), and may be
    /// as large as the device allows whatever MTU the route to the peer
    /// says (`IP_PMTUDISC_PROBE`).
    pub(crate) fn open_path_probe(id: u16, mark: u32) -> Result<Self> {
        let p = Self::open(false, id)?;
        p.sock
            .set(libc::SOL_SOCKET, libc::SO_MARK, mark as libc::c_int)
            .context("setting SO_MARK on the path MTU probe socket")?;
        p.sock
            .set(
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_PROBE,
            )
            .context("setting IP_PMTUDISC_PROBE on the path MTU probe socket")?;
        Ok(p)
    }

    /// The socket, to poll.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.sock.fd.as_raw_fd()
    }

    /// Sends one echo request of `size` bytes on the wire (IP header
    /// included) to `to`.
    pub(crate) fn send(&self, to: IpAddr, seq: u16, size: usize) -> Result<()> {
        let header = if self.sock.v6 {
            IPV6_HEADER
        } else {
            IPV4_HEADER
        };
        let pkt = request(
            self.sock.v6,
            self.id,
            seq,
            size.saturating_sub(header).max(8),
        );
        self.sock.send_to(&pkt, to)
    }

    /// The next echo reply of ours, or None when `wait` passes first.
    pub(crate) fn recv(&mut self, wait: Duration) -> Result<Option<Echoed>> {
        let deadline = Instant::now() + wait;
        loop {
            match self.recv_any(deadline.saturating_duration_since(Instant::now()))? {
                Some(Received::Echo(e)) => return Ok(Some(e)),
                Some(Received::FragNeeded { .. }) => {}
                None => return Ok(None),
            }
        }
    }
}
/// What an IPv4 [`Pinger`] received: an echo reply of its own, or a
/// "fragmentation needed" the underlay sent about a UDP packet of this
/// node's (an encapsulated one, if `dport` is the VXLAN port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Received {
    Echo(Echoed),
    FragNeeded {
        /// The packet's destination and UDP destination port.
        to: Ipv4Addr,
        dport: u16,
        /// The next hop's MTU the message names (0: none named).
        mtu: u16,
    },
}

impl Pinger {
    /// The next echo reply of ours or "fragmentation needed" about a UDP
    /// packet (IPv4), or None when `wait` passes first.
    pub(crate) fn recv_any(&mut self, wait: Duration) -> Result<Option<Received>> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let Some((n, from)) = self.sock.recv_from(&mut self.buf, left)? else {
                return Ok(None);
            };
            let msg = &self.buf[..n];
            if let Some(seq) = reply_seq(self.sock.v6, msg, self.id) {
                return Ok(Some(Received::Echo(Echoed { from, seq })));
            }
            if !self.sock.v6
                && let Some(r) = frag_needed_udp(msg)
            {
                return Ok(Some(r));
            }
        }
    }
}

/// A "fragmentation needed" (an IPv4 message, its IP header first) about
/// a UDP packet: the packet's destination, UDP port and the MTU named.
fn frag_needed_udp(msg: &[u8]) -> Option<Received> {
    let ihl = usize::from(msg.first()? & 0x0f) * 4;
    let icmp = msg.get(ihl..)?;
    if ihl < IPV4_HEADER || icmp.len() < 8 || icmp[0] != UNREACHABLE4 || icmp[1] != FRAG_NEEDED4 {
        return None;
    }
    let mtu = u16::from_be_bytes([icmp[6], icmp[7]]);
    let inner = &icmp[8..];
    let inner_ihl = usize::from(inner.first()? & 0x0f) * 4;
    if inner.first()? >> 4 != 4
        || inner_ihl < IPV4_HEADER
        || *inner.get(9)? != libc::IPPROTO_UDP as u8
    {
        return None;
    }
    let to = Ipv4Addr::new(*inner.get(16)?, inner[17], inner[18], inner[19]);
    let udp = inner.get(inner_ihl..inner_ihl + 4)?;
    Some(Received::FragNeeded {
        to,
        dport: u16::from_be_bytes([udp[2], udp[3]]),
        mtu,
    })
}

/// The sequence number of an echo reply carrying `id`.
fn reply_seq(v6: bool, msg: &[u8], id: u16) -> Option<u16> {
    let icmp = if v6 {
        msg
    } else {
        let ihl = usize::from(msg.first()? & 0x0f) * 4;
        if ihl < IPV4_HEADER {
            return None;
        }
        msg.get(ihl..)?
    };
    let want = if v6 { ECHO_REPLY6 } else { ECHO_REPLY4 };
    (icmp.len() >= 8 && icmp[0] == want && icmp[4..6] == id.to_be_bytes())
        .then(|| u16::from_be_bytes([icmp[6], icmp[7]]))
}

/// An echo request's ICMP message (`len` bytes). IPv4's checksum is ours
/// to fill; the kernel fills ICMPv6's (it covers a pseudo-header).
fn request(v6: bool, id: u16, seq: u16, len: usize) -> Vec<u8> {
    let mut pkt = vec![0u8; len];
    pkt[0] = if v6 { ECHO_REQUEST6 } else { ECHO_REQUEST4 };
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    if !v6 {
        let csum = crate::checksum::internet(&pkt);
        pkt[2..4].copy_from_slice(&csum.to_be_bytes());
    }
    pkt
}

enum Answer {
    Reply,
    TooBig,
    Other,
}

/// What a received message says about our probe to `to`. An IPv4 raw
/// socket hands back the IP header too; an IPv6 one, the ICMPv6 message
/// alone.
fn answer(to: IpAddr, msg: &[u8], from: IpAddr, id: u16, seq: u16) -> Answer {
    let icmp = match to {
        IpAddr::V4(_) => {
            let ihl = usize::from(msg.first().copied().unwrap_or(0) & 0x0f) * 4;
            match msg.get(ihl..) {
                Some(m) if ihl >= IPV4_HEADER => m,
                _ => return Answer::Other,
            }
        }
        IpAddr::V6(_) => msg,
    };
    if icmp.len() < 8 {
        return Answer::Other;
    }
    let ours = icmp[4..6] == id.to_be_bytes() && icmp[6..8] == seq.to_be_bytes();
    match (to, icmp[0], icmp[1]) {
        (IpAddr::V4(_), ECHO_REPLY4, _) | (IpAddr::V6(_), ECHO_REPLY6, _) => {
            if ours && from == to {
                Answer::Reply
            } else {
                Answer::Other
            }
        }
        (IpAddr::V4(_), UNREACHABLE4, FRAG_NEEDED4) | (IpAddr::V6(_), TOO_BIG6, _) => {
            Answer::TooBig
        }
        _ => Answer::Other,
    }
}

/// A raw ICMP (or ICMPv6) socket that does not fragment.
struct Socket {
    fd: OwnedFd,
    v6: bool,
}

impl Socket {
    fn open(to: IpAddr) -> Result<Self> {
        let (domain, proto) = match to {
            IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_ICMP),
            IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_ICMPV6),
        };
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("a raw ICMP socket (root needed)");
        }
        // SAFETY: fd is a new, valid descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let s = Self {
            fd,
            v6: to.is_ipv6(),
        };
        if s.v6 {
            s.set(
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
        } else {
            s.set(
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
        }
        Ok(s)
    }

    /// Only echo replies and "too big" answers are queued to the socket
    /// (a raw socket otherwise gets a copy of every ICMP message).
    fn only_replies(&self) -> Result<()> {
        if self.v6 {
            // struct icmp6_filter: a set bit blocks its type.
            let mut data = [u32::MAX; 8];
            for t in [ECHO_REPLY6, TOO_BIG6] {
                data[usize::from(t >> 5)] &= !(1u32 << (t & 31));
            }
            self.set_raw(libc::IPPROTO_ICMPV6, ICMP6_FILTER, &data)
        } else {
            // ICMP_FILTER: a set bit blocks its type.
            let pass = (1u32 << ECHO_REPLY4) | (1u32 << UNREACHABLE4);
            self.set_raw(libc::SOL_RAW, ICMP_FILTER, &!pass)
        }
    }

    fn set(&self, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> Result<()> {
        self.set_raw(level, name, &value)
    }

    fn set_raw<T>(&self, level: libc::c_int, name: libc::c_int, value: &T) -> Result<()> {
        // SAFETY: `value` is valid for reads of size_of::<T>() bytes.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (value as *const T).cast(),
                size_of::<T>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error()).context("setsockopt on the ICMP socket");
        }
        Ok(())
    }

    fn send_to(&self, pkt: &[u8], to: IpAddr) -> Result<()> {
        let (addr, len) = sockaddr(to);
        // SAFETY: pkt is valid for its length; addr is a sockaddr of the
        // family the socket has, valid for `len` bytes.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&addr as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error()).context("sending the probe");
        }
        Ok(())
    }

    /// One message and its source, or None when `wait` passes first.
    fn recv_from(&self, buf: &mut [u8], wait: Duration) -> Result<Option<(usize, IpAddr)>> {
        let tv = libc::timeval {
            tv_sec: wait.as_secs() as _,
            tv_usec: wait.subsec_micros().max(1) as _,
        };
        self.set_raw(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        loop {
            // SAFETY: all zeroes is a valid sockaddr_storage.
            let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: buf is valid for writes of its length; from and len
            // describe a writable sockaddr_storage.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Ok(None),
                    _ => return Err(e).context("receiving on the ICMP socket"),
                }
            }
            return Ok(Some((n as usize, source(&from))));
        }
    }
}

/// `to` as a socket address of its family, and its length.
fn sockaddr(to: IpAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all zeroes is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match to {
        IpAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for,
            // sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        IpAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for,
            // sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address in a received sockaddr (unspecified if of another family).
fn source(ss: &libc::sockaddr_storage) -> IpAddr {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (its family says so).
            let sin: &libc::sockaddr_in = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (its family says so).
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
        }
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_requests_of_either_family() {
        // IPv4: id 1, seq 1, no payload, its checksum filled.
        assert_eq!(request(false, 1, 1, 8), [8, 0, 0xf7, 0xfd, 0, 1, 0, 1]);
        // IPv6: the kernel fills the checksum (it covers a pseudo-header).
        assert_eq!(request(true, 1, 1, 8), [128, 0, 0, 0, 0, 1, 0, 1]);
    }

    #[test]
    fn answers_are_matched_to_the_probe() {
        let to6: IpAddr = "fd00::1".parse().unwrap();
        let reply6 = [ECHO_REPLY6, 0, 0, 0, 0, 7, 0, 9];
        assert!(matches!(answer(to6, &reply6, to6, 7, 9), Answer::Reply));
        assert!(matches!(answer(to6, &reply6, to6, 7, 10), Answer::Other));
        let other: IpAddr = "fd00::2".parse().unwrap();
        assert!(matches!(answer(to6, &reply6, other, 7, 9), Answer::Other));
        assert!(matches!(
            answer(to6, &[TOO_BIG6, 0, 0, 0, 0, 0, 5, 0xdc], other, 7, 9),
            Answer::TooBig
        ));
        // IPv4: the IP header comes first.
        let to4: IpAddr = "10.0.0.1".parse().unwrap();
        let mut reply4 = vec![0x45u8];
        reply4.extend([0; 19]);
        reply4.extend([ECHO_REPLY4, 0, 0, 0, 0, 7, 0, 9]);
        assert!(matches!(answer(to4, &reply4, to4, 7, 9), Answer::Reply));
        assert!(matches!(
            answer(to4, &reply4[..24], to4, 7, 9),
            Answer::Other
        ));
    }

    #[test]
    fn fragmentation_needed_about_a_vxlan_packet_is_read() {
        // The router's header, ICMP 3/4 naming 1400, then our packet's IP
        // header (UDP to 198.18.1.3) and the first 8 bytes of its UDP.
        let mut m = vec![0x45u8];
        m.extend([0; 19]);
        m.extend([UNREACHABLE4, FRAG_NEEDED4, 0, 0, 0, 0, 0x05, 0x78]);
        let mut inner = vec![0x45u8, 0, 0x05, 0xdc, 0, 0, 0x40, 0, 64, 17, 0, 0];
        inner.extend([198, 18, 0, 1, 198, 18, 1, 3]);
        inner.extend([0x80, 0x00, 0x21, 0x18, 0x05, 0xc8, 0, 0]);
        m.extend(&inner);
        assert_eq!(
            frag_needed_udp(&m),
            Some(Received::FragNeeded {
                to: Ipv4Addr::new(198, 18, 1, 3),
                dport: 8472,
                mtu: 1400
            })
        );
        // Truncated, or about TCP: nothing.
        assert_eq!(frag_needed_udp(&m[..m.len() - 6]), None);
        let mut tcp = m.clone();
        tcp[28 + 9] = 6;
        assert_eq!(frag_needed_udp(&tcp), None);
    }

    #[test]
    fn a_pinger_sees_its_own_replies_only() {
        let mut reply4 = vec![0x45u8];
        reply4.extend([0; 19]);
        reply4.extend([ECHO_REPLY4, 0, 0, 0, 0, 7, 0, 9]);
        assert_eq!(reply_seq(false, &reply4, 7), Some(9));
        assert_eq!(reply_seq(false, &reply4, 8), None);
        assert_eq!(
            reply_seq(true, &[ECHO_REPLY6, 0, 0, 0, 0, 7, 1, 2], 7),
            Some(258)
        );
        assert_eq!(
            reply_seq(true, &[ECHO_REQUEST6, 0, 0, 0, 0, 7, 1, 2], 7),
            None
        );
        // A real socket: loopback answers, by sequence number.
        let mut p = Pinger::open(false, 0x5eed).unwrap();
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        p.send(lo, 41, 84).unwrap();
        let got = p.recv(Duration::from_secs(2)).unwrap();
        assert_eq!(got, Some(Echoed { from: lo, seq: 41 }));
    }

    #[test]
    fn loopback_answers() {
        // A real raw socket (the tests run as root).
        let rtt = echo("127.0.0.1".parse().unwrap(), 84, Duration::from_secs(2)).unwrap();
        assert!(rtt < Duration::from_secs(2));
        let e = echo("127.0.0.1".parse().unwrap(), 70_000, Duration::from_secs(1));
        assert!(e.is_err(), "a probe larger than any IP packet is refused");
    }
}
