//! What a peer lease must be before it reaches a map or a route.
//!
//! Everything under the subnets prefix is untrusted input: any client with
//! write access can put anything there. A lease becomes a peer only if its
//! subnet is one this network can hand out and its VTEP is a plausible
//! remote node; everything else is rejected with a reason, never fatal.

use std::{fmt, net::Ipv4Addr};

use ipnet::Ipv4Net;

use super::{attrs::LeaseAttrs, config::NetworkConfig};
use crate::{dataplane::Peer, mac::MacAddr};

/// Why a lease is not programmed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rejection {
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
    /// The PublicIP is not a unicast address a node can have.
    PublicIp,
    /// The PublicIP lies inside `Network`.
    PublicIpInNetwork,
    /// The PublicIP is this node's own (another node claims our address).
    PublicIpOurs,
    /// An older lease of another node has this PublicIP (named by its key).
    PublicIpTaken(String),
    /// The VtepMAC is not a unicast MAC.
    VtepMac(MacAddr),
}

impl Rejection {
    /// Every metric label, for a complete `weft_leases_rejected` series.
    pub const REASONS: [&'static str; 12] = [
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
    ];

    /// The `reason` label of `weft_leases_rejected`.
    pub fn name(&self) -> &'static str {
        match self {
            Rejection::Backend(_) => "backend",
            Rejection::Vni(_) => "vni",
            Rejection::BackendData(_) => "backend_data",
            Rejection::OutsideNetwork => "outside_network",
            Rejection::SubnetLen(_) => "subnet_len",
            Rejection::OverlapsOwn => "overlaps_own",
            Rejection::OverlapsPeer(_) => "overlaps_peer",
            Rejection::PublicIp => "public_ip",
            Rejection::PublicIpInNetwork => "public_ip_in_network",
            Rejection::PublicIpOurs => "public_ip_ours",
            Rejection::PublicIpTaken(_) => "public_ip_taken",
            Rejection::VtepMac(_) => "vtep_mac",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Backend(b) => write!(f, "backend {b:?} is not vxlan"),
            Rejection::Vni(v) => write!(f, "VNI {v} is not this network's"),
            Rejection::BackendData(e) => write!(f, "{e}"),
            Rejection::OutsideNetwork => write!(f, "the subnet is outside the network"),
            Rejection::SubnetLen(l) => {
                write!(f, "prefix length /{l} is not the network's SubnetLen")
            }
            Rejection::OverlapsOwn => write!(f, "the subnet overlaps this node's own subnet"),
            Rejection::OverlapsPeer(k) => write!(f, "the subnet overlaps the older lease {k}"),
            Rejection::PublicIp => write!(f, "PublicIP is not a unicast node address"),
            Rejection::PublicIpInNetwork => write!(f, "PublicIP lies inside the pod network"),
            Rejection::PublicIpOurs => write!(f, "PublicIP is this node's own address"),
            Rejection::PublicIpTaken(k) => {
                write!(f, "PublicIP belongs to another node's older lease {k}")
            }
            Rejection::VtepMac(m) => write!(f, "VtepMAC {m} is not a unicast MAC"),
        }
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

/// The checks that depend on one lease alone (and the config, and who we
/// are when known). Overlaps between leases are decided by the caller.
pub(super) fn check(
    subnet: &Ipv4Net,
    attrs: &LeaseAttrs,
    config: &NetworkConfig,
    our_ip: Option<Ipv4Addr>,
) -> Result<Peer, Rejection> {
    if attrs.backend_type != "vxlan" {
        return Err(Rejection::Backend(attrs.backend_type.clone()));
    }
    let data = attrs
        .vxlan_data()
        .map_err(|e| Rejection::BackendData(e.to_string()))?;
    if data.vni != config.vni {
        return Err(Rejection::Vni(data.vni));
    }
    if !config.network.contains(subnet) {
        return Err(Rejection::OutsideNetwork);
    }
    if subnet.prefix_len() != config.subnet_len {
        return Err(Rejection::SubnetLen(subnet.prefix_len()));
    }
    let ip = attrs.public_ip;
    if !is_node_address(ip) {
        return Err(Rejection::PublicIp);
    }
    if config.network.contains(&ip) {
        return Err(Rejection::PublicIpInNetwork);
    }
    if Some(ip) == our_ip {
        return Err(Rejection::PublicIpOurs);
    }
    let mac = data.vtep_mac;
    if mac.0[0] & 1 != 0 || mac.0 == [0; 6] {
        return Err(Rejection::VtepMac(mac));
    }
    Ok(Peer {
        subnet: *subnet,
        vtep: ip,
        mac,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NetworkConfig {
        NetworkConfig::parse(br#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":7}}"#)
            .unwrap()
    }

    fn lease(ip: &str, mac: &str, vni: u32) -> LeaseAttrs {
        LeaseAttrs::parse(
            format!(r#"{{"PublicIP":"{ip}","BackendType":"vxlan","BackendData":{{"VNI":{vni},"VtepMAC":"{mac}"}}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn accepts_an_honest_lease_and_names_every_rejection() {
        let c = cfg();
        let ours = Some("198.18.0.1".parse().unwrap());
        let s24: Ipv4Net = "10.5.3.0/24".parse().unwrap();
        let good = lease("198.18.0.2", "02:00:00:00:00:02", 7);
        let p = check(&s24, &good, &c, ours).unwrap();
        assert_eq!(p.vtep.to_string(), "198.18.0.2");

        let cases: Vec<(Ipv4Net, LeaseAttrs, &str)> = vec![
            (
                "127.0.0.0/8".parse().unwrap(),
                good.clone(),
                "outside_network",
            ),
            (
                "0.0.0.0/1".parse().unwrap(),
                good.clone(),
                "outside_network",
            ),
            ("10.5.3.0/25".parse().unwrap(), good.clone(), "subnet_len"),
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
}
