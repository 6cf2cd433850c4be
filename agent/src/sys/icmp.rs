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

/// What every echo request carries after its header: a random nonce of
/// the socket's, which a reply must echo (an id alone is 16 bits anyone
/// can spray; the nonce is 64 no one off the path can guess).
const NONCE: usize = 8;
/// The smallest echo message sent: header and nonce.
const MIN_ECHO: usize = 8 + NONCE;

/// Sends one ICMP echo of `size` bytes on the wire (IP header included)
/// to `to` and waits up to `timeout` for its answer; returns the round
/// trip.
pub(crate) fn echo(to: IpAddr, size: usize, timeout: Duration) -> Result<Duration> {
    let sock = Socket::open(to)?;
    let (id, nonce, seq): (u16, [u8; NONCE], u16) =
        (rand::random(), rand::random(), rand::random());
    let header = if to.is_ipv4() {
        IPV4_HEADER
    } else {
        IPV6_HEADER
    };
    let pkt = request(
        to.is_ipv6(),
        id,
        seq,
        size.saturating_sub(header).max(MIN_ECHO),
        &nonce,
    );
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
        match answer(to, &buf[..n.min(buf.len())], from, id, seq, &nonce) {
            Answer::Reply => return Ok(started.elapsed()),
            Answer::TooBig => bail!("fragmentation needed on the way"),
            Answer::Other => continue,
        }
    }
}

/// A long-lived echo socket of one family, for probes many and often
/// (peer health): requests carry its random id and nonce and a sequence
/// number; only echo replies (and "too big" answers) reach it.
pub(crate) struct Pinger {
    sock: Socket,
    id: u16,
    nonce: [u8; NONCE],
    buf: Vec<u8>,
}

/// One answer a [`Pinger`] received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Echoed {
    pub from: IpAddr,
    pub seq: u16,
    /// Its size on the wire, IP header included (what the request's was,
    /// for a genuine reply).
    pub size: usize,
}

impl Pinger {
    /// An echo socket of one family, with an id and a nonce of its own
    /// (random: another process's probes, or forged replies, are not
    /// taken for its own).
    pub(crate) fn open(v6: bool) -> Result<Self> {
        let any = if v6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let sock = Socket::open(any)?;
        sock.only_replies()?;
        let p = Self {
            sock,
            id: rand::random(),
            nonce: rand::random(),
            buf: vec![0u8; 2048],
        };
        p.sock
            .attach_filter(&filter::ours(v6, p.id, &p.nonce, None))?;
        Ok(p)
    }

    /// An IPv4 echo socket for path MTU probes: its packets carry `mark`
    /// (the programs set don't-fragment on their outer header), and may be
    /// as large as the device allows whatever MTU the route to the peer
    /// says (`IP_PMTUDISC_PROBE`). Besides its echo replies it takes
    /// "fragmentation needed" about UDP from `vtep` to `port` (the node's
    /// VXLAN packets) and nothing else.
    pub(crate) fn open_path_probe(mark: u32, vtep: Ipv4Addr, port: u16) -> Result<Self> {
        let p = Self::open(false)?;
        p.sock
            .attach_filter(&filter::ours(false, p.id, &p.nonce, Some((vtep, port))))?;
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

    /// Waits up to `wait` (at least a millisecond) until one of `pingers`
    /// has something to read: whether one has; None when there are none.
    pub(crate) fn any_readable<'a>(
        pingers: impl Iterator<Item = &'a Pinger>,
        wait: Duration,
    ) -> Option<bool> {
        let mut fds: Vec<libc::pollfd> = pingers
            .map(|p| libc::pollfd {
                fd: p.fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            return None;
        }
        // SAFETY: fds is a valid array of pollfd for its length.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().clamp(1, i32::MAX as u128) as libc::c_int,
            )
        };
        Some(n > 0)
    }

    /// Sends one echo request of `size` bytes on the wire (IP header
    /// included) to `to`.
    pub(crate) fn send(&self, to: IpAddr, seq: u16, size: usize) -> Result<()> {
        let header = self.header();
        let pkt = request(
            self.sock.v6,
            self.id,
            seq,
            size.saturating_sub(header).max(MIN_ECHO),
            &self.nonce,
        );
        self.sock.send_to(&pkt, to)
    }

    fn header(&self) -> usize {
        if self.sock.v6 {
            IPV6_HEADER
        } else {
            IPV4_HEADER
        }
    }

    /// The next echo reply of ours, or None when `wait` passes first.
    #[cfg(test)]
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
        /// The quoted packet's source, destination and UDP destination
        /// port.
        from: Ipv4Addr,
        to: Ipv4Addr,
        dport: u16,
        /// The next hop's MTU the message names (0: none named).
        mtu: u16,
    },
}

