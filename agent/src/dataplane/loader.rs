//! Loads Weft's eBPF object and attaches its programs through pinned links.
//!
//! Maps are pinned by name under `<pins>/maps` and links under `<pins>/links`,
//! one file per attach point named `<kind>-<ifname>-<ifindex>`. An agent that
//! starts where pins already exist loads the programs again and swaps them
//! into the existing links atomically (`bpf_link_update`), so traffic never
//! sees a moment without a program, and the maps keep their entries.

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, LinkError, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
        xdp::XdpLink,
    },
};
use dataplane_common::program_names;

use super::{bpffs::PinDir, netlink::Netlink};

/// The eBPF object built from `dataplane-ebpf/` (see `build.rs`).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/weft-dataplane"));

/// Where a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Xdp,
    TcIngress,
    TcEgress,
}

impl Hook {
    fn pin_prefix(self) -> &'static str {
        match self {
            Hook::Xdp => "xdp",
            Hook::TcIngress => "tc_ingress",
            Hook::TcEgress => "tc_egress",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Xdp => "xdp",
            Hook::TcIngress => "tc-ingress",
            Hook::TcEgress => "tc-egress",
        }
    }
}

/// The outcome of one attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub program: &'static str,
    pub iface: String,
    pub hook: Hook,
    /// The XDP mode in use (None for TC).
    pub xdp_mode: Option<XdpModeName>,
    /// True when an existing pinned link was reused (the program swapped in
    /// place), false when a new link was created.
    pub adopted: bool,
}

/// The XDP modes an operator can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpModeName {
    /// Native (driver) mode.
    Native,
    /// Generic (skb) mode.
    Generic,
}

impl XdpModeName {
    pub fn as_str(self) -> &'static str {
        match self {
            XdpModeName::Native => "native",
            XdpModeName::Generic => "generic",
        }
    }

    fn mode(self) -> XdpMode {
        match self {
            XdpModeName::Native => XdpMode::Driver,
            XdpModeName::Generic => XdpMode::Skb,
        }
    }
}

/// The loaded object: programs ready to attach, maps pinned.
pub struct Loaded {
    ebpf: Ebpf,
    pins: PinDir,
}

impl Loaded {
    /// Loads the embedded object. Maps that are already pinned under `pins`
    /// are reused with their contents; the others are created and pinned.
    pub fn load(pins: &PinDir) -> Result<Self> {
        pins.ensure()?;
        let ebpf = EbpfLoader::new()
            .default_map_pin_directory(pins.maps())
            .load(OBJECT)
            .context("loading the eBPF object (maps and programs)")?;
        Ok(Self {
            ebpf,
            pins: pins.clone(),
        })
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub fn pins(&self) -> &PinDir {
        &self.pins
    }

    /// Attaches the XDP program `program` to `iface`. Modes are tried in the
    /// order given (e.g. native, then generic); a pinned link from an earlier
    /// run is updated in place instead, keeping its mode.
    pub fn attach_xdp(
        &mut self,
        program: &'static str,
        iface: &str,
        modes: &[XdpModeName],
    ) -> Result<Attachment> {
        let ifindex = ifindex(iface)?;
        let pin = self.link_pin(Hook::Xdp, iface, ifindex);
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("the eBPF object has no program {program}"))?
            .try_into()?;
        if prog.fd().is_err() {
            prog.load()
                .with_context(|| format!("loading XDP program {program}"))?;
        }
        if let Some(old) = open_pinned_link(&pin)? {
            let swapped = XdpLink::try_from(old)
                .map_err(anyhow::Error::from)
                .and_then(|link| prog.attach_to_link(link).map_err(anyhow::Error::from));
            match swapped {
                Ok(_) => {
                    return Ok(Attachment {
                        program,
                        iface: iface.to_string(),
                        hook: Hook::Xdp,
                        xdp_mode: None,
                        adopted: true,
                    });
                }
                Err(e) => {
                    tracing::warn!(pin = %pin.display(), error = %e, "pinned XDP link is unusable; attaching anew");
                    remove_pin(&pin)?;
                }
            }
        }
        let mut last_err = None;
        for mode in modes {
            match prog.attach_to_if_index(ifindex, mode.mode()) {
                Ok(id) => {
                    let link = prog.take_link(id)?;
                    let fd: FdLink = link.try_into().map_err(|e: LinkError| {
                        anyhow!("XDP on {iface} was attached through netlink, not a bpf link, so it cannot be pinned: {e}")
                    })?;
                    fd.pin(&pin)
                        .with_context(|| format!("pinning the XDP link at {}", pin.display()))?;
                    return Ok(Attachment {
                        program,
                        iface: iface.to_string(),
                        hook: Hook::Xdp,
                        xdp_mode: Some(*mode),
                        adopted: false,
                    });
                }
                Err(e) => {
                    tracing::debug!(iface, mode = mode.as_str(), error = %e, "XDP attach failed");
                    last_err = Some(anyhow::Error::from(e));
                }
            }
        }
        Err(last_err
            .unwrap_or_else(|| anyhow!("no XDP mode to try"))
            .context(format!("attaching XDP program {program} to {iface}")))
    }

