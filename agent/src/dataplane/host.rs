//! The host settings the datapath needs, changed only where needed and
//! restored by `weft teardown`.
//!
//! - `net.ipv4.ip_forward=1`: pods' traffic is routed through the node.
//! - With IPv6: `net.ipv6.conf.all.forwarding=1`, and on the uplink
//!   `accept_ra=2` where it was 1 (forwarding would otherwise stop the
//!   uplink from taking router advertisements, and with them, maybe, its
//!   address and default route).
//! - Loose reverse-path filtering (rp_filter=2) on the uplink, where
//!   decapsulated packets from remote pods enter the stack: their route
//!   back goes through the overlay device, which strict filtering (1)
//!   rejects. The kernel applies the larger of `all` and the device's value,
//!   so raising the uplink's is enough; `all` is never touched.
//!
//! A value is recorded in `<state-dir>/saved-sysctls` the first time Weft
//! changes it (later runs keep the first record), so teardown can put it
//! back. The state directory is a tmpfs (`/run/weft`): after a reboot the
//! kernel's defaults are back and so is an empty record.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::sys::sysctl;

const SAVED: &str = "saved-sysctls";

/// Sets what is not set yet (the IPv6 settings when `ipv6`); returns
/// whether anything was.
pub(crate) fn apply(uplink: &str, state_dir: &Path, ipv6: bool) -> Result<bool> {
    let mut changed = false;
    if sysctl::read("net.ipv4.ip_forward")? != "1" {
        sysctl::write("net.ipv4.ip_forward", "1")?;
        tracing::info!("enabled net.ipv4.ip_forward");
        changed = true;
    }
    if ipv6 {
        // The uplink first: once forwarding is on, accept_ra=1 ignores
        // router advertisements.
        let ra = sysctl::read_iface("ipv6", uplink, "accept_ra")?;
        if ra == "1" {
            save(state_dir, &format!("net.ipv6.conf.{uplink}.accept_ra"), &ra)?;
            sysctl::write_iface("ipv6", uplink, "accept_ra", "2")?;
            tracing::info!(
                uplink,
                "accept_ra=2 on the uplink, so it keeps taking router advertisements with forwarding on"
            );
            changed = true;
        }
        let fwd = sysctl::read_iface("ipv6", "all", "forwarding")?;
        if fwd != "1" {
            save(state_dir, "net.ipv6.conf.all.forwarding", &fwd)?;
            sysctl::write_iface("ipv6", "all", "forwarding", "1")?;
            tracing::info!("enabled net.ipv6.conf.all.forwarding");
            changed = true;
        }
    }
    let all: u8 = sysctl::read_iface("ipv4", "all", "rp_filter")?
        .parse()
        .unwrap_or(0);
    let key = format!("net.ipv4.conf.{uplink}.rp_filter");
    let dev = sysctl::read_iface("ipv4", uplink, "rp_filter")?;
    let dev_n: u8 = dev.parse().unwrap_or(0);
    if all.max(dev_n) == 1 {
        save(state_dir, &key, &dev)?;
        sysctl::write_iface("ipv4", uplink, "rp_filter", "2")?;
        tracing::info!(
            uplink,
            was = %dev,
            "set loose reverse-path filtering (rp_filter=2) on the uplink, where decapsulated packets enter"
        );
        changed = true;
    }
    Ok(changed)
}

/// Puts back every value Weft changed; returns what it restored.
pub(crate) fn restore(state_dir: &Path) -> Result<Vec<String>> {
    let path = saved_path(state_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut restored = Vec::new();
    for (key, value) in text.lines().filter_map(|l| l.split_once('=')) {
        let Some((family, rest)) = key
            .strip_prefix("net.ipv4.conf.")
            .map(|r| ("ipv4", r))
            .or_else(|| key.strip_prefix("net.ipv6.conf.").map(|r| ("ipv6", r)))
        else {
            continue;
        };
        let Some((iface, leaf)) = rest.rsplit_once('.') else {
            continue;
        };
        // The device may be gone; then so is its setting.
        if sysctl::write_iface(family, iface, leaf, value).is_ok() {
            restored.push(format!("sysctl {key}={value}"));
        }
    }
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(restored)
}

fn saved_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SAVED)
}

fn save(state_dir: &Path, key: &str, value: &str) -> Result<()> {
    let path = saved_path(state_dir);
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    if text
        .lines()
        .any(|l| l.split_once('=').is_some_and(|(k, _)| k == key))
    {
        return Ok(());
    }
    text.push_str(&format!("{key}={value}\n"));
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}
