//! Typed access to the dataplane's pinned maps.

use anyhow::{Context as _, Result};
use aya::maps::{Map, MapData, PerCpuArray};
use dataplane_common::{Counter, Reason, map_names};

use super::bpffs::PinDir;

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
