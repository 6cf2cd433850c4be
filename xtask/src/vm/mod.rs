//! The VM test runner: Debian's kernels booted under qemu (virtme-ng, over
//! the host's root file system, read-only), the privileged integration
//! tests run inside as built on the host, their output and results
//! brought back.
//!
//! The tests do not know where they run. What emulation stretches, the
//! runner scales: it sets `WEFT_TEST_TIME_SCALE`, by which the tests'
//! helpers multiply their deadlines.

pub(crate) mod binaries;
pub(crate) mod kernels;
pub(crate) mod qemu;

use std::{
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Result;

use self::{
    binaries::TestBinary,
    qemu::{Accel, AccelChoice, BOOTED, Boot},
};

/// What one VM run is asked to do.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The kernel series (`6.12`, `6.1`).
    pub(crate) kernel: String,
    pub(crate) accel: AccelChoice,
    /// Deadline factor for the tests; by default 1.5 under KVM, 6 under
    /// emulation.
    pub(crate) time_scale: Option<f64>,
    pub(crate) cpus: u32,
    pub(crate) memory: String,
    /// Test targets of the tests crate, run one after the other.
    pub(crate) tests: Vec<String>,
    /// Passed to each test binary (a test name filter).
    pub(crate) filter: Option<String>,
    /// Instead of the tests: `weft-bench` with these arguments (a release
    /// build, with the release agent).
    pub(crate) bench: Option<Vec<String>>,
    /// More environment for the tests.
    pub(crate) env: Vec<(String, String)>,
    /// The whole VM run, boot to power-off.
    pub(crate) timeout: Duration,
    /// Which of the kernel's VMs this is, where the matrix splits one
    /// kernel's tests over two VMs that run side by side.
    pub(crate) part: Option<&'static str>,
}

impl Options {
    pub(crate) fn new(kernel: &str, tests: &[&str]) -> Self {
        Self {
            kernel: kernel.to_string(),
            accel: AccelChoice::Auto,
            time_scale: None,
            cpus: 2,
            memory: "4G".into(),
            tests: tests.iter().map(|t| t.to_string()).collect(),
            filter: None,
            bench: None,
            env: vec![],
            timeout: Duration::from_secs(30 * 60),
            part: None,
        }
    }

    /// The VM's name: the kernel, and its part of the matrix if any.
    pub(crate) fn name(&self) -> String {
        match self.part {
            Some(p) => format!("{} {p}", self.kernel),
            None => self.kernel.clone(),
        }
    }

    fn part(mut self, part: &'static str) -> Self {
        self.part = Some(part);
        self
    }
}

/// What a VM run found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Lines naming what failed (a test's own `... FAILED` and panics, a
    /// test binary's exit, a VM that did not boot), prefixed by the kernel.
    pub(crate) failures: Vec<String>,
    pub(crate) took: Duration,
}

