//! `lint`: fmt, clippy and the import-cycle check, on the host crates and
//! on the eBPF crate.

use std::{path::Path, process::Command};

use anyhow::Result;

use crate::process::{cargo, run};

/// fmt and clippy on the host crates and on the eBPF crate (with its own
/// toolchain and target). Needs no root.
pub(crate) fn lint() -> Result<()> {
    let mut c = cargo();
    c.args(["fmt", "--all", "--check"]);
    run(c)?;
    crate::cycles::check(&[
        "agent/src",
        "dataplane-common/src",
        "dataplane-ebpf/src",
        "formats/src",
        "tests/src",
        "xtask/src",
    ])?;
    let mut c = cargo();
    c.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]);
    run(c)?;
    let ebpf = Path::new("dataplane-ebpf");
    let channel = crate::toolchain::channel(ebpf)?;
    let mut c = ebpf_cargo(&channel);
    c.args(["fmt", "--check"]).current_dir(ebpf);
    run(c)?;
    let mut c = ebpf_cargo(&channel);
    c.args([
        "clippy",
        "--release",
        "--locked",
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
        "--target-dir",
        "../target/ebpf",
        "--",
        "-D",
        "warnings",
    ])
    .current_dir(ebpf);
    run(c)
}

/// cargo of the eBPF crate's toolchain.
pub(crate) fn ebpf_cargo(channel: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", channel, "cargo"]);
    // The outer (stable) cargo's settings must not leak in.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
    ] {
        c.env_remove(var);
    }
    c
}
