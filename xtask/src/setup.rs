//! `cargo xtask setup`: everything a fresh Debian machine needs to build,
//! test and benchmark Weft. Each step checks first and only acts when
//! something is missing, so a second run takes seconds.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::run;

/// Debian packages: the build (protoc for etcd-client), the tests (etcd,
/// iproute2, tcpdump/tshark, scapy, nftables) and the benchmarks (iperf3,
/// sockperf, bpftool, perf, ethtool).
const PACKAGES: &[&str] = &[
    "protobuf-compiler",
    "etcd-server",
    "etcd-client",
    "iproute2",
    "iputils-ping",
    "procps",
    "iperf3",
    "sockperf",
    "bpftool",
    "tshark",
    "tcpdump",
    "python3-scapy",
    "nftables",
    "iptables",
    "ethtool",
    "linux-perf",
];

const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_MAJOR: &str = "22";

pub fn setup() -> Result<()> {
    let started = Instant::now();
    step("Debian packages", debian_packages)?;
    step("nightly toolchain with rust-src", nightly_rust_src)?;
    step("bpf-linker", bpf_linker)?;
    step("bpffs at /sys/fs/bpf", bpffs)?;
    step("kernel", kernel)?;
    eprintln!("setup: done in {:.1?}", started.elapsed());
    Ok(())
}

fn step(name: &str, f: fn() -> Result<String>) -> Result<()> {
    let t = Instant::now();
    let what = f().with_context(|| format!("setup step '{name}'"))?;
    eprintln!("setup: {name}: {what} ({:.1?})", t.elapsed());
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn debian_packages() -> Result<String> {
    if Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "dpkg-query not found: this is not a Debian-like system. Install by hand: {}",
            PACKAGES.join(" ")
        );
    }
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${Status}\n"])
        .args(PACKAGES)
        .output()
        .context("running dpkg-query")?;
    let listed = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !listed
                .lines()
                .any(|l| l.starts_with(&format!("{p} ")) && l.ends_with("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(format!("all {} present", PACKAGES.len()));
    }
    if !is_root() {
        bail!(
            "missing packages: {}. Run `sudo cargo xtask setup`, or install them: sudo apt-get install {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("setup: installing {}", missing.join(" "));
    let mut update = Command::new("apt-get");
    update.args(["update", "-qq"]);
    run(update).context("apt-get update failed: check the machine's apt sources and network")?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(install)?;
    Ok(format!("installed {}", missing.join(" ")))
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .context("running rustc +nightly")?;
    if !out.status.success() {
        bail!(
            "no nightly toolchain: the eBPF programs build with nightly (-Z build-std). Install it with `rustup toolchain install nightly --component rust-src`. ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn nightly_rust_src() -> Result<String> {
    let sysroot = nightly_sysroot()?;
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok("present".into());
    }
    let mut c = Command::new("rustup");
    c.args(["component", "add", "rust-src", "--toolchain", "nightly"]);
    run(c)?;
    Ok("installed rust-src".into())
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// bpf-linker links against the libLLVM that ships inside the nightly
/// toolchain (same LLVM major as its rustc). Its binary looks for the library
/// in `~/.cache/llvm<major>/lib` (its runpath), where we keep symlinks.
fn bpf_linker() -> Result<String> {
    let sysroot = nightly_sysroot()?;
    let prefix = home().join(format!(".cache/llvm{LLVM_MAJOR}"));
    link_llvm(&sysroot, &prefix.join("lib"))?;

    if let Ok(out) = Command::new("bpf-linker").arg("--version").output()
        && out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains(BPF_LINKER_VERSION)
    {
        return Ok(format!("{BPF_LINKER_VERSION} present"));
    }
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against nightly's LLVM {LLVM_MAJOR} (about 2 minutes)"
    );
    let mut c = Command::new("cargo");
    c.args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--locked",
        "--force",
        "--no-default-features",
        "--features",
        &format!("llvm-{LLVM_MAJOR}"),
    ])
    .env("LLVM_PREFIX", &prefix)
    .current_dir(std::env::temp_dir());
    run(c)?;
    let out = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .context("bpf-linker was installed but cannot be run: is ~/.cargo/bin on PATH?")?;
    if !out.status.success() {
        bail!(
            "bpf-linker was built but does not run: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(format!("built {BPF_LINKER_VERSION}"))
}

/// Symlinks every libLLVM of the nightly toolchain into `lib`, under both
/// names bpf-linker's build and runtime look for.
fn link_llvm(sysroot: &Path, lib: &Path) -> Result<()> {
    std::fs::create_dir_all(lib)?;
    let mut found = false;
    for entry in std::fs::read_dir(sysroot.join("lib"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("libLLVM") {
            continue;
        }
        found = true;
        symlink(&entry.path(), &lib.join(&name))?;
        if name.starts_with(&format!("libLLVM.so.{LLVM_MAJOR}")) {
            symlink(&entry.path(), &lib.join("libLLVM.so"))?;
        }
    }
    if !found {
        bail!(
            "the nightly toolchain at {} ships no libLLVM to build bpf-linker against",
            sysroot.display()
        );
    }
    Ok(())
}

fn symlink(target: &Path, link: &Path) -> Result<()> {
    if std::fs::read_link(link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("symlinking {} -> {}", link.display(), target.display()))
}

fn bpffs() -> Result<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    if mounts.lines().any(|l| {
        l.split_whitespace().nth(1) == Some("/sys/fs/bpf")
            && l.split_whitespace().nth(2) == Some("bpf")
    }) {
        return Ok("mounted".into());
    }
    if !is_root() {
        bail!("/sys/fs/bpf is not a bpf filesystem; as root: mount -t bpf bpf /sys/fs/bpf");
    }
    let mut c = Command::new("mount");
    c.args(["-t", "bpf", "bpf", "/sys/fs/bpf"]);
    run(c)?;
    Ok("mounted now".into())
}

fn kernel() -> Result<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "kernel {release} has no BTF (/sys/kernel/btf/vmlinux); Weft needs Linux >= 5.15 with CONFIG_DEBUG_INFO_BTF"
        );
    }
    Ok(format!("{release} with BTF"))
}
