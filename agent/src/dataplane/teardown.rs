//! `weft teardown`: everything Weft created on a node, removed, and the
//! host settings it changed, put back.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::dataplane::host;
use crate::dataplane::names::device_name;
use crate::dataplane::names::device6_name;
use crate::dataplane::names::receive_device_name;
use crate::dataplane::netfilter;
use crate::dataplane::programs::generations;
use crate::dataplane::programs::links;
use crate::dataplane::programs::loader::off_runtime;
use crate::sys::bpffs::PinDir;
use crate::sys::netlink::Netlink;

/// Removes everything Weft created on this node: the programs (links), the
/// pinned maps, the overlay device and with it its routes, and puts back
/// the host settings it changed. Safe to run twice; returns what it
/// removed.
pub(crate) async fn teardown(pins: &PinDir, vni: u32, state_dir: &Path) -> Result<Vec<String>> {
    let nl = Netlink::new()?;
    let mut removed = remove_links(pins)?;
    // Weft routes go with the device; remove any left on other devices.
    for r in nl.weft_routes().await? {
        nl.del_route(&r).await?;
        removed.push(format!("route {}/{}", r.dst, r.prefix_len));
    }
    for dev in [
        device_name(vni),
        device6_name(vni),
        receive_device_name(vni),
    ] {
        if nl.delete_link(&dev).await? {
            removed.push(format!("device {dev}"));
        }
    }
    removed.extend(remove_maps(pins)?);
    removed.extend(netfilter::remove()?);
    removed.extend(host::restore(state_dir)?);
    PinDir::unannounce(state_dir);
    Ok(removed)
}

/// Detaches every program whose link is pinned under `pins` (unpinning the
/// link detaches it); returns what was detached.
pub(crate) fn remove_links(pins: &PinDir) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for (hook, iface, _) in links::pinned_links(pins)? {
        let pins = pins.clone();
        let name = iface.clone();
        if off_runtime(move || links::detach(&pins, hook, &name))? {
            removed.push(format!("{} program on {iface}", hook.name()));
        }
    }
    let _ = std::fs::remove_dir(pins.links());
    Ok(removed)
}

/// Removes the pinned maps (every layout version's) and both generations
/// of pinned programs (the programs themselves go with their last
/// reference); returns the maps removed.
pub(crate) fn remove_maps(pins: &PinDir) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let mut dirs: Vec<std::path::PathBuf> = vec![pins.maps()];
    dirs.extend(pins.other_map_versions().into_iter().map(|(_, d)| d));
    for maps_dir in dirs {
        if !maps_dir.exists() {
            continue;
        }
        for e in std::fs::read_dir(&maps_dir)
            .with_context(|| format!("reading {}", maps_dir.display()))?
        {
            let e = e?;
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
            removed.push(format!("map {}", e.file_name().to_string_lossy()));
        }
        let _ = std::fs::remove_dir(&maps_dir);
    }
    generations::remove_all(pins)?;
    Ok(removed)
}
