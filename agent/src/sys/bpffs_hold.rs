//! The agent holds its pin directory open for as long as it runs.
//!
//! An unmount of the bpf filesystem under a running agent would drop every
//! pin in it: the links the CNI plugin pinned for netkit pods (nothing else
//! holds them) would detach and cut those pods off, and a restart would
//! find nothing to adopt. Holding a descriptor of the directory makes a
//! plain unmount fail (EBUSY); a lazy one (`umount -l`) detaches the mount
//! but leaves the filesystem, and every pin in it, alive. The agent then
//! mounts a bpf filesystem where the old one was (where it may; or waits
//! for node-init to) and pins every object of the detached one into it
//! again, at the same paths: nothing detaches, nothing is lost.

use std::{
    fs::File,
    io,
    os::{fd::AsFd as _, fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::sys::bpffs::{PinDir, is_bpffs};

/// The pin directory, held open.
pub(crate) struct BpffsHold {
    /// The pin directory (on the filesystem held).
    root: PathBuf,
    /// The mount point of the bpf filesystem it lies on.
    mount_point: PathBuf,
    dir: File,
    dev: u64,
    /// Why the last attempt to put the pins back failed (logged once).
    failing: Option<String>,
}

impl BpffsHold {
    /// Holds `pins`' directory (which must lie on a bpf filesystem).
    pub(crate) fn new(pins: &PinDir) -> Result<Self> {
        let root = pins.root().to_path_buf();
        let dir = File::open(&root).with_context(|| format!("opening {}", root.display()))?;
        let dev = dir.metadata()?.dev();
        // The topmost directory of the same filesystem.
        let mut mount_point = root.clone();
        while let Some(parent) = mount_point.parent() {
            match std::fs::metadata(parent) {
                Ok(m) if m.dev() == dev => mount_point = parent.to_path_buf(),
                _ => break,
            }
        }
        Ok(Self {
            root,
            mount_point,
            dir,
            dev,
            failing: None,
        })
    }

    /// Whether the pin directory is still the one held.
    fn in_place(&self) -> bool {
        std::fs::metadata(&self.root).is_ok_and(|m| m.dev() == self.dev)
    }

    /// Puts the pins back where the filesystem held was unmounted: Ok(true)
    /// when it did, Ok(false) when nothing was amiss. An error says what
    /// keeps it from doing so (logged by the caller once per cause).
    pub(crate) fn heal(&mut self) -> Result<bool> {
        if self.in_place() {
            self.failing = None;
            return Ok(false);
        }
        match self.restore() {
            Ok(copied) => {
                tracing::warn!(
                    dir = %self.root.display(),
                    mount_point = %self.mount_point.display(),
                    pins = copied,
                    "the bpf filesystem holding the pins was unmounted: mounted one again and pinned every object of the old one into it"
                );
                self.failing = None;
                Ok(true)
            }
            Err(e) => {
                let why = format!("{e:#}");
                let first = self.failing.as_deref() != Some(why.as_str());
                self.failing = Some(why.clone());
                if first {
                    tracing::error!(
                        dir = %self.root.display(),
                        error = %why,
                        "the bpf filesystem holding the pins was unmounted, and cannot be put back yet: the programs go on forwarding from the detached filesystem this agent holds, but a restart would find no pins; mount it again (node-init does)"
                    );
                }
                Err(e)
            }
        }
    }

    /// Mounts a bpf filesystem at the mount point if none is there, pins
    /// every object of the held one into it, and holds the new one.
    fn restore(&mut self) -> Result<usize> {
        if !self.mount_point.is_dir() || !is_bpffs(&self.mount_point)? {
            crate::sys::fs::mount_bpffs(&self.mount_point)?;
        }
        std::fs::create_dir_all(&self.root)
            .with_context(|| format!("creating {}", self.root.display()))?;
        let held = PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()));
        let copied = copy_pins(&held, &self.root)?;
        let dir =
            File::open(&self.root).with_context(|| format!("opening {}", self.root.display()))?;
        self.dev = dir.metadata()?.dev();
        self.dir = dir;
        Ok(copied)
    }
}

/// Pins every object under `from` at the same path under `to` (directories
/// made; what is already there kept); returns how many it pinned.
fn copy_pins(from: &Path, to: &Path) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            match std::fs::create_dir(&dst) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).with_context(|| format!("creating {}", dst.display())),
            }
            n += copy_pins(&src, &dst)?;
            continue;
        }
        let Some(fd) = crate::sys::bpf::open_pin(&src)
            .with_context(|| format!("opening the pin {}", src.display()))?
        else {
            continue;
        };
        match crate::sys::bpf::pin(fd.as_fd(), &dst) {
            Ok(()) => n += 1,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("pinning {}", dst.display())),
        }
    }
    Ok(n)
}
