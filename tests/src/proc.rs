//! Running commands, with errors that say what failed.

use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail};

/// Runs `program args...` and returns its stdout; fails with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    check(program, args, out)
}

/// Like [`run`], ignoring failure (for cleanup).
pub fn run_quiet(program: &str, args: &[&str]) {
    let _ = Command::new(program).args(args).output();
}

fn check(program: &str, args: &[&str], out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The pids of processes one of whose arguments is `arg` (e.g. the shims
/// of a containerd, by its socket's path).
pub fn pids_with_arg(arg: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

/// Unmounts (lazily) every mount at or below `dir`, deepest first: what a
/// container runtime left there when a test failed half-way.
pub fn unmount_under(dir: &std::path::Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut under: Vec<std::path::PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(std::path::PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in under {
        if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2(2) with a NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
