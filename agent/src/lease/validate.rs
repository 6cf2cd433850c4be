//! What a peer lease must be before it reaches a map or a route.
//!
//! Everything under the subnets prefix is untrusted input: any client with
//! write access can put anything there. A lease becomes a peer only if its
//! subnet is one this network can hand out and its VTEP is a plausible
//! remote node; everything else is rejected with a reason, never fatal.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;

use super::{
    acquire::Identity,
    attrs::{LeaseAttrs, VxlanData},
    config::NetworkConfig,
    key::Subnets,
};
use crate::{mac::MacAddr, peer::Peer, wgkey::WgKey};

/// Why a lease is not programmed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Rejection {
    /// Not a vxlan lease.
    Backend(String),
    /// The VNI in the backend data is not the network's.
    Vni(u32),
    /// Bad or missing vxlan backend data.
    BackendData(String),
    /// The subnet is not inside `Network`.
    OutsideNetwork,
    /// The subnet's prefix length is not `SubnetLen`.
    SubnetLen(u8),
    /// The subnet overlaps this node's own subnet.
    OverlapsOwn,
    /// The subnet overlaps an older lease (named by its key).
    OverlapsPeer(String),
    /// The PublicIP (or PublicIPv6) is not a unicast address a node can
    /// have.
    PublicIp(IpAddr),
    /// The PublicIP lies inside `Network` (PublicIPv6: `IPv6Network`).
    PublicIpInNetwork(IpAddr),
    /// The PublicIP is this node's own (another node claims our address).
    PublicIpOurs(IpAddr),
    /// An older lease of another node has this PublicIP (named by its key).
    PublicIpTaken(String),
    /// The VtepMAC is not a unicast MAC.
    VtepMac(MacAddr),
    /// The wireguard lease's PublicKey is not a key.
    PublicKey(String),
    /// An older lease of another node has this public key (named by its
    /// key).
    PublicKeyTaken(String),
}

impl Rejection {
    /// Every metric label, for a complete `weft_leases_rejected` series.
    pub(crate) const REASONS: [&'static str; 14] = [
        "backend",
        "vni",
        "backend_data",
        "outside_network",
        "subnet_len",
        "overlaps_own",
        "overlaps_peer",
        "public_ip",
        "public_ip_in_network",
        "public_ip_ours",
        "public_ip_taken",
        "vtep_mac",
        "public_key",
        "public_key_taken",
    ];

    /// The `reason` label of `weft_leases_rejected`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Rejection::Backend(_) => "backend",
            Rejection::Vni(_) => "vni",
            Rejection::BackendData(_) => "backend_data",
            Rejection::OutsideNetwork => "outside_network",
            Rejection::SubnetLen(_) => "subnet_len",
            Rejection::OverlapsOwn => "overlaps_own",
            Rejection::OverlapsPeer(_) => "overlaps_peer",
            Rejection::PublicIp(_) => "public_ip",
            Rejection::PublicIpInNetwork(_) => "public_ip_in_network",
            Rejection::PublicIpOurs(_) => "public_ip_ours",
            Rejection::PublicIpTaken(_) => "public_ip_taken",
            Rejection::VtepMac(_) => "vtep_mac",
            Rejection::PublicKey(_) => "public_key",
            Rejection::PublicKeyTaken(_) => "public_key_taken",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Backend(b) => write!(f, "backend {b:?} is not this network's"),
            Rejection::Vni(v) => write!(f, "VNI {v} is not this network's"),
            Rejection::BackendData(e) => write!(f, "{e}"),
            Rejection::OutsideNetwork => {
                write!(
                    f,
                    "the subnet is outside the network (or of a family it does not have)"
                )
            }
            Rejection::SubnetLen(l) => {
                write!(f, "prefix length /{l} is not the network's SubnetLen")
            }
            Rejection::OverlapsOwn => write!(f, "the subnet overlaps this node's own subnet"),
            Rejection::OverlapsPeer(k) => write!(f, "the subnet overlaps the older lease {k}"),
            Rejection::PublicIp(ip) => {
                write!(f, "{} {ip} is not a unicast node address", field(ip))
            }
            Rejection::PublicIpInNetwork(ip) => {
                write!(f, "{} {ip} lies inside the pod network", field(ip))
            }
            Rejection::PublicIpOurs(ip) => {
                write!(f, "{} {ip} is this node's own address", field(ip))
            }
            Rejection::PublicIpTaken(k) => {
                write!(f, "PublicIP belongs to another node's older lease {k}")
            }
            Rejection::VtepMac(m) => write!(f, "VtepMAC {m} is not a unicast MAC"),
            Rejection::PublicKey(e) => write!(f, "{e}"),
            Rejection::PublicKeyTaken(k) => {
                write!(f, "PublicKey belongs to another node's older lease {k}")
            }
        }
    }
}

