//! Typed access to the dataplane's pinned maps. Each kind of map exists
//! once per address family in the kernel (the programs key them by the
//! family's address); here each pair is one type, [`AddrMap`] or
//! [`PeerTries`], and the family is matched in that type alone.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result};
use aya::maps::{
    Array, HashMap as BpfHashMap, IterableMap as _, LpmTrie, Map, MapData, PerCpuArray,
    lpm_trie::Key,
};
use dataplane_common::{
    Counter, DataplaneConfig, Endpoint, PodIf, Reason, VTEP_F_DIRECT, Vtep, Vtep6, VtepInfo,
    map_names,
};

use aya::Pod;
use aya::maps::MapError;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::dataplane::types::Peer;
use crate::mac::MacAddr;
use crate::sys::bpffs::PinDir;

/// Opens a pinned map by name.
pub(crate) fn open_pinned(pins: &PinDir, name: &str) -> Result<Map> {
    let path = pins.map(name);
    let data = MapData::from_pin(&path).with_context(|| {
        format!(
            "opening the pinned map {} (is the agent running?)",
            path.display()
        )
    })?;
    Map::from_map_data(data).with_context(|| format!("reading the pinned map {}", path.display()))
}

fn be(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

fn from_be(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

/// A map lookup that found nothing is `None`, not an error.
fn found<T>(r: Result<T, MapError>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A removal of what is not there succeeds.
fn removed(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        r => r,
    }
}

/// A hash map keyed by address: one kernel map per family (IPv4 keys in
/// network order, IPv6 keys as 16 bytes), one value type.
pub(crate) struct AddrMap<V: Pod> {
    v4: BpfHashMap<MapData, u32, V>,
    v6: BpfHashMap<MapData, [u8; 16], V>,
}

impl<V: Pod> AddrMap<V> {
    fn open(pins: &PinDir, name4: &str, name6: &str) -> Result<Self> {
        Ok(Self {
            v4: BpfHashMap::try_from(open_pinned(pins, name4)?)?,
            v6: BpfHashMap::try_from(open_pinned(pins, name6)?)?,
        })
    }

    fn get(&self, ip: IpAddr) -> Result<Option<V>> {
        found(match ip {
            IpAddr::V4(a) => self.v4.get(&be(a), 0),
            IpAddr::V6(a) => self.v6.get(&a.octets(), 0),
        })
    }

    fn insert(&mut self, ip: IpAddr, v: V) -> Result<(), MapError> {
        match ip {
            IpAddr::V4(a) => self.v4.insert(be(a), v, 0),
            IpAddr::V6(a) => self.v6.insert(a.octets(), v, 0),
        }
    }

    fn remove(&mut self, ip: IpAddr) -> Result<(), MapError> {
        removed(match ip {
            IpAddr::V4(a) => self.v4.remove(&be(a)),
            IpAddr::V6(a) => self.v6.remove(&a.octets()),
        })
    }

    fn all(&self) -> Result<HashMap<IpAddr, V>> {
        let mut out = HashMap::new();
        for item in self.v4.iter() {
            let (k, v) = item?;
            out.insert(IpAddr::V4(from_be(k)), v);
        }
        for item in self.v6.iter() {
            let (k, v) = item?;
            out.insert(IpAddr::V6(Ipv6Addr::from(k)), v);
        }
        Ok(out)
    }
}

type Trie4 = LpmTrie<MapData, u32, Vtep>;
type Trie6 = LpmTrie<MapData, [u8; 16], Vtep6>;

/// One entry of an IPv4 peer trie: the peer and its flags.
fn entry4(k: &Key<u32>, v: &Vtep) -> Result<(Peer, u8)> {
    let subnet = Ipv4Net::new(from_be(k.data()), k.prefix_len() as u8)
        .context("a peer map key with a bad prefix length")?
        .trunc();
    Ok((
        Peer::v4(subnet, from_be(v.addr_be), MacAddr(v.mac)),
        v.flags,
    ))
}

/// One entry of an IPv6 peer trie: the peer and its flags.
fn entry6(k: &Key<[u8; 16]>, v: &Vtep6) -> Result<(Peer, u8)> {
    let subnet = Ipv6Net::new(Ipv6Addr::from(k.data()), k.prefix_len() as u8)
        .context("an IPv6 peer map key with a bad prefix length")?
        .trunc();
    Ok((
        Peer::v6(subnet, Ipv6Addr::from(v.addr), MacAddr(v.mac)),
        v.flags,
    ))
}

/// How one trie entry reads: the peer and its flags.
type Entry<K, V> = fn(&Key<K>, &V) -> Result<(Peer, u8)>;

fn collect<K: Pod, V: Pod>(
    trie: &LpmTrie<MapData, K, V>,
    entry: Entry<K, V>,
    out: &mut HashMap<IpNet, (Peer, u8)>,
) -> Result<()> {
    for item in trie.iter() {
        let (k, v) = item?;
        let (p, flags) = entry(&k, &v)?;
        out.insert(p.subnet, (p, flags));
    }
    Ok(())
}

/// The peer tries, subnet -> VTEP: one per family (longest-prefix match on
/// the inner destination).
pub(crate) struct PeerTries {
    v4: Trie4,
    v6: Trie6,
}

impl PeerTries {
    fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            v4: LpmTrie::try_from(open_pinned(pins, map_names::PEERS)?)?,
            v6: LpmTrie::try_from(open_pinned(pins, map_names::PEERS6)?)?,
        })
    }

    /// Every entry, both families: subnet -> (peer, flags).
    fn all(&self) -> Result<HashMap<IpNet, (Peer, u8)>> {
        let mut out = HashMap::new();
        collect(&self.v4, entry4, &mut out)?;
        collect(&self.v6, entry6, &mut out)?;
        Ok(out)
    }

    fn get(&self, subnet: &IpNet) -> Result<Option<Peer>> {
        Ok(match subnet {
            IpNet::V4(s) => {
                let k = Key::new(s.prefix_len() as u32, be(s.network()));
                found(self.v4.get(&k, 0))?
                    .map(|v| entry4(&k, &v))
                    .transpose()?
            }
            IpNet::V6(s) => {
                let k = Key::new(s.prefix_len() as u32, s.network().octets());
                found(self.v6.get(&k, 0))?
                    .map(|v| entry6(&k, &v))
                    .transpose()?
            }
        }
        .map(|(p, _)| p))
    }

    fn insert(&mut self, p: &Peer, flags: u8) -> Result<()> {
        match (p.subnet, p.vtep) {
            (IpNet::V4(s), IpAddr::V4(v)) => {
                let value = Vtep {
                    addr_be: be(v),
                    mac: p.mac.0,
                    flags,
                    _pad: 0,
                };
                self.v4
                    .insert(&Key::new(s.prefix_len() as u32, be(s.network())), value, 0)
            }
            (IpNet::V6(s), IpAddr::V6(v)) => {
                let value = Vtep6 {
                    addr: v.octets(),
                    mac: p.mac.0,
                    flags,
                    _pad: 0,
                };
                let k = Key::new(s.prefix_len() as u32, s.network().octets());
                self.v6.insert(&k, value, 0)
            }
            _ => anyhow::bail!("peer {}: a VTEP of another address family", p.subnet),
        }
        .with_context(|| format!("programming peer {}", p.subnet))
    }

    fn remove(&mut self, subnet: &IpNet) -> Result<()> {
        removed(match subnet {
            IpNet::V4(s) => self
                .v4
                .remove(&Key::new(s.prefix_len() as u32, be(s.network()))),
            IpNet::V6(s) => self
                .v6
                .remove(&Key::new(s.prefix_len() as u32, s.network().octets())),
        })
        .with_context(|| format!("removing peer {subnet}"))
    }
}

