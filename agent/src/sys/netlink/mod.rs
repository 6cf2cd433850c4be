//! rtnetlink: the host state the dataplane relies on (devices, addresses,
//! routes), and what is attached where.
//!
//! Every call works in the network namespace of the thread that created the
//! [`Netlink`] handle.

mod addresses;
pub(crate) mod events;
mod routes;

use std::net::Ipv6Addr;

use anyhow::{Context as _, Result, anyhow, bail};
use futures::TryStreamExt as _;
use rtnetlink::{
    Handle, LinkUnspec, LinkVeth, LinkVxlan, LinkWireguard,
    packet_route::link::{
        InfoData, InfoKind, InfoNetkit, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, LinkXdp,
        XdpAttached as Attached,
    },
};

pub(crate) use self::routes::Route;
use crate::dataplane::types::XdpMode;

/// How long a route request may wait for the kernel's answer.
pub(super) const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long listing the routes may take.
pub(super) const LIST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// Routes Weft installs carry this protocol number (`ip route ... proto 44`),
/// so they can be told apart from everyone else's and removed on teardown.
pub(crate) const ROUTE_PROTOCOL: u8 = 44;

/// What the dataplane needs to know about one network device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) mtu: u32,
    pub(crate) mac: [u8; 6],
    pub(crate) up: bool,
    /// ARP enabled (IFF_NOARP clear).
    pub(crate) arp: bool,
    /// "dummy", "veth", "vxlan", ... (None for physical devices).
    pub(crate) kind: Option<String>,
    /// The XDP program attached, if any.
    pub(crate) xdp: Option<XdpAttached>,
    /// The network namespace (its id here) of the device's peer, for a
    /// veth whose other end lives elsewhere (a pod's).
    pub(crate) peer_netns: Option<i32>,
    /// A netkit pair's primary (its host side, through which both its
    /// hooks are managed).
    pub(crate) netkit_primary: bool,
}

/// An XDP program attached to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XdpAttached {
    pub(crate) program: u32,
    /// Native or generic; None for hardware offload or several programs.
    pub(crate) mode: Option<XdpMode>,
}

