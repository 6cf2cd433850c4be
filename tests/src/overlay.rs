//! Driving the datapath through its library API (static peers), as a node's
//! agent would, inside a node's namespace.

use std::net::Ipv4Addr;

use anyhow::Result;
use weft::{
    dataplane::{
        bpffs::PinDir,
        overlay::{DecapMode, Overlay, OverlaySpec},
    },
    lease::subnet::Ipv4Net,
    mac::MacAddr,
    peers::Peer,
};

use crate::cluster::Node;

pub type Subnet = Ipv4Net;

/// The VTEP MAC a test gives node `i`.
pub fn vtep_mac(i: u8) -> MacAddr {
    MacAddr([0x02, 0xee, 0, 0, 0, i])
}

pub fn spec(node: &Node, subnet: Ipv4Net, pins: &PinDir, decap: DecapMode) -> OverlaySpec {
    OverlaySpec {
        uplink: "eth0".into(),
        public_ip: node.ip,
        vni: 1,
        port: 8472,
        vtep_mac: vtep_mac(node.index),
        subnet,
        decap,
        pins: pins.clone(),
    }
}

/// Sets up the overlay on `node` and installs `peers`; returns what the
/// setup reported (attachments), then lets go: the pinned programs and maps
/// keep working with no process holding them.
pub fn install(node: &Node, spec: OverlaySpec, peers: Vec<Peer>) -> Result<Vec<String>> {
    node.ns.run(move || -> Result<Vec<String>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut o = Overlay::setup(spec).await?;
            for p in peers {
                o.upsert(p).await?;
            }
            Ok(o.attachments()
                .iter()
                .map(|a| {
                    format!(
                        "{}:{}:{}",
                        a.program,
                        a.hook.name(),
                        a.xdp_mode.map(|m| m.as_str()).unwrap_or("-")
                    )
                })
                .collect())
        })
    })?
}

/// Runs `f` with the node's overlay (set up again, adopting what is pinned).
pub fn with_overlay<T: Send + 'static>(
    node: &Node,
    spec: OverlaySpec,
    f: impl AsyncFnOnce(&mut Overlay) -> Result<T> + Send + 'static,
) -> Result<T> {
    node.ns.run(move || -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut o = Overlay::setup(spec).await?;
            f(&mut o).await
        })
    })?
}

/// The peer entry for `node` serving `subnet`.
pub fn peer(node: &Node, subnet: Ipv4Net) -> Peer {
    Peer {
        subnet,
        vtep: node.ip,
        mac: vtep_mac(node.index),
    }
}

pub fn subnet_of(i: u8) -> Ipv4Net {
    format!("10.244.{i}.0/24").parse().expect("valid")
}

pub fn pod_ip(node: u8, pod: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, node, 10 + pod)
}
