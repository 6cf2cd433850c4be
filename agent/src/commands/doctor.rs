//! `weft doctor`: checks this node and says what to fix.
//!
//! Each check prints `ok`, `warn` or `FAIL`, what it saw, and for anything
//! short of ok the fix. The exit status is non-zero when a check failed.
//! Checks that need the agent's pins say so when it is not running.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cli::NodeArgs,
    dataplane::{
        Hook, Netlink, PeerMaps, PinDir, device_name, gro, is_bpffs, pinned_links, pinned_program,
        read_iface_sysctl, read_sysctl, tx_checksum,
    },
    lease::{self, EtcdStore, LeaseAttrs, Store as _},
    report,
};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Finding {
    level: Level,
    check: String,
}

#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn ok(&mut self, check: &str, saw: impl Into<String>) {
        self.push(Level::Ok, check, saw.into(), None);
    }
    fn warn(&mut self, check: &str, saw: impl Into<String>, fix: impl Into<String>) {
        self.push(Level::Warn, check, saw.into(), Some(fix.into()));
    }
    fn fail(&mut self, check: &str, saw: impl Into<String>, fix: impl Into<String>) {
        self.push(Level::Fail, check, saw.into(), Some(fix.into()));
    }
    fn push(&mut self, level: Level, check: &str, saw: String, fix: Option<String>) {
        let tag = match level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        println!("{tag}  {check:<10} {saw}");
        if let Some(f) = &fix {
            println!("      {:<10} fix: {f}", "");
        }
        self.0.push(Finding {
            level,
            check: check.into(),
        });
    }
}

/// Where the CNI network configs are, and the node's files.
pub(crate) struct DoctorArgs<'a> {
    pub(crate) node: &'a NodeArgs,
    pub(crate) cni_conf_dir: &'a Path,
    pub(crate) probe_timeout: Duration,
}

pub(crate) async fn doctor(a: DoctorArgs<'_>) -> Result<()> {
    let mut f = Findings::default();
    kernel(&mut f);
    bpffs(&mut f, &a.node.pins.bpffs_dir);
    let dir = PinDir::new(&a.node.pins.bpffs_dir);
    let agent = report::read(&a.node.state.state_dir);
    match PeerMaps::open(&dir).and_then(|m| Ok((m.config()?, m))) {
        Err(e) => f.fail(
            "datapath",
            format!(
                "no pinned maps under {}: {e:#}",
                a.node.pins.bpffs_dir.display()
            ),
            "start the agent (weft agent), or give its --bpffs-dir",
        ),
        Ok((cfg, maps)) => {
            let nl = Netlink::new()?;
            let uplink = nl.link_by_index(cfg.uplink_ifindex).await?;
            let Some(uplink) = uplink else {
                f.fail(
                    "uplink",
                    format!("ifindex {} is gone", cfg.uplink_ifindex),
                    "restart the agent: it chooses the uplink at start",
                );
                return finish(f);
            };
            programs(&mut f, &nl, &dir, &uplink.name, cfg.vni, agent.as_ref()).await?;
            rp_filter(&mut f, &uplink.name);
            let xdp = agent
                .as_ref()
                .and_then(|r| r.decap.as_ref())
                .is_some_and(|d| d.hook.contains("xdp"));
            offloads(&mut f, &uplink.name, xdp);
            let overlay = nl.link(&device_name(cfg.vni)).await?;
            let overlay_mtu = overlay.as_ref().map(|l| l.mtu);
            mtu(&mut f, uplink.mtu, overlay_mtu, &a.node.subnet_file);
            subnet_and_lease(&mut f, &a, Ipv4Addr::from(cfg.local_addr_be.to_ne_bytes())).await;
            let peers: Vec<_> = maps.peers()?.into_values().collect();
            probes(
                &mut f,
                &peers,
                overlay_mtu.unwrap_or(1450),
                cfg.port,
                a.probe_timeout,
            );
        }
    }
    cni(&mut f, a.cni_conf_dir);
    finish(f)
}

