//! build, run, test, demo and bench.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::process::{cargo, run, run_collecting_failures};

/// Where the time of a `cargo xtask test` went, printed at its end (the
/// part of a CI log a reader sees first).
#[derive(Default)]
struct Ledger {
    phases: Vec<(String, Duration)>,
    binaries: Vec<(String, Duration)>,
}

impl Ledger {
    fn phase<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.phases.push((name.to_string(), t.elapsed()));
        r
    }

    fn print(&self) {
        let line = |(n, d): &(String, Duration)| format!("{n} {:.0}s", d.as_secs_f64());
        eprintln!(
            "xtask test: time by phase: {}",
            self.phases.iter().map(line).collect::<Vec<_>>().join(", ")
        );
        let mut slow = self.binaries.clone();
        slow.sort_by_key(|b| std::cmp::Reverse(b.1));
        slow.truncate(12);
        eprintln!(
            "xtask test: slowest test binaries: {}",
            slow.iter().map(line).collect::<Vec<_>>().join(", ")
        );
    }
}

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

/// fmt and clippy on the host crates and on the eBPF crate (with its own
/// toolchain and target). Needs no root.
pub(crate) fn lint() -> Result<()> {
    let mut c = cargo();
    c.args(["fmt", "--all", "--check"]);
    run(c)?;
    crate::cycles::check(&[
        "agent/src",
        "dataplane-common/src",
        "dataplane-ebpf/src",
        "tests/src",
        "xtask/src",
    ])?;
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
    // The formats alone, as the fuzz targets build them.
    let mut c = cargo();
    c.args([
        "clippy",
        "--package",
        "weft",
        "--no-default-features",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]);
    run(c)?;
    let ebpf = Path::new("dataplane-ebpf");
    let channel = crate::toolchain::channel(ebpf)?;
    let mut c = ebpf_cargo(&channel);
    c.args(["fmt", "--check"]).current_dir(ebpf);
    run(c)?;
    let mut c = ebpf_cargo(&channel);
    c.args([
        "clippy",
        "--release",
        "--locked",
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
        "--target-dir",
        "../target/ebpf",
        "--",
        "-D",
        "warnings",
    ])
    .current_dir(ebpf);
    run(c)
}

/// cargo of the eBPF crate's toolchain.
fn ebpf_cargo(channel: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", channel, "cargo"]);
    // The outer (stable) cargo's settings must not leak in.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
    ] {
        c.env_remove(var);
    }
    c
}

