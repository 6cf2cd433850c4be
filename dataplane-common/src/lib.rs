//! Types shared by Weft's eBPF programs and its agent.
//!
//! Everything here is `#[repr(C)]` and plain old data: the agent writes these
//! values into eBPF maps and the programs read them, so both sides must agree
//! on every byte. Addresses are kept in network byte order (`*_be` fields), as
//! they appear in packets, so the programs compare them without conversion.
#![no_std]

/// VXLAN overhead over IPv4: outer Ethernet (14) is not counted because the
/// inner frame's Ethernet header replaces it on the wire; outer IPv4 (20),
/// UDP (8), VXLAN (8) and inner Ethernet (14) are.
pub const VXLAN_OVERHEAD: u32 = 50;

/// VXLAN overhead over IPv6: outer IPv6 (40), UDP, VXLAN, inner Ethernet.
pub const VXLAN6_OVERHEAD: u32 = 70;

/// Default VXLAN UDP port (the Linux and flannel default, not IANA's 4789).
pub const DEFAULT_VXLAN_PORT: u16 = 8472;

/// Default VXLAN network identifier (flannel's default).
pub const DEFAULT_VNI: u32 = 1;

/// Default capacity of the peer tables (remote subnets a node can route
/// to); `weft agent --max-peers` sets it when the maps are created.
pub const MAX_PEERS: u32 = 65_536;

/// Version of the layout of the pinned maps (their types, keys, values and
/// meaning). Pins live in a directory named after it (`maps-v2`), so an
/// agent never reuses maps another version created; it bumps whenever a
/// map's layout or meaning changes. Version 1 pinned into `maps`.
/// Version 3 added the IPv6 maps and the IPv6 half of the config;
/// version 4 the conntrack settings and the node's own subnets in the
/// config, the pod veth map, the `drop_invalid_source` and
/// `drop_foreign_destination` counters and the conntrack requests.
pub const LAYOUT_VERSION: u32 = 4;

/// Values of the programs' load-time constant `FAULT`: a fault put in on
/// purpose (the agent's hidden `--inject-fault`), so that tests can prove
/// an upgrade's self-test refuses programs that are wrong. 0: none.
pub const FAULT_NONE: u32 = 0;
/// Decapsulation drops every frame it would have decapsulated.
pub const FAULT_DECAP: u32 = 1;
/// The same on real devices only, not on loopback (where the self-test
/// runs): a fault the golden frames cannot see, which the check after a
/// swap (peers that answered before must answer after) catches.
pub const FAULT_DECAP_LIVE: u32 = 2;

/// Map names, as the programs declare them and the agent pins them.
pub mod map_names {
    pub const PEERS: &str = "WEFT_PEERS";
    pub const VTEPS: &str = "WEFT_VTEPS";
    pub const CONFIG: &str = "WEFT_CONFIG";
    pub const COUNTERS: &str = "WEFT_COUNTERS";
    pub const ENDPOINTS: &str = "WEFT_ENDPOINTS";
    pub const PEERS6: &str = "WEFT_PEERS6";
    pub const VTEPS6: &str = "WEFT_VTEPS6";
    pub const ENDPOINTS6: &str = "WEFT_ENDPOINTS6";
    pub const POD_IFS: &str = "WEFT_POD_IFS";
    /// Ring buffer: flows whose conntrack entry the agent is asked to make
    /// liberal (see `CtRequest`).
    pub const CT_REQUESTS: &str = "WEFT_CT_REQUESTS";
    /// Ring buffer: the same for flows that earned the marking by lasting
    /// rather than by a GSO packet (see `CtRequest`).
    pub const CT_EARNED: &str = "WEFT_CT_EARNED";
    /// Flows asked about recently (LRU), so a flow is asked about once.
    pub const CT_ASKED: &str = "WEFT_CT_ASKED";
    /// Measured path MTUs by remote IPv4 VTEP (see [`CONFIG_F_PATH_MTU`]).
    pub const PATH_MTU: &str = "WEFT_PATH_MTU";
    /// Per CPU: when a frame last went whole to the kernel's vxlan device
    /// (see [`CONFIG_F_KERNEL_RX`]).
    pub const WHOLE_RX: &str = "WEFT_WHOLE_RX";
}