pub(crate) struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens a netlink socket in the current thread's network namespace. Must
    /// be called inside a tokio runtime.
    pub(crate) fn new() -> Result<Self> {
        let (conn, handle, _) =
            rtnetlink::new_connection().context("opening an rtnetlink socket")?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Runs `f` with a fresh handle on a private current-thread runtime, for
    /// callers outside async code (CLI commands, tests).
    pub(crate) fn blocking<T>(f: impl AsyncFnOnce(&Netlink) -> Result<T>) -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a tokio runtime for netlink")?;
        rt.block_on(async {
            let nl = Netlink::new()?;
            f(&nl).await
        })
    }

    pub(crate) async fn link(&self, name: &str) -> Result<Option<Link>> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(parse_link(&msg))),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
        }
    }

    pub(crate) async fn require_link(&self, name: &str) -> Result<Link> {
        self.link(name)
            .await?
            .ok_or_else(|| anyhow!("no network interface named {name:?} in this network namespace"))
    }

    pub(crate) async fn links(&self) -> Result<Vec<Link>> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .context("listing links")?;
        Ok(msgs.iter().map(parse_link).collect())
    }

    /// Creates (or converges) the overlay device `name`: one end of a veth
    /// pair (the other end, `peer`, only exists because a veth comes in
    /// pairs; nothing is ever delivered to it), with ARP off, `mac` and
    /// `mtu`, both ends up. Returns the device's index, and whether it was
    /// created now.
    ///
    /// A veth pair rather than a dummy device because every kernel with
    /// network namespaces has veth, while dummy is optional (and missing on
    /// some minimal kernels). The TC egress program redirects every IPv4
    /// packet before the veth transmits it.
    pub(crate) async fn ensure_overlay_device(
        &self,
        name: &str,
        peer: &str,
        mac: [u8; 6],
        mtu: u32,
    ) -> Result<(u32, bool)> {
        let mut created = false;
        let link = match self.link(name).await? {
            Some(l) if l.kind.as_deref() == Some("veth") => l,
            Some(l) => bail!(
                "a device named {name} exists but is a {} device, not Weft's overlay device; remove it",
                l.kind.as_deref().unwrap_or("physical")
            ),
            None => {
                let msg = LinkVeth::new(name, peer).build();
                self.handle
                    .link()
                    .add(msg)
                    .execute()
                    .await
                    .with_context(|| {
                        format!("creating the overlay device {name} (veth, peer {peer})")
                    })?;
                created = true;
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, Some(mac), mtu).await?;
        if let Some(p) = self.link(peer).await? {
            self.converge_noarp(&p, None, mtu).await?;
        }
        Ok((link.index, created))
    }

    /// Sets `link` up with ARP off, `mtu` and (if given) `mac`, unless it
    /// already is.
    async fn converge_noarp(&self, link: &Link, mac: Option<[u8; 6]>, mtu: u32) -> Result<()> {
        if mac.is_none_or(|m| m == link.mac) && link.mtu == mtu && link.up && !link.arp {
            return Ok(());
        }
        let mut b = LinkUnspec::new_with_index(link.index)
            .mtu(mtu)
            .arp(false)
            .up();
        if let Some(m) = mac {
            b = b.address(m.to_vec());
        }
        self.handle
            .link()
            .set(b.build())
            .execute()
            .await
            .with_context(|| format!("configuring {}", link.name))
    }

    /// Creates (or converges) a vxlan device `name`: the kernel's vxlan
    /// driver in collect-metadata mode on UDP `port` (`ip link add NAME type
    /// vxlan external dstport PORT [local LOCAL] nolearning`), ARP off, `mac`
    /// and `mtu`, up. It decapsulates both families (its sockets listen on
    /// IPv4 and IPv6); to send, the TC programs give every packet its tunnel
    /// key and the driver writes the outer headers, with UDP checksums, from
    /// the IPv6 address `local`. Returns the device's index, and whether it
    /// was created now.
    pub(crate) async fn ensure_vxlan_device(
        &self,
        name: &str,
        port: u16,
        local: Option<Ipv6Addr>,
        mac: [u8; 6],
        mtu: u32,
    ) -> Result<(u32, bool)> {
        let mut created = false;
        let link = match self.link(name).await? {
            Some(l) if l.kind.as_deref() == Some("vxlan") => l,
            Some(l) => bail!(
                "a device named {name} exists but is a {} device, not Weft's vxlan device; remove it",
                l.kind.as_deref().unwrap_or("physical")
            ),
            None => {
                let mut msg = LinkVxlan::new(name, 0).port(port);
                if let Some(local) = local {
                    msg = msg.local6(local);
                }
                let msg = msg
                    .collect_metadata(true)
                    .learning(false)
                    .udp_zero_csum6_rx(false)
                    .udp_zero_csum6_tx(false)
                    .build();
                self.handle
                    .link()
                    .add(msg)
                    .execute()
                    .await
                    .with_context(|| {
                        format!(
                            "creating the vxlan device {name} (collect-metadata, UDP {port}; another vxlan device on UDP {port}, such as flannel's, must be removed first)"
                        )
                    })?;
                created = true;
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, Some(mac), mtu).await?;
        Ok((link.index, created))
    }

    /// Creates (or adopts, as it is) the WireGuard device `name`, with
    /// `mtu`, up. Returns its index, and whether it was created now.
    pub(crate) async fn ensure_wireguard_device(
        &self,
        name: &str,
        mtu: u32,
    ) -> Result<(u32, bool)> {
        let mut created = false;
        let link = match self.link(name).await? {
            Some(l) if l.kind.as_deref() == Some("wireguard") => l,
            Some(l) => bail!(
                "a device named {name} exists but is a {} device, not a WireGuard device; remove it",
                l.kind.as_deref().unwrap_or("physical")
            ),
            None => {
                self.handle
                    .link()
                    .add(LinkWireguard::new(name).build())
                    .execute()
                    .await
                    .with_context(|| {
                        format!("creating the WireGuard device {name} (does this kernel have WireGuard?)")
                    })?;
                created = true;
                self.require_link(name).await?
            }
        };
        self.converge_noarp(&link, None, mtu).await?;
        Ok((link.index, created))
    }

    /// Sets device `index` down.
    pub(crate) async fn set_down(&self, index: u32) -> Result<()> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).down().build())
            .execute()
            .await
            .with_context(|| format!("setting device {index} down"))
    }

    pub(crate) async fn delete_link(&self, name: &str) -> Result<bool> {
        let Some(l) = self.link(name).await? else {
            return Ok(false);
        };
        self.handle
            .link()
            .del(l.index)
            .execute()
            .await
            .with_context(|| format!("deleting device {name}"))?;
        Ok(true)
    }

    pub(crate) async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut stream = self.handle.link().get().match_index(index).execute();
        match stream.try_next().await {
            Ok(m) => Ok(m.as_ref().map(parse_link)),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {index}")),
        }
    }
}

fn parse_link(msg: &LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        mac: [0; 6],
        up: msg.header.flags.contains(LinkFlags::Up),
        arp: !msg.header.flags.contains(LinkFlags::Noarp),
        kind: None,
        xdp: None,
        peer_netns: None,
        netkit_primary: false,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::LinkNetNsId(id) => link.peer_netns = Some(*id),
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::Address(a) if a.len() == 6 => link.mac.copy_from_slice(a),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => {
                            link.kind = Some(match k {
                                InfoKind::Other(s) => s.clone(),
                                k => k.to_string(),
                            });
                        }
                        LinkInfo::Data(InfoData::Netkit(nk)) => {
                            link.netkit_primary = nk.contains(&InfoNetkit::Primary(true));
                        }
                        _ => {}
                    }
                }
            }
            LinkAttribute::Xdp(xdp) => {
                let mut mode = None;
                let mut prog = None;
                for x in xdp {
                    match x {
                        LinkXdp::Attached(Attached::Driver) => mode = Some(XdpMode::Native),
                        LinkXdp::Attached(Attached::SocketBuffer) => mode = Some(XdpMode::Generic),
                        LinkXdp::ProgId(id) => prog = Some(*id),
                        _ => {}
                    }
                }
                if let Some(program) = prog.filter(|p| *p != 0) {
                    link.xdp = Some(XdpAttached { program, mode });
                }
            }
            _ => {}
        }
    }
    link
}
