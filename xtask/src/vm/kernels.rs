//! The kernels the VM test runner boots: Debian's own packages, fetched
//! with `apt-get download` and unpacked with `dpkg-deb -x` into a cache of
//! ours. Nothing is installed on the host, so no initramfs or bootloader
//! hook runs, and the host's /lib/modules is never touched: virtme-ng
//! links the unpacked modules into the guest's /lib/modules.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::process::run;

/// A kernel series the runner knows: how its Debian package is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Series {
    /// What `--kernel` calls it.
    pub(crate) name: &'static str,
    /// The package name's prefix, before the ABI or patch number.
    prefix: &'static str,
    /// The package name's suffix, after it.
    suffix: &'static str,
    /// What this series is for in the matrix.
    pub(crate) role: &'static str,
    /// What the tests must find this kernel can do
    /// (`WEFT_TEST_KERNEL_EXPECT`, `name=value` by commas): the tests'
    /// own checks of the kernel fail where they find otherwise, so a
    /// kernel that lost a feature cannot turn a test of that feature into
    /// a test of its absence.
    pub(crate) expect: &'static str,
}

/// The series the matrix runs: Debian bookworm's two kernels (its own,
/// 6.1, which Weft refuses, and the backported LTS, 6.12).
pub(crate) const SERIES: [Series; 2] = [
    Series {
        name: "6.12",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64",
        role: "the supported kernel users run (netkit, WireGuard, conntrack as a module)",
        expect: "xdp_adjust_meta=yes,conntrack_kfuncs=module,netkit=yes",
    },
    Series {
        name: "6.1",
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64",
        role: "older than Weft supports: the agent must refuse it, saying why",
        expect: "netkit=no",
    },
];

pub(crate) fn series(name: &str) -> Result<Series> {
    SERIES
        .iter()
        .copied()
        .find(|s| s.name == name)
        .with_context(|| {
            format!(
                "no kernel series {name:?}; the runner knows {}",
                SERIES.map(|s| s.name).join(", ")
            )
        })
}

/// An unpacked kernel package.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    /// The package it came from.
    pub(crate) package: String,
    /// `uname -r` in the guest.
    pub(crate) release: String,
    /// The bootable image, `<root>/boot/vmlinuz-<release>`.
    pub(crate) image: PathBuf,
}

/// Where kernels are unpacked: one directory per package.
fn cache() -> PathBuf {
    crate::paths::home().join(".cache/weft/kernels")
}

/// The newest package of `series` that apt knows (by its number: the
/// ABI for 6.1, the patch level for 6.12).
fn newest_package(series: Series) -> Result<String> {
    let out = Command::new("apt-cache")
        .args(["pkgnames", series.prefix])
        .output()
        .context("running apt-cache")?;
    let number = |name: &str| -> Option<u32> {
        name.strip_prefix(series.prefix)?
            .strip_suffix(series.suffix)?
            .parse()
            .ok()
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|n| number(n).map(|v| (v, n.to_string())))
        .max()
        .map(|(_, n)| n)
        .with_context(|| {
            format!(
                "apt knows no package {}N{}: run `apt-get update`, and check that Debian bookworm's main and its updates are in the apt sources",
                series.prefix, series.suffix
            )
        })
}

/// The unpacked kernel of `series` in the cache, if there is one (the
/// newest, when several are).
pub(crate) fn cached(series: Series) -> Option<Kernel> {
    let mut found: Vec<Kernel> = std::fs::read_dir(cache())
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let package = e.file_name().to_string_lossy().into_owned();
            let rest = package
                .strip_prefix(series.prefix)?
                .strip_suffix(series.suffix)?;
            rest.parse::<u32>().ok()?;
            unpacked(&e.path(), &package)
        })
        .collect();
    found.sort_by_key(|k| {
        k.package
            .strip_prefix(series.prefix)
            .and_then(|r| r.strip_suffix(series.suffix))
            .and_then(|r| r.parse::<u32>().ok())
    });
    found.pop()
}

/// The kernel unpacked at `dir`, once its modules are indexed (the last
/// step of unpacking: a half-unpacked directory is not a kernel).
fn unpacked(dir: &Path, package: &str) -> Option<Kernel> {
    let boot = std::fs::read_dir(dir.join("boot")).ok()?;
    let image = boot.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
    })?;
    let release = image
        .file_name()?
        .to_string_lossy()
        .strip_prefix("vmlinuz-")?
        .to_string();
    dir.join("lib/modules")
        .join(&release)
        .join("modules.dep")
        .exists()
        .then(|| Kernel {
            package: package.to_string(),
            release,
            image,
        })
}

/// Fetches and unpacks the newest kernel of `series` unless the cache has
/// one: `apt-get download`, `dpkg-deb -x`, then `depmod` over the unpacked
/// tree (Debian's packages leave the module index to their install hook).
pub(crate) fn fetch(series: Series) -> Result<(Kernel, bool)> {
    if let Some(k) = cached(series) {
        return Ok((k, false));
    }
    // apt's lists may be missing or old on a machine that had every
    // package already: refresh them once, then ask again.
    let package = match newest_package(series) {
        Ok(p) => p,
        Err(_) => {
            let mut update = Command::new("apt-get");
            update.args(["update", "-qq"]);
            run(update).context("apt-get update, to find Debian's kernel packages")?;
            newest_package(series)?
        }
    };
    let cache = cache();
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs)?;
    eprintln!("vm: fetching {package} (about 100 MB)");
    let mut c = Command::new("apt-get");
    c.args(["download", "-qq", "-o", "APT::Sandbox::User=root", &package])
        .current_dir(&debs);
    run(c).with_context(|| format!("apt-get download {package}"))?;
    let deb = std::fs::read_dir(&debs)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
        })
        .with_context(|| {
            format!(
                "apt-get download left no {package}_*.deb in {}",
                debs.display()
            )
        })?;
    // Unpacked beside its final place, then renamed: an interrupted unpack
    // leaves no directory that looks like a kernel.
    let dir = cache.join(&package);
    let partial = cache.join(format!(".{package}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    let mut c = Command::new("dpkg-deb");
    c.arg("-x").arg(&deb).arg(&partial);
    run(c)?;
    let release = std::fs::read_dir(partial.join("lib/modules"))
        .with_context(|| format!("{package} has no lib/modules"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .with_context(|| format!("{package} has no module directory"))?;
    let mut c = Command::new("depmod");
    c.arg("-a").arg("-b").arg(&partial).arg(&release);
    run(c).context("depmod over the unpacked kernel (Debian's kmod)")?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    std::fs::remove_file(&deb)?;
    let kernel = unpacked(&dir, &package)
        .with_context(|| format!("{package} unpacked to {} has no vmlinuz-*", dir.display()))?;
    Ok((kernel, true))
}

/// `cargo xtask setup`'s step: every series of the matrix.
pub(crate) fn fetch_all() -> Result<String> {
    let mut said = vec![];
    for s in SERIES {
        let (k, fetched) = fetch(s)?;
        said.push(format!(
            "{} {}",
            k.release,
            if fetched { "fetched" } else { "present" }
        ));
    }
    if said.is_empty() {
        bail!("no kernel series");
    }
    Ok(said.join(", "))
}