/// Whether a map update failed because the map is full.
pub(crate) fn is_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<aya::maps::MapError>().is_some_and(|m| {
            matches!(m, aya::maps::MapError::SyscallError(s)
                if matches!(s.io_error.raw_os_error(), Some(libc::E2BIG) | Some(libc::ENOSPC)))
        })
    })
}

/// The per-CPU counters, summed over CPUs.
pub struct Counters {
    map: PerCpuArray<MapData, Counter>,
}

impl Counters {
    pub fn open(pins: &PinDir) -> Result<Self> {
        let map = open_pinned(pins, map_names::COUNTERS)?;
        Ok(Self {
            map: PerCpuArray::try_from(map)?,
        })
    }

    /// One reason's counter, summed over all CPUs.
    pub fn get(&self, reason: Reason) -> Result<Counter> {
        let per_cpu = self.map.get(&(reason as u32), 0)?;
        Ok(per_cpu.iter().fold(Counter::default(), |acc, c| Counter {
            packets: acc.packets + c.packets,
            bytes: acc.bytes + c.bytes,
        }))
    }

    /// Every reason's counter.
    pub fn all(&self) -> Result<Vec<(Reason, Counter)>> {
        Reason::ALL
            .iter()
            .map(|r| Ok((*r, self.get(*r)?)))
            .collect()
    }
}

