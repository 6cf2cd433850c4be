//! `weft node-init`: what the DaemonSet's privileged init container does,
//! so the agent itself runs with a short list of capabilities.
//!
//! - A bpf filesystem at the host's `/sys/fs/bpf` (the init container
//!   mounts it with Bidirectional propagation, so the host and the agent,
//!   whose mount only needs HostToContainer, see it): the agent's pins
//!   outlive its pod, which is what makes a restart hitless.
//! - The agent's seccomp profile (`deploy/seccomp/weft-agent.json`, built
//!   into the binary) in the kubelet's profile directory, for the agent
//!   container's `seccompProfile: Localhost`: the runtimes' default profiles
//!   allow `bpf()` only with CAP_SYS_ADMIN.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::dataplane::{PinDir, is_bpffs};

/// The agent's seccomp profile: every system call but those an agent never
/// needs (module loading, kexec, mounts, namespaces, tracing other
/// processes, keyrings, clock and swap changes, reboot).
pub(crate) const SECCOMP_PROFILE: &str = include_str!("../../../deploy/seccomp/weft-agent.json");

/// The profile's file name in the kubelet's directory.
pub(crate) const SECCOMP_FILE: &str = "weft-agent.json";

pub(crate) fn node_init(bpffs_root: &Path, seccomp_dir: Option<&Path>) -> Result<()> {
    let was = is_bpffs(bpffs_root).unwrap_or(false);
    PinDir::new(bpffs_root).ensure()?;
    println!(
        "{} is a bpf filesystem{}",
        bpffs_root.display(),
        if was { "" } else { " (mounted now)" }
    );
    if let Some(dir) = seccomp_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(SECCOMP_FILE);
        let tmp = dir.join(format!(".{SECCOMP_FILE}.tmp"));
        std::fs::write(&tmp, SECCOMP_PROFILE)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .with_context(|| format!("writing {}", path.display()))?;
        println!(
            "installed the agent's seccomp profile as {}",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seccomp_profile_allows_bpf_and_denies_what_an_agent_never_needs() {
        let v: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        assert_eq!(v["defaultAction"], "SCMP_ACT_ALLOW");
        let denied: Vec<&str> = v["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["action"] == "SCMP_ACT_ERRNO")
            .flat_map(|s| s["names"].as_array().unwrap())
            .map(|n| n.as_str().unwrap())
            .collect();
        for must in [
            "init_module",
            "finit_module",
            "kexec_load",
            "mount",
            "ptrace",
            "setns",
        ] {
            assert!(denied.contains(&must), "{must}");
        }
        assert!(!denied.contains(&"bpf"));
    }
}
