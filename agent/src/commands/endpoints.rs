//! `weft endpoints`: this node's pods as host routing knows them, read
//! from what the agent reads (the plugin's records, the runtime's CNI
//! cache) and from the endpoint map the programs use; it needs no agent.

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use anyhow::Result;
use serde_json::{Value, json};

use crate::{
    cni::EndpointRecord,
    dataplane::{EndpointMap, PinDir},
};

/// One address of a pod.
struct Row {
    address: IpAddr,
    pod: Option<String>,
    container: String,
    ifname: String,
    device: String,
    attached_by: &'static str,
    programmed: bool,
}

pub(crate) fn endpoints(
    state_dir: &Path,
    bpffs_dir: &Path,
    ipam_dir: &Path,
    cache_dir: &Path,
    json: bool,
) -> Result<()> {
    let own = crate::cni::records(state_dir);
    let (adopted, skipped) = crate::cni::adopted(cache_dir, ipam_dir, &own);
    // Without pins (no agent ever ran here) nothing is programmed.
    let mut map: BTreeMap<IpAddr, u32> = EndpointMap::open(&PinDir::new(bpffs_dir))
        .and_then(|m| m.all())
        .map(|m| m.into_iter().map(|(ip, e)| (ip, e.ifindex)).collect())
        .unwrap_or_default();
    let mut rows = Vec::new();
    for (records, by) in [(&own, "plugin"), (&adopted, "runtime cache")] {
        for r in records.iter() {
            rows.extend(rows_of(r, by, &mut map));
        }
    }
    // In the map with no attachment behind them: the agent removes these
    // (a pod deleted while it was down, say).
    for (ip, ifindex) in map {
        rows.push(Row {
            address: ip,
            pod: None,
            container: String::new(),
            ifname: String::new(),
            device: format!("ifindex {ifindex}"),
            attached_by: "none",
            programmed: true,
        });
    }
    rows.sort_by_key(|r| (r.address.is_ipv6(), r.address));
    if json {
        let doc = json!({
            "endpoints": rows.iter().map(|r| json!({
                "address": r.address,
                "pod": r.pod,
                "container_id": r.container,
                "ifname": r.ifname,
                "device": r.device,
                "attached_by": r.attached_by,
                "programmed": r.programmed,
            })).collect::<Vec<Value>>(),
            "cache_entries_skipped": skipped.iter().map(|(entry, why)| json!({"entry": entry, "why": why})).collect::<Vec<Value>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "{:<28} {:<40} {:<14} {:<16} {:<14} PROGRAMMED",
        "ADDRESS", "POD", "CONTAINER", "DEVICE", "ATTACHED BY"
    );
    for r in &rows {
        println!(
            "{:<28} {:<40} {:<14} {:<16} {:<14} {}",
            r.address,
            super::shown(r.pod.as_deref().unwrap_or("-")),
            super::shown(&r.container.chars().take(12).collect::<String>()),
            super::shown(&r.device),
            r.attached_by,
            if r.programmed { "yes" } else { "no" }
        );
    }
    if !skipped.is_empty() {
        println!("\nCNI cache entries not used ({})", skipped.len());
        for (entry, why) in &skipped {
            println!("  {}: {}", super::shown(entry), super::shown(why));
        }
    }
    Ok(())
}

/// The rows of one attachment's addresses, each taken out of `map` (what
/// is left there has no attachment).
fn rows_of(r: &EndpointRecord, by: &'static str, map: &mut BTreeMap<IpAddr, u32>) -> Vec<Row> {
    r.ips()
        .into_iter()
        .map(|ip| Row {
            address: ip,
            pod: r.pod.as_ref().map(ToString::to_string),
            container: r.container_id.clone(),
            ifname: r.ifname.clone(),
            device: r.host_if.clone(),
            attached_by: by,
            programmed: map.remove(&ip).is_some(),
        })
        .collect()
}
