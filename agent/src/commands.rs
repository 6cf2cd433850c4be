//! Operator commands: `weft leases`, `weft counters`.

use std::collections::HashMap;

use anyhow::Result;

use crate::{
    cli::{EtcdArgs, PinArgs},
    dataplane::{bpffs::PinDir, maps::Counters},
    lease::{etcd::EtcdStore, watch},
};

/// `weft leases`: every lease in etcd, with its time to live.
pub async fn leases(etcd: &EtcdArgs, json: bool) -> Result<()> {
    let store = EtcdStore::connect(&etcd.options()).await?;
    let prefix = format!("{}/subnets/", etcd.prefix());
    let (leases, bad) = watch::list_once(&store, &prefix).await?;
    let mut ttls: HashMap<i64, i64> = HashMap::new();
    for l in &leases {
        if l.lease_id != 0 && !ttls.contains_key(&l.lease_id) {
            let ttl = store
                .client()
                .lease_time_to_live(l.lease_id, None)
                .await
                .map(|r| r.ttl())
                .unwrap_or(-1);
            ttls.insert(l.lease_id, ttl);
        }
    }
    let ttl_text = |id: i64| match id {
        0 => "reservation".to_string(),
        id => match ttls.get(&id) {
            Some(t) if *t >= 0 => format!("{t}s"),
            _ => "expired".to_string(),
        },
    };
    if json {
        let rows: Vec<_> = leases
            .iter()
            .map(|l| {
                serde_json::json!({
                    "subnet": l.subnet.to_string(),
                    "public_ip": l.attrs.public_ip.to_string(),
                    "backend": l.attrs.backend_type,
                    "vtep_mac": l.attrs.vxlan_data().ok().map(|d| d.vtep_mac.to_string()),
                    "node_id": l.attrs.node_id,
                    "lease_id": l.lease_id,
                    "ttl_seconds": if l.lease_id == 0 { None } else { ttls.get(&l.lease_id).copied() },
                    "reservation": l.lease_id == 0,
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
        "{:<20} {:<16} {:<18} {:<24} TTL",
        "SUBNET", "PUBLIC IP", "VTEP MAC", "NODE"
    );
    for l in &leases {
        let mac = l
            .attrs
            .vxlan_data()
            .map(|d| d.vtep_mac.to_string())
            .unwrap_or_else(|_| format!("({})", l.attrs.backend_type));
        println!(
            "{:<20} {:<16} {:<18} {:<24} {}",
            l.subnet.to_string(),
            l.attrs.public_ip.to_string(),
            mac,
            l.attrs.node_id.as_deref().unwrap_or("(flannel)"),
            ttl_text(l.lease_id)
        );
    }
    for (k, why) in &bad {
        println!("malformed: {k}: {why}");
    }
    Ok(())
}

/// `weft counters`: the dataplane's counters.
pub fn counters(pins: &PinArgs) -> Result<()> {
    let counters = Counters::open(&PinDir::new(&pins.bpffs_dir))?;
    for (reason, c) in counters.all()? {
        println!("{:<20} {:>12} {:>14}", reason.name(), c.packets, c.bytes);
    }
    Ok(())
}

/// `weft teardown`.
pub async fn teardown(pins: &PinArgs) -> Result<()> {
    let dir = PinDir::new(&pins.bpffs_dir);
    let vni = crate::dataplane::maps::PeerMaps::open(&dir)
        .and_then(|m| m.config())
        .map(|c| c.vni)
        .ok();
    let vnis: Vec<u32> = match vni {
        Some(v) => vec![v],
        None => {
            // No pinned config: remove whatever overlay devices are there.
            let nl = crate::dataplane::netlink::Netlink::new()?;
            nl.links()
                .await?
                .iter()
                .filter_map(|l| l.name.strip_prefix("weft.").and_then(|v| v.parse().ok()))
                .collect()
        }
    };
    let mut removed = Vec::new();
    for vni in vnis.iter().copied().chain(vnis.is_empty().then_some(1)) {
        removed.extend(crate::dataplane::overlay::teardown(&dir, vni).await?);
    }
    if removed.is_empty() {
        println!("nothing to remove");
    }
    for r in removed {
        println!("removed {r}");
    }
    Ok(())
}
