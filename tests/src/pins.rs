//! A private bpffs directory per test, unmounted and removed on drop.

use std::path::{Path, PathBuf};

use weft::dataplane::bpffs::PinDir;

pub struct TestPins {
    dir: PathBuf,
    pins: PinDir,
}

impl TestPins {
    /// A fresh directory under /tmp; the agent code mounts bpffs on it.
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(crate::unique("weft-bpffs-"));
        std::fs::create_dir_all(&dir).expect("creating a temp dir");
        let pins = PinDir::new(&dir);
        Self { dir, pins }
    }

    pub fn pins(&self) -> &PinDir {
        &self.pins
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Default for TestPins {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestPins {
    fn drop(&mut self) {
        // Unmounting drops every pin in it: links detach, maps go away.
        crate::proc::run_quiet("umount", &[self.dir.to_str().unwrap_or_default()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
