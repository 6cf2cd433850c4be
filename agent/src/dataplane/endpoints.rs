//! Host routing's local pods: the endpoint map (pod address -> its veth,
//! its MAC, its gateway's MAC) and the transmit program on each pod's veth.
//!
//! The agent is the only writer. It hands over the endpoints the CNI
//! plugin registered; one address has one endpoint (of two registrations
//! of one address, the newer wins: a pod deleted and its address reused),
//! and an endpoint whose veth is gone is dropped, so nothing stale survives
//! a crash between CNI ADD and DEL.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use anyhow::Result;
use dataplane_common::{Endpoint, program_names};

use super::{
    bpffs::PinDir,
    loader::{self, Attachment, Hook, Loaded},
    maps::EndpointMap,
    netlink::Netlink,
};
use crate::mac::MacAddr;

/// An endpoint as registered (by the CNI plugin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    /// Who registered it: CNI container id and interface name.
    pub owner: String,
    pub ip: IpAddr,
    /// The host side of the pod's veth, by name and index.
    pub host_if: String,
    pub host_ifindex: u32,
    pub pod_mac: MacAddr,
    pub gw_mac: MacAddr,
    /// When it was registered (nanoseconds since the epoch): the newer of
    /// two registrations of one address wins.
    pub added_ns: u128,
}

/// What a sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointSync {
    /// Endpoints programmed now.
    pub active: usize,
    /// Registrations whose veth no longer exists (their pod is gone): the
    /// caller forgets them.
    pub gone: Vec<String>,
}

/// The endpoints programmed, by address.
/// One endpoint per address: the newest registration whose veth is still
/// there (by index and name). Registrations whose veth is gone are added to
/// `gone`.
fn choose<'a>(
    want: &'a [EndpointSpec],
    links: &HashMap<u32, String>,
    gone: &mut Vec<String>,
) -> HashMap<IpAddr, &'a EndpointSpec> {
    let mut chosen: HashMap<IpAddr, &EndpointSpec> = HashMap::new();
    for e in want {
        if links.get(&e.host_ifindex) != Some(&e.host_if) {
            gone.push(e.owner.clone());
            continue;
        }
        match chosen.get(&e.ip) {
            Some(c) if (c.added_ns, &c.owner) >= (e.added_ns, &e.owner) => {}
            _ => {
                chosen.insert(e.ip, e);
            }
        }
    }
    chosen
}

#[derive(Default)]
pub(crate) struct Endpoints {
    active: HashMap<IpAddr, EndpointSpec>,
}

impl Endpoints {
    /// Makes the map and the veths' programs match `want`.
    pub(crate) async fn sync(
        &mut self,
        want: &[EndpointSpec],
        map: &mut EndpointMap,
        loaded: &mut Loaded,
        pins: &PinDir,
        nl: &Netlink,
        not_pods: &[String],
    ) -> Result<EndpointSync> {
        let links: HashMap<u32, String> = nl
            .links()
            .await?
            .into_iter()
            .map(|l| (l.index, l.name))
            .collect();
        let mut out = EndpointSync::default();
        let chosen = choose(want, &links, &mut out.gone);
        // Gone first, so a veth that now serves another address is not
        // left with the old one.
        let stale: Vec<IpAddr> = self
            .active
            .iter()
            .filter(|(ip, e)| chosen.get(ip).is_none_or(|c| *c != *e))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in stale {
            let e = self.active.remove(&ip).expect("listed");
            map.remove(ip)?;
            tracing::debug!(%ip, veth = %e.host_if, owner = %e.owner, "endpoint removed");
        }
        let serving: HashSet<&str> = chosen.values().map(|e| e.host_if.as_str()).collect();
        for (ip, e) in &chosen {
            if self.active.get(ip) == Some(*e) {
                continue;
            }
            map.set(
                *ip,
                &Endpoint {
                    ifindex: e.host_ifindex,
                    pod_mac: e.pod_mac.0,
                    gw_mac: e.gw_mac.0,
                },
            )?;
            let a = loaded.attach_tc(program_names::FROM_POD, &e.host_if, Hook::TcIngress)?;
            tracing::debug!(%ip, veth = %e.host_if, owner = %e.owner, adopted = a.adopted, "endpoint programmed");
            self.active.insert(*ip, (*e).clone());
        }
        // Programs on veths that serve no endpoint (a pod gone while the
        // agent was away) are removed; pins of vanished devices too.
        for (hook, iface, ifindex) in loader::pinned_links(pins)? {
            // Only pods' links: not the uplink's, not the IPv6 overlay
            // device's (its ingress program checks what the kernel
            // decapsulated).
            if hook != Hook::TcIngress || not_pods.contains(&iface) {
                continue;
            }
            let exists = links.get(&ifindex) == Some(&iface);
            if !exists || !serving.contains(iface.as_str()) {
                loader::detach(pins, Hook::TcIngress, &iface)?;
            }
        }
        out.active = self.active.len();
        Ok(out)
    }
}

impl Endpoints {
    /// Attaches the program again on any active endpoint's veth that lost
    /// it (its link unpinned or detached); returns on how many.
    pub(crate) fn heal(&mut self, loaded: &mut Loaded) -> usize {
        let mut n = 0;
        for e in self.active.values() {
            if loader::ifindex(&e.host_if).is_err() {
                // The pod is going: the next sync forgets it.
                continue;
            }
            let a = Attachment {
                program: program_names::FROM_POD,
                iface: e.host_if.clone(),
                hook: Hook::TcIngress,
                xdp_mode: None,
                adopted: false,
            };
            let r = loaded.is_attached(&a).and_then(|attached| {
                if attached {
                    Ok(false)
                } else {
                    loaded
                        .attach_tc(program_names::FROM_POD, &e.host_if, Hook::TcIngress)
                        .map(|_| true)
                }
            });
            match r {
                Ok(true) => n += 1,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(veth = %e.host_if, error = %format!("{err:#}"), "cannot check or attach host routing on a pod's veth")
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(owner: &str, ip: [u8; 4], veth: &str, idx: u32, at: u128) -> EndpointSpec {
        EndpointSpec {
            owner: owner.into(),
            ip: std::net::Ipv4Addr::from(ip).into(),
            host_if: veth.into(),
            host_ifindex: idx,
            pod_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            gw_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            added_ns: at,
        }
    }

    #[test]
    fn the_newest_registration_of_an_address_wins_and_vanished_veths_are_gone() {
        let links: HashMap<u32, String> = [
            (10, "vethA".to_string()),
            (11, "vethB".to_string()),
            (12, "vethC".to_string()),
        ]
        .into_iter()
        .collect();
        let want = vec![
            // A's pod was deleted and its address reused by B (newer).
            ep("a", [10, 5, 1, 2], "vethA", 10, 100),
            ep("b", [10, 5, 1, 2], "vethB", 11, 200),
            // C is fine; D's veth is gone; E's index now names another veth.
            ep("c", [10, 5, 1, 3], "vethC", 12, 50),
            ep("d", [10, 5, 1, 4], "vethD", 13, 60),
            ep("e", [10, 5, 1, 5], "vethE", 12, 70),
        ];
        let mut gone = Vec::new();
        let chosen = choose(&want, &links, &mut gone);
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 2])].owner, "b");
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 3])].owner, "c");
        assert_eq!(chosen.len(), 2);
        assert_eq!(gone, ["d", "e"]);
        // Order of registration does not matter.
        let mut rev = want.clone();
        rev.reverse();
        let chosen = choose(&rev, &links, &mut Vec::new());
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 2])].owner, "b");
    }
}
