//! `cargo xtask setup`: everything a fresh Debian machine needs to build,
//! test and benchmark Weft. Each step checks first and only acts when
//! something is missing, so a second run takes seconds.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    paths::{home, kubernetes_validate_bin, promtool_bin, venv_bin},
    process::run,
    toolchain,
};

/// Debian packages: the build (protoc and the protobuf well-known types for
/// etcd-client), the tests (etcd, iproute2, tcpdump/tshark, scapy,
/// nftables, openssl for test certificates, the CNI plugins pods are
/// attached with, podman with its CNI backend and runc, containerd for
/// pods made through CRI as the kubelet makes them, a static busybox for a
/// container's root), the image (buildah, musl-tools for the static
/// binary's C parts), manifest checks (yamllint, python3-venv for
/// kubernetes-validate), conntrack (the tests read conntrack's entries)
/// the benchmarks (iperf3, sockperf, bpftool, perf, ethtool) and the VM
/// test runner (qemu, kmod's depmod for the guest kernels' modules), and
/// `wg` (wireguard-tools) for the flannel-style WireGuard node of the
/// wireguard tests.
const PACKAGES: &[&str] = &[
    "protobuf-compiler",
    "libprotobuf-dev",
    "containernetworking-plugins",
    "podman",
    "runc",
    "containerd",
    "conmon",
    "busybox-static",
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
    "conntrack",
    "openssl",
    "buildah",
    "musl-tools",
    "yamllint",
    "python3-venv",
    "ethtool",
    "linux-perf",
    "qemu-system-x86",
    "kmod",
    "wireguard-tools",
];

/// What `cargo xtask demo` needs of them: the build, etcd and etcdctl, the
/// pods' CNI plugins, ip, ping, iperf3, ps, modprobe. The rest stays with
/// `cargo xtask test`.
const DEMO_PACKAGES: &[&str] = &[
    "protobuf-compiler",
    "libprotobuf-dev",
    "containernetworking-plugins",
    "etcd-server",
    "etcd-client",
    "iproute2",
    "iputils-ping",
    "procps",
    "iperf3",
    "kmod",
];

const BPF_LINKER_VERSION: &str = "0.13.0";
const CARGO_FUZZ_VERSION: &str = "0.13.1";

pub(crate) fn setup() -> Result<()> {
    let started = Instant::now();
    step("Debian packages", || debian_packages(PACKAGES))?;
    step("nightly toolchain with rust-src", nightly_rust_src)?;
    step("the recorded nightly", nightly_recorded)?;
    step("bpf-linker", bpf_linker)?;
    step("cargo-fuzz", cargo_fuzz)?;
    step("the static (musl) target", musl_target)?;
    step("kubernetes-validate", kubernetes_validate)?;
    step("virtme-ng", virtme_ng)?;
    step("promtool", promtool)?;
    step("VM kernels", crate::vm::kernels::fetch_all)?;
    step("bpffs at /sys/fs/bpf", bpffs)?;
    step("kernel", kernel)?;
    eprintln!("setup: done in {:.1?}", started.elapsed());
    Ok(())
}

/// What `cargo xtask demo` needs, checking first what no install can fix
/// (root, Debian, the kernel), so a machine that cannot run Weft is told
/// at once rather than after the whole test toolchain is installed.
pub(crate) fn demo() -> Result<()> {
    let started = Instant::now();
    if !is_root() {
        bail!("the demo makes network namespaces and loads eBPF programs: run it as root");
    }
    if Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "dpkg-query not found: cargo xtask demo installs with apt on Debian; elsewhere install {} and run `cargo xtask demo --no-setup`",
            DEMO_PACKAGES.join(" ")
        );
    }
    step("kernel", kernel)?;
    eprintln!(
        "setup (demo): Debian packages {}, the nightly toolchain's rust-src and bpf-linker, if missing",
        DEMO_PACKAGES.join(" ")
    );
    step("Debian packages", || debian_packages(DEMO_PACKAGES))?;
    step("nightly toolchain with rust-src", nightly_rust_src)?;
    step("the recorded nightly", nightly_recorded)?;
    step("bpf-linker", bpf_linker)?;
    step("bpffs at /sys/fs/bpf", bpffs)?;
    eprintln!("setup (demo): done in {:.1?}", started.elapsed());
    Ok(())
}

fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
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

fn debian_packages(packages: &[&str]) -> Result<String> {
    if Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "dpkg-query not found: this is not a Debian-like system. Install by hand: {}",
            packages.join(" ")
        );
    }
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${Status}\n"])
        .args(packages)
        .output()
        .context("running dpkg-query")?;
    let listed = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !listed
                .lines()
                .any(|l| l.starts_with(&format!("{p} ")) && l.ends_with("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(format!("all {} present", packages.len()));
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

fn ebpf_dir() -> PathBuf {
    PathBuf::from("dataplane-ebpf")
}

fn nightly_sysroot() -> Result<PathBuf> {
    let channel = toolchain::channel(&ebpf_dir())?;
    let out = Command::new("rustup")
        .args(["run", &channel, "rustc", "--print", "sysroot"])
        .output()
        .context("running rustup")?;
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
    let channel = toolchain::channel(&ebpf_dir())?;
    let mut c = Command::new("rustup");
    c.args(["component", "add", "rust-src", "--toolchain", &channel]);
    run(c)?;
    Ok("installed rust-src".into())
}

fn nightly_recorded() -> Result<String> {
    let r = toolchain::rustc(&ebpf_dir())?;
    toolchain::check(&r)?;
    Ok(format!(
        "rustc {} ({}), LLVM {}",
        r.release, r.commit_date, r.llvm_major
    ))
}

/// bpf-linker links against the libLLVM that ships inside the nightly
/// toolchain (same LLVM major as its rustc). Its binary looks for the library
/// in `~/.cache/llvm<major>/lib` (its runpath), where we keep symlinks.
fn bpf_linker() -> Result<String> {
    let sysroot = nightly_sysroot()?;
    let llvm = toolchain::rustc(&ebpf_dir())?.llvm_major;
    let prefix = home().join(format!(".cache/llvm{llvm}"));
    link_llvm(&sysroot, &prefix.join("lib"), llvm)?;

    if let Ok(out) = Command::new("bpf-linker").arg("--version").output()
        && out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains(BPF_LINKER_VERSION)
    {
        return Ok(format!("{BPF_LINKER_VERSION} present"));
    }
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against nightly's LLVM {llvm} (about 2 minutes)"
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
        &format!("llvm-{llvm}"),
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

/// cargo-fuzz, which runs the fuzz targets under libFuzzer (with the
/// nightly toolchain: sanitizers need it).
fn cargo_fuzz() -> Result<String> {
    if let Ok(out) = Command::new("cargo-fuzz").arg("--version").output()
        && out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains(CARGO_FUZZ_VERSION)
    {
        return Ok(format!("{CARGO_FUZZ_VERSION} present"));
    }
    eprintln!("setup: building cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)");
    let mut c = Command::new("cargo");
    c.args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
        "--force",
    ])
    .current_dir(std::env::temp_dir());
    run(c)?;
    Ok(format!("built {CARGO_FUZZ_VERSION}"))
}

/// Symlinks every libLLVM of the nightly toolchain into `lib`, under both
/// names bpf-linker's build and runtime look for.
fn link_llvm(sysroot: &Path, lib: &Path, llvm: u32) -> Result<()> {
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
        if name.starts_with(&format!("libLLVM.so.{llvm}")) {
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
    kernel_fits(&release, Path::new("/sys/kernel/btf/vmlinux").exists())
}

/// Whether a kernel of `release` (with BTF or not) can run Weft.
fn kernel_fits(release: &str, btf: bool) -> Result<String> {
    // TC programs attach through TCX links, which Linux 6.6 introduced.
    let version: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|p| p.parse().ok())
        .collect();
    if version.len() == 2 && (version[0], version[1]) < (6, 6) {
        bail!(
            "kernel {release} is older than 6.6: Weft attaches its TC programs through TCX links (Linux >= 6.6 with CONFIG_DEBUG_INFO_BTF; Debian bookworm's backports kernel, or trixie, has one)"
        );
    }
    if !btf {
        bail!(
            "kernel {release} has no BTF (/sys/kernel/btf/vmlinux); Weft needs Linux >= 6.6 with CONFIG_DEBUG_INFO_BTF"
        );
    }
    Ok(format!("{release} with BTF"))
}

/// The target the image's static binary is built for.
fn musl_target() -> Result<String> {
    let target = crate::image::TARGET;
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup")?;
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        return Ok("present".into());
    }
    let mut c = Command::new("rustup");
    c.args(["target", "add", target]);
    run(c)?;
    Ok(format!("installed {target}"))
}

