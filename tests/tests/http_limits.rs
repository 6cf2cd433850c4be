//! The health server on hostNetwork is open to every pod on the node: a pod
//! holding thousands of slow connections (a byte every 4 s, as slowloris
//! does) neither stops kubelet's probe on loopback from being answered
//! within a second nor grows the agent, and the server closes what it will
//! not serve.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, TcpStream},
    time::{Duration, Instant},
};

use weft_tests::{cgroup::peak_rss, weft_cluster::WeftCluster};

const CONNECTIONS: usize = 5000;

/// Raises the open-file limit of process `pid` (0: this one) to its hard
/// limit; returns it.
fn raise_nofile(pid: i32) -> u64 {
    // SAFETY: rlimit is plain old data; all zeroes is a valid value.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: prlimit on a live pid, reading into a valid rlimit.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: as above, setting a valid rlimit.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    lim.rlim_cur
}

/// GET /healthz on loopback inside `ns`; how long the answer took.
fn probe(ns: &weft_tests::netns::Netns) -> Duration {
    ns.run(|| {
        let t = Instant::now();
        let mut s =
            TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, 9090).into(), Duration::from_secs(5))
                .expect("connect to the health server");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out:?}");
        t.elapsed()
    })
    .unwrap()
}

#[test]
fn slow_connections_from_a_pod_do_not_starve_the_probe() {
    let c = WeftCluster::new(1, &[]).unwrap();
    let n = &c.nodes[0];
    // Both sides may open this many files: what bounds the agent is its
    // own cap, not the kernel's limit.
    let agent_files = raise_nofile(n.agent.pid());
    let our_files = raise_nofile(0);
    assert!(
        agent_files > CONNECTIONS as u64 + 1000 && our_files > CONNECTIONS as u64 + 1000,
        "open-file limits {agent_files} (agent) and {our_files} (the pod's side) leave room for {CONNECTIONS} connections"
    );
    let node_ip = n.node.ip;
    let pod = &n.node.pods[0];
    let before = probe(&n.node.ns);
    println!("probe before: {before:?}");
    let attack = pod.ns.spawn_thread(move || {
        let mut socks = Vec::new();
        for _ in 0..CONNECTIONS {
            match TcpStream::connect_timeout(&(node_ip, 9090).into(), Duration::from_secs(2)) {
                Ok(s) => {
                    s.set_nonblocking(true).unwrap();
                    socks.push(Some(s));
                }
                Err(_) => socks.push(None),
            }
        }
        let opened = socks.iter().filter(|s| s.is_some()).count();
        // A byte every 4 s, for 16 s; count what the server closed.
        let mut closed_at: Vec<Option<Instant>> = vec![None; socks.len()];
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(16) {
            for (i, s) in socks.iter_mut().enumerate() {
                let Some(sock) = s else { continue };
                let mut buf = [0u8; 64];
                let gone = match sock.read(&mut buf) {
                    Ok(_) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        sock.write_all(b"G").is_err()
                    }
                    Err(_) => true,
                };
                if gone && closed_at[i].is_none() {
                    closed_at[i] = Some(Instant::now());
                    *s = None;
                }
            }
            std::thread::sleep(Duration::from_secs(4));
        }
        let closed = closed_at.iter().filter(|c| c.is_some()).count();
        (opened, closed)
    });
    // Kubelet's probe on loopback, every second while the attack runs.
    let mut worst = Duration::ZERO;
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..10 {
        let t = probe(&n.node.ns);
        worst = worst.max(t);
        std::thread::sleep(Duration::from_secs(1));
    }
    let (opened, closed) = attack.join().unwrap();
    let peak = peak_rss(n.agent.pid()).unwrap();
    println!(
        "{opened} slow connections opened, {closed} closed by the server; worst probe {worst:?}; agent peak RSS {} MiB",
        peak >> 20
    );
    assert!(opened >= CONNECTIONS * 9 / 10, "{opened} opened");
    assert!(
        closed >= opened * 99 / 100,
        "the server closed {closed} of {opened} slow connections"
    );
    assert!(worst < Duration::from_secs(1), "a probe took {worst:?}");
    assert!(peak < 100 << 20, "peak RSS {} MiB", peak >> 20);
    assert!(n.agent.running());
}