    /// Attaches the TC program `program` to `iface` at `hook` (TCX link).
    pub fn attach_tc(
        &mut self,
        program: &'static str,
        iface: &str,
        hook: Hook,
    ) -> Result<Attachment> {
        let attach_type = match hook {
            Hook::TcIngress => TcAttachType::Ingress,
            Hook::TcEgress => TcAttachType::Egress,
            Hook::Xdp => bail!("attach_tc called with the XDP hook"),
        };
        let ifindex = ifindex(iface)?;
        let pin = self.link_pin(hook, iface, ifindex);
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| anyhow!("the eBPF object has no program {program}"))?
            .try_into()?;
        if prog.fd().is_err() {
            prog.load()
                .with_context(|| format!("loading TC program {program}"))?;
        }
        let attachment = |adopted| Attachment {
            program,
            iface: iface.to_string(),
            hook,
            xdp_mode: None,
            adopted,
        };
        if let Some(old) = open_pinned_link(&pin)? {
            let swapped = SchedClassifierLink::try_from(old)
                .map_err(anyhow::Error::from)
                .and_then(|link| prog.attach_to_link(link).map_err(anyhow::Error::from));
            match swapped {
                Ok(_) => return Ok(attachment(true)),
                Err(e) => {
                    tracing::warn!(pin = %pin.display(), error = %e, "pinned TC link is unusable; attaching anew");
                    remove_pin(&pin)?;
                }
            }
        }
        let id = prog
            .attach_with_options(
                iface,
                attach_type,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .with_context(|| {
                format!("attaching TC program {program} to {iface} {}", hook.name())
            })?;
        let link = prog.take_link(id)?;
        let fd: FdLink = link
            .try_into()
            .map_err(|e: LinkError| anyhow!("TC link on {iface} cannot be pinned: {e}"))?;
        fd.pin(&pin)
            .with_context(|| format!("pinning the TC link at {}", pin.display()))?;
        Ok(attachment(false))
    }

    fn link_pin(&self, hook: Hook, iface: &str, ifindex: u32) -> PathBuf {
        link_pin_path(&self.pins, hook, iface, ifindex)
    }

    /// Program names known to the object, for diagnostics.
    pub fn program_names(&self) -> Vec<String> {
        self.ebpf.programs().map(|(n, _)| n.to_string()).collect()
    }

    pub fn program_name_for(hook: Hook) -> &'static str {
        match hook {
            Hook::Xdp => program_names::DECAP_XDP,
            Hook::TcIngress => program_names::DECAP_TC,
            Hook::TcEgress => program_names::ENCAP,
        }
    }
}

/// The pin of the link at `hook` on `iface`.
pub fn link_pin_path(pins: &PinDir, hook: Hook, iface: &str, ifindex: u32) -> PathBuf {
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
pub fn attached_programs(hook: Hook, iface: &str) -> Result<Vec<u32>> {
    match hook {
        Hook::Xdp => {
            let name = iface.to_string();
            let link = Netlink::blocking(async move |nl| nl.link(&name).await)?;
            Ok(link
                .and_then(|l| l.xdp)
                .map(|(id, _)| id)
                .into_iter()
                .collect())
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
pub fn pinned_links(pins: &PinDir) -> Result<Vec<(Hook, String, u32)>> {
    let mut out = Vec::new();
    let dir = pins.links();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        for hook in [Hook::Xdp, Hook::TcIngress, Hook::TcEgress] {
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

fn open_pinned_link(pin: &Path) -> Result<Option<FdLink>> {
    match PinnedLink::from_pin(pin) {
        Ok(p) => Ok(Some(p.into())),
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("opening the pinned link {}", pin.display())),
    }
}

fn remove_pin(pin: &Path) -> Result<()> {
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