/// Program names, as the programs declare them.
pub mod program_names {
    pub const ENCAP: &str = "weft_encap";
    pub const DECAP_XDP: &str = "weft_decap";
    pub const DECAP_TC: &str = "weft_decap_tc";
    /// Host routing, transmit: on each pod's host-side veth (TC ingress).
    pub const FROM_POD: &str = "weft_from_pod";
    /// Host routing, receive after XDP decapsulation (TC ingress, uplink).
    pub const DELIVER: &str = "weft_deliver";
    /// IPv6: TC egress on the IPv6 overlay device (a vxlan device in
    /// collect-metadata mode): the tunnel key for the kernel to encapsulate.
    pub const ENCAP6: &str = "weft_encap6";
    /// IPv6: TC ingress on the IPv6 overlay device: what the kernel
    /// decapsulated (fragments the programs on the uplink passed) gets the
    /// same checks.
    pub const TUNNEL_RX: &str = "weft_tunnel_rx";
    /// The wireguard backend: TC ingress on each WireGuard device; a
    /// decrypted packet for a local pod goes straight into the pod.
    pub const FROM_WG: &str = "weft_from_wg";
    /// The wireguard backend: on each pod's host-side veth (TC ingress) in
    /// place of `FROM_POD`; a pod's packet to a remote pod goes straight to
    /// the WireGuard device.
    pub const FROM_POD_WG: &str = "weft_from_pod_wg";
}

/// Capacity of the endpoint map: pods on one node.
pub const MAX_ENDPOINTS: u32 = 4096;

/// A pod on this node, as host routing reaches it: the value of the
/// `WEFT_ENDPOINTS` hash map, keyed by the pod's IPv4 address (network
/// order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The host side of the pod's veth: packets for the pod go to its peer.
    pub ifindex: u32,
    /// The pod's MAC (destination of what is delivered to it).
    pub pod_mac: [u8; 6],
    /// The MAC the pod's gateway has (source of what is delivered to it).
    pub gw_mac: [u8; 6],
}

/// A pod's veth as host routing knows it: the value of the `WEFT_POD_IFS`
/// hash map, keyed by the ifindex of the veth's host side. A packet from
/// that veth takes the fast path only if its source is one of these.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodIf {
    /// The pod's IPv4 address (network order), if `POD_IF_V4`.
    pub ip4_be: u32,
    /// Bit flags, see `POD_IF_*`.
    pub flags: u32,
    /// The pod's IPv6 address, if `POD_IF_V6`.
    pub ip6: [u8; 16],
}

/// `PodIf::flags`: the pod has an IPv4 address.
pub const POD_IF_V4: u32 = 1;
/// `PodIf::flags`: the pod has an IPv6 address.
pub const POD_IF_V6: u32 = 2;

/// Where packets to one remote subnet go: the remote node's VTEP.
///
/// The value of the `WEFT_PEERS` LPM trie (keyed by the remote subnet).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Vtep {
    /// The remote node's public IPv4 address (outer destination), network order.
    pub addr_be: u32,
    /// The remote node's VTEP MAC (inner destination MAC).
    pub mac: [u8; 6],
    /// Bit flags, see `VTEP_F_*`.
    pub flags: u8,
    pub _pad: u8,
}

/// `Vtep::flags`: the remote node is on the uplink's own subnet and is sent
/// its pods' packets as they are, without encapsulation (flannel's
/// `DirectRouting`). The zero byte older agents wrote means "encapsulate".
pub const VTEP_F_DIRECT: u8 = 1;

/// Where packets to one remote IPv6 subnet go: the value of the
/// `WEFT_PEERS6` LPM trie (keyed by the remote subnet).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Vtep6 {
    /// The remote node's public IPv6 address (outer destination).
    pub addr: [u8; 16],
    /// The remote node's IPv6 VTEP MAC (inner destination MAC).
    pub mac: [u8; 6],
    /// Bit flags, see `VTEP_F_*` (none apply to IPv6 yet).
    pub flags: u8,
    pub _pad: u8,
}

/// What the decapsulation side knows of one remote VTEP.
///
/// The value of the `WEFT_VTEPS` hash map (keyed by the VTEP's IPv4 address,
/// network order). It only says "this address is a known peer"; the inner
/// source check goes through `WEFT_PEERS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VtepInfo {
    /// How many subnets this VTEP currently carries (normally 1).
    pub subnets: u32,
}

