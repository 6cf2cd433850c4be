//! `cargo xtask`: Weft's developer commands.
//!
//! - `setup`: installs what building, testing and benchmarking need (idempotent)
//! - `build [--release]`: the eBPF programs and the agent, in one step
//! - `run -- ARGS`: build, then run `weft ARGS`
//! - `lint`: fmt and clippy, host and eBPF crates (no root needed)
//! - `test`: setup, build, lint, and every test (unit and privileged)
//! - `fuzz [--seconds N] [TARGET..]`: the fuzz targets, longer
//! - `demo`: setup, then a 3-node cluster in network namespaces, end to end
//! - `bench datapath|egress|leases|control-plane`: benchmarks, side by side with baselines
//! - `image`: the container image (a static binary, from scratch) as an OCI archive

mod cmd;
mod image;
mod setup;
mod toolchain;

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
    /// Setup, build, lint, all tests, and every fuzz target for 30 s.
    Test {
        /// Only run tests whose name contains this (and no fuzzing).
        filter: Option<String>,
        /// Skip `cargo xtask setup`.
        #[arg(long)]
        no_setup: bool,
        /// Seconds each fuzz target runs (0: none).
        #[arg(long, default_value_t = 30)]
        fuzz_seconds: u64,
    },
    /// Run the fuzz targets (all, or those named) for longer.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        targets: Vec<String>,
    },
    /// Setup, then a 3-node cluster in network namespaces, end to end.
    Demo {
        /// Skip `cargo xtask setup`.
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
            let bin = cmd::build(release)?;
            println!("built {}", bin.display());
            Ok(())
        }
        Command::Run { release, args } => {
            let bin = cmd::build(release)?;
            cmd::exec(&bin, &args)
        }
        Command::Test {
            filter,
            no_setup,
            fuzz_seconds,
        } => {
            if !no_setup {
                setup::setup()?;
            }
            cmd::test(filter.as_deref(), fuzz_seconds)
        }
        Command::Fuzz { seconds, targets } => {
            cmd::build(false)?;
            cmd::fuzz(&targets, seconds)
        }
        Command::Lint => cmd::lint(),
        Command::Demo { no_setup, args } => {
            if !no_setup {
                setup::setup()?;
            }
            cmd::tool("weft-demo", &args)
        }
        Command::Bench { args } => cmd::tool("weft-bench", &args),
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
