//! The golden frames: for each program, what it is given and what the
//! wire format (and Weft's rules) say it must return, count and leave.

use std::net::IpAddr;

use crate::mac::MacAddr;

use dataplane_common::{Reason, program_names as prog};

use crate::dataplane::programs::selftest::{
    fixture::{self as fx, Mode},
    packets::{self as pk, ENCAP4, ENCAP6, ETH_LEN, IPV4_LEN, IPV6_LEN, Ip, Vxlan},
};

/// What a TC program returns.
pub(super) const TC_ACT_OK: u32 = 0;
pub(super) const TC_ACT_SHOT: u32 = 2;
pub(super) const TC_ACT_REDIRECT: u32 = 7;
/// What an XDP program returns.
pub(super) const XDP_DROP: u32 = 1;
pub(super) const XDP_PASS: u32 = 2;

/// One program run on one frame.
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) program: &'static str,
    pub(super) mode: Mode,
    pub(super) input: Vec<u8>,
    pub(super) expect: Expect,
}

/// A check of a frame's varying bytes: what is wrong, if anything.
pub(super) type Check = fn(&[u8]) -> Result<(), String>;

/// What the run must give.
pub(super) struct Expect {
    /// The program's return value.
    pub(super) action: u32,
    /// The counter it adds one packet to (None: no counter moves).
    pub(super) reason: Option<Reason>,
    /// The frame it leaves.
    pub(super) frame: Vec<u8>,
    /// Byte ranges of `frame` that vary by run (an IP ID, a source port
    /// from the flow hash): not compared, but checked by `valid`.
    pub(super) varies: Vec<std::ops::Range<usize>>,
    /// Checks of the varying bytes.
    pub(super) valid: Option<Check>,
}

impl Expect {
    fn new(action: u32, reason: Reason, frame: Vec<u8>) -> Self {
        Self {
            action,
            reason: Some(reason),
            frame,
            varies: Vec::new(),
            valid: None,
        }
    }
}

fn case(name: &str, program: &'static str, mode: Mode, input: Vec<u8>, e: Expect) -> Case {
    Case {
        name: name.to_string(),
        program,
        mode,
        input,
        expect: e,
    }
}

/// A pod's frame as it leaves the pod (to its gateway's MAC).
fn pod_frame(ip: Ip) -> Vec<u8> {
    let mut f = pk::eth(fx::GW_MAC, fx::POD_MAC, ip.ethertype());
    f.extend_from_slice(&ip.bytes());
    f
}

/// A frame the host stack routed into the overlay device.
fn routed_frame(ip: Ip) -> Vec<u8> {
    let mut f = pk::eth(fx::VTEP_MAC, fx::VTEP_MAC, ip.ethertype());
    f.extend_from_slice(&ip.bytes());
    f
}

/// VXLAN from the IPv4 peer (or `outer_src`) to this node, carrying `inner`.
fn vxlan4(outer_src: IpAddr, inner: Ip) -> Vxlan {
    Vxlan {
        outer: Ip::udp(outer_src, IpAddr::V4(fx::LOCAL4)),
        port: fx::port(),
        flags: 0x08,
        vni: fx::vni(),
        inner_dst_mac: fx::VTEP_MAC,
        inner_src_mac: fx::PEER4_MAC,
        inner,
    }
}

fn vxlan6(outer_src: IpAddr, inner: Ip) -> Vxlan {
    Vxlan {
        outer: Ip::udp(outer_src, IpAddr::V6(fx::LOCAL6)),
        port: fx::port(),
        flags: 0x08,
        vni: fx::vni(),
        inner_dst_mac: fx::VTEP6_MAC,
        inner_src_mac: fx::PEER6_MAC,
        inner,
    }
}

fn wire(v: &Vxlan) -> Vec<u8> {
    v.frame(fx::UPLINK_MAC, fx::WIRE_MAC)
}

