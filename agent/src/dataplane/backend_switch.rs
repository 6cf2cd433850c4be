//! A node that changes backend (the network config's `Backend.Type`, then
//! the agents restarted, as the README says) keeps nothing of the backend
//! it ran: a VXLAN run leaves its overlay devices (`weft.<VNI>` with its
//! per-peer routes, which would win over WireGuard's; `weft-rx.<VNI>`
//! listening on the VXLAN port on every address), the uplink's programs
//! and the pods' programs with a config the other backend does not
//! write; a WireGuard run leaves `flannel-wg` and `flannel-wg-v6` with
//! their peers. Each backend, as it starts, removes what the other left,
//! as flannel recreates its devices at start and Cilium removes the other
//! tunnel mode's devices and programs: a switch never leaves a path that
//! is not the configured one (plaintext VXLAN under WireGuard, or VXLAN
//! decapsulated from anyone).

use anyhow::Result;
use dataplane_common::CONFIG_F_WIREGUARD;

use crate::dataplane::maps::PeerMaps;
use crate::dataplane::teardown::remove_links;
use crate::dataplane::teardown::remove_maps;
use crate::dataplane::wireguard;
use crate::sys::bpffs::PinDir;
use crate::sys::netlink::Netlink;

/// The backend a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Vxlan,
    Wireguard,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Vxlan => "vxlan",
            Backend::Wireguard => "wireguard",
        }
    }

    fn other(self) -> Self {
        match self {
            Backend::Vxlan => Backend::Wireguard,
            Backend::Wireguard => Backend::Vxlan,
        }
    }
}

/// The backend the programs pinned under `pins` were set up for, if any
/// are pinned (their config map says).
fn pinned(pins: &PinDir) -> Option<Backend> {
    let cfg = PeerMaps::open(pins).and_then(|m| m.config()).ok()?;
    Some(if cfg.flags & CONFIG_F_WIREGUARD != 0 {
        Backend::Wireguard
    } else {
        Backend::Vxlan
    })
}

/// Whether `name` is a device of Weft's VXLAN backend: `weft.<VNI>`,
/// `weft-v6.<VNI>`, `weft-rx.<VNI>` (any VNI: the config that made them
/// may have had another).
fn is_vxlan_device(name: &str) -> bool {
    ["weft.", "weft-v6.", "weft-rx."].iter().any(|p| {
        name.strip_prefix(p)
            .is_some_and(|vni| !vni.is_empty() && vni.parse::<u32>().is_ok())
    })
}

/// Removes what the other backend left on this node, before `this` is set
/// up; returns what was removed (nothing on a node that ran `this`).
pub(crate) async fn remove_other(this: Backend, pins: &PinDir) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    // Its programs: every link detached and the maps removed, so that
    // `this` starts from nothing (it adopts only pins of its own).
    if pinned(pins) == Some(this.other()) {
        removed.extend(remove_links(pins)?);
        removed.extend(remove_maps(pins)?);
    }
    let nl = Netlink::new()?;
    let devices: Vec<String> = match this {
        Backend::Vxlan => [wireguard::DEVICE, wireguard::DEVICE6]
            .iter()
            .map(|d| d.to_string())
            .collect(),
        Backend::Wireguard => nl
            .links()
            .await?
            .into_iter()
            .map(|l| l.name)
            .filter(|n| is_vxlan_device(n))
            .collect(),
    };
    for dev in devices {
        // Its routes go with it.
        if nl.delete_link(&dev).await? {
            removed.push(format!("device {dev}"));
        }
    }
    for r in &removed {
        tracing::warn!(
            backend = this.name(),
            left_by = this.other().name(),
            "the node ran the {} backend before: removed {r}",
            this.other().name()
        );
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vxlan_devices_are_told_by_name() {
        for n in ["weft.1", "weft-v6.1", "weft-rx.4096"] {
            assert!(is_vxlan_device(n), "{n}");
        }
        for n in [
            "weft",
            "weft.",
            "weft.x",
            "weftx.1",
            "flannel.1",
            "flannel-wg",
            "eth0",
        ] {
            assert!(!is_vxlan_device(n), "{n}");
        }
    }
}
