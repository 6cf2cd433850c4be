use clap::{Parser, Subcommand};

/// Weft: an eBPF-accelerated VXLAN overlay network, compatible with flannel.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the dataplane's packet counters.
    Counters {
        /// The agent's bpffs directory.
        #[arg(long, env = "WEFT_BPFFS_DIR", default_value = weft::dataplane::bpffs::DEFAULT_DIR)]
        bpffs_dir: std::path::PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Counters { bpffs_dir } => {
            let pins = weft::dataplane::bpffs::PinDir::new(bpffs_dir);
            let counters = weft::dataplane::maps::Counters::open(&pins)?;
            for (reason, c) in counters.all()? {
                println!("{:<20} {:>12} {:>14}", reason.name(), c.packets, c.bytes);
            }
        }
    }
    Ok(())
}
