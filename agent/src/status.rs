//! `weft status`: this node at a glance, from the pinned maps and links,
//! the subnet file, netlink, and (if reachable) etcd.

use std::{net::Ipv4Addr, path::Path, time::Duration};

use anyhow::Result;
use serde_json::json;

use crate::{
    cli::{EtcdArgs, PinArgs},
    dataplane::{
        bpffs::PinDir,
        loader,
        maps::{Counters, PeerMaps},
        netlink::Netlink,
    },
    lease::{etcd::EtcdStore, store::Store as _, subnet_file},
    mac::MacAddr,
};

pub async fn run(
    pins: &PinArgs,
    etcd: &EtcdArgs,
    subnet_path: &Path,
    json_out: bool,
) -> Result<()> {
    let dir = PinDir::new(&pins.bpffs_dir);
    let maps = PeerMaps::open(&dir)?;
    let cfg = maps.config()?;
    let counters = Counters::open(&dir)?.all()?;
    let mut peers: Vec<_> = maps.peers()?.into_values().collect();
    peers.sort_by_key(|p| p.subnet);
    let nl = Netlink::new()?;
    let mut attach = Vec::new();
    for (hook, iface, _) in loader::pinned_links(&dir)? {
        let mode = match hook {
            loader::Hook::Xdp => nl
                .link(&iface)
                .await?
                .and_then(|l| l.xdp)
                .map(|(_, m)| m.as_str().to_string())
                .unwrap_or_else(|| "detached".into()),
            _ => "-".into(),
        };
        attach.push((
            iface,
            hook.name(),
            loader::Loaded::program_name_for(hook),
            mode,
        ));
    }
    let uplink = nl.link_by_index(cfg.uplink_ifindex).await?;
    let subnet = subnet_file::read_subnet(subnet_path).ok().flatten();

    // The lease's time to live, if etcd answers quickly.
    let lease = match subnet {
        Some(s) => {
            let key = format!("{}/subnets/{}", etcd.prefix(), s.to_key());
            let mut o = etcd.options();
            o.request_timeout = Duration::from_secs(2);
            match tokio::time::timeout(Duration::from_secs(3), lease_ttl(&o, &key)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => format!("unknown (etcd: {e})"),
                Err(_) => "unknown (etcd did not answer)".into(),
            }
        }
        None => "unknown (no subnet file)".into(),
    };

    let local = Ipv4Addr::from(cfg.local_addr_be.to_ne_bytes());
    if json_out {
        let doc = json!({
            "subnet": subnet.map(|s| s.to_string()),
            "lease": lease,
            "public_ip": local.to_string(),
            "vni": cfg.vni,
            "port": cfg.port,
            "vtep_mac": MacAddr(cfg.vtep_mac).to_string(),
            "uplink": uplink.as_ref().map(|l| json!({"name": l.name, "ifindex": l.index, "mtu": l.mtu})),
            "attached": attach.iter().map(|(i, h, p, m)| json!({"iface": i, "hook": h, "program": p, "xdp_mode": m})).collect::<Vec<_>>(),
            "peers": peers.iter().map(|p| json!({"subnet": p.subnet.to_string(), "vtep": p.vtep.to_string(), "mac": p.mac.to_string()})).collect::<Vec<_>>(),
            "counters": counters.iter().map(|(r, c)| (r.name().to_string(), json!({"packets": c.packets, "bytes": c.bytes}))).collect::<serde_json::Map<_, _>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("Node");
    println!(
        "  subnet     {}",
        subnet
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown".into())
    );
    println!("  lease      {lease}");
    println!(
        "  VTEP       {local}  VNI {}  UDP {}  MAC {}",
        cfg.vni,
        cfg.port,
        MacAddr(cfg.vtep_mac)
    );
    if let Some(u) = &uplink {
        println!(
            "  uplink     {} (ifindex {}, MTU {})",
            u.name, u.index, u.mtu
        );
    }
    println!("\nAttached programs");
    for (iface, hook, prog, mode) in &attach {
        println!("  {iface:<12} {hook:<11} {prog:<14} {mode}");
    }
    println!("\nPeers ({})", peers.len());
    println!("  {:<18} {:<16} MAC", "SUBNET", "VTEP");
    for p in &peers {
        println!(
            "  {:<18} {:<16} {}",
            p.subnet.to_string(),
            p.vtep.to_string(),
            p.mac
        );
    }
    println!("\nCounters");
    for (r, c) in &counters {
        println!(
            "  {:<18} {:>12} packets {:>15} bytes",
            r.name(),
            c.packets,
            c.bytes
        );
    }
    Ok(())
}

async fn lease_ttl(o: &crate::lease::etcd::EtcdOptions, key: &str) -> Result<String> {
    let store = EtcdStore::connect(o).await?;
    let Some(kv) = store.get(key).await? else {
        return Ok(format!("{key}: not in etcd"));
    };
    if kv.lease == 0 {
        return Ok(format!("{key} (reservation, no TTL)"));
    }
    let ttl = store
        .client()
        .lease_time_to_live(kv.lease, None)
        .await?
        .ttl();
    Ok(format!("{key}, TTL {ttl}s"))
}
