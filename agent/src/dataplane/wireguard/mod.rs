//! flannel's `wireguard` backend: the kernel's WireGuard devices, set up as
//! flannel sets them up, so Weft nodes and flannel nodes of the backend
//! share one encrypted network.
//!
//! - Devices: `flannel-wg` (IPv4 underlay, `ListenPort`) and, in `Mode`
//!   `separate` with IPv6, `flannel-wg-v6` (`ListenPortV6`); in the other
//!   modes `flannel-wg` carries both families. MTU: the underlay's less 80.
//!   Each holds its family's subnet's network address (/32, /128), and the
//!   whole cluster network is routed to it.
//! - Peers: one per node's public key on each device, its allowed IPs the
//!   node's subnets there, its endpoint the node's public address at the
//!   local listening port.
//! - Unlike flannel, which deletes and recreates its devices when it
//!   starts, an existing device is adopted as it is (its peers included),
//!   so a restart drops no packet; peers whose leases went while the agent
//!   was away go at the first complete sync.

mod backend;
mod fastpath;
mod genl;
pub mod key_file;
mod stats;

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use anyhow::{Context as _, Result};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

pub use self::key_file::{DEFAULT_KEY_FILE, PrivateKey};
use self::stats::stats;
pub(crate) use self::stats::{HANDSHAKE_RECENT_SECS, WgPeerStats, age};
use self::{
    fastpath::{FastDevice, FastPath},
    genl::{PeerConfig, WgNetlink},
};
use crate::dataplane::Healed;
use crate::dataplane::HostRouting;
use crate::dataplane::Peer;
use crate::dataplane::PeerUpdate;
use crate::dataplane::PinDir;
use crate::dataplane::host;
use crate::dataplane::netfilter;
use crate::dataplane::netfilter::NetfilterSpec;
use crate::sys::netlink::Netlink;
use crate::sys::netlink::Route;
use crate::{
    lease::{Subnets, WIREGUARD_OVERHEAD, WgMode, WireguardConfig},
    wgkey::WgKey,
};

/// flannel's device names.
pub const DEVICE: &str = "flannel-wg";
pub const DEVICE6: &str = "flannel-wg-v6";

/// What the wireguard dataplane is built from.
#[derive(Clone, Debug)]
pub struct WgSpec {
    pub config: WireguardConfig,
    pub key: PrivateKey,
    /// The underlay's MTU (`Backend.MTU`, else the uplink's).
    pub underlay_mtu: u32,
    pub uplink: String,
    pub state_dir: std::path::PathBuf,
    pub network: Option<Ipv4Net>,
    pub network6: Option<Ipv6Net>,
    /// Masquerade pods' traffic leaving the cluster network (`Some(true)`:
    /// fully random ports).
    pub masquerade: Option<bool>,
    pub forward_rules: bool,
    /// Host routing into and out of the devices (`legacy`: none, no
    /// programs), and where its programs and maps are pinned.
    pub host_routing: HostRouting,
    pub pins: PinDir,
    pub max_peers: u32,
    /// What the kernel lets the programs do (its probes at start).
    pub kernel: crate::dataplane::programs::kernel::ProgramKernel,
}

/// One device and the families it carries.
#[derive(Clone, Debug)]
struct Device {
    name: &'static str,
    port: u16,
    v4: bool,
    v6: bool,
    index: u32,
}

/// A device as `weft status` shows it.
#[derive(Clone, Debug)]
pub(crate) struct DeviceView {
    pub name: &'static str,
    pub port: u16,
    pub public_key: Option<WgKey>,
    pub peers: Vec<WgPeerStats>,
}

/// The wireguard backend's devices in this network namespace, as the
/// kernel reports them (none: not the wireguard backend here).
pub(crate) fn devices_here() -> Result<Vec<DeviceView>> {
    let mut out = Vec::new();
    let mut wg: Option<WgNetlink> = None;
    for name in [DEVICE, DEVICE6] {
        if !std::path::Path::new("/sys/class/net").join(name).exists() {
            continue;
        }
        let nl = match &mut wg {
            Some(w) => w,
            None => wg.insert(WgNetlink::open()?),
        };
        let d = nl.device(name)?;
        out.push(DeviceView {
            name,
            port: d.listen_port,
            public_key: d.public_key,
            peers: d.peers.into_iter().map(|p| stats(name, p)).collect(),
        });
    }
    Ok(out)
}