/// The peer tables (IPv4 and IPv6), the VTEP tables and the config entry.
pub struct PeerMaps {
    peers: PeerTries,
    /// VTEP address -> how many subnets it carries.
    vteps: AddrMap<VtepInfo>,
    config: Array<MapData, DataplaneConfig>,
}

impl PeerMaps {
    pub fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            peers: PeerTries::open(pins)?,
            vteps: AddrMap::open(pins, map_names::VTEPS, map_names::VTEPS6)?,
            config: Array::try_from(open_pinned(pins, map_names::CONFIG)?)?,
        })
    }

    pub fn config(&self) -> Result<DataplaneConfig> {
        Ok(self.config.get(&0, 0)?)
    }

    pub fn set_config(&mut self, c: &DataplaneConfig) -> Result<()> {
        self.config
            .set(0, c, 0)
            .context("writing the dataplane config")
    }

    /// The peers in the maps, both families.
    pub fn peers(&self) -> Result<HashMap<IpNet, Peer>> {
        Ok(self
            .peers
            .all()?
            .into_iter()
            .map(|(s, (p, _))| (s, p))
            .collect())
    }

    /// The peers in a peer map that is no longer pinned (replaced by a new
    /// layout); fails if its entries are not this version's.
    pub(crate) fn read_peers(name: &str, old: MapData) -> Result<HashMap<IpNet, Peer>> {
        let map = Map::from_map_data(old)?;
        let mut out = HashMap::new();
        if name == map_names::PEERS6 {
            collect(&Trie6::try_from(map)?, entry6, &mut out)?;
        } else {
            collect(&Trie4::try_from(map)?, entry4, &mut out)?;
        }
        Ok(out.into_iter().map(|(s, (p, _))| (s, p)).collect())
    }

    /// The subnets of the peers reached without encapsulation.
    pub fn direct_subnets(&self) -> Result<HashSet<IpNet>> {
        Ok(self
            .peers
            .all()?
            .into_iter()
            .filter(|(_, (_, flags))| flags & VTEP_F_DIRECT != 0)
            .map(|(s, _)| s)
            .collect())
    }

    /// The peer of exactly `subnet`, if programmed.
    pub fn get(&self, subnet: &IpNet) -> Result<Option<Peer>> {
        self.peers.get(subnet)
    }

    /// How many peers the IPv4 map can hold (the IPv6 map, as many).
    pub fn capacity(&self) -> Result<u32> {
        Ok(self.peers.v4.map().info()?.max_entries())
    }

    /// The VTEP tables: address -> how many subnets it carries.
    pub fn vteps(&self) -> Result<HashMap<IpAddr, u32>> {
        Ok(self
            .vteps
            .all()?
            .into_iter()
            .map(|(a, v)| (a, v.subnets))
            .collect())
    }

    /// Installs or replaces the peer of `p.subnet` (`direct`: reached
    /// without encapsulation), given what it was. The VTEP table learns the
    /// new VTEP before the subnet points at it, and forgets the old one only
    /// after: no packet sees a half-done change.
    pub fn upsert(&mut self, p: &Peer, old: Option<&Peer>, direct: bool) -> Result<()> {
        if old.map(|o| o.vtep) != Some(p.vtep) {
            self.vtep_ref(p.vtep, 1)?;
        }
        self.peers
            .insert(p, if direct { VTEP_F_DIRECT } else { 0 })?;
        if let Some(o) = old
            && o.vtep != p.vtep
        {
            self.vtep_ref(o.vtep, -1)?;
        }
        Ok(())
    }

    pub fn remove(&mut self, old: &Peer) -> Result<()> {
        self.peers.remove(&old.subnet)?;
        self.vtep_ref(old.vtep, -1)
    }

    /// Recomputes the VTEP tables from the peer tables (after adopting
    /// pinned maps, in case an earlier run stopped between the two).
    pub fn rebuild_vteps(&mut self, peers: &HashMap<IpNet, Peer>) -> Result<()> {
        let mut want: HashMap<IpAddr, u32> = HashMap::new();
        for p in peers.values() {
            *want.entry(p.vtep).or_default() += 1;
        }
        for vtep in self.vteps.all()?.into_keys() {
            if !want.contains_key(&vtep) {
                let _ = self.vteps.remove(vtep);
            }
        }
        for (vtep, n) in want {
            self.set_vtep(vtep, n)?;
        }
        Ok(())
    }

    fn set_vtep(&mut self, vtep: IpAddr, subnets: u32) -> Result<()> {
        self.vteps
            .insert(vtep, VtepInfo { subnets })
            .with_context(|| format!("recording VTEP {vtep}"))
    }

    fn vtep_ref(&mut self, vtep: IpAddr, delta: i32) -> Result<()> {
        let n = self.vteps.get(vtep)?.map_or(0, |v| v.subnets as i64) + delta as i64;
        if n <= 0 {
            Ok(self.vteps.remove(vtep)?)
        } else {
            self.set_vtep(vtep, n as u32)
        }
    }
}

