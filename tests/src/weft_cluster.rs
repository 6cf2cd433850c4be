//! A cluster of real `weft agent` processes: an underlay bridge, an etcd
//! inside the underlay namespace (198.18.0.254:2379), nodes whose agents run
//! in their own namespaces with their own bpffs directories, and pods
//! attached the way the flannel CNI plugin attaches them once the node's
//! subnet is known.

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, Result};
use ipnet::Ipv4Net;
use weft::dataplane::PeerMaps;

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

/// An agent started on a node, not yet part of the cluster.
pub struct Started {
    pub node: Node,
    pub agent: Agent,
    pub pins: TestPins,
}

pub struct WeftCluster {
    pub nodes: Vec<WeftNode>,
    pub etcd: Etcd,
    pub underlay: Underlay,
    /// How agents reach etcd (default: the one member in the underlay
    /// namespace); a test with its own etcd cluster replaces it.
    pub etcd_args: Vec<String>,
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
            etcd_args: vec!["--etcd-endpoints".into(), format!("http://{ETCD_IP}:2379")],
        };
        for i in 1..=n {
            c.add_node(i, extra)?;
        }
        Ok(c)
    }

    /// Starts node `i`'s agent, waits for its subnet, then adds two pods
    /// (attached by bridge + host-local, with Weft's plugin chained).
    pub fn add_node(&mut self, i: u8, extra: &[&str]) -> Result<&WeftNode> {
        self.start_node(i, extra)?;
        let n = self.nodes.last_mut().expect("just added");
        n.use_cni();
        for _ in 0..2 {
            n.node.add_pod()?;
        }
        n.wait_adopted()?;
        Ok(n)
    }

    /// Starts node `i`'s agent and waits for its subnet; no pods yet.
    pub fn start_node(&mut self, i: u8, extra: &[&str]) -> Result<&mut WeftNode> {
        let node = Node::new(&self.underlay, i)?;
        self.start_node_on(node, extra)
    }

    /// Starts an agent on `node` (set up by the caller) and waits for its
    /// subnet.
    pub fn start_node_on(&mut self, node: Node, extra: &[&str]) -> Result<&mut WeftNode> {
        let s = self.start_agent(node, TestPins::new(), extra)?;
        self.adopt(s)
    }

    /// Starts an agent on `node` with `pins`, without waiting for anything.
    pub fn start_agent(&self, node: Node, pins: TestPins, extra: &[&str]) -> Result<Started> {
        let args = self.agent_args(&node, &pins, extra);
        let agent = Agent::start(&format!("node{}", node.index), Some(&node.ns), &args)?;
        Ok(Started { node, agent, pins })
    }

    /// Like [`WeftCluster::start_agent`], the agent started inside
    /// `cgroup` (a memory limit, say).
    pub fn start_agent_in_cgroup(
        &self,
        node: Node,
        pins: TestPins,
        extra: &[&str],
        cgroup: &std::path::Path,
    ) -> Result<Started> {
        let args = self.agent_args(&node, &pins, extra);
        let agent = Agent::start_in_cgroup(
            &format!("node{}", node.index),
            Some(&node.ns),
            &args,
            cgroup,
        )?;
        Ok(Started { node, agent, pins })
    }

    /// The command line of node `node`'s agent.
    pub fn agent_args(&self, node: &Node, pins: &TestPins, extra: &[&str]) -> Vec<String> {
        let i = node.index;
        let mut args: Vec<String> = self.etcd_args.clone();
        if !extra.contains(&"--node-id") {
            args.extend(["--node-id".to_string(), format!("node-{i}")]);
        }
        args.extend(
            [
                "--bpffs-dir",
                pins.path().to_str().unwrap(),
                "--healthz-port",
                "9090",
                "--cni-ipam-dir",
                node.ipam_dir.to_str().unwrap(),
                "--cni-cache-dir",
                node.cni_cache_dir.to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        if !extra.contains(&"--iface") {
            args.extend(["--iface".to_string(), "eth0".to_string()]);
        }
        if !extra.contains(&"--host-routing") {
            args.extend([
                "--host-routing".to_string(),
                crate::host_routing().to_string(),
            ]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Waits for a started agent's subnet and adds its node to the cluster.
    pub fn adopt(&mut self, s: Started) -> Result<&mut WeftNode> {
        let line = s.agent.wait_subnet(Duration::from_secs(30))?;
        let acquired_at = std::time::Instant::now();
        let (ip, len) = line.split_once('/').context("FLANNEL_SUBNET")?;
        let ip: Ipv4Addr = ip.parse()?;
        let len: u8 = len.parse()?;
        let subnet = Ipv4Net::new(ip, len)?.trunc();
        self.nodes.push(WeftNode {
            node: s.node,
            agent: s.agent,
            pins: s.pins,
            subnet,
            acquired_at,
        });
        Ok(self.nodes.last_mut().unwrap())
    }

    /// Makes `f` a flannel node of this cluster, as flanneld would: its
    /// `flannel.1` holding `subnet`, the lease (with a TTL, as flannel's
    /// are) and its routes, FDB and neighbour entries to every Weft node.
    pub fn flannel_up(&self, f: &Node, subnet: Ipv4Net) {
        let mac = crate::cluster::flannel_device(f, subnet).unwrap();
        let lease = self.etcd.etcdctl(&["lease", "grant", "86400"]).unwrap();
        let id = lease.split_whitespace().nth(1).unwrap().to_string();
        self.etcd
            .etcdctl(&[
                "put",
                &format!("--lease={id}"),
                &format!("{PREFIX}/subnets/{}", weft::lease::to_key(&subnet)),
                &serde_json::json!({
                    "PublicIP": f.ip.to_string(), "PublicIPv6": null, "BackendType": "vxlan",
                    "BackendData": {"VNI": 1, "VtepMAC": mac.to_string()},
                })
                .to_string(),
            ])
            .unwrap();
        for n in &self.nodes {
            crate::cluster::flannel_peer(f, n.subnet, n.node.ip, n.vtep_mac()).unwrap();
        }
    }

    /// Waits until every node has every other node in its peer map.
    pub fn wait_meshed(&self, within: Duration) {
        let others = self.nodes.len() - 1;
        crate::agent::eventually("every node has every other as its peer", within, || {
            self.nodes
                .iter()
                .all(|n| n.peer_subnets().len() == others)
                .then_some(())
        });
    }

    /// `n` /24s of `CONFIG`'s network (from 10.244.200.0 up) that no node
    /// holds: a test's own lease on a fixed subnet could land on one a node
    /// drew at random, which would be a lease loss, not what it tests.
    pub fn free_subnets(&self, n: usize) -> Vec<Ipv4Net> {
        (200..=255u8)
            .map(|i| Ipv4Net::new(Ipv4Addr::new(10, 244, i, 0), 24).unwrap())
            .filter(|s| self.nodes.iter().all(|node| node.subnet != *s))
            .take(n)
            .collect()
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
    /// Attaches pods of this node's subnet from now on the way the README
    /// sets it up: flannel's bridge + host-local, Weft's plugin chained.
    /// With `WEFT_TEST_CNI=unchained`, as flannel's plugin does, without
    /// Weft's plugin: the agent adopts the pods from the runtime's cache.
    /// The pods' MTU is the agent's subnet file's `FLANNEL_MTU`, as
    /// flannel's plugin reads it.
    pub fn use_cni(&mut self) {
        let mtu = self.subnet_file_mtu();
        if std::env::var("WEFT_TEST_CNI").as_deref() == Ok("unchained") {
            self.node.use_subnet(self.subnet, mtu);
            return;
        }
        let state = self.agent.state_dir();
        self.node.use_subnet_weft(self.subnet, mtu, &state);
    }

    /// `FLANNEL_MTU` of the agent's subnet file.
    pub fn subnet_file_mtu(&self) -> u32 {
        let env = std::fs::read_to_string(self.agent.subnet_file()).expect("the subnet file");
        env.lines()
            .find_map(|l| l.strip_prefix("FLANNEL_MTU="))
            .and_then(|v| v.trim().parse().ok())
            .expect("FLANNEL_MTU in the subnet file")
    }

    /// With pods attached without Weft's plugin (`WEFT_TEST_CNI=unchained`)
    /// and host routing on: waits until the agent has adopted them all
    /// (it reads the runtime's cache each second), as Weft's plugin would
    /// have registered them at ADD.
    pub fn wait_adopted(&self) -> Result<()> {
        if std::env::var("WEFT_TEST_CNI").as_deref() != Ok("unchained")
            || crate::host_routing() == "legacy"
        {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + crate::scaled(Duration::from_secs(30));
        loop {
            let n = weft::dataplane::EndpointMap::open(self.pins.pins())
                .and_then(|m| m.all())
                .map(|a| a.len())
                .unwrap_or(0);
            if n >= self.node.pods.len() {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("{n} of {} pods adopted", self.node.pods.len());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The IPv4 subnets in this agent's pinned peer map.
    pub fn peer_subnets(&self) -> Vec<Ipv4Net> {
        self.peer_nets()
            .into_iter()
            .filter_map(|n| match n {
                ipnet::IpNet::V4(s) => Some(s),
                ipnet::IpNet::V6(_) => None,
            })
            .collect()
    }

    /// The IPv6 subnets in this agent's pinned peer map.
    pub fn peer_subnets6(&self) -> Vec<ipnet::Ipv6Net> {
        self.peer_nets()
            .into_iter()
            .filter_map(|n| match n {
                ipnet::IpNet::V6(s) => Some(s),
                ipnet::IpNet::V4(_) => None,
            })
            .collect()
    }

    fn peer_nets(&self) -> Vec<ipnet::IpNet> {
        PeerMaps::open(self.pins.pins())
            .and_then(|m| m.peers())
            .map(|p| p.into_keys().collect())
            .unwrap_or_default()
    }

    /// The agent's metrics (`/metrics`), by series (`name{labels}`).
    pub fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let (_, body) = http_get(&self.node.ns, self.node.ip, 9090, "/metrics")
            .expect("the agent serves /metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    /// One series of [`WeftNode::metrics`] (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics().get(series).copied().unwrap_or(0.0)
    }

    /// Waits until one series of the agent's `/metrics` satisfies `ok`;
    /// returns its value.
    pub fn wait_metric(&self, series: &str, ok: impl Fn(f64) -> bool, within: Duration) -> f64 {
        crate::agent::eventually(&format!("{}: {series}", self.agent.name), within, || {
            Some(self.metric(series)).filter(|v| ok(*v))
        })
    }

    /// Waits until the running agent process reports its eBPF dataplane
    /// up (its status report names this process and where decapsulation
    /// runs).
    pub fn wait_dataplane_up(&self, within: Duration) {
        let pid = self.agent.pid();
        crate::agent::eventually(
            &format!("{}: dataplane up", self.agent.name),
            within,
            || {
                let r = self.status_json()?;
                (r["pid"].as_i64() == Some(i64::from(pid)) && r["decap"]["hook"].is_string())
                    .then_some(())
            },
        )
    }

    /// The agent's status report (`<state-dir>/status.json`), once written.
    pub fn status_json(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.agent.state_dir().join("status.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The leases the agent's status report lists as rejected: (key, reason).
    pub fn rejected(&self) -> Vec<(String, String)> {
        self.status_json()
            .and_then(|v| v["rejected"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|r| {
                Some((
                    r["key"].as_str()?.to_string(),
                    r["reason"].as_str()?.to_string(),
                ))
            })
            .collect()
    }

    /// One series of the agent's metrics; None when the agent does not
    /// answer or does not export it.
    pub fn series(&self, series: &str) -> Option<f64> {
        let (_, body) = http_get(&self.node.ns, self.node.ip, 9090, "/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// `weft doctor`'s findings (stdout) on the kernel and what the agent
    /// keeps in its state directory, run from the host's namespace with
    /// the shortest peer probes (the kernel's lines do not need them).
    pub fn doctor_from_host(&self) -> String {
        let state = self.agent.state_dir();
        crate::agent::weft(&[
            "doctor",
            "--probe-timeout",
            "0.1",
            "--state-dir",
            state.to_str().unwrap(),
        ])
        .1
    }

    /// Runs `weft ARGS` inside this node's namespace, pointed at this node's
    /// pins, subnet file and the cluster's etcd where the command takes them.
    pub fn weft(&self, args: &[&str]) -> Result<String> {
        let pins = self.pins.path().to_str().unwrap().to_string();
        let subnet_file = self.agent.subnet_file().to_str().unwrap().to_string();
        let etcd = format!("http://{ETCD_IP}:2379");
        let state = self.agent.state_dir().to_str().unwrap().to_string();
        let mut full: Vec<&str> = args.to_vec();
        if matches!(
            args.first(),
            Some(&"status")
                | Some(&"teardown")
                | Some(&"counters")
                | Some(&"rollback")
                | Some(&"bundle")
        ) {
            full.extend(["--bpffs-dir", &pins]);
        }
        if matches!(
            args.first(),
            Some(&"status") | Some(&"teardown") | Some(&"bundle")
        ) {
            full.extend(["--state-dir", &state]);
        }
        if matches!(args.first(), Some(&"status") | Some(&"bundle")) {
            full.extend(["--subnet-file", &subnet_file, "--etcd-endpoints", &etcd]);
        }
        self.node
            .ns
            .exec(crate::agent::weft_bin().to_str().unwrap(), &full)
    }

    /// The MAC of this node's overlay device (its VtepMAC).
    pub fn vtep_mac(&self) -> weft::mac::MacAddr {
        let out = self.node.ns.ip(&["-j", "link", "show", "weft.1"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["address"].as_str().unwrap().parse().unwrap()
    }

    pub fn lease_key(&self) -> String {
        format!("{PREFIX}/subnets/{}", weft::lease::to_key(&self.subnet))
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
        s.set_read_timeout(Some(crate::scaled(Duration::from_secs(5))))?;
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
