//! The bpf filesystem the agent pins its maps and links in.
//!
//! Pins are what let programs keep forwarding while the agent is restarted:
//! a pinned link stays attached, a pinned map keeps its entries. Each agent
//! has a directory of its own (`--bpffs-dir`, default `/sys/fs/bpf/weft`);
//! several agents in network namespaces on one host need one each.

use std::{
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use dataplane_common::LAYOUT_VERSION;

/// The file in the agent's state directory that names its pin directory.
const ANNOUNCED: &str = "bpffs-dir";

/// The default directory of an agent's pins.
pub const DEFAULT_DIR: &str = "/sys/fs/bpf/weft";

/// Where one agent keeps its pins.
#[derive(Clone, Debug)]
pub struct PinDir {
    root: PathBuf,
}

impl PinDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Says, in `state_dir`, that the agent's pins are here, for the CNI
    /// plugin (which writes host routing's entries of the pods it adds and
    /// deletes, see `cni/fastpath.rs`).
    pub(crate) fn announce(&self, state_dir: &Path) -> Result<()> {
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let tmp = state_dir.join(format!(".{ANNOUNCED}.tmp"));
        std::fs::write(&tmp, self.root.as_os_str().as_bytes())
            .and_then(|()| std::fs::rename(&tmp, state_dir.join(ANNOUNCED)))
            .with_context(|| format!("writing {}", state_dir.join(ANNOUNCED).display()))
    }

    /// The pins the agent with `state_dir` announced, if any.
    pub(crate) fn announced(state_dir: &Path) -> Option<Self> {
        let raw = std::fs::read(state_dir.join(ANNOUNCED)).ok()?;
        let text = String::from_utf8(raw).ok()?;
        let root = PathBuf::from(text.trim());
        root.is_absolute().then(|| Self::new(root))
    }

    /// Forgets the announcement (teardown).
    pub(crate) fn unannounce(state_dir: &Path) {
        let _ = std::fs::remove_file(state_dir.join(ANNOUNCED));
    }

    /// Maps are pinned here by name, in a directory of this binary's map
    /// layout version (`maps-v2`).
    pub fn maps(&self) -> PathBuf {
        self.root.join(format!("maps-v{LAYOUT_VERSION}"))
    }

    /// Map directories of other layout versions (`maps` was version 1).
    pub(crate) fn other_map_versions(&self) -> Vec<(u32, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out: Vec<(u32, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let version = match name.as_str() {
                    "maps" => 1,
                    n => n.strip_prefix("maps-v")?.parse().ok()?,
                };
                (version != LAYOUT_VERSION).then(|| (version, e.path()))
            })
            .collect();
        out.sort();
        out
    }

    /// Links are pinned here, one per attach point.
    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }

    /// Makes sure the directory exists on a bpffs, mounting one there if the
    /// path is on some other filesystem.
    pub fn ensure(&self) -> Result<()> {
        std::fs::create_dir_all(&self.root)
            .with_context(|| format!("creating the pin directory {}", self.root.display()))?;
        if !is_bpffs(&self.root)? {
            crate::sys::fs::mount_bpffs(&self.root)?;
            tracing::info!(dir = %self.root.display(), "mounted a bpf filesystem for the agent's pins");
        }
        for dir in [self.maps(), self.links()] {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(())
    }

    /// True when the directory holds links pinned by an earlier run.
    pub(crate) fn has_links(&self) -> bool {
        std::fs::read_dir(self.links()).is_ok_and(|mut d| d.next().is_some())
    }
}

/// Whether `path` lies on a bpf filesystem.
pub fn is_bpffs(path: &Path) -> Result<bool> {
    crate::sys::fs::is_bpffs(path)
}
