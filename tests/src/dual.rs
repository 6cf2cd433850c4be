//! Clusters of real `weft agent` processes on a network with IPv6: the
//! underlay carries IPv4 (node i at 198.18.0.i, etcd at 198.18.0.254) and
//! IPv6 (node i at fd00:18::i); pods are attached by Weft's standalone CNI
//! plugin, which hands out an address of every family subnet.env names.

use std::{
    net::{IpAddr, Ipv6Addr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use weft::lease::{SubnetEnv, Subnets};

use crate::{
    agent::Agent,
    cluster::{Node, Underlay},
    etcd::Etcd,
    pins::TestPins,
    weft_cluster::{ETCD_IP, PREFIX},
};

/// A dual-stack network: flannel's config with IPv6 enabled.
pub const DUAL: &str = r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#;
/// An IPv6-only network.
pub const V6_ONLY: &str = r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#;

/// Node `i`'s IPv6 address on the underlay.
pub fn underlay6(i: u8) -> Ipv6Addr {
    format!("fd00:18::{i:x}").parse().expect("an address")
}

pub struct DualNode {
    pub node: Node,
    pub agent: Agent,
    pub pins: TestPins,
    /// What its subnet.env names.
    pub subnets: Subnets,
    pub ip6: Ipv6Addr,
}

impl DualNode {
    /// Every address of this node's pods.
    pub fn pod_addrs(&self) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for p in &self.node.pods {
            if !p.ip.is_unspecified() {
                out.push(p.ip.into());
            }
            if let Some(v6) = p.ip6 {
                out.push(v6.into());
            }
        }
        out
    }

    /// The subnets (of both families) in the agent's pinned peer maps.
    pub fn peers(&self) -> Vec<ipnet::IpNet> {
        weft::dataplane::PeerMaps::open(self.pins.pins())
            .and_then(|m| m.peers())
            .map(|p| p.into_keys().collect())
            .unwrap_or_default()
    }

    pub fn counters(&self) -> weft::dataplane::Counters {
        weft::dataplane::Counters::open(self.pins.pins()).expect("the counters are pinned")
    }
}

pub struct DualCluster {
    pub nodes: Vec<DualNode>,
    pub etcd: Etcd,
    pub underlay: Underlay,
}

impl DualCluster {
    /// An etcd holding `config`, and `n` nodes with two pods each.
    pub fn new(n: u8, config: &str, extra: &[&str]) -> Result<Self> {
        crate::require_root();
        let underlay = Underlay::new()?;
        underlay.ns.enable_ipv6()?;
        underlay.host_addr(ETCD_IP)?;
        let etcd = Etcd::start_in(&underlay.ns, ETCD_IP)?;
        etcd.etcdctl(&["put", &format!("{PREFIX}/config"), config])?;
        let mut c = Self {
            nodes: Vec::new(),
            etcd,
            underlay,
        };
        for i in 1..=n {
            c.add_node(i, extra)?;
        }
        Ok(c)
    }

    /// Node `i` on the underlay with its IPv6 address, its agent, and (once
    /// subnet.env is written) two pods.
    pub fn add_node(&mut self, i: u8, extra: &[&str]) -> Result<&DualNode> {
        let mut node = Node::new(&self.underlay, i)?;
        node.ns.enable_ipv6()?;
        node.ipv6 = true;
        let ip6 = underlay6(i);
        node.ns.add_addr6("eth0", ip6, 64)?;
        let pins = TestPins::new();
        let mut args: Vec<String> = [
            "--etcd-endpoints",
            &format!("http://{ETCD_IP}:2379"),
            "--node-id",
            &format!("node-{i}"),
            "--bpffs-dir",
            pins.path().to_str().expect("a path"),
            "--healthz-port",
            "9090",
            "--cni-ipam-dir",
            node.ipam_dir.to_str().expect("a path"),
            "--cni-cache-dir",
            node.cni_cache_dir.to_str().expect("a path"),
            "--iface",
            "eth0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // The run's host routing, unless the test chooses its own.
        if !extra.contains(&"--host-routing") {
            args.extend([
                "--host-routing".to_string(),
                crate::host_routing().to_string(),
            ]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let agent = Agent::start(&format!("node{i}"), Some(&node.ns), &args)?;
        let subnets = wait_subnets(&agent, Duration::from_secs(30))?;
        let mut n = DualNode {
            node,
            agent,
            pins,
            subnets,
            ip6,
        };
        n.node.cni = Some(crate::cni::weft_standalone(
            &n.agent.subnet_file(),
            &n.agent.state_dir(),
            &n.node.ipam_dir,
        ));
        for _ in 0..2 {
            n.node.add_pod()?;
        }
        self.nodes.push(n);
        Ok(self.nodes.last().expect("just added"))
    }

    /// Waits until every node has every other node's subnets (both
    /// families) in its peer maps.
    pub fn wait_meshed(&self, within: Duration) {
        let want: usize = self
            .nodes
            .iter()
            .map(|n| usize::from(n.subnets.v4.is_some()) + usize::from(n.subnets.v6.is_some()))
            .sum();
        let meshed = crate::agent::poll(within, || {
            self.nodes
                .iter()
                .all(|n| {
                    let mine =
                        usize::from(n.subnets.v4.is_some()) + usize::from(n.subnets.v6.is_some());
                    n.peers().len() == want - mine
                })
                .then_some(())
        });
        if meshed.is_none() {
            // Who is missing whom, and what etcd holds.
            let seen: Vec<String> = self
                .nodes
                .iter()
                .map(|n| format!("node with {:?} has peers {:?}", n.subnets, n.peers()))
                .collect();
            let leases = self
                .etcd
                .etcdctl(&["get", "--prefix", "--keys-only", "/"])
                .unwrap_or_else(|e| e.to_string());
            panic!(
                "timed out after {:?} waiting for every node to have every other's subnets:\n{}\netcd keys:\n{leases}",
                crate::scaled(within),
                seen.join("\n")
            );
        }
    }

    /// Pings every pod address from every pod; the pairs that fail.
    pub fn unreachable_pairs(&self) -> Vec<String> {
        let all: Vec<IpAddr> = self.nodes.iter().flat_map(|n| n.pod_addrs()).collect();
        let mut failed = Vec::new();
        for n in &self.nodes {
            for p in &n.node.pods {
                let own4 = (!p.ip.is_unspecified()).then_some(IpAddr::from(p.ip));
                let own6 = p.ip6.map(IpAddr::from);
                for dst in &all {
                    let has_family = if dst.is_ipv4() {
                        own4.is_some()
                    } else {
                        own6.is_some()
                    };
                    if Some(*dst) == own4 || Some(*dst) == own6 || !has_family {
                        continue;
                    }
                    // A second try after a pause: the first pings of a
                    // fresh cluster may meet neighbour discovery on its
                    // new devices; an unreachable pod fails both.
                    if !crate::cluster::ping(&p.ns, *dst, 2) && {
                        std::thread::sleep(std::time::Duration::from_secs(1));
                        println!("{dst} did not answer at once; trying again");
                        !crate::cluster::ping(&p.ns, *dst, 2)
                    } {
                        let from = own4.or(own6).expect("a pod has an address");
                        failed.push(format!("{from} -> {dst}"));
                    }
                }
            }
        }
        failed
    }
}

/// Waits for the agent's subnet.env and reads its subnets.
pub fn wait_subnets(agent: &Agent, within: Duration) -> Result<Subnets> {
    let within = crate::scaled(within);
    let until = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(agent.subnet_file())
            && let Ok(env) = SubnetEnv::parse(&text)
        {
            return Ok(env.subnets());
        }
        if !agent.running() {
            bail!("agent {} exited:\n{}", agent.name, agent.log());
        }
        if Instant::now() > until {
            return Err(anyhow::anyhow!("no subnet.env within {within:?}"))
                .with_context(|| agent.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