/// The node's own datapath settings, in the one-entry `WEFT_CONFIG` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DataplaneConfig {
    /// VXLAN network identifier (host order, 24 bits).
    pub vni: u32,
    /// VXLAN UDP destination port (host order).
    pub port: u16,
    pub _pad0: u16,
    /// Our public IPv4 address (outer source, decap destination), network order.
    pub local_addr_be: u32,
    /// Index of the uplink device the encapsulated packets leave through.
    pub uplink_ifindex: u32,
    /// MTU of the uplink: an encapsulated frame never exceeds it.
    pub uplink_mtu: u32,
    /// Our VTEP MAC (the inner source MAC we send, the one peers address).
    pub vtep_mac: [u8; 6],
    /// The uplink's MAC: decapsulated frames are addressed to it so the stack
    /// accepts them as PACKET_HOST.
    pub uplink_mac: [u8; 6],
    /// Bit flags, see `CONFIG_F_*`.
    pub flags: u32,
    /// Our public IPv6 address (outer source, decap destination).
    pub local_addr6: [u8; 16],
    /// Index of the IPv6 overlay device (the kernel's vxlan device in
    /// collect-metadata mode that writes the outer IPv6 headers).
    pub overlay6_ifindex: u32,
    /// MTU of the IPv6 overlay device: a packet to a remote IPv6 pod that
    /// is not GSO and exceeds it takes the stack (ICMPv6 Packet Too Big).
    pub overlay6_mtu: u32,
    /// Our IPv6 VTEP MAC (the inner source MAC over IPv6).
    pub vtep6_mac: [u8; 6],
    pub _pad1: [u8; 2],
    /// This node's IPv4 pod subnet and its netmask (network order; a zero
    /// mask: none). A pod's packet from an address in it that is not the
    /// pod's own is spoofed.
    pub subnet4_be: u32,
    pub mask4_be: u32,
    /// This node's IPv6 pod subnet and its netmask (all zero: none).
    pub subnet6: [u8; 16],
    pub mask6: [u8; 16],
    /// conntrack (`--host-routing auto`): the timeout, in milliseconds, a
    /// fast-path TCP flow's ESTABLISHED entry is refreshed to
    /// (`nf_conntrack_tcp_timeout_established`), and a UDP flow's
    /// (`nf_conntrack_udp_timeout_stream`); 0: never refreshed.
    pub ct_tcp_timeout_ms: u32,
    pub ct_udp_timeout_ms: u32,
    /// Refresh an entry only once fewer than this many jiffies are left
    /// (half its timeout): an entry's line is written about once per half
    /// timeout, not per packet.
    pub ct_tcp_refresh_jiffies: u32,
    pub ct_udp_refresh_jiffies: u32,
    /// A UDP flow conntrack has seen no reply of (one-way, at its
    /// originator): refreshed to `nf_conntrack_udp_timeout` (ms), once
    /// fewer than the second value's jiffies are left.
    pub ct_udp_unreplied_ms: u32,
    pub ct_udp_unreplied_refresh_jiffies: u32,
}

/// A flow whose conntrack entry is ESTABLISHED and ASSURED but not yet
/// liberal: the programs ask the agent (through the `WEFT_CT_REQUESTS`
/// ring buffer for a bulk flow, `WEFT_CT_EARNED` for one that lasted) to
/// mark both its directions `IP_CT_TCP_FLAG_BE_LIBERAL`
/// over ctnetlink, as the kernel's flowtable does when it offloads a flow,
/// so a packet of it that takes the host stack later (a FIN, a hand-back)
/// is in window for conntrack, which did not see the window move. Also the
/// key of `WEFT_CT_ASKED`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtRequest {
    /// 4 or 6.
    pub family: u8,
    /// IPPROTO_TCP.
    pub proto: u8,
    pub _pad: u16,
    /// Ports, network order, as the packet carries them.
    pub sport: u16,
    pub dport: u16,
    /// Addresses as the packet carries them (IPv4: the first 4 bytes).
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// Set once the agent has written a complete configuration; until then the
/// programs pass everything.
pub const CONFIG_F_READY: u32 = 1;

/// Host routing: pods' packets to remote pods are encapsulated at their
/// veth and sent to the uplink, decapsulated packets for local pods go
/// straight into them; everything else takes the host stack.
pub const CONFIG_F_BYPASS: u32 = 2;

/// With host routing, only flows conntrack holds as confirmed and not NATed
/// bypass the host stack (`--host-routing auto`).
pub const CONFIG_F_CT_GATE: u32 = 4;

/// The node carries IPv4 pod traffic (IPv4 VTEP, `local_addr_be`).
pub const CONFIG_F_IPV4: u32 = 8;

