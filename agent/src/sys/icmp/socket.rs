//! The raw ICMP (or ICMPv6) socket an echo goes out on and comes back to.

use std::{
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::wire::*;

/// A raw ICMP (or ICMPv6) socket that does not fragment.
pub(super) struct Socket {
    pub(super) fd: OwnedFd,
    pub(super) v6: bool,
}

impl Socket {
    pub(super) fn open(to: IpAddr) -> Result<Self> {
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
    pub(super) fn only_replies(&self) -> Result<()> {
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
    pub(super) fn attach_filter(&self, program: &[libc::sock_filter]) -> Result<()> {
        let prog = libc::sock_fprog {
            len: program.len() as libc::c_ushort,
            filter: program.as_ptr().cast_mut(),
        };
        self.set_raw(libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
            .context("attaching the ICMP socket's filter")
    }

    pub(super) fn set(
        &self,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> Result<()> {
        self.set_raw(level, name, &value)
    }

    pub(super) fn set_raw<T>(
        &self,
        level: libc::c_int,
        name: libc::c_int,
        value: &T,
    ) -> Result<()> {
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

    pub(super) fn send_to(&self, pkt: &[u8], to: IpAddr) -> Result<()> {
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
    pub(super) fn recv_from(
        &self,
        buf: &mut [u8],
        wait: Duration,
    ) -> Result<Option<(usize, IpAddr)>> {
        let tv = libc::timeval {
            tv_sec: wait.as_secs() as _,
            tv_usec: wait.subsec_micros().max(1) as _,
        };
        self.set_raw(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        self.recv_flags(buf, 0)
    }

    /// One message queued now and its source, or None (without waiting).
    pub(super) fn try_recv_from(&self, buf: &mut [u8]) -> Result<Option<(usize, IpAddr)>> {
        self.recv_flags(buf, libc::MSG_DONTWAIT)
    }

    /// One message and its source: its whole length (`MSG_TRUNC`: what
    /// did not fit in `buf` is dropped, but counted).
    pub(super) fn recv_flags(
        &self,
        buf: &mut [u8],
        flags: libc::c_int,
    ) -> Result<Option<(usize, IpAddr)>> {
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

/// `to` as a socket address of its family, and its length.
pub(super) fn sockaddr(to: IpAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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
pub(super) fn source(ss: &libc::sockaddr_storage) -> IpAddr {
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
