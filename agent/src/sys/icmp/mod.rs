//! One ICMP echo, either family, from a raw socket: what `weft doctor`
//! probes peers with. The probe has the don't-fragment rule set (IPv4: DF;
//! IPv6 never fragments on the way), so a full-size probe that a path
//! cannot carry comes back as "fragmentation needed" / "packet too big" or
//! not at all.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

mod filter;
mod socket;
mod wire;

use socket::Socket;
use wire::*;

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

#[cfg(test)]
mod tests;