/// The lease field an address comes from.
fn field(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "PublicIP"
    } else {
        "PublicIPv6"
    }
}

/// Whether `ip` can be a node's address: unicast, not loopback, not
/// unspecified, not "this network" (0/8), not multicast, not reserved
/// (240/4) or broadcast.
pub(super) fn is_node_address(ip: Ipv4Addr) -> bool {
    let first = ip.octets()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_broadcast()
        || first == 0
        || first >= 240)
}

/// Whether `ip` can be a node's IPv6 address: unicast with a scope beyond
/// the link (a VTEP is reached through routing, without an interface to
/// qualify a link-local address), not an IPv4-mapped address.
pub(super) fn is_node_address6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || s[0] & 0xffc0 == 0xfe80
        || ip.to_ipv4_mapped().is_some())
}

/// The unicast check on a VTEP MAC.
fn unicast_mac(data: &VxlanData) -> Result<MacAddr, Rejection> {
    let mac = data.vtep_mac;
    if mac.0[0] & 1 != 0 || mac.0 == [0; 6] {
        return Err(Rejection::VtepMac(mac));
    }
    Ok(mac)
}

/// What one family's backend data gives a peer: the vxlan backend's VTEP
/// MAC (its VNI checked), or the wireguard backend's public key.
fn link(
    attrs: &LeaseAttrs,
    config: &NetworkConfig,
    v6: bool,
) -> Result<(MacAddr, Option<WgKey>), Rejection> {
    if config.wireguard.is_some() {
        let data = attrs
            .wireguard_data(v6)
            .map_err(|e| Rejection::BackendData(e.to_string()))?;
        let key = data.key().map_err(Rejection::PublicKey)?;
        return Ok((MacAddr([0; 6]), Some(key)));
    }
    let data = if v6 {
        attrs.vxlan_v6_data()
    } else {
        attrs.vxlan_data()
    }
    .map_err(|e| Rejection::BackendData(e.to_string()))?;
    if data.vni != config.vni {
        return Err(Rejection::Vni(data.vni));
    }
    Ok((unicast_mac(&data)?, None))
}