/// The node carries IPv6 pod traffic (IPv6 VTEP, `local_addr6`).
pub const CONFIG_F_IPV6: u32 = 16;

/// Pods' sources are checked at their veth (a pod sending as another pod,
/// the node or its subnet's other addresses is dropped) even where nothing
/// bypasses the stack: `--host-routing auto` on a kernel without the
/// conntrack kfuncs. [`CONFIG_F_BYPASS`] implies it.
pub const CONFIG_F_SOURCE_CHECK: u32 = 32;

/// The kernel's vxlan device (collect-metadata, on our port) decapsulates
/// what does not go straight into a local pod: TC decapsulation on the
/// uplink checks such a frame and passes it on whole, so the kernel strips
/// it as its own tunnel (clearing the tunnel's offload state, which a
/// program cannot: a frame stripped in TC stays a tunnel GSO packet, which
/// the bridge then segments in software) and `weft_tunnel_rx` checks what
/// comes out. Without it TC strips every frame itself.
pub const CONFIG_F_KERNEL_RX: u32 = 64;

/// Per-peer path MTU (the agent measures each IPv4 peer's path, see
/// `WEFT_PATH_MTU`): the outer IPv4 header says don't-fragment to a peer
/// whose path was measured and on the prober's packets
/// ([`PROBE_MARK`]); the fast path hands a packet whose outer packet (or
/// GSO segment) would exceed the peer's path to the stack, whose route to
/// the peer carries that MTU and answers with ICMP. A peer not measured
/// gets the smaller of the uplink's MTU and [`DEFAULT_PATH_MTU`]. Adding it
/// changed no existing map, so older programs (a rollback) ignore it.
pub const CONFIG_F_PATH_MTU: u32 = 128;

/// The wireguard backend: the kernel's WireGuard devices carry the overlay
/// and the programs only shorten the way to and from them. A pod's packet
/// to a remote pod (a subnet in `WEFT_PEERS`/`WEFT_PEERS6`) goes from its
/// veth straight to the device of its family, whose index and MTU are then
/// `uplink_ifindex` and `uplink_mtu` (IPv4) and `overlay6_ifindex` and
/// `overlay6_mtu` (IPv6); `weft_from_wg` puts decrypted packets for local
/// pods straight into them. No program encapsulates or decapsulates VXLAN.
/// Adding it changed no existing map.
pub const CONFIG_F_WIREGUARD: u32 = 256;
/// The drop trace is on (`--trace-drops`, `weft trace-drops on`): each
/// dropped packet is also logged through aya-log's ring buffer, which the
/// agent reads into its log. Off, a drop costs one test of this flag more.
/// The agent sets and clears it at run time. Adding it changed no map.
pub const CONFIG_F_TRACE_DROPS: u32 = 512;

/// The flags of [`DataplaneConfig`] by name, and the fields the wireguard
/// backend gives another meaning, under the names of what they hold there.
impl DataplaneConfig {
    const fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// [`CONFIG_F_READY`].
    #[inline(always)]
    pub const fn ready(&self) -> bool {
        self.has(CONFIG_F_READY)
    }

    /// [`CONFIG_F_BYPASS`]: host routing takes what it may.
    #[inline(always)]
    pub const fn bypass(&self) -> bool {
        self.has(CONFIG_F_BYPASS)
    }

    /// [`CONFIG_F_CT_GATE`]: conntrack decides what bypasses.
    #[inline(always)]
    pub const fn ct_gate(&self) -> bool {
        self.has(CONFIG_F_CT_GATE)
    }

    /// [`CONFIG_F_IPV4`].
    #[inline(always)]
    pub const fn ipv4(&self) -> bool {
        self.has(CONFIG_F_IPV4)
    }

    /// [`CONFIG_F_IPV6`].
    #[inline(always)]
    pub const fn ipv6(&self) -> bool {
        self.has(CONFIG_F_IPV6)
    }

    /// A pod's packets are looked at on its veth: their source is checked
    /// ([`CONFIG_F_SOURCE_CHECK`]), which host routing implies.
    #[inline(always)]
    pub const fn checks_pods(&self) -> bool {
        self.has(CONFIG_F_BYPASS | CONFIG_F_SOURCE_CHECK)
    }

    /// [`CONFIG_F_KERNEL_RX`]: the kernel's vxlan device decapsulates.
    #[inline(always)]
    pub const fn kernel_rx(&self) -> bool {
        self.has(CONFIG_F_KERNEL_RX)
    }

