//! The links that hold the programs on their attach points, pinned one
//! file per attach point, `<kind>-<ifname>-<ifindex>`, under
//! `<pins>/links`: their names, the programs they hold, and detaching
//! them (releasing a link is asynchronous: detach waits until the kernel
//! no longer runs the program there).

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use aya::programs::{
    SchedClassifier, TcAttachType,
    links::{FdLink, LinkError, PinnedLink},
};

use crate::dataplane::netkit;
use crate::dataplane::netkit::NetkitHook;
use crate::dataplane::programs::ids;
use crate::sys::bpffs::PinDir;
use crate::sys::netlink::Netlink;

/// Where a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Xdp,
    TcIngress,
    TcEgress,
    /// A netkit pair's peer hook (what the pod transmits), named by the
    /// primary (host side) device.
    NetkitPeer,
}

impl Hook {
    /// How its links' pins are named: `<prefix>-<iface>-<ifindex>`.
    pub(crate) fn pin_prefix(self) -> &'static str {
        match self {
            Hook::Xdp => "xdp",
            Hook::TcIngress => "tc_ingress",
            Hook::TcEgress => "tc_egress",
            Hook::NetkitPeer => "netkit_peer",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Xdp => "xdp",
            Hook::TcIngress => "tc-ingress",
            Hook::TcEgress => "tc-egress",
            Hook::NetkitPeer => "netkit-peer",
        }
    }
}

/// The name of the program in the link pinned at `hook` on `iface`.
pub(crate) fn pinned_program(
    pins: &PinDir,
    hook: Hook,
    iface: &str,
    ifindex: u32,
) -> Option<String> {
    let link = open_pinned_link(&link_pin_path(pins, hook, iface, ifindex)).ok()??;
    let id = link.info().ok()?.program_id();
    pinned_program_name(pins, id).or_else(|| ids::program_name(id))
}

/// The name of the program with kernel id `id` among the generations
/// pinned under `pins`. Reading a pinned program's info needs no privilege
/// beyond the pin's file mode, where walking every loaded program
/// ([`ids::program_name`]) needs CAP_SYS_ADMIN, which the DaemonSet's agent
/// container (and `kubectl exec ... weft doctor` in it) does not have.
fn pinned_program_name(pins: &PinDir, id: u32) -> Option<String> {
    [
        crate::dataplane::programs::generations::CURRENT,
        crate::dataplane::programs::generations::PREVIOUS,
    ]
    .iter()
    .find_map(|g| {
        std::fs::read_dir(pins.root().join(g))
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| aya::programs::ProgramInfo::from_pin(e.path()).ok())
            .find(|p| p.id() == id)
            .and_then(|p| p.name_as_str().map(str::to_string))
    })
}

/// The pin of the link at `hook` on `iface`.
pub(crate) fn link_pin_path(pins: &PinDir, hook: Hook, iface: &str, ifindex: u32) -> PathBuf {
    pins.links().join(format!(
        "{}-{}-{ifindex}",
        hook.pin_prefix(),
        pin_safe(iface)
    ))
}

/// bpffs refuses names with '.', which interface names may hold (weft.1);
/// ':' can never appear in an interface name, so it stands in for it.
fn pin_safe(iface: &str) -> String {
    iface.replace('.', ":")
}

fn from_pin_safe(name: &str) -> String {
    name.replace(':', ".")
}

/// Removes the pin of the link at `hook` on `iface`, detaching it, and waits
/// until the kernel no longer runs the program there (releasing a link is
/// asynchronous). Returns whether there was one.
pub fn detach(pins: &PinDir, hook: Hook, iface: &str) -> Result<bool> {
    let prefix = format!("{}-{}-", hook.pin_prefix(), pin_safe(iface));
    let mut found = false;
    let dir = pins.links();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let pin = entry.path();
        let prog_id = match open_pinned_link(&pin) {
            Ok(Some(link)) => link.info().ok().map(|i| i.program_id()),
            _ => None,
        };
        remove_pin(&pin)?;
        found = true;
        if let Some(prog_id) = prog_id {
            wait_detached(hook, iface, prog_id)?;
        }
    }
    Ok(found)
}

/// The ids of the programs attached at `hook` on `iface`.
pub(crate) fn attached_programs(hook: Hook, iface: &str) -> Result<Vec<u32>> {
    match hook {
        Hook::Xdp => {
            let name = iface.to_string();
            let link = Netlink::blocking(async move |nl| nl.link(&name).await)?;
            Ok(link
                .and_then(|l| l.xdp)
                .map(|x| x.program)
                .into_iter()
                .collect())
        }
        Hook::NetkitPeer => {
            // The device is gone: nothing is attached to it.
            let Ok(index) = ifindex(iface) else {
                return Ok(Vec::new());
            };
            netkit::query(index, NetkitHook::Peer)
                .with_context(|| format!("querying the programs at netkit {iface}'s peer hook"))
        }
        Hook::TcIngress | Hook::TcEgress => {
            let ty = if hook == Hook::TcIngress {
                TcAttachType::Ingress
            } else {
                TcAttachType::Egress
            };
            match SchedClassifier::query_tcx(iface, ty) {
                Ok((_, progs)) => Ok(progs.iter().map(|p| p.id()).collect()),
                Err(e) => {
                    // The device is gone: nothing is attached to it.
                    if ifindex(iface).is_err() {
                        Ok(Vec::new())
                    } else {
                        Err(e).with_context(|| format!("querying TC programs on {iface}"))
                    }
                }
            }
        }
    }
}

fn wait_detached(hook: Hook, iface: &str, prog_id: u32) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if !attached_programs(hook, iface)?.contains(&prog_id) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "program {prog_id} is still attached to {iface} ({}) 5 s after its link was unpinned",
                hook.name()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The link pins present, as (hook, iface) pairs.
pub(crate) fn pinned_links(pins: &PinDir) -> Result<Vec<(Hook, String, u32)>> {
    let mut out = Vec::new();
    let dir = pins.links();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        for hook in [Hook::Xdp, Hook::TcIngress, Hook::TcEgress, Hook::NetkitPeer] {
            if let Some(rest) = name.strip_prefix(&format!("{}-", hook.pin_prefix()))
                && let Some((iface, idx)) = rest.rsplit_once('-')
                && let Ok(idx) = idx.parse()
            {
                out.push((hook, from_pin_safe(iface), idx));
            }
        }
    }
    out.sort_by(|a, b| (a.1.as_str(), a.0.name()).cmp(&(b.1.as_str(), b.0.name())));
    Ok(out)
}

/// The OS error at the root of `e`, if any.
pub(crate) fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(code) = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(code);
        }
        cur = err.source();
    }
    None
}

pub(crate) fn open_pinned_link(pin: &Path) -> Result<Option<FdLink>> {
    match PinnedLink::from_pin(pin) {
        Ok(p) => Ok(Some(p.into())),
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("opening the pinned link {}", pin.display())),
    }
}

pub(crate) fn remove_pin(pin: &Path) -> Result<()> {
    match std::fs::remove_file(pin) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", pin.display())),
    }
}

/// The index of `iface` in the current network namespace.
pub fn ifindex(iface: &str) -> Result<u32> {
    let c = CString::new(iface).with_context(|| format!("bad interface name {iface:?}"))?;
    // SAFETY: if_nametoindex reads a valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no network interface named {iface:?} in this network namespace");
    }
    Ok(idx)
}
