//! Weft: an eBPF-accelerated VXLAN overlay network agent, wire- and
//! etcd-compatible with flannel's VXLAN backend.
//!
//! The binary is [`main`]. The `dataplane` and `lease` modules are also a
//! library for Weft's integration tests and benchmarks. flannel's formats
//! (the parsers of untrusted input, which the fuzz targets build alone) are
//! the `weft-formats` crate, re-exported in `lease`, `mac` and `wgkey`.

mod agent;
mod backoff;
mod checksum;
mod cli;
mod cni;
mod commands;
pub mod dataplane;
mod health;
mod http;
pub mod lease;
pub use weft_formats::mac;
mod metrics;
mod node;
pub mod peer;
mod pods;
mod report;
mod sys;
pub use weft_formats::wgkey;

use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Cli, Command, LogFormat};

/// The endpoints Weft's CNI plugin registered under `state_dir` (what the
/// agent programs for host routing), for tests and benchmarks that drive
/// the dataplane through the library.
pub fn endpoint_records(state_dir: &std::path::Path) -> Vec<dataplane::EndpointSpec> {
    cni::records(state_dir)
        .iter()
        .flat_map(|r| r.endpoints())
        .collect()
}

/// `weft`: parses the command line and runs the command.
pub fn main() -> ExitCode {
    // Run by a container runtime as a CNI plugin (the binary is installed
    // as /opt/cni/bin/weft too).
    if cni::invoked() {
        return cni::main();
    }
    sys::memory::tune_allocator();
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log_level);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weft: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The agent's fatal error goes to its log (which may be JSON, collected
    // with the rest); a command's, once, to the operator's terminal.
    let in_log = matches!(cli.command, Command::Agent(_));
    let result = rt.block_on(async {
        match cli.command {
            Command::Agent(args) => agent::run(*args).await,
            Command::Leases { etcd, json } => commands::leases(&etcd, json).await,
            Command::Counters { pins } => commands::counters(&pins),
            Command::Rollback { pins } => commands::rollback(&pins),
            Command::Status { node, json } => commands::status(&node, json).await,
            Command::Teardown { pins, state } => commands::teardown(&pins, &state).await,
            Command::InstallCni { dirs, conflist } => commands::install_cni(
                &dirs.bin_dir,
                &dirs.conf_dir,
                conflist.as_deref(),
                &dirs.conf_name,
            ),
            Command::Doctor {
                node,
                cni_conf_dir,
                probe_timeout,
                json,
            } => {
                commands::doctor(commands::DoctorArgs {
                    node: &node,
                    cni_conf_dir: &cni_conf_dir,
                    probe_timeout: std::time::Duration::from_secs_f64(
                        probe_timeout.clamp(0.05, 60.0),
                    ),
                    json,
                })
                .await
            }
            Command::UninstallCni { dirs } => {
                commands::uninstall_cni(&dirs.bin_dir, &dirs.conf_dir, &dirs.conf_name)
            }
            Command::NodeInit {
                bpffs_root,
                seccomp_dir,
            } => commands::node_init(&bpffs_root, seccomp_dir.as_deref()),
            Command::Selftest {
                bpffs_root,
                verbose,
            } => commands::selftest(&bpffs_root, verbose),
            Command::Bundle {
                node,
                cni_conf_dir,
                output,
            } => commands::bundle(&node, &cni_conf_dir, output.as_deref()).await,
            Command::LogLevel { filter, state } => commands::log_level(&state.state_dir, &filter),
            Command::Endpoints {
                state,
                pins,
                cni_ipam_dir,
                cni_cache_dir,
                json,
            } => commands::endpoints(
                &state.state_dir,
                &pins.bpffs_dir,
                &cni_ipam_dir,
                &cni_cache_dir,
                json,
            ),
            Command::TraceDrops { switch, state } => {
                commands::trace_drops(&state.state_dir, switch == cli::OnOff::On)
            }
            Command::Completions { shell } => {
                use clap::CommandFactory as _;
                clap_complete::generate(shell, &mut Cli::command(), "weft", &mut std::io::stdout());
                Ok(())
            }
            Command::Reference { page } => {
                print!("{}", commands::reference(page));
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if in_log {
                tracing::error!("{e:#}");
            } else {
                eprintln!("weft: error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The running process's log filter, to change while it runs (`weft
/// log-level`, through the agent's socket).
static LOG_FILTER: std::sync::OnceLock<
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
> = std::sync::OnceLock::new();

/// Replaces the log filter of this process (tracing's EnvFilter syntax).
pub(crate) fn set_log_filter(filter: &str) -> Result<(), String> {
    let f = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| format!("{filter:?} is not a log filter: {e}"))?;
    let handle = LOG_FILTER.get().ok_or("logging is not set up")?;
    handle.reload(f).map_err(|e| e.to_string())?;
    tracing::info!(filter, "log filter changed");
    Ok(())
}

/// The agent's last log lines, for `weft bundle` (through its socket): a
/// node's recent history wherever its log goes (a journal, a pod's log).
static LOG_TAIL: std::sync::Mutex<std::collections::VecDeque<String>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// How many lines [`LOG_TAIL`] keeps.
const LOG_TAIL_LINES: usize = 1000;

/// The last log lines, oldest first.
pub(crate) fn log_tail() -> Vec<String> {
    LOG_TAIL
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default()
}

/// The log's writer: stderr, and a copy of each line into [`LOG_TAIL`].
struct Tee;

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut t) = LOG_TAIL.lock() {
            for line in String::from_utf8_lossy(buf).lines() {
                if t.len() == LOG_TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line.to_string());
            }
        }
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn init_logging(format: LogFormat, filter: &str) {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("weft: bad --log-level {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let _ = LOG_FILTER.set(handle);
    use std::io::IsTerminal as _;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(|| Tee)
        .with_ansi(std::io::stderr().is_terminal());
    let registry = tracing_subscriber::registry().with(filter);
    // `init` also routes the `log` facade (the eBPF drop trace) into tracing.
    // JSON: one flat object per line (the event's fields beside `level`,
    // `target` and `timestamp`), as log collectors index them.
    match format {
        LogFormat::Text => registry.with(fmt).init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).init(),
    }
}
