//! Clusters made of network namespaces: an underlay (a bridge in its own
//! namespace), nodes plugged into it, and pods attached to each node the way
//! the flannel CNI plugin attaches them (a `cni0` bridge holding the gateway
//! `<subnet>.1`, one veth per pod).
//!
//! Addresses: underlay 198.18.0.0/24 (RFC 2544 benchmarking range), node i
//! at 198.18.0.i; pods in 10.244.0.0/16. All of it exists only inside the
//! namespaces the test created.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use anyhow::{Context as _, Result};
use ipnet::Ipv4Net;

use crate::cni::ConfList;

use crate::netns::{Netns, mac, veth};

pub const UNDERLAY_PREFIX: &str = "198.18.0";

/// The underlay: a bridge `br0` in its own namespace.
pub struct Underlay {
    pub ns: Netns,
    ports: std::sync::atomic::AtomicU32,
}

impl Underlay {
    pub fn new() -> Result<Self> {
        let ns = Netns::new("wu")?;
        ns.ip(&["link", "add", "br0", "type", "bridge"])?;
        ns.ip(&["link", "set", "br0", "up"])?;
        Ok(Self {
            ns,
            ports: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// Plugs `iface` of `ns` into the bridge, with `addr/24`.
    pub fn plug(&self, ns: &Netns, iface: &str, addr: &str) -> Result<()> {
        self.plug_into("br0", ns, iface, addr)
    }

    /// A second L2 segment: bridge `bridge` in the underlay namespace,
    /// which holds `router/24` on it and routes between it and `br0`.
    pub fn add_segment(&self, bridge: &str, router: &str) -> Result<()> {
        self.ns.ip(&["link", "add", bridge, "type", "bridge"])?;
        self.ns.ip(&["link", "set", bridge, "up"])?;
        self.ns
            .ip(&["addr", "add", &format!("{router}/24"), "dev", bridge])?;
        self.ns.sysctl("net.ipv4.ip_forward", "1")
    }

    /// Plugs `iface` of `ns` into bridge `bridge`, with `addr/24`.
    pub fn plug_into(&self, bridge: &str, ns: &Netns, iface: &str, addr: &str) -> Result<()> {
        let n = self
            .ports
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = format!("p{n}");
        veth(ns, iface, &self.ns, &port)?;
        self.ns.ip(&["link", "set", &port, "master", bridge])?;
        ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", iface])?;
        Ok(())
    }

    /// Gives the underlay namespace itself an address on the bridge (to run
    /// a shared service such as etcd there).
    pub fn host_addr(&self, addr: &str) -> Result<()> {
        self.ns
            .ip(&["addr", "add", &format!("{addr}/24"), "dev", "br0"])?;
        Ok(())
    }
}

/// A pod: a namespace with `eth0`, attached by CNI plugins.
pub struct Pod {
    pub ns: Netns,
    /// Its IPv4 address (unspecified for a pod without one).
    pub ip: Ipv4Addr,
    /// Its IPv6 address, on a network with IPv6.
    pub ip6: Option<Ipv6Addr>,
    /// The host side of its veth.
    pub host_if: String,
    pub container_id: String,
    /// What CNI ADD returned (libcni keeps it for DEL and CHECK).
    pub result: serde_json::Value,
}

/// A node: a namespace with `eth0` on the underlay.
pub struct Node {
    pub ns: Netns,
    pub index: u8,
    pub ip: Ipv4Addr,
    pub pods: Vec<Pod>,
    /// The network pods are attached to (once the node's subnet is known).
    pub cni: Option<ConfList>,
    /// host-local's records of this node's pod addresses.
    pub ipam_dir: PathBuf,
    /// The runtime's (libcni's) cache: every attachment's result.
    pub cni_cache_dir: PathBuf,
    /// Pods get IPv6 (their namespaces have it on).
    pub ipv6: bool,
}

impl Node {
    pub fn new(underlay: &Underlay, index: u8) -> Result<Self> {
        let ns = Netns::new("wn")?;
        let ip = Ipv4Addr::new(198, 18, 0, index);
        underlay.plug(&ns, "eth0", &ip.to_string())?;
        Ok(Self::in_ns(ns, index, ip))
    }

    /// A node on the segment `bridge` (see [`Underlay::add_segment`]) at
    /// `ip`, reaching the rest of the underlay through `gateway`.
    pub fn on_segment(
        underlay: &Underlay,
        bridge: &str,
        index: u8,
        ip: Ipv4Addr,
        gateway: Ipv4Addr,
    ) -> Result<Self> {
        let ns = Netns::new("wn")?;
        underlay.plug_into(bridge, &ns, "eth0", &ip.to_string())?;
        ns.ip(&["route", "add", "default", "via", &gateway.to_string()])?;
        Ok(Self::in_ns(ns, index, ip))
    }

    /// A node in an existing namespace.
    pub fn in_ns(ns: Netns, index: u8, ip: Ipv4Addr) -> Self {
        let ipam_dir = std::env::temp_dir().join(crate::unique("weft-ipam-"));
        let cni_cache_dir = std::env::temp_dir().join(crate::unique("weft-cni-cache-"));
        Self {
            ns,
            index,
            ip,
            pods: Vec::new(),
            cni: None,
            ipam_dir,
            cni_cache_dir,
            ipv6: false,
        }
    }

    pub fn mac(&self) -> String {
        mac(&self.ns, "eth0").expect("eth0 has a MAC")
    }

    /// Attaches pods of `subnet` from now on, with the network flannel's CNI
    /// plugin would set up from subnet.env (network 10.244.0.0/16).
    pub fn use_subnet(&mut self, subnet: Ipv4Net, mtu: u32) {
        self.cni = Some(crate::cni::flannel_like(
            subnet,
            "10.244.0.0/16".parse().expect("valid"),
            mtu,
            &self.ipam_dir,
        ));
    }

    /// Like [`Node::use_subnet`], with Weft's CNI plugin chained after
    /// (registering endpoints in `state_dir` for host routing).
    pub fn use_subnet_weft(&mut self, subnet: Ipv4Net, mtu: u32, state_dir: &std::path::Path) {
        self.use_subnet(subnet, mtu);
        if let Some(c) = self.cni.as_mut() {
            crate::cni::chain_weft(c, state_dir);
        }
    }

    /// Attaches a pod through the node's CNI network, as a runtime does.
    pub fn add_pod(&mut self) -> Result<&Pod> {
        self.add_pod_with("")
    }

    /// Attaches a pod with extra CNI_ARGS (`IP=...` asks host-local for an
    /// address).
    pub fn add_pod_with(&mut self, cni_args: &str) -> Result<&Pod> {
        let cni = self
            .cni
            .as_ref()
            .context("no CNI network on this node yet (use_subnet)")?;
        let ns = Netns::new("wp")?;
        if self.ipv6 {
            ns.enable_ipv6()?;
        }
        let container_id = crate::cni::container_id(ns.name());
        let a = cni.add_with(&self.ns, &container_id, &ns, "eth0", cni_args)?;
        crate::cni::cache_result(
            &self.cni_cache_dir,
            cni,
            &container_id,
            "eth0",
            &ns,
            &a.result,
        )?;
        self.pods.push(Pod {
            ns,
            ip: a.ip,
            ip6: a.ip6,
            host_if: a.host_if,
            container_id,
            result: a.result,
        });
        Ok(self.pods.last().expect("just added"))
    }

    /// Deletes pod `i` as a runtime does (CNI DEL, then the namespace).
    pub fn del_pod(&mut self, i: usize) -> Result<Pod> {
        let pod = self.pods.remove(i);
        let cni = self.cni.as_ref().context("no CNI network")?;
        cni.del(
            &self.ns,
            &pod.container_id,
            Some(&pod.ns),
            "eth0",
            Some(&pod.result),
        )?;
        crate::cni::uncache_result(&self.cni_cache_dir, cni, &pod.container_id, "eth0");
        Ok(pod)
    }

    /// `n` pods on `subnet`, attached by CNI (bridge cni0 with the gateway
    /// at the first address, host-local addresses from the second on).
    pub fn pods_for(&mut self, subnet: Ipv4Net, n: usize, mtu: u32) -> Result<()> {
        self.use_subnet(subnet, mtu);
        for _ in 0..n {
            self.add_pod()?;
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Pods first (their namespaces take the veths with them), then
        // host-local's records.
        self.pods.clear();
        let _ = std::fs::remove_dir_all(&self.ipam_dir);
        let _ = std::fs::remove_dir_all(&self.cni_cache_dir);
    }
}

/// Pings `to` (IPv4 or IPv6) from `from` (`count` packets); true when all
/// replies came.
pub fn ping(from: &Netns, to: impl Into<IpAddr>, count: u32) -> bool {
    let to: IpAddr = to.into();
    from.exec(
        "ping",
        &[
            "-c",
            &count.to_string(),
            "-i",
            "0.05",
            "-W",
            "2",
            "-q",
            &to.to_string(),
        ],
    )
    .is_ok()
}

/// Whether `count` pings of `payload` bytes (IPv4: a packet of 28 more)
/// with don't-fragment set from `from` to `to` are answered.
pub fn ping_df(from: &Netns, to: impl Into<IpAddr>, payload: u32, count: u32) -> bool {
    let to: IpAddr = to.into();
    from.exec(
        "ping",
        &[
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "2",
            "-q",
            "-M",
            "do",
            "-s",
            &payload.to_string(),
            &to.to_string(),
        ],
    )
    .is_ok()
}

/// Sets `node` up exactly as flannel's vxlan backend sets up a node:
/// `flannel.1` (VNI 1, port 8472, no learning, MTU 1450) holding
/// `<subnet>.0/32`, forwarding on. Returns flannel.1's MAC (its VtepMAC).
pub fn flannel_device(node: &Node, subnet: ipnet::Ipv4Net) -> Result<weft::mac::MacAddr> {
    let ns = &node.ns;
    let ip = node.ip.to_string();
    ns.ip(&[
        "link",
        "add",
        "flannel.1",
        "type",
        "vxlan",
        "id",
        "1",
        "local",
        &ip,
        "dev",
        "eth0",
        "dstport",
        "8472",
        "nolearning",
    ])?;
    ns.ip(&["link", "set", "flannel.1", "mtu", "1450", "up"])?;
    ns.ip(&[
        "addr",
        "add",
        &format!("{}/32", subnet.network()),
        "dev",
        "flannel.1",
    ])?;
    ns.sysctl("net.ipv4.ip_forward", "1")?;
    Ok(mac(ns, "flannel.1")?.parse()?)
}

/// Sets `node` up as flannel sets up a dual-stack node's IPv6 half:
/// `flannel-v6.1` (VNI 1, port 8472, local `ip6`, no learning, on `eth0`,
/// created with MTU 1450: flannel subtracts 50 over IPv6 too, and the
/// kernel lowers it to the 1430 an IPv6 vxlan device on a 1500-byte uplink
/// can carry) holding `<subnet>/128`, IPv6 forwarding on. Returns its MAC
/// (the lease's BackendV6Data VtepMAC).
pub fn flannel_device6(
    node: &Node,
    ip6: Ipv6Addr,
    subnet: ipnet::Ipv6Net,
) -> Result<weft::mac::MacAddr> {
    let ns = &node.ns;
    ns.ip(&[
        "link",
        "add",
        "flannel-v6.1",
        "mtu",
        "1450",
        "type",
        "vxlan",
        "id",
        "1",
        "local",
        &ip6.to_string(),
        "dstport",
        "8472",
        "nolearning",
        "dev",
        "eth0",
    ])?;
    ns.sysctl("net.ipv6.conf.flannel-v6/1.accept_ra", "0")?;
    ns.ip(&["link", "set", "flannel-v6.1", "up"])?;
    ns.add_addr6("flannel-v6.1", subnet.network(), 128)?;
    ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    Ok(mac(ns, "flannel-v6.1")?.parse()?)
}

/// flannel's IPv6 entries for one remote lease: neighbour `<subnet>:: ->
/// VtepMAC`, FDB `VtepMAC -> PublicIPv6`, route `<subnet> via <subnet>::
/// onlink`.
pub fn flannel_peer6(
    node: &Node,
    subnet: ipnet::Ipv6Net,
    public_ipv6: Ipv6Addr,
    vtep_mac: weft::mac::MacAddr,
) -> Result<()> {
    let ns = &node.ns;
    let (m, gw) = (vtep_mac.to_string(), subnet.network().to_string());
    ns.ip(&[
        "-6",
        "neigh",
        "replace",
        &gw,
        "lladdr",
        &m,
        "dev",
        "flannel-v6.1",
        "nud",
        "permanent",
    ])?;
    ns.exec(
        "bridge",
        &[
            "fdb",
            "append",
            &m,
            "dev",
            "flannel-v6.1",
            "dst",
            &public_ipv6.to_string(),
        ],
    )?;
    ns.ip(&[
        "-6",
        "route",
        "replace",
        &subnet.to_string(),
        "via",
        &gw,
        "dev",
        "flannel-v6.1",
        "onlink",
    ])?;
    Ok(())
}

/// flannel's entries for one remote lease: neighbour `<subnet>.0 -> VtepMAC`,
/// FDB `VtepMAC -> PublicIP`, route `<subnet> via <subnet>.0 onlink`.
pub fn flannel_peer(
    node: &Node,
    subnet: ipnet::Ipv4Net,
    public_ip: Ipv4Addr,
    vtep_mac: weft::mac::MacAddr,
) -> Result<()> {
    let ns = &node.ns;
    let (m, gw) = (vtep_mac.to_string(), subnet.network().to_string());
    ns.ip(&[
        "neigh",
        "replace",
        &gw,
        "lladdr",
        &m,
        "dev",
        "flannel.1",
        "nud",
        "permanent",
    ])?;
    ns.exec(
        "bridge",
        &[
            "fdb",
            "append",
            &m,
            "dev",
            "flannel.1",
            "dst",
            &public_ip.to_string(),
        ],
    )?;
    ns.ip(&[
        "route",
        "replace",
        &subnet.to_string(),
        "via",
        &gw,
        "dev",
        "flannel.1",
        "onlink",
    ])?;
    Ok(())
}