/// A device's peer as the config that would write it (None: it has no
/// endpoint, so no config matches it).
fn as_config(p: &genl::PeerState) -> Option<PeerConfig> {
    let mut allowed = p.allowed.clone();
    allowed.sort();
    Some(PeerConfig {
        key: p.key,
        endpoint: p.endpoint?,
        allowed,
        psk: p.psk,
        keepalive: p.keepalive,
    })
}

pub(crate) struct WgOverlay {
    spec: WgSpec,
    devices: Vec<Device>,
    subnets: Subnets,
    peers: HashMap<IpNet, Peer>,
    /// A device's peers could not be set: set them all again at the next
    /// check.
    dirty: bool,
    /// The peer set has been complete once: peers not in it may go.
    synced: bool,
    /// Host routing's programs (None: `--host-routing legacy`).
    fast: Option<FastPath>,
    /// What each device's peers are, as last read or written: a peer is
    /// written only when it differs (writing one replaces its allowed IPs,
    /// and for that moment the device has no peer for its subnets: a
    /// packet to or from them is dropped; an agent that restarts hands
    /// every lease to the device again).
    written: HashMap<(&'static str, WgKey), PeerConfig>,
}

impl WgOverlay {
    /// The devices the config asks for.
    fn plan(spec: &WgSpec) -> Vec<Device> {
        let (v4, v6) = (spec.network.is_some(), spec.network6.is_some());
        let c = &spec.config;
        match c.mode {
            WgMode::Separate => [
                v4.then_some(Device {
                    name: DEVICE,
                    port: c.listen_port,
                    v4: true,
                    v6: false,
                    index: 0,
                }),
                v6.then_some(Device {
                    name: DEVICE6,
                    port: c.listen_port_v6,
                    v4: false,
                    v6: true,
                    index: 0,
                }),
            ]
            .into_iter()
            .flatten()
            .collect(),
            _ => vec![Device {
                name: DEVICE,
                port: c.listen_port,
                v4,
                v6,
                index: 0,
            }],
        }
    }

    /// The overlay MTU: the underlay's less WireGuard's 80.
    pub(crate) fn mtu(&self) -> u32 {
        self.spec.underlay_mtu - WIREGUARD_OVERHEAD
    }

    pub(crate) async fn setup(spec: WgSpec, subnets: Subnets) -> Result<Self> {
        host::apply(&spec.uplink, &spec.state_dir, spec.network6.is_some())?;
        let mut o = Self {
            devices: Self::plan(&spec),
            spec,
            subnets,
            peers: HashMap::new(),
            dirty: false,
            synced: false,
            fast: None,
            written: HashMap::new(),
        };
        let nl = Netlink::new()?;
        for i in 0..o.devices.len() {
            o.ensure_device(&nl, i).await?;
        }
        if o.spec.host_routing != HostRouting::Legacy {
            o.fast = Some(FastPath::setup(
                &o.spec.pins,
                &o.spec.state_dir,
                o.spec.host_routing,
                o.spec.max_peers,
                o.spec.kernel,
                &o.subnets,
                &o.fast_devices(),
            )?);
        }
        netfilter::apply(&o.netfilter())?;
        Ok(o)
    }

    /// The devices as host routing's programs use them.
    fn fast_devices(&self) -> Vec<FastDevice> {
        self.devices
            .iter()
            .map(|d| FastDevice {
                name: d.name,
                index: d.index,
                mtu: self.mtu(),
                v4: d.v4,
                v6: d.v6,
            })
            .collect()
    }

    /// Names of the node's own devices (never a pod's).
    fn not_pods(&self) -> Vec<String> {
        let mut v: Vec<String> = [DEVICE, DEVICE6].iter().map(|s| s.to_string()).collect();
        v.push(self.spec.uplink.clone());
        v
    }

    /// Makes the local pods host routing reaches match the registered
    /// endpoints `want` (nothing under `legacy`).
    pub(crate) async fn sync_endpoints(
        &mut self,
        want: &[super::EndpointSpec],
    ) -> Result<super::EndpointSync> {
        let not_pods = self.not_pods();
        match &mut self.fast {
            Some(f) => f.sync_endpoints(want, self.subnets, &not_pods).await,
            None => Ok(super::EndpointSync::default()),
        }
    }

    /// The programs' counters (host routing on).
    pub(crate) fn counters(&self) -> Option<std::sync::Arc<super::Counters>> {
        self.fast.as_ref().map(FastPath::counters)
    }

    pub(crate) fn liberal(&self) -> Option<std::sync::Arc<super::LiberalStats>> {
        self.fast.as_ref().map(FastPath::liberal)
    }

    pub(crate) fn attachments(&self) -> &[super::Attachment] {
        self.fast.as_ref().map_or(&[], FastPath::attachments)
    }

