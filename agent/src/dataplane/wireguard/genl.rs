//! The kernel's WireGuard devices, configured over generic netlink (the
//! `wireguard` family: `WG_CMD_GET_DEVICE`, a dump, and
//! `WG_CMD_SET_DEVICE`), as `wg` does, without running it.
//!
//! Each call opens its own socket and waits for the kernel's answer: these
//! are rare, short requests (a peer's key changed, a lease came or went).

use std::{collections::BTreeMap, net::IpAddr, net::SocketAddr, time::SystemTime};

use anyhow::{Context as _, Result, anyhow, bail};
use ipnet::IpNet;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_packet_generic::{
    GenlMessage,
    ctrl::{GenlCtrl, GenlCtrlCmd, nlas::GenlCtrlAttrs},
};
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardDeviceFlags, WireguardMessage, WireguardPeer, WireguardPeerAttribute,
    WireguardPeerFlags,
};
use netlink_sys::{Socket, SocketAddr as NlAddr, protocols::NETLINK_GENERIC};

use crate::wgkey::WgKey;

/// Peers per `WG_CMD_SET_DEVICE` message: a message must fit the kernel's
/// netlink limits (each peer with two allowed IPs is under 200 bytes).
const PEERS_PER_MESSAGE: usize = 100;

/// A peer as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerState {
    pub key: WgKey,
    pub endpoint: Option<SocketAddr>,
    pub allowed: Vec<IpNet>,
    /// The last completed handshake (None: never).
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub keepalive: u16,
    /// The pre-shared key (None: none).
    pub psk: Option<WgKey>,
}

/// A device as the kernel reports it.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeviceState {
    pub public_key: Option<WgKey>,
    pub private_key: Option<[u8; 32]>,
    pub listen_port: u16,
    pub peers: Vec<PeerState>,
}

/// What a peer should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerConfig {
    pub key: WgKey,
    pub endpoint: SocketAddr,
    pub allowed: Vec<IpNet>,
    pub psk: Option<WgKey>,
    pub keepalive: u16,
}

/// A generic netlink socket bound to the wireguard family.
pub(crate) struct WgNetlink {
    socket: Socket,
    family: u16,
    seq: u32,
}

impl WgNetlink {
    /// Opens a socket and resolves the family (the `wireguard` module must
    /// be loaded: creating a device loads it).
    pub(crate) fn open() -> Result<Self> {
        let mut socket =
            Socket::new(NETLINK_GENERIC).context("opening a generic netlink socket")?;
        socket
            .bind_auto()
            .context("binding a generic netlink socket")?;
        socket
            .connect(&NlAddr::new(0, 0))
            .context("connecting a generic netlink socket")?;
        let mut nl = Self {
            socket,
            family: 0,
            seq: 0,
        };
        let answers = nl.request(
            GenlMessage::from_payload(GenlCtrl {
                cmd: GenlCtrlCmd::GetFamily,
                nlas: vec![GenlCtrlAttrs::FamilyName("wireguard".into())],
            }),
            NLM_F_REQUEST | NLM_F_ACK,
            |_| {},
        )?;
        nl.family = answers
            .iter()
            .flat_map(|m: &GenlMessage<GenlCtrl>| &m.payload.nlas)
            .find_map(|a| match a {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| {
                anyhow!("the kernel has no wireguard netlink family (no WireGuard module?)")
            })?;
        Ok(nl)
    }

    /// Sends `msg` and collects the answers up to the ACK (or the end of
    /// a dump).
    fn request<F>(
        &mut self,
        mut msg: GenlMessage<F>,
        flags: u16,
        set_family: impl FnOnce(&mut GenlMessage<F>),
    ) -> Result<Vec<GenlMessage<F>>>
    where
        F: netlink_packet_generic::GenlFamily + std::fmt::Debug,
        GenlMessage<F>: NetlinkSerializable + NetlinkDeserializable,
    {
        set_family(&mut msg);
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.socket.send(&buf, 0).context("sending to the kernel")?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self
                .socket
                .recv_from_full()
                .context("reading the kernel's answer")?;
            let mut offset = 0;
            while offset < data.len() {
                let m = NetlinkMessage::<GenlMessage<F>>::deserialize(&data[offset..])
                    .map_err(|e| anyhow!("the kernel's answer does not parse: {e}"))?;
                let len = m.header.length as usize;
                if len == 0 {
                    bail!("a netlink message of length 0");
                }
                offset += (len + 3) & !3;
                if m.header.sequence_number != self.seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::InnerMessage(inner) => {
                        out.push(inner);
                        if flags & NLM_F_DUMP == 0 && flags & NLM_F_ACK == 0 {
                            return Ok(out);
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(out),
                        Some(code) => {
                            return Err(std::io::Error::from_raw_os_error(-code.get()).into());
                        }
                    },
                    _ => {}
                }
            }
        }
    }

    fn wg(
        &mut self,
        cmd: WireguardCmd,
        attributes: Vec<WireguardAttribute>,
        flags: u16,
    ) -> Result<Vec<GenlMessage<WireguardMessage>>> {
        let family = self.family;
        self.request(
            GenlMessage::from_payload(WireguardMessage { cmd, attributes }),
            flags,
            |m| m.set_resolved_family_id(family),
        )
    }