/// The checks that depend on one lease alone (and the config, and who we
/// are when known): the peers it makes, one per address family the network
/// and the lease both have. Overlaps between leases are decided by the
/// caller.
pub(super) fn check(
    subnets: &Subnets,
    attrs: &LeaseAttrs,
    config: &NetworkConfig,
    me: Option<&Identity>,
) -> Result<Vec<Peer>, Rejection> {
    let backend = if config.wireguard.is_some() {
        "wireguard"
    } else {
        "vxlan"
    };
    if attrs.backend_type != backend {
        return Err(Rejection::Backend(attrs.backend_type.to_string()));
    }
    let mut peers = Vec::new();
    if let Some(subnet) = subnets.v4 {
        let Some(pool) = &config.ipv4 else {
            return Err(Rejection::OutsideNetwork);
        };
        let link = link(attrs, config, false)?;
        if !pool.network.contains(&subnet) {
            return Err(Rejection::OutsideNetwork);
        }
        if subnet.prefix_len() != pool.subnet_len {
            return Err(Rejection::SubnetLen(subnet.prefix_len()));
        }
        let ip = attrs.public_ip;
        if !is_node_address(ip) {
            return Err(Rejection::PublicIp(ip.into()));
        }
        if pool.network.contains(&ip) {
            return Err(Rejection::PublicIpInNetwork(ip.into()));
        }
        if me.is_some_and(|m| m.public_ip == Some(ip)) {
            return Err(Rejection::PublicIpOurs(ip.into()));
        }
        peers.push(Peer {
            subnet: IpNet::V4(subnet),
            vtep: ip.into(),
            mac: link.0,
            key: link.1,
            since: 0,
        });
    }
    if let (Some(subnet), Some(pool)) = (subnets.v6, &config.ipv6) {
        let link = link(attrs, config, true)?;
        if !pool.network.contains(&subnet) {
            return Err(Rejection::OutsideNetwork);
        }
        if subnet.prefix_len() != pool.subnet_len {
            return Err(Rejection::SubnetLen(subnet.prefix_len()));
        }
        let Some(ip) = attrs.public_ipv6 else {
            return Err(Rejection::BackendData(
                "an IPv6 subnet without PublicIPv6".into(),
            ));
        };
        if !is_node_address6(ip) {
            return Err(Rejection::PublicIp(ip.into()));
        }
        if pool.network.contains(&ip) {
            return Err(Rejection::PublicIpInNetwork(ip.into()));
        }
        if me.is_some_and(|m| m.public_ipv6 == Some(ip)) {
            return Err(Rejection::PublicIpOurs(ip.into()));
        }
        peers.push(Peer {
            subnet: IpNet::V6(subnet),
            vtep: ip.into(),
            mac: link.0,
            key: link.1,
            since: 0,
        });
    }
    if peers.is_empty() {
        // An IPv6-only lease in a network without IPv6.
        return Err(Rejection::OutsideNetwork);
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::Ipv4Net;

    fn cfg() -> NetworkConfig {
        NetworkConfig::parse(br#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":7}}"#)
            .unwrap()
    }

    fn dual() -> NetworkConfig {
        NetworkConfig::parse(
            br#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:5::/56","Backend":{"Type":"vxlan","VNI":7}}"#,
        )
        .unwrap()
    }

    fn lease(ip: &str, mac: &str, vni: u32) -> LeaseAttrs {
        LeaseAttrs::parse(
            format!(r#"{{"PublicIP":"{ip}","BackendType":"vxlan","BackendData":{{"VNI":{vni},"VtepMAC":"{mac}"}}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    fn lease6(ip: &str, ip6: &str, mac: &str, vni: u32) -> LeaseAttrs {
        LeaseAttrs::parse(
            format!(r#"{{"PublicIP":"{ip}","PublicIPv6":"{ip6}","BackendType":"vxlan","BackendData":{{"VNI":7,"VtepMAC":"02:00:00:00:00:02"}},"BackendV6Data":{{"VNI":{vni},"VtepMAC":"{mac}"}}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    fn me() -> Identity {
        Identity {
            node_id: "me".into(),
            public_ip: Some("198.18.0.1".parse().unwrap()),
            public_ipv6: Some("fd00:18::1".parse().unwrap()),
        }
    }

    fn v4(s: &str) -> Subnets {
        Subnets::v4(s.parse::<Ipv4Net>().unwrap())
    }

    const KEY: &str = "x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g=";

    fn wg_cfg() -> NetworkConfig {
        NetworkConfig::parse(
            br#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:5::/56","Backend":{"Type":"wireguard"}}"#,
        )
        .unwrap()
    }

    fn wg_lease(data: &str, data6: &str) -> LeaseAttrs {
        LeaseAttrs::parse(
            format!(r#"{{"PublicIP":"198.18.0.2","PublicIPv6":"fd00:18::2","BackendType":"wireguard","BackendData":{data},"BackendV6Data":{data6}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn wireguard_leases_carry_a_key_per_family_and_a_bad_key_is_named() {
        let c = wg_cfg();
        let m = me();
        let s = super::super::key::parse_key("10.5.3.0-24&fd00:5:0:3::-64").unwrap();
        let good = format!(r#"{{"PublicKey":"{KEY}","Port":51820}}"#);
        let p = check(&s, &wg_lease(&good, &good), &c, Some(&m)).unwrap();
        assert_eq!(p.len(), 2);
        assert!(p.iter().all(|p| p.key.unwrap().to_string() == KEY));
        assert_eq!(p[1].vtep.to_string(), "fd00:18::2");
        for (data, data6, want) in [
            (
                r#"{"PublicKey":"AAAA"}"#.to_string(),
                good.clone(),
                "public_key",
            ),
            (
                good.clone(),
                r#"{"PublicKey":"x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1h="}"#.into(),
                "public_key",
            ),
            (r#"{"Key":"x"}"#.into(), good.clone(), "backend_data"),
            (r#""text""#.into(), good.clone(), "backend_data"),
        ] {
            let got = check(&s, &wg_lease(&data, &data6), &c, Some(&m)).unwrap_err();
            assert_eq!(got.name(), want, "{data} {data6}: {got}");
        }
        // A vxlan lease in a wireguard network, and the other way round.
        let vx = lease6("198.18.0.2", "fd00:18::2", "02:00:00:00:00:03", 7);
        assert_eq!(check(&s, &vx, &c, Some(&m)).unwrap_err().name(), "backend");
        let wg = wg_lease(&good, &good);
        assert_eq!(
            check(&s, &wg, &dual(), Some(&m)).unwrap_err().name(),
            "backend"
        );
    }

    #[test]
    fn accepts_an_honest_lease_and_names_every_rejection() {
        let c = cfg();
        let m = me();
        let ours = Some(&m);
        let s24 = v4("10.5.3.0/24");
        let good = lease("198.18.0.2", "02:00:00:00:00:02", 7);
        let p = check(&s24, &good, &c, ours).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].vtep.to_string(), "198.18.0.2");

        let cases: Vec<(Subnets, LeaseAttrs, &str)> = vec![
            (v4("127.0.0.0/8"), good.clone(), "outside_network"),
            (v4("0.0.0.0/1"), good.clone(), "outside_network"),
            (v4("10.5.3.0/25"), good.clone(), "subnet_len"),
            (s24, lease("127.0.0.1", "02:00:00:00:00:02", 7), "public_ip"),
            (s24, lease("0.0.0.0", "02:00:00:00:00:02", 7), "public_ip"),
            (s24, lease("224.0.0.5", "02:00:00:00:00:02", 7), "public_ip"),
            (
                s24,
                lease("255.255.255.255", "02:00:00:00:00:02", 7),
                "public_ip",
            ),
            (
                s24,
                lease("10.5.9.9", "02:00:00:00:00:02", 7),
                "public_ip_in_network",
            ),
            (
                s24,
                lease("198.18.0.1", "02:00:00:00:00:02", 7),
                "public_ip_ours",
            ),
            (s24, lease("198.18.0.2", "01:00:5e:00:00:01", 7), "vtep_mac"),
            (s24, lease("198.18.0.2", "00:00:00:00:00:00", 7), "vtep_mac"),
            (s24, lease("198.18.0.2", "02:00:00:00:00:02", 1), "vni"),
            // An IPv6-only lease where the network has no IPv6.
            (
                super::super::key::parse_key("0.0.0.0-0&fd00:5:0:3::-64").unwrap(),
                lease6("0.0.0.0", "fd00:18::2", "02:00:00:00:00:03", 7),
                "outside_network",
            ),
        ];
        for (subnet, attrs, want) in cases {
            let got = check(&subnet, &attrs, &c, ours).unwrap_err();
            assert_eq!(got.name(), want, "{subnet} {attrs:?}: {got}");
            assert!(Rejection::REASONS.contains(&got.name()));
        }
        let mut hostgw = good.clone();
        hostgw.backend_type = "host-gw".into();
        assert_eq!(
            check(&s24, &hostgw, &c, ours).unwrap_err().name(),
            "backend"
        );
        let nodata =
            LeaseAttrs::parse(br#"{"PublicIP":"198.18.0.2","BackendType":"vxlan"}"#).unwrap();
        assert_eq!(
            check(&s24, &nodata, &c, ours).unwrap_err().name(),
            "backend_data"
        );
    }

    #[test]
    fn dual_stack_leases_make_a_peer_per_family_and_ipv6_is_checked_too() {
        let c = dual();
        let m = me();
        let key = |k: &str| super::super::key::parse_key(k).unwrap();
        let both = key("10.5.3.0-24&fd00:5:0:3::-64");
        let good = lease6("198.18.0.2", "fd00:18::2", "02:00:00:00:00:03", 7);
        let p = check(&both, &good, &c, Some(&m)).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].subnet.to_string(), "fd00:5:0:3::/64");
        assert_eq!(p[1].vtep.to_string(), "fd00:18::2");
        assert_eq!(p[1].mac.to_string(), "02:00:00:00:00:03");
        // A flannel node without IPv6 in a dual-stack network: its IPv4 half.
        let p = check(
            &v4("10.5.4.0/24"),
            &lease("198.18.0.4", "02:00:00:00:00:04", 7),
            &c,
            Some(&m),
        )
        .unwrap();
        assert_eq!(p.len(), 1);

        let cases: Vec<(Subnets, LeaseAttrs, &str)> = vec![
            (
                key("10.5.3.0-24&fd01::-64"),
                good.clone(),
                "outside_network",
            ),
            (
                key("10.5.3.0-24&fd00:5:0:3::-65"),
                good.clone(),
                "subnet_len",
            ),
            (
                both,
                lease6("198.18.0.2", "::1", "02:00:00:00:00:03", 7),
                "public_ip",
            ),
            (
                both,
                lease6("198.18.0.2", "ff02::1", "02:00:00:00:00:03", 7),
                "public_ip",
            ),
            (
                both,
                lease6("198.18.0.2", "fe80::1", "02:00:00:00:00:03", 7),
                "public_ip",
            ),
            (
                both,
                lease6("198.18.0.2", "::ffff:198.18.0.2", "02:00:00:00:00:03", 7),
                "public_ip",
            ),
            (
                both,
                lease6("198.18.0.2", "fd00:5::9", "02:00:00:00:00:03", 7),
                "public_ip_in_network",
            ),
            (
                both,
                lease6("198.18.0.2", "fd00:18::1", "02:00:00:00:00:03", 7),
                "public_ip_ours",
            ),
            (
                both,
                lease6("198.18.0.2", "fd00:18::2", "33:33:00:00:00:01", 7),
                "vtep_mac",
            ),
            (
                both,
                lease6("198.18.0.2", "fd00:18::2", "02:00:00:00:00:03", 8),
                "vni",
            ),
            (
                both,
                good.clone().tap(|a| a.backend_v6_data = None),
                "backend_data",
            ),
            (
                both,
                good.clone().tap(|a| a.public_ipv6 = None),
                "backend_data",
            ),
        ];
        for (subnet, attrs, want) in cases {
            let got = check(&subnet, &attrs, &c, Some(&m)).unwrap_err();
            assert_eq!(got.name(), want, "{subnet} {attrs:?}: {got}");
        }
        assert!(
            check(
                &both,
                &lease6("198.18.0.2", "ff02::1", "02:00:00:00:00:03", 7),
                &c,
                Some(&m)
            )
            .unwrap_err()
            .to_string()
            .contains("PublicIPv6 ff02::1")
        );
    }

    trait Tap: Sized {
        fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
    }
    impl Tap for LeaseAttrs {
        fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
            f(&mut self);
            self
        }
    }
}
