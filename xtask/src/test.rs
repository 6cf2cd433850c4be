//! `test`: everything CI runs, in order, its time accounted by phase.

use std::{
    collections::VecDeque,
    path::Path,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::process::{cargo, run_collecting_failures};

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

/// Everything CI runs. The host's phases run one after the other; the
/// kernel matrix's VMs and the fuzzers run in [`Lanes`] beside them: one
/// lane from the start (the host's tests mostly wait, on etcd, timers and
/// packets: they kept a quarter of this machine's two cores busy), a
/// second once the host's phases are over.
pub(crate) fn test(filter: Option<&str>, fuzz_seconds: u64) -> Result<()> {
    let started = Instant::now();
    let mut ledger = Ledger::default();
    let weft = ledger.phase("build", || {
        crate::build::build(false).and_then(|b| frozen(&b))
    })?;
    ledger.phase("lint", crate::lint::lint)?;
    ledger.phase("docs", || crate::docs::docs(&weft, true))?;
    // The VMs are made ready (kernels fetched, test binaries built) before
    // anything runs beside them: cargo is not called from a lane.
    let lanes = match filter {
        Some(_) => Lanes::new(vec![]),
        None => Lanes::new(ledger.phase("vm binaries", || jobs(fuzz_seconds))?),
    };
    let lanes_started = Instant::now();
    let (tests, mut failures) = std::thread::scope(|s| {
        s.spawn(|| lanes.lane(&weft));
        let host = host_phases(&mut ledger, &weft, filter);
        if host.2 {
            // Nothing was tested: the VMs wait for a run that can be.
            lanes.queue.lock().expect("the job queue").clear();
        }
        s.spawn(|| lanes.lane(&weft));
        (host.0, host.1)
    });
    ledger.phases.push((
        "vm and fuzz (beside the host's phases)".to_string(),
        lanes_started.elapsed(),
    ));
    let side = lanes.finish();
    ledger.phases.extend(side.phases);
    failures.extend(side.failures);
    // Repeated last, where a reader of the run's tail sees them.
    ledger.print();
    if !failures.is_empty() {
        eprintln!("xtask test: what failed:");
        for f in &failures {
            eprintln!("  {f}");
        }
    }
    tests?;
    side.kernels?;
    side.fuzzed?;
    eprintln!("xtask test: all green in {:.0?}", started.elapsed());
    Ok(())
}

/// A copy of the agent binary `built` that no later cargo run replaces:
/// `cargo test --workspace` links `target/debug/weft` again (its features
/// unified with the tests'), and a VM lane that starts an agent while it
/// does runs a half-written file.
fn frozen(built: &Path) -> Result<std::path::PathBuf> {
    let dir = std::fs::canonicalize("target")?.join("under-test");
    std::fs::create_dir_all(&dir)?;
    let to = dir.join("weft");
    let part = dir.join("weft.partial");
    std::fs::copy(built, &part)
        .with_context(|| format!("copying {} to {}", built.display(), part.display()))?;
    std::fs::rename(&part, &to)?;
    Ok(to)
}

/// The host's phases: the image, the tests, the reruns. Returns the tests'
/// result, what failed, and whether the image failed (and nothing ran).
fn host_phases(
    ledger: &mut Ledger,
    weft: &Path,
    filter: Option<&str>,
) -> (Result<()>, Vec<String>, bool) {
    // The image the image and manifest tests run.
    let image = match ledger.phase("image", crate::image::image) {
        Ok(i) => i,
        Err(e) => return (Err(e), vec!["the image".into()], true),
    };
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
    c.env("WEFT_BIN", weft)
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
        c.env("WEFT_BIN", weft).env(var, value);
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
    (tests, failures, false)
}

/// One job of [`Lanes`].
enum Job {
    Vm(Box<crate::vm::Prepared>),
    Fuzz(u64),
}

/// The kernel matrix's VMs made ready, then the fuzzers (`fuzz_seconds` per
/// target, if any).
fn jobs(fuzz_seconds: u64) -> Result<Vec<Job>> {
    let mut jobs = vec![];
    for opts in crate::vm::matrix() {
        jobs.push(Job::Vm(Box::new(crate::vm::prepare(&opts)?)));
    }
    if fuzz_seconds > 0 {
        jobs.push(Job::Fuzz(fuzz_seconds));
    }
    Ok(jobs)
}

/// Jobs taken in order by lanes (threads): each lane takes the next job
/// when its last one ends. An emulated guest runs on one host thread, so a
/// lane is one core's work.
pub(crate) struct Lanes {
    queue: Mutex<VecDeque<Job>>,
    done: Mutex<Vec<Done>>,
}

/// A job that ran: its name, its outcome (a VM's report) and its time.
type Done = (String, Result<Option<crate::vm::Report>>, Duration);

/// What [`Lanes`] ran: each job's time, what failed, and the results of
/// the kernels and of the fuzzers.
pub(crate) struct SideBySide {
    pub(crate) phases: Vec<(String, Duration)>,
    pub(crate) failures: Vec<String>,
    pub(crate) kernels: Result<()>,
    pub(crate) fuzzed: Result<()>,
}

impl Lanes {
    fn new(jobs: Vec<Job>) -> Self {
        Self {
            queue: Mutex::new(jobs.into()),
            done: Mutex::new(vec![]),
        }
    }

    /// Takes jobs until none is left.
    fn lane(&self, weft: &Path) {
        loop {
            let Some(job) = self.queue.lock().expect("the job queue").pop_front() else {
                return;
            };
            let t = Instant::now();
            let (name, r) = match &job {
                Job::Vm(p) => (
                    format!("vm {}", p.opts().name()),
                    crate::vm::run_prepared(p, weft).map(Some),
                ),
                Job::Fuzz(secs) => (
                    "fuzz".to_string(),
                    crate::fuzz::fuzz(&[], *secs).map(|()| None),
                ),
            };
            let took = t.elapsed();
            if let Ok(Some(r)) = &r
                && r.ok()
            {
                eprintln!("xtask test: {name}: all green in {took:.0?} (boot and tests)");
            }
            self.done.lock().expect("the results").push((name, r, took));
        }
    }

    /// What the lanes ran, once they are over.
    fn finish(self) -> SideBySide {
        let mut out = SideBySide {
            phases: vec![],
            failures: vec![],
            kernels: Ok(()),
            fuzzed: Ok(()),
        };
        for (name, r, took) in self.done.into_inner().expect("the results") {
            out.phases.push((name.clone(), took));
            match r {
                Ok(Some(r)) if !r.ok() => {
                    out.failures.extend(r.failures);
                    out.kernels = Err(anyhow::anyhow!("the tests failed in {name}"));
                }
                Ok(_) => {}
                Err(e) if name == "fuzz" => {
                    out.failures.push(format!("fuzz: {e:#}"));
                    out.fuzzed = Err(e);
                }
                Err(e) => {
                    out.failures.push(format!("{name}: {e:#}"));
                    out.kernels = Err(anyhow::anyhow!("the VM runner failed for {name}"));
                }
            }
        }
        out
    }
}

/// The kernel matrix alone (`cargo xtask vm-matrix`): its VMs in two lanes.
pub(crate) fn vm_matrix(weft: &Path) -> Result<SideBySide> {
    let lanes = Lanes::new(jobs(0)?);
    std::thread::scope(|s| {
        s.spawn(|| lanes.lane(weft));
        s.spawn(|| lanes.lane(weft));
    });
    Ok(lanes.finish())
}
