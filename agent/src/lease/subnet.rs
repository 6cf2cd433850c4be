//! IPv4 subnets and their etcd key form (`10.244.34.0-24`).

use std::{fmt, net::Ipv4Addr, str::FromStr};

use thiserror::Error;

/// An IPv4 network: a canonical address (no host bits) and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    addr: u32,
    prefix_len: u8,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum NetError {
    #[error("{0:?} is not an IPv4 network in CIDR form (like 10.244.0.0/16)")]
    Syntax(String),
    #[error("prefix length {0} is out of range 0..=32")]
    PrefixLen(u8),
    #[error("{net} has host bits set; the network address is {canonical}")]
    HostBits { net: String, canonical: String },
    #[error("{0:?} is not a subnet key (like 10.244.34.0-24)")]
    Key(String),
}

const fn mask(prefix_len: u8) -> u32 {
    if prefix_len == 0 {
        0
    } else {
        u32::MAX << (32 - prefix_len)
    }
}

impl Ipv4Net {
    /// A network from an address without host bits.
    pub fn new(addr: Ipv4Addr, prefix_len: u8) -> Result<Self, NetError> {
        if prefix_len > 32 {
            return Err(NetError::PrefixLen(prefix_len));
        }
        let a = u32::from(addr);
        if a & !mask(prefix_len) != 0 {
            return Err(NetError::HostBits {
                net: format!("{addr}/{prefix_len}"),
                canonical: format!("{}/{prefix_len}", Ipv4Addr::from(a & mask(prefix_len))),
            });
        }
        Ok(Self {
            addr: a,
            prefix_len,
        })
    }

    /// The network that contains `addr`.
    pub fn containing(addr: Ipv4Addr, prefix_len: u8) -> Self {
        let prefix_len = prefix_len.min(32);
        Self {
            addr: u32::from(addr) & mask(prefix_len),
            prefix_len,
        }
    }

    pub fn addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.addr)
    }

    pub fn addr_u32(&self) -> u32 {
        self.addr
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    pub fn mask(&self) -> u32 {
        mask(self.prefix_len)
    }

    /// Number of addresses.
    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix_len as u32)
    }

    /// The last address (broadcast).
    pub fn last(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.addr | !self.mask())
    }

    /// The first usable address: the gateway on a node's pod bridge, and
    /// what flannel writes as FLANNEL_SUBNET.
    pub fn first_host(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.addr.wrapping_add(1))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == self.addr
    }

    pub fn contains_net(&self, other: &Ipv4Net) -> bool {
        other.prefix_len >= self.prefix_len && self.contains(other.addr())
    }

    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        self.contains_net(other) || other.contains_net(self)
    }

    /// The etcd key suffix flannel uses: `10.244.34.0-24`.
    pub fn to_key(&self) -> String {
        format!("{}-{}", self.addr(), self.prefix_len)
    }

    /// Parses a lease key's suffix. Dual-stack keys (`10.244.34.0-24&fd00::-56`)
    /// yield their IPv4 part.
    pub fn from_key(key: &str) -> Result<Self, NetError> {
        let v4 = key.split('&').next().unwrap_or_default();
        let (a, l) = v4
            .rsplit_once('-')
            .ok_or_else(|| NetError::Key(key.to_string()))?;
        let addr: Ipv4Addr = a.parse().map_err(|_| NetError::Key(key.to_string()))?;
        let len: u8 = l.parse().map_err(|_| NetError::Key(key.to_string()))?;
        Self::new(addr, len).map_err(|_| NetError::Key(key.to_string()))
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix_len)
    }
}

impl FromStr for Ipv4Net {
    type Err = NetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| NetError::Syntax(s.to_string()))?;
        let addr: Ipv4Addr = a.parse().map_err(|_| NetError::Syntax(s.to_string()))?;
        let len: u8 = l.parse().map_err(|_| NetError::Syntax(s.to_string()))?;
        Self::new(addr, len)
    }
}

impl serde::Serialize for Ipv4Net {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        let n: Ipv4Net = "10.244.0.0/16".parse().unwrap();
        assert_eq!(n.to_string(), "10.244.0.0/16");
        assert_eq!(n.size(), 65536);
        assert_eq!(n.last(), Ipv4Addr::new(10, 244, 255, 255));
        assert_eq!(n.first_host(), Ipv4Addr::new(10, 244, 0, 1));
        assert!(n.contains(Ipv4Addr::new(10, 244, 3, 4)));
        assert!(!n.contains(Ipv4Addr::new(10, 245, 0, 0)));
    }

    #[test]
    fn rejects_bad_networks_with_clear_errors() {
        assert!(matches!(
            "10.244.0.0".parse::<Ipv4Net>(),
            Err(NetError::Syntax(_))
        ));
        assert!(matches!(
            "10.244.0.0/33".parse::<Ipv4Net>(),
            Err(NetError::PrefixLen(33))
        ));
        let err = "10.244.1.0/16".parse::<Ipv4Net>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "10.244.1.0/16 has host bits set; the network address is 10.244.0.0/16"
        );
    }

    #[test]
    fn keys_round_trip_and_dual_stack_keys_parse() {
        let n: Ipv4Net = "10.244.34.0/24".parse().unwrap();
        assert_eq!(n.to_key(), "10.244.34.0-24");
        assert_eq!(Ipv4Net::from_key("10.244.34.0-24").unwrap(), n);
        assert_eq!(
            Ipv4Net::from_key("10.244.34.0-24&fd00:12:13::-56").unwrap(),
            n
        );
        assert!(Ipv4Net::from_key("10.244.34.1-24").is_err());
        assert!(Ipv4Net::from_key("garbage").is_err());
        assert!(Ipv4Net::from_key("10.244.34.0_24").is_err());
    }

    #[test]
    fn overlap() {
        let a: Ipv4Net = "10.244.0.0/16".parse().unwrap();
        let b: Ipv4Net = "10.244.4.0/24".parse().unwrap();
        let c: Ipv4Net = "10.245.4.0/24".parse().unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
    }
}
