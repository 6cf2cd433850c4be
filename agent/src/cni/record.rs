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
    /// The Kubernetes pod, as the runtime named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<Pod>,
}

/// The Kubernetes pod an attachment is for, as the runtime names it in
/// CNI_ARGS (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`; the
/// kubelet's runtimes pass them): shown to operators (`weft endpoints`),
/// never used to decide anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) uid: String,
}

impl Pod {
    /// From CNI_ARGS' `key=value` pairs: none unless a namespace and a name
    /// are there and look like Kubernetes names (anything else is ignored,
    /// not an error: the runtime's arguments are informational here).
    pub(crate) fn from_args<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Self> {
        let (mut namespace, mut name, mut uid) = (None, None, String::new());
        for (k, v) in pairs {
            match k {
                "K8S_POD_NAMESPACE" => namespace = Some(v),
                "K8S_POD_NAME" => name = Some(v),
                "K8S_POD_UID" if is_uid(v) => uid = v.to_string(),
                _ => {}
            }
        }
        let (namespace, name) = (namespace?, name?);
        (is_k8s_name(namespace) && is_k8s_name(name)).then(|| Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid,
        })
    }

    /// From the CNI_ARGS string (`IgnoreUnknown=1;K8S_POD_NAME=web-0;...`).
    pub(crate) fn from_cni_args(args: &str) -> Option<Self> {
        Self::from_args(args.split(';').filter_map(|kv| kv.split_once('=')))
    }
}

impl std::fmt::Display for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Kubernetes object name (a DNS subdomain: lower-case letters, digits,
/// `-` and `.`, at most 253).
fn is_k8s_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A pod UID (a UUID; at most 64 of hex digits and `-`).
fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
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
            pod: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_comes_from_the_kubelets_cni_args() {
        let p = Pod::from_cni_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-7d.x9;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1f0c6f5e-2b7a-4c1e-9d55-0c3a1b2c3d4e",
        )
        .unwrap();
        assert_eq!(p.to_string(), "kube-system/coredns-7d.x9");
        assert_eq!(p.uid, "1f0c6f5e-2b7a-4c1e-9d55-0c3a1b2c3d4e");
    }

    #[test]
    fn arguments_that_are_not_a_pods_name_are_ignored() {
        for args in [
            "",
            "IgnoreUnknown=1",
            "K8S_POD_NAME=web-0",
            "K8S_POD_NAMESPACE=default",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=Web",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web 0",
            "K8S_POD_NAMESPACE=de/fault;K8S_POD_NAME=web",
            "K8S_POD_NAMESPACE=;K8S_POD_NAME=web",
        ] {
            assert_eq!(Pod::from_cni_args(args), None, "{args:?}");
        }
        let long = "a".repeat(254);
        assert_eq!(
            Pod::from_cni_args(&format!("K8S_POD_NAMESPACE=d;K8S_POD_NAME={long}")),
            None
        );
        // A UID that is not one is left out; the pod stays.
        let p =
            Pod::from_cni_args("K8S_POD_NAMESPACE=d;K8S_POD_NAME=w;K8S_POD_UID=\x1b[31m").unwrap();
        assert_eq!(p.uid, "");
    }

    #[test]
    fn a_record_without_a_pod_reads_as_before() {
        let old = r#"{"container_id":"c","ifname":"eth0","netns":"/n","network":"cbr0","ip":"10.244.1.2","pod_mac":"02:00:00:00:00:01","host_if":"veth1","host_ifindex":7,"gw_mac":"02:00:00:00:00:02","added_ns":1}"#;
        let r: Record = serde_json::from_str(old).unwrap();
        assert_eq!(r.pod, None);
        assert!(!serde_json::to_string(&r).unwrap().contains("pod\""));
    }
}
