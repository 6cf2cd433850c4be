//! Traffic for tests: a checksummed TCP stream and counted UDP datagrams,
//! between addresses inside test namespaces.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::mpsc,
    time::Duration,
};

use crate::netns::Netns;

/// A deterministic byte stream (xorshift64*), so both ends know the content.
struct Stream(u64);

impl Stream {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// FNV-1a, byte by byte: independent of how the stream was chunked.
fn digest(mut h: u64, buf: &[u8]) -> u64 {
    for b in buf {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Sends `bytes` over TCP from `client` (in `cns`) to `server:port` (in
/// `sns`); returns (bytes received, digest matches).
pub fn tcp_transfer(
    sns: &Netns,
    server: impl Into<IpAddr>,
    port: u16,
    cns: &Netns,
    bytes: usize,
) -> (usize, bool) {
    let server: IpAddr = server.into();
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = sns.spawn_thread(move || {
        let l = TcpListener::bind((server, port)).expect("bind");
        ready_tx.send(()).unwrap();
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(crate::scaled(Duration::from_secs(30))))
            .unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let (mut n, mut h) = (0usize, 0xcbf2_9ce4_8422_2325u64);
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    h = digest(h, &buf[..k]);
                    n += k;
                }
                Err(e) => panic!("server read: {e}"),
            }
        }
        (n, h)
    });
    ready_rx.recv().unwrap();
    let cli = cns.spawn_thread(move || {
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::from((server, port)), Duration::from_secs(5))
                .expect("connect");
        let mut stream = Stream(0x9e37_79b9_7f4a_7c15);
        let mut sent = 0;
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut buf = vec![0u8; 1 << 16];
        while sent < bytes {
            let k = (bytes - sent).min(buf.len());
            stream.fill(&mut buf[..k]);
            s.write_all(&buf[..k]).expect("write");
            h = digest(h, &buf[..k]);
            sent += k;
        }
        h
    });
    let want = cli.join().unwrap();
    let (n, got) = srv.join().unwrap();
    (n, got == want)
}

/// Sends `count` datagrams of `size` bytes from `cns` to `server:port` in
/// `sns`; returns how many arrived intact.
pub fn udp_transfer(
    sns: &Netns,
    server: impl Into<IpAddr>,
    port: u16,
    cns: &Netns,
    count: usize,
    size: usize,
) -> usize {
    let server: IpAddr = server.into();
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = sns.spawn_thread(move || {
        let s = UdpSocket::bind((server, port)).expect("bind");
        s.set_read_timeout(Some(crate::scaled(Duration::from_millis(1500))))
            .unwrap();
        // Room for every datagram of the burst: what is measured is the
        // datapath, not how fast this thread drains its socket.
        force_rcvbuf(&s, 16 << 20);
        ready_tx.send(()).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut ok = 0;
        while let Ok(k) = s.recv(&mut buf) {
            let i = buf[0] as usize;
            if k == size && buf[..k].iter().all(|b| *b == i as u8) {
                ok += 1;
            }
        }
        ok
    });
    ready_rx.recv().unwrap();
    cns.spawn_thread(move || {
        let any: IpAddr = if server.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let s = UdpSocket::bind((any, 0)).unwrap();
        for i in 0..count {
            s.send_to(&vec![i as u8; size], (server, port)).unwrap();
            if i % 10 == 9 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })
    .join()
    .unwrap();
    srv.join().unwrap()
}

/// Sets a socket's receive buffer past net.core.rmem_max (SO_RCVBUFFORCE;
/// the tests run as root).
fn force_rcvbuf(s: &UdpSocket, bytes: libc::c_int) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: setsockopt with a valid int option on an open socket.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &bytes as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
}

/// Receives one datagram with the TOS byte of its IPv4 header (IP_RECVTOS),
/// or None once the socket's read timeout passes.
pub fn recv_with_tos(s: &UdpSocket) -> Option<(Vec<u8>, u8)> {
    use std::os::fd::AsRawFd as _;
    let fd = s.as_raw_fd();
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with a valid int option on an open socket.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_RECVTOS,
            &on as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(rc, 0, "IP_RECVTOS");
    let mut buf = vec![0u8; 2048];
    let mut cmsg = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cmsg);
    // SAFETY: msg points at a valid buffer and control area that outlive the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    let mut tos = None;
    // SAFETY: walking the control messages the kernel wrote into cmsg,
    // with the libc macros that bound them by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                tos = Some(*libc::CMSG_DATA(c));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Some((buf, tos.unwrap_or(0)))
}

