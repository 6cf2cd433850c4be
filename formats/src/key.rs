//! Subnet lease keys: `<prefix>/subnets/10.244.34.0-24`, or for dual-stack
//! leases flannel's `10.244.34.0-24&fd00:12:13::-56`. flannel names an
//! IPv6-only lease `0.0.0.0-0&fd00:12:13::-56`: its IPv4 half is empty.

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};

use super::pool::Net as _;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?} is not a subnet key (like 10.244.34.0-24)")]
pub struct KeyError(String);

/// The subnets one lease holds: an IPv4 subnet, an IPv6 subnet, or both
/// (dual-stack). A key always names at least one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subnets {
    pub v4: Option<Ipv4Net>,
    pub v6: Option<Ipv6Net>,
}

impl Subnets {
    pub fn v4(subnet: Ipv4Net) -> Self {
        Self {
            v4: Some(subnet),
            v6: None,
        }
    }

    /// The key suffix flannel writes for these subnets.
    pub fn key(&self) -> String {
        let v4 = self
            .v4
            .map_or_else(|| "0.0.0.0-0".to_string(), |s| to_key(&s));
        match self.v6 {
            None => v4,
            Some(s) => format!("{v4}&{}-{}", s.network(), s.prefix_len()),
        }
    }

    /// Whether any subnet of one overlaps the other's of the same family.
    pub fn overlaps(&self, other: &Subnets) -> bool {
        let v4 = matches!((self.v4, other.v4), (Some(a), Some(b)) if a.overlaps(&b));
        let v6 = matches!((self.v6, other.v6), (Some(a), Some(b)) if a.overlaps(&b));
        v4 || v6
    }

    /// Whether `net` overlaps our subnet of its family.
    pub fn overlaps_net(&self, net: &ipnet::IpNet) -> bool {
        match net {
            ipnet::IpNet::V4(n) => self.v4.is_some_and(|o| o.overlaps(n)),
            ipnet::IpNet::V6(n) => self.v6.is_some_and(|o| o.overlaps(n)),
        }
    }
}

impl From<Ipv4Net> for Subnets {
    fn from(s: Ipv4Net) -> Self {
        Subnets::v4(s)
    }
}

impl fmt::Display for Subnets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.v4, self.v6) {
            (Some(a), Some(b)) => write!(f, "{a}+{b}"),
            (Some(a), None) => write!(f, "{a}"),
            (None, Some(b)) => write!(f, "{b}"),
            (None, None) => write!(f, "-"),
        }
    }
}

/// The key suffix of an IPv4 subnet (`10.244.34.0-24`).
pub fn to_key(subnet: &Ipv4Net) -> String {
    format!("{}-{}", subnet.network(), subnet.prefix_len())
}

/// Parses a key suffix. Addresses must be network addresses (no host
/// bits), as flannel writes them; `0.0.0.0-0` before an IPv6 half is
/// flannel's empty IPv4 half.
pub fn parse_key(key: &str) -> Result<Subnets, KeyError> {
    let bad = || KeyError(key.to_string());
    let (v4, v6) = match key.split_once('&') {
        Some((a, b)) => (a, Some(b)),
        None => (key, None),
    };
    let (a, l) = v4.rsplit_once('-').ok_or_else(bad)?;
    let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
    let len: u8 = l.parse().map_err(|_| bad())?;
    let v4 = Ipv4Net::new(addr, len).map_err(|_| bad())?;
    if v4.network() != addr {
        return Err(bad());
    }
    let v6 = match v6 {
        None => None,
        Some(s) => {
            let (a, l) = s.rsplit_once('-').ok_or_else(bad)?;
            let addr: Ipv6Addr = a.parse().map_err(|_| bad())?;
            let len: u8 = l.parse().map_err(|_| bad())?;
            let net = Ipv6Net::new(addr, len).map_err(|_| bad())?;
            if net.network() != addr {
                return Err(bad());
            }
            Some(net)
        }
    };
    let empty_v4 = v4.prefix_len() == 0 && v6.is_some();
    Ok(Subnets {
        v4: (!empty_v4).then_some(v4),
        v6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_dual_stack_keys_parse() {
        let n: Ipv4Net = "10.244.34.0/24".parse().unwrap();
        assert_eq!(to_key(&n), "10.244.34.0-24");
        assert_eq!(parse_key("10.244.34.0-24").unwrap(), Subnets::v4(n));
        let d = parse_key("10.244.34.0-24&fd00:12:13::-56").unwrap();
        assert_eq!(d.v4, Some(n));
        assert_eq!(d.v6, Some("fd00:12:13::/56".parse().unwrap()));
        assert_eq!(d.key(), "10.244.34.0-24&fd00:12:13::-56");
        // flannel's IPv6-only key: the IPv4 half is empty.
        let v6only = parse_key("0.0.0.0-0&fd00:12:13::-56").unwrap();
        assert_eq!(v6only.v4, None);
        assert_eq!(v6only.key(), "0.0.0.0-0&fd00:12:13::-56");
        // A supernet key alone is IPv4 (and outside any network).
        assert_eq!(
            parse_key("0.0.0.0-0").unwrap().v4,
            Some("0.0.0.0/0".parse().unwrap())
        );
        for bad in [
            "10.244.34.1-24",
            "garbage",
            "10.244.34.0_24",
            "10.244.34.0-33",
            "10.244.34.0-24&fd00::1-56",
            "10.244.34.0-24&fd00::-129",
            "",
        ] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subnets_overlap_per_family() {
        let a = parse_key("10.244.1.0-24&fd00:0:0:1::-64").unwrap();
        let b = parse_key("10.244.2.0-24&fd00:0:0:1::-64").unwrap();
        let c = parse_key("10.244.2.0-24&fd00:0:0:2::-64").unwrap();
        assert!(a.overlaps(&b), "same IPv6 half");
        assert!(b.overlaps(&c), "same IPv4 half");
        assert!(!a.overlaps(&c));
        assert!(!a.overlaps(&parse_key("0.0.0.0-0&fd00:0:0:2::-64").unwrap()));
    }
}
