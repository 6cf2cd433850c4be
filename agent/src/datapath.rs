//! The agent's view of the dataplane: `none` (control plane only) or the
//! eBPF VXLAN datapath. Both keep the same peer table; the eBPF one programs
//! it into the kernel.

use std::{collections::HashMap, net::Ipv4Addr};

use anyhow::Result;

use crate::{
    cli::{AgentArgs, DatapathKind},
    dataplane::{maps::Counters, netlink::Link},
    lease::{acquire::HeldLease, config::NetworkConfig, subnet::Ipv4Net},
    peers::{Peer, PeerUpdate},
};

pub enum Datapath {
    /// Control plane only: the peer table is kept and logged, not programmed.
    None { peers: HashMap<Ipv4Net, Peer> },
}

impl Datapath {
    pub async fn new(
        args: &AgentArgs,
        _uplink: Option<Link>,
        _public_ip: Ipv4Addr,
    ) -> Result<Self> {
        match args.datapath {
            DatapathKind::None => Ok(Datapath::None {
                peers: HashMap::new(),
            }),
            DatapathKind::Ebpf => anyhow::bail!("the eBPF datapath is not available in this build"),
        }
    }

    /// Our own subnet is (now) `held`.
    pub async fn set_own(&mut self, held: &HeldLease, _config: &NetworkConfig) -> Result<()> {
        match self {
            Datapath::None { .. } => {
                tracing::debug!(subnet = %held.subnet, "own subnet (no datapath)");
                Ok(())
            }
        }
    }

    pub async fn apply(&mut self, u: &PeerUpdate) -> Result<()> {
        match self {
            Datapath::None { peers } => {
                match u {
                    PeerUpdate::Upsert(p) => {
                        tracing::info!(subnet = %p.subnet, vtep = %p.vtep, mac = %p.mac, "peer");
                        peers.insert(p.subnet, *p);
                    }
                    PeerUpdate::Remove(s) => {
                        tracing::info!(subnet = %s, "peer removed");
                        peers.remove(s);
                    }
                }
                Ok(())
            }
        }
    }

    /// The updates so far add up to etcd's state at `revision`.
    pub async fn synced(&mut self, revision: i64) -> Result<()> {
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
        }
    }

    /// The dataplane's counters, for /metrics.
    pub fn counters(&self) -> Option<std::sync::Arc<Counters>> {
        match self {
            Datapath::None { .. } => None,
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
