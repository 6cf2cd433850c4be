//! The integration tests' executables, built on the host: the guest runs
//! them as cargo would (from the tests crate's directory), over the host's
//! file system.

use std::{io::BufRead as _, path::PathBuf, process::Stdio};

use anyhow::{Context as _, Result, bail};

use crate::process::cargo;

/// A program the guest runs: a test target of the tests crate
/// (`tests/tests/<name>.rs`), or the benchmarks.
#[derive(Clone, Debug)]
pub(crate) struct TestBinary {
    pub(crate) name: String,
    pub(crate) executable: PathBuf,
    /// Its arguments (a test filter, a benchmark and its options).
    pub(crate) args: Vec<String>,
}

/// Builds the named test targets and returns their executables, in the
/// order named.
pub(crate) fn build(names: &[String]) -> Result<Vec<TestBinary>> {
    let mut c = cargo();
    c.args([
        "test",
        "--package",
        "weft-tests",
        "--locked",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    for n in names {
        c.args(["--test", n]);
    }
    eprintln!(
        "+ cargo test --package weft-tests --no-run --test {}",
        names.join(" --test ")
    );
    let mut child = c
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test --no-run")?;
    let mut found = vec![];
    for line in std::io::BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let (Some(name), Some(exe)) = (v["target"]["name"].as_str(), v["executable"].as_str())
        else {
            continue;
        };
        if v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"))
        {
            found.push(TestBinary {
                name: name.to_string(),
                executable: PathBuf::from(exe),
                args: vec![],
            });
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building the tests failed ({status})");
    }
    names
        .iter()
        .map(|n| {
            found
                .iter()
                .find(|b| &b.name == n)
                .cloned()
                .with_context(|| {
                    format!("no test target {n:?} in the tests crate (tests/tests/{n}.rs)")
                })
        })
        .collect()
}

/// The tests crate's directory: cargo runs integration tests from there.
pub(crate) fn tests_dir() -> Result<PathBuf> {
    std::fs::canonicalize("tests").context("the tests crate's directory")
}

/// Whether `name` is a test target of the tests crate.
pub(crate) fn exists(name: &str) -> bool {
    std::path::Path::new("tests/tests")
        .join(format!("{name}.rs"))
        .exists()
}

/// The tests given on the command line, checked.
pub(crate) fn check_names(names: &[String]) -> Result<()> {
    for n in names {
        if !exists(n) {
            bail!(
                "no test target {n:?}: the tests are the files of tests/tests/ (e.g. datapath, agent)"
            );
        }
    }
    Ok(())
}

/// Fails unless each of `tests` is a test of `binary` (asked with
/// `--list` on the host): with `--exact`, a renamed test would otherwise
/// silently leave the guest's run.
pub(crate) fn check_tests(binary: &TestBinary, tests: &[String]) -> Result<()> {
    let out = std::process::Command::new(&binary.executable)
        .args(["--list", "--format", "terse"])
        .output()
        .with_context(|| format!("listing the tests of {}", binary.name))?;
    let listed = String::from_utf8_lossy(&out.stdout);
    let have: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    for t in tests {
        if !have.contains(&t.as_str()) {
            bail!(
                "{} has no test {t:?}; it has: {}",
                binary.name,
                have.join(", ")
            );
        }
    }
    Ok(())
}

/// `weft-bench` in a release build, to run with `args`.
pub(crate) fn bench(args: &[String]) -> Result<TestBinary> {
    let mut c = cargo();
    c.args([
        "build",
        "--release",
        "--locked",
        "--package",
        "weft-tests",
        "--bin",
        "weft-bench",
    ]);
    crate::process::run(c)?;
    Ok(TestBinary {
        name: "bench".into(),
        executable: std::fs::canonicalize("target/release/weft-bench")?,
        args: args.to_vec(),
    })
}
