//! Typed access to the dataplane's pinned maps.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
};

use anyhow::{Context as _, Result};
use aya::maps::{
    Array, HashMap as BpfHashMap, IterableMap as _, LpmTrie, Map, MapData, PerCpuArray,
    lpm_trie::Key,
};
use dataplane_common::{
    Counter, DataplaneConfig, Endpoint, Reason, VTEP_F_DIRECT, Vtep, VtepInfo, map_names,
};

use super::bpffs::PinDir;
use ipnet::Ipv4Net;

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

/// Every entry of a peer map.
fn read_trie(trie: &LpmTrie<MapData, u32, Vtep>) -> Result<HashMap<Ipv4Net, Peer>> {
    let mut out = HashMap::new();
    for item in trie.iter() {
        let (k, v) = item?;
        let subnet = Ipv4Net::new(from_be(k.data()), k.prefix_len() as u8)
            .context("a peer map key with a bad prefix length")?
            .trunc();
        out.insert(
            subnet,
            Peer {
                subnet,
                vtep: from_be(v.addr_be),
                mac: MacAddr(v.mac),
            },
        );
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

/// The peer tables and the config entry.
pub struct PeerMaps {
    peers: LpmTrie<MapData, u32, Vtep>,
    vteps: BpfHashMap<MapData, u32, VtepInfo>,
    config: Array<MapData, DataplaneConfig>,
}

impl PeerMaps {
    pub fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            peers: LpmTrie::try_from(open_pinned(pins, map_names::PEERS)?)?,
            vteps: BpfHashMap::try_from(open_pinned(pins, map_names::VTEPS)?)?,
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

    /// The peers in the map.
    pub fn peers(&self) -> Result<HashMap<Ipv4Net, Peer>> {
        read_trie(&self.peers)
    }

    /// The peers in a peer map that is no longer pinned (replaced by a new
    /// layout); fails if its entries are not this version's.
    pub(crate) fn read_peers(old: MapData) -> Result<HashMap<Ipv4Net, Peer>> {
        let trie: LpmTrie<MapData, u32, Vtep> = LpmTrie::try_from(Map::from_map_data(old)?)?;
        read_trie(&trie)
    }

    /// The subnets of the peers reached without encapsulation.
    pub fn direct_subnets(&self) -> Result<HashSet<Ipv4Net>> {
        let mut out = HashSet::new();
        for item in self.peers.iter() {
            let (k, v) = item?;
            if v.flags & VTEP_F_DIRECT != 0 {
                out.insert(
                    Ipv4Net::new(from_be(k.data()), k.prefix_len() as u8)
                        .context("a peer map key with a bad prefix length")?
                        .trunc(),
                );
            }
        }
        Ok(out)
    }

    /// The peer of exactly `subnet`, if programmed.
    pub fn get(&self, subnet: &Ipv4Net) -> Result<Option<Peer>> {
        let key = Key::new(subnet.prefix_len() as u32, be(subnet.network()));
        match self.peers.get(&key, 0) {
            Ok(v) => Ok(Some(Peer {
                subnet: *subnet,
                vtep: from_be(v.addr_be),
                mac: MacAddr(v.mac),
            })),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// How many peers the map can hold.
    pub fn capacity(&self) -> Result<u32> {
        Ok(self.peers.map().info()?.max_entries())
    }

    pub fn vteps(&self) -> Result<HashMap<Ipv4Addr, u32>> {
        let mut out = HashMap::new();
        for item in self.vteps.iter() {
            let (k, v) = item?;
            out.insert(from_be(k), v.subnets);
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
        let key = Key::new(p.subnet.prefix_len() as u32, be(p.subnet.network()));
        let value = Vtep {
            addr_be: be(p.vtep),
            mac: p.mac.0,
            flags: if direct { VTEP_F_DIRECT } else { 0 },
            _pad: 0,
        };
        self.peers
            .insert(&key, value, 0)
            .with_context(|| format!("programming peer {}", p.subnet))?;
        if let Some(o) = old
            && o.vtep != p.vtep
        {
            self.vtep_ref(o.vtep, -1)?;
        }
        Ok(())
    }

    pub fn remove(&mut self, old: &Peer) -> Result<()> {
        let key = Key::new(old.subnet.prefix_len() as u32, be(old.subnet.network()));
        match self.peers.remove(&key) {
            Ok(()) => {}
            Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(e).with_context(|| format!("removing peer {}", old.subnet)),
        }
        self.vtep_ref(old.vtep, -1)
    }

    /// Recomputes the VTEP table from the peer table (after adopting pinned
    /// maps, in case an earlier run stopped between the two).
    pub fn rebuild_vteps(&mut self, peers: &HashMap<Ipv4Net, Peer>) -> Result<()> {
        let mut want: HashMap<Ipv4Addr, u32> = HashMap::new();
        for p in peers.values() {
            *want.entry(p.vtep).or_default() += 1;
        }
        for (vtep, _) in self.vteps()? {
            if !want.contains_key(&vtep) {
                let _ = self.vteps.remove(&be(vtep));
            }
        }
        for (vtep, n) in want {
            self.vteps.insert(be(vtep), VtepInfo { subnets: n }, 0)?;
        }
        Ok(())
    }

    fn vtep_ref(&mut self, vtep: Ipv4Addr, delta: i32) -> Result<()> {
        let k = be(vtep);
        let n = match self.vteps.get(&k, 0) {
            Ok(v) => v.subnets as i64,
            Err(aya::maps::MapError::KeyNotFound) => 0,
            Err(e) => return Err(e.into()),
        } + delta as i64;
        if n <= 0 {
            match self.vteps.remove(&k) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(e.into()),
            }
        } else {
            self.vteps
                .insert(k, VtepInfo { subnets: n as u32 }, 0)
                .with_context(|| format!("recording VTEP {vtep}"))
        }
    }
}

/// The endpoint map: local pods that host routing delivers to directly.
pub struct EndpointMap {
    map: BpfHashMap<MapData, u32, Endpoint>,
}

impl EndpointMap {
    pub fn open(pins: &PinDir) -> Result<Self> {
        Ok(Self {
            map: BpfHashMap::try_from(open_pinned(pins, map_names::ENDPOINTS)?)?,
        })
    }

    /// Every entry: pod address -> endpoint.
    pub fn all(&self) -> Result<HashMap<Ipv4Addr, Endpoint>> {
        let mut out = HashMap::new();
        for item in self.map.iter() {
            let (k, v) = item?;
            out.insert(from_be(k), v);
        }
        Ok(out)
    }

    pub(crate) fn set(&mut self, ip: Ipv4Addr, ep: &Endpoint) -> Result<()> {
        self.map
            .insert(be(ip), *ep, 0)
            .with_context(|| format!("programming endpoint {ip}"))
    }

    pub(crate) fn remove(&mut self, ip: Ipv4Addr) -> Result<()> {
        match self.map.remove(&be(ip)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing endpoint {ip}")),
        }
    }
}
