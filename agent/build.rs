//! Builds Weft's eBPF programs so the agent can embed them.
//!
//! The programs live in `dataplane-ebpf/`, a crate of its own built with the
//! toolchain its `rust-toolchain.toml` names (nightly) for
//! `bpfel-unknown-none` (`-Z build-std=core`) and linked by bpf-linker
//! (`cargo xtask setup` installs both and checks the nightly is the recorded
//! one). The object lands in
//! `OUT_DIR/weft-dataplane` and `src/dataplane/loader.rs` includes it.
//!
//! Set `WEFT_EBPF_OBJECT=/path/to/object` to embed a prebuilt object instead.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let dest = out_dir.join("weft-dataplane");
    println!("cargo:rerun-if-env-changed=WEFT_EBPF_OBJECT");
    if let Some(prebuilt) = env::var_os("WEFT_EBPF_OBJECT") {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy(&prebuilt, &dest);
        return;
    }

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir
        .parent()
        .expect("agent/ sits in the workspace root");
    let ebpf_dir = root.join("dataplane-ebpf");
    for watched in [
        ebpf_dir.join("src"),
        ebpf_dir.join("Cargo.toml"),
        ebpf_dir.join("Cargo.lock"),
        ebpf_dir.join("rust-toolchain.toml"),
        root.join("dataplane-common/src"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    let channel = toolchain_channel(&ebpf_dir.join("rust-toolchain.toml"));

    // A target directory of its own, shared by every profile of the agent, so
    // core is built for BPF once and the outer cargo's lock is not contended.
    let target_dir = root.join("target").join("ebpf");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &channel, "cargo", "build", "--release", "--locked"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--manifest-path")
        .arg(ebpf_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(&ebpf_dir);
    // The outer cargo (stable, maybe clippy) must not leak into the inner build.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTUP_TOOLCHAIN",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run `rustup run {channel} cargo` to build the eBPF programs: {e}; run `cargo xtask setup`")
    });
    if !status.success() {
        panic!(
            "building the eBPF programs failed ({status}); `cargo xtask setup` installs the nightly rust-src component and bpf-linker"
        );
    }
    copy(
        &target_dir.join("bpfel-unknown-none/release/weft-dataplane"),
        &dest,
    );
}

/// The channel `dataplane-ebpf/rust-toolchain.toml` names.
fn toolchain_channel(file: &Path) -> String {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("{} names no channel", file.display()))
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
}
