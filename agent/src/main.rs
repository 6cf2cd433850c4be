use std::process::ExitCode;

use clap::Parser as _;
use weft::cli::{Cli, Command, LogFormat};

fn main() -> ExitCode {
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
    let result = rt.block_on(async {
        match cli.command {
            Command::Agent(args) => weft::agent::run(*args).await,
            Command::Leases { etcd, json } => weft::commands::leases(&etcd, json).await,
            Command::Counters { pins } => weft::commands::counters(&pins),
            Command::Status {
                pins,
                etcd,
                subnet_file,
                json,
            } => weft::status::run(&pins, &etcd, &subnet_file, json).await,
            Command::Teardown { pins } => weft::commands::teardown(&pins).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("weft: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("weft: bad --log-level {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
