//! The datapath as the agent left it: its programs attached where they
//! belong, and each family's overlay MTU against the uplink's and what
//! subnet.env tells the pods.

use anyhow::Result;

use super::findings::Findings;
use crate::{
    dataplane::{
        Family, Hook, Netlink, PinDir, device_name, device6_name, pinned_links, pinned_program,
    },
    report,
};

/// One family's overlay device, as found.
pub(super) struct FamilyDevice {
    pub(super) family: Family,
    pub(super) name: String,
    /// Its MTU, if it exists.
    pub(super) mtu: Option<u32>,
}

/// The overlay devices of the families the datapath runs.
pub(super) async fn devices(
    nl: &Netlink,
    vni: u32,
    families: &[Family],
) -> Result<Vec<FamilyDevice>> {
    let mut out = Vec::new();
    for &family in families {
        let name = match family {
            Family::V4 => device_name(vni),
            Family::V6 => device6_name(vni),
        };
        let mtu = nl.link(&name).await?.map(|l| l.mtu);
        out.push(FamilyDevice { family, name, mtu });
    }
    Ok(out)
}

pub(super) async fn programs(
    f: &mut Findings,
    nl: &Netlink,
    dir: &PinDir,
    uplink: &str,
    devices: &[FamilyDevice],
    agent: Option<&report::Report>,
) -> Result<()> {
    let mut decap = None;
    let mut encap: Vec<(String, String)> = Vec::new();
    for (hook, iface, ifindex) in pinned_links(dir)? {
        let program = pinned_program(dir, hook, &iface, ifindex).unwrap_or_default();
        let link = nl.link(&iface).await?;
        if link.as_ref().is_none_or(|l| l.index != ifindex) {
            continue;
        }
        if iface == uplink && program.contains("decap") {
            let attached = match hook {
                Hook::Xdp => link.and_then(|l| l.xdp).is_some(),
                _ => true,
            };
            if attached {
                decap = Some(format!("{program} ({})", hook.name()));
            }
        }
        if hook == Hook::TcEgress && program.contains("encap") {
            encap.push((iface, program));
        }
    }
    let mut missing = Vec::new();
    if decap.is_none() {
        missing.push(format!("no decapsulation program on {uplink}"));
    }
    let mut found = Vec::new();
    for d in devices {
        match encap.iter().find(|(iface, _)| *iface == d.name) {
            Some((iface, program)) => found.push(format!("{program} on {iface}")),
            None => missing.push(format!(
                "no {} encapsulation program on {}",
                d.family.name(),
                d.name
            )),
        }
    }
    match decap {
        Some(d) if missing.is_empty() => {
            f.ok("programs", format!("{d} on {uplink}, {}", found.join(", ")))
        }
        _ => f.fail(
            "programs",
            missing.join("; "),
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

/// Each family's overlay MTU plus its VXLAN overhead fits the uplink, and
/// subnet.env gives pods the smallest of them.
pub(super) fn mtu(
    f: &mut Findings,
    uplink_mtu: u32,
    devices: &[FamilyDevice],
    env_mtu: Option<u32>,
) {
    let mut seen = Vec::new();
    for d in devices {
        let Some(mtu) = d.mtu else {
            f.fail(
                "mtu",
                format!(
                    "the {} overlay device {} is missing",
                    d.family.name(),
                    d.name
                ),
                "the agent re-creates it: is it running?",
            );
            return;
        };
        let overhead = d.family.overhead();
        if mtu + overhead > uplink_mtu {
            f.fail(
                "mtu",
                format!("{} overlay MTU {mtu} + {overhead} bytes of VXLAN exceeds the uplink's {uplink_mtu}: large packets are dropped", d.name),
                format!("set Backend.MTU to the underlay's MTU (or unset it), or ip link set dev {} mtu {}", d.name, d.family.overlay_mtu(uplink_mtu)),
            );
            return;
        }
        seen.push(format!("{} {mtu}", d.name));
    }
    let pods = devices.iter().filter_map(|d| d.mtu).min();
    match (env_mtu, pods) {
        (Some(e), Some(p)) if e != p => f.fail(
            "mtu",
            format!("subnet.env says FLANNEL_MTU={e} but the overlay carries {p}: new pods get the wrong MTU"),
            "restart the agent (it rewrites subnet.env)",
        ),
        _ => f.ok(
            "mtu",
            format!(
                "overlay {}, uplink {uplink_mtu}, subnet.env {}",
                seen.join(", "),
                env_mtu.map_or("-".into(), |m| m.to_string())
            ),
        ),
    }
}

/// VXLAN that arrived as outer fragments: a hop between this node and a
/// peer carries less than the packets sent over it. Nothing is lost (the
/// kernel reassembles them) but each costs a reassembly, and any fragment
/// lost loses the packet.
pub(super) fn fragments(f: &mut Findings, fragmented: u64, uplink_mtu: u32) {
    if fragmented == 0 {
        f.ok("fragments", "no VXLAN arrived fragmented");
        return;
    }
    f.warn(
        "fragments",
        format!(
            "{fragmented} VXLAN packets arrived as outer fragments (counted since the datapath's maps were created): a hop on the underlay between this node and a peer carries less than {uplink_mtu} bytes"
        ),
        "set Backend.MTU to the underlay's smallest MTU, or raise that hop's; weft_dataplane_packets_total{reason=\"fragmented\"} shows when it happens",
    );
}

/// Peers whose path was measured smaller than the uplink's MTU (per-peer
/// path MTU): packets to them are limited to that path, less VXLAN's
/// overhead. Not a failure (their route carries it and the node answers
/// too-big packets with ICMP), but worth knowing: a hop on the way is
/// smaller than the uplinks, and a pod that drops ICMP "fragmentation
/// needed" stalls on it.
pub(super) fn paths(f: &mut Findings, agent: Option<&crate::report::Report>, uplink_mtu: u32) {
    let Some(r) = agent else {
        return;
    };
    let measured: Vec<_> = r
        .peer_health
        .iter()
        .filter_map(|h| Some((h, h.path_mtu?)))
        .collect();
    if measured.is_empty() {
        f.ok(
            "path-mtu",
            "no peer's path MTU measured (per-peer path MTU off, or not yet)",
        );
        return;
    }
    let small: Vec<String> = measured
        .iter()
        .filter(|(_, m)| *m < uplink_mtu)
        .map(|(h, m)| format!("{} ({}) {m}", h.subnet, h.vtep))
        .collect();
    if small.is_empty() {
        f.ok(
            "path-mtu",
            format!(
                "{} peers' paths carry the uplink's {uplink_mtu} bytes",
                measured.len()
            ),
        );
        return;
    }
    let shown = small.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    f.warn(
        "path-mtu",
        format!(
            "{} of {} peers' paths carry less than the uplink's {uplink_mtu} bytes: {shown}{}; packets to them are limited to that less 50",
            small.len(),
            measured.len(),
            if small.len() > 5 { ", ..." } else { "" }
        ),
        "raise the smaller hop's MTU if it should carry jumbo frames; weft status shows each peer's path MTU",
    );
}
