//! An ICMP echo through the overlay to each peer's overlay address (its
//! subnet's network address, held by its overlay device), either family:
//! answered only if VXLAN on the UDP port passes both ways. Full-size and
//! unfragmentable, so a path that cannot carry the overlay MTU shows too.

use std::time::Duration;

use super::{dataplane::FamilyDevice, findings::Findings};
use crate::{
    dataplane::{Family, Peer},
    sys::icmp,
};

/// The smallest probe of a family: its IP header, ICMP's and 56 bytes.
fn small(family: Family) -> usize {
    match family {
        Family::V4 => 84,
        Family::V6 => 104,
    }
}

pub(super) fn probe(
    f: &mut Findings,
    peers: &[Peer],
    devices: &[FamilyDevice],
    port: u16,
    timeout: Duration,
    paths: &std::collections::HashMap<ipnet::IpNet, u32>,
) {
    if peers.is_empty() {
        f.ok("peers", "no peers yet");
        return;
    }
    let mut peers = peers.to_vec();
    peers.sort_by_key(|p| p.subnet);
    for p in &peers {
        let family = Family::of(p.subnet.addr());
        let name = format!("peer {}", p.subnet);
        let Some(mtu) = devices
            .iter()
            .find(|d| d.family == family)
            .and_then(|d| d.mtu)
        else {
            f.fail(
                "peers",
                format!(
                    "{name} via {}: no {} overlay device to probe through",
                    p.vtep,
                    family.name()
                ),
                "the agent creates it: is it running? (its log says why not)",
            );
            continue;
        };
        // A peer whose path was measured smaller: what its route carries.
        let mtu = match paths.get(&p.subnet) {
            Some(path) => mtu.min(path.saturating_sub(dataplane_common::VXLAN_OVERHEAD)),
            None => mtu,
        };
        let to = p.subnet.network();
        match icmp::echo(to, mtu as usize, timeout) {
            Ok(rtt) => f.ok(
                "peers",
                format!("{name} via {}: a {mtu}-byte probe through UDP {port} answered in {:.1} ms", p.vtep, rtt.as_secs_f64() * 1e3),
            ),
            Err(e) => match icmp::echo(to, small(family), timeout) {
                Ok(_) => f.fail(
                    "peers",
                    format!("{name} via {}: small probes pass, {mtu}-byte ones do not ({e:#}): the path does not carry the overlay MTU", p.vtep),
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
