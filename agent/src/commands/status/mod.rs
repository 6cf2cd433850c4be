//! `weft status`: this node at a glance, from the pinned maps and links,
//! the subnet file, netlink, and (if reachable) etcd.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    time::Duration,
};

use anyhow::Result;
use serde_json::json;

use crate::{
    cli::NodeArgs,
    dataplane::{
        Counters, EndpointMap, Hook, Netlink, PeerMaps, PinDir, pinned_links, pinned_program,
    },
    lease::{self, EtcdOptions, EtcdStore, Store as _},
    mac::MacAddr,
    report,
};

mod wireguard;

pub(crate) async fn status(node: &NodeArgs, json_out: bool) -> Result<()> {
    let (pins, state, etcd) = (&node.pins, &node.state, &node.etcd);
    let subnet_path: &Path = &node.subnet_file;
    let dir = PinDir::new(&pins.bpffs_dir);
    // The wireguard backend: its devices, and host routing's programs
    // where they run (`CONFIG_F_WIREGUARD`; `legacy`: no maps).
    let wireguard = crate::dataplane::wireguard::devices_here()?;
    let wg_maps = PeerMaps::open(&dir)
        .and_then(|m| m.config())
        .map(|c| c.flags & dataplane_common::CONFIG_F_WIREGUARD != 0);
    if !wireguard.is_empty() && !matches!(wg_maps, Ok(false)) {
        let fast = match wg_maps {
            Ok(_) => Some(wireguard::FastView {
                counters: Counters::open(&dir)?.all()?,
                endpoints: EndpointMap::open(&dir)?.all()?.len(),
            }),
            Err(_) => None,
        };
        return wireguard::print(
            &wireguard,
            fast,
            lease::read_subnet(&node.subnet_file).ok().flatten(),
            report::read(&state.state_dir),
            json_out,
        );
    }
    let maps = PeerMaps::open(&dir)?;
    let cfg = maps.config()?;
    let counters = Counters::open(&dir)?.all()?;
    let capacity = maps.capacity()?;
    let agent = report::read(&state.state_dir);
    let mut peers: Vec<_> = maps.peers()?.into_values().collect();
    peers.sort_by_key(|p| p.subnet);
    let direct = maps.direct_subnets()?;
    let path = |s: &ipnet::IpNet| {
        if direct.contains(s) {
            "direct"
        } else {
            "vxlan"
        }
    };
    let nl = Netlink::new()?;
    let mut attach = Vec::new();
    let mut pod_veths = 0;
    for (hook, iface, ifindex) in pinned_links(&dir)? {
        let program = pinned_program(&dir, hook, &iface, ifindex).unwrap_or_else(|| "?".into());
        if program == dataplane_common::program_names::FROM_POD {
            pod_veths += 1;
            continue;
        }
        let mode = match hook {
            Hook::Xdp => match nl.link(&iface).await?.and_then(|l| l.xdp) {
                Some(x) => x.mode.map_or("attached", |m| m.as_str()).to_string(),
                None => "detached".into(),
            },
            _ => "-".into(),
        };
        attach.push((iface, hook.name(), program, mode));
    }
    let endpoints = EndpointMap::open(&dir)
        .and_then(|m| m.all())
        .map(|m| m.len())
        .unwrap_or(0);
    let uplink = nl.link_by_index(cfg.uplink_ifindex).await?;
    let subnet = lease::read_subnet(subnet_path).ok().flatten();

    // The lease's time to live, if etcd answers quickly.
    let lease = match subnet {
        Some(s) => {
            let key = format!("{}/subnets/{}", etcd.prefix(), s.key());
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
    let v6 = cfg.flags & dataplane_common::CONFIG_F_IPV6 != 0;
    let local6 = v6.then(|| Ipv6Addr::from(cfg.local_addr6));
    if json_out {
        let doc = json!({
            "subnet": subnet.and_then(|s| s.v4).map(|s| s.to_string()),
            "subnet6": subnet.and_then(|s| s.v6).map(|s| s.to_string()),
            "lease": lease,
            "public_ip": local.to_string(),
            "public_ipv6": local6.map(|a| a.to_string()),
            "vni": cfg.vni,
            "port": cfg.port,
            "vtep_mac": MacAddr(cfg.vtep_mac).to_string(),
            "vtep6_mac": v6.then(|| MacAddr(cfg.vtep6_mac).to_string()),
            "uplink": uplink.as_ref().map(|l| json!({"name": l.name, "ifindex": l.index, "mtu": l.mtu})),
            "attached": attach.iter().map(|(i, h, p, m)| json!({"iface": i, "hook": h, "program": p, "xdp_mode": m})).collect::<Vec<_>>(),
            "peers": peers.iter().map(|p| json!({"subnet": p.subnet.to_string(), "vtep": p.vtep.to_string(), "mac": p.mac.to_string(), "path": path(&p.subnet)})).collect::<Vec<_>>(),
            "peer_capacity": capacity,
            "endpoints": endpoints,
            "pod_veth_programs": pod_veths,
            "agent": agent,
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
    if let Some(l6) = local6 {
        println!(
            "  VTEP IPv6  {l6}  MAC {}  device MTU {}",
            MacAddr(cfg.vtep6_mac),
            cfg.overlay6_mtu
        );
    }
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
    println!(
        "  weft_from_pod on {pod_veths} pod device(s) (veth or netkit); {endpoints} local pod(s) in the endpoint map"
    );
    if let Some(d) = agent.as_ref().and_then(|r| r.decap.as_ref()) {
        println!("  decapsulation: {} ({})", d.hook, d.why);
    }
    if let Some(r) = &agent {
        println!("  host routing: {}", r.host_routing);
        if r.endpoints_adopted > 0 {
            println!(
                "  adopted: {} pod attachment(s) made without Weft's plugin (from the runtime's CNI result cache)",
                r.endpoints_adopted
            );
        }
        println!(
            "  masquerade: {}",
            if r.masquerade {
                "on (--ip-masq)"
            } else {
                "off"
            }
        );
        if r.trace_drops {
            println!("  drop trace: on (every drop in the agent's log; `weft trace-drops off`)");
        }
        if let Some(m) = r.mtu {
            println!("  overlay MTU: {m}");
        }
        if let Some(p) = &r.programs {
            print_programs(p);
        }
        if let Some(k) = &r.kernel {
            print_kernel(k);
        }
    }
    println!("\nPeers ({} of {capacity})", peers.len());
    let health: std::collections::HashMap<String, &crate::report::PeerHealth> = agent
        .as_ref()
        .map(|r| {
            r.peer_health
                .iter()
                .map(|h| (h.subnet.clone(), h))
                .collect()
        })
        .unwrap_or_default();
    println!(
        "  {:<18} {:<16} {:<18} {:<7} {:<12} {:<9} PATH MTU",
        "SUBNET", "VTEP", "MAC", "PATH", "HEALTH", "RTT"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for p in &peers {
        let h = health.get(&p.subnet.to_string());
        println!(
            "  {:<18} {:<16} {:<18} {:<7} {:<12} {:<9} {}",
            p.subnet.to_string(),
            p.vtep.to_string(),
            p.mac.to_string(),
            path(&p.subnet),
            h.map_or("-", |h| h.state.as_str()),
            h.and_then(|h| h.rtt_us)
                .map_or("-".to_string(), |us| format!(
                    "{:.1} ms",
                    us as f64 / 1000.0
                )),
            h.and_then(|h| h.path_mtu.map(|m| (m, h.path_mtu_measured)))
                .map_or("-".to_string(), |(m, at)| match at {
                    Some(at) => format!("{m} (measured {}s ago)", now.saturating_sub(at)),
                    None => m.to_string(),
                }),
        );
        if let Some(e) = h.and_then(|h| h.error.as_deref()) {
            println!("    last probe: {}", super::shown(e));
        }
    }
    if peers.len() as u32 >= capacity {
        println!("  the peer map is full: leases beyond it are not programmed; raise --max-peers");
    }
    match &agent {
        None => println!(
            "\nAgent: no report in {} (is the agent running with this --state-dir?)",
            state.state_dir.display()
        ),
        Some(r) => {
            println!("\nAgent: {}", if r.ready { "ready" } else { "NOT READY" });
            if let Some(c) = &r.conflict {
                println!(
                    "  PUBLIC IP CONFLICT: node {:?} claims this node's public IP too (cloned machines, or one --public-ip for two nodes); give each node its own address",
                    c.node
                );
            }
            if let Some(o) = &r.old_subnet {
                println!(
                    "  waiting for {} local pod(s) to leave the old subnet {}: recreate them",
                    o.pods, o.subnet
                );
            }
            if !r.problems.is_empty() {
                println!(
                    "\nPeers not programmed ({}), retried with backoff",
                    r.problems.len()
                );
                for p in &r.problems {
                    println!(
                        "  {:<18} {:<16} {:<9} {}",
                        p.subnet, p.vtep, p.problem, p.error
                    );
                }
            }
            if !r.endpoints_rejected.is_empty() {
                println!(
                    "\nPods not fit for host routing ({}), on the host stack",
                    r.endpoints_rejected.len()
                );
                for e in &r.endpoints_rejected {
                    println!("  {}: {}", super::shown(&e.owner), super::shown(&e.why));
                }
            }
            if !r.rejected.is_empty() {
                println!("\nLeases rejected ({})", r.rejected.len());
                for l in &r.rejected {
                    println!(
                        "  {} ({}): {}",
                        super::shown(&l.key),
                        l.reason,
                        super::shown(&l.detail)
                    );
                }
            }
        }
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

async fn lease_ttl(o: &EtcdOptions, key: &str) -> Result<String> {
    let store = EtcdStore::connect(o).await?;
    let Some(kv) = store.get(key).await? else {
        return Ok(format!("{key}: not in etcd"));
    };
    if kv.lease == 0 {
        return Ok(format!("{key} (reservation, no TTL)"));
    }
    Ok(match store.ttl(kv.lease).await? {
        Some(ttl) => format!("{key}, TTL {ttl}s"),
        None => format!("{key}, its etcd lease has expired"),
    })
}

/// The self-test of the agent's build and what followed from it.
/// The kernel's features as the agent probed them at start: one line
/// each, and for a missing one what it costs and what the node does
/// instead.
pub(super) fn print_kernel(k: &crate::report::Kernel) {
    println!("\nKernel features (Linux {})", k.release);
    for f in &k.features {
        let state = match (f.available, f.required) {
            (true, _) => "available",
            (false, true) => "unavailable (required)",
            (false, false) => "unavailable",
        };
        println!("  {:<17} {state:<11} {}", f.name, f.detail);
        if let (Some(lost), Some(instead)) = (&f.lost, &f.instead) {
            println!("  {:<17} lost: {lost}", "");
            println!("  {:<17} instead: {instead}", "");
        }
    }
}

fn print_programs(p: &crate::report::Programs) {
    let ids = p
        .ids
        .iter()
        .map(|(n, id)| format!("{n}={id}"))
        .collect::<Vec<_>>()
        .join(" ");
    if p.selftest_failed.is_empty() && p.selftest_cases == 0 {
        println!("  programs: installed on a node without programs (no self-test)");
    } else if p.selftest_failed.is_empty() {
        println!(
            "  programs: self-test passed ({} cases) before they went into the running links",
            p.selftest_cases
        );
    } else {
        println!(
            "  programs: UPGRADE REFUSED: this build's programs failed {} of {} self-test cases; the programs that ran before still run",
            p.selftest_failed.len(),
            p.selftest_cases
        );
        for f in p.selftest_failed.iter().take(5) {
            println!("    failed: {}", super::shown(f));
        }
    }
    match (&p.rollback_reason, p.rolled_back) {
        (Some(why), _) => println!(
            "  programs: ROLLED BACK by the agent after the swap: {}",
            super::shown(why)
        ),
        (None, true) => {
            println!("  programs: rolled back (weft rollback) to the previous generation")
        }
        (None, false) => {}
    }
    if !p.verified {
        println!(
            "  programs: NOT VERIFIED: they have not reached the peers through the tunnel yet (checked again and again; the node is not ready meanwhile)"
        );
    }
    println!("  program ids: {ids}");
}
