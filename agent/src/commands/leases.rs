//! `weft leases`: every lease in etcd, its time to live, and whether Weft
//! nodes program it.

use std::collections::HashMap;

use anyhow::Result;

use super::shown;
use crate::{
    cli::EtcdArgs,
    lease::{self, EtcdStore, NetworkConfig, Store as _},
};

pub(crate) async fn leases(etcd: &EtcdArgs, json: bool) -> Result<()> {
    let store = EtcdStore::connect(&etcd.options()).await?;
    let prefix = format!("{}/subnets/", etcd.prefix());
    let (leases, bad) = lease::list_once(&store, &prefix).await?;
    let mut ttls: HashMap<i64, Option<i64>> = HashMap::new();
    for l in &leases {
        if l.lease_id != 0 && !ttls.contains_key(&l.lease_id) {
            ttls.insert(l.lease_id, store.ttl(l.lease_id).await.ok().flatten());
        }
    }
    // The verdict every node reaches on a lease that is not its own (the
    // checks that depend on the node itself are left out).
    let config = store
        .get(&format!("{}/config", etcd.prefix()))
        .await?
        .and_then(|kv| NetworkConfig::parse(&kv.value).ok());
    let rejected = match &config {
        Some(c) => lease::decide(leases.iter(), c, None, None, |_| false).rejected,
        None => HashMap::new(),
    };
    let verdict = |key: &str| match (&config, rejected.get(key)) {
        (None, _) => "unknown (no usable network config)".to_string(),
        (Some(_), None) => "ok".to_string(),
        (Some(_), Some((why, _))) => format!("rejected ({}): {why}", why.name()),
    };
    let ttl_text = |id: i64| match id {
        0 => "reservation".to_string(),
        id => match ttls.get(&id).copied().flatten() {
            Some(t) => format!("{t}s"),
            None => "expired".to_string(),
        },
    };
    if json {
        let rows: Vec<_> = leases
            .iter()
            .map(|l| {
                serde_json::json!({
                    "key": l.key,
                    "subnet": l.subnet.to_string(),
                    "public_ip": l.attrs.public_ip.to_string(),
                    "backend": l.attrs.backend_type,
                    "vtep_mac": l.attrs.vxlan_data().ok().map(|d| d.vtep_mac.to_string()),
                    "node_id": l.attrs.node_id,
                    "lease_id": l.lease_id,
                    "ttl_seconds": if l.lease_id == 0 { None } else { ttls.get(&l.lease_id).copied().flatten() },
                    "reservation": l.lease_id == 0,
                    "rejected": rejected.get(&l.key).map(|(why, _)| serde_json::json!({"reason": why.name(), "detail": why.to_string()})),
                })
            })
            .collect();
        let malformed: Vec<_> = bad
            .iter()
            .map(|(k, why)| serde_json::json!({"key": k, "error": why}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"leases": rows, "malformed": malformed})
            )?
        );
        return Ok(());
    }
    println!(
        "{:<20} {:<16} {:<18} {:<24} {:<12} STATUS",
        "SUBNET", "PUBLIC IP", "VTEP MAC", "NODE", "TTL"
    );
    for l in &leases {
        let mac = l
            .attrs
            .vxlan_data()
            .map(|d| d.vtep_mac.to_string())
            .unwrap_or_else(|_| format!("({})", shown(&l.attrs.backend_type)));
        println!(
            "{:<20} {:<16} {:<18} {:<24} {:<12} {}",
            l.subnet.to_string(),
            l.attrs.public_ip.to_string(),
            mac,
            shown(l.attrs.node_id.as_deref().unwrap_or("(flannel)")),
            ttl_text(l.lease_id),
            shown(&verdict(&l.key)),
        );
    }
    for (k, why) in &bad {
        println!("malformed: {}: {}", shown(k), shown(why));
    }
    Ok(())
}