/// What a paced UDP stream ([`udp_stream`]) came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOutcome {
    /// Datagrams sent, and received intact.
    pub sent: u32,
    pub received: u32,
    /// The longest silence at the receiver between two datagrams (or
    /// from the first send to the first), and the last number received
    /// before it.
    pub longest_gap: Duration,
    pub gap_after: Option<u32>,
    /// The numbers sent but never received, as inclusive ranges.
    pub missing: Vec<(u32, u32)>,
}

impl StreamOutcome {
    /// (sent, received), to compare with what should have been.
    pub fn counts(&self) -> (u32, u32) {
        (self.sent, self.received)
    }
}

/// Starts a paced UDP stream from `cns` to `server:port` in `sns`: `count`
/// numbered 100-byte datagrams, `gap` apart. The receiver counts until a
/// second after the sender's last datagram (however long a stall in
/// between), so a loss shows as the datagrams missing, not as an early
/// end; join the handle for the outcome.
pub fn udp_stream(
    sns: &Netns,
    server: impl Into<IpAddr>,
    port: u16,
    cns: &Netns,
    count: u32,
    gap: Duration,
) -> std::thread::JoinHandle<StreamOutcome> {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering::SeqCst},
    };
    let server: IpAddr = server.into();
    let (ready_tx, ready_rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let sender_done = done.clone();
    let srv = sns.spawn_thread(move || {
        let s = UdpSocket::bind((server, port)).expect("bind");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 2048];
        let mut seen = vec![false; count as usize];
        let started = std::time::Instant::now();
        let mut last = started;
        let (mut longest, mut after, mut last_n) = (Duration::ZERO, None, None);
        let mut done_at: Option<std::time::Instant> = None;
        let hard = started + crate::scaled(Duration::from_secs(30)) + gap * count;
        loop {
            let now = std::time::Instant::now();
            if now > hard || done_at.is_some_and(|d| now.duration_since(d) > Duration::from_secs(1))
            {
                break;
            }
            if done_at.is_none() && done.load(SeqCst) {
                done_at = Some(now);
            }
            let Ok(k) = s.recv(&mut buf) else { continue };
            if k != 100 || !buf[4..100].iter().all(|b| *b == 0x5a) {
                continue;
            }
            let n = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let Some(slot) = seen.get_mut(n as usize) else {
                continue;
            };
            *slot = true;
            let now = std::time::Instant::now();
            if now.duration_since(last) > longest {
                longest = now.duration_since(last);
                after = last_n;
            }
            last = now;
            last_n = Some(n);
        }
        let received = seen.iter().filter(|b| **b).count() as u32;
        let mut missing: Vec<(u32, u32)> = Vec::new();
        for (i, got) in seen.iter().enumerate() {
            let i = i as u32;
            if *got {
                continue;
            }
            match missing.last_mut() {
                Some((_, end)) if *end + 1 == i => *end = i,
                _ => missing.push((i, i)),
            }
        }
        (received, longest, after, missing)
    });
    ready_rx.recv().unwrap();
    let cli = cns.spawn_thread(move || {
        let any: IpAddr = if server.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let s = UdpSocket::bind((any, 0)).unwrap();
        let mut sent = 0;
        for i in 0..count {
            let mut d = [0x5au8; 100];
            d[..4].copy_from_slice(&i.to_be_bytes());
            if s.send_to(&d, (server, port)).is_ok() {
                sent += 1;
            }
            std::thread::sleep(gap);
        }
        sender_done.store(true, SeqCst);
        sent
    });
    std::thread::spawn(move || {
        let sent = cli.join().expect("sender");
        let (received, longest_gap, gap_after, missing) = srv.join().expect("receiver");
        StreamOutcome {
            sent,
            received,
            longest_gap,
            gap_after,
            missing,
        }
    })
}

