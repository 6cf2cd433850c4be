//! The nightly toolchain the eBPF programs are built with.
//!
//! `dataplane-ebpf/rust-toolchain.toml` names the channel; no dated nightly
//! can be fetched on the build machines, so the nightly actually installed
//! is recorded here and `cargo xtask setup` refuses any other: an unnoticed
//! toolchain change could change the programs' code, and bpf-linker must be
//! built against the same LLVM major as that rustc.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

/// `commit-date` of the recorded nightly (`rustc -vV`).
pub(crate) const COMMIT_DATE: &str = "2026-05-19";
/// Its LLVM major version.
pub(crate) const LLVM_MAJOR: u32 = 22;

/// What `rustc -vV` reports for the eBPF crate's toolchain.
pub(crate) struct Rustc {
    pub(crate) commit_date: String,
    pub(crate) llvm_major: u32,
    pub(crate) release: String,
}

/// The channel named by `dataplane-ebpf/rust-toolchain.toml`.
pub(crate) fn channel(ebpf_dir: &Path) -> Result<String> {
    let file = ebpf_dir.join("rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .with_context(|| format!("{} names no channel", file.display()))
}

/// Asks the eBPF crate's toolchain for its version.
pub(crate) fn rustc(ebpf_dir: &Path) -> Result<Rustc> {
    let channel = channel(ebpf_dir)?;
    let out = Command::new("rustup")
        .args(["run", &channel, "rustc", "-vV"])
        .output()
        .context("running rustup")?;
    if !out.status.success() {
        bail!(
            "no {channel} toolchain: the eBPF programs build with it (-Z build-std). ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

fn parse(vv: &str) -> Result<Rustc> {
    let field = |name: &str| {
        vv.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("`rustc -vV` printed no {name}"))
    };
    let llvm = field("LLVM version:")?;
    let llvm_major = llvm
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("LLVM version {llvm:?}"))?;
    Ok(Rustc {
        commit_date: field("commit-date:")?,
        llvm_major,
        release: field("release:")?,
    })
}

/// Fails unless the toolchain is the recorded one.
pub(crate) fn check(r: &Rustc) -> Result<()> {
    if r.commit_date != COMMIT_DATE || r.llvm_major != LLVM_MAJOR {
        bail!(
            "the nightly toolchain is rustc {} (commit date {}, LLVM {}), but the eBPF programs are built and checked with the nightly of {COMMIT_DATE} (LLVM {LLVM_MAJOR}). \
             Install that one, or, after checking the programs with the new one (`cargo xtask test`), record it in xtask/src/toolchain.rs.",
            r.release,
            r.commit_date,
            r.llvm_major
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rustc_vv() {
        let r = parse("rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\nbinary: rustc\ncommit-hash: e50\ncommit-date: 2026-05-19\nhost: x86_64-unknown-linux-gnu\nrelease: 1.97.0-nightly\nLLVM version: 22.1.4\n").unwrap();
        assert_eq!((r.commit_date.as_str(), r.llvm_major), ("2026-05-19", 22));
        assert!(check(&r).is_ok());
        let other = Rustc {
            commit_date: "2026-06-01".into(),
            llvm_major: 22,
            release: "1.98.0-nightly".into(),
        };
        let e = check(&other).unwrap_err().to_string();
        assert!(e.contains("2026-06-01") && e.contains("record it"), "{e}");
    }
}
