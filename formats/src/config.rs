//! The network configuration at `<prefix>/config`, read and validated with
//! flannel's defaults and rules, so a config written for flannel means the
//! same thing to Weft.

use serde_json::{Map, Value};

use ipnet::{Ipv4Net, Ipv6Net};

pub use super::json::ConfigError;
use super::json::{err, get_bool, get_str, get_u64};
use super::key::Subnets;
pub use super::pool::{Ipv4Pool, Ipv6Pool};
use super::wireguard::{WIREGUARD_OVERHEAD, WireguardConfig};

/// A validated network config (vxlan or wireguard backend; IPv4, IPv6 or
/// both).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkConfig {
    /// `EnableIPv4` (flannel's default: on).
    pub ipv4: Option<Ipv4Pool>,
    /// `EnableIPv6` (flannel's default: off).
    pub ipv6: Option<Ipv6Pool>,
    pub backend_type: String,
    pub vni: u32,
    pub port: u16,
    /// `Backend.MTU`: the underlay MTU to assume (the overlay's is 50
    /// less, 70 over IPv6); None: the uplink's.
    pub mtu: Option<u32>,
    /// `Backend.DirectRouting`: peers on the uplink's own subnet are sent
    /// to without encapsulation.
    pub direct_routing: bool,
    /// The wireguard backend's settings (None: the vxlan backend).
    pub wireguard: Option<WireguardConfig>,
    /// Settings Weft accepts but does not act on, to log once.
    pub ignored: Vec<String>,
}

impl NetworkConfig {
    /// Parses and validates the JSON stored at `<prefix>/config`.
    pub fn parse(json: &[u8]) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_slice(json)
            .map_err(|e| err("(document)", format!("not valid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(err("(document)", "must be a JSON object"));
        };
        Self::from_object(&obj)
    }

    fn from_object(obj: &Map<String, Value>) -> Result<Self, ConfigError> {
        let mut ignored = Vec::new();
        let enable_v4 = get_bool(obj, "EnableIPv4")?.unwrap_or(true);
        let enable_v6 = get_bool(obj, "EnableIPv6")?.unwrap_or(false);
        if !enable_v4 && !enable_v6 {
            return Err(err(
                "EnableIPv4",
                "is false and EnableIPv6 is not true: the network has no address family",
            ));
        }
        let ipv4 = if enable_v4 {
            Some(Ipv4Pool::from_object(obj)?)
        } else {
            None
        };
        let ipv6 = if enable_v6 {
            Some(Ipv6Pool::from_object(obj)?)
        } else {
            None
        };
        let backend = match obj.get("Backend") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(b)) => b.clone(),
            Some(_) => {
                return Err(err(
                    "Backend",
                    "must be an object like {\"Type\":\"vxlan\"}",
                ));
            }
        };
        // flannel's default backend is "udp".
        let backend_type = get_str(&backend, "Type")
            .map_err(|e| err("Backend.Type", e.reason))?
            .unwrap_or("udp")
            .to_ascii_lowercase();
        let wireguard = match backend_type.as_str() {
            "vxlan" => None,
            "wireguard" => Some(WireguardConfig::from_backend(&backend)?),
            _ => {
                return Err(err(
                    "Backend.Type",
                    format!(
                        "is {backend_type:?}; Weft implements flannel's \"vxlan\" and \"wireguard\" backends"
                    ),
                ));
            }
        };
        let overhead = if wireguard.is_some() {
            WIREGUARD_OVERHEAD
        } else {
            dataplane_common::VXLAN_OVERHEAD
        };
        let vni = match get_u64(&backend, "VNI").map_err(|e| err("Backend.VNI", e.reason))? {
            None | Some(0) => dataplane_common::DEFAULT_VNI,
            Some(v) if v < (1 << 24) => v as u32,
            Some(v) => return Err(err("Backend.VNI", format!("{v} does not fit in 24 bits"))),
        };
        let port = match get_u64(&backend, "Port").map_err(|e| err("Backend.Port", e.reason))? {
            None | Some(0) => dataplane_common::DEFAULT_VXLAN_PORT,
            Some(p) if p <= u16::MAX as u64 => p as u16,
            Some(p) => return Err(err("Backend.Port", format!("{p} is not a UDP port"))),
        };
        if wireguard.is_none()
            && get_bool(&backend, "GBP").map_err(|e| err("Backend.GBP", e.reason))? == Some(true)
        {
            return Err(err(
                "Backend.GBP",
                "VXLAN group-based policy is not supported by Weft",
            ));
        }
        let mtu = match get_u64(&backend, "MTU").map_err(|e| err("Backend.MTU", e.reason))? {
            None | Some(0) => None,
            Some(m) if m > (overhead + 68) as u64 && m <= 65_535 => Some(m as u32),
            Some(m) => {
                return Err(err(
                    "Backend.MTU",
                    format!(
                        "{m} is not a usable underlay MTU (it must leave at least 68 bytes after the backend's {overhead} and be at most 65535)",
                    ),
                ));
            }
        };
        let direct_routing = get_bool(&backend, "DirectRouting")
            .map_err(|e| err("Backend.DirectRouting", e.reason))?
            .unwrap_or(false)
            && wireguard.is_none();
        for (key, what) in [(
            "Learning",
            "Weft programs its peers from etcd; learning does not apply",
        )] {
            if let Some(v) = backend.get(key)
                && !matches!(v, Value::Null | Value::Bool(false))
            {
                ignored.push(format!("Backend.{key}={v}: {what}"));
            }
        }

