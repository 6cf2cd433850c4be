//! A private bpffs directory per test, unmounted and removed on drop.

use std::path::{Path, PathBuf};

use weft::dataplane::PinDir;

pub struct TestPins {
    dir: PathBuf,
    pins: PinDir,
}

impl TestPins {
    /// A fresh directory under /tmp with a bpffs mounted on it, in this
    /// (the host's) mount namespace: agents started with `ip netns exec` get
    /// a copy of the mount table, so they see the same bpffs, and their pins
    /// outlive them as they would on a node.
    pub fn new() -> Self {
        let t = Self::unmounted();
        crate::proc::run("mount", &["-t", "bpf", "bpf", t.dir.to_str().unwrap()])
            .expect("mounting bpffs");
        t
    }

    /// A fresh, empty directory (no bpffs): for checking that the agent
    /// mounts one itself.
    pub fn unmounted() -> Self {
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

    /// A state directory to go with these pins (a plain directory beside
    /// them: bpffs holds only pins).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.with_extension("state")
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
        let _ = std::fs::remove_dir_all(self.state_dir());
    }
}