impl Report {
    pub(crate) fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// A VM run made ready on the host: its kernel fetched, its test
/// binaries built. Booting it needs no cargo, so it can run beside a
/// `cargo test` of the host.
pub(crate) struct Prepared {
    opts: Options,
    kernel: kernels::Kernel,
    tests: Vec<TestBinary>,
}

impl Prepared {
    pub(crate) fn opts(&self) -> &Options {
        &self.opts
    }
}

/// Boots the kernel of `opts` and runs its tests there with `weft` (the
/// agent binary built on the host).
pub(crate) fn run(opts: &Options, weft: &Path) -> Result<Report> {
    let started = Instant::now();
    let mut r = run_prepared(&prepare(opts)?, weft)?;
    r.took = started.elapsed();
    Ok(r)
}

/// Fetches the kernel of `opts` and builds its test binaries.
pub(crate) fn prepare(opts: &Options) -> Result<Prepared> {
    let series = kernels::series(&opts.kernel)?;
    let (kernel, _) = kernels::fetch(series)?;
    let tests = match &opts.bench {
        Some(args) => vec![binaries::bench(args)?],
        None => {
            // `file` or `file:test,test`: a file's tests, or those named.
            let (files, only): (Vec<String>, Vec<Vec<String>>) = opts
                .tests
                .iter()
                .map(|t| match t.split_once(':') {
                    Some((f, names)) => (
                        f.to_string(),
                        names.split(',').map(str::to_string).collect(),
                    ),
                    None => (t.clone(), vec![]),
                })
                .unzip();
            binaries::check_names(&files)?;
            let mut tests = binaries::build(&files)?;
            for (t, only) in tests.iter_mut().zip(only) {
                if only.is_empty() {
                    t.args.extend(opts.filter.clone());
                } else {
                    // libtest runs what matches any filter; exact names.
                    binaries::check_tests(t, &only)?;
                    t.args.extend(only);
                    t.args.push("--exact".into());
                }
            }
            tests
        }
    };
    Ok(Prepared {
        opts: opts.clone(),
        kernel,
        tests,
    })
}

/// Boots a [`prepare`]d VM and runs its tests there with `weft`.
pub(crate) fn run_prepared(p: &Prepared, weft: &Path) -> Result<Report> {
    let started = Instant::now();
    let (opts, kernel, tests) = (&p.opts, &p.kernel, &p.tests);
    let scratch = std::fs::canonicalize("target")?.join("vm");
    let dir = scratch.join(opts.name().replace(' ', "-"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let accel = qemu::accel(opts.accel, kernel, &scratch)?;
    let scale = opts.time_scale.unwrap_or(match accel {
        Accel::Kvm => 1.5,
        Accel::Tcg => 6.0,
    });
    let label = format!("vm {}", opts.name());
    eprintln!(
        "{label}: {} ({}) under {}, {} CPUs, {} memory, deadlines x{scale}: {}",
        kernel.release,
        kernel.package,
        accel.name(),
        opts.cpus,
        opts.memory,
        tests
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let script = dir.join("guest.sh");
    std::fs::write(&script, guest_script(opts, weft, tests, &dir, scale)?)?;
    let mut follow = Follow::new(&label, &dir, tests);
    let ended = Boot {
        kernel,
        accel,
        cpus: opts.cpus,
        memory: &opts.memory,
        dir: &dir,
        script: &script,
        boot_timeout: match accel {
            Accel::Kvm => Duration::from_secs(60),
            Accel::Tcg => Duration::from_secs(180),
        },
        timeout: opts.timeout,
    }
    .run(|| follow.tick())?;

    let mut report = Report {
        failures: follow.failures,
        took: Duration::ZERO,
    };
    if !ended.booted {
        eprintln!(
            "{label}: the VM did not boot{}; its console:\n{}",
            ended
                .stopped
                .as_deref()
                .map(|w| format!(" ({w})"))
                .unwrap_or_default(),
            qemu::console_tail(&ended.console, 80)
        );
        report.failures.push(format!(
            "{label}: {} did not boot under {} (console: {})",
            kernel.release,
            accel.name(),
            ended.console.display()
        ));
    } else {
        for t in tests {
            let status = std::fs::read_to_string(dir.join(format!("{}.status", t.name)));
            let timing = std::fs::read_to_string(dir.join(format!("{}.seconds", t.name)))
                .unwrap_or_default();
            match status.map(|s| s.trim().to_string()) {
                Ok(s) if s == "0" => {
                    eprintln!("{label}: {} passed in {} s", t.name, timing.trim());
                }
                Ok(s) => report.failures.push(format!(
                    "{label}: {} failed (exit {s}, {} s; its output: {})",
                    t.name,
                    timing.trim(),
                    dir.join(format!("{}.log", t.name)).display()
                )),
                Err(_) => report.failures.push(format!(
                    "{label}: {} did not finish{}",
                    t.name,
                    ended
                        .stopped
                        .as_deref()
                        .map(|w| format!(": {w}"))
                        .unwrap_or_default()
                )),
            }
        }
        if ended.stopped.is_some() {
            eprintln!(
                "{label}: the VM was stopped; its console's tail:\n{}",
                qemu::console_tail(&ended.console, 40)
            );
        }
    }
    report.took = started.elapsed();
    eprintln!(
        "{label}: {} in {:.0?} under {}",
        if report.ok() { "all green" } else { "FAILED" },
        ended.took,
        accel.name()
    );
    Ok(report)
}

/// [`run`], its failures listed and the run failed if any (`what`: what
/// ran, for the message).
pub(crate) fn run_or_fail(opts: &Options, weft: &Path, what: &str) -> Result<()> {
    let report = run(opts, weft)?;
    if !report.ok() {
        for f in &report.failures {
            eprintln!("  {f}");
        }
        anyhow::bail!("{what} in the {} VM failed", opts.name());
    }
    Ok(())
}

/// Quotes `s` for the guest's shell.
fn sh(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn guest_script(
    opts: &Options,
    weft: &Path,
    tests: &[TestBinary],
    dir: &Path,
    scale: f64,
) -> Result<String> {
    let d = sh(&dir.display().to_string());
    let mut s = String::new();
    s.push_str("set -u\n");
    s.push_str(&format!("uname -r > {d}/{BOOTED}\n"));
    s.push_str("mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf\n");
    s.push_str("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root RUST_BACKTRACE=1\n");
    s.push_str(&format!(
        "export WEFT_BIN={} WEFT_TEST_TIME_SCALE={scale}\n",
        sh(&weft.display().to_string())
    ));
    s.push_str(&format!(
        "export WEFT_TEST_KERNEL_EXPECT={}\n",
        sh(kernels::series(&opts.kernel)?.expect)
    ));
    for (k, v) in &opts.env {
        s.push_str(&format!("export {k}={}\n", sh(v)));
    }
    s.push_str(&format!(
        "cd {}\n",
        sh(&binaries::tests_dir()?.display().to_string())
    ));
    for t in tests {
        let n = &t.name;
        let args: Vec<String> = t.args.iter().map(|a| sh(a)).collect();
        s.push_str(&format!(
            "t0=$(date +%s)\n{} {} > {d}/{n}.log 2>&1\necho $? > {d}/{n}.status.tmp\necho $(( $(date +%s) - t0 )) > {d}/{n}.seconds\nmv {d}/{n}.status.tmp {d}/{n}.status\n",
            sh(&t.executable.display().to_string()),
            args.join(" "),
        ));
    }
    s.push_str("sync\n");
    Ok(s)
}

/// Echoes the tests' output as the guest writes it, each line prefixed,
/// and keeps the lines that name a failure.
struct Follow {
    label: String,
    logs: Vec<(PathBuf, u64, Vec<u8>)>,
    failures: Vec<String>,
}

impl Follow {
    fn new(label: &str, dir: &Path, tests: &[TestBinary]) -> Self {
        Self {
            label: label.to_string(),
            logs: tests
                .iter()
                .map(|t| (dir.join(format!("{}.log", t.name)), 0, vec![]))
                .collect(),
            failures: vec![],
        }
    }

    fn tick(&mut self) {
        let stdout = std::io::stdout();
        for (path, offset, partial) in &mut self.logs {
            let Ok(mut f) = std::fs::File::open(&*path) else {
                continue;
            };
            if f.seek(SeekFrom::Start(*offset)).is_err() {
                continue;
            }
            let mut buf = vec![];
            if f.read_to_end(&mut buf).is_err() || buf.is_empty() {
                continue;
            }
            *offset += buf.len() as u64;
            partial.extend_from_slice(&buf);
            while let Some(nl) = partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                let _ = writeln!(stdout.lock(), "{}| {line}", self.label);
                if (line.starts_with("test ") && line.ends_with("FAILED"))
                    || line.contains("panicked at")
                {
                    self.failures.push(format!("{}: {line}", self.label));
                }
            }
        }
    }
}

/// The kernel matrix of `cargo xtask test`: each kernel with what it must
/// show. The agent's own tests run on the host three times (as they are, on
/// the host stack, with adopted pods) and the agent runs on 6.12 in
/// `kernel_support`; under emulation on a busy day they took 10 minutes
/// there, so they stay out of the matrix (`cargo xtask vm-test agent`).
pub(crate) fn matrix() -> Vec<Options> {
    // Several VMs of about five minutes each (under emulation), so that
    // two lanes end close together: `cargo xtask test` runs them one after
    // the other in a lane beside the host's tests, and in two once those
    // are over. Each boot costs about 18 s.
    vec![
        // What depends on the kernel: its check (which also sees `auto`
        // warn where conntrack is a module), encapsulation, decapsulation
        // by XDP and TC, the checks on hostile and oversized packets, outer
        // fragments reassembled by the kernel's vxlan device, interop with
        // that device, and `auto`'s source check without bypass there. The
        // rest runs on the host: under emulation here the bulk transfers
        // of datapath alone took 2-4 minutes, host_routing 9.5 and
        // dual_stack more than 10.
        Options::new(
            "6.12",
            &[
                // First, before anything else loads conntrack: the agent
                // loads the module itself, calls its kfuncs through the
                // module's BTF, and holds it.
                "conntrack_module",
                "kernel_support",
                "datapath:every_pod_reaches_every_other_pod_and_nodes_reach_remote_pods,\
                 tc_decapsulation_fallback_carries_traffic_too,\
                 hostile_packets_are_dropped_and_counted,\
                 oversized_packets_get_icmp_or_a_counted_drop,\
                 interop_with_a_flannel_node_using_the_kernel_vxlan_device,\
                 vxlan_that_arrives_as_fragments_is_reassembled_checked_and_counted",
                // Pods made by containerd's CRI take the fast path with
                // the module's kfuncs, as on a Debian kubelet.
                "cri:pods_made_through_cri_reach_each_other_across_nodes",
            ],
        ),
        // flannel's wireguard backend (the host's kernel has no WireGuard),
        // its fast path under auto's conntrack gate.
        Options::new("6.12", &["wireguard"]).part("wireguard"),
        // A switch between the backends, both ways: nothing of the old one
        // left.
        Options::new("6.12", &["backend_switch"]).part("backend-switch"),
        // conntrack kept true by flows on the fast path, with the module's
        // kfuncs.
        Options::new("6.12", &["long_flows"]).part("long-flows"),
        Options::new(
            "6.12",
            &[
                // auto's fast path with conntrack a module: its source
                // check, its share of a flow, XDP's frame mark.
                "host_routing:spoofed_sources_never_leave_the_node_under_auto,\
                 the_fast_path_carries_at_least_99_percent_of_a_flow,\
                 host_routing_after_xdp_decapsulation",
                // The kernel features as probed: this kernel lets XDP mark
                // its frames (the host's refuses bpf_xdp_adjust_meta), has
                // netkit, and conntrack as a module; the mark turned off
                // where the kernel has it (netkit turned off: the
                // programs VM).
                "kernel_features:the_agent_reports_what_this_kernel_refuses_and_says_it_once,\
                 without_the_xdp_mark_frames_xdp_decapsulates_take_the_host_stack",
            ],
        )
        .part("host-routing"),
        // The programs that call the module's kfuncs: their golden frames,
        // and an upgrade refused, swapped and rolled back under traffic;
        // exact endpoints (here, not beside the share of a flow on the
        // fast path, which a neighbour's load on two emulated CPUs
        // lowers).
        Options::new(
            "6.12",
            &[
                "selftest:every_program_passes_its_golden_frames",
                "host_routing:endpoints_follow_pods",
                "program_upgrade:a_faulty_upgrade_is_refused_a_good_one_swapped_and_rolled_back_without_loss",
                // netkit turned off on a kernel that has it: here, not
                // beside the netkit VM's cluster, whose fast-path share
                // two clusters at once on two emulated CPUs starve.
                "netkit:with_netkit_off_a_netkit_add_is_refused_and_veth_pods_carry_traffic",
            ],
        )
        .part("programs"),
        // netkit pods: the host's kernel has none.
        Options::new(
            "6.12",
            &["netkit:netkit_pods_beside_veth_pods_over_netkit,\
               a_netkit_add_that_cannot_work_fails_clearly_and_leaves_nothing"],
        )
        .part("netkit"),
        Options::new("6.1", &["kernel_support"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_quoted_for_the_guest_shell() {
        assert_eq!(sh("a b"), "'a b'");
        assert_eq!(sh("it's"), r"'it'\''s'");
    }
}
