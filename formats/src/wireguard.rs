//! flannel's `wireguard` backend: its settings in the network config and
//! what its leases carry.
//!
//! The config's `Backend` (flannel's defaults):
//! `{"Type":"wireguard","ListenPort":51820,"ListenPortV6":51821,
//!   "PSK":"<base64>","PersistentKeepaliveInterval":0,"Mode":"separate","MTU":<uplink's>}`
//! and a lease's `BackendData` (and `BackendV6Data` with IPv6):
//! `{"PublicKey":"<base64>","Port":51820}` (older flannel wrote no `Port`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::json::{ConfigError, err, get_str, get_u64};
use crate::wgkey::WgKey;

/// What WireGuard adds to a packet: outer IPv4 (20; flannel counts 20 for
/// IPv6 too), UDP 8, type 4, key index 4, nonce 8, tag 16, and padding.
/// flannel subtracts 80 from the underlay MTU, for both families.
pub const WIREGUARD_OVERHEAD: u32 = 80;

/// flannel's defaults.
pub const DEFAULT_LISTEN_PORT: u16 = 51820;
pub const DEFAULT_LISTEN_PORT_V6: u16 = 51821;

/// How the families map to devices (flannel's `Mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgMode {
    /// A device per family: `flannel-wg` (IPv4 underlay, `ListenPort`) and
    /// `flannel-wg-v6` (IPv6 underlay, `ListenPortV6`).
    Separate,
    /// One device, `flannel-wg`, for both families; each peer reached over
    /// IPv4 unless only IPv6 looks routable (flannel's choice).
    Auto,
    /// One device; every peer over its IPv4 address.
    Ipv4,
    /// One device; every peer over its IPv6 address.
    Ipv6,
}

impl WgMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WgMode::Separate => "separate",
            WgMode::Auto => "auto",
            WgMode::Ipv4 => "ipv4",
            WgMode::Ipv6 => "ipv6",
        }
    }
}

/// The wireguard backend's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireguardConfig {
    pub listen_port: u16,
    pub listen_port_v6: u16,
    /// `PSK`: a pre-shared key every peer is given.
    pub psk: Option<WgKey>,
    /// `PersistentKeepaliveInterval`, in seconds (0: off).
    pub keepalive: u16,
    pub mode: WgMode,
}

impl WireguardConfig {
    /// Reads the `Backend` object of a config whose type is "wireguard".
    pub fn from_backend(backend: &Map<String, Value>) -> Result<Self, ConfigError> {
        let port = |key: &'static str, default: u16| -> Result<u16, ConfigError> {
            match get_u64(backend, key).map_err(|e| err(key, e.reason))? {
                None | Some(0) => Ok(default),
                Some(p) if p <= u16::MAX as u64 => Ok(p as u16),
                Some(p) => Err(err(key, format!("{p} is not a UDP port"))),
            }
        };
        let listen_port = port("ListenPort", DEFAULT_LISTEN_PORT)
            .map_err(|e| err("Backend.ListenPort", e.reason))?;
        let listen_port_v6 = port("ListenPortV6", DEFAULT_LISTEN_PORT_V6)
            .map_err(|e| err("Backend.ListenPortV6", e.reason))?;
        let psk = get_str(backend, "PSK")
            .map_err(|e| err("Backend.PSK", e.reason))?
            .map(|s| WgKey::parse(s).map_err(|e| err("Backend.PSK", e)))
            .transpose()?;
        let keepalive = match get_u64(backend, "PersistentKeepaliveInterval")
            .map_err(|e| err("Backend.PersistentKeepaliveInterval", e.reason))?
        {
            None => 0,
            Some(s) if s <= u16::MAX as u64 => s as u16,
            Some(s) => {
                return Err(err(
                    "Backend.PersistentKeepaliveInterval",
                    format!("{s} seconds is more than WireGuard's 65535"),
                ));
            }
        };
        let mode = match get_str(backend, "Mode")
            .map_err(|e| err("Backend.Mode", e.reason))?
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("separate") => WgMode::Separate,
            Some("auto") => WgMode::Auto,
            Some("ipv4") => WgMode::Ipv4,
            Some("ipv6") => WgMode::Ipv6,
            Some(other) => {
                return Err(err(
                    "Backend.Mode",
                    format!("is {other:?}; one of separate, auto, ipv4, ipv6"),
                ));
            }
        };
        Ok(Self {
            listen_port,
            listen_port_v6,
            psk,
            keepalive,
            mode,
        })
    }
}

/// A wireguard lease's `BackendData` (or `BackendV6Data`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireguardData {
    #[serde(rename = "PublicKey")]
    pub public_key: String,
    /// The port the node listens on; 0 or missing in older flannel's
    /// leases (the network's `ListenPort` then).
    #[serde(rename = "Port", default)]
    pub port: u16,
}

impl WireguardData {
    /// The public key, checked.
    pub fn key(&self) -> Result<WgKey, String> {
        WgKey::parse(&self.public_key).map_err(|e| format!("PublicKey: {e}"))
    }
}