    /// [`CONFIG_F_PATH_MTU`]: per-peer path MTUs.
    #[inline(always)]
    pub const fn path_mtu(&self) -> bool {
        self.has(CONFIG_F_PATH_MTU)
    }

    /// [`CONFIG_F_WIREGUARD`]: the wireguard backend.
    #[inline(always)]
    pub const fn wireguard(&self) -> bool {
        self.has(CONFIG_F_WIREGUARD)
    }

    /// [`CONFIG_F_TRACE_DROPS`].
    #[inline(always)]
    pub const fn trace_drops(&self) -> bool {
        self.has(CONFIG_F_TRACE_DROPS)
    }

    /// Under [`CONFIG_F_WIREGUARD`]: the IPv4 WireGuard device (held in
    /// `uplink_ifindex`).
    #[inline(always)]
    pub const fn wg4_ifindex(&self) -> u32 {
        self.uplink_ifindex
    }

    /// Under [`CONFIG_F_WIREGUARD`]: the IPv4 WireGuard device's MTU (held
    /// in `uplink_mtu`).
    #[inline(always)]
    pub const fn wg4_mtu(&self) -> u32 {
        self.uplink_mtu
    }

    /// Under [`CONFIG_F_WIREGUARD`]: the IPv6 WireGuard device (held in
    /// `overlay6_ifindex`).
    #[inline(always)]
    pub const fn wg6_ifindex(&self) -> u32 {
        self.overlay6_ifindex
    }

    /// Under [`CONFIG_F_WIREGUARD`]: the IPv6 WireGuard device's MTU (held
    /// in `overlay6_mtu`).
    #[inline(always)]
    pub const fn wg6_mtu(&self) -> u32 {
        self.overlay6_mtu
    }
}

impl Vtep {
    /// [`VTEP_F_DIRECT`]: sent as is, without encapsulation.
    #[inline(always)]
    pub const fn direct(&self) -> bool {
        self.flags & VTEP_F_DIRECT != 0
    }
}

impl PodIf {
    /// The pod's IPv4 address, if it has one ([`POD_IF_V4`]).
    #[inline(always)]
    pub const fn ip4(&self) -> Option<u32> {
        if self.flags & POD_IF_V4 != 0 {
            Some(self.ip4_be)
        } else {
            None
        }
    }

    /// Whether the pod has an IPv6 address ([`POD_IF_V6`]), `ip6`.
    #[inline(always)]
    pub const fn has_ip6(&self) -> bool {
        self.flags & POD_IF_V6 != 0
    }
}

/// The path MTU a peer not yet measured is given (outer IPv4 packet,
/// header included), where the uplink's is larger.
pub const DEFAULT_PATH_MTU: u32 = 1500;

/// `SO_MARK` of the prober's path MTU probes: their outer header says
/// don't-fragment whether or not the peer's path was measured.
pub const PROBE_MARK: u32 = 0x5746_0d0f;

/// XDP's mark on a frame it decapsulated (in the frame's metadata), for the
/// TC program that delivers it after GRO.
pub const XDP_DECAP_MARK: u32 = 0x5745_4654;

/// One counter: packets and bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

/// Why a packet was counted: the index into the per-CPU `WEFT_COUNTERS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Encapsulated and sent to a remote VTEP.
    Encapsulated = 0,
    /// Decapsulated and handed to the local pod network.
    Decapsulated = 1,
    /// Not overlay traffic: passed on untouched.
    Passed = 2,
    /// Encap: the destination lies in no known remote subnet.
    DropNoRoute = 3,
    /// Truncated or otherwise unparseable overlay packet.
    DropMalformed = 4,
    /// VXLAN to our port with another VNI.
    DropWrongVni = 5,
    /// VXLAN from an outer source that is no known peer VTEP.
    DropUnknownVtep = 6,
    /// Inner source outside the subnet of the VTEP that sent it.
    DropSpoofed = 7,
    /// Encap: the encapsulated frame would exceed the uplink MTU.
    DropTooBig = 8,
    /// A helper failed (no room, redirect refused).
    DropError = 9,
    /// Decap: a VXLAN packet that arrived as outer IPv4 fragments (a hop
    /// on the way has a smaller MTU), passed for the kernel to reassemble
    /// and decapsulate; counted once, at its first fragment.
    Fragmented = 10,
    /// Decap: the outer header says congestion (CE) but the inner packet is
    /// not ECN-capable (RFC 6040: drop).
    DropEcn = 11,
    /// Host routing: encapsulated at a pod's veth and sent to the uplink.
    EncapBypass = 12,
    /// Host routing: decapsulated and delivered straight into a local pod.
    DecapBypass = 13,
    /// Host routing, DirectRouting: sent as is (no encapsulation) straight
    /// to a peer on the uplink's own subnet.
    DirectTx = 14,
    /// Host routing, DirectRouting: arrived unencapsulated from a peer on
    /// the uplink's own subnet and delivered straight into a local pod.
    DirectRx = 15,
    /// Host routing: a pod's packet whose source is another local pod's
    /// address, or in the node's pod subnets but not the pod's own, the
    /// node's address, a remote pod's or another node's address (Cilium's
    /// DROP_INVALID_SIP).
    DropInvalidSource = 16,
    /// Decap: the inner destination is not in this node's pod subnets (a
    /// VTEP may not use this node as a relay to anywhere else), or VXLAN
    /// the kernel decapsulated was sent to another of the node's addresses
    /// than its VTEP address (a pod's gateway, say).
    DropForeignDestination = 17,
}

