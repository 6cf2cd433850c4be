//! The overlay devices, one per address family, and the uplink they send
//! through. One [`OverlayDevice`] type covers both families: the IPv4
//! device is a veth pair whose egress program encapsulates (`weft.<VNI>`),
//! the IPv6 device is the kernel's vxlan driver in collect-metadata mode
//! (`weft-v6.<VNI>`); what differs between them is said once, here.
//!
//! What does not go straight into a local pod is decapsulated by the
//! kernel's vxlan device (a program cannot strip a tunnel the way the
//! kernel does: a frame stripped in TC stays a tunnel GSO packet with
//! `encapsulation` set, which the pod bridge then segments and checksums
//! in software). One collect-metadata vxlan device per node receives for
//! both families: the IPv6 device where the node has IPv6, otherwise the
//! receive device `weft-rx.<VNI>`. It carries the node's IPv4 overlay
//! address too, so reverse-path filtering accepts what it hands the stack.
//! Where it cannot exist (another vxlan device, such as flannel's, holds
//! the port), TC strips every frame itself, as before.

use anyhow::{Context as _, Result, bail};
use dataplane_common::program_names;
use ipnet::{IpNet, Ipv4Net};

use crate::dataplane::names::device_name;
use crate::dataplane::names::device6_name;
use crate::dataplane::names::receive_device_name;
use crate::dataplane::programs::links;
use crate::dataplane::programs::links::Hook;
use crate::dataplane::programs::loader::off_runtime;
use crate::dataplane::types::DataplaneSpec;
use crate::dataplane::types::Family;
use crate::lease::Subnets;
use crate::sys::netlink::Link;
use crate::sys::netlink::Netlink;
use crate::sys::sysctl;

/// The other end of the IPv4 overlay device's veth pair.
pub(crate) fn device_peer_name(vni: u32) -> String {
    format!("weft.{vni}.p")
}

/// flannel's device for a VNI: routes through it are taken over when a node
/// moves from flannel to Weft.
pub(crate) fn flannel_device_name(vni: u32) -> String {
    format!("flannel.{vni}")
}

/// The names of every device Weft creates for a VNI.
pub(crate) fn all_device_names(vni: u32) -> [String; 4] {
    [
        device_name(vni),
        device_peer_name(vni),
        device6_name(vni),
        receive_device_name(vni),
    ]
}

/// What a device is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Its family's overlay device: routes to remote subnets go through it.
    Overlay,
    /// Only receives (the kernel decapsulates into it): no routes.
    Receive,
}

/// The programs at a device's hooks.
pub(crate) type DevicePrograms = &'static [(&'static str, Hook)];

/// One family's overlay device.
pub(crate) struct OverlayDevice {
    pub(crate) family: Family,
    pub(crate) role: Role,
    pub(crate) name: String,
    /// Its index, once it exists.
    pub(crate) index: Option<u32>,
    pub(crate) mtu: u32,
}

/// What healing one device did.
#[derive(Debug, Default)]
pub(super) struct DeviceHealed {
    /// The device was gone or replaced: its programs' links are defunct.
    pub(super) recreated: bool,
    /// It was down, had ARP on or the wrong MAC, and was put right.
    pub(super) repaired: bool,
    /// It was created or converged: its family's waiting peers can be
    /// routed now.
    pub(super) converged: bool,
    /// Its address was put back.
    pub(super) address: bool,
}

impl OverlayDevice {
    fn new(family: Family, vni: u32, mtu: u32) -> Self {
        let name = match family {
            Family::V4 => device_name(vni),
            Family::V6 => device6_name(vni),
        };
        Self {
            family,
            role: Role::Overlay,
            name,
            index: None,
            mtu,
        }
    }

    /// The receive device of a node without IPv6.
    fn receive(vni: u32, mtu: u32) -> Self {
        Self {
            family: Family::V4,
            role: Role::Receive,
            name: receive_device_name(vni),
            index: None,
            mtu,
        }
    }

    /// Whether the kernel decapsulates into this device.
    fn receives(&self) -> bool {
        self.role == Role::Receive || self.family.is_v6()
    }

    /// The addresses it should have: its family's subnet's network address
    /// (flannel's form: `10.244.3.0/32`, `fd00:10:244:3::/128`), and on a
    /// receiving device the IPv4 one too, for reverse-path filtering.
    fn wanted(&self, subnets: &Subnets) -> Vec<(Family, IpNet)> {
        let mut out = Vec::new();
        if let Some(s) = self.family.subnet(subnets) {
            out.push((self.family, s));
        }
        if self.receives()
            && self.family != Family::V4
            && let Some(s) = Family::V4.subnet(subnets)
        {
            out.push((Family::V4, s));
        }
        out
    }

