//! What `weft status` shows of a node on the VXLAN backend, gathered once
//! from the pinned maps and links, netlink, the subnet file, the agent's
//! report and etcd: rendered as text ([`super::text`]) or as JSON by serde.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use anyhow::Result;
use ipnet::IpNet;
use serde::{Serialize, Serializer, ser::SerializeMap as _};

use crate::{
    cli::NodeArgs,
    dataplane::{EndpointMap, Hook, Netlink, PeerMaps, PinDir, pinned_links, pinned_program},
    lease::{self, EtcdOptions, EtcdStore, Store as _, Subnets},
    mac::MacAddr,
    report,
};

/// A node on the VXLAN backend, as `weft status` shows it.
#[derive(Serialize)]
pub(super) struct NodeStatus {
    pub(super) subnet: Option<String>,
    pub(super) subnet6: Option<String>,
    /// The lease's key and time to live, or why it is unknown.
    pub(super) lease: String,
    pub(super) public_ip: Ipv4Addr,
    pub(super) public_ipv6: Option<Ipv6Addr>,
    pub(super) vni: u32,
    pub(super) port: u16,
    pub(super) vtep_mac: String,
    pub(super) vtep6_mac: Option<String>,
    pub(super) uplink: Option<Uplink>,
    pub(super) attached: Vec<Attached>,
    pub(super) peers: Vec<PeerRow>,
    pub(super) peer_capacity: u32,
    pub(super) endpoints: usize,
    pub(super) pod_veth_programs: usize,
    pub(super) agent: Option<report::Report>,
    #[serde(serialize_with = "counters_by_name")]
    pub(super) counters: Vec<(dataplane_common::Reason, dataplane_common::Counter)>,
    /// Both families' subnets, as the text shows them.
    #[serde(skip)]
    pub(super) subnets: Option<Subnets>,
    #[serde(skip)]
    pub(super) overlay6_mtu: u32,
}

#[derive(Serialize)]
pub(super) struct Uplink {
    pub(super) name: String,
    pub(super) ifindex: u32,
    pub(super) mtu: u32,
}

/// A program in a link (the pod devices' are counted, not listed).
#[derive(Serialize)]
pub(super) struct Attached {
    pub(super) iface: String,
    pub(super) hook: &'static str,
    pub(super) program: String,
    pub(super) xdp_mode: String,
}

#[derive(Serialize)]
pub(super) struct PeerRow {
    pub(super) subnet: IpNet,
    pub(super) vtep: String,
    pub(super) mac: String,
    /// `direct` (DirectRouting) or `vxlan`.
    pub(super) path: &'static str,
}

/// The counters as JSON has them: by outcome's name.
fn counters_by_name<S: Serializer>(
    rows: &[(dataplane_common::Reason, dataplane_common::Counter)],
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Count {
        packets: u64,
        bytes: u64,
    }
    let mut m = s.serialize_map(Some(rows.len()))?;
    for (r, c) in rows {
        m.serialize_entry(
            r.name(),
            &Count {
                packets: c.packets,
                bytes: c.bytes,
            },
        )?;
    }
    m.end()
}

pub(super) async fn gather(dir: &PinDir, node: &NodeArgs) -> Result<NodeStatus> {
    let maps = PeerMaps::open(dir)?;
    let cfg = maps.config()?;
    let direct = maps.direct_subnets()?;
    let mut peers: Vec<_> = maps
        .peers()?
        .into_values()
        .map(|p| PeerRow {
            subnet: p.subnet,
            vtep: p.vtep.to_string(),
            mac: p.mac.to_string(),
            path: if direct.contains(&p.subnet) {
                "direct"
            } else {
                "vxlan"
            },
        })
        .collect();
    peers.sort_by_key(|p| p.subnet);
    let nl = Netlink::new()?;
    let mut attached = Vec::new();
    let mut pod_veth_programs = 0;
    for (hook, iface, ifindex) in pinned_links(dir)? {
        let program = pinned_program(dir, hook, &iface, ifindex).unwrap_or_else(|| "?".into());
        if program == dataplane_common::program_names::FROM_POD {
            pod_veth_programs += 1;
            continue;
        }
        let xdp_mode = match hook {
            Hook::Xdp => match nl.link(&iface).await?.and_then(|l| l.xdp) {
                Some(x) => x.mode.map_or("attached", |m| m.as_str()).to_string(),
                None => "detached".into(),
            },
            _ => "-".into(),
        };
        attached.push(Attached {
            iface,
            hook: hook.name(),
            program,
            xdp_mode,
        });
    }
    let subnets = lease::read_subnet(&node.subnet_file).ok().flatten();
    let v6 = cfg.flags & dataplane_common::CONFIG_F_IPV6 != 0;
    Ok(NodeStatus {
        subnet: subnets.and_then(|s| s.v4).map(|s| s.to_string()),
        subnet6: subnets.and_then(|s| s.v6).map(|s| s.to_string()),
        lease: lease_of(node, subnets).await,
        public_ip: Ipv4Addr::from(cfg.local_addr_be.to_ne_bytes()),
        public_ipv6: v6.then(|| Ipv6Addr::from(cfg.local_addr6)),
        vni: cfg.vni,
        port: cfg.port,
        vtep_mac: MacAddr(cfg.vtep_mac).to_string(),
        vtep6_mac: v6.then(|| MacAddr(cfg.vtep6_mac).to_string()),
        uplink: nl.link_by_index(cfg.uplink_ifindex).await?.map(|l| Uplink {
            name: l.name,
            ifindex: l.index,
            mtu: l.mtu,
        }),
        attached,
        peers,
        peer_capacity: maps.capacity()?,
        endpoints: EndpointMap::open(dir)
            .and_then(|m| m.all())
            .map(|m| m.len())
            .unwrap_or(0),
        pod_veth_programs,
        agent: report::read(&node.state.state_dir),
        counters: crate::dataplane::Counters::open(dir)?.all()?,
        subnets,
        overlay6_mtu: cfg.overlay6_mtu,
    })
}

/// The lease's time to live, if etcd answers quickly.
async fn lease_of(node: &NodeArgs, subnets: Option<Subnets>) -> String {
    let Some(s) = subnets else {
        return "unknown (no subnet file)".into();
    };
    let key = format!("{}/subnets/{}", node.etcd.prefix(), s.key());
    let mut o = node.etcd.options();
    o.request_timeout = Duration::from_secs(2);
    match tokio::time::timeout(Duration::from_secs(3), lease_ttl(&o, &key)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => format!("unknown (etcd: {e})"),
        Err(_) => "unknown (etcd did not answer)".into(),
    }
}

async fn lease_ttl(o: &EtcdOptions, key: &str) -> Result<String> {
    let store = EtcdStore::connect(o).await?;
    let Some(kv) = store.get(key).await? else {
        return Ok(format!("{key}: not in etcd"));
    };
    if kv.lease == 0 {
        return Ok(format!("{key} (reservation, no TTL)"));
    }
    Ok(match store.ttl(kv.lease).await? {
        Some(ttl) => format!("{key}, TTL {ttl}s"),
        None => format!("{key}, its etcd lease has expired"),
    })
}
