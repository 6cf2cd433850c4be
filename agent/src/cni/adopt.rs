//! Pods Weft's plugin did not attach: those flannel's plugin (or any chain
//! without a `weft` line) attached, as on a node just moved from flannel
//! whose pods keep running. The container runtime keeps every attachment's
//! result in libcni's cache (`<cacheDir>/results/<network>-<container
//! id>-<ifname>`, `"kind": "cniCacheV1"`), and host-local keeps a file per
//! address it gave out (`<ipamDir>/<network>/<address>`, the container id on
//! its first line). An attachment is adopted when its cached result names a
//! pod interface, its address and the host side of its veth, and, where
//! host-local keeps the network's addresses, host-local still gives each of
//! its addresses to that container (a cache entry left behind by a runtime
//! that crashed during DEL is not a pod). The records made here are
//! validated like the plugin's own (a veth whose other end is in another
//! namespace, an address in the node's subnets) before they are programmed,
//! and they live only as long as the cache entry: when the runtime deletes
//! the pod, libcni removes the entry and the next sync removes the endpoint.

use std::{
    collections::HashSet,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::record::Record;

/// libcni's cache directory, as containerd and CRI-O use it.
pub(crate) const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";

/// The bridge flannel's plugin attaches pods to, unless the result names
/// another one.
const DEFAULT_BRIDGE: &str = "cni0";

/// A cache file larger than this is not a CNI result.
const MAX_CACHE_FILE: u64 = 1 << 20;

/// Records for the attachments in libcni's cache under `cache_dir` that are
/// not among `own` (the plugin's records win: they are exact), checked
/// against host-local's records under `ipam_dir`. Unusable entries are
/// skipped, with the reason, in the second list.
pub(crate) fn adopted(
    cache_dir: &Path,
    ipam_dir: &Path,
    own: &[Record],
) -> (Vec<Record>, Vec<(String, String)>) {
    let own_ips: HashSet<IpAddr> = own.iter().flat_map(Record::ips).collect();
    let own: HashSet<String> = own.iter().map(Record::owner).collect();
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(cache_dir.join("results")) else {
        return (out, skipped);
    };
    for e in entries.filter_map(|e| e.ok()) {
        let path = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        let kept = match adopt(&path, ipam_dir) {
            Ok(Some(r)) => beside_own(&r, &own, &own_ips).map(|keep| keep.then_some(r)),
            other => other,
        };
        match kept {
            Ok(Some(r)) => out.push(r),
            Ok(None) => {}
            Err(why) => skipped.push((name, why)),
        }
    }
    (out, skipped)
}

/// Whether an adopted record stands beside the plugin's own records
/// (owners `own`, addresses `own_ips`): not when it is one of them (the
/// plugin's record is exact), and not when the plugin attached a pod with
/// one of its addresses (the cache entry is left from before).
fn beside_own(
    r: &Record,
    own: &HashSet<String>,
    own_ips: &HashSet<IpAddr>,
) -> Result<bool, String> {
    if own.contains(&r.owner()) {
        return Ok(false);
    }
    if r.ips().iter().any(|ip| own_ips.contains(ip)) {
        return Err("Weft's plugin attached a pod with its address since".into());
    }
    Ok(true)
}

/// One cache entry: `Ok(None)` when it is not an attachment of a pod to a
/// bridge through a veth (another network, a loopback attachment).
fn adopt(path: &PathBuf, ipam_dir: &Path) -> Result<Option<Record>, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() || meta.len() > MAX_CACHE_FILE {
        return Err("not a cache file of a usable size".into());
    }
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&text).map_err(|e| format!("not JSON: {e}"))?;
    if v["kind"].as_str() != Some("cniCacheV1") {
        return Err("not a libcni cache entry (kind cniCacheV1)".into());
    }
    let field = |k: &str| {
        v[k].as_str()
            .filter(|s| !s.is_empty() && s.len() <= 256)
            .map(str::to_string)
            .ok_or_else(|| format!("no {k}"))
    };
    let (container_id, ifname, network) = (
        field("containerId")?,
        field("ifName")?,
        field("networkName")?,
    );
    let result = &v["result"];
    if !result.is_object() {
        return Err("no result".into());
    }
    let ifaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    let netns = ifaces
        .iter()
        .find(|i| i["name"].as_str() == Some(ifname.as_str()))
        .and_then(|i| i["sandbox"].as_str())
        .unwrap_or_default()
        .to_string();
    let bridge = ifaces
        .iter()
        .filter(|i| i["sandbox"].as_str().is_none_or(str::is_empty))
        .filter_map(|i| i["name"].as_str())
        .find(|n| super::record::is_bridge(n))
        .unwrap_or(DEFAULT_BRIDGE)
        .to_string();
    let Ok(mut r) = Record::from_result(
        &network,
        &bridge,
        container_id,
        ifname,
        &netns,
        result,
        None,
    ) else {
        // No veth on a bridge in this result (macvlan, loopback, a device
        // gone since): nothing host routing could reach.
        return Ok(None);
    };
    host_local_agrees(ipam_dir, &r)?;
    // libcni keeps the runtime's CNI_ARGS as `[[key, value], ...]`.
    r.pod = super::record::Pod::from_args(
        v["cniArgs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|kv| Some((kv.get(0)?.as_str()?, kv.get(1)?.as_str()?))),
    );
    // When the runtime wrote the entry, not when it was read: of two
    // attachments with one address the newer wins, and reading again
    // changes nothing.
    r.added_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(Some(r))
}