/// `frame` (Ethernet + IPv4) encapsulated for the IPv4 peer as the kernel's
/// vxlan device would: the outer Ethernet header kept (the neighbour table
/// fills it on redirect), outer IPv4 from this node (TTL 64, ECN from the
/// inner packet, DF clear), UDP to the VXLAN port without a checksum, the
/// VNI, and the inner frame to the peer's VTEP MAC from ours.
fn encapsulated4(frame: &[u8], peer_mac: MacAddr, vtep: std::net::Ipv4Addr) -> Expect {
    let inner = &frame[ETH_LEN..];
    let mut f = frame[..ETH_LEN].to_vec();
    f[12..14].copy_from_slice(&pk::ETH_P_IP.to_be_bytes());
    let ip_len = (IPV4_LEN + 16 + ETH_LEN + inner.len()) as u16;
    f.extend_from_slice(&[0x45, inner[1] & 0x03]);
    f.extend_from_slice(&ip_len.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0, 64, pk::IPPROTO_UDP, 0, 0]);
    f.extend_from_slice(&fx::LOCAL4.octets());
    f.extend_from_slice(&vtep.octets());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&fx::port().to_be_bytes());
    f.extend_from_slice(&(ip_len - IPV4_LEN as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x08, 0, 0, 0]);
    f.extend_from_slice(&(fx::vni() << 8).to_be_bytes());
    f.extend_from_slice(&pk::eth(peer_mac, fx::VTEP_MAC, pk::ETH_P_IP));
    f.extend_from_slice(inner);
    Expect {
        action: TC_ACT_REDIRECT,
        reason: Some(Reason::Encapsulated),
        frame: f,
        // The IP ID, the header checksum over it, the UDP source port.
        varies: vec![18..20, 24..26, 34..36],
        valid: Some(outer4_valid),
    }
}

/// The outer IPv4 header sums to zero and the source port is in the
/// kernel's ephemeral range, as `udp_flow_src_port` picks it.
fn outer4_valid(f: &[u8]) -> Result<(), String> {
    if pk::checksum(&f[ETH_LEN..ETH_LEN + IPV4_LEN]) != 0 {
        return Err("the outer IPv4 header checksum is wrong".into());
    }
    let sport = u16::from_be_bytes([f[34], f[35]]);
    if !(32768..=60999).contains(&sport) {
        return Err(format!("UDP source port {sport} is outside 32768-60999"));
    }
    Ok(())
}

/// Unchanged, with this action and counter.
fn same(action: u32, reason: Reason, input: &[u8]) -> Expect {
    Expect::new(action, reason, input.to_vec())
}

/// Decapsulated by XDP: the inner frame, readdressed to the uplink's MAC.
fn stripped_xdp(v: &Vxlan) -> Expect {
    let mut f = v.inner_frame();
    f[..6].copy_from_slice(&fx::UPLINK_MAC.0);
    Expect::new(XDP_PASS, Reason::Decapsulated, f)
}

/// Decapsulated by TC: the outer Ethernet header (to the uplink) and the
/// inner packet.
fn stripped_tc(v: &Vxlan, encap: usize) -> Vec<u8> {
    let wire = wire(v);
    let mut f = wire[..ETH_LEN].to_vec();
    f.extend_from_slice(&wire[ETH_LEN + encap..]);
    f
}

/// Delivered into the local pod: to its MAC from its gateway's, one hop
/// less.
fn into_pod(mut f: Vec<u8>) -> Vec<u8> {
    f[..6].copy_from_slice(&fx::POD_MAC.0);
    f[6..12].copy_from_slice(&fx::GW_MAC.0);
    pk::hop(&mut f, ETH_LEN);
    f
}

pub(crate) fn all() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(encap());
    v.extend(decap_xdp());
    v.extend(decap_tc());
    v.extend(host_routing());
    v.extend(ipv6_overlay());
    v
}

