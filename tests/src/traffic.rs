//! Traffic for tests: a checksummed TCP stream and counted UDP datagrams,
//! between addresses inside test namespaces.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
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
    server: Ipv4Addr,
    port: u16,
    cns: &Netns,
    bytes: usize,
) -> (usize, bool) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = sns.spawn_thread(move || {
        let l = TcpListener::bind((server, port)).expect("bind");
        ready_tx.send(()).unwrap();
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
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
    server: Ipv4Addr,
    port: u16,
    cns: &Netns,
    count: usize,
    size: usize,
) -> usize {
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = sns.spawn_thread(move || {
        let s = UdpSocket::bind((server, port)).expect("bind");
        s.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
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
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        for i in 0..count {
            s.send_to(&vec![i as u8; size], (server, port)).unwrap();
            if i % 50 == 49 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    })
    .join()
    .unwrap();
    srv.join().unwrap()
}
