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

    /// A fresh directory with no bpffs yet, made a shared mount point (a
    /// bind of itself), as a node's /sys/fs/bpf is: a bpffs that a
    /// container mounts there with Bidirectional (rshared) propagation
    /// appears on the host.
    pub fn shared_unmounted() -> Self {
        let t = Self::unmounted();
        let d = t.dir.to_str().unwrap();
        crate::proc::run("mount", &["--bind", d, d]).expect("bind-mounting the pin directory");
        crate::proc::run("mount", &["--make-shared", d]).expect("making it shared");
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
        // Unmounting drops every pin in it: links detach, maps go away
        // (twice: a shared bind may be under the bpffs).
        for _ in 0..2 {
            crate::proc::run_quiet("umount", &[self.dir.to_str().unwrap_or_default()]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(self.state_dir());
    }
}
