//! The node the self-test pretends to be, and the peers and pod its maps
//! hold. Addresses are from the documentation ranges and the default pod
//! network; the frames built for them are only ever handed to the
//! programs by `BPF_PROG_TEST_RUN`, never sent.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Result;
use dataplane_common::{
    CONFIG_F_BYPASS, CONFIG_F_CT_GATE, CONFIG_F_IPV4, CONFIG_F_IPV6, CONFIG_F_KERNEL_RX,
    CONFIG_F_READY, CONFIG_F_SOURCE_CHECK, DataplaneConfig, Endpoint, POD_IF_V4, POD_IF_V6, PodIf,
};

use crate::{
    dataplane::{EndpointMap, Peer, PeerMaps},
    mac::MacAddr,
};

/// The node's VXLAN settings the frames carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wire {
    pub vni: u32,
    pub port: u16,
}

impl Default for Wire {
    /// flannel's defaults.
    fn default() -> Self {
        Self {
            vni: dataplane_common::DEFAULT_VNI,
            port: 8472,
        }
    }
}

std::thread_local! {
    /// The VNI and port of the node the self-test runs for (set by
    /// [`crate::dataplane::programs::selftest::run`] on the thread that builds and runs the cases).
    static WIRE: std::cell::Cell<Wire> = std::cell::Cell::new(Wire::default());
}

pub(super) fn set_wire(w: Wire) {
    WIRE.with(|c| c.set(w));
}

pub(super) fn vni() -> u32 {
    WIRE.with(|c| c.get().vni)
}

pub(super) fn port() -> u16 {
    WIRE.with(|c| c.get().port)
}
pub(super) const UPLINK_MTU: u32 = 1500;
/// The interface the kernel runs test frames on: loopback, which the
/// fixture also takes as the pod's veth and the uplink.
pub(super) const IFINDEX: u32 = 1;

pub(super) const LOCAL4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub(super) const LOCAL6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
pub(super) const VTEP_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0, 0x01]);
pub(super) const VTEP6_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0x06, 0x01]);
pub(super) const UPLINK_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0, 0xaa]);
/// The MAC the wire frames arrive from (the uplink's neighbour).
pub(super) const WIRE_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0, 0xbb]);

/// The IPv4 peer (encapsulated), its IPv6 twin, and a DirectRouting peer.
pub(super) const PEER4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub(super) const PEER4_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0, 0x02]);
pub(super) const PEER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
pub(super) const PEER6_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0x06, 0x02]);
pub(super) const DIRECT4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
pub(super) const DIRECT4_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0, 0x03]);
/// An address that is no peer's VTEP.
pub(super) const STRANGER4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 99);
pub(super) const STRANGER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x99);

/// The local pod (on the veth the frames come in on), its gateway's MAC.
pub(super) const POD4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);
pub(super) const POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 5);
pub(super) const POD_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0x10, 0x05]);
pub(super) const GW_MAC: MacAddr = MacAddr([0x02, 0x57, 0x46, 0, 0x10, 0x01]);

/// Addresses in the subnets of the node, the peers and nobody.
pub(super) fn own4(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 1, host))
}
pub(super) fn own6(host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, host))
}
pub(super) fn peer4_pod(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 2, host))
}
pub(super) fn peer6_pod(host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, host))
}
pub(super) fn direct_pod(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 3, host))
}
pub(super) fn nowhere4() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 250, 0, 1))
}
pub(super) fn nowhere6() -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1))
}

/// How the node's dataplane is configured for a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// `--host-routing legacy`: every pod packet takes the host stack.
    Legacy,
    /// `--host-routing bpf`: the fast path for every pod packet.
    Bypass,
    /// `--host-routing auto`: the fast path only for flows conntrack holds.
    Gated,
    /// `--host-routing auto` on a kernel without the conntrack kfuncs:
    /// nothing bypasses the stack, pods' sources are still checked.
    Checked,
    /// `--host-routing bpf` with the kernel's vxlan device decapsulating
    /// what does not go straight into a pod.
    KernelRx,
}

/// The config of the fixture's node in `mode`.
pub(super) fn config(mode: Mode) -> DataplaneConfig {
    let mask = |len: u32| u32::from_ne_bytes((u32::MAX << (32 - len)).to_be_bytes());
    let mut mask6 = [0u8; 16];
    mask6[..8].fill(0xff);
    DataplaneConfig {
        vni: vni(),
        port: port(),
        local_addr_be: u32::from_ne_bytes(LOCAL4.octets()),
        uplink_ifindex: IFINDEX,
        uplink_mtu: UPLINK_MTU,
        vtep_mac: VTEP_MAC.0,
        uplink_mac: UPLINK_MAC.0,
        local_addr6: LOCAL6.octets(),
        overlay6_ifindex: IFINDEX,
        overlay6_mtu: UPLINK_MTU - 70,
        vtep6_mac: VTEP6_MAC.0,
        subnet4_be: u32::from_ne_bytes([10, 244, 1, 0]),
        mask4_be: mask(24),
        subnet6: Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0).octets(),
        mask6,
        flags: CONFIG_F_READY
            | CONFIG_F_IPV4
            | CONFIG_F_IPV6
            | match mode {
                Mode::Legacy => 0,
                Mode::Bypass => CONFIG_F_BYPASS,
                Mode::Gated => CONFIG_F_BYPASS | CONFIG_F_CT_GATE,
                Mode::Checked => CONFIG_F_SOURCE_CHECK,
                Mode::KernelRx => CONFIG_F_BYPASS | CONFIG_F_KERNEL_RX,
            },
        ..DataplaneConfig::default()
    }
}

/// Fills the private maps: the peers, the pod and its veth.
pub(super) fn seed(maps: &mut PeerMaps, endpoints: &mut EndpointMap) -> Result<()> {
    let net4 = |c: u8| format!("10.244.{c}.0/24").parse().expect("a valid subnet");
    let net6 = |c: u16| {
        format!("fd00:10:244:{c:x}::/64")
            .parse()
            .expect("a valid subnet")
    };
    maps.upsert(&Peer::v4(net4(2), PEER4, PEER4_MAC), None, false)?;
    maps.upsert(&Peer::v6(net6(2), PEER6, PEER6_MAC), None, false)?;
    maps.upsert(&Peer::v4(net4(3), DIRECT4, DIRECT4_MAC), None, true)?;
    let ep = Endpoint {
        ifindex: IFINDEX,
        pod_mac: POD_MAC.0,
        gw_mac: GW_MAC.0,
    };
    endpoints.set(IpAddr::V4(POD4), &ep)?;
    endpoints.set(IpAddr::V6(POD6), &ep)?;
    endpoints.set_pod_if(
        IFINDEX,
        &PodIf {
            ip4_be: u32::from_ne_bytes(POD4.octets()),
            flags: POD_IF_V4 | POD_IF_V6,
            ip6: POD6.octets(),
        },
    )
}