pub(crate) fn test(filter: Option<&str>, fuzz_seconds: u64) -> Result<()> {
    let started = Instant::now();
    let mut ledger = Ledger::default();
    let weft = ledger.phase("build", || build(false))?;
    ledger.phase("lint", lint)?;
    ledger.phase("docs", || crate::docs::docs(&weft, true))?;
    // The image the image and manifest tests run.
    let image = ledger.phase("image", crate::image::image)?;

    let mut c = cargo();
    c.args(["test", "--workspace", "--locked", "--no-fail-fast", "--"]);
    if let Some(f) = filter {
        c.arg(f);
    }
    // This host's kernel has no netkit: the tests over netkit run in the
    // 6.12 VM of the kernel matrix (they fail where netkit is missing).
    c.args(["--skip", "over_netkit"]);
    // Nor WireGuard: the wireguard backend's tests run in the 6.12 VM too.
    c.args(["--skip", "over_wireguard"]);
    c.env("WEFT_BIN", &weft)
        .env("WEFT_IMAGE", &image.archive)
        .env("WEFT_IMAGE_REF", &image.reference)
        .env(
            "WEFT_KUBERNETES_VALIDATE",
            crate::paths::kubernetes_validate_bin(),
        )
        .env("WEFT_PROMTOOL", crate::paths::promtool_bin());
    let run = ledger.phase("tests", || run_collecting_failures(c));
    let (mut tests, mut failures) = (run.result, run.failures);
    ledger.binaries.extend(run.binaries);
    // The datapath tests again without host routing (the host-stack path:
    // what every packet took before it, and still takes when the fast path
    // cannot), and the agent's with pods attached without Weft's plugin
    // (adopted from the runtime's CNI cache, as on a node moved from
    // flannel).
    // The 60 s etcd outage is the control plane's, whatever the path and
    // the CNI chain: it runs once.
    let reruns: [(&str, &str, &[&str]); 2] = [
        (
            "WEFT_TEST_HOST_ROUTING",
            "legacy",
            &[
                "datapath",
                "datapath6",
                "mtu",
                "untrusted",
                "upgrade",
                "dual_stack",
                "agent",
            ],
        ),
        ("WEFT_TEST_CNI", "unchained", &["agent"]),
    ];
    for (var, value, files) in reruns {
        if filter.is_some() || tests.is_err() {
            break;
        }
        let mut c = cargo();
        c.args([
            "test",
            "--package",
            "weft-tests",
            "--locked",
            "--no-fail-fast",
        ]);
        for f in files {
            c.args(["--test", f]);
        }
        c.args(["--", "--skip", "etcd_outage_of_60_seconds"]);
        c.env("WEFT_BIN", &weft).env(var, value);
        let run = ledger.phase(&format!("{var}={value}"), || run_collecting_failures(c));
        tests = run
            .result
            .with_context(|| format!("the {} tests with {var}={value}", files.join(", ")));
        failures.extend(run.failures);
        ledger.binaries.extend(
            run.binaries
                .into_iter()
                .map(|(n, d)| (format!("{n} ({value})"), d)),
        );
    }
    // The kernel matrix: the privileged tests again on Debian's kernels,
    // each booted in a VM (KVM where it boots, else emulation). Run even
    // when a test failed here: both results are reported. The kernels boot
    // side by side: an emulated guest runs on one host thread, so two fill
    // this machine's two cores (6.1's short run used to wait for 6.12's).
    // Nothing else runs beside them: a guest under emulation is slow
    // enough.
    let mut kernels: Result<()> = Ok(());
    if filter.is_none() {
        let matrix = crate::vm::matrix();
        let started = Instant::now();
        let runs: Vec<(String, Result<crate::vm::Report>, Duration)> = std::thread::scope(|s| {
            let handles: Vec<_> = matrix
                .iter()
                .map(|opts| {
                    let weft = &weft;
                    s.spawn(move || {
                        let t = Instant::now();
                        let r = crate::vm::run(opts, weft);
                        (opts.name(), r, t.elapsed())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a VM runner thread panicked"))
                .collect()
        });
        for (kernel, r, took) in runs {
            ledger.phases.push((format!("vm {kernel}"), took));
            if r.is_ok() {
                eprintln!(
                    "xtask test: Linux {kernel} in a VM: {:.0?} (build, boot and tests)",
                    took
                );
            }
            match r {
                Ok(r) if r.ok() => {}
                Ok(r) => {
                    failures.extend(r.failures);
                    kernels = Err(anyhow::anyhow!("the tests failed on Linux {kernel}"));
                }
                Err(e) => {
                    failures.push(format!("vm {kernel}: {e:#}"));
                    kernels = Err(anyhow::anyhow!("the VM runner failed for Linux {kernel}"));
                }
            }
        }
        ledger
            .phases
            .push(("vm (side by side)".to_string(), started.elapsed()));
    }
    // The fuzzers run even when a test failed: both results are reported.
    let fuzzed = if filter.is_none() && fuzz_seconds > 0 {
        ledger.phase("fuzz", || fuzz(&[], fuzz_seconds))
    } else {
        Ok(())
    };
    // Repeated last, where a reader of the run's tail sees them.
    ledger.print();
    if !failures.is_empty() {
        eprintln!("xtask test: what failed:");
        for f in &failures {
            eprintln!("  {f}");
        }
    }
    tests?;
    kernels?;
    fuzzed?;
    eprintln!("xtask test: all green in {:.0?}", started.elapsed());
    Ok(())
}

/// The fuzz targets (`fuzz/fuzz_targets/`): the parsers of what untrusted
/// writers put into etcd or onto disk.
pub(crate) const FUZZ_TARGETS: [&str; 4] =
    ["lease_json", "network_config", "subnet_key", "subnet_env"];

/// Runs each of `targets` (all when empty) for `seconds` under libFuzzer,
/// starting from the committed seeds in `fuzz/seeds/<target>`. A crash
/// fails the run and leaves its input in `fuzz/artifacts/<target>/`.
pub(crate) fn fuzz(targets: &[String], seconds: u64) -> Result<()> {
    let all: Vec<String> = FUZZ_TARGETS.iter().map(|t| t.to_string()).collect();
    let targets = if targets.is_empty() { &all } else { targets };
    for t in targets {
        if !FUZZ_TARGETS.contains(&t.as_str()) {
            bail!(
                "no fuzz target {t:?}; there are {}",
                FUZZ_TARGETS.join(", ")
            );
        }
    }
    let channel = crate::toolchain::channel(Path::new("dataplane-ebpf"))?;
    let ebpf_object =
        std::fs::canonicalize("target/ebpf/bpfel-unknown-none/release/weft-dataplane").ok();
    for t in targets {
        let corpus = std::env::temp_dir().join(format!("weft-fuzz-{t}-{}", std::process::id()));
        std::fs::create_dir_all(&corpus)?;
        let mut c = ebpf_cargo(&channel);
        c.args(["fuzz", "run", "--fuzz-dir", "fuzz", t])
            .arg(&corpus)
            .arg(format!("fuzz/seeds/{t}"))
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-print_final_stats=1",
            ]);
        // The eBPF object the agent embeds is already built: reuse it.
        if let Some(o) = &ebpf_object {
            c.env("WEFT_EBPF_OBJECT", o);
        }
        // libFuzzer's progress goes to a log; its tail is shown on failure.
        let log = PathBuf::from("target/fuzz-logs").join(format!("{t}.log"));
        std::fs::create_dir_all("target/fuzz-logs")?;
        let file = std::fs::File::create(&log)?;
        c.stdout(file.try_clone()?).stderr(file);
        let r = run(c);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if r.is_ok() {
            let done = lines.iter().rev().find(|l| l.starts_with("Done "));
            eprintln!("fuzz {t}: {}", done.unwrap_or(&"done"));
        } else {
            for l in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{l}");
            }
        }
        let _ = std::fs::remove_dir_all(&corpus);
        r.with_context(|| format!("fuzz target {t} (a crashing input is in fuzz/artifacts/{t}/)"))?;
    }
    Ok(())
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
