//! Ethernet MAC addresses as flannel writes them (`c6:d2:32:6f:8f:44`).

use std::{fmt, str::FromStr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a MAC address (like c6:d2:32:6f:8f:44)")]
pub struct MacError(String);

impl MacAddr {
    /// A stable, locally administered unicast MAC derived from `seed`, so a
    /// node's VTEP MAC survives restarts and device re-creation (flannel
    /// issue #1155: a MAC rewritten under the lease breaks peers).
    pub fn derived(seed: &[u8]) -> Self {
        // FNV-1a, 64 bit: small, stable across releases.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in seed {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let b = h.to_be_bytes();
        // Locally administered (bit 1), unicast (bit 0 clear).
        MacAddr([(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let p = parts.next().ok_or_else(|| MacError(s.to_string()))?;
            if p.len() != 2 {
                return Err(MacError(s.to_string()));
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| MacError(s.to_string()))?;
        }
        if parts.next().is_some() {
            return Err(MacError(s.to_string()));
        }
        Ok(MacAddr(out))
    }
}

impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let m: MacAddr = "c6:d2:32:6f:8f:44".parse().unwrap();
        assert_eq!(m.to_string(), "c6:d2:32:6f:8f:44");
        assert_eq!("C6:D2:32:6F:8F:44".parse::<MacAddr>().unwrap(), m);
        for bad in [
            "",
            "c6:d2:32:6f:8f",
            "c6:d2:32:6f:8f:44:00",
            "c6-d2-32-6f-8f-44",
            "zz:d2:32:6f:8f:44",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn derived_macs_are_stable_local_unicast_and_distinct() {
        let a = MacAddr::derived(b"node-a/198.18.0.1");
        assert_eq!(a, MacAddr::derived(b"node-a/198.18.0.1"));
        assert_ne!(a, MacAddr::derived(b"node-b/198.18.0.1"));
        assert_eq!(a.0[0] & 0x03, 0x02);
    }
}
