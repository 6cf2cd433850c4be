//! Clusters made of network namespaces: an underlay (a bridge in its own
//! namespace), nodes plugged into it, and pods attached to each node the way
//! the flannel CNI plugin attaches them (a `cni0` bridge holding the gateway
//! `<subnet>.1`, one veth per pod).
//!
//! Addresses: underlay 198.18.0.0/24 (RFC 2544 benchmarking range), node i
//! at 198.18.0.i; pods in 10.244.0.0/16. All of it exists only inside the
//! namespaces the test created.

use std::net::Ipv4Addr;

use anyhow::Result;

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
        let n = self
            .ports
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = format!("p{n}");
        veth(ns, iface, &self.ns, &port)?;
        self.ns.ip(&["link", "set", &port, "master", "br0"])?;
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

/// A pod: a namespace with `eth0` on its node's cni0.
pub struct Pod {
    pub ns: Netns,
    pub ip: Ipv4Addr,
}

/// A node: a namespace with `eth0` on the underlay.
pub struct Node {
    pub ns: Netns,
    pub index: u8,
    pub ip: Ipv4Addr,
    pub pods: Vec<Pod>,
}

impl Node {
    pub fn new(underlay: &Underlay, index: u8) -> Result<Self> {
        let ns = Netns::new("wn")?;
        let ip = Ipv4Addr::new(198, 18, 0, index);
        underlay.plug(&ns, "eth0", &ip.to_string())?;
        Ok(Self {
            ns,
            index,
            ip,
            pods: Vec::new(),
        })
    }

    pub fn mac(&self) -> String {
        mac(&self.ns, "eth0").expect("eth0 has a MAC")
    }

    /// The pod subnet a test gives this node when no lease decides it.
    pub fn default_subnet(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }

    /// Creates cni0 with `gateway/len` (e.g. 10.244.3.1/24) and MTU `mtu`,
    /// as the flannel CNI plugin (bridge, isGateway) does.
    pub fn cni0(&self, gateway: Ipv4Addr, len: u8, mtu: u32) -> Result<()> {
        self.ns.ip(&["link", "add", "cni0", "type", "bridge"])?;
        self.ns
            .ip(&["link", "set", "cni0", "mtu", &mtu.to_string()])?;
        self.ns
            .ip(&["addr", "add", &format!("{gateway}/{len}"), "dev", "cni0"])?;
        self.ns.ip(&["link", "set", "cni0", "up"])?;
        Ok(())
    }

    /// Adds a pod with `ip/len` behind cni0, default route via `gateway`.
    pub fn add_pod(&mut self, ip: Ipv4Addr, len: u8, gateway: Ipv4Addr, mtu: u32) -> Result<()> {
        let ns = Netns::new("wp")?;
        let host_if = format!("veth{}", self.pods.len());
        veth(&ns, "eth0", &self.ns, &host_if)?;
        self.ns.ip(&["link", "set", &host_if, "master", "cni0"])?;
        self.ns
            .ip(&["link", "set", &host_if, "mtu", &mtu.to_string()])?;
        ns.ip(&["link", "set", "eth0", "mtu", &mtu.to_string()])?;
        ns.ip(&["addr", "add", &format!("{ip}/{len}"), "dev", "eth0"])?;
        ns.ip(&["route", "add", "default", "via", &gateway.to_string()])?;
        self.pods.push(Pod { ns, ip });
        Ok(())
    }

    /// cni0 and `n` pods for `subnet` (x.y.z.0/len): gateway .1, pods .10, .11, ...
    pub fn pods_for(&mut self, subnet: Ipv4Addr, len: u8, n: usize, mtu: u32) -> Result<()> {
        let o = subnet.octets();
        let gw = Ipv4Addr::new(o[0], o[1], o[2], o[3] + 1);
        self.cni0(gw, len, mtu)?;
        for i in 0..n {
            self.add_pod(
                Ipv4Addr::new(o[0], o[1], o[2], o[3] + 10 + i as u8),
                len,
                gw,
                mtu,
            )?;
        }
        Ok(())
    }
}

/// Pings `to` from `from` (`count` packets); true when all replies came.
pub fn ping(from: &Netns, to: Ipv4Addr, count: u32) -> bool {
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

/// Sets `node` up exactly as flannel's vxlan backend sets up a node:
/// `flannel.1` (VNI 1, port 8472, no learning, MTU 1450) holding
/// `<subnet>.0/32`, forwarding on. Returns flannel.1's MAC (its VtepMAC).
pub fn flannel_device(node: &Node, subnet: crate::overlay::Subnet) -> Result<weft::mac::MacAddr> {
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
        &format!("{}/32", subnet.addr()),
        "dev",
        "flannel.1",
    ])?;
    ns.sysctl("net.ipv4.ip_forward", "1")?;
    Ok(mac(ns, "flannel.1")?.parse()?)
}

/// flannel's entries for one remote lease: neighbour `<subnet>.0 -> VtepMAC`,
/// FDB `VtepMAC -> PublicIP`, route `<subnet> via <subnet>.0 onlink`.
pub fn flannel_peer(
    node: &Node,
    subnet: crate::overlay::Subnet,
    public_ip: Ipv4Addr,
    vtep_mac: weft::mac::MacAddr,
) -> Result<()> {
    let ns = &node.ns;
    let (m, gw) = (vtep_mac.to_string(), subnet.addr().to_string());
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
