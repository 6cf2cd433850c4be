//! Driving the datapath through its library API (static peers), as a node's
//! agent would, inside a node's namespace.

use std::net::Ipv4Addr;

use anyhow::Result;
use ipnet::Ipv4Net;
use weft::{
    dataplane::{Dataplane, DataplaneSpec, Peer, PeerUpdate, XdpMode},
    lease::Subnets,
    mac::MacAddr,
};

use crate::{cluster::Node, pins::TestPins};

pub type Subnet = Ipv4Net;

/// The VTEP MAC a test gives node `i`.
pub fn vtep_mac(i: u8) -> MacAddr {
    MacAddr([0x02, 0xee, 0, 0, 0, i])
}

/// The IPv6 VTEP MAC a test gives node `i`.
pub fn vtep6_mac(i: u8) -> MacAddr {
    MacAddr([0x02, 0xee, 0, 0, 6, i])
}

/// A node's dataplane, and the subnets it serves.
pub struct Setup {
    pub spec: DataplaneSpec,
    pub subnet: Ipv4Net,
    /// With IPv6 (`spec.public_ipv6` set too).
    pub subnet6: Option<ipnet::Ipv6Net>,
}

pub fn spec(node: &Node, subnet: Ipv4Net, pins: &TestPins, mode: XdpMode) -> Setup {
    Setup {
        spec: DataplaneSpec {
            uplink: "eth0".into(),
            public_ip: Some(node.ip),
            public_ipv6: None,
            vni: 1,
            port: 8472,
            vtep_mac: vtep_mac(node.index),
            vtep6_mac: vtep6_mac(node.index),
            xdp_mode: mode,
            pins: pins.pins().clone(),
            max_peers: dataplane_common::MAX_PEERS,
            fault: dataplane_common::FAULT_NONE,
            host_routing: match crate::host_routing() {
                "legacy" => weft::dataplane::HostRouting::Legacy,
                "bpf" => weft::dataplane::HostRouting::Bpf,
                _ => weft::dataplane::HostRouting::Auto,
            },
            state_dir: pins.state_dir(),
            network: Some("10.244.0.0/16".parse().expect("a network")),
            network6: None,
            masquerade: None,
            forward_rules: true,
            underlay_mtu: None,
            direct_routing: false,
            path_mtu: false,
            kernel: weft::dataplane::ProgramKernel::probe(),
        },
        subnet,
        subnet6: None,
    }
}

/// Sets up the overlay on `node` and installs `peers`; returns what the
/// setup reported (attachments), then lets go: the pinned programs and maps
/// keep working with no process holding them.
pub fn install(node: &Node, setup: Setup, peers: Vec<Peer>) -> Result<Vec<String>> {
    with_overlay(node, setup, async move |o| {
        let updates: Vec<PeerUpdate> = peers.into_iter().map(PeerUpdate::Upsert).collect();
        o.apply(&updates).await?;
        if let Some(p) = o.problems().first() {
            anyhow::bail!("peer {}: {}", p.peer.subnet, p.error);
        }
        Ok(o.attachments()
            .iter()
            .map(|a| {
                format!(
                    "{}:{}:{}",
                    a.program,
                    a.hook.name(),
                    a.xdp_mode.map_or("-", |m| m.as_str())
                )
            })
            .collect())
    })
}

/// Runs `f` with the node's dataplane, as the agent drives it (set up
/// again, adopting what is pinned).
pub fn with_overlay<T: Send + 'static>(
    node: &Node,
    setup: Setup,
    f: impl AsyncFnOnce(&mut Dataplane) -> Result<T> + Send + 'static,
) -> Result<T> {
    node.ns.run(move || -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut o = up(setup).await?;
            f(&mut o).await
        })
    })?
}

