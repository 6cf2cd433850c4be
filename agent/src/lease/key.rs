//! Subnet lease keys: `<prefix>/subnets/10.244.34.0-24`, or for dual-stack
//! leases flannel's `10.244.34.0-24&fd00:12:13::-56`.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?} is not a subnet key (like 10.244.34.0-24)")]
pub struct KeyError(String);

/// The subnets a key names: the IPv4 subnet, and the IPv6 subnet of a
/// dual-stack key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubnetKey {
    pub v4: Ipv4Net,
    pub v6: Option<Ipv6Net>,
}

/// The key suffix of an IPv4 subnet (`10.244.34.0-24`).
pub fn to_key(subnet: &Ipv4Net) -> String {
    format!("{}-{}", subnet.network(), subnet.prefix_len())
}

/// Parses a key suffix. The address must be the network address (no host
/// bits), as flannel writes it.
pub fn parse_key(key: &str) -> Result<SubnetKey, KeyError> {
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
    Ok(SubnetKey { v4, v6 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_dual_stack_keys_parse() {
        let n: Ipv4Net = "10.244.34.0/24".parse().unwrap();
        assert_eq!(to_key(&n), "10.244.34.0-24");
        assert_eq!(parse_key("10.244.34.0-24").unwrap().v4, n);
        let d = parse_key("10.244.34.0-24&fd00:12:13::-56").unwrap();
        assert_eq!(d.v4, n);
        assert_eq!(d.v6, Some("fd00:12:13::/56".parse().unwrap()));
        for bad in [
            "10.244.34.1-24",
            "garbage",
            "10.244.34.0_24",
            "10.244.34.0-33",
            "10.244.34.0-24&fd00::1-56",
            "",
        ] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }
}