/// The endpoint maps: local pods that host routing delivers to directly,
/// by address, and the addresses each pod's veth may send from.
pub struct EndpointMap {
    map: AddrMap<Endpoint>,
    pod_ifs: BpfHashMap<MapData, u32, PodIf>,
}

impl EndpointMap {
    pub fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            map: AddrMap::open(pins, map_names::ENDPOINTS, map_names::ENDPOINTS6)?,
            pod_ifs: BpfHashMap::try_from(open_pinned(pins, map_names::POD_IFS)?)?,
        })
    }

    /// Every pod veth (host side ifindex) -> the pod's addresses.
    pub fn pod_ifs(&self) -> Result<HashMap<u32, PodIf>> {
        let mut out = HashMap::new();
        for item in self.pod_ifs.iter() {
            let (k, v) = item?;
            out.insert(k, v);
        }
        Ok(out)
    }

    pub(crate) fn set_pod_if(&mut self, ifindex: u32, p: &PodIf) -> Result<()> {
        self.pod_ifs
            .insert(ifindex, *p, 0)
            .with_context(|| format!("programming the addresses of pod veth {ifindex}"))
    }

    pub(crate) fn remove_pod_if(&mut self, ifindex: u32) -> Result<()> {
        removed(self.pod_ifs.remove(&ifindex))
            .with_context(|| format!("removing pod veth {ifindex}"))
    }

    /// Every entry: pod address -> endpoint.
    pub fn all(&self) -> Result<HashMap<IpAddr, Endpoint>> {
        self.map.all()
    }

    pub(crate) fn set(&mut self, ip: IpAddr, ep: &Endpoint) -> Result<()> {
        self.map
            .insert(ip, *ep)
            .with_context(|| format!("programming endpoint {ip}"))
    }

    pub(crate) fn remove(&mut self, ip: IpAddr) -> Result<()> {
        self.map
            .remove(ip)
            .with_context(|| format!("removing endpoint {ip}"))
    }
}

/// Measured path MTUs by remote IPv4 VTEP (`WEFT_PATH_MTU`): the largest
/// outer packet each peer's path carries.
pub(crate) struct PathMtuMap(BpfHashMap<MapData, u32, u32>);

impl PathMtuMap {
    pub(crate) fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self(BpfHashMap::try_from(open_pinned(
            pins,
            map_names::PATH_MTU,
        )?)?))
    }

    /// Every entry: VTEP -> path MTU.
    pub(crate) fn all(&self) -> Result<HashMap<Ipv4Addr, u32>> {
        let mut out = HashMap::new();
        for item in self.0.iter() {
            let (k, v) = item?;
            out.insert(from_be(k), v);
        }
        Ok(out)
    }

    /// Sets (or, with None, removes) `vtep`'s path MTU.
    pub(crate) fn set(&mut self, vtep: Ipv4Addr, mtu: Option<u32>) -> Result<()> {
        match mtu {
            Some(m) => self.0.insert(be(vtep), m, 0),
            None => removed(self.0.remove(&be(vtep))),
        }
        .with_context(|| format!("setting the path MTU of {vtep}"))
    }
}