/// A node's overlay kept running, as its agent keeps it (the conntrack
/// marker of `--host-routing auto` needs a live dataplane: without it TCP
/// flows stay on the host stack); stopped when dropped.
pub struct Running {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sets up the node's overlay (adopting what is pinned), runs `f` on it,
/// and keeps it running until the returned handle drops.
pub fn run_overlay(
    node: &Node,
    setup: Setup,
    f: impl AsyncFnOnce(&mut Dataplane) -> Result<()> + Send + 'static,
) -> Result<Running> {
    let subnets = Subnets {
        v4: Some(setup.subnet),
        v6: setup.subnet6,
    };
    run_dataplane(node, Dataplane::ebpf(setup.spec), subnets, f)
}

/// As [`run_overlay`], for the wireguard backend's dataplane.
pub fn run_wireguard(
    node: &Node,
    spec: weft::dataplane::wireguard::WgSpec,
    subnets: Subnets,
    f: impl AsyncFnOnce(&mut Dataplane) -> Result<()> + Send + 'static,
) -> Result<Running> {
    run_dataplane(node, Dataplane::wireguard(spec), subnets, f)
}

/// Brings dataplane `d` up around `subnets` in the node's namespace, runs
/// `f` on it, and keeps it running until the returned handle drops.
fn run_dataplane(
    node: &Node,
    mut d: Dataplane,
    subnets: Subnets,
    f: impl AsyncFnOnce(&mut Dataplane) -> Result<()> + Send + 'static,
) -> Result<Running> {
    let file = std::fs::File::open(node.ns.path())?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        use std::os::fd::AsRawFd as _;
        // SAFETY: setns on a valid namespace fd, affecting this thread only.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            let _ = ready_tx.send(Err(anyhow::anyhow!(
                "setns: {}",
                std::io::Error::last_os_error()
            )));
            return;
        }
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready_tx.send(Err(e.into()));
                return;
            }
        };
        rt.block_on(async move {
            if let Err(e) = d.set_subnet(subnets).await {
                let _ = ready_tx.send(Err(e));
                return;
            }
            let r = f(&mut d).await;
            let ok = r.is_ok();
            let _ = ready_tx.send(r);
            if ok {
                // Until the handle drops (its sender goes).
                let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            }
        });
    });
    ready_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the dataplane thread died"))??;
    Ok(Running {
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// The dataplane of `setup`, up around its subnets.
async fn up(setup: Setup) -> Result<Dataplane> {
    let mut d = Dataplane::ebpf(setup.spec);
    d.set_subnet(Subnets {
        v4: Some(setup.subnet),
        v6: setup.subnet6,
    })
    .await?;
    Ok(d)
}

/// The peer entry for `node` serving `subnet`.
pub fn peer(node: &Node, subnet: Ipv4Net) -> Peer {
    Peer::v4(subnet, node.ip, vtep_mac(node.index))
}

pub fn subnet_of(i: u8) -> Ipv4Net {
    format!("10.244.{i}.0/24").parse().expect("valid")
}

/// Node `i`'s IPv6 pod subnet (in fd00:10:244::/56).
pub fn subnet6_of(i: u8) -> ipnet::Ipv6Net {
    format!("fd00:10:244:{i:x}::/64").parse().expect("valid")
}

/// The IPv6 peer entry for `node` (IPv6 VTEP `ip6`) serving `subnet`.
pub fn peer6(node: &Node, ip6: std::net::Ipv6Addr, subnet: ipnet::Ipv6Net) -> Peer {
    Peer::v6(subnet, ip6, vtep6_mac(node.index))
}

/// `setup` with IPv6 too: the node's IPv6 VTEP `ip6` and subnet `subnet6`
/// of fd00:10:244::/56.
pub fn with_ipv6(mut setup: Setup, ip6: std::net::Ipv6Addr, subnet6: ipnet::Ipv6Net) -> Setup {
    setup.spec.public_ipv6 = Some(ip6);
    setup.spec.network6 = Some("fd00:10:244::/56".parse().expect("a network"));
    setup.subnet6 = Some(subnet6);
    setup
}

pub fn pod_ip(node: u8, pod: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, node, 10 + pod)
}