    fn netfilter(&self) -> NetfilterSpec {
        NetfilterSpec {
            network: self.spec.network,
            subnet: self.subnets.v4,
            network6: self.spec.network6,
            subnet6: self.subnets.v6,
            // The gate asks conntrack: make sure it tracks here.
            track: self.fast.as_ref().is_some_and(FastPath::gated),
            masquerade: self.spec.masquerade,
            forward_rules: self.spec.forward_rules,
            clamp_mss: false,
        }
    }

    /// Creates or adopts device `i`: its key and port, MTU, address and
    /// route. Returns whether it was created now.
    async fn ensure_device(&mut self, nl: &Netlink, i: usize) -> Result<bool> {
        let mtu = self.mtu();
        let d = &mut self.devices[i];
        let (index, created) = nl.ensure_wireguard_device(d.name, mtu).await?;
        d.index = index;
        let mut wg = WgNetlink::open()?;
        let state = wg.device(d.name)?;
        let name = d.name;
        self.written.retain(|(dev, _), _| *dev != name);
        self.written.extend(
            state
                .peers
                .iter()
                .filter_map(|p| Some(((name, p.key), as_config(p)?))),
        );
        let d = &mut self.devices[i];
        if state.private_key != Some(*self.spec.key.bytes()) || state.listen_port != d.port {
            wg.set_identity(d.name, self.spec.key.bytes(), d.port)?;
            if !created {
                tracing::info!(
                    device = d.name,
                    port = d.port,
                    "set the WireGuard device's key and port"
                );
            }
        } else {
            tracing::info!(
                device = d.name,
                peers = state.peers.len(),
                "adopted the WireGuard device as it is"
            );
        }
        if created {
            tracing::info!(device = d.name, port = d.port, mtu, public_key = %self.spec.key.public(), "created the WireGuard device");
        }
        let d = self.devices[i].clone();
        self.address_and_routes(nl, &d).await?;
        Ok(created)
    }

    /// The device's addresses (each family's subnet's network address) and
    /// its routes (the cluster networks).
    async fn address_and_routes(&self, nl: &Netlink, d: &Device) -> Result<()> {
        if d.v4
            && let Some(s) = self.subnets.v4
        {
            nl.ensure_only_address(d.index, s.network(), 32).await?;
        }
        if d.v6
            && let Some(s) = self.subnets.v6
        {
            nl.ensure_only_address(d.index, s.network(), 128).await?;
        }
        let routes = self.routes(d);
        for (r, route) in nl
            .install_routes(&routes, None, None)
            .await?
            .into_iter()
            .zip(&routes)
        {
            r.with_context(|| format!("routing {}/{} to {}", route.dst, route.prefix_len, d.name))?;
        }
        Ok(())
    }

    fn routes(&self, d: &Device) -> Vec<Route> {
        let mut nets: Vec<IpNet> = Vec::new();
        if d.v4
            && let Some(n) = self.spec.network
        {
            nets.push(n.into());
        }
        if d.v6
            && let Some(n) = self.spec.network6
        {
            nets.push(n.into());
        }
        nets.into_iter()
            .map(|n| Route {
                dst: n.network(),
                prefix_len: n.prefix_len(),
                gateway: None,
                oif: d.index,
                onlink: false,
                mtu: None,
            })
            .collect()
    }

    /// Writes the programs' config again (the drop trace was switched).
    pub(crate) fn write_config(&mut self) -> Result<()> {
        let (devices, subnets) = (self.fast_devices(), self.subnets);
        match &mut self.fast {
            Some(f) => f.write_config(&subnets, &devices),
            None => Ok(()),
        }
    }

    /// Our subnets moved: the devices' addresses follow.
    pub(crate) async fn set_subnet(&mut self, subnets: Subnets) -> Result<()> {
        self.subnets = subnets;
        let nl = Netlink::new()?;
        for d in self.devices.clone() {
            self.address_and_routes(&nl, &d).await?;
        }
        let devices = self.fast_devices();
        if let Some(f) = &mut self.fast {
            f.write_config(&subnets, &devices)?;
        }
        netfilter::apply(&self.netfilter())
    }

    pub(crate) fn peers(&self) -> &HashMap<IpNet, Peer> {
        &self.peers
    }