/// `weft_encap`: what the host stack routed into `weft.<VNI>`.
fn encap() -> Vec<Case> {
    let to_peer = routed_frame(Ip::udp(fx::own4(5), fx::peer4_pod(7)).tos(0x02));
    let no_peer = routed_frame(Ip::udp(fx::own4(5), fx::nowhere4()));
    let big = routed_frame(Ip::udp(fx::own4(5), fx::peer4_pod(7)).payload(1500 - 20 - 8 - 49));
    let fits = routed_frame(Ip::udp(fx::own4(5), fx::peer4_pod(7)).payload(1500 - 20 - 8 - 50));
    let arp = pk::arp(fx::VTEP_MAC);
    vec![
        case(
            "encap: to a peer's pod, VXLAN to its VTEP (ECN copied outward)",
            prog::ENCAP,
            Mode::Legacy,
            to_peer.clone(),
            encapsulated4(&to_peer, fx::PEER4_MAC, fx::PEER4),
        ),
        case(
            "encap: a packet that fills the overlay MTU exactly",
            prog::ENCAP,
            Mode::Legacy,
            fits.clone(),
            encapsulated4(&fits, fx::PEER4_MAC, fx::PEER4),
        ),
        case(
            "encap: one byte more than the uplink carries",
            prog::ENCAP,
            Mode::Legacy,
            big.clone(),
            same(TC_ACT_SHOT, Reason::DropTooBig, &big),
        ),
        case(
            "encap: a destination in no peer's subnet",
            prog::ENCAP,
            Mode::Legacy,
            no_peer.clone(),
            same(TC_ACT_SHOT, Reason::DropNoRoute, &no_peer),
        ),
        case(
            "encap: not IP",
            prog::ENCAP,
            Mode::Legacy,
            arp.clone(),
            same(TC_ACT_OK, Reason::Passed, &arp),
        ),
    ]
}

/// The hostile and the odd VXLAN frames, over IPv4, each with the drop it
/// earns (the same for XDP and TC).
fn hostile4() -> Vec<(&'static str, Vec<u8>, Reason)> {
    let peer = IpAddr::V4(fx::PEER4);
    let good = || vxlan4(peer, Ip::udp(fx::peer4_pod(7), fx::own4(5)));
    let mut wrong_vni = good();
    wrong_vni.vni = fx::vni() ^ 1;
    let mut no_i_flag = good();
    no_i_flag.flags = 0;
    let stranger = vxlan4(
        IpAddr::V4(fx::STRANGER4),
        Ip::udp(fx::peer4_pod(7), fx::own4(5)),
    );
    let spoofed = vxlan4(peer, Ip::udp(fx::direct_pod(9), fx::own4(5)));
    let foreign = vxlan4(peer, Ip::udp(fx::peer4_pod(7), fx::nowhere4()));
    // CE on the way, for an inner packet that is not ECN-capable.
    let mut ce = wire(&good());
    pk::mark_ce(&mut ce, ETH_LEN);
    let mut truncated = wire(&good());
    truncated.truncate(ETH_LEN + IPV4_LEN + 8 + 4);
    vec![
        ("another VNI", wire(&wrong_vni), Reason::DropWrongVni),
        (
            "VXLAN without the I flag",
            wire(&no_i_flag),
            Reason::DropMalformed,
        ),
        (
            "from an address that is no VTEP",
            wire(&stranger),
            Reason::DropUnknownVtep,
        ),
        (
            "an inner source of another peer's subnet",
            wire(&spoofed),
            Reason::DropSpoofed,
        ),
        (
            "an inner destination that is no pod here",
            wire(&foreign),
            Reason::DropForeignDestination,
        ),
        ("CE outside, not ECN-capable inside", ce, Reason::DropEcn),
        (
            "cut short inside the VXLAN header",
            truncated,
            Reason::DropMalformed,
        ),
    ]
}

/// The first fragment of a VXLAN packet over IPv4 (a hop on the way
/// fragmented it): passed untouched for the kernel to reassemble.
fn first_fragment() -> Vec<u8> {
    let mut v = vxlan4(
        IpAddr::V4(fx::PEER4),
        Ip::udp(fx::peer4_pod(7), fx::own4(5)),
    );
    v.outer = v.outer.frag(0x2000);
    wire(&v)
}

