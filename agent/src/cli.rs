//! Command-line interface. flanneld's flag names are kept where they exist,
//! each also readable from `FLANNELD_<FLAG>`; Weft's own flags read `WEFT_<FLAG>`.

use std::{net::Ipv4Addr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{dataplane::bpffs, lease::subnet_file};

/// Weft: an eBPF-accelerated VXLAN overlay network, compatible with flannel.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "WEFT_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log filter (tracing's EnvFilter syntax, e.g. `info`, `weft=debug`).
    #[arg(long, global = true, default_value = "info", env = "WEFT_LOG")]
    pub log_level: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the node agent: acquire this node's subnet, program the dataplane,
    /// follow every other node's lease.
    Agent(Box<AgentArgs>),
    /// List every lease in etcd.
    Leases {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// This node at a glance: own lease, peers, attach points, counters.
    Status {
        #[command(flatten)]
        pins: PinArgs,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// The subnet file the agent writes.
        #[arg(long, env = "FLANNELD_SUBNET_FILE", default_value = subnet_file::DEFAULT_PATH)]
        subnet_file: PathBuf,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Print the dataplane's packet counters.
    Counters {
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Remove everything Weft set up on this node: programs, pinned maps,
    /// the overlay device and its routes. The lease in etcd is left alone.
    Teardown {
        #[command(flatten)]
        pins: PinArgs,
    },
}

#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// etcd endpoints, comma separated.
    #[arg(
        long,
        env = "FLANNELD_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of the network config and leases.
    #[arg(
        long,
        env = "FLANNELD_ETCD_PREFIX",
        default_value = "/coreos.com/network"
    )]
    pub etcd_prefix: String,
    /// CA certificate to verify etcd's certificate with.
    #[arg(long, env = "FLANNELD_ETCD_CAFILE")]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long, env = "FLANNELD_ETCD_CERTFILE")]
    pub etcd_certfile: Option<PathBuf>,
    /// Client key for etcd.
    #[arg(long, env = "FLANNELD_ETCD_KEYFILE")]
    pub etcd_keyfile: Option<PathBuf>,
    /// etcd user name.
    #[arg(long, env = "FLANNELD_ETCD_USERNAME")]
    pub etcd_username: Option<String>,
    /// etcd password.
    #[arg(long, env = "FLANNELD_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// Deadline of each etcd request, in seconds.
    #[arg(long, env = "WEFT_ETCD_TIMEOUT", default_value_t = 5)]
    pub etcd_timeout: u64,
}

impl EtcdArgs {
    pub fn options(&self) -> crate::lease::etcd::EtcdOptions {
        crate::lease::etcd::EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            cafile: self.etcd_cafile.clone(),
            certfile: self.etcd_certfile.clone(),
            keyfile: self.etcd_keyfile.clone(),
            username: self.etcd_username.clone(),
            password: self.etcd_password.clone(),
            request_timeout: std::time::Duration::from_secs(self.etcd_timeout.max(1)),
        }
    }

    pub fn prefix(&self) -> String {
        self.etcd_prefix.trim_end_matches('/').to_string()
    }
}

#[derive(Args, Debug, Clone)]
pub struct PinArgs {
    /// Directory on a bpffs for this agent's pinned maps and links (one per
    /// agent; mounted if nothing is mounted there).
    #[arg(long, env = "WEFT_BPFFS_DIR", default_value = bpffs::DEFAULT_DIR)]
    pub bpffs_dir: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DatapathKind {
    /// Control plane only: leases, subnet.env, no packet handling.
    None,
    /// The eBPF VXLAN datapath.
    Ebpf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum XdpModeArg {
    /// Native XDP if the driver has it, else generic XDP.
    Auto,
    Native,
    Generic,
    /// No XDP: decapsulate in TC on the uplink's ingress.
    Off,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Uplink interface (default: the device of the default route).
    #[arg(long, env = "FLANNELD_IFACE")]
    pub iface: Option<String>,
    /// Public IP of this node, the VTEP address peers send to (default: the
    /// uplink's first IPv4 address).
    #[arg(long, env = "FLANNELD_PUBLIC_IP")]
    pub public_ip: Option<Ipv4Addr>,
    /// Where to write subnet.env for the CNI plugin.
    #[arg(long, env = "FLANNELD_SUBNET_FILE", default_value = subnet_file::DEFAULT_PATH)]
    pub subnet_file: PathBuf,
    /// Warn when the lease has gone unrenewed so long that less than this
    /// many minutes of its TTL are left.
    #[arg(long, env = "FLANNELD_SUBNET_LEASE_RENEW_MARGIN", default_value_t = 60)]
    pub subnet_lease_renew_margin: u64,
    /// TTL of the etcd lease in seconds (flannel: 24 h).
    #[arg(long, env = "WEFT_SUBNET_LEASE_TTL", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(2..=31_536_000))]
    pub subnet_lease_ttl: u64,
    /// Stable id of this node (default: /etc/machine-id).
    #[arg(long, env = "WEFT_NODE_ID")]
    pub node_id: Option<String>,
    /// Packet datapath.
    #[arg(long, env = "WEFT_DATAPATH", value_enum, default_value_t = DatapathKind::Ebpf)]
    pub datapath: DatapathKind,
    /// Where decapsulation runs.
    #[arg(long, env = "WEFT_XDP_MODE", value_enum, default_value_t = XdpModeArg::Auto)]
    pub xdp_mode: XdpModeArg,
    #[command(flatten)]
    pub pins: PinArgs,
    /// Address of the health and metrics server.
    #[arg(long, env = "FLANNELD_HEALTHZ_IP", default_value = "0.0.0.0")]
    pub healthz_ip: std::net::IpAddr,
    /// Port of the health and metrics server (/healthz, /readyz, /metrics);
    /// 0 disables it.
    #[arg(long, env = "FLANNELD_HEALTHZ_PORT", default_value_t = 0)]
    pub healthz_port: u16,
    /// Seconds between retries when no subnet is free or the config is unusable.
    #[arg(long, env = "WEFT_RETRY_INTERVAL", default_value_t = 10)]
    pub retry_interval: u64,
}
