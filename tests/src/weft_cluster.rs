//! A cluster of real `weft agent` processes: an underlay bridge, an etcd
//! inside the underlay namespace (198.18.0.254:2379), nodes whose agents run
//! in their own namespaces with their own bpffs directories, and pods
//! attached the way the flannel CNI plugin attaches them once the node's
//! subnet is known.

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, Result};
use weft::{dataplane::maps::PeerMaps, lease::subnet::Ipv4Net};

use crate::{agent::Agent, cluster::Node, cluster::Underlay, etcd::Etcd, pins::TestPins};

pub const ETCD_IP: &str = "198.18.0.254";
pub const PREFIX: &str = "/coreos.com/network";
pub const CONFIG: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#;

pub struct WeftNode {
    pub node: Node,
    pub agent: Agent,
    pub pins: TestPins,
    pub subnet: Ipv4Net,
    /// When the agent's subnet file appeared (its lease was acquired).
    pub acquired_at: std::time::Instant,
}

pub struct WeftCluster {
    pub nodes: Vec<WeftNode>,
    pub etcd: Etcd,
    pub underlay: Underlay,
}

impl WeftCluster {
    pub fn new(n: u8, extra: &[&str]) -> Result<Self> {
        Self::with_config(n, CONFIG, extra)
    }

    pub fn with_config(n: u8, config: &str, extra: &[&str]) -> Result<Self> {
        crate::require_root();
        let underlay = Underlay::new()?;
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

    /// Starts node `i`'s agent, waits for its subnet, then adds two pods.
    pub fn add_node(&mut self, i: u8, extra: &[&str]) -> Result<&WeftNode> {
        self.start_node(i, extra)?;
        let n = self.nodes.last_mut().expect("just added");
        n.node
            .pods_for(n.subnet.addr(), n.subnet.prefix_len(), 2, 1450)?;
        Ok(n)
    }

    /// Starts node `i`'s agent and waits for its subnet; no pods yet.
    pub fn start_node(&mut self, i: u8, extra: &[&str]) -> Result<&mut WeftNode> {
        let node = Node::new(&self.underlay, i)?;
        let pins = TestPins::new();
        let mut args: Vec<String> = [
            "--etcd-endpoints",
            &format!("http://{ETCD_IP}:2379"),
            "--iface",
            "eth0",
            "--node-id",
            &format!("node-{i}"),
            "--bpffs-dir",
            pins.path().to_str().unwrap(),
            "--healthz-port",
            "9090",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let agent = Agent::start(&format!("node{i}"), Some(&node.ns), &args)?;
        let line = agent.wait_subnet(Duration::from_secs(30))?;
        let acquired_at = std::time::Instant::now();
        let (ip, len) = line.split_once('/').context("FLANNEL_SUBNET")?;
        let ip: Ipv4Addr = ip.parse()?;
        let len: u8 = len.parse()?;
        let subnet = Ipv4Net::containing(ip, len);
        self.nodes.push(WeftNode {
            node,
            agent,
            pins,
            subnet,
            acquired_at,
        });
        Ok(self.nodes.last_mut().unwrap())
    }

    pub fn pod_ips(&self) -> Vec<Ipv4Addr> {
        self.nodes
            .iter()
            .flat_map(|n| n.node.pods.iter().map(|p| p.ip))
            .collect()
    }

    /// Whether every pod reaches every other pod.
    pub fn all_pairs_reach(&self) -> Result<(), String> {
        let all = self.pod_ips();
        for n in &self.nodes {
            for pod in &n.node.pods {
                for dst in &all {
                    if *dst != pod.ip && !crate::cluster::ping(&pod.ns, *dst, 1) {
                        return Err(format!("{} cannot reach {dst}", pod.ip));
                    }
                }
            }
        }
        Ok(())
    }
}

impl WeftNode {
    /// The subnets in this agent's pinned peer map.
    pub fn peer_subnets(&self) -> Vec<Ipv4Net> {
        PeerMaps::open(self.pins.pins())
            .and_then(|m| m.peers())
            .map(|p| p.into_keys().collect())
            .unwrap_or_default()
    }

    /// Runs `weft ARGS` inside this node's namespace, pointed at this node's
    /// pins, subnet file and the cluster's etcd where the command takes them.
    pub fn weft(&self, args: &[&str]) -> Result<String> {
        let pins = self.pins.path().to_str().unwrap().to_string();
        let subnet_file = self.agent.subnet_file().to_str().unwrap().to_string();
        let etcd = format!("http://{ETCD_IP}:2379");
        let mut full: Vec<&str> = args.to_vec();
        full.extend(["--bpffs-dir", &pins]);
        if args.first() == Some(&"status") {
            full.extend(["--subnet-file", &subnet_file, "--etcd-endpoints", &etcd]);
        }
        self.node
            .ns
            .exec(crate::agent::weft_bin().to_str().unwrap(), &full)
    }

    pub fn lease_key(&self) -> String {
        format!("{PREFIX}/subnets/{}", self.subnet.to_key())
    }
}

/// GET `path` from `ip:port` inside `ns`; returns (status line, body).
pub fn http_get(
    ns: &crate::netns::Netns,
    ip: Ipv4Addr,
    port: u16,
    path: &str,
) -> Result<(String, String)> {
    let path = path.to_string();
    ns.run(move || -> Result<(String, String)> {
        use std::io::{Read as _, Write as _};
        let mut s =
            std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let (head, body) = out.split_once("\r\n\r\n").context("HTTP response")?;
        Ok((
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        ))
    })?
}