/// `weft_decap`: XDP on the uplink.
fn decap_xdp() -> Vec<Case> {
    let peer = IpAddr::V4(fx::PEER4);
    let good = vxlan4(peer, Ip::udp(fx::peer4_pod(7), fx::own4(5)));
    let from_node = vxlan4(peer, Ip::udp(peer, fx::own4(5)));
    let ecn = vxlan4(peer, Ip::udp(fx::peer4_pod(7), fx::own4(5)).tos(0x01));
    let mut ecn_wire = wire(&ecn);
    pk::mark_ce(&mut ecn_wire, ETH_LEN);
    let mut ecn_out = stripped_xdp(&ecn);
    pk::mark_ce(&mut ecn_out.frame, ETH_LEN);
    let mut other_port = good.clone();
    // The IANA VXLAN port, unless that is the node's own.
    other_port.port = if fx::port() == 4789 { 8472 } else { 4789 };
    let v6 = vxlan6(
        IpAddr::V6(fx::PEER6),
        Ip::udp(fx::peer6_pod(7), fx::own6(5)),
    );
    let mut out = vec![
        case(
            "decap xdp: from a peer's pod to a pod here",
            prog::DECAP_XDP,
            Mode::Legacy,
            wire(&good),
            stripped_xdp(&good),
        ),
        case(
            "decap xdp: from the peer node itself",
            prog::DECAP_XDP,
            Mode::Legacy,
            wire(&from_node),
            stripped_xdp(&from_node),
        ),
        case(
            "decap xdp: CE outside goes inside (RFC 6040)",
            prog::DECAP_XDP,
            Mode::Legacy,
            ecn_wire,
            ecn_out,
        ),
        case(
            "decap xdp: over IPv6 from the IPv6 peer",
            prog::DECAP_XDP,
            Mode::Legacy,
            wire(&v6),
            stripped_xdp(&v6),
        ),
        case(
            "decap xdp: UDP to another port is not ours",
            prog::DECAP_XDP,
            Mode::Legacy,
            wire(&other_port),
            same(XDP_PASS, Reason::Passed, &wire(&other_port)),
        ),
        case(
            "decap xdp: the first fragment of a VXLAN packet passes to be reassembled",
            prog::DECAP_XDP,
            Mode::Legacy,
            first_fragment(),
            same(XDP_PASS, Reason::Fragmented, &first_fragment()),
        ),
    ];
    for (what, frame, reason) in hostile4().into_iter().chain(hostile6()) {
        out.push(Case {
            name: format!("decap xdp: {what}"),
            program: prog::DECAP_XDP,
            mode: Mode::Legacy,
            expect: same(XDP_DROP, reason, &frame),
            input: frame,
        });
    }
    out
}

/// The hostile VXLAN frames over IPv6.
fn hostile6() -> Vec<(&'static str, Vec<u8>, Reason)> {
    let peer = IpAddr::V6(fx::PEER6);
    let good = || vxlan6(peer, Ip::udp(fx::peer6_pod(7), fx::own6(5)));
    let mut wrong_vni = good();
    wrong_vni.vni = fx::vni() ^ 6;
    let stranger = vxlan6(
        IpAddr::V6(fx::STRANGER6),
        Ip::udp(fx::peer6_pod(7), fx::own6(5)),
    );
    let spoofed = vxlan6(peer, Ip::udp(fx::nowhere6(), fx::own6(5)));
    let foreign = vxlan6(peer, Ip::udp(fx::peer6_pod(7), fx::nowhere6()));
    vec![
        ("IPv6: another VNI", wire(&wrong_vni), Reason::DropWrongVni),
        (
            "IPv6: from an address that is no VTEP",
            wire(&stranger),
            Reason::DropUnknownVtep,
        ),
        (
            "IPv6: an inner source outside the peer's subnet",
            wire(&spoofed),
            Reason::DropSpoofed,
        ),
        (
            "IPv6: an inner destination that is no pod here",
            wire(&foreign),
            Reason::DropForeignDestination,
        ),
    ]
}