fn finish(f: Findings) -> Result<()> {
    let failed = f.0.iter().filter(|x| x.level == Level::Fail).count();
    let warned = f.0.iter().filter(|x| x.level == Level::Warn).count();
    println!();
    if failed > 0 {
        let names: Vec<&str> =
            f.0.iter()
                .filter(|x| x.level == Level::Fail)
                .map(|x| x.check.as_str())
                .collect();
        bail!(
            "{failed} check(s) failed ({}), {warned} warning(s)",
            names.join(", ")
        );
    }
    println!("all checks passed, {warned} warning(s)");
    Ok(())
}

fn kernel(f: &mut Findings) {
    // SAFETY: uname fills the struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a utsname.
    let release = if unsafe { libc::uname(&mut u) } == 0 {
        // SAFETY: uname NUL-terminates release.
        unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        "unknown".into()
    };
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    if (major, minor) < (6, 6) {
        f.fail(
            "kernel",
            format!("Linux {release}: Weft needs 6.6 or later (TCX links)"),
            "upgrade the kernel",
        );
    } else if !btf {
        f.fail(
            "kernel",
            format!("Linux {release} without BTF (/sys/kernel/btf/vmlinux)"),
            "a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        );
    } else {
        f.ok("kernel", format!("Linux {release} with BTF"));
    }
}

fn bpffs(f: &mut Findings, pins: &Path) {
    // The pin directory, or the nearest existing parent.
    let mut at = pins.to_path_buf();
    while !at.exists() {
        if !at.pop() {
            break;
        }
    }
    match is_bpffs(&at) {
        Ok(true) => {}
        _ => {
            f.fail(
                "bpffs",
                format!("{} is not on a bpffs", at.display()),
                format!("mount -t bpf bpf {} (setup does)", at.display()),
            );
            return;
        }
    }
    match mount_of(&at) {
        Some((point, Propagation::Private)) => f.fail(
            "bpffs",
            format!("the bpffs at {point} is a private mount: pins made here (in a container) do not reach the host's bpffs, and a restarted agent cannot adopt its programs"),
            format!("mount --make-shared {point} on the host (in Kubernetes: the host's /sys/fs/bpf with mountPropagation: Bidirectional)"),
        ),
        Some((point, p)) => f.ok(
            "bpffs",
            format!("{} on bpffs {point} ({})", pins.display(), match p {
                Propagation::Shared => "shared",
                _ => "a slave of a shared mount",
            }),
        ),
        None => f.warn(
            "bpffs",
            format!("{} is on bpffs; its mount is not in /proc/self/mountinfo", pins.display()),
            "check the mount by hand",
        ),
    }
}

#[derive(Clone, Copy)]
enum Propagation {
    Shared,
    Slave,
    Private,
}

/// The mount point holding `path` and its propagation.
fn mount_of(path: &Path) -> Option<(String, Propagation)> {
    let path = std::fs::canonicalize(path).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = f.get(4)?.to_string();
            let sep = f.iter().position(|x| *x == "-")?;
            let opts = &f[6..sep];
            let p = if opts.iter().any(|o| o.starts_with("shared:")) {
                Propagation::Shared
            } else if opts.iter().any(|o| o.starts_with("master:")) {
                Propagation::Slave
            } else {
                Propagation::Private
            };
            path.starts_with(&point).then_some((point, p))
        })
        // The deepest mount (the last of equal depth wins: mounted later).
        .fold(None, |best: Option<(String, Propagation)>, m| match &best {
            Some(b) if b.0.len() > m.0.len() => best,
            _ => Some(m),
        })
}

