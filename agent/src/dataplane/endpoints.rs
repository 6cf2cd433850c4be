//! Host routing's local pods: the endpoint map (pod address -> its veth,
//! its MAC, its gateway's MAC), the pod veth map (veth -> the addresses
//! its pod may send from) and the transmit program on each pod's device:
//! at TC ingress on a veth's host side, at the peer hook of a netkit pair
//! (named by its primary, the host side).
//!
//! The CNI plugin registers each pod (a record per attachment) and, so that
//! nothing stale outlives an agent that is away, writes and removes the
//! pod's map entries itself on ADD and DEL. The agent makes the pinned maps
//! exact at start and on every sync: it reads them and compares them with
//! the registrations that are fit for the fast path and the links that
//! exist, so an entry without a live registration is removed whoever wrote
//! it, and a registration is checked before it is programmed (a veth whose
//! other end is in another namespace, never a bridge or one of Weft's own
//! devices, an address in the node's own subnets). One address has one
//! endpoint: of two registrations of one address, the newer wins (a pod
//! deleted and its address reused). A registration that is not fit is
//! reported and skipped; it never stops the others.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use anyhow::Result;
use dataplane_common::{Endpoint, POD_IF_V4, POD_IF_V6, PodIf, program_names};

use crate::dataplane::maps::EndpointMap;
use crate::dataplane::programs::links;
use crate::dataplane::programs::links::Hook;
use crate::dataplane::programs::loader::Attachment;
use crate::dataplane::programs::loader::Loaded;
use crate::sys::bpffs::PinDir;
use crate::sys::netlink::Link;
use crate::sys::netlink::Netlink;
use crate::{lease::Subnets, mac::MacAddr};

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

impl EndpointSpec {
    /// The value of its endpoint map entry.
    pub(crate) fn entry(&self) -> Endpoint {
        Endpoint {
            ifindex: self.host_ifindex,
            pod_mac: self.pod_mac.0,
            gw_mac: self.gw_mac.0,
        }
    }
}

/// The addresses of the pod behind one veth: the lowest registered of
/// each family (the fast path carries one source per family per pod).
pub(crate) fn pod_ifs<'a>(eps: impl IntoIterator<Item = &'a EndpointSpec>) -> HashMap<u32, PodIf> {
    let mut out: HashMap<u32, PodIf> = HashMap::new();
    for e in eps {
        let p = out.entry(e.host_ifindex).or_default();
        match e.ip {
            IpAddr::V4(a) => {
                let be = u32::from_ne_bytes(a.octets());
                if p.flags & POD_IF_V4 == 0 || a.octets() < p.ip4_be.to_ne_bytes() {
                    p.ip4_be = be;
                    p.flags |= POD_IF_V4;
                }
            }
            IpAddr::V6(a) => {
                if p.flags & POD_IF_V6 == 0 || a.octets() < p.ip6 {
                    p.ip6 = a.octets();
                    p.flags |= POD_IF_V6;
                }
            }
        }
    }
    out
}

/// What a sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointSync {
    /// Endpoints programmed now.
    pub active: usize,
    /// Registrations whose veth no longer exists (their pod is gone): the
    /// caller forgets them.
    pub gone: Vec<String>,
    /// Registrations not fit for the fast path: (owner, why). Their pods
    /// take the host stack.
    pub rejected: Vec<(String, String)>,
}

/// Where registrations must fit.
pub(crate) struct Scope<'a> {
    /// Devices that are never a pod's (the uplink, the overlay devices).
    pub(crate) not_pods: &'a [String],
    /// The node's own subnets: pod addresses lie in them.
    pub(crate) subnets: Subnets,
}

/// Why registration `e` (whose veth, `link`, exists) is not fit for the
/// fast path, if it is not.
fn unfit(e: &EndpointSpec, link: &Link, scope: &Scope<'_>) -> Option<String> {
    if scope.not_pods.contains(&link.name) {
        return Some(format!("{} is one of the node's own devices", link.name));
    }
    match link.kind.as_deref() {
        Some("veth") => {}
        Some("netkit") if link.netkit_primary => {}
        Some("netkit") => {
            return Some(format!(
                "{} is a netkit pair's peer, not its primary (the host side)",
                link.name
            ));
        }
        kind => {
            return Some(format!(
                "{} is a {}, not a pod's veth or netkit device",
                link.name,
                kind.unwrap_or("device")
            ));
        }
    }
    if link.peer_netns.is_none() {
        return Some(format!(
            "{}'s other end is not in another network namespace",
            link.name
        ));
    }
    let inside = match e.ip {
        IpAddr::V4(a) => scope.subnets.v4.is_some_and(|s| s.contains(&a)),
        IpAddr::V6(a) => scope.subnets.v6.is_some_and(|s| s.contains(&a)),
    };
    if !inside {
        return Some(format!("{} is not in this node's pod subnets", e.ip));
    }
    None
}

