//! A memory cgroup for a test's process: a limit the kernel enforces (the
//! process is OOM-killed beyond it), as a container's memory limit is.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// A cgroup with a memory limit, removed on drop (once its processes are
/// gone).
pub struct MemCgroup {
    dir: PathBuf,
}

impl MemCgroup {
    /// A new cgroup limited to `bytes` of memory (cgroup v1's memory
    /// controller, or v2's where that is what the machine has).
    pub fn new(bytes: u64) -> Result<Self> {
        let name = crate::unique("weft-mem-");
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else {
            let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .into_iter()
                .map(Path::new)
                .find(|p| {
                    std::fs::read_to_string(p.join("cgroup.controllers"))
                        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
                })
                .context("no memory cgroup controller on this machine")?;
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
            (v2.join(&name), "memory.max")
        };
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let g = Self { dir };
        std::fs::write(g.dir.join(file), bytes.to_string())
            .with_context(|| format!("limiting {} to {bytes} bytes", g.dir.display()))?;
        Ok(g)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether the kernel killed a process of this cgroup for its memory.
    pub fn oom_killed(&self) -> Result<bool> {
        let events = self.dir.join("memory.events");
        if events.exists() {
            let t = std::fs::read_to_string(events)?;
            return Ok(t
                .lines()
                .any(|l| l.starts_with("oom_kill ") && !l.ends_with(" 0")));
        }
        let ctl = std::fs::read_to_string(self.dir.join("memory.oom_control"))?;
        match ctl.lines().find_map(|l| l.strip_prefix("oom_kill ")) {
            Some(n) => Ok(n.trim() != "0"),
            None => bail!("no OOM counter in {}", self.dir.display()),
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// A process's peak resident memory (VmHWM), in bytes.
pub fn peak_rss(pid: i32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmHWM")?;
    Ok(kb * 1024)
}
