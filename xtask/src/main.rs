//! `cargo xtask`: Weft's developer commands.
//!
//! - `setup`: installs what building, testing and benchmarking need (idempotent)
//! - `build [--release]`: the eBPF programs and the agent, in one step
//! - `run -- ARGS`: build, then run `weft ARGS`
//! - `test`: setup, build, fmt, clippy, and every test (unit and privileged)
//! - `demo`: a 3-node cluster in network namespaces, end to end
//! - `bench datapath|leases|control-plane`: benchmarks, side by side with baselines

mod cmd;
mod setup;

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
    /// Setup, build, fmt, clippy and all tests.
    Test {
        /// Only run tests whose name contains this.
        filter: Option<String>,
        /// Skip `cargo xtask setup`.
        #[arg(long)]
        no_setup: bool,
    },
    /// A 3-node cluster in network namespaces, end to end.
    Demo {
        #[arg(last = true)]
        args: Vec<String>,
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
        Command::Test { filter, no_setup } => {
            if !no_setup {
                setup::setup()?;
            }
            cmd::test(filter.as_deref())
        }
        Command::Demo { args } => cmd::demo(&args),
        Command::Bench { args } => cmd::bench(&args),
    }
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("xtask/ is in the workspace root")
        .to_path_buf()
}