    /// What device `d` should hold for the public keys in `keys`.
    fn wanted(&self, d: &Device, keys: &BTreeSet<WgKey>) -> HashMap<WgKey, PeerConfig> {
        let mut by_key: HashMap<WgKey, Vec<&Peer>> = HashMap::new();
        for p in self.peers.values() {
            let carried = match p.subnet {
                IpNet::V4(_) => d.v4,
                IpNet::V6(_) => d.v6,
            };
            if let Some(k) = p.key
                && carried
                && keys.contains(&k)
            {
                by_key.entry(k).or_default().push(p);
            }
        }
        by_key
            .into_iter()
            .filter_map(|(key, ps)| {
                let endpoint = self.endpoint(&ps)?;
                let mut allowed: Vec<IpNet> = ps.iter().map(|p| p.subnet).collect();
                allowed.sort();
                Some((
                    key,
                    PeerConfig {
                        key,
                        endpoint: SocketAddr::new(endpoint, d.port),
                        allowed,
                        psk: self.spec.config.psk,
                        keepalive: self.spec.config.keepalive,
                    },
                ))
            })
            .collect()
    }

    /// Where a node (its peers on one device) is reached: in `separate`
    /// mode its address of the device's family; on one device for both
    /// families, the one `Mode` picks (`auto`: IPv4 where it has one).
    fn endpoint(&self, ps: &[&Peer]) -> Option<IpAddr> {
        endpoint(ps, self.spec.config.mode)
    }

