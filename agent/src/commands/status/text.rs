//! `weft status` as text: the node, its programs, its peers with their
//! health, the agent's state, the counters.

use std::path::Path;

use super::gather::NodeStatus;
use crate::{commands::shown, report::Report};

pub(super) fn print(s: &NodeStatus, state_dir: &Path) {
    node(s);
    programs(s);
    peers(s);
    match &s.agent {
        None => println!(
            "\nAgent: no report in {} (is the agent running with this --state-dir?)",
            state_dir.display()
        ),
        Some(r) => agent(r),
    }
    println!("\nCounters");
    for (r, c) in &s.counters {
        println!(
            "  {:<18} {:>12} packets {:>15} bytes",
            r.name(),
            c.packets,
            c.bytes
        );
    }
}

/// The node: its subnets, lease, VTEPs and uplink.
fn node(s: &NodeStatus) {
    println!("Node");
    println!(
        "  subnet     {}",
        s.subnets
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown".into())
    );
    println!("  lease      {}", s.lease);
    println!(
        "  VTEP       {}  VNI {}  UDP {}  MAC {}",
        s.public_ip, s.vni, s.port, s.vtep_mac
    );
    if let (Some(l6), Some(mac6)) = (s.public_ipv6, &s.vtep6_mac) {
        println!(
            "  VTEP IPv6  {l6}  MAC {mac6}  device MTU {}",
            s.overlay6_mtu
        );
    }
    if let Some(u) = &s.uplink {
        println!(
            "  uplink     {} (ifindex {}, MTU {})",
            u.name, u.ifindex, u.mtu
        );
    }
}

/// The programs in the links, and what the agent says of them and of
/// the kernel.
fn programs(s: &NodeStatus) {
    println!("\nAttached programs");
    for a in &s.attached {
        println!(
            "  {:<12} {:<11} {:<14} {}",
            a.iface, a.hook, a.program, a.xdp_mode
        );
    }
    println!(
        "  weft_from_pod on {} pod device(s) (veth or netkit); {} local pod(s) in the endpoint map",
        s.pod_veth_programs, s.endpoints
    );
    let agent = &s.agent;
    if let Some(d) = agent.as_ref().and_then(|r| r.decap.as_ref()) {
        println!("  decapsulation: {} ({})", d.hook, d.why);
    }
    if let Some(r) = agent {
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
}

/// The peers, with their health as the agent last probed it.
fn peers(s: &NodeStatus) {
    let agent = &s.agent;
    println!("\nPeers ({} of {})", s.peers.len(), s.peer_capacity);
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
    for p in &s.peers {
        let h = health.get(&p.subnet.to_string());
        println!(
            "  {:<18} {:<16} {:<18} {:<7} {:<12} {:<9} {}",
            p.subnet.to_string(),
            p.vtep,
            p.mac,
            p.path,
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
            println!("    last probe: {}", shown(e));
        }
    }
    if s.peers.len() as u32 >= s.peer_capacity {
        println!("  the peer map is full: leases beyond it are not programmed; raise --max-peers");
    }
}

/// The agent's readiness, and what keeps it from being ready or from
/// programming a peer, a pod or a lease.
fn agent(r: &Report) {
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
            println!("  {}: {}", shown(&e.owner), shown(&e.why));
        }
    }
    if r.skipped_keys > 0 {
        println!(
            "\nKeys under the subnets prefix that hold no lease ({}), skipped",
            r.skipped_keys
        );
        for (key, why) in &r.skipped_examples {
            println!("  {}: {}", shown(key), shown(why));
        }
    }
    if !r.rejected.is_empty() {
        let total = r.rejected_total.max(r.rejected.len());
        if total > r.rejected.len() {
            println!(
                "\nLeases rejected ({total}; the first {} by key)",
                r.rejected.len()
            );
        } else {
            println!("\nLeases rejected ({total})");
        }
        for l in &r.rejected {
            println!("  {} ({}): {}", shown(&l.key), l.reason, shown(&l.detail));
        }
    }
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
            println!("    failed: {}", shown(f));
        }
    }
    match (&p.rollback_reason, p.rolled_back) {
        (Some(why), _) => println!(
            "  programs: ROLLED BACK by the agent after the swap: {}",
            shown(why)
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
