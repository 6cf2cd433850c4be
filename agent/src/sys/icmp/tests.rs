//! The tests of `icmp`.

use std::os::fd::{FromRawFd as _, OwnedFd};

use super::socket::sockaddr;
use super::*;

#[test]
fn echo_requests_of_either_family() {
    let nonce = [1, 2, 3, 4, 5, 6, 7, 8];
    // IPv4: id 1, seq 1, the nonce, its checksum filled.
    let r = request(false, 1, 1, 8, &nonce);
    assert_eq!(r.len(), MIN_ECHO);
    assert_eq!(&r[4..], &[0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(crate::checksum::internet(&r), 0, "a valid checksum");
    // IPv6: the kernel fills the checksum (it covers a pseudo-header).
    assert_eq!(&request(true, 1, 1, 8, &nonce)[..4], &[128, 0, 0, 0]);
}

fn echo_reply(v6: bool, id: u16, seq: u16, nonce: &[u8; NONCE]) -> Vec<u8> {
    let mut m = Vec::new();
    if !v6 {
        m.push(0x45u8);
        m.extend([0; 19]);
    }
    m.extend([if v6 { ECHO_REPLY6 } else { ECHO_REPLY4 }, 0, 0, 0]);
    m.extend(id.to_be_bytes());
    m.extend(seq.to_be_bytes());
    m.extend(nonce);
    m
}

#[test]
fn answers_are_matched_to_the_probe_by_id_seq_nonce_and_source() {
    let n = [9u8; NONCE];
    let to6: IpAddr = "fd00::1".parse().unwrap();
    let reply6 = echo_reply(true, 7, 9, &n);
    assert!(matches!(answer(to6, &reply6, to6, 7, 9, &n), Answer::Reply));
    assert!(matches!(
        answer(to6, &reply6, to6, 7, 10, &n),
        Answer::Other
    ));
    assert!(matches!(
        answer(to6, &reply6, to6, 7, 9, &[8; NONCE]),
        Answer::Other
    ));
    let other: IpAddr = "fd00::2".parse().unwrap();
    assert!(matches!(
        answer(to6, &reply6, other, 7, 9, &n),
        Answer::Other
    ));
    assert!(matches!(
        answer(to6, &[TOO_BIG6, 0, 0, 0, 0, 0, 5, 0xdc], other, 7, 9, &n),
        Answer::TooBig
    ));
    // IPv4: the IP header comes first.
    let to4: IpAddr = "10.0.0.1".parse().unwrap();
    let reply4 = echo_reply(false, 7, 9, &n);
    assert!(matches!(answer(to4, &reply4, to4, 7, 9, &n), Answer::Reply));
    // Without the nonce (an echo of 8 bytes, as a forger's).
    assert!(matches!(
        answer(to4, &reply4[..28], to4, 7, 9, &n),
        Answer::Other
    ));
}

#[test]
fn fragmentation_needed_about_a_vxlan_packet_is_read() {
    // The router's header, ICMP 3/4 naming 1400, then our packet's IP
    // header (UDP from 198.18.0.1 to 198.18.1.3) and the first 8 bytes
    // of its UDP.
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
            from: Ipv4Addr::new(198, 18, 0, 1),
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
    let n = [3u8; NONCE];
    let reply4 = echo_reply(false, 7, 9, &n);
    assert_eq!(reply_of(false, &reply4, 7, &n), Some((9, 16)));
    assert_eq!(reply_of(false, &reply4, 8, &n), None);
    assert_eq!(reply_of(false, &reply4, 7, &[4; NONCE]), None);
    assert_eq!(
        reply_of(true, &echo_reply(true, 7, 258, &n), 7, &n),
        Some((258, 16))
    );
    let mut request6 = echo_reply(true, 7, 258, &n);
    request6[0] = ECHO_REQUEST6;
    assert_eq!(reply_of(true, &request6, 7, &n), None);
    // A real socket: loopback answers, by sequence number, with the
    // request's size.
    let mut p = Pinger::open(false).unwrap();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    p.send(lo, 41, 84).unwrap();
    let got = p.recv(Duration::from_secs(2)).unwrap();
    assert_eq!(
        got,
        Some(Echoed {
            from: lo,
            seq: 41,
            size: 84
        })
    );
    // Another pinger's replies (another id and nonce) are not its.
    let mut q = Pinger::open(false).unwrap();
    q.send(lo, 42, 84).unwrap();
    assert_eq!(p.recv(Duration::from_millis(300)).unwrap(), None);
    assert!(q.recv(Duration::from_secs(2)).unwrap().is_some());
}

#[test]
fn a_drain_reads_what_is_queued_and_no_more_than_asked() {
    let mut p = Pinger::open(false).unwrap();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    for seq in 1..=5 {
        p.send(lo, seq, 84).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let first = p.drain(3).unwrap();
    let rest = p.drain(100).unwrap();
    assert_eq!(first.len(), 3, "{first:?}");
    assert_eq!(rest.len(), 2, "{rest:?}");
    assert!(p.drain(100).unwrap().is_empty(), "nothing waits");
}

/// Sends `icmp` (a message, its checksum filled here) from 127.0.0.9
/// to 127.0.0.1 through a raw IP socket.
fn send_raw(icmp: &[u8]) {
    let mut m = icmp.to_vec();
    m[2..4].copy_from_slice(&[0, 0]);
    let c = crate::checksum::internet(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut pkt = vec![
        0x45u8, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 127, 0, 0, 9, 127, 0, 0, 1,
    ];
    let len = (pkt.len() + m.len()) as u16;
    pkt[2..4].copy_from_slice(&len.to_be_bytes());
    pkt.extend(m);
    // SAFETY: socket(2) with constant arguments; checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    assert!(fd >= 0, "a raw socket");
    // SAFETY: the descriptor is new and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (addr, alen) = sockaddr("127.0.0.1".parse().unwrap());
    // SAFETY: a valid packet buffer and address of its length.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_storage).cast(),
            alen,
        )
    };
    assert_eq!(n, pkt.len() as isize);
}

#[test]
fn the_kernel_drops_what_is_not_an_answer_to_a_pingers_probes() {
    let lo4 = Ipv4Addr::new(127, 0, 0, 1);
    let mut p = Pinger::open_path_probe(0, lo4, 8472).unwrap();
    // A forged echo reply: the right id, no nonce; another id with
    // the nonce; then the real thing.
    let mut forged = vec![ECHO_REPLY4, 0, 0, 0];
    forged.extend(p.id.to_be_bytes());
    forged.extend([0, 1]);
    forged.extend([0u8; NONCE]);
    send_raw(&forged);
    let mut other_id = vec![ECHO_REPLY4, 0, 0, 0];
    other_id.extend(p.id.wrapping_add(1).to_be_bytes());
    other_id.extend([0, 1]);
    other_id.extend(p.nonce);
    send_raw(&other_id);
    // "Fragmentation needed" quoting UDP from another address, and to
    // another port, and then one from our VTEP to our port.
    let frag = |src: [u8; 4], dport: u16| {
        let mut m = vec![UNREACHABLE4, FRAG_NEEDED4, 0, 0, 0, 0, 0x05, 0x00];
        m.extend([0x45u8, 0, 0x05, 0xdc, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        m.extend(src);
        m.extend([198, 18, 0, 2]);
        m.extend([0x80u8, 0]);
        m.extend(dport.to_be_bytes());
        m.extend([0u8; 4]);
        m
    };
    send_raw(&frag([10, 0, 0, 1], 8472));
    send_raw(&frag([127, 0, 0, 1], 53));
    send_raw(&frag([127, 0, 0, 1], 8472));
    p.send(IpAddr::V4(lo4), 7, 84).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let got = p.drain(100).unwrap();
    assert_eq!(
        got,
        vec![
            Received::FragNeeded {
                from: lo4,
                to: Ipv4Addr::new(198, 18, 0, 2),
                dport: 8472,
                mtu: 1280
            },
            Received::Echo(Echoed {
                from: IpAddr::V4(lo4),
                seq: 7,
                size: 84
            }),
        ]
    );
}

#[test]
fn loopback_answers() {
    // A real raw socket (the tests run as root).
    let rtt = echo("127.0.0.1".parse().unwrap(), 84, Duration::from_secs(2)).unwrap();
    assert!(rtt < Duration::from_secs(2));
    let e = echo("127.0.0.1".parse().unwrap(), 70_000, Duration::from_secs(1));
    assert!(e.is_err(), "a probe larger than any IP packet is refused");
}