    /// The programs at this device's hooks: encapsulation on egress, and
    /// for the vxlan device, the check of what it decapsulated.
    pub(super) fn programs(&self) -> DevicePrograms {
        match (self.role, self.family) {
            (Role::Receive, _) => &[(program_names::TUNNEL_RX, Hook::TcIngress)],
            (Role::Overlay, Family::V4) => &[(program_names::ENCAP, Hook::TcEgress)],
            (Role::Overlay, Family::V6) => &[
                (program_names::ENCAP6, Hook::TcEgress),
                (program_names::TUNNEL_RX, Hook::TcIngress),
            ],
        }
    }

    /// Whether the node runs without this device when it cannot be made.
    /// Another vxlan device on the port (flannel's, on a node moving from
    /// flannel) keeps the IPv6 device from being created: IPv6 peers wait,
    /// reported, until that device is gone and healing creates this one.
    /// The IPv4 device is a veth pair nothing else claims: not being able
    /// to create it is fatal.
    fn optional(&self) -> bool {
        self.receives()
    }

    /// Creates the device or converges it (kind, MAC, MTU, up, no ARP)
    /// with its family's settings; returns its index and whether it is new.
    async fn converge(&self, nl: &Netlink, spec: &DataplaneSpec) -> Result<(u32, bool)> {
        let mac = spec.device_mac(self.family).0;
        if self.role == Role::Receive {
            let r = nl
                .ensure_vxlan_device(&self.name, spec.port, None, mac, self.mtu)
                .await?;
            let _ = sysctl::write_iface("ipv6", &self.name, "disable_ipv6", "1");
            sysctl::write_iface("ipv4", &self.name, "rp_filter", "2")?;
            return Ok(r);
        }
        match self.family {
            Family::V4 => {
                let peer = device_peer_name(spec.vni);
                let r = nl
                    .ensure_overlay_device(&self.name, &peer, mac, self.mtu)
                    .await?;
                // IPv4 only: no IPv6 link-local chatter into the
                // encapsulation path.
                for d in [&self.name, &peer] {
                    let _ = sysctl::write_iface("ipv6", d, "disable_ipv6", "1");
                }
                Ok(r)
            }
            Family::V6 => {
                let Some(local) = spec.public_ipv6 else {
                    bail!("no IPv6 VTEP address");
                };
                let r = nl
                    .ensure_vxlan_device(&self.name, spec.port, Some(local), mac, self.mtu)
                    .await?;
                // No router advertisements on the overlay; its address is
                // not duplicate-checked (no ARP, no neighbour discovery).
                let _ = sysctl::write_iface("ipv6", &self.name, "accept_ra", "0");
                // IPv4 packets it decapsulates come from remote subnets
                // routed through the IPv4 device: reverse-path filtering
                // here must be loose (the larger of `all` and the device's
                // value applies, and 2 is the larger).
                sysctl::write_iface("ipv4", &self.name, "rp_filter", "2")?;
                Ok(r)
            }
        }
    }

    /// Makes the [`wanted`](Self::wanted) addresses the device's only
    /// addresses of their families.
    async fn address(&self, nl: &Netlink, index: u32, subnets: &Subnets) -> Result<()> {
        for (family, subnet) in self.wanted(subnets) {
            nl.ensure_only_address(index, subnet.network(), family.host_prefix())
                .await?;
        }
        Ok(())
    }

    /// Creates or converges the device and its addresses.
    async fn ensure(
        &mut self,
        nl: &Netlink,
        spec: &DataplaneSpec,
        subnets: &Subnets,
    ) -> Result<()> {
        let (index, created) = self.converge(nl, spec).await?;
        if created {
            tracing::info!(device = %self.name, mtu = self.mtu, "created the overlay device");
        }
        self.address(nl, index, subnets).await?;
        self.index = Some(index);
        Ok(())
    }

