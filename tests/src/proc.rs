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