/// `weft_decap_tc`: the TC fallback on the uplink, and host routing's
/// delivery after it.
fn decap_tc() -> Vec<Case> {
    let peer = IpAddr::V4(fx::PEER4);
    let good = vxlan4(peer, Ip::udp(fx::peer4_pod(7), fx::own4(5)));
    let to_other = vxlan4(peer, Ip::udp(fx::peer4_pod(7), fx::own4(6)));
    let v6 = vxlan6(
        IpAddr::V6(fx::PEER6),
        Ip::udp(fx::peer6_pod(7), fx::own6(5)),
    );
    let mut out = vec![
        case(
            "decap tc: from a peer's pod to a pod here",
            prog::DECAP_TC,
            Mode::Legacy,
            wire(&good),
            Expect::new(TC_ACT_OK, Reason::Decapsulated, stripped_tc(&good, ENCAP4)),
        ),
        case(
            "decap tc: over IPv6",
            prog::DECAP_TC,
            Mode::Legacy,
            wire(&v6),
            Expect::new(TC_ACT_OK, Reason::Decapsulated, stripped_tc(&v6, ENCAP6)),
        ),
        case(
            "decap tc, host routing: straight into the pod",
            prog::DECAP_TC,
            Mode::Bypass,
            wire(&good),
            Expect::new(
                TC_ACT_REDIRECT,
                Reason::DecapBypass,
                into_pod(stripped_tc(&good, ENCAP4)),
            ),
        ),
        case(
            "decap tc, host routing, IPv6: straight into the pod",
            prog::DECAP_TC,
            Mode::Bypass,
            wire(&v6),
            Expect::new(
                TC_ACT_REDIRECT,
                Reason::DecapBypass,
                into_pod(stripped_tc(&v6, ENCAP6)),
            ),
        ),
        case(
            "decap tc, host routing: an address with no endpoint takes the stack",
            prog::DECAP_TC,
            Mode::Bypass,
            wire(&to_other),
            Expect::new(
                TC_ACT_OK,
                Reason::Decapsulated,
                stripped_tc(&to_other, ENCAP4),
            ),
        ),
    ];
    // With the kernel's vxlan device behind the uplink: what goes into a
    // pod is stripped here as before; the rest is stripped here too while
    // no GSO frame went whole to the device on this CPU lately (none in
    // the self-test's own maps), else passed on whole behind it.
    out.extend([
        case(
            "decap tc, kernel receive: straight into the pod",
            prog::DECAP_TC,
            Mode::KernelRx,
            wire(&good),
            Expect::new(
                TC_ACT_REDIRECT,
                Reason::DecapBypass,
                into_pod(stripped_tc(&good, ENCAP4)),
            ),
        ),
        case(
            "decap tc, kernel receive, IPv6: straight into the pod",
            prog::DECAP_TC,
            Mode::KernelRx,
            wire(&v6),
            Expect::new(
                TC_ACT_REDIRECT,
                Reason::DecapBypass,
                into_pod(stripped_tc(&v6, ENCAP6)),
            ),
        ),
        case(
            "decap tc, kernel receive: no endpoint and no GSO frame lately, stripped for the stack",
            prog::DECAP_TC,
            Mode::KernelRx,
            wire(&to_other),
            Expect::new(
                TC_ACT_OK,
                Reason::Decapsulated,
                stripped_tc(&to_other, ENCAP4),
            ),
        ),
    ]);
    for mode in [Mode::Legacy, Mode::KernelRx] {
        out.push(case(
            &format!(
                "decap tc ({mode:?}): the first fragment of a VXLAN packet passes to be reassembled"
            ),
            prog::DECAP_TC,
            mode,
            first_fragment(),
            same(TC_ACT_OK, Reason::Fragmented, &first_fragment()),
        ));
        for (what, frame, reason) in hostile4().into_iter().chain(hostile6()) {
            out.push(Case {
                name: format!("decap tc ({mode:?}): {what}"),
                program: prog::DECAP_TC,
                mode,
                expect: same(TC_ACT_SHOT, reason, &frame),
                input: frame,
            });
        }
    }
    out
}

