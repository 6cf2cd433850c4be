//! The few sysctls the datapath needs.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

fn path(key: &str) -> PathBuf {
    // net.ipv4.conf.<iface>.rp_filter: the interface name may hold dots.
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

pub(crate) fn read(key: &str) -> Result<String> {
    Ok(std::fs::read_to_string(path(key))
        .with_context(|| format!("reading sysctl {key}"))?
        .trim()
        .to_string())
}

pub(super) fn write(key: &str, value: &str) -> Result<()> {
    std::fs::write(path(key), value).with_context(|| format!("setting sysctl {key}={value}"))
}

pub(crate) fn read_iface(family: &str, iface: &str, leaf: &str) -> Result<String> {
    let p = PathBuf::from("/proc/sys/net")
        .join(family)
        .join("conf")
        .join(iface)
        .join(leaf);
    Ok(std::fs::read_to_string(&p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .to_string())
}

pub(super) fn write_iface(family: &str, iface: &str, leaf: &str, value: &str) -> Result<()> {
    let p = PathBuf::from("/proc/sys/net")
        .join(family)
        .join("conf")
        .join(iface)
        .join(leaf);
    std::fs::write(&p, value).with_context(|| format!("setting {}={value}", p.display()))
}
