//! Running commands: cargo as the one running xtask, and a command echoed
//! and checked, or run with its test failures and timings collected.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs a command, echoing it, failing on a non-zero exit.
pub(crate) fn run(mut cmd: Command) -> Result<()> {
    eprintln!("+ {}", describe(&cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(&cmd));
    }
    Ok(())
}

/// What a run of `cargo test` left: its outcome, the lines that name a
/// failed test (`test x ... FAILED`) and cargo's own errors, and how long
/// each test binary ran.
pub(crate) struct TestRun {
    pub(crate) result: Result<()>,
    pub(crate) failures: Vec<String>,
    /// Each binary (`tests/x.rs`, `unittests src/main.rs`) and its time,
    /// from its `Running` line to the next one (cargo runs them one after
    /// another).
    pub(crate) binaries: Vec<(String, Duration)>,
}

/// Runs a command like [`run`], echoing its output as it comes, and
/// collects a [`TestRun`], so that a long run can end by repeating its
/// failures and its slowest parts.
pub(crate) fn run_collecting_failures(mut cmd: Command) -> TestRun {
    use std::io::{BufRead as _, BufReader, Write as _};
    eprintln!("+ {}", describe(&cmd));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return TestRun {
                result: Err(e).context(format!("starting {}", describe(&cmd))),
                failures: vec![],
                binaries: vec![],
            };
        }
    };
    let interesting = |l: &str| {
        (l.starts_with("test ") && l.ends_with("FAILED"))
            || l.starts_with("error: ")
            || l.contains("panicked at")
    };
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let from_stderr = std::thread::spawn(move || {
        let mut found = vec![];
        let mut started: Vec<(String, Instant)> = vec![];
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{l}");
            if interesting(&l) {
                found.push(l.clone());
            }
            if let Some(rest) = l.trim_start().strip_prefix("Running ") {
                let name = rest.split(" (").next().unwrap_or(rest).to_string();
                started.push((name, Instant::now()));
            }
        }
        let end = Instant::now();
        let mut binaries = vec![];
        for (i, (name, at)) in started.iter().enumerate() {
            let next = started.get(i + 1).map_or(end, |(_, t)| *t);
            binaries.push((name.clone(), next - *at));
        }
        (found, binaries)
    });
    let mut found = vec![];
    let stdout = std::io::stdout();
    for l in BufReader::new(out).lines().map_while(Result::ok) {
        let _ = writeln!(stdout.lock(), "{l}");
        if interesting(&l) {
            found.push(l);
        }
    }
    let (from_err, binaries) = from_stderr.join().unwrap_or_default();
    found.extend(from_err);
    let result = match child.wait() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(anyhow::anyhow!("`{}` failed ({s})", describe(&cmd))),
        Err(e) => Err(e.into()),
    };
    TestRun {
        result,
        failures: found,
        binaries,
    }
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program().to_string_lossy().into_owned())
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}
