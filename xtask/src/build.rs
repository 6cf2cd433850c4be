//! `build`, `run`, `demo` and `bench`: the agent built, and the tests
//! crate's programs run with it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use crate::process::{cargo, run};

/// Builds the agent (and, through its build script, the eBPF programs).
pub(crate) fn build(release: bool) -> Result<PathBuf> {
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

pub(crate) fn exec(bin: &Path, args: &[String]) -> Result<()> {
    let mut c = Command::new(bin);
    c.args(args);
    run(c)
}

/// Runs one of the tests crate's programs (`weft-demo`, `weft-bench`) in a
/// release build, with the release `weft` binary.
pub(crate) fn tool(name: &str, args: &[String]) -> Result<()> {
    let weft = build(true)?;
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "weft-tests",
        "--bin",
        name,
        "--",
    ]);
    c.args(args);
    c.env("WEFT_BIN", &weft);
    run(c)
}
