//! `cargo xtask image`: Weft's container image, from scratch.
//!
//! One file: a static `weft` (musl), which is the agent, the operator CLI
//! and the CNI plugin (`weft install-cni` copies it to the node). No base
//! image, no registry: buildah assembles it in a storage of its own under
//! `target/image/` and writes it out as an OCI archive.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::process::{cargo, run};

/// The static target.
pub(crate) const TARGET: &str = "x86_64-unknown-linux-musl";

/// The image's name; its tag is the workspace version.
const NAME: &str = "localhost/weft";

/// What `image` produced.
pub(crate) struct Image {
    /// `localhost/weft:<version>`.
    pub reference: String,
    pub archive: PathBuf,
}

/// The workspace version (`[workspace.package] version`).
fn version() -> Result<String> {
    let toml = std::fs::read_to_string("Cargo.toml")?;
    let mut in_package = false;
    for line in toml.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_package = l == "[workspace.package]";
        } else if in_package && let Some(v) = l.strip_prefix("version") {
            let v = v.trim().trim_start_matches('=').trim().trim_matches('"');
            return Ok(v.to_string());
        }
    }
    bail!("no version in [workspace.package] of Cargo.toml")
}

/// buildah confined to `target/image/` (vfs storage: no overlay mounts
/// needed, nothing shared with the host's own images).
fn buildah(dir: &Path) -> Command {
    let mut c = Command::new("buildah");
    c.env("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"));
    c
}

fn output(mut c: Command) -> Result<String> {
    let out = c.output().with_context(|| format!("starting {c:?}"))?;
    if !out.status.success() {
        bail!(
            "{c:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds the static binary and the image; returns where its archive is.
pub(crate) fn image() -> Result<Image> {
    let mut c = cargo();
    c.args([
        "build",
        "--release",
        "--locked",
        "--package",
        "weft",
        "--target",
        TARGET,
    ]);
    run(c)?;
    let bin = PathBuf::from("target")
        .join(TARGET)
        .join("release/weft")
        .canonicalize()?;
    check_static(&bin)?;

    let version = version()?;
    let dir = std::env::current_dir()?.join("target/image");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            dir.join("storage").display(),
            dir.join("run").display()
        ),
    )?;
    let reference = format!("{NAME}:{version}");
    let archive = dir.join(format!("weft-{version}.oci.tar"));

    let mut c = buildah(&dir);
    c.args(["from", "scratch"]);
    let ctr = output(c)?;
    let built = (|| -> Result<()> {
        let mut c = buildah(&dir);
        c.args(["copy", "--chmod", "0755", &ctr])
            .arg(&bin)
            .arg("/weft");
        run(c)?;
        let mut c = buildah(&dir);
        c.args([
            "config",
            "--entrypoint",
            r#"["/weft"]"#,
            "--cmd",
            "agent",
            "--env",
            "WEFT_LOG=info",
            "--label",
            &format!("org.opencontainers.image.version={version}"),
            "--label",
            "org.opencontainers.image.title=weft",
            "--label",
            "org.opencontainers.image.description=Weft: eBPF VXLAN overlay, flannel compatible",
            &ctr,
        ]);
        run(c)?;
        let mut c = buildah(&dir);
        c.args(["commit", "--format", "oci", "--rm", &ctr, &reference]);
        run(c)
    })();
    if built.is_err() {
        let mut c = buildah(&dir);
        c.args(["rm", &ctr]);
        let _ = c.output();
    }
    built?;
    let _ = std::fs::remove_file(&archive);
    let mut c = buildah(&dir);
    c.args(["push", &reference])
        .arg(format!("oci-archive:{}:{reference}", archive.display()));
    run(c)?;
    let size = std::fs::metadata(&archive)?.len();
    eprintln!(
        "xtask image: {reference} in {} ({:.1} MiB; the binary is {:.1} MiB)",
        archive.display(),
        size as f64 / (1 << 20) as f64,
        std::fs::metadata(&bin)?.len() as f64 / (1 << 20) as f64
    );
    Ok(Image { reference, archive })
}

/// The image has no libraries: the binary must need none, i.e. have no
/// PT_INTERP program header (no dynamic loader).
fn check_static(bin: &Path) -> Result<()> {
    let b = std::fs::read(bin)?;
    let u16_at = |o: usize| b.get(o..o + 2).map(|x| u16::from_le_bytes([x[0], x[1]]));
    let u64_at = |o: usize| {
        b.get(o..o + 8)
            .map(|x| u64::from_le_bytes(x.try_into().expect("8 bytes")))
    };
    if b.get(..5) != Some(b"\x7fELF\x02".as_slice()) {
        bail!("{} is not a 64-bit ELF", bin.display());
    }
    let (phoff, phentsize, phnum) = (
        u64_at(0x20).context("ELF header")? as usize,
        u16_at(0x36).context("ELF header")? as usize,
        u16_at(0x38).context("ELF header")? as usize,
    );
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let t = b
            .get(o..o + 4)
            .map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")))
            .context("program header")?;
        if t == PT_INTERP {
            bail!(
                "{} is not static: it asks for a dynamic loader",
                bin.display()
            );
        }
    }
    Ok(())
}