/// PyPI's kubernetes-validate (the Kubernetes API schemas, offline), in a
/// virtualenv of its own; the tests run it from there.
pub(crate) const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

fn kubernetes_validate() -> Result<String> {
    pip_package(
        "kubernetes-validate",
        KUBERNETES_VALIDATE_VERSION,
        &kubernetes_validate_bin(),
    )
}

/// PyPI's virtme-ng, which boots a kernel over the host's root file system
/// (read-only) for the VM test runner; in the same virtualenv.
pub(crate) const VIRTME_NG_VERSION: &str = "1.42";

fn virtme_ng() -> Result<String> {
    pip_package("virtme-ng", VIRTME_NG_VERSION, &venv_bin().join("vng"))
}

/// Prometheus's `promtool` (the tests check the agent's scrape with
/// `promtool check metrics`): taken out of Debian's `prometheus` package
/// rather than installing it, which would start a Prometheus server.
fn promtool() -> Result<String> {
    let bin = promtool_bin();
    if Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok("present".into());
    }
    let dir = home().join(".cache/weft/prometheus-deb");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let download = || {
        let mut c = Command::new("apt-get");
        c.args(["download", "-qq", "prometheus"]).current_dir(&dir);
        run(c)
    };
    if download().is_err() {
        let mut update = Command::new("apt-get");
        update.args(["update", "-qq"]);
        run(update)
            .context("apt-get update failed: check the machine's apt sources and network")?;
        download().context("apt-get download prometheus")?;
    }
    let deb = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let tree = dir.join("tree");
    let mut x = Command::new("dpkg-deb");
    x.arg("-x").arg(&deb).arg(&tree);
    run(x)?;
    std::fs::create_dir_all(bin.parent().context("promtool path")?)?;
    std::fs::copy(tree.join("usr/bin/promtool"), &bin)
        .with_context(|| format!("installing {}", bin.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "installed {} from {}",
        bin.display(),
        deb.file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// `package==version` from PyPI in the project's virtualenv (made with
/// Debian's python), unless `bin` is there and pip has that version.
fn pip_package(package: &str, version: &str, bin: &Path) -> Result<String> {
    let venv = venv_bin();
    let venv = venv.parent().context("venv path")?;
    let pip = venv.join("bin/pip");
    if let Ok(out) = Command::new(&pip).args(["show", package]).output()
        && String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == format!("Version: {version}"))
        && bin.exists()
    {
        return Ok("present".into());
    }
    if !venv.join("bin/python").exists() {
        // Debian's python (python3-venv), whatever else is on PATH.
        let mut c = Command::new("/usr/bin/python3");
        c.args(["-m", "venv"]).arg(venv);
        run(c).context("python3 -m venv")?;
    }
    let mut c = Command::new(&pip);
    c.args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("{package}=={version}"),
    ]);
    run(c).with_context(|| format!("installing {package} from PyPI"))?;
    Ok(format!("installed {version} in {}", venv.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_check_refuses_what_weft_cannot_run_on() {
        assert!(kernel_fits("6.1.0-57-amd64", true).is_err());
        assert!(kernel_fits("5.15.0", true).is_err());
        assert!(kernel_fits("6.12.118+deb12-amd64", false).is_err());
        assert!(kernel_fits("6.6.0", true).is_ok());
        assert!(kernel_fits("6.18.44-fc-v1300", true).is_ok());
    }
}
