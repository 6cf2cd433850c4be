//! The agent's view of the dataplane: `none` (control plane only) or the
//! eBPF VXLAN datapath. Both keep the same peer table; the eBPF one programs
//! it into the kernel.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
    sync::{Arc, OnceLock},
};

use anyhow::Result;

use crate::{
    cli::{AgentArgs, DatapathKind, XdpModeArg},
    dataplane::{
        bpffs::PinDir,
        maps::Counters,
        netlink::Link,
        overlay::{DecapMode, Overlay, OverlaySpec},
    },
    lease::{acquire::HeldLease, config::NetworkConfig, subnet::Ipv4Net},
    peers::{Peer, PeerUpdate},
};

/// Where the /metrics handler finds the dataplane's counters once the
/// dataplane is up.
pub type CountersSlot = Arc<OnceLock<Arc<Counters>>>;

pub enum Datapath {
    /// Control plane only: the peer table is kept and logged, not programmed.
    None {
        peers: HashMap<Ipv4Net, Peer>,
    },
    Ebpf(Box<Ebpf>),
}

pub struct Ebpf {
    uplink: Link,
    public_ip: Ipv4Addr,
    decap: DecapMode,
    pins: PinDir,
    overlay: Option<Overlay>,
    /// Subnets upserted since start; the first sync removes pinned peers
    /// not among them (leases that vanished while the agent was away).
    seen: HashSet<Ipv4Net>,
    first_sync_done: bool,
    counters: CountersSlot,
}

impl Datapath {
    pub async fn new(
        args: &AgentArgs,
        uplink: Option<Link>,
        public_ip: Ipv4Addr,
        counters: CountersSlot,
    ) -> Result<Self> {
        match args.datapath {
            DatapathKind::None => Ok(Datapath::None {
                peers: HashMap::new(),
            }),
            DatapathKind::Ebpf => {
                let uplink = uplink.ok_or_else(|| {
                    anyhow::anyhow!("the eBPF datapath needs an uplink (--iface)")
                })?;
                let decap = match args.xdp_mode {
                    XdpModeArg::Auto => DecapMode::XdpAuto,
                    XdpModeArg::Native => DecapMode::XdpNative,
                    XdpModeArg::Generic => DecapMode::XdpGeneric,
                    XdpModeArg::Off => DecapMode::Tc,
                };
                Ok(Datapath::Ebpf(Box::new(Ebpf {
                    uplink,
                    public_ip,
                    decap,
                    pins: PinDir::new(&args.pins.bpffs_dir),
                    overlay: None,
                    seen: HashSet::new(),
                    first_sync_done: false,
                    counters,
                })))
            }
        }
    }

    /// Our own subnet is (now) `held`: set up the dataplane around it.
    pub async fn set_own(&mut self, held: &HeldLease, config: &NetworkConfig) -> Result<()> {
        match self {
            Datapath::None { .. } => {
                tracing::debug!(subnet = %held.subnet, "own subnet (no datapath)");
                Ok(())
            }
            Datapath::Ebpf(e) => {
                match &mut e.overlay {
                    Some(o) => o.set_subnet(held.subnet).await?,
                    None => {
                        let mac = held
                            .attrs
                            .vxlan_data()
                            .map(|d| d.vtep_mac)
                            .map_err(|err| anyhow::anyhow!("our own lease value: {err}"))?;
                        let o = Overlay::setup(OverlaySpec {
                            uplink: e.uplink.name.clone(),
                            public_ip: e.public_ip,
                            vni: config.vni,
                            port: config.port,
                            vtep_mac: mac,
                            subnet: held.subnet,
                            decap: e.decap,
                            pins: e.pins.clone(),
                        })
                        .await?;
                        let _ = e.counters.set(o.counters());
                        tracing::info!(
                            device = %crate::dataplane::overlay::device_name(config.vni),
                            subnet = %held.subnet,
                            peers = o.peers().len(),
                            "dataplane up"
                        );
                        e.overlay = Some(o);
                    }
                }
                Ok(())
            }
        }
    }

    /// Applies a batch of peer updates, in order.
    pub async fn apply(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    tracing::debug!(subnet = %p.subnet, vtep = %p.vtep, mac = %p.mac, "peer")
                }
                PeerUpdate::Remove(s) => tracing::debug!(subnet = %s, "peer removed"),
            }
        }
        match self {
            Datapath::None { peers } => {
                for u in updates {
                    match u {
                        PeerUpdate::Upsert(p) => {
                            peers.insert(p.subnet, *p);
                        }
                        PeerUpdate::Remove(s) => {
                            peers.remove(s);
                        }
                    }
                }
                Ok(())
            }
            Datapath::Ebpf(e) => {
                let Some(o) = e.overlay.as_mut() else {
                    anyhow::bail!("peer update before the dataplane is up");
                };
                for u in updates {
                    match u {
                        PeerUpdate::Upsert(p) => e.seen.insert(p.subnet),
                        PeerUpdate::Remove(s) => e.seen.remove(s),
                    };
                }
                o.apply_batch(updates).await
            }
        }
    }

    /// The updates so far add up to etcd's state at `revision`.
    pub async fn synced(&mut self, revision: i64) -> Result<()> {
        if let Datapath::Ebpf(e) = self
            && !e.first_sync_done
            && let Some(o) = e.overlay.as_mut()
        {
            let removed = o.retain(&e.seen).await?;
            if removed > 0 {
                tracing::info!(
                    removed,
                    "removed peers whose leases vanished while the agent was away"
                );
            }
            e.first_sync_done = true;
        }
        tracing::debug!(
            revision,
            peers = self.peer_count(),
            "peer table in step with etcd"
        );
        Ok(())
    }

    pub fn peer_count(&self) -> usize {
        match self {
            Datapath::None { peers } => peers.len(),
            Datapath::Ebpf(e) => e.overlay.as_ref().map(|o| o.peers().len()).unwrap_or(0),
        }
    }
}

/// The eBPF counters in Prometheus text format.
pub fn render_counters(c: &Counters) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let Ok(all) = c.all() else { return o };
    let _ = writeln!(
        o,
        "# HELP weft_dataplane_packets_total Packets seen by the eBPF programs, by outcome.\n# TYPE weft_dataplane_packets_total counter"
    );
    for (r, v) in &all {
        let _ = writeln!(
            o,
            "weft_dataplane_packets_total{{reason=\"{}\"}} {}",
            r.name(),
            v.packets
        );
    }
    let _ = writeln!(
        o,
        "# HELP weft_dataplane_bytes_total Bytes seen by the eBPF programs, by outcome.\n# TYPE weft_dataplane_bytes_total counter"
    );
    for (r, v) in &all {
        let _ = writeln!(
            o,
            "weft_dataplane_bytes_total{{reason=\"{}\"}} {}",
            r.name(),
            v.bytes
        );
    }
    o
}