    /// Applies peer changes: only the keys they touch are written, so
    /// other peers' sessions are never disturbed.
    ///
    /// Host routing's maps follow the devices: a removed peer leaves them
    /// before it leaves the devices, a new one enters them after.
    pub(crate) async fn apply_batch(&mut self, updates: &[PeerUpdate]) -> Result<()> {
        let mut keys = BTreeSet::new();
        let removed: Vec<IpNet> = updates
            .iter()
            .filter_map(|u| match u {
                PeerUpdate::Remove(s) => Some(*s),
                PeerUpdate::Upsert(p)
                    if self.peers.get(&p.subnet).is_some_and(|o| o.key != p.key) =>
                {
                    Some(p.subnet)
                }
                PeerUpdate::Upsert(_) => None,
            })
            .collect();
        if let Some(f) = &mut self.fast {
            f.remove(&removed)?;
        }
        for u in updates {
            match u {
                PeerUpdate::Upsert(p) => {
                    if let Some(old) = self.peers.insert(p.subnet, *p)
                        && let Some(k) = old.key
                    {
                        keys.insert(k);
                    }
                    if let Some(k) = p.key {
                        keys.insert(k);
                    }
                }
                PeerUpdate::Remove(s) => {
                    if let Some(old) = self.peers.remove(s)
                        && let Some(k) = old.key
                    {
                        keys.insert(k);
                    }
                }
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        let r = self.write_keys(&keys);
        if r.is_err() {
            self.dirty = true;
        }
        r?;
        let added: Vec<Peer> = updates
            .iter()
            .filter_map(|u| match u {
                PeerUpdate::Upsert(p) => self.peers.get(&p.subnet).copied(),
                PeerUpdate::Remove(_) => None,
            })
            .collect();
        if let Some(f) = &mut self.fast {
            f.upsert(&added)?;
        }
        Ok(())
    }

    /// Writes the peers of `keys` on every device: set where wanted,
    /// removed where not.
    fn write_keys(&mut self, keys: &BTreeSet<WgKey>) -> Result<()> {
        let mut wg = WgNetlink::open()?;
        for d in self.devices.clone() {
            let wanted = self.wanted(&d, keys);
            let remove: Vec<WgKey> = keys
                .iter()
                .filter(|k| !wanted.contains_key(k) && self.written.contains_key(&(d.name, **k)))
                .copied()
                .collect();
            let set: Vec<PeerConfig> = wanted
                .into_values()
                .filter(|w| self.written.get(&(d.name, w.key)) != Some(w))
                .collect();
            if set.is_empty() && remove.is_empty() {
                continue;
            }
            for p in &set {
                tracing::info!(device = d.name, key = %p.key, endpoint = %p.endpoint, allowed = ?p.allowed, "WireGuard peer");
            }
            for k in &remove {
                tracing::info!(device = d.name, key = %k, "WireGuard peer removed");
            }
            wg.set_peers(d.name, &set, &remove)?;
            for k in &remove {
                self.written.remove(&(d.name, *k));
            }
            for p in set {
                self.written.insert((d.name, p.key), p);
            }
        }
        Ok(())
    }

    /// Makes every device hold exactly the peers wanted (those of the
    /// peer table, nothing else). Returns how many peers it removed.
    fn reconcile(&mut self) -> Result<usize> {
        let all: BTreeSet<WgKey> = self.peers.values().filter_map(|p| p.key).collect();
        let mut wg = WgNetlink::open()?;
        let mut removed = 0;
        for d in &self.devices {
            let wanted = self.wanted(d, &all);
            let state = wg.device(d.name)?;
            let remove: Vec<WgKey> = state
                .peers
                .iter()
                .filter(|p| !wanted.contains_key(&p.key))
                .map(|p| p.key)
                .collect();
            let have: HashMap<WgKey, &genl::PeerState> =
                state.peers.iter().map(|p| (p.key, p)).collect();
            let set: Vec<PeerConfig> = wanted
                .values()
                .filter(|w| have.get(&w.key).and_then(|h| as_config(h)).as_ref() != Some(*w))
                .cloned()
                .collect();
            if !set.is_empty() || !remove.is_empty() {
                wg.set_peers(d.name, &set, &remove)?;
            }
            let name = d.name;
            self.written.retain(|(dev, _), _| *dev != name);
            self.written
                .extend(wanted.into_iter().map(|(k, w)| ((name, k), w)));
            removed += remove.len();
        }
        self.dirty = false;
        Ok(removed)
    }

    /// The peer set is complete (`peers`): device peers of no lease go.
    pub(crate) async fn retain(&mut self, peers: &HashSet<IpNet>) -> Result<usize> {
        self.peers.retain(|s, _| peers.contains(s));
        self.synced = true;
        let removed = self.reconcile()?;
        if let Some(f) = &mut self.fast {
            f.retain(&self.peers)?;
        }
        Ok(removed)
    }

    /// Puts back what something else removed: a device (with its peers),
    /// an address or route, peers that could not be written.
    pub(crate) async fn heal(&mut self) -> Result<Healed> {
        let mut h = Healed::default();
        let nl = Netlink::new()?;
        let routes = nl.weft_routes().await?;
        for i in 0..self.devices.len() {
            let d = self.devices[i].clone();
            let link = nl.link(d.name).await?;
            let gone = link
                .as_ref()
                .is_none_or(|l| l.kind.as_deref() != Some("wireguard"));
            if gone || link.as_ref().is_some_and(|l| l.index != d.index || !l.up) {
                self.ensure_device(&nl, i).await?;
                h.repairs.push("device");
                self.dirty = true;
                continue;
            }
            let missing = self.routes(&d).into_iter().any(|r| {
                !routes
                    .iter()
                    .any(|x| x.dst == r.dst && x.prefix_len == r.prefix_len && x.oif == r.oif)
            });
            if missing {
                self.address_and_routes(&nl, &d).await?;
                h.repairs.push("routes");
            }
        }
        if self.dirty && self.synced {
            self.reconcile()?;
            if let Some(f) = &mut self.fast {
                f.retain(&self.peers)?;
            }
            h.repairs.push("peers");
        }
        // The programs' config names the devices (a recreated one has a
        // new index); their links go with a device.
        let (devices, subnets) = (self.fast_devices(), self.subnets);
        if let Some(f) = &mut self.fast {
            f.write_config(&subnets, &devices)?;
            if f.heal(&devices)? {
                h.repairs.push("programs");
            }
        }
        h.repairs.extend(netfilter::heal(&self.netfilter())?);
        Ok(h)
    }

    /// Every device's peers as the kernel reports them.
    pub(crate) fn stats(&self) -> Result<Vec<WgPeerStats>> {
        let mut wg = WgNetlink::open()?;
        let mut out = Vec::new();
        for d in &self.devices {
            out.extend(
                wg.device(d.name)?
                    .peers
                    .into_iter()
                    .map(|p| stats(d.name, p)),
            );
        }
        Ok(out)
    }

    /// The public key of this node.
    pub(crate) fn public_key(&self) -> WgKey {
        self.spec.key.public()
    }

    /// The devices and their ports, for status.
    pub(crate) fn devices(&self) -> Vec<(&'static str, u16)> {
        self.devices.iter().map(|d| (d.name, d.port)).collect()
    }
}

/// Where a node with the peers `ps` (one public key) is reached under
/// `mode`. A node whose address changed has two leases until the old one
/// expires: the newest lease's address wins, whatever order the peers
/// come in, so every node sends to where the node is now.
fn endpoint(ps: &[&Peer], mode: WgMode) -> Option<IpAddr> {
    let newest = |v6: bool| {
        ps.iter()
            .filter(|p| p.vtep.is_ipv6() == v6)
            .max_by_key(|p| (p.since, p.vtep))
            .map(|p| p.vtep)
    };
    match mode {
        WgMode::Ipv6 => newest(true).or(newest(false)),
        _ => newest(false).or(newest(true)),
    }
}

#[cfg(test)]
mod tests;
