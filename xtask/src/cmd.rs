//! build, run, test, demo and bench.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs a command, echoing it, failing on a non-zero exit.
pub fn run(mut cmd: Command) -> Result<()> {
    eprintln!("+ {}", describe(&cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(&cmd));
    }
    Ok(())
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Builds the agent (and, through its build script, the eBPF programs).
pub fn build(release: bool) -> Result<PathBuf> {
    let mut c = cargo();
    c.args(["build", "--package", "weft"]);
    if release {
        c.arg("--release");
    }
    run(c)?;
    Ok(PathBuf::from("target")
        .join(if release { "release" } else { "debug" })
        .join("weft")
        .canonicalize()?)
}

pub fn exec(bin: &Path, args: &[String]) -> Result<()> {
    let mut c = Command::new(bin);
    c.args(args);
    run(c)
}

pub fn test(filter: Option<&str>) -> Result<()> {
    let started = Instant::now();
    let weft = build(false)?;

    let mut c = cargo();
    c.args(["fmt", "--all", "--check"]);
    run(c)?;
    let mut c = cargo();
    c.args([
        "fmt",
        "--check",
        "--manifest-path",
        "dataplane-ebpf/Cargo.toml",
    ]);
    run(c)?;

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

    let mut c = cargo();
    c.args(["test", "--workspace", "--locked", "--no-fail-fast"]);
    if let Some(f) = filter {
        c.args(["--", f]);
    }
    c.env("WEFT_BIN", &weft);
    run(c)?;
    eprintln!("xtask test: all green in {:.0?}", started.elapsed());
    Ok(())
}

pub fn demo(args: &[String]) -> Result<()> {
    let weft = build(true)?;
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "weft-tests",
        "--bin",
        "weft-demo",
        "--",
    ]);
    c.args(args);
    c.env("WEFT_BIN", &weft);
    run(c)
}

pub fn bench(args: &[String]) -> Result<()> {
    let weft = build(true)?;
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "weft-tests",
        "--bin",
        "weft-bench",
        "--",
    ]);
    c.args(args);
    c.env("WEFT_BIN", &weft);
    run(c)
}