/// Starts `ping` from `from` to `to`: `count` echo requests 10 ms apart,
/// each given 1 s for its reply; read the outcome with [`ping_outcome`].
pub fn ping_run(from: &Netns, to: Ipv4Addr, count: u32) -> std::process::Child {
    from.command("ping")
        .args([
            "-i",
            "0.01",
            "-c",
            &count.to_string(),
            "-W",
            "1",
            "-q",
            &to.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ping starts")
}

/// (transmitted, received) of a finished [`ping_run`].
pub fn ping_outcome(child: std::process::Child) -> (u32, u32) {
    let out = child.wait_with_output().expect("ping finishes");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_default();
    let n: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    (
        n.first().copied().unwrap_or(0),
        n.get(1).copied().unwrap_or(0),
    )
}

/// Sends one UDP datagram from `sender` (a namespace) to `to:port`, where a
/// receiver in `receiver` answers it; returns the source address the
/// receiver saw, once the answer made it back (None if it did not).
pub fn udp_seen_source(
    receiver: &Netns,
    to: Ipv4Addr,
    port: u16,
    sender: &Netns,
) -> Option<Ipv4Addr> {
    match seen_source(receiver, to.into(), port, sender)? {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

/// [`udp_seen_source`] over IPv6.
pub fn udp_seen_source6(
    receiver: &Netns,
    to: Ipv6Addr,
    port: u16,
    sender: &Netns,
) -> Option<Ipv6Addr> {
    match seen_source(receiver, to.into(), port, sender)? {
        IpAddr::V6(a) => Some(a),
        IpAddr::V4(_) => None,
    }
}

fn seen_source(receiver: &Netns, to: IpAddr, port: u16, sender: &Netns) -> Option<IpAddr> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = receiver.spawn_thread(move || {
        let s = UdpSocket::bind((to, port)).expect("bind");
        s.set_read_timeout(Some(crate::scaled(Duration::from_secs(5))))
            .unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 64];
        let (_, from) = s.recv_from(&mut buf).ok()?;
        s.send_to(b"pong", from).ok()?;
        Some(from.ip())
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).ok()?;
    let answered = sender
        .run(move || {
            let any: IpAddr = if to.is_ipv4() {
                Ipv4Addr::UNSPECIFIED.into()
            } else {
                Ipv6Addr::UNSPECIFIED.into()
            };
            let s = UdpSocket::bind((any, 0)).expect("bind");
            s.set_read_timeout(Some(crate::scaled(Duration::from_secs(3))))
                .unwrap();
            s.send_to(b"ping", (to, port)).ok()?;
            let mut buf = [0u8; 16];
            s.recv_from(&mut buf).ok().map(|_| ())
        })
        .ok()
        .flatten();
    let seen = srv.join().ok().flatten();
    answered.and(seen)
}

/// Counts the packets matching the pcap `filter` on `iface` of `ns` while
/// `during` runs (tcpdump, stopped with SIGINT afterwards).
pub fn capture_count(ns: &Netns, iface: &str, filter: &str, during: impl FnOnce()) -> u64 {
    let child = ns
        .command("tcpdump")
        .args(["-ni", iface, "--immediate-mode", "-w", "/dev/null", filter])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tcpdump starts");
    // tcpdump says nothing until it is stopped when writing a file: give it
    // time to open its socket.
    std::thread::sleep(Duration::from_millis(1000));
    during();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill(2) on the pid of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("tcpdump stops");
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .find_map(|l| {
            l.strip_suffix(" packets captured")
                .or_else(|| l.strip_suffix(" packet captured"))
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no packet count from tcpdump: {err}"))
}

/// A UDP listener on `ip:port` in `ns`, bound when this returns: the
/// payloads that arrive (trailing padding dots cut), until 3 s of silence
/// after `sent` is set (however long the sender takes to start).
pub fn udp_payloads(
    ns: &Netns,
    ip: impl Into<IpAddr>,
    port: u16,
    sent: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    let ip: IpAddr = ip.into();
    let (tx, rx) = mpsc::channel();
    let h = ns.spawn_thread(move || {
        let s = UdpSocket::bind((ip, port)).expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = std::time::Instant::now() + crate::scaled(Duration::from_secs(60));
        // Quiet for this long once the sender is done: a packet that takes
        // the host stack may wait a second for neighbour discovery.
        let quiet = crate::scaled(Duration::from_secs(3));
        let (mut last, mut sent_at) = (None, None);
        while std::time::Instant::now() < deadline {
            match s.recv(&mut buf) {
                Ok(n) => {
                    got.push(
                        String::from_utf8_lossy(&buf[..n])
                            .trim_end_matches('.')
                            .to_string(),
                    );
                    last = Some(std::time::Instant::now());
                }
                Err(_) if sent.load(std::sync::atomic::Ordering::SeqCst) => {
                    let done = *sent_at.get_or_insert_with(std::time::Instant::now);
                    let since = last.map_or(done, |l: std::time::Instant| l.max(done));
                    if since.elapsed() >= quiet {
                        break;
                    }
                }
                Err(_) => {}
            }
        }
        got
    });
    rx.recv().unwrap();
    h
}