async fn programs(
    f: &mut Findings,
    nl: &Netlink,
    dir: &PinDir,
    uplink: &str,
    vni: u32,
    agent: Option<&report::Report>,
) -> Result<()> {
    let overlay = device_name(vni);
    let mut decap = None;
    let mut encap = false;
    for (hook, iface, ifindex) in pinned_links(dir)? {
        let program = pinned_program(dir, hook, &iface, ifindex).unwrap_or_default();
        let present = nl.link(&iface).await?.is_some_and(|l| l.index == ifindex);
        if !present {
            continue;
        }
        if iface == uplink && program.contains("decap") {
            let attached = match hook {
                Hook::Xdp => nl.link(&iface).await?.and_then(|l| l.xdp).is_some(),
                _ => true,
            };
            if attached {
                decap = Some(format!("{program} ({})", hook.name()));
            }
        }
        if iface == overlay && program.contains("encap") {
            encap = true;
        }
    }
    match (&decap, encap) {
        (Some(d), true) => f.ok(
            "programs",
            format!("{d} on {uplink}, weft_encap on {overlay}"),
        ),
        _ => f.fail(
            "programs",
            format!(
                "{}{}",
                if decap.is_none() {
                    format!("no decapsulation program on {uplink}; ")
                } else {
                    String::new()
                },
                if encap {
                    String::new()
                } else {
                    format!("no encapsulation program on {overlay}")
                }
            ),
            "the agent re-attaches them within seconds: is it running? (its log says why not)",
        ),
    }
    match agent.and_then(|r| r.decap.as_ref()) {
        Some(d) => f.ok("hook", format!("{} on {uplink}: {}", d.hook, d.why)),
        None => f.warn(
            "hook",
            "no status report from the agent",
            "start the agent, or give its --state-dir",
        ),
    }
    Ok(())
}

fn rp_filter(f: &mut Findings, uplink: &str) {
    let all = read_sysctl("net.ipv4.conf.all.rp_filter").unwrap_or_default();
    let dev = read_iface_sysctl("ipv4", uplink, "rp_filter").unwrap_or_default();
    // The kernel uses the larger of the two.
    let effective = all.clone().max(dev.clone());
    if effective == "1" {
        f.fail(
            "rp_filter",
            format!("strict on {uplink} (all={all}, {uplink}={dev}): decapsulated packets from other nodes' pods are dropped"),
            format!("sysctl -w net.ipv4.conf.{uplink}.rp_filter=2 net.ipv4.conf.all.rp_filter=2 (the agent sets the first)"),
        );
    } else {
        f.ok("rp_filter", format!("{uplink}: {dev}, all: {all}"));
    }
}

fn offloads(f: &mut Findings, uplink: &str, xdp: bool) {
    let driver = std::fs::read_link(format!("/sys/class/net/{uplink}/device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "virtual".into());
    let on_off = |b: Option<bool>| match b {
        Some(true) => "on",
        Some(false) => "off",
        None => "unknown",
    };
    let gro = gro(uplink).ok();
    let csum = tx_checksum(uplink).ok();
    if xdp && gro == Some(false) {
        f.warn(
            "offloads",
            format!("GRO is off on {uplink}, where XDP decapsulates: decapsulated TCP is not merged, throughput suffers"),
            format!("ethtool -K {uplink} gro on (the agent turns it on at start)"),
        );
    } else if driver == "vmxnet3" && csum == Some(true) {
        f.warn(
            "offloads",
            format!("{uplink} uses vmxnet3 with transmit checksum offload: some versions corrupt VXLAN checksums on UDP 8472 (flannel #1279)"),
            format!("ethtool -K {uplink} tx-checksum-ip-generic off, if pods across nodes see TCP stalls"),
        );
    } else {
        f.ok(
            "offloads",
            format!(
                "{uplink} ({driver}): GRO {}, transmit checksum offload {}",
                on_off(gro),
                on_off(csum)
            ),
        );
    }
}

fn mtu(f: &mut Findings, uplink_mtu: u32, overlay: Option<u32>, subnet_file: &Path) {
    let Some(overlay) = overlay else {
        f.fail(
            "mtu",
            "the overlay device is missing",
            "the agent re-creates it: is it running?",
        );
        return;
    };
    let env_mtu: Option<u32> = std::fs::read_to_string(subnet_file).ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("FLANNEL_MTU="))
            .and_then(|v| v.trim().parse().ok())
    });
    if overlay + 50 > uplink_mtu {
        f.fail(
            "mtu",
            format!("overlay MTU {overlay} + 50 bytes of VXLAN exceeds the uplink's {uplink_mtu}: large packets are dropped"),
            format!("set Backend.MTU to the underlay's MTU (or unset it), or ip link set dev weft.<VNI> mtu {}", uplink_mtu.saturating_sub(50)),
        );
    } else if env_mtu.is_some_and(|m| m != overlay) {
        f.fail(
            "mtu",
            format!("subnet.env says FLANNEL_MTU={} but the overlay MTU is {overlay}: new pods get the wrong MTU", env_mtu.unwrap_or_default()),
            "restart the agent (it rewrites subnet.env)",
        );
    } else {
        f.ok(
            "mtu",
            format!(
                "overlay {overlay}, uplink {uplink_mtu}, subnet.env {}",
                env_mtu.map_or("-".into(), |m| m.to_string())
            ),
        );
    }
}

