//! The dataplane's vocabulary: what the agent tells it (peers, updates,
//! the spec it is built from) and what it reports (where decapsulation
//! runs). The low-level files (netlink, loader, maps) use these without the
//! facade in `mod.rs`.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use dataplane_common::{VXLAN_OVERHEAD, VXLAN6_OVERHEAD};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

pub use crate::peer::{Peer, PeerUpdate};
use crate::sys::bpffs::PinDir;
use crate::{lease::Subnets, mac::MacAddr};

/// An address family, for what the dataplane does once per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn is_v6(self) -> bool {
        self == Family::V6
    }

    /// `IPv4` or `IPv6`.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// VXLAN's overhead over this family's underlay: outer Ethernet, IP,
    /// UDP and VXLAN headers (50 bytes over IPv4, 70 over IPv6).
    pub fn overhead(self) -> u32 {
        match self {
            Family::V4 => VXLAN_OVERHEAD,
            Family::V6 => VXLAN6_OVERHEAD,
        }
    }

    /// The one MTU rule: an overlay device of this family carries the
    /// underlay's MTU less the family's overhead. (flannel subtracts 50 for
    /// both, which leaves a full-size IPv6 packet too big for the underlay.)
    pub fn overlay_mtu(self, underlay_mtu: u32) -> u32 {
        underlay_mtu.saturating_sub(self.overhead())
    }

    /// A host route's prefix length (32, 128).
    pub fn host_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// This family's subnet among `subnets`.
    pub fn subnet(self, subnets: &Subnets) -> Option<IpNet> {
        match self {
            Family::V4 => subnets.v4.map(IpNet::V4),
            Family::V6 => subnets.v6.map(IpNet::V6),
        }
    }
}

/// Where decapsulation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// Native XDP if the driver has it, else generic XDP.
    Auto,
    /// XDP in the driver.
    Native,
    /// XDP on the socket buffer (any device, slower).
    Generic,
    /// No XDP: decapsulate in TC on the uplink's ingress.
    Off,
}

/// How pods' traffic crosses the host (`--host-routing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HostRouting {
    /// Bypass the host stack for flows conntrack holds as confirmed and
    /// not NATed; everything else takes the host stack.
    Auto,
    /// Bypass the host stack for all pod-to-pod traffic between nodes:
    /// netfilter (NAT of replies, FORWARD rules) no longer sees it.
    Bpf,
    /// Always through the host stack: bridge, routing, the overlay device.
    Legacy,
}

impl HostRouting {
    pub fn as_str(self) -> &'static str {
        match self {
            HostRouting::Auto => "auto",
            HostRouting::Bpf => "bpf",
            HostRouting::Legacy => "legacy",
        }
    }
}

impl XdpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Auto => "auto",
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
            XdpMode::Off => "off",
        }
    }
}

/// What the eBPF dataplane is built from.
#[derive(Clone, Debug)]
pub struct DataplaneSpec {
    /// The uplink device's name.
    pub uplink: String,
    /// Our IPv4 VTEP address (outer source, decapsulation destination);
    /// None on an IPv6-only node.
    pub public_ip: Option<Ipv4Addr>,
    /// Our IPv6 VTEP address, when the network has IPv6.
    pub public_ipv6: Option<Ipv6Addr>,
    pub vni: u32,
    pub port: u16,
    pub vtep_mac: MacAddr,
    /// The IPv6 overlay device's MAC (the lease's `BackendV6Data`).
    pub vtep6_mac: MacAddr,
    pub xdp_mode: XdpMode,
    pub pins: PinDir,
    /// Capacity of the peer maps.
    pub max_peers: u32,
    /// A fault put into the programs on purpose (`--inject-fault`, for
    /// tests of the upgrade's self-test); `FAULT_NONE` otherwise.
    pub fault: u32,
    pub host_routing: HostRouting,
    /// Where host settings changed by Weft are recorded, to be restored by
    /// `weft teardown` (a tmpfs: `/run/weft`).
    pub state_dir: PathBuf,
    /// The cluster network (flannel's `Network`), if it has IPv4.
    pub network: Option<Ipv4Net>,
    /// The cluster's IPv6 network (`IPv6Network`), if it has IPv6.
    pub network6: Option<Ipv6Net>,
    /// Masquerade pods' traffic leaving the cluster network (`--ip-masq`);
    /// `Some(true)`: with fully random source ports.
    pub masquerade: Option<bool>,
    /// Accept forwarded cluster traffic in iptables' FORWARD chain
    /// (`--iptables-forward-rules`).
    pub forward_rules: bool,
    /// The underlay MTU to assume (`Backend.MTU`); None: the uplink's,
    /// followed as it changes.
    pub underlay_mtu: Option<u32>,
    /// Reach peers on the uplink's own subnet without encapsulation
    /// (`Backend.DirectRouting`).
    pub direct_routing: bool,
    /// Per-peer path MTU (`--path-mtu`, without `Backend.MTU`): the
    /// programs mark and limit per peer, routes carry each peer's MTU.
    pub path_mtu: bool,
    /// What the kernel lets the programs do (its probes at start).
    pub kernel: crate::dataplane::programs::kernel::ProgramKernel,
}

impl DataplaneSpec {
    /// Our VTEP address of `family`, if the node has one.
    pub fn vtep(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.public_ip.map(IpAddr::V4),
            Family::V6 => self.public_ipv6.map(IpAddr::V6),
        }
    }

    /// The MAC of `family`'s overlay device.
    pub fn device_mac(&self, family: Family) -> MacAddr {
        match family {
            Family::V4 => self.vtep_mac,
            Family::V6 => self.vtep6_mac,
        }
    }

    /// The underlay MTU: `Backend.MTU`, else the uplink's.
    pub fn underlay_mtu(&self, uplink_mtu: u32) -> u32 {
        self.underlay_mtu.unwrap_or(uplink_mtu)
    }
}

/// Where decapsulation runs on the uplink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecapHook {
    /// XDP in the driver.
    XdpNative,
    /// XDP on the socket buffer.
    XdpGeneric,
    /// TC ingress.
    Tc,
}

impl DecapHook {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DecapHook::XdpNative => "xdp-native",
            DecapHook::XdpGeneric => "xdp-generic",
            DecapHook::Tc => "tc",
        }
    }
}

/// Where decapsulation runs on the uplink, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DecapChoice {
    pub hook: DecapHook,
    pub why: String,
}