/// Where host-local keeps the network's addresses, each of the record's
/// addresses must be given to its container.
fn host_local_agrees(ipam_dir: &Path, r: &Record) -> Result<(), String> {
    let dir = ipam_dir.join(&r.network);
    if !dir.is_dir() {
        return Ok(());
    }
    for ip in std::iter::once(r.ip).chain(r.other_ips.iter().copied()) {
        let holder = std::fs::read_to_string(dir.join(ip_file(ip)))
            .ok()
            .and_then(|t| t.lines().next().map(|l| l.trim().to_string()));
        if holder.as_deref() != Some(r.container_id.as_str()) {
            return Err(format!(
                "host-local does not give {ip} to container {}",
                r.container_id
            ));
        }
    }
    Ok(())
}

/// host-local's file name for an address (the address itself).
fn ip_file(ip: IpAddr) -> String {
    ip.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mac::MacAddr;

    fn record(container: &str, ip: [u8; 4], added_ns: u128) -> Record {
        Record {
            container_id: container.into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/x".into(),
            network: "cbr0".into(),
            ip: std::net::Ipv4Addr::from(ip).into(),
            other_ips: Vec::new(),
            pod_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            host_if: "veth1".into(),
            host_ifindex: 7,
            gw_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            added_ns,
            delegate: None,
            netkit: false,
            pod: None,
        }
    }

    /// A cache entry left for an address Weft's plugin has since given to
    /// a pod never stands beside the plugin's record, however recently it
    /// was read; one of the plugin's own attachments is the plugin's.
    #[test]
    fn the_plugins_records_win_over_cache_entries() {
        let mine = record("new", [10, 244, 1, 5], 1);
        let own: HashSet<String> = [mine.owner()].into();
        let own_ips: HashSet<IpAddr> = mine.ips().into_iter().collect();
        let stale = record("old", [10, 244, 1, 5], u128::MAX);
        assert!(beside_own(&stale, &own, &own_ips).is_err());
        assert_eq!(
            beside_own(&record("new", [10, 244, 1, 5], 9), &own, &own_ips),
            Ok(false)
        );
        assert_eq!(
            beside_own(&record("other", [10, 244, 1, 6], 9), &own, &own_ips),
            Ok(true)
        );
    }
}