        Ok(Self {
            ipv4,
            ipv6,
            backend_type,
            vni,
            port,
            mtu,
            direct_routing,
            wireguard,
            ignored,
        })
    }

    /// The IPv4 network, when the config enables IPv4.
    pub fn network(&self) -> Option<Ipv4Net> {
        self.ipv4.as_ref().map(|p| p.network)
    }

    /// The IPv6 network, when the config enables IPv6.
    pub fn ipv6_network(&self) -> Option<Ipv6Net> {
        self.ipv6.as_ref().map(|p| p.network)
    }

    /// The subnets of a lease this config could hand out: each enabled
    /// family's subnet present and assignable, no other (flannel's
    /// `isSubnetConfigCompat` and `isIPv6SubnetConfigCompat`).
    pub fn is_assignable(&self, s: &Subnets) -> bool {
        let v4 = match (&self.ipv4, s.v4) {
            (Some(p), Some(n)) => p.is_assignable(&n),
            (None, None) => true,
            _ => false,
        };
        let v6 = match (&self.ipv6, s.v6) {
            (Some(p), Some(n)) => p.is_assignable(&n),
            (None, None) => true,
            _ => false,
        };
        v4 && v6
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn parse(s: &str) -> Result<NetworkConfig, ConfigError> {
        NetworkConfig::parse(s.as_bytes())
    }

    #[test]
    fn flannel_defaults() {
        let c = parse(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap();
        assert!(c.ipv6.is_none(), "IPv6 is off unless enabled");
        let c4 = c.ipv4.clone().unwrap();
        assert_eq!(c4.subnet_len, 24);
        assert_eq!(
            c4.subnet_min,
            Ipv4Addr::new(10, 244, 1, 0),
            "the first subnet is skipped"
        );
        assert_eq!(c4.subnet_max, Ipv4Addr::new(10, 244, 255, 0));
        assert_eq!((c.vni, c.port), (1, 8472));
        assert_eq!(c4.subnet_count(), 255);
        let subnets: Vec<_> = c4.subnets().take(2).map(|s| s.to_string()).collect();
        assert_eq!(subnets, ["10.244.1.0/24", "10.244.2.0/24"]);
        assert_eq!(c4.subnets().last().unwrap().to_string(), "10.244.255.0/24");
        assert_eq!(c4.index(&"10.244.3.0/24".parse().unwrap()), Some(2));
        assert_eq!(c4.nth(2).unwrap().to_string(), "10.244.3.0/24");
        assert_eq!(c4.index(&"10.244.0.0/24".parse().unwrap()), None);
    }

    #[test]
    fn small_networks_get_prefix_plus_two() {
        let c = parse(r#"{"Network":"10.1.0.0/25","Backend":{"Type":"vxlan"}}"#).unwrap();
        let c = c.ipv4.unwrap();
        assert_eq!(c.subnet_len, 27);
        assert_eq!(c.subnet_count(), 3);
        let e = parse(r#"{"Network":"10.1.0.0/29","Backend":{"Type":"vxlan"}}"#).unwrap_err();
        assert_eq!(e.field, "Network");
    }

    #[test]
    fn explicit_settings_and_their_errors_name_the_field() {
        let c = parse(
            r#"{"Network":"10.5.0.0/16","SubnetLen":26,"SubnetMin":"10.5.8.0","SubnetMax":"10.5.9.192",
                "Backend":{"Type":"vxlan","VNI":4097,"Port":4789}}"#,
        )
        .unwrap();
        assert_eq!((c.vni, c.port), (4097, 4789));
        let c4 = c.ipv4.unwrap();
        assert_eq!(c4.subnet_len, 26);
        assert_eq!(c4.subnet_count(), 8);

        let cases = [
            (r#"{"Backend":{"Type":"vxlan"}}"#, "Network"),
            (
                r#"{"Network":"10.5.0.0/16","SubnetLen":31,"Backend":{"Type":"vxlan"}}"#,
                "SubnetLen",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetLen":17,"Backend":{"Type":"vxlan"}}"#,
                "SubnetLen",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetLen":"24","Backend":{"Type":"vxlan"}}"#,
                "SubnetLen",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMin":"10.6.0.0","Backend":{"Type":"vxlan"}}"#,
                "SubnetMin",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.0.7","Backend":{"Type":"vxlan"}}"#,
                "SubnetMin",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMax":"10.5.3.1","Backend":{"Type":"vxlan"}}"#,
                "SubnetMax",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.9.0","SubnetMax":"10.5.3.0","Backend":{"Type":"vxlan"}}"#,
                "SubnetMin",
            ),
            (r#"{"Network":"10.5.0.0/16"}"#, "Backend.Type"),
            (
                r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#,
                "Backend.Type",
            ),
            (
                r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":16777216}}"#,
                "Backend.VNI",
            ),
            (
                r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","Port":70000}}"#,
                "Backend.Port",
            ),
            (
                r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","GBP":true}}"#,
                "Backend.GBP",
            ),
            (
                r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"Backend":{"Type":"vxlan"}}"#,
                "IPv6Network",
            ),
            (
                r#"{"EnableIPv4":false,"Backend":{"Type":"vxlan"}}"#,
                "EnableIPv4",
            ),
            (
                r#"{"Network":"10.5.0.0/16","EnableIPv6":"yes","Backend":{"Type":"vxlan"}}"#,
                "EnableIPv6",
            ),
            (
                r#"{"Network":"10.5.1.0/16","Backend":{"Type":"vxlan"}}"#,
                "Network",
            ),
            (r#"[1,2]"#, "(document)"),
            (r#"{"Network": "#, "(document)"),
        ];
        for (json, field) in cases {
            let e = parse(json).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("network config: {field}: "))
            );
        }
    }

    #[test]
    fn unsupported_backend_options_are_reported_not_fatal() {
        let c = parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"VXLAN","Learning":true}}"#)
            .unwrap();
        assert_eq!(c.ignored.len(), 1);
        assert!(c.ignored[0].starts_with("Backend.Learning=true"));
    }

    #[test]
    fn direct_routing_and_mtu_are_read() {
        let c = parse(
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true,"MTU":9000}}"#,
        )
        .unwrap();
        assert!(c.direct_routing);
        assert_eq!(c.mtu, Some(9000));
        assert!(c.ignored.is_empty());
        let c = parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","MTU":0}}"#).unwrap();
        assert_eq!((c.mtu, c.direct_routing), (None, false));
        for bad in [
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","MTU":100}}"#,
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","MTU":70000}}"#,
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","MTU":"1500"}}"#,
        ] {
            assert_eq!(parse(bad).unwrap_err().field, "Backend.MTU", "{bad}");
        }
        let e =
            parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","DirectRouting":"yes"}}"#)
                .unwrap_err();
        assert_eq!(e.field, "Backend.DirectRouting");
    }

    #[test]
    fn ipv6_with_flannels_defaults_dual_stack_and_ipv6_only() {
        let c = parse(
            r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        assert!(c.ipv4.is_some());
        let v6 = c.ipv6.clone().unwrap();
        assert_eq!(v6.subnet_len, 64);
        assert_eq!(
            v6.subnet_min.to_string(),
            "fd00:10:244:1::",
            "the first is skipped"
        );
        assert_eq!(v6.subnet_max.to_string(), "fd00:10:244:ff::");
        assert_eq!(v6.subnet_count(), 255);
        assert_eq!(v6.nth(0).unwrap().to_string(), "fd00:10:244:1::/64");
        assert_eq!(v6.index(&"fd00:10:244:3::/64".parse().unwrap()), Some(2));
        assert!(!v6.is_assignable(&"fd00:10:244::/64".parse().unwrap()));
        // Both halves must fit for a lease to be one this config hands out.
        let both = super::super::key::parse_key("10.244.3.0-24&fd00:10:244:3::-64").unwrap();
        assert!(c.is_assignable(&both));
        let v4_only = super::super::key::parse_key("10.244.3.0-24").unwrap();
        assert!(!c.is_assignable(&v4_only));

        let only = parse(
            r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/48","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        assert!(only.ipv4.is_none());
        assert_eq!(only.ipv6.as_ref().unwrap().subnet_len, 64);
        assert_eq!(only.ipv6.as_ref().unwrap().subnet_count(), 65_535);
        let v6_key = super::super::key::parse_key("0.0.0.0-0&fd00:10:244:7::-64").unwrap();
        assert!(only.is_assignable(&v6_key));

        // Small networks: prefix + 2; an explicit length and range.
        let small = parse(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/120","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        assert_eq!(small.ipv6.unwrap().subnet_len, 122);
        let ranged = parse(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/56","IPv6SubnetLen":60,"IPv6SubnetMin":"fd00:0:0:20::","IPv6SubnetMax":"fd00:0:0:40::","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap()
        .ipv6
        .unwrap();
        assert_eq!((ranged.subnet_len, ranged.subnet_count()), (60, 3));

        let cases = [
            (r#""IPv6Network":"fd00::1/56""#, "IPv6Network"),
            (r#""IPv6Network":"10.0.0.0/8""#, "IPv6Network"),
            (r#""IPv6Network":"fd00::/125""#, "IPv6Network"),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetLen":127"#,
                "IPv6SubnetLen",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetLen":57"#,
                "IPv6SubnetLen",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMin":"fd01::""#,
                "IPv6SubnetMin",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMin":"fd00::1""#,
                "IPv6SubnetMin",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMax":"10.0.0.1""#,
                "IPv6SubnetMax",
            ),
            (
                r#""IPv6Network":"fd00::/56","IPv6SubnetMin":"fd00:0:0:9::","IPv6SubnetMax":"fd00:0:0:3::""#,
                "IPv6SubnetMin",
            ),
        ];
        for (fields, field) in cases {
            let json = format!(
                r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,{fields},"Backend":{{"Type":"vxlan"}}}}"#
            );
            let e = parse(&json).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
        }
    }
}