/// `weft_from_pod` and `weft_deliver`: host routing.
fn host_routing() -> Vec<Case> {
    let to_peer = pod_frame(Ip::udp(IpAddr::V4(fx::POD4), fx::peer4_pod(7)));
    let mut bypassed = {
        let mut hopped = to_peer.clone();
        pk::hop(&mut hopped, ETH_LEN);
        encapsulated4(&hopped, fx::PEER4_MAC, fx::PEER4)
    };
    bypassed.reason = Some(Reason::EncapBypass);
    let to_direct = pod_frame(Ip::udp(IpAddr::V4(fx::POD4), fx::direct_pod(4)));
    let mut direct_out = to_direct.clone();
    pk::hop(&mut direct_out, ETH_LEN);
    let spoofed = pod_frame(Ip::udp(fx::own4(77), fx::peer4_pod(7)));
    let spoofed6 = pod_frame(Ip::udp(fx::own6(0x77), fx::peer6_pod(7)));
    let to_world = pod_frame(Ip::udp(IpAddr::V4(fx::POD4), fx::nowhere4()));
    let mut last_hop = Ip::udp(IpAddr::V4(fx::POD4), fx::peer4_pod(7));
    last_hop.ttl = 1;
    let last_hop = pod_frame(last_hop);
    let to_peer6 = pod_frame(Ip::udp(IpAddr::V6(fx::POD6), fx::peer6_pod(7)));
    let mut bypassed6 = to_peer6.clone();
    bypassed6[..6].copy_from_slice(&fx::PEER6_MAC.0);
    bypassed6[6..12].copy_from_slice(&fx::VTEP6_MAC.0);
    pk::hop(&mut bypassed6, ETH_LEN);
    // From a direct peer's pod, unencapsulated, to the pod here.
    let mut from_direct = pk::eth(fx::UPLINK_MAC, fx::WIRE_MAC, pk::ETH_P_IP);
    from_direct.extend_from_slice(&Ip::udp(fx::direct_pod(4), IpAddr::V4(fx::POD4)).bytes());
    let mut from_elsewhere = pk::eth(fx::UPLINK_MAC, fx::WIRE_MAC, pk::ETH_P_IP);
    from_elsewhere.extend_from_slice(&Ip::udp(fx::nowhere4(), IpAddr::V4(fx::POD4)).bytes());
    vec![
        case(
            "from pod: to a peer's pod, encapsulated at the veth",
            prog::FROM_POD,
            Mode::Bypass,
            to_peer.clone(),
            bypassed,
        ),
        case(
            "from pod: to a direct peer's pod, as it is, one hop less",
            prog::FROM_POD,
            Mode::Bypass,
            to_direct,
            Expect::new(TC_ACT_REDIRECT, Reason::DirectTx, direct_out),
        ),
        case(
            "from pod, IPv6: the tunnel key and the inner MACs, to the IPv6 overlay device",
            prog::FROM_POD,
            Mode::Bypass,
            to_peer6,
            Expect::new(TC_ACT_REDIRECT, Reason::EncapBypass, bypassed6),
        ),
        case(
            "from pod: a source of this node's subnet that is not the pod's",
            prog::FROM_POD,
            Mode::Bypass,
            spoofed.clone(),
            same(TC_ACT_SHOT, Reason::DropInvalidSource, &spoofed),
        ),
        case(
            "from pod, IPv6: a source of this node's subnet that is not the pod's",
            prog::FROM_POD,
            Mode::Bypass,
            spoofed6.clone(),
            same(TC_ACT_SHOT, Reason::DropInvalidSource, &spoofed6),
        ),
        case(
            "from pod: outside the cluster takes the stack",
            prog::FROM_POD,
            Mode::Bypass,
            to_world.clone(),
            same(TC_ACT_OK, Reason::Passed, &to_world),
        ),
        case(
            "from pod: a TTL the stack must answer",
            prog::FROM_POD,
            Mode::Bypass,
            last_hop.clone(),
            same(TC_ACT_OK, Reason::Passed, &last_hop),
        ),
        case(
            "from pod, auto: a flow conntrack does not hold takes the stack",
            prog::FROM_POD,
            Mode::Gated,
            to_peer.clone(),
            same(TC_ACT_OK, Reason::Passed, &to_peer),
        ),
        case(
            "from pod, auto without kfuncs: a flow to a peer's pod takes the stack",
            prog::FROM_POD,
            Mode::Checked,
            to_peer.clone(),
            same(TC_ACT_OK, Reason::Passed, &to_peer),
        ),
        case(
            "from pod, auto without kfuncs: a spoofed source is still dropped",
            prog::FROM_POD,
            Mode::Checked,
            spoofed.clone(),
            same(TC_ACT_SHOT, Reason::DropInvalidSource, &spoofed),
        ),
        case(
            "from pod, auto without kfuncs, IPv6: a spoofed source is still dropped",
            prog::FROM_POD,
            Mode::Checked,
            spoofed6.clone(),
            same(TC_ACT_SHOT, Reason::DropInvalidSource, &spoofed6),
        ),
        case(
            "from pod, legacy: everything takes the stack",
            prog::FROM_POD,
            Mode::Legacy,
            to_peer.clone(),
            same(TC_ACT_OK, Reason::Passed, &to_peer),
        ),
        case(
            "deliver: a direct peer's pod to a pod here",
            prog::DELIVER,
            Mode::Bypass,
            from_direct.clone(),
            Expect::new(TC_ACT_REDIRECT, Reason::DirectRx, into_pod(from_direct)),
        ),
        case(
            "deliver: from no direct peer, untouched and not counted",
            prog::DELIVER,
            Mode::Bypass,
            from_elsewhere.clone(),
            Expect {
                action: TC_ACT_OK,
                reason: None,
                frame: from_elsewhere,
                varies: Vec::new(),
                valid: None,
            },
        ),
    ]
}

