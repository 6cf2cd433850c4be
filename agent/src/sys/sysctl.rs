//! The few sysctls the datapath needs, all under `net.`.
//!
//! They are read and written under `/proc/sys/net`, or where
//! `WEFT_PROC_SYS_NET` says: a container that is not privileged has
//! `/proc/sys` read-only, and container runtimes refuse mounts inside
//! `/proc`, so the DaemonSet mounts the host's `/proc/sys/net` elsewhere
//! (`/host/proc/sys/net`, as Cilium does) and points Weft there.

use std::{path::PathBuf, sync::OnceLock};

use anyhow::{Context as _, Result, bail};

/// Where `net.*` sysctls live.
fn net_root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        std::env::var_os("WEFT_PROC_SYS_NET")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| PathBuf::from("/proc/sys/net"))
    })
}

fn path(key: &str) -> Result<PathBuf> {
    let Some(rest) = key.strip_prefix("net.") else {
        bail!("sysctl {key} is not under net.");
    };
    // net.ipv4.conf.<iface>.rp_filter: the interface name may hold dots,
    // which is why such keys go through the `_iface` functions.
    Ok(net_root().join(rest.replace('.', "/")))
}

pub(crate) fn read(key: &str) -> Result<String> {
    Ok(std::fs::read_to_string(path(key)?)
        .with_context(|| format!("reading sysctl {key}"))?
        .trim()
        .to_string())
}

pub(crate) fn write(key: &str, value: &str) -> Result<()> {
    std::fs::write(path(key)?, value).with_context(|| format!("setting sysctl {key}={value}"))
}

fn iface_path(family: &str, iface: &str, leaf: &str) -> PathBuf {
    net_root().join(family).join("conf").join(iface).join(leaf)
}

pub(crate) fn read_iface(family: &str, iface: &str, leaf: &str) -> Result<String> {
    let p = iface_path(family, iface, leaf);
    Ok(std::fs::read_to_string(&p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .to_string())
}

pub(crate) fn write_iface(family: &str, iface: &str, leaf: &str, value: &str) -> Result<()> {
    let p = iface_path(family, iface, leaf);
    std::fs::write(&p, value).with_context(|| format!("setting {}={value}", p.display()))
}