    /// The device `name`, with its peers.
    pub(crate) fn device(&mut self, name: &str) -> Result<DeviceState> {
        let answers = self
            .wg(
                WireguardCmd::GetDevice,
                vec![WireguardAttribute::IfName(name.to_string())],
                NLM_F_REQUEST | NLM_F_DUMP,
            )
            .with_context(|| format!("reading WireGuard device {name}"))?;
        let mut dev = DeviceState::default();
        // A large device comes in several messages; a peer whose allowed
        // IPs do not fit one goes on in the next.
        let mut peers: BTreeMap<WgKey, PeerState> = BTreeMap::new();
        let mut order: Vec<WgKey> = Vec::new();
        for m in answers {
            for a in m.payload.attributes {
                match a {
                    WireguardAttribute::PublicKey(k) => dev.public_key = Some(WgKey(k)),
                    WireguardAttribute::PrivateKey(k) => dev.private_key = Some(k),
                    WireguardAttribute::ListenPort(p) => dev.listen_port = p,
                    WireguardAttribute::Peers(list) => {
                        for p in list {
                            let Some(state) = peer_state(&p) else {
                                continue;
                            };
                            match peers.get_mut(&state.key) {
                                Some(known) => known.allowed.extend(state.allowed),
                                None => {
                                    order.push(state.key);
                                    peers.insert(state.key, state);
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        dev.peers = order.into_iter().filter_map(|k| peers.remove(&k)).collect();
        Ok(dev)
    }

    /// Sets the device's private key and listening port (its peers stay).
    pub(crate) fn set_identity(&mut self, name: &str, private: &[u8; 32], port: u16) -> Result<()> {
        self.wg(
            WireguardCmd::SetDevice,
            vec![
                WireguardAttribute::IfName(name.to_string()),
                WireguardAttribute::PrivateKey(*private),
                WireguardAttribute::ListenPort(port),
            ],
            NLM_F_REQUEST | NLM_F_ACK,
        )
        .with_context(|| format!("setting the key and port of WireGuard device {name}"))?;
        Ok(())
    }

    /// Adds or updates `peers` (their allowed IPs replaced) and removes
    /// the peers keyed `remove`; other peers are untouched.
    pub(crate) fn set_peers(
        &mut self,
        name: &str,
        peers: &[PeerConfig],
        remove: &[WgKey],
    ) -> Result<()> {
        let mut all: Vec<WireguardPeer> = remove
            .iter()
            .map(|k| {
                WireguardPeer(vec![
                    WireguardPeerAttribute::PublicKey(k.0),
                    WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
                ])
            })
            .collect();
        all.extend(peers.iter().map(peer_message));
        for chunk in all.chunks(PEERS_PER_MESSAGE) {
            self.wg(
                WireguardCmd::SetDevice,
                vec![
                    WireguardAttribute::IfName(name.to_string()),
                    WireguardAttribute::Flags(WireguardDeviceFlags::empty()),
                    WireguardAttribute::Peers(chunk.to_vec()),
                ],
                NLM_F_REQUEST | NLM_F_ACK,
            )
            .with_context(|| format!("setting peers of WireGuard device {name}"))?;
        }
        Ok(())
    }
}

fn peer_message(p: &PeerConfig) -> WireguardPeer {
    let mut attrs = vec![
        WireguardPeerAttribute::PublicKey(p.key.0),
        WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
        WireguardPeerAttribute::Endpoint(p.endpoint),
        WireguardPeerAttribute::PersistentKeepalive(p.keepalive),
        WireguardPeerAttribute::PresharedKey(p.psk.map_or([0; 32], |k| k.0)),
    ];
    attrs.push(WireguardPeerAttribute::AllowedIps(
        p.allowed
            .iter()
            .map(|net| {
                WireguardAllowedIp(vec![
                    WireguardAllowedIpAttr::Family(match net {
                        IpNet::V4(_) => WireguardAddressFamily::Ipv4,
                        IpNet::V6(_) => WireguardAddressFamily::Ipv6,
                    }),
                    WireguardAllowedIpAttr::IpAddr(net.network()),
                    WireguardAllowedIpAttr::Cidr(net.prefix_len()),
                ])
            })
            .collect(),
    ));
    WireguardPeer(attrs)
}

fn peer_state(p: &WireguardPeer) -> Option<PeerState> {
    let mut key = None;
    let mut s = PeerState {
        key: WgKey([0; 32]),
        endpoint: None,
        allowed: Vec::new(),
        last_handshake: None,
        rx_bytes: 0,
        tx_bytes: 0,
        keepalive: 0,
        psk: None,
    };
    for a in &p.0 {
        match a {
            WireguardPeerAttribute::PublicKey(k) => key = Some(WgKey(*k)),
            WireguardPeerAttribute::Endpoint(e) => s.endpoint = Some(*e),
            WireguardPeerAttribute::LastHandshake(t) => {
                s.last_handshake = (t.seconds > 0).then(|| {
                    SystemTime::UNIX_EPOCH
                        + std::time::Duration::new(t.seconds as u64, t.nano_seconds as u32)
                });
            }
            WireguardPeerAttribute::RxBytes(b) => s.rx_bytes = *b,
            WireguardPeerAttribute::TxBytes(b) => s.tx_bytes = *b,
            WireguardPeerAttribute::PersistentKeepalive(k) => s.keepalive = *k,
            WireguardPeerAttribute::PresharedKey(k) => {
                s.psk = (*k != [0; 32]).then_some(WgKey(*k));
            }
            WireguardPeerAttribute::AllowedIps(list) => {
                for ip in list {
                    let mut addr: Option<IpAddr> = None;
                    let mut cidr = None;
                    for a in &ip.0 {
                        match a {
                            WireguardAllowedIpAttr::IpAddr(x) => addr = Some(*x),
                            WireguardAllowedIpAttr::Cidr(c) => cidr = Some(*c),
                            _ => {}
                        }
                    }
                    if let (Some(a), Some(c)) = (addr, cidr)
                        && let Ok(net) = IpNet::new(a, c)
                    {
                        s.allowed.push(net);
                    }
                }
            }
            _ => {}
        }
    }
    s.key = key?;
    Some(s)
}