/// The endpoints to program, by address: of the registrations that are
/// fit, the newest of each address. Registrations whose veth is gone (by
/// index and name) go to `out.gone`, unfit ones to `out.rejected`.
fn choose<'a>(
    want: &'a [EndpointSpec],
    links: &HashMap<u32, Link>,
    scope: &Scope<'_>,
    out: &mut EndpointSync,
) -> HashMap<IpAddr, &'a EndpointSpec> {
    let mut chosen: HashMap<IpAddr, &EndpointSpec> = HashMap::new();
    for e in want {
        let Some(link) = links.get(&e.host_ifindex).filter(|l| l.name == e.host_if) else {
            if !out.gone.contains(&e.owner) {
                out.gone.push(e.owner.clone());
            }
            continue;
        };
        if let Some(why) = unfit(e, link, scope) {
            out.rejected.push((e.owner.clone(), why));
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

/// Where a pod device's transmit program goes: a veth's host side at TC
/// ingress, a netkit pair at its peer hook (run in the pod's own transmit).
fn pod_hook(link: &Link) -> Hook {
    if link.kind.as_deref() == Some("netkit") {
        Hook::NetkitPeer
    } else {
        Hook::TcIngress
    }
}

pub(crate) struct Endpoints {
    /// The transmit program on pods' devices: `weft_from_pod`, or the
    /// wireguard backend's `weft_from_pod_wg`.
    program: &'static str,
    /// The pod devices whose transmit program this run attached (index ->
    /// name and hook).
    attached: HashMap<u32, (String, Hook)>,
    /// Rejections already reported (owner -> why), so each is logged once.
    reported: BTreeMap<String, String>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Self::with_program(program_names::FROM_POD)
    }
}

impl Endpoints {
    /// Endpoints whose pods' devices get `program`.
    pub(crate) fn with_program(program: &'static str) -> Self {
        Self {
            program,
            attached: HashMap::new(),
            reported: BTreeMap::new(),
        }
    }

    /// Makes the pinned maps and the veths' programs exactly what the fit
    /// registrations in `want` ask for.
    pub(crate) async fn sync(
        &mut self,
        want: &[EndpointSpec],
        map: &mut EndpointMap,
        loaded: &mut Loaded,
        pins: &PinDir,
        nl: &Netlink,
        scope: &Scope<'_>,
    ) -> Result<EndpointSync> {
        let links: HashMap<u32, Link> = nl
            .links()
            .await?
            .into_iter()
            .map(|l| (l.index, l))
            .collect();
        let mut out = EndpointSync::default();
        let chosen = choose(want, &links, scope, &mut out);
        self.report(&out.rejected);

        // The maps: what is there against what should be, whoever wrote
        // it. Stale entries go first, so an address never points at two
        // places.
        let want_eps: HashMap<IpAddr, Endpoint> =
            chosen.iter().map(|(ip, e)| (*ip, e.entry())).collect();
        let want_ifs = pod_ifs(chosen.values().copied());
        let have_eps = map.all()?;
        let have_ifs = map.pod_ifs()?;
        let mut failed = 0usize;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                failed += 1;
                tracing::warn!(error = %format!("{e:#}"), "cannot update an endpoint entry; retrying at the next sync");
            }
        };
        for (ip, ep) in &have_eps {
            if !want_eps.contains_key(ip) {
                tracing::debug!(%ip, ifindex = ep.ifindex, "endpoint removed");
                note(map.remove(*ip));
            }
        }
        for (ifindex, _) in have_ifs.iter().filter(|(i, _)| !want_ifs.contains_key(i)) {
            note(map.remove_pod_if(*ifindex));
        }
        for (ifindex, p) in &want_ifs {
            if have_ifs.get(ifindex) != Some(p) {
                note(map.set_pod_if(*ifindex, p));
            }
        }
        for (ip, ep) in &want_eps {
            if have_eps.get(ip) != Some(ep) {
                let e = chosen[ip];
                tracing::debug!(%ip, veth = %e.host_if, owner = %e.owner, "endpoint programmed");
                note(map.set(*ip, ep));
            }
        }

        // The programs: on every veth that serves an endpoint, once per run
        // (a link pinned by an earlier run is adopted).
        let serving: HashMap<u32, (&str, Hook)> = chosen
            .values()
            .map(|e| {
                let hook = links.get(&e.host_ifindex).map_or(Hook::TcIngress, pod_hook);
                (e.host_ifindex, (e.host_if.as_str(), hook))
            })
            .collect();
        self.attached
            .retain(|i, (name, hook)| serving.get(i) == Some(&(name.as_str(), *hook)));
        for (ifindex, (name, hook)) in &serving {
            if self.attached.contains_key(ifindex) {
                continue;
            }
            match loaded.attach_tc(self.program, name, *hook) {
                Ok(a) => {
                    tracing::debug!(device = %name, hook = hook.name(), adopted = a.adopted, "host routing on a pod's device");
                    self.attached.insert(*ifindex, (name.to_string(), *hook));
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(veth = %name, error = %format!("{e:#}"), "cannot attach host routing to a pod's veth; retrying at the next sync");
                }
            }
        }
        // Programs on veths that serve no endpoint (a pod gone while the
        // agent was away) are removed; pins of vanished devices too.
        for (hook, iface, ifindex) in links::pinned_links(pins)? {
            // Only pods' links: not the uplink's, not the IPv6 overlay
            // device's (its ingress program checks what the kernel
            // decapsulated).
            if !matches!(hook, Hook::TcIngress | Hook::NetkitPeer)
                || scope.not_pods.contains(&iface)
            {
                continue;
            }
            let exists = links.get(&ifindex).is_some_and(|l| l.name == iface);
            // A netkit pair whose program went would drop all its pod
            // sends (its peer's default policy): the program stays while
            // the device does; it passes a pod it does not know to the
            // stack.
            let keep = exists && hook == Hook::NetkitPeer;
            if !keep && (!exists || serving.get(&ifindex) != Some(&(iface.as_str(), hook))) {
                links::detach(pins, hook, &iface)?;
            }
        }
        if failed > 0 {
            tracing::debug!(failed, "endpoint sync incomplete");
        }
        out.active = chosen.len();
        Ok(out)
    }

    /// Logs each rejection once (and again if its reason changes).
    fn report(&mut self, rejected: &[(String, String)]) {
        let now: BTreeMap<String, String> = rejected.iter().cloned().collect();
        for (owner, why) in &now {
            if self.reported.get(owner) != Some(why) {
                tracing::warn!(
                    owner,
                    why,
                    "a pod's registration is not fit for host routing: its pod takes the host stack"
                );
            }
        }
        self.reported = now;
    }

    /// Attaches the program again on any served veth that lost it (its
    /// link unpinned or detached); returns on how many.
    pub(crate) fn heal(&mut self, loaded: &mut Loaded) -> usize {
        let mut n = 0;
        for (name, hook) in self.attached.values() {
            if links::ifindex(name).is_err() {
                // The pod is going: the next sync forgets it.
                continue;
            }
            let a = Attachment {
                program: self.program,
                iface: name.clone(),
                hook: *hook,
                xdp_mode: None,
                adopted: false,
            };
            let r = loaded.is_attached(&a).and_then(|attached| {
                if attached {
                    Ok(false)
                } else {
                    loaded.attach_tc(self.program, name, *hook).map(|_| true)
                }
            });
            match r {
                Ok(true) => n += 1,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(veth = %name, error = %format!("{err:#}"), "cannot check or attach host routing on a pod's veth")
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

    fn link(index: u32, name: &str, kind: &str, peer: Option<i32>) -> (u32, Link) {
        (
            index,
            Link {
                index,
                name: name.into(),
                mtu: 1450,
                mac: [2, 0, 0, 0, 0, index as u8],
                up: true,
                arp: true,
                kind: Some(kind.into()),
                xdp: None,
                peer_netns: peer,
                netkit_primary: false,
            },
        )
    }

    fn scope(not_pods: &[String]) -> Scope<'_> {
        Scope {
            not_pods,
            subnets: Subnets {
                v4: Some("10.5.1.0/24".parse().unwrap()),
                v6: None,
            },
        }
    }

    #[test]
    fn the_newest_registration_of_an_address_wins_and_vanished_veths_are_gone() {
        let links: HashMap<u32, Link> = [
            link(10, "vethA", "veth", Some(1)),
            link(11, "vethB", "veth", Some(2)),
            link(12, "vethC", "veth", Some(3)),
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
        let mut out = EndpointSync::default();
        let chosen = choose(&want, &links, &scope(&[]), &mut out);
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 2])].owner, "b");
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 3])].owner, "c");
        assert_eq!(chosen.len(), 2);
        assert_eq!(out.gone, ["d", "e"]);
        assert!(out.rejected.is_empty());
        // Order of registration does not matter.
        let mut rev = want.clone();
        rev.reverse();
        let chosen = choose(&rev, &links, &scope(&[]), &mut EndpointSync::default());
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 2])].owner, "b");
    }

    #[test]
    fn bridges_own_devices_local_veths_and_foreign_addresses_are_rejected() {
        let not_pods = ["eth0".to_string()];
        let links: HashMap<u32, Link> = [
            link(3, "cbr0", "bridge", None),
            link(4, "eth0", "veth", Some(9)),
            link(5, "vethL", "veth", None),
            link(6, "vethF", "veth", Some(1)),
            link(7, "vethOk", "veth", Some(2)),
        ]
        .into_iter()
        .collect();
        let want = vec![
            ep("bridge", [10, 5, 1, 2], "cbr0", 3, 1),
            ep("uplink", [10, 5, 1, 3], "eth0", 4, 1),
            ep("local", [10, 5, 1, 4], "vethL", 5, 1),
            ep("foreign", [10, 6, 0, 1], "vethF", 6, 1),
            ep("ok", [10, 5, 1, 9], "vethOk", 7, 1),
        ];
        let mut links = links;
        let (i, mut primary) = link(8, "nk1", "netkit", Some(3));
        primary.netkit_primary = true;
        links.insert(i, primary);
        links.extend([link(9, "nk1p", "netkit", Some(4))]);
        let mut want = want;
        want.extend([
            ep("netkit", [10, 5, 1, 10], "nk1", 8, 1),
            ep("netkit-peer", [10, 5, 1, 11], "nk1p", 9, 1),
        ]);
        let mut out = EndpointSync::default();
        let chosen = choose(&want, &links, &scope(&not_pods), &mut out);
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 9])].owner, "ok");
        assert_eq!(chosen[&IpAddr::from([10, 5, 1, 10])].owner, "netkit");
        assert_eq!(pod_hook(&links[&8]), Hook::NetkitPeer);
        assert_eq!(pod_hook(&links[&7]), Hook::TcIngress);
        let rejected: Vec<&str> = out.rejected.iter().map(|(o, _)| o.as_str()).collect();
        assert_eq!(
            rejected,
            ["bridge", "uplink", "local", "foreign", "netkit-peer"]
        );
        assert!(out.rejected[4].1.contains("peer"), "{:?}", out.rejected);
        assert!(out.rejected[0].1.contains("bridge"), "{:?}", out.rejected);
        assert!(out.rejected[3].1.contains("10.6.0.1"), "{:?}", out.rejected);
    }

    #[test]
    fn a_veth_sends_from_its_lowest_address_of_each_family() {
        let mut a = ep("a", [10, 5, 1, 7], "vethA", 10, 1);
        let b = ep("a", [10, 5, 1, 3], "vethA", 10, 1);
        let c = ep("c", [10, 5, 1, 4], "vethC", 11, 1);
        let ifs = pod_ifs([&a, &b, &c]);
        assert_eq!(ifs[&10].ip4_be.to_ne_bytes(), [10, 5, 1, 3]);
        assert_eq!(ifs[&10].flags, POD_IF_V4);
        assert_eq!(ifs[&11].ip4_be.to_ne_bytes(), [10, 5, 1, 4]);
        a.ip = "fd00::5".parse().unwrap();
        let ifs = pod_ifs([&a, &b]);
        assert_eq!(ifs[&10].flags, POD_IF_V4 | POD_IF_V6);
        assert_eq!(
            ifs[&10].ip6,
            "fd00::5".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
    }
}