async fn subnet_and_lease(f: &mut Findings, a: &DoctorArgs<'_>, public_ip: Ipv4Addr) {
    let subnet = match lease::read_subnet(&a.node.subnet_file) {
        Ok(Some(s)) => s,
        Ok(None) => {
            f.fail(
                "subnet",
                format!("no {}", a.node.subnet_file.display()),
                "the agent writes it once it holds a lease and its datapath is up",
            );
            return;
        }
        Err(e) => {
            f.fail(
                "subnet",
                format!("{e:#}"),
                "restart the agent (it rewrites the file)",
            );
            return;
        }
    };
    let key = format!("{}/subnets/{}", a.node.etcd.prefix(), subnet.key());
    let mut o = a.node.etcd.options();
    o.request_timeout = Duration::from_secs(2);
    let got = tokio::time::timeout(Duration::from_secs(4), async {
        let store = EtcdStore::connect(&o).await?;
        anyhow::Ok(store.get(&key).await?)
    })
    .await;
    match got {
        Err(_) | Ok(Err(_)) => f.warn(
            "subnet",
            format!("{subnet} (subnet.env); etcd did not answer, the lease is not checked"),
            "check --etcd-endpoints and the TLS flags (weft leases shows what etcd holds)",
        ),
        Ok(Ok(None)) => f.fail(
            "subnet",
            format!("subnet.env names {subnet}, but etcd has no lease {key}"),
            "the agent re-acquires a lease when it loses one: check its log; a stale subnet.env is rewritten",
        ),
        Ok(Ok(Some(kv))) => match LeaseAttrs::parse(&kv.value) {
            Ok(l) if l.public_ip == public_ip => {
                f.ok("subnet", format!("{subnet}: subnet.env and the lease in etcd agree ({public_ip})"))
            }
            Ok(l) => f.fail(
                "subnet",
                format!("subnet.env names {subnet}, whose lease belongs to {} (this node is {public_ip})", l.public_ip),
                "restart the agent: it acquires a subnet of its own and rewrites subnet.env",
            ),
            Err(e) => f.fail("subnet", format!("the lease {key} is malformed: {e}"), "delete the key; the agent writes a new one"),
        },
    }
}

/// An ICMP echo through the overlay to each peer's overlay address (its
/// subnet's first address, held by its VXLAN device): answered only if
/// VXLAN on UDP `port` passes both ways. Full-size and with DF, so a path
/// that cannot carry the overlay MTU shows too.
fn probes(
    f: &mut Findings,
    peers: &[crate::dataplane::Peer],
    overlay_mtu: u32,
    port: u16,
    timeout: Duration,
) {
    if peers.is_empty() {
        f.ok("peers", "no peers yet");
        return;
    }
    let v6 = peers.iter().filter(|p| p.subnet.addr().is_ipv6()).count();
    if v6 > 0 {
        f.ok(
            "peers",
            format!("{v6} IPv6 peers (probed through their IPv4 VTEPs only)"),
        );
    }
    for p in peers {
        let std::net::IpAddr::V4(to) = p.subnet.network() else {
            continue;
        };
        let name = format!("peer {}", p.subnet);
        let big = echo(to, overlay_mtu as usize, timeout);
        match big {
            Ok(rtt) => f.ok(
                "peers",
                format!("{name} via {}: a {overlay_mtu}-byte probe through UDP {port} answered in {:.1} ms", p.vtep, rtt.as_secs_f64() * 1e3),
            ),
            Err(e) => match echo(to, 84, timeout) {
                Ok(_) => f.fail(
                    "peers",
                    format!("{name} via {}: small probes pass, {overlay_mtu}-byte ones do not ({e:#}): the path does not carry the overlay MTU", p.vtep),
                    "set Backend.MTU to the smallest underlay MTU of the cluster",
                ),
                Err(e) => f.fail(
                    "peers",
                    format!("{name} via {}: no answer through UDP {port} ({e:#})", p.vtep),
                    format!("open UDP {port} between this node and {} both ways (firewalls, security groups); check the peer's agent", p.vtep),
                ),
            },
        }
    }
}

