//! The value of a lease key: flannel's `LeaseAttrs` JSON, plus the field
//! `WeftNodeID` naming the node (flannel ignores fields it does not know).
//!
//! flannel writes (Go `encoding/json`, field order fixed):
//! `{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan",
//!   "BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}`

use std::{
    borrow::Cow,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use thiserror::Error;

use super::wireguard::WireguardData;
use crate::{mac::MacAddr, wgkey::WgKey};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseAttrs {
    pub public_ip: Ipv4Addr,
    pub public_ipv6: Option<Ipv6Addr>,
    /// `"vxlan"` or `"wireguard"` (the leases Weft accepts) without an
    /// allocation of its own: 50,000 leases kept 1.6 MB of copies of it.
    pub backend_type: Cow<'static, str>,
    /// Kept as the JSON text it was written as (compact, and written back
    /// unchanged).
    pub backend_data: Option<RawJson>,
    pub backend_v6_data: Option<RawJson>,
    /// The node that holds the lease; None in leases written by flannel.
    pub node_id: Option<String>,
}

/// The vxlan backend's `BackendData`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanData {
    #[serde(rename = "VNI")]
    pub vni: u32,
    #[serde(rename = "VtepMAC")]
    pub vtep_mac: MacAddr,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AttrsError {
    #[error("lease value is not flannel lease JSON: {0}")]
    Json(String),
    #[error("lease value has PublicIP {0:?}, not an IPv4 address")]
    PublicIp(String),
    #[error("lease value has PublicIPv6 {0:?}, not an IPv6 address")]
    PublicIpv6(String),
    #[error("lease value has BackendType {0:?}, not \"vxlan\"")]
    NotVxlan(String),
    #[error("lease value has bad vxlan BackendData: {0}")]
    VxlanData(String),
    #[error("lease value has BackendType {0:?}, not \"wireguard\"")]
    NotWireguard(String),
    #[error("lease value has bad wireguard backend data: {0}")]
    WireguardData(String),
}

/// A JSON value kept as its text.
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl Clone for RawJson {
    fn clone(&self) -> Self {
        RawJson(self.0.to_owned())
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for RawJson {}

#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(rename = "PublicIP")]
    public_ip: String,
    #[serde(rename = "PublicIPv6", default)]
    public_ipv6: Option<String>,
    #[serde(
        rename = "BackendType",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    backend_type: String,
    #[serde(
        rename = "BackendData",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    backend_data: Option<RawJson>,
    #[serde(
        rename = "BackendV6Data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    backend_v6_data: Option<RawJson>,
    #[serde(
        rename = "WeftNodeID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    node_id: Option<String>,
}

impl LeaseAttrs {
    /// The value a Weft node writes for itself.
    pub fn vxlan(public_ip: Ipv4Addr, vni: u32, vtep_mac: MacAddr, node_id: &str) -> Self {
        Self {
            public_ip,
            public_ipv6: None,
            backend_type: "vxlan".into(),
            backend_data: Some(RawJson(
                serde_json::value::to_raw_value(&VxlanData { vni, vtep_mac })
                    .expect("plain struct serializes"),
            )),
            backend_v6_data: None,
            node_id: Some(node_id.to_string()),
        }
    }

    /// The value of an IPv6-only Weft node, as flannel writes one: the
    /// IPv4 PublicIP unspecified, no IPv4 backend data.
    pub fn vxlan_v6_only(
        public_ipv6: Ipv6Addr,
        vni: u32,
        vtep_mac: MacAddr,
        node_id: &str,
    ) -> Self {
        let mut a = Self::vxlan(Ipv4Addr::UNSPECIFIED, vni, vtep_mac, node_id);
        a.backend_data = None;
        a.with_v6(public_ipv6, vni, vtep_mac)
    }

    /// The value of a node of the wireguard backend, as flannel writes it:
    /// `BackendData` when the network has IPv4, `BackendV6Data` when it has
    /// IPv6 (an IPv6-only lease has PublicIP 0.0.0.0 and no `BackendData`),
    /// each with the one public key and that family's listening port.
    pub fn wireguard(
        public_ip: Option<Ipv4Addr>,
        public_ipv6: Option<Ipv6Addr>,
        key: WgKey,
        ports: (u16, u16),
        node_id: &str,
    ) -> Self {
        let data = |port| {
            RawJson(
                serde_json::value::to_raw_value(&WireguardData {
                    public_key: key.to_string(),
                    port,
                })
                .expect("plain struct serializes"),
            )
        };
        Self {
            public_ip: public_ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
            public_ipv6,
            backend_type: "wireguard".into(),
            backend_data: public_ip.map(|_| data(ports.0)),
            backend_v6_data: public_ipv6.map(|_| data(ports.1)),
            node_id: Some(node_id.to_string()),
        }
    }

    /// The wireguard backend data of one family (`BackendData`, or
    /// `BackendV6Data` for IPv6), for a lease of the wireguard backend.
    pub fn wireguard_data(&self, v6: bool) -> Result<WireguardData, AttrsError> {
        if self.backend_type != "wireguard" {
            return Err(AttrsError::NotWireguard(self.backend_type.to_string()));
        }
        let (field, data) = if v6 {
            ("BackendV6Data", &self.backend_v6_data)
        } else {
            ("BackendData", &self.backend_data)
        };
        let data = data
            .as_ref()
            .ok_or_else(|| AttrsError::WireguardData(format!("{field} is missing")))?;
        serde_json::from_str(data.get())
            .map_err(|e| AttrsError::WireguardData(format!("{field}: {e}")))
    }

    /// Adds the IPv6 VTEP of a dual-stack node (`PublicIPv6`,
    /// `BackendV6Data`).
    pub fn with_v6(mut self, public_ipv6: Ipv6Addr, vni: u32, vtep_mac: MacAddr) -> Self {
        self.public_ipv6 = Some(public_ipv6);
        self.backend_v6_data = Some(RawJson(
            serde_json::value::to_raw_value(&VxlanData { vni, vtep_mac })
                .expect("plain struct serializes"),
        ));
        self
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, AttrsError> {
        let w: Wire = serde_json::from_slice(bytes).map_err(|e| AttrsError::Json(e.to_string()))?;
        let public_ip = w
            .public_ip
            .parse()
            .map_err(|_| AttrsError::PublicIp(w.public_ip.clone()))?;
        let public_ipv6 = match w.public_ipv6 {
            None => None,
            Some(s) => Some(s.parse().map_err(|_| AttrsError::PublicIpv6(s.clone()))?),
        };
        Ok(Self {
            public_ip,
            public_ipv6,
            backend_type: match w.backend_type.as_str() {
                "vxlan" => Cow::Borrowed("vxlan"),
                "wireguard" => Cow::Borrowed("wireguard"),
                _ => Cow::Owned(w.backend_type),
            },
            backend_data: w.backend_data,
            backend_v6_data: w.backend_v6_data,
            node_id: w.node_id.filter(|n| !n.is_empty()),
        })
    }

    /// Serializes in flannel's field order.
    pub fn to_json(&self) -> String {
        let w = Wire {
            public_ip: self.public_ip.to_string(),
            public_ipv6: self.public_ipv6.map(|ip| ip.to_string()),
            backend_type: self.backend_type.to_string(),
            backend_data: self.backend_data.clone(),
            backend_v6_data: self.backend_v6_data.clone(),
            node_id: self.node_id.clone(),
        };
        serde_json::to_string(&w).expect("plain struct serializes")
    }

    /// The vxlan backend data, for a lease of the vxlan backend.
    pub fn vxlan_data(&self) -> Result<VxlanData, AttrsError> {
        if self.backend_type != "vxlan" {
            return Err(AttrsError::NotVxlan(self.backend_type.to_string()));
        }
        let data = self
            .backend_data
            .as_ref()
            .ok_or_else(|| AttrsError::VxlanData("BackendData is missing".into()))?;
        serde_json::from_str(data.get()).map_err(|e| AttrsError::VxlanData(e.to_string()))
    }

    /// The vxlan backend data of the IPv6 VTEP (`BackendV6Data`).
    pub fn vxlan_v6_data(&self) -> Result<VxlanData, AttrsError> {
        if self.backend_type != "vxlan" {
            return Err(AttrsError::NotVxlan(self.backend_type.to_string()));
        }
        let data = self
            .backend_v6_data
            .as_ref()
            .ok_or_else(|| AttrsError::VxlanData("BackendV6Data is missing".into()))?;
        serde_json::from_str(data.get()).map_err(|e| AttrsError::VxlanData(e.to_string()))
    }

    /// The address that says which node a lease is for: its IPv4
    /// PublicIP, or on an IPv6-only node (PublicIP unspecified) its
    /// PublicIPv6.
    pub fn node_addr(&self) -> IpAddr {
        match self.public_ipv6 {
            Some(v6) if self.public_ip.is_unspecified() => IpAddr::V6(v6),
            _ => IpAddr::V4(self.public_ip),
        }
    }

    /// Whether this value names `node_id` at `addr` (see [`Self::node_addr`]).
    pub fn names(&self, node_id: &str, addr: IpAddr) -> bool {
        self.node_addr() == addr && self.node_id.as_deref() == Some(node_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease exactly as flannel 0.2x writes it.
    const FLANNEL: &str = r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;

    /// A dual-stack wireguard lease as flannel writes it.
    const FLANNEL_WG: &str = r#"{"PublicIP":"192.168.64.3","PublicIPv6":"fd00:64::3","BackendType":"wireguard","BackendData":{"PublicKey":"x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g=","Port":51820},"BackendV6Data":{"PublicKey":"x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g=","Port":51821}}"#;

    #[test]
    fn wireguard_leases_as_flannel_writes_them() {
        let a = LeaseAttrs::parse(FLANNEL_WG.as_bytes()).unwrap();
        let key = a.wireguard_data(false).unwrap().key().unwrap();
        assert_eq!(a.wireguard_data(true).unwrap().port, 51821);
        assert!(a.vxlan_data().is_err());
        let ours = LeaseAttrs::wireguard(
            Some(a.public_ip),
            a.public_ipv6,
            key,
            (51820, 51821),
            "node-a",
        );
        assert_eq!(
            ours.to_json().replace(r#","WeftNodeID":"node-a""#, ""),
            FLANNEL_WG
        );
        // IPv6-only: PublicIP unspecified, no BackendData.
        let v6 = LeaseAttrs::wireguard(None, a.public_ipv6, key, (51820, 51821), "n");
        assert_eq!(v6.public_ip, Ipv4Addr::UNSPECIFIED);
        assert!(v6.backend_data.is_none());
        assert!(
            v6.wireguard_data(false)
                .unwrap_err()
                .to_string()
                .contains("BackendData is missing")
        );
    }

    #[test]
    fn reads_flannel_leases() {
        let a = LeaseAttrs::parse(FLANNEL.as_bytes()).unwrap();
        assert_eq!(a.public_ip, Ipv4Addr::new(192, 168, 64, 3));
        assert_eq!(a.node_id, None);
        let v = a.vxlan_data().unwrap();
        assert_eq!(v.vni, 1);
        assert_eq!(v.vtep_mac.to_string(), "c6:d2:32:6f:8f:44");
        // And writes them back byte for byte.
        assert_eq!(a.to_json(), FLANNEL);
    }

    #[test]
    fn writes_flannel_json_plus_the_node_id() {
        let mac = "c6:d2:32:6f:8f:44".parse().unwrap();
        let a = LeaseAttrs::vxlan(Ipv4Addr::new(192, 168, 64, 3), 1, mac, "node-a");
        let json = a.to_json();
        assert_eq!(
            json,
            r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"},"WeftNodeID":"node-a"}"#
        );
        // flannel's reader only needs its own fields: the same JSON minus ours.
        let without_ours = json.replace(r#","WeftNodeID":"node-a""#, "");
        assert_eq!(without_ours, FLANNEL);
        assert!(
            LeaseAttrs::parse(json.as_bytes())
                .unwrap()
                .names("node-a", a.public_ip.into())
        );
    }

    /// Dual-stack and IPv6-only leases as flannel writes them.
    const FLANNEL_DUAL: &str = r#"{"PublicIP":"192.168.64.3","PublicIPv6":"fd00:64::3","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"},"BackendV6Data":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:46"}}"#;
    const FLANNEL_V6: &str = r#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:64::3","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:46"}}"#;

    #[test]
    fn dual_stack_and_ipv6_only_values_both_ways() {
        let mac4 = "c6:d2:32:6f:8f:44".parse().unwrap();
        let mac6 = "c6:d2:32:6f:8f:46".parse().unwrap();
        let v6: Ipv6Addr = "fd00:64::3".parse().unwrap();
        let dual =
            LeaseAttrs::vxlan(Ipv4Addr::new(192, 168, 64, 3), 1, mac4, "n").with_v6(v6, 1, mac6);
        assert_eq!(
            dual.to_json().replace(r#","WeftNodeID":"n""#, ""),
            FLANNEL_DUAL
        );
        let read = LeaseAttrs::parse(FLANNEL_DUAL.as_bytes()).unwrap();
        assert_eq!(read.vxlan_v6_data().unwrap().vtep_mac, mac6);
        assert_eq!(read.node_addr(), IpAddr::V4(Ipv4Addr::new(192, 168, 64, 3)));
        assert_eq!(read.to_json(), FLANNEL_DUAL);

        let only = LeaseAttrs::vxlan_v6_only(v6, 1, mac6, "n");
        assert_eq!(
            only.to_json().replace(r#","WeftNodeID":"n""#, ""),
            FLANNEL_V6
        );
        assert!(only.vxlan_data().is_err(), "no IPv4 VTEP");
        assert_eq!(only.node_addr(), IpAddr::V6(v6));
        assert!(only.names("n", IpAddr::V6(v6)));
        assert!(!only.names("n", IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
    }

    #[test]
    fn malformed_values_say_why() {
        assert!(matches!(
            LeaseAttrs::parse(b"not json"),
            Err(AttrsError::Json(_))
        ));
        assert!(matches!(LeaseAttrs::parse(b"{}"), Err(AttrsError::Json(_))));
        assert_eq!(
            LeaseAttrs::parse(br#"{"PublicIP":"300.1.1.1"}"#),
            Err(AttrsError::PublicIp("300.1.1.1".into()))
        );
        let a = LeaseAttrs::parse(br#"{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"nope"}}"#).unwrap();
        assert!(matches!(a.vxlan_data(), Err(AttrsError::VxlanData(_))));
        let a = LeaseAttrs::parse(br#"{"PublicIP":"10.0.0.1","BackendType":"host-gw"}"#).unwrap();
        assert_eq!(a.vxlan_data(), Err(AttrsError::NotVxlan("host-gw".into())));
    }
}