/// `weft_encap6` and `weft_tunnel_rx`: the IPv6 overlay device.
fn ipv6_overlay() -> Vec<Case> {
    let mut routed = pk::eth(fx::VTEP6_MAC, fx::VTEP6_MAC, pk::ETH_P_IPV6);
    routed.extend_from_slice(&Ip::udp(fx::own6(5), fx::peer6_pod(7)).bytes());
    let mut keyed = routed.clone();
    keyed[..6].copy_from_slice(&fx::PEER6_MAC.0);
    keyed[6..12].copy_from_slice(&fx::VTEP6_MAC.0);
    let mut no_peer = pk::eth(fx::VTEP6_MAC, fx::VTEP6_MAC, pk::ETH_P_IPV6);
    no_peer.extend_from_slice(&Ip::udp(fx::own6(5), fx::nowhere6()).bytes());
    let mut inner = pk::eth(fx::VTEP6_MAC, fx::PEER6_MAC, pk::ETH_P_IPV6);
    inner.extend_from_slice(&Ip::udp(fx::peer6_pod(7), fx::own6(5)).bytes());
    debug_assert!(inner.len() > ETH_LEN + IPV6_LEN);
    vec![
        case(
            "encap6: to a peer's pod, the inner MACs for the kernel to encapsulate",
            prog::ENCAP6,
            Mode::Legacy,
            routed,
            Expect::new(TC_ACT_OK, Reason::Encapsulated, keyed),
        ),
        case(
            "encap6: a destination in no peer's subnet",
            prog::ENCAP6,
            Mode::Legacy,
            no_peer.clone(),
            same(TC_ACT_SHOT, Reason::DropNoRoute, &no_peer),
        ),
        case(
            "tunnel rx: a frame without tunnel metadata",
            prog::TUNNEL_RX,
            Mode::Legacy,
            inner.clone(),
            same(TC_ACT_SHOT, Reason::DropMalformed, &inner),
        ),
    ]
}
