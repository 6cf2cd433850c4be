//! Endpoint records: what the plugin registered, one file per attachment
//! (`<stateDir>/endpoints/<container id>-<ifname>.json`), written
//! atomically. They are the plugin's result cache: the agent reads them at
//! start and whenever the plugin says something changed.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{CniError, Code};
use crate::{dataplane::EndpointSpec, mac::MacAddr};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) container_id: String,
    pub(crate) ifname: String,
    pub(crate) netns: String,
    pub(crate) network: String,
    /// The pod's address (IPv4 if it has one).
    pub(crate) ip: IpAddr,
    /// Its other addresses (a dual-stack pod's IPv6 address).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) other_ips: Vec<IpAddr>,
    pub(crate) pod_mac: MacAddr,
    pub(crate) host_if: String,
    pub(crate) host_ifindex: u32,
    pub(crate) gw_mac: MacAddr,
    /// When it was written (nanoseconds since the epoch).
    pub(crate) added_ns: u128,
    /// The delegate config of a standalone ADD, for its DEL and CHECK
    /// (for a netkit pod, the IPAM plugin's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) delegate: Option<Value>,
    /// The pod's device is a netkit pair the plugin made (DEL removes it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) netkit: bool,
}

/// The owner of an attachment: the container id and the interface name.
pub(crate) fn owner(container_id: &str, ifname: &str) -> String {
    format!("{container_id}-{ifname}")
}

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("endpoints")
}

fn path(state_dir: &Path, owner: &str) -> PathBuf {
    dir(state_dir).join(format!("{owner}.json"))
}

fn bad(msg: String) -> CniError {
    CniError::new(Code::Plugin, msg)
}

impl Record {
    /// The endpoint a CNI result describes: the container's interface
    /// `ifname` (its MAC and addresses), and the host side of its veth
    /// (an interface of the result outside the sandbox, not the bridge).
    pub(crate) fn from_result(
        network: &str,
        bridge_name: &str,
        container_id: String,
        ifname: String,
        netns: &str,
        result: &Value,
        delegate: Option<Value>,
    ) -> Result<Self, CniError> {
        let ifaces = result["interfaces"].as_array().cloned().unwrap_or_default();
        let in_sandbox = |i: &Value| i["sandbox"].as_str().is_some_and(|s| !s.is_empty());
        let (pod_idx, pod) = ifaces
            .iter()
            .enumerate()
            .find(|(_, i)| in_sandbox(i) && i["name"].as_str() == Some(ifname.as_str()))
            .ok_or_else(|| {
                bad(format!(
                    "the result has no interface {ifname} in the container"
                ))
            })?;
        let pod_mac: MacAddr = pod["mac"]
            .as_str()
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| bad(format!("the result gives {ifname} no MAC")))?;
        let mut ips: Vec<IpAddr> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| {
                a["interface"]
                    .as_u64()
                    .is_none_or(|i| i as usize == pod_idx)
            })
            .filter_map(|a| a["address"].as_str()?.parse::<IpNet>().ok())
            .map(|n| n.addr())
            .collect();
        // IPv4 first, as the primary address.
        ips.sort_by_key(|a| a.is_ipv6());
        ips.dedup();
        if ips.is_empty() {
            return Err(bad(format!("the result gives {ifname} no IP address")));
        }
        let ip = ips.remove(0);
        // The host side of the pod's veth (or netkit): an interface of the result
        // outside the sandbox that is not a bridge (whatever the bridge is
        // called: flannel's is cni0, a chain may name it cbr0) and links to
        // a peer.
        let host_if = ifaces
            .iter()
            .filter(|i| !in_sandbox(i))
            .filter_map(|i| i["name"].as_str())
            .find(|n| *n != bridge_name && is_pod_device(n))
            .ok_or_else(|| bad("the result names no host side of the pod's veth".into()))?
            .to_string();
        let host_ifindex =
            ifindex(&host_if).ok_or_else(|| bad(format!("no interface {host_if} on the host")))?;
        let netkit = crate::sys::ethtool::driver(&host_if).is_ok_and(|d| d == "netkit");
        // The gateway: the bridge the veth is a port of (its MAC is what
        // the pod's gateway address resolves to), as the result names it
        // or as the veth's master.
        let bridge = ifaces
            .iter()
            .filter(|i| !in_sandbox(i))
            .filter_map(|i| Some((i["name"].as_str()?, i["mac"].as_str())))
            .find(|(n, _)| *n == bridge_name || is_bridge(n));
        // A netkit pod's gateway is its pair's primary (an L3 device: no
        // bridge, no ARP).
        let gw_mac = (netkit.then(|| sys_mac(&host_if)).flatten())
            .or_else(|| bridge.and_then(|(_, m)| m?.parse().ok()))
            .or_else(|| bridge.and_then(|(n, _)| sys_mac(n)))
            .or_else(|| sys_mac(&format!("{host_if}/master")))
            .or_else(|| sys_mac(bridge_name))
            .or_else(|| sys_mac(&host_if))
            .ok_or_else(|| bad(format!("no MAC for the gateway ({bridge_name})")))?;
        Ok(Self {
            container_id,
            ifname,
            netns: netns.to_string(),
            network: network.to_string(),
            ip,
            other_ips: ips,
            pod_mac,
            host_if,
            host_ifindex,
            gw_mac,
            added_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
            delegate,
            netkit,
        })
    }

    pub(crate) fn owner(&self) -> String {
        owner(&self.container_id, &self.ifname)
    }

    /// The pod's addresses.
    pub(crate) fn ips(&self) -> Vec<IpAddr> {
        std::iter::once(self.ip)
            .chain(self.other_ips.iter().copied())
            .collect()
    }

    /// The endpoints of the attachment: one per address.
    pub(crate) fn endpoints(&self) -> Vec<EndpointSpec> {
        std::iter::once(self.ip)
            .chain(self.other_ips.iter().copied())
            .map(|ip| EndpointSpec {
                owner: self.owner(),
                ip,
                host_if: self.host_if.clone(),
                host_ifindex: self.host_ifindex,
                pod_mac: self.pod_mac,
                gw_mac: self.gw_mac,
                added_ns: self.added_ns,
            })
            .collect()
    }
}

fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: if_nametoindex reads a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Whether `iface` is a bridge (asked of its driver: sysfs may belong to
/// another network namespace than the plugin's).
pub(crate) fn is_bridge(iface: &str) -> bool {
    crate::sys::ethtool::driver(iface).is_ok_and(|d| d == "bridge")
}

/// Whether `iface` can be the host side of a pod's device: a veth, or a
/// netkit pair's primary.
fn is_pod_device(iface: &str) -> bool {
    crate::sys::ethtool::driver(iface).is_ok_and(|d| d == "veth" || d == "netkit")
}

fn sys_mac(iface: &str) -> Option<MacAddr> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub(crate) fn write(state_dir: &Path, r: &Record) -> Result<(), CniError> {
    let io = |what: &str, e: std::io::Error| {
        CniError::new(Code::Io, format!("{what} under {}", state_dir.display()))
            .with_details(e.to_string())
    };
    let d = dir(state_dir);
    std::fs::create_dir_all(&d).map_err(|e| io("creating the endpoint directory", e))?;
    let tmp = d.join(format!(".{}.tmp-{}", r.owner(), std::process::id()));
    let text = serde_json::to_vec_pretty(r).expect("a record serializes");
    std::fs::write(&tmp, text).map_err(|e| io("writing the endpoint record", e))?;
    std::fs::rename(&tmp, path(state_dir, &r.owner()))
        .map_err(|e| io("writing the endpoint record", e))
}

pub(crate) fn read(state_dir: &Path, owner: &str) -> Option<Record> {
    let text = std::fs::read(path(state_dir, owner)).ok()?;
    serde_json::from_slice(&text).ok()
}

pub(crate) fn remove(state_dir: &Path, owner: &str) -> Result<(), CniError> {
    match std::fs::remove_file(path(state_dir, owner)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            Err(CniError::new(Code::Io, "removing the endpoint record").with_details(e.to_string()))
        }
    }
}

/// Every record under `state_dir` (unreadable ones are skipped).
pub(crate) fn records(state_dir: &Path) -> Vec<Record> {
    let Ok(entries) = std::fs::read_dir(dir(state_dir)) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect()
}

/// Forgets the record of `owner` (its pod is gone).
pub(crate) fn forget(state_dir: &Path, owner: &str) {
    let _ = std::fs::remove_file(path(state_dir, owner));
}