    /// Puts the device back as it should be (with MTU `mtu`), if something
    /// removed or changed it.
    async fn heal(
        &mut self,
        nl: &Netlink,
        spec: &DataplaneSpec,
        subnets: &Subnets,
        mtu: u32,
    ) -> Result<DeviceHealed> {
        let mut h = DeviceHealed::default();
        self.mtu = mtu;
        let mac = spec.device_mac(self.family).0;
        let link = nl.link(&self.name).await?;
        let broken = link
            .as_ref()
            .is_some_and(|l| !l.up || l.arp || l.mac != mac);
        let recreate = link.as_ref().is_none_or(|l| Some(l.index) != self.index);
        let changed = link.as_ref().is_none_or(|l| l.mtu != mtu) || broken;
        if recreate {
            // The links pinned for the old device are defunct.
            let (pins, name, hooks) = (spec.pins.clone(), self.name.clone(), self.programs());
            off_runtime(move || -> Result<()> {
                for (_, hook) in hooks {
                    links::detach(&pins, *hook, &name)?;
                }
                Ok(())
            })?;
            h.recreated = true;
        }
        if changed {
            match self.converge(nl, spec).await {
                Ok((index, _)) => {
                    let first = self.index.is_none();
                    self.index = Some(index);
                    h.converged = true;
                    if first {
                        tracing::info!(device = %self.name, "the overlay device is up");
                    } else if recreate || broken {
                        h.repaired = true;
                    }
                }
                Err(e) if self.optional() => {
                    self.index = None;
                    tracing::warn!(device = %self.name, error = %format!("{e:#}"), "still no overlay device");
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(index) = self.index {
            for (family, subnet) in self.wanted(subnets) {
                let want = [(subnet.network(), family.host_prefix())];
                if nl.family_addresses(index, family.is_v6()).await? != want {
                    self.address(nl, index, subnets).await?;
                    h.address = true;
                    break;
                }
            }
        }
        Ok(h)
    }
}

/// The node's overlay devices (one per family the node has a subnet and a
/// VTEP address for) and its uplink.
pub(crate) struct Devices {
    devices: Vec<OverlayDevice>,
    pub(crate) uplink: Link,
    /// flannel's device for our VNI, if the node has one.
    pub(crate) flannel_index: Option<u32>,
    /// The subnets the uplink's IPv4 addresses are on: a peer whose VTEP is
    /// on one of them is on our L2 segment.
    pub(crate) uplink_nets: Vec<Ipv4Net>,
}

/// What one pass of [`Devices::heal`] did.
#[derive(Debug, Default)]
pub(super) struct DevicesHealed {
    pub(super) recreated: bool,
    pub(super) repairs: Vec<&'static str>,
    /// Families whose device was created or converged.
    pub(super) converged: Vec<Family>,
}

impl Devices {
    /// Checks the uplink and creates (or adopts) the overlay devices.
    pub(super) async fn setup(
        nl: &Netlink,
        spec: &DataplaneSpec,
        subnets: Subnets,
    ) -> Result<Self> {
        let uplink = nl.require_link(&spec.uplink).await?;
        let overhead = Family::ALL
            .into_iter()
            .filter(|f| f.subnet(&subnets).is_some())
            .map(Family::overhead)
            .max()
            .unwrap_or(Family::V4.overhead());
        if uplink.mtu <= overhead + 68 {
            bail!(
                "uplink {} has MTU {}: too small for VXLAN",
                uplink.name,
                uplink.mtu
            );
        }
        if let Some(m) = spec.underlay_mtu
            && m > uplink.mtu
        {
            tracing::warn!(
                backend_mtu = m,
                uplink_mtu = uplink.mtu,
                "Backend.MTU is larger than the uplink's MTU: packets that fill the overlay MTU cannot leave"
            );
        }
        let underlay = spec.underlay_mtu(uplink.mtu);
        let mut devices = Vec::new();
        for family in Family::ALL {
            let (Some(_), Some(_)) = (family.subnet(&subnets), spec.vtep(family)) else {
                continue;
            };
            devices.push(OverlayDevice::new(
                family,
                spec.vni,
                family.overlay_mtu(underlay),
            ));
        }
        if !devices.iter().any(OverlayDevice::receives) {
            devices.push(OverlayDevice::receive(
                spec.vni,
                Family::V4.overlay_mtu(underlay),
            ));
        }
        // A receive device of another shape of this node (IPv4-only before,
        // now with IPv6) would hold the port.
        if devices.iter().all(|d| d.role != Role::Receive) {
            nl.delete_link(&receive_device_name(spec.vni)).await?;
        }
        for d in &mut devices {
            match d.ensure(nl, spec, &subnets).await {
                Ok(()) => {}
                Err(e) if d.optional() => {
                    tracing::warn!(device = %d.name, error = %format!("{e:#}"), "no vxlan device yet (retrying); until then TC strips every frame");
                }
                Err(e) => return Err(e).with_context(|| format!("creating {}", d.name)),
            }
        }
        let flannel_index = nl
            .link(&flannel_device_name(spec.vni))
            .await?
            .map(|l| l.index);
        let uplink_nets = nl
            .addresses(uplink.index)
            .await?
            .into_iter()
            .filter_map(|(ip, len)| Ipv4Net::new(ip, len).ok().map(|n| n.trunc()))
            .collect();
        Ok(Self {
            devices,
            uplink,
            flannel_index,
            uplink_nets,
        })
    }

    /// The devices that exist (by family), with their programs.
    pub(crate) fn existing(&self) -> impl Iterator<Item = &OverlayDevice> {
        self.devices.iter().filter(|d| d.index.is_some())
    }

    /// `family`'s overlay device, whether it exists yet or not.
    pub(crate) fn get(&self, family: Family) -> Option<&OverlayDevice> {
        self.devices
            .iter()
            .find(|d| d.family == family && d.role == Role::Overlay)
    }

    /// The kernel's vxlan device that decapsulates what does not go
    /// straight into a pod (`weft_tunnel_rx` checks it), once it exists.
    pub(crate) fn kernel_rx(&self) -> Option<&OverlayDevice> {
        self.existing().find(|d| d.receives())
    }

    /// Forgets the receive device's index (it is about to go down), if the
    /// node has one; returns the index.
    pub(crate) fn stand_down_receive(&mut self) -> Option<u32> {
        self.devices
            .iter_mut()
            .find(|d| d.role == Role::Receive)
            .and_then(|d| d.index.take())
    }

    /// The index of `family`'s device, once it exists.
    pub(crate) fn index(&self, family: Family) -> Option<u32> {
        self.get(family).and_then(|d| d.index)
    }

    /// The devices that exist and their programs, for attaching.
    pub(super) fn attachable(&self) -> Vec<(String, DevicePrograms)> {
        self.existing()
            .map(|d| (d.name.clone(), d.programs()))
            .collect()
    }

    /// The pods' MTU: the smallest of their families' overlay MTUs (one
    /// pod interface carries both).
    pub(crate) fn pods_mtu(&self, spec: &DataplaneSpec, subnets: &Subnets) -> u32 {
        let underlay = spec.underlay_mtu(self.uplink.mtu);
        Family::ALL
            .into_iter()
            .filter(|f| f.subnet(subnets).is_some())
            .map(|f| f.overlay_mtu(underlay))
            .min()
            .unwrap_or(Family::V4.overlay_mtu(underlay))
    }

    /// Gives the devices that exist the addresses of new `subnets`.
    pub(super) async fn set_subnets(&self, nl: &Netlink, subnets: &Subnets) -> Result<()> {
        for d in self.existing() {
            if let Some(index) = d.index {
                d.address(nl, index, subnets).await?;
            }
        }
        Ok(())
    }

    /// Follows the uplink (gone: an error; its MTU, followed) and puts the
    /// devices back as they should be.
    pub(super) async fn heal(
        &mut self,
        nl: &Netlink,
        spec: &DataplaneSpec,
        subnets: &Subnets,
    ) -> Result<DevicesHealed> {
        let Some(uplink) = nl.link_by_index(self.uplink.index).await? else {
            bail!("the uplink {} is gone", spec.uplink);
        };
        if uplink.mtu != self.uplink.mtu {
            tracing::info!(
                uplink = %uplink.name,
                from = self.uplink.mtu,
                to = uplink.mtu,
                "the uplink's MTU changed"
            );
        }
        self.uplink = uplink;
        let underlay = spec.underlay_mtu(self.uplink.mtu);
        let mut h = DevicesHealed::default();
        for d in &mut self.devices {
            if d.family.subnet(subnets).is_none() {
                continue;
            }
            let mtu = d.family.overlay_mtu(underlay);
            let dh = d.heal(nl, spec, subnets, mtu).await?;
            h.recreated |= dh.recreated;
            for (did, what) in [(dh.repaired, "device"), (dh.address, "address")] {
                if did && !h.repairs.contains(&what) {
                    h.repairs.push(what);
                }
            }
            if dh.converged && d.role == Role::Overlay {
                h.converged.push(d.family);
            }
        }
        Ok(h)
    }
}