impl Pinger {
    /// The next echo reply of ours or "fragmentation needed" about a UDP
    /// packet (IPv4), or None when `wait` passes first (however many
    /// other messages arrive meanwhile).
    #[cfg(test)]
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
            if let Some(r) = self.classify(n, from) {
                return Ok(Some(r));
            }
        }
    }

    /// What is queued on the socket now, without waiting: at most `max`
    /// messages read (a flood of them cannot keep the caller here), the
    /// ones of ours returned.
    pub(crate) fn drain(&mut self, max: usize) -> Result<Vec<Received>> {
        let mut out = Vec::new();
        for _ in 0..max {
            let Some((n, from)) = self.sock.try_recv_from(&mut self.buf)? else {
                break;
            };
            out.extend(self.classify(n, from));
        }
        Ok(out)
    }

    /// A message of `n` bytes from `from` (its first bytes in the buffer:
    /// a jumbo answer is longer), if it is one of ours.
    fn classify(&self, n: usize, from: IpAddr) -> Option<Received> {
        let msg = &self.buf[..n.min(self.buf.len())];
        if let Some((seq, _)) = reply_of(self.sock.v6, msg, self.id, &self.nonce) {
            // The whole message's size, IP header included.
            let size = if self.sock.v6 { n + IPV6_HEADER } else { n };
            return Some(Received::Echo(Echoed { from, seq, size }));
        }
        if !self.sock.v6 {
            return frag_needed_udp(msg);
        }
        None
    }
}

/// A "fragmentation needed" (an IPv4 message, its IP header first) about
/// a UDP packet: the packet's source, destination, UDP port and the MTU
/// named.
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
    let from = Ipv4Addr::new(*inner.get(12)?, inner[13], inner[14], inner[15]);
    let to = Ipv4Addr::new(*inner.get(16)?, inner[17], inner[18], inner[19]);
    let udp = inner.get(inner_ihl..inner_ihl + 4)?;
    Some(Received::FragNeeded {
        from,
        to,
        dport: u16::from_be_bytes([udp[2], udp[3]]),
        mtu,
    })
}

/// The sequence number and ICMP length of an echo reply carrying `id` and
/// echoing `nonce`.
fn reply_of(v6: bool, msg: &[u8], id: u16, nonce: &[u8; NONCE]) -> Option<(u16, usize)> {
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
    (icmp.len() >= MIN_ECHO
        && icmp[0] == want
        && icmp[4..6] == id.to_be_bytes()
        && icmp[8..MIN_ECHO] == nonce[..])
        .then(|| (u16::from_be_bytes([icmp[6], icmp[7]]), icmp.len()))
}

/// An echo request's ICMP message (`len` bytes, at least [`MIN_ECHO`]):
/// `nonce` first in its data. IPv4's checksum is ours to fill; the kernel
/// fills ICMPv6's (it covers a pseudo-header).
fn request(v6: bool, id: u16, seq: u16, len: usize, nonce: &[u8; NONCE]) -> Vec<u8> {
    let mut pkt = vec![0u8; len.max(MIN_ECHO)];
    pkt[0] = if v6 { ECHO_REQUEST6 } else { ECHO_REQUEST4 };
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    pkt[8..MIN_ECHO].copy_from_slice(nonce);
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
fn answer(to: IpAddr, msg: &[u8], from: IpAddr, id: u16, seq: u16, nonce: &[u8; NONCE]) -> Answer {
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
    let ours = icmp.len() >= MIN_ECHO
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
        && icmp[8..MIN_ECHO] == nonce[..];
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

    /// Lets the kernel drop what `program` (classic BPF) refuses before it
    /// is queued: a flood of forged messages never fills the queue in
    /// front of a real answer, nor reaches the agent.
    fn attach_filter(&self, program: &[libc::sock_filter]) -> Result<()> {
        let prog = libc::sock_fprog {
            len: program.len() as libc::c_ushort,
            filter: program.as_ptr().cast_mut(),
        };
        self.set_raw(libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
            .context("attaching the ICMP socket's filter")
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
        self.recv_flags(buf, 0)
    }

    /// One message queued now and its source, or None (without waiting).
    fn try_recv_from(&self, buf: &mut [u8]) -> Result<Option<(usize, IpAddr)>> {
        self.recv_flags(buf, libc::MSG_DONTWAIT)
    }

    /// One message and its source: its whole length (`MSG_TRUNC`: what
    /// did not fit in `buf` is dropped, but counted).
    fn recv_flags(&self, buf: &mut [u8], flags: libc::c_int) -> Result<Option<(usize, IpAddr)>> {
        let flags = flags | libc::MSG_TRUNC;
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
                    flags,
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

/// The socket filters (classic BPF) of the echo sockets: what is not an
/// answer to this socket's own probes is dropped in the kernel.
mod filter {
    use std::net::Ipv4Addr;

    use libc::sock_filter;

    use super::{ECHO_REPLY4, ECHO_REPLY6, FRAG_NEEDED4, NONCE, UNREACHABLE4};

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
#[path = "icmp_tests.rs"]
mod tests;
