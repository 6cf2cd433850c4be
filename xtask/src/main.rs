//! `cargo xtask`: Weft's developer commands.
//!
//! - `setup`: installs what building, testing and benchmarking need (idempotent)
//! - `build [--release]`: the eBPF programs and the agent, in one step
//! - `run -- ARGS`: build, then run `weft ARGS`
//! - `lint`: fmt and clippy, host and eBPF crates (no root needed)
//! - `docs [--check]`: the generated reference pages written (or checked), links checked
//! - `test`: setup, build, lint, and every test (unit and privileged)
//! - `fuzz [--seconds N] [TARGET..]`: the fuzz targets, longer
//! - `demo`: the kernel checked, what the demo needs installed, then a 3-node cluster in network namespaces, end to end
//! - `vm-test [--kernel 6.12|6.1] [TESTS..]`: the privileged tests on another kernel, in a VM
//! - `vm-matrix`: the kernel matrix of `test` alone, its VMs side by side
//! - `vm-bench [--kernel 6.12] ARGS`: a benchmark in such a VM
//! - `bench datapath|egress|leases|control-plane`: benchmarks, side by side with baselines
//! - `image`: the container image (a static binary, from scratch) as an OCI archive

mod build;
mod cycles;
mod docs;
mod fuzz;
mod image;
mod lint;
mod paths;
mod process;
mod setup;
mod test;
mod toolchain;
mod vm;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Weft's developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the toolchain pieces, Debian packages and bpffs (idempotent).
    Setup,
    /// Build the eBPF programs and the agent with them embedded.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build, then run `weft ARGS` (usually as root).
    Run {
        #[arg(long)]
        release: bool,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// fmt and clippy on every crate, the eBPF one included (no root needed).
    Lint,
    /// Write docs/reference/ from the code (`--check`: fail where it
    /// differs), and check every relative link of the docs.
    Docs {
        #[arg(long)]
        check: bool,
    },
    /// Setup, build, lint, all tests, and every fuzz target for 12 s.
    Test {
        /// Only run tests whose name contains this (and no fuzzing).
        filter: Option<String>,
        /// Skip `cargo xtask setup`.
        #[arg(long)]
        no_setup: bool,
        /// Seconds each fuzz target runs (0: none).
        #[arg(long, default_value_t = 12)]
        fuzz_seconds: u64,
    },
    /// The privileged integration tests on one of Debian's kernels, booted
    /// under qemu (KVM where it boots, else emulation).
    VmTest {
        /// The kernel series: 6.12 or 6.1.
        #[arg(long, default_value = "6.12")]
        kernel: String,
        /// kvm, tcg (emulation), or auto: KVM if the kernel boots under it.
        #[arg(long, value_enum, default_value_t = vm::qemu::AccelChoice::Auto)]
        accel: vm::qemu::AccelChoice,
        /// The tests' deadline factor (default 1.5 under KVM, 6 under
        /// emulation).
        #[arg(long)]
        time_scale: Option<f64>,
        #[arg(long, default_value_t = 2)]
        cpus: u32,
        #[arg(long, default_value = "4G")]
        memory: String,
        /// Minutes the VM may run, boot to power-off.
        #[arg(long, default_value_t = 30)]
        minutes: u64,
        /// Only the tests whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Test targets (files of tests/tests/); the kernel's matrix entry
        /// when none.
        tests: Vec<String>,
    },
    /// The kernel matrix of `test` alone: its VMs side by side, as there.
    VmMatrix,
    /// `cargo xtask bench ARGS` in a VM of one of Debian's kernels (with
    /// KVM its ratios are worth reading; under emulation it is a smoke run).
    VmBench {
        /// The kernel series: 6.12 or 6.1.
        #[arg(long, default_value = "6.12")]
        kernel: String,
        #[arg(long, value_enum, default_value_t = vm::qemu::AccelChoice::Auto)]
        accel: vm::qemu::AccelChoice,
        #[arg(long, default_value_t = 2)]
        cpus: u32,
        #[arg(long, default_value = "4G")]
        memory: String,
        /// Minutes the VM may run, boot to power-off.
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// The benchmark and its options, as for `cargo xtask bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
    /// Run the fuzz targets (all, or those named) for longer.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        targets: Vec<String>,
    },
    /// Check the kernel, install what the demo needs (not the test
    /// toolchain), then a 3-node cluster in network namespaces, end to end.
    Demo {
        /// Skip the checks and installs.
        #[arg(long)]
        no_setup: bool,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Setup, then the container image: a static weft, from scratch, saved
    /// as an OCI archive under target/image/.
    Image {
        /// Skip `cargo xtask setup`.
        #[arg(long)]
        no_setup: bool,
    },
    /// Benchmarks (release build): `datapath`, `leases`, `control-plane`.
    Bench {
        #[arg(last = false, trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match cli.command {
        Command::Setup => setup::setup(),
        Command::Build { release } => {
            let bin = build::build(release)?;
            println!("built {}", bin.display());
            Ok(())
        }
        Command::Run { release, args } => {
            let bin = build::build(release)?;
            build::exec(&bin, &args)
        }
        Command::Test {
            filter,
            no_setup,
            fuzz_seconds,
        } => {
            if !no_setup {
                setup::setup()?;
            }
            test::test(filter.as_deref(), fuzz_seconds)
        }
        Command::Fuzz { seconds, targets } => {
            build::build(false)?;
            fuzz::fuzz(&targets, seconds)
        }
        Command::Lint => lint::lint(),
        Command::Docs { check } => {
            let weft = build::build(false)?;
            docs::docs(&weft, check)
        }
        Command::Demo { no_setup, args } => {
            if !no_setup {
                setup::demo()?;
            }
            build::tool("weft-demo", &args)
        }
        Command::VmTest {
            kernel,
            accel,
            time_scale,
            cpus,
            memory,
            minutes,
            filter,
            tests,
        } => {
            let weft = build::build(false)?;
            // The kernel's tests in the matrix, all in one VM.
            let mut opts = vm::Options::new(&kernel, &[]);
            for o in vm::matrix().into_iter().filter(|o| o.kernel == kernel) {
                for t in o.tests {
                    merge_test(&mut opts.tests, &t);
                }
                opts.env.extend(o.env);
            }
            if !tests.is_empty() {
                opts.tests = tests;
            }
            opts.accel = accel;
            opts.time_scale = time_scale;
            opts.cpus = cpus;
            opts.memory = memory;
            opts.filter = filter;
            opts.timeout = std::time::Duration::from_secs(minutes * 60);
            vm::run_or_fail(&opts, &weft, "the tests")
        }
        Command::VmMatrix => {
            let weft = build::build(false)?;
            let side = test::vm_matrix(&weft)?;
            for (n, d) in &side.phases {
                eprintln!("xtask vm-matrix: {n} {:.0}s", d.as_secs_f64());
            }
            for f in &side.failures {
                eprintln!("  {f}");
            }
            side.kernels
        }
        Command::VmBench {
            kernel,
            accel,
            cpus,
            memory,
            minutes,
            args,
        } => {
            let weft = build::build(true)?;
            let mut opts = vm::Options::new(&kernel, &[]);
            opts.bench = Some(args);
            opts.accel = accel;
            opts.cpus = cpus;
            opts.memory = memory;
            opts.timeout = std::time::Duration::from_secs(minutes * 60);
            vm::run_or_fail(&opts, &weft, "the benchmark")
        }
        Command::Bench { args } => build::tool("weft-bench", &args),
        Command::Image { no_setup } => {
            if !no_setup {
                setup::setup()?;
            }
            image::image().map(|_| ())
        }
    }
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("xtask/ is in the workspace root")
        .to_path_buf()
}

/// Adds `FILE[:TEST,...]` to `tests`, where the matrix names one file in
/// two of its VMs: one run of the file, with both lists of tests (or the
/// whole file, where either names no tests), so that one VM runs each
/// file once.
fn merge_test(tests: &mut Vec<String>, t: &str) {
    let (file, names) = t.split_once(':').map_or((t, None), |(f, n)| (f, Some(n)));
    let Some(i) = tests.iter().position(|x| x.split(':').next() == Some(file)) else {
        tests.push(t.to_string());
        return;
    };
    tests[i] = match (tests[i].split_once(':'), names) {
        (Some((_, old)), Some(new)) => format!("{file}:{old},{new}"),
        _ => file.to_string(),
    };
}

#[cfg(test)]
mod merge_tests {
    use super::merge_test;

    #[test]
    fn a_file_named_twice_runs_once_with_both_lists() {
        let mut t = vec![];
        for x in ["a:x,y", "b", "a:z", "b:w", "c:v"] {
            merge_test(&mut t, x);
        }
        assert_eq!(t, ["a:x,y,z", "b", "c:v"]);
    }
}
