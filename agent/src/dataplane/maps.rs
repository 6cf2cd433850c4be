//! Typed access to the dataplane's pinned maps.

use std::{collections::HashMap, net::Ipv4Addr};

use anyhow::{Context as _, Result};
use aya::maps::{Array, HashMap as BpfHashMap, LpmTrie, Map, MapData, PerCpuArray, lpm_trie::Key};
use dataplane_common::{Counter, DataplaneConfig, Reason, Vtep, VtepInfo, map_names};

use super::bpffs::PinDir;
use crate::{lease::subnet::Ipv4Net, mac::MacAddr, peers::Peer};

/// Opens a pinned map by name.
pub fn open_pinned(pins: &PinDir, name: &str) -> Result<Map> {
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
        let mut out = HashMap::new();
        for item in self.peers.iter() {
            let (k, v) = item?;
            let subnet = Ipv4Net::containing(from_be(k.data()), k.prefix_len() as u8);
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

    /// The peer of exactly `subnet`, if programmed.
    pub fn get(&self, subnet: &Ipv4Net) -> Result<Option<Peer>> {
        let key = Key::new(subnet.prefix_len() as u32, be(subnet.addr()));
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

    pub fn vteps(&self) -> Result<HashMap<Ipv4Addr, u32>> {
        let mut out = HashMap::new();
        for item in self.vteps.iter() {
            let (k, v) = item?;
            out.insert(from_be(k), v.subnets);
        }
        Ok(out)
    }

    /// Installs or replaces the peer of `p.subnet`, given what it was. The
    /// VTEP table learns the new VTEP before the subnet points at it, and
    /// forgets the old one only after: no packet sees a half-done change.
    pub fn upsert(&mut self, p: &Peer, old: Option<&Peer>) -> Result<()> {
        if old == Some(p) {
            return Ok(());
        }
        if old.map(|o| o.vtep) != Some(p.vtep) {
            self.vtep_ref(p.vtep, 1)?;
        }
        let key = Key::new(p.subnet.prefix_len() as u32, be(p.subnet.addr()));
        let value = Vtep {
            addr_be: be(p.vtep),
            mac: p.mac.0,
            _pad: [0; 2],
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
        let key = Key::new(old.subnet.prefix_len() as u32, be(old.subnet.addr()));
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
