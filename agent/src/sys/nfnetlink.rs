//! Netfilter's netlink (nfnetlink): the socket, the messages and their
//! attributes, shared by Weft's nftables batches and its conntrack
//! requests. The socket also reads rtnetlink's route dumps, one datagram
//! at a time (see `Netlink::each_route`).

use std::io;

use anyhow::{Context as _, Result, bail};

const NETLINK_NETFILTER: i32 = 12;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_MULTI: u16 = 0x2;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLA_F_NESTED: u16 = 0x8000;

/// A netlink attribute tree.
pub(crate) enum Attr {
    Str(u16, String),
    U8(u16, u8),
    /// A 16-bit value, in network order.
    U16(u16, u16),
    /// A 32-bit value, in network order.
    U32(u16, u32),
    Bytes(u16, Vec<u8>),
    Nested(u16, Vec<Attr>),
}

impl Attr {
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend([0; 4]);
        let ty = match self {
            Attr::Str(t, s) => {
                out.extend(s.as_bytes());
                out.push(0);
                *t
            }
            Attr::U8(t, v) => {
                out.push(*v);
                *t
            }
            Attr::U16(t, v) => {
                out.extend(v.to_be_bytes());
                *t
            }
            Attr::U32(t, v) => {
                out.extend(v.to_be_bytes());
                *t
            }
            Attr::Bytes(t, b) => {
                out.extend(b);
                *t
            }
            Attr::Nested(t, attrs) => {
                for a in attrs {
                    a.encode(out);
                }
                *t | NLA_F_NESTED
            }
        };
        let len = (out.len() - start) as u16;
        out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        out[start + 2..start + 4].copy_from_slice(&ty.to_ne_bytes());
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }
}

/// Appends one nfnetlink message to `buf`: the netlink header, the
/// nfgenmsg (`family`, version 0, `res_id`), then `attrs`.
pub(crate) fn message(
    buf: &mut Vec<u8>,
    seq: u32,
    ty: u16,
    flags: u16,
    family: u8,
    res_id: u16,
    attrs: &[Attr],
) {
    let start = buf.len();
    buf.extend([0; 16]);
    buf.extend([family, 0]);
    buf.extend(res_id.to_be_bytes());
    for a in attrs {
        a.encode(buf);
    }
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    buf[start + 4..start + 6].copy_from_slice(&ty.to_ne_bytes());
    buf[start + 6..start + 8].copy_from_slice(&flags.to_ne_bytes());
    buf[start + 8..start + 12].copy_from_slice(&seq.to_ne_bytes());
}

/// Top-level attributes of a message body: (type, value).
pub(crate) fn parse_attrs(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & !NLA_F_NESTED;
        if len < 4 || len > b.len() {
            break;
        }
        out.push((ty, &b[4..len]));
        b = b.get(len.div_ceil(4) * 4..).unwrap_or_default();
    }
    out
}

pub(crate) fn is_enoent(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            == Some(libc::ENOENT)
    })
}

/// A netfilter netlink socket.
pub(crate) struct Socket(std::os::fd::OwnedFd);

impl Socket {
    pub(crate) fn open() -> Result<Self> {
        Self::open_protocol(NETLINK_NETFILTER).context("opening a netfilter netlink socket")
    }

    /// A rtnetlink socket (`NETLINK_ROUTE`) whose reads give up after
    /// `timeout`.
    pub(crate) fn open_route(timeout: std::time::Duration) -> Result<Self> {
        use std::os::fd::AsRawFd as _;
        let s = Self::open_protocol(libc::NETLINK_ROUTE).context("opening a rtnetlink socket")?;
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: setting a socket option from a value of its size.
        let r = unsafe {
            libc::setsockopt(
                s.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error()).context("setting SO_RCVTIMEO");
        }
        Ok(s)
    }

    fn open_protocol(protocol: i32) -> io::Result<Self> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: a plain socket(2) call; the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a socket we just opened and nothing else owns.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn send(&self, buf: &[u8]) -> Result<()> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a zeroed sockaddr_nl (the kernel's address) is valid.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sending a valid buffer to a valid address of its size.
        let sent = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// The messages the kernel answers with, up to `stop` returning true.
    fn read(&self, mut each: impl FnMut(u16, u16, &[u8]) -> Result<bool>) -> Result<()> {
        use std::os::fd::AsRawFd as _;
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: receiving into a buffer we own, of its length.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error().into());
            }
            let n = n as usize;
            if n == 0 {
                bail!("netlink closed");
            }
            let mut o = 0;
            while o + 16 <= n {
                let len = u32::from_ne_bytes(buf[o..o + 4].try_into().expect("4 bytes")) as usize;
                let ty = u16::from_ne_bytes(buf[o + 4..o + 6].try_into().expect("2 bytes"));
                let flags = u16::from_ne_bytes(buf[o + 6..o + 8].try_into().expect("2 bytes"));
                if len < 16 || o + len > n {
                    bail!("a malformed netlink message");
                }
                if ty == NLMSG_ERROR {
                    let err = i32::from_ne_bytes(buf[o + 16..o + 20].try_into().expect("4 bytes"));
                    if err != 0 {
                        return Err(io::Error::from_raw_os_error(-err).into());
                    }
                }
                if each(ty, flags, &buf[o..o + len])? {
                    return Ok(());
                }
                o += len.div_ceil(4) * 4;
            }
        }
    }

    pub(crate) fn acks(&self, want: usize) -> Result<()> {
        if want == 0 {
            return Ok(());
        }
        let mut got = 0;
        self.read(|ty, _, _| {
            if ty == NLMSG_ERROR {
                got += 1;
            }
            Ok(got >= want)
        })
    }

    /// Each answer to a dump request as it is read, (type, whole
    /// message), until its end: never more than one datagram held.
    pub(crate) fn dump_each(&self, mut each: impl FnMut(u16, &[u8])) -> Result<()> {
        self.read(|ty, flags, m| {
            match ty {
                NLMSG_DONE | NLMSG_ERROR => return Ok(true),
                _ => each(ty, m),
            }
            Ok(flags & NLM_F_MULTI == 0)
        })
    }

    /// The answers to a get or dump request (until its end).
    pub(crate) fn dump(&self) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.read(|ty, flags, m| {
            match ty {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => return Ok(true),
                _ => out.push(m.to_vec()),
            }
            Ok(flags & NLM_F_MULTI == 0)
        })?;
        Ok(out)
    }
}