/// Sends one ICMP echo of `size` bytes (IP header included) with DF set
/// and waits for its answer.
fn echo(to: Ipv4Addr, size: usize, timeout: Duration) -> Result<Duration> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: a raw ICMP socket, owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMP,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("a raw ICMP socket (root needed)");
    }
    // SAFETY: fd is a new, valid descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let dont_fragment: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: a valid option pointer and length.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&dont_fragment as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let id = (std::process::id() & 0xffff) as u16;
    let seq = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| (d.subsec_nanos() >> 10) as u16);
    let mut pkt = vec![0u8; size.saturating_sub(20).max(8)];
    pkt[0] = 8; // echo request
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    let csum = checksum(&pkt);
    pkt[2..4].copy_from_slice(&csum.to_be_bytes());
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.octets()),
        },
        sin_zero: [0; 8],
    };
    let started = Instant::now();
    // SAFETY: pkt and addr are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error()).context("sending the probe");
    }
    let mut buf = vec![0u8; 65536];
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            bail!("no answer within {timeout:?}");
        }
        let tv = libc::timeval {
            tv_sec: left.as_secs() as _,
            tv_usec: left.subsec_micros() as _,
        };
        // SAFETY: a valid timeval pointer and length.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            bail!("no answer within {timeout:?}");
        }
        let n = n as usize;
        // A raw socket hands back the IP header too.
        let ihl = usize::from(buf[0] & 0x0f) * 4;
        if n < ihl + 8 || buf[12..16] != to.octets() {
            continue;
        }
        let icmp = &buf[ihl..n];
        if icmp[0] == 0 && icmp[4..6] == id.to_be_bytes() && icmp[6..8] == seq.to_be_bytes() {
            return Ok(started.elapsed());
        }
        if icmp[0] == 3 && icmp[1] == 4 {
            bail!("fragmentation needed on the way");
        }
    }
}

fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn cni(f: &mut Findings, dir: &Path) {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(r) => r
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "conflist" || e == "conf" || e == "json")
            })
            .collect(),
        Err(e) => {
            f.fail(
                "cni",
                format!("cannot read {}: {e}", dir.display()),
                "weft install-cni writes the network config there",
            );
            return;
        }
    };
    files.sort();
    let Some(first) = files.first() else {
        f.fail(
            "cni",
            format!("no network config in {}: pods cannot start", dir.display()),
            "weft install-cni (the DaemonSet's init container runs it)",
        );
        return;
    };
    let text = std::fs::read_to_string(first).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let types: Vec<&str> = match v["plugins"].as_array() {
        Some(ps) => ps.iter().filter_map(|p| p["type"].as_str()).collect(),
        None => v["type"].as_str().into_iter().collect(),
    };
    if types.contains(&"weft") {
        f.ok(
            "cni",
            format!(
                "{} ({}) is the runtime's network, with Weft's plugin",
                first.display(),
                types.join(", ")
            ),
        );
    } else {
        f.fail(
            "cni",
            format!("the runtime uses {} (plugins: {}), which does not run Weft's plugin: pods are not registered for host routing", first.display(), if types.is_empty() { "none readable".into() } else { types.join(", ") }),
            "weft install-cni, or add {\"type\": \"weft\"} at the end of that conflist's plugins",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icmp_checksum() {
        // An echo request with id 1, seq 1 and no payload.
        let mut p = vec![8, 0, 0, 0, 0, 1, 0, 1];
        let c = checksum(&p);
        p[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&p), 0);
        assert_eq!(c, 0xf7fd);
    }
}