impl Reason {
    pub const COUNT: u32 = 18;

    pub const ALL: [Reason; Reason::COUNT as usize] = [
        Reason::Encapsulated,
        Reason::Decapsulated,
        Reason::Passed,
        Reason::DropNoRoute,
        Reason::DropMalformed,
        Reason::DropWrongVni,
        Reason::DropUnknownVtep,
        Reason::DropSpoofed,
        Reason::DropTooBig,
        Reason::DropError,
        Reason::Fragmented,
        Reason::DropEcn,
        Reason::EncapBypass,
        Reason::DecapBypass,
        Reason::DirectTx,
        Reason::DirectRx,
        Reason::DropInvalidSource,
        Reason::DropForeignDestination,
    ];

    /// The name used in metrics and `weft status`.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Encapsulated => "encapsulated",
            Reason::Decapsulated => "decapsulated",
            Reason::Passed => "passed",
            Reason::DropNoRoute => "drop_no_route",
            Reason::DropMalformed => "drop_malformed",
            Reason::DropWrongVni => "drop_wrong_vni",
            Reason::DropUnknownVtep => "drop_unknown_vtep",
            Reason::DropSpoofed => "drop_spoofed",
            Reason::DropTooBig => "drop_too_big",
            Reason::DropError => "drop_error",
            Reason::Fragmented => "fragmented",
            Reason::DropEcn => "drop_ecn",
            Reason::EncapBypass => "encap_bypass",
            Reason::DecapBypass => "decap_bypass",
            Reason::DirectTx => "direct_tx",
            Reason::DirectRx => "direct_rx",
            Reason::DropInvalidSource => "drop_invalid_source",
            Reason::DropForeignDestination => "drop_foreign_destination",
        }
    }

    pub const fn is_drop(self) -> bool {
        matches!(
            self,
            Reason::DropNoRoute
                | Reason::DropMalformed
                | Reason::DropWrongVni
                | Reason::DropUnknownVtep
                | Reason::DropSpoofed
                | Reason::DropTooBig
                | Reason::DropError
                | Reason::DropEcn
                | Reason::DropInvalidSource
                | Reason::DropForeignDestination
        )
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, no implicit padding (checked by the layout
    // test), and every bit pattern is a valid value; the same holds for the
    // three below.
    unsafe impl aya::Pod for super::Vtep {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::VtepInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Vtep6 {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::DataplaneConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Counter {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Endpoint {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CtRequest {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PodIf {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<Vtep>(), 12);
        assert_eq!(size_of::<VtepInfo>(), 4);
        assert_eq!(size_of::<DataplaneConfig>(), 132);
        assert_eq!(size_of::<CtRequest>(), 40);
        assert_eq!(size_of::<PodIf>(), 24);
        assert_eq!(size_of::<Vtep6>(), 24);
        assert_eq!(size_of::<Counter>(), 16);
        assert_eq!(size_of::<Endpoint>(), 16);
    }

    #[test]
    fn reasons_are_dense_and_named_uniquely() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
            for other in &Reason::ALL[i + 1..] {
                assert_ne!(r.name(), other.name());
            }
        }
        assert!(!Reason::Passed.is_drop());
        assert!(Reason::DropNoRoute.is_drop());
        assert!(Reason::DropEcn.is_drop());
        assert!(!Reason::DecapBypass.is_drop());
    }
}
