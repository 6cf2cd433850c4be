//! Builds Weft's eBPF programs so the agent can embed them.
//!
//! The programs live in `dataplane-ebpf/`, a crate of its own built with the
//! nightly toolchain for `bpfel-unknown-none` (`-Z build-std=core`) and linked
//! by bpf-linker (`cargo xtask setup` installs both). The object lands in
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
        root.join("dataplane-common/src"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }

    // A target directory of its own, shared by every profile of the agent, so
    // core is built for BPF once and the outer cargo's lock is not contended.
    let target_dir = root.join("target").join("ebpf");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--release", "--locked"])
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
        panic!("cannot run `rustup run nightly cargo` to build the eBPF programs: {e}; run `cargo xtask setup`")
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

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
}
