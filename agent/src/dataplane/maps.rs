//! Typed access to the dataplane's pinned maps.

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

use super::bpffs::PinDir;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::Peer;
use crate::mac::MacAddr;

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

/// Every entry of an IPv4 peer map.
fn read_trie(trie: &LpmTrie<MapData, u32, Vtep>) -> Result<HashMap<IpNet, Peer>> {
    let mut out = HashMap::new();
    for item in trie.iter() {
        let (k, v) = item?;
        let subnet = Ipv4Net::new(from_be(k.data()), k.prefix_len() as u8)
            .context("a peer map key with a bad prefix length")?
            .trunc();
        let p = Peer::v4(subnet, from_be(v.addr_be), MacAddr(v.mac));
        out.insert(p.subnet, p);
    }
    Ok(out)
}

/// Every entry of the IPv6 peer map.
fn read_trie6(trie: &LpmTrie<MapData, [u8; 16], Vtep6>) -> Result<HashMap<IpNet, Peer>> {
    let mut out = HashMap::new();
    for item in trie.iter() {
        let (k, v) = item?;
        let subnet = Ipv6Net::new(Ipv6Addr::from(k.data()), k.prefix_len() as u8)
            .context("an IPv6 peer map key with a bad prefix length")?
            .trunc();
        let p = Peer::v6(subnet, Ipv6Addr::from(v.addr), MacAddr(v.mac));
        out.insert(p.subnet, p);
    }
    Ok(out)
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

/// The peer tables (IPv4 and IPv6) and the config entry.
pub struct PeerMaps {
    peers: LpmTrie<MapData, u32, Vtep>,
    vteps: BpfHashMap<MapData, u32, VtepInfo>,
    peers6: LpmTrie<MapData, [u8; 16], Vtep6>,
    vteps6: BpfHashMap<MapData, [u8; 16], VtepInfo>,
    config: Array<MapData, DataplaneConfig>,
}

impl PeerMaps {
    pub fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            peers: LpmTrie::try_from(open_pinned(pins, map_names::PEERS)?)?,
            vteps: BpfHashMap::try_from(open_pinned(pins, map_names::VTEPS)?)?,
            peers6: LpmTrie::try_from(open_pinned(pins, map_names::PEERS6)?)?,
            vteps6: BpfHashMap::try_from(open_pinned(pins, map_names::VTEPS6)?)?,
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
        let mut out = read_trie(&self.peers)?;
        out.extend(read_trie6(&self.peers6)?);
        Ok(out)
    }

    /// The peers in a peer map that is no longer pinned (replaced by a new
    /// layout); fails if its entries are not this version's.
    pub(crate) fn read_peers(name: &str, old: MapData) -> Result<HashMap<IpNet, Peer>> {
        let map = Map::from_map_data(old)?;
        if name == map_names::PEERS6 {
            read_trie6(&LpmTrie::try_from(map)?)
        } else {
            read_trie(&LpmTrie::try_from(map)?)
        }
    }

    /// The subnets of the peers reached without encapsulation.
    pub fn direct_subnets(&self) -> Result<HashSet<IpNet>> {
        let mut out = HashSet::new();
        for item in self.peers.iter() {
            let (k, v) = item?;
            if v.flags & VTEP_F_DIRECT != 0 {
                out.insert(IpNet::V4(
                    Ipv4Net::new(from_be(k.data()), k.prefix_len() as u8)
                        .context("a peer map key with a bad prefix length")?
                        .trunc(),
                ));
            }
        }
        Ok(out)
    }

    /// The peer of exactly `subnet`, if programmed.
    pub fn get(&self, subnet: &IpNet) -> Result<Option<Peer>> {
        let found = match subnet {
            IpNet::V4(s) => {
                let key = Key::new(s.prefix_len() as u32, be(s.network()));
                self.peers
                    .get(&key, 0)
                    .map(|v| Peer::v4(*s, from_be(v.addr_be), MacAddr(v.mac)))
            }
            IpNet::V6(s) => {
                let key = Key::new(s.prefix_len() as u32, s.network().octets());
                self.peers6
                    .get(&key, 0)
                    .map(|v| Peer::v6(*s, Ipv6Addr::from(v.addr), MacAddr(v.mac)))
            }
        };
        match found {
            Ok(p) => Ok(Some(p)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// How many peers the IPv4 map can hold (the IPv6 map, as many).
    pub fn capacity(&self) -> Result<u32> {
        Ok(self.peers.map().info()?.max_entries())
    }

    /// The VTEP tables: address -> how many subnets it carries.
    pub fn vteps(&self) -> Result<HashMap<IpAddr, u32>> {
        let mut out = HashMap::new();
        for item in self.vteps.iter() {
            let (k, v) = item?;
            out.insert(IpAddr::V4(from_be(k)), v.subnets);
        }
        for item in self.vteps6.iter() {
            let (k, v) = item?;
            out.insert(IpAddr::V6(Ipv6Addr::from(k)), v.subnets);
        }
        Ok(out)
    }

    /// Installs or replaces the peer of `p.subnet` (`direct`: reached
    /// without encapsulation), given what it was. The VTEP table learns the
    /// new VTEP before the subnet points at it, and forgets the old one only
    /// after: no packet sees a half-done change.
    pub fn upsert(&mut self, p: &Peer, old: Option<&Peer>, direct: bool) -> Result<()> {
        if old.map(|o| o.vtep) != Some(p.vtep) {
            self.vtep_ref(p.vtep, 1)?;
        }
        let r = match (p.subnet, p.vtep) {
            (IpNet::V4(s), IpAddr::V4(v)) => {
                let key = Key::new(s.prefix_len() as u32, be(s.network()));
                let value = Vtep {
                    addr_be: be(v),
                    mac: p.mac.0,
                    flags: if direct { VTEP_F_DIRECT } else { 0 },
                    _pad: 0,
                };
                self.peers.insert(&key, value, 0)
            }
            (IpNet::V6(s), IpAddr::V6(v)) => {
                let key = Key::new(s.prefix_len() as u32, s.network().octets());
                let value = Vtep6 {
                    addr: v.octets(),
                    mac: p.mac.0,
                    flags: 0,
                    _pad: 0,
                };
                self.peers6.insert(&key, value, 0)
            }
            _ => anyhow::bail!("peer {}: a VTEP of another address family", p.subnet),
        };
        r.with_context(|| format!("programming peer {}", p.subnet))?;
        if let Some(o) = old
            && o.vtep != p.vtep
        {
            self.vtep_ref(o.vtep, -1)?;
        }
        Ok(())
    }

    pub fn remove(&mut self, old: &Peer) -> Result<()> {
        let r = match old.subnet {
            IpNet::V4(s) => self
                .peers
                .remove(&Key::new(s.prefix_len() as u32, be(s.network()))),
            IpNet::V6(s) => self
                .peers6
                .remove(&Key::new(s.prefix_len() as u32, s.network().octets())),
        };
        match r {
            Ok(()) => {}
            Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(e).with_context(|| format!("removing peer {}", old.subnet)),
        }
        self.vtep_ref(old.vtep, -1)
    }

    /// Recomputes the VTEP tables from the peer tables (after adopting
    /// pinned maps, in case an earlier run stopped between the two).
    pub fn rebuild_vteps(&mut self, peers: &HashMap<IpNet, Peer>) -> Result<()> {
        let mut want: HashMap<IpAddr, u32> = HashMap::new();
        for p in peers.values() {
            *want.entry(p.vtep).or_default() += 1;
        }
        for (vtep, _) in self.vteps()? {
            if !want.contains_key(&vtep) {
                let _ = match vtep {
                    IpAddr::V4(v) => self.vteps.remove(&be(v)),
                    IpAddr::V6(v) => self.vteps6.remove(&v.octets()),
                };
            }
        }
        for (vtep, n) in want {
            self.set_vtep(vtep, n)?;
        }
        Ok(())
    }

    fn set_vtep(&mut self, vtep: IpAddr, subnets: u32) -> Result<()> {
        let v = VtepInfo { subnets };
        match vtep {
            IpAddr::V4(a) => self.vteps.insert(be(a), v, 0),
            IpAddr::V6(a) => self.vteps6.insert(a.octets(), v, 0),
        }
        .with_context(|| format!("recording VTEP {vtep}"))
    }

    fn vtep_ref(&mut self, vtep: IpAddr, delta: i32) -> Result<()> {
        let got = match vtep {
            IpAddr::V4(a) => self.vteps.get(&be(a), 0),
            IpAddr::V6(a) => self.vteps6.get(&a.octets(), 0),
        };
        let n = match got {
            Ok(v) => v.subnets as i64,
            Err(aya::maps::MapError::KeyNotFound) => 0,
            Err(e) => return Err(e.into()),
        } + delta as i64;
        if n <= 0 {
            let r = match vtep {
                IpAddr::V4(a) => self.vteps.remove(&be(a)),
                IpAddr::V6(a) => self.vteps6.remove(&a.octets()),
            };
            match r {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(e.into()),
            }
        } else {
            self.set_vtep(vtep, n as u32)
        }
    }
}

/// The endpoint maps: local pods that host routing delivers to directly,
/// by IPv4 and by IPv6 address, and the addresses each pod's veth may send
/// from.
pub struct EndpointMap {
    map: BpfHashMap<MapData, u32, Endpoint>,
    map6: BpfHashMap<MapData, [u8; 16], Endpoint>,
    pod_ifs: BpfHashMap<MapData, u32, PodIf>,
}

impl EndpointMap {
    pub fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            map: BpfHashMap::try_from(open_pinned(pins, map_names::ENDPOINTS)?)?,
            map6: BpfHashMap::try_from(open_pinned(pins, map_names::ENDPOINTS6)?)?,
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
        match self.pod_ifs.remove(&ifindex) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing pod veth {ifindex}")),
        }
    }

    /// Every entry: pod address -> endpoint.
    pub fn all(&self) -> Result<HashMap<IpAddr, Endpoint>> {
        let mut out = HashMap::new();
        for item in self.map.iter() {
            let (k, v) = item?;
            out.insert(IpAddr::V4(from_be(k)), v);
        }
        for item in self.map6.iter() {
            let (k, v) = item?;
            out.insert(IpAddr::V6(Ipv6Addr::from(k)), v);
        }
        Ok(out)
    }

    pub(crate) fn set(&mut self, ip: IpAddr, ep: &Endpoint) -> Result<()> {
        match ip {
            IpAddr::V4(a) => self.map.insert(be(a), *ep, 0),
            IpAddr::V6(a) => self.map6.insert(a.octets(), *ep, 0),
        }
        .with_context(|| format!("programming endpoint {ip}"))
    }

    pub(crate) fn remove(&mut self, ip: IpAddr) -> Result<()> {
        let r = match ip {
            IpAddr::V4(a) => self.map.remove(&be(a)),
            IpAddr::V6(a) => self.map6.remove(&a.octets()),
        };
        match r {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing endpoint {ip}")),
        }
    }
}
