//! Command-line interface. flanneld's flag names are kept where they exist,
//! each also readable from `FLANNELD_<FLAG>`; Weft's own flags read `WEFT_<FLAG>`.

use std::{net::Ipv4Addr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    dataplane::{DEFAULT_PIN_DIR, HostRouting, XdpMode},
    lease::{DEFAULT_SUBNET_FILE, EtcdOptions},
};

/// Weft: an eBPF-accelerated VXLAN overlay network, compatible with flannel.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about, long_about = None)]
pub(crate) struct Cli {
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
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
        node: NodeArgs,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// List this node's pods as host routing knows them: each address,
    /// its Kubernetes pod (from the runtime's CNI_ARGS), container, device,
    /// who attached it (Weft's plugin, or the runtime's CNI cache: a pod
    /// flannel's plugin attached) and whether it is in the endpoint map.
    Endpoints {
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        pins: PinArgs,
        /// Where host-local records the addresses it gives pods.
        #[arg(
            long,
            env = "WEFT_CNI_IPAM_DIR",
            default_value = "/var/lib/cni/networks"
        )]
        cni_ipam_dir: PathBuf,
        /// libcni's cache directory (the container runtime's).
        #[arg(long, env = "WEFT_CNI_CACHE_DIR", default_value = crate::cni::DEFAULT_CACHE_DIR)]
        cni_cache_dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the dataplane's packet counters.
    Counters {
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Remove everything Weft set up on this node: programs, pinned maps,
    /// the overlay device and its routes, and put back the host settings it
    /// changed. The lease in etcd is left alone.
    Teardown {
        #[command(flatten)]
        pins: PinArgs,
        #[command(flatten)]
        state: StateArgs,
    },
    /// Install Weft's CNI plugin (this binary) and a network config on this
    /// node; the DaemonSet's init container runs it.
    InstallCni {
        #[command(flatten)]
        dirs: CniDirs,
        /// The network config (.conflist) to install; default: Weft's plugin
        /// standalone, as flannel's, plus portmap, network name cbr0.
        #[arg(long, env = "WEFT_CNI_CONFLIST")]
        conflist: Option<PathBuf>,
    },
    /// Check this node (kernel, bpffs, programs, rp_filter, offloads, MTU,
    /// VXLAN to every peer, subnet.env against etcd, the CNI config) and
    /// print the fix for each problem; non-zero exit when a check fails.
    Doctor {
        #[command(flatten)]
        node: NodeArgs,
        /// Where the runtime finds CNI network configs.
        #[arg(long, env = "WEFT_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
        cni_conf_dir: PathBuf,
        /// How long to wait for each peer's answer, in seconds.
        #[arg(long, default_value_t = 1.0)]
        probe_timeout: f64,
        /// Print the findings as one JSON document (for scripts and
        /// diagnostics bundles); the exit status is the same.
        #[arg(long)]
        json: bool,
    },
    /// Remove what install-cni put on this node.
    UninstallCni {
        #[command(flatten)]
        dirs: CniDirs,
    },
    /// What the DaemonSet's privileged init container does, so the agent
    /// needs no privilege: mount a bpf filesystem at --bpffs-root unless one
    /// is there, and install the agent's seccomp profile into
    /// --seccomp-dir (the kubelet's), if given.
    NodeInit {
        /// Where the host's bpf filesystem is (its pins outlive the pod).
        #[arg(long, default_value = "/sys/fs/bpf")]
        bpffs_root: PathBuf,
        /// The kubelet's seccomp profile directory, as mounted here.
        #[arg(long)]
        seccomp_dir: Option<PathBuf>,
    },
    /// Put back the programs an upgrade replaced (pinned as the previous
    /// generation), atomically in each link, within one map layout
    /// version; the running agent follows. Run it again to undo it.
    Rollback {
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Run each eBPF program of this binary on golden frames (encapsulation
    /// to each kind of peer, decapsulation, hostile frames) with maps of its
    /// own, and check verdicts, counters and every byte; non-zero exit when a
    /// case fails. Safe on a node carrying traffic: nothing is attached.
    Selftest {
        /// A mounted bpf filesystem for the test's private pins.
        #[arg(long, default_value = "/sys/fs/bpf")]
        bpffs_root: PathBuf,
        /// Also list the cases that pass.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Gather what a bug report needs from this node into one JSON
    /// document: version, kernel, status, doctor's findings, the leases,
    /// the pins, subnet.env and the agent's last log lines. Each part that
    /// cannot be read says why; nothing stops at the first.
    Bundle {
        #[command(flatten)]
        node: NodeArgs,
        /// Where the runtime finds CNI network configs (doctor's check).
        #[arg(long, env = "WEFT_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
        cni_conf_dir: PathBuf,
        /// Write the bundle here instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Change the running agent's log filter, without a restart (tracing's
    /// EnvFilter syntax: `debug`, `info,weft::dataplane=trace`); the next
    /// start takes --log-level again.
    LogLevel {
        /// The new filter.
        filter: String,
        #[command(flatten)]
        state: StateArgs,
    },
    /// Turn the running agent's drop trace on or off, without a restart:
    /// every packet the dataplane drops, with its reason and addresses, in
    /// the agent's log; the next start takes --trace-drops again.
    TraceDrops {
        #[arg(value_enum)]
        switch: OnOff,
        #[command(flatten)]
        state: StateArgs,
    },
    /// Print the shell completion script for `weft` (bash: `weft
    /// completions bash > /etc/bash_completion.d/weft`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a page of docs/reference/ as the code defines it (`cargo xtask
    /// docs` writes them; the test suite fails when they differ).
    #[command(hide = true)]
    Reference {
        #[arg(value_enum)]
        page: ReferencePage,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ReferencePage {
    /// Every command's flags and their environment variables.
    Flags,
    /// Every metric the agent exports.
    Metrics,
}

/// The environment variables Weft reads that are not a flag's.
pub(crate) const OTHER_ENV: [(&str, &str); 3] = [
    (
        "WEFT_CNI_ROOTS",
        "The CNI plugin: colon-separated absolute directories that its config's `stateDir`, `subnetFile` and `dataDir` may also lie under (besides /run/weft, /run/flannel and /var/lib/cni). Set in the runtime's environment: a network config cannot set it.",
    ),
    (
        "WEFT_PROC_SYS_NET",
        "Where the host's /proc/sys/net is mounted, for the sysctls the agent keeps set (the DaemonSet mounts it at /host/proc/sys/net, as an unprivileged container's own is read-only).",
    ),
    (
        "CNI_COMMAND",
        "Set by a container runtime: the binary runs as the CNI plugin (ADD, DEL, CHECK, STATUS, GC, VERSION), reading CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME and CNI_PATH as the CNI spec says.",
    ),
];

/// Where a node's agent keeps its state, and its etcd: what the commands
/// that look at a node read.
#[derive(Args, Debug, Clone)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The subnet file the agent writes.
    #[arg(long, env = "FLANNELD_SUBNET_FILE", default_value = DEFAULT_SUBNET_FILE)]
    pub subnet_file: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct CniDirs {
    /// Where the runtime finds CNI plugins.
    #[arg(long, env = "WEFT_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    pub bin_dir: PathBuf,
    /// Where the runtime finds CNI network configs.
    #[arg(long, env = "WEFT_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    pub conf_dir: PathBuf,
    /// The network config's file name.
    #[arg(long, env = "WEFT_CNI_CONF_NAME", default_value = "10-weft.conflist")]
    pub conf_name: String,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct EtcdArgs {
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
    pub(crate) fn options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            cafile: self.etcd_cafile.clone(),
            certfile: self.etcd_certfile.clone(),
            keyfile: self.etcd_keyfile.clone(),
            username: self.etcd_username.clone(),
            password: self.etcd_password.clone(),
            request_timeout: std::time::Duration::from_secs(self.etcd_timeout.max(1)),
        }
    }

    pub(crate) fn prefix(&self) -> String {
        self.etcd_prefix.trim_end_matches('/').to_string()
    }
}

#[derive(Args, Debug, Clone)]
pub(crate) struct PinArgs {
    /// Directory on a bpffs for this agent's pinned maps and links (one per
    /// agent; mounted if nothing is mounted there).
    #[arg(long, env = "WEFT_BPFFS_DIR", default_value = DEFAULT_PIN_DIR)]
    pub bpffs_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct StateArgs {
    /// Where the agent keeps its state: host settings it changed (restored
    /// by `weft teardown`) and its status for `weft status`.
    #[arg(long, env = "WEFT_STATE_DIR", default_value = "/run/weft")]
    pub(crate) state_dir: PathBuf,
}

/// A fault the programs can be loaded with (`--inject-fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Fault {
    /// Decapsulation drops what it would have decapsulated.
    Decap,
    /// The same on real devices only: the self-test passes, the check
    /// after the swap does not.
    DecapLive,
}

impl Fault {
    pub(crate) fn value(self) -> u32 {
        match self {
            Fault::Decap => dataplane_common::FAULT_DECAP,
            Fault::DecapLive => dataplane_common::FAULT_DECAP_LIVE,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DatapathKind {
    /// Control plane only: leases, subnet.env, no packet handling.
    None,
    /// The eBPF VXLAN datapath.
    Ebpf,
}

#[derive(Args, Debug)]
pub(crate) struct AgentArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Uplink interface, by name or by one of its IPv4 addresses; repeat
    /// (or separate with commas) to give alternatives, the first that exists
    /// wins. Default: see --iface-regex, --iface-can-reach, else the device
    /// of the default route.
    #[arg(long, env = "FLANNELD_IFACE", value_delimiter = ',')]
    pub iface: Vec<String>,
    /// Regular expression matched against every interface's IPv4 addresses,
    /// then against interface names, when no --iface is given; repeat to
    /// give alternatives, tried in order.
    #[arg(long, env = "FLANNELD_IFACE_REGEX")]
    pub iface_regex: Vec<String>,
    /// Use the interface (and its address) that the route to this address
    /// goes out of, when neither --iface nor --iface-regex is given.
    #[arg(long, env = "FLANNELD_IFACE_CAN_REACH")]
    pub iface_can_reach: Option<Ipv4Addr>,
    /// Public IP of this node, the VTEP address peers send to (default: the
    /// uplink's first IPv4 address).
    #[arg(long, env = "FLANNELD_PUBLIC_IP")]
    pub public_ip: Option<Ipv4Addr>,
    /// Public IPv6 address of this node, the IPv6 VTEP address, when the
    /// network has IPv6 (default: the uplink's first global IPv6 address).
    #[arg(long, env = "FLANNELD_PUBLIC_IPV6")]
    pub public_ipv6: Option<std::net::Ipv6Addr>,
    /// Where to write subnet.env for the CNI plugin.
    #[arg(long, env = "FLANNELD_SUBNET_FILE", default_value = DEFAULT_SUBNET_FILE)]
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
    #[arg(long, env = "WEFT_XDP_MODE", value_enum, default_value_t = XdpMode::Auto)]
    pub xdp_mode: XdpMode,
    /// How pods' traffic between nodes crosses the host: `auto` bypasses the
    /// host stack for flows conntrack has confirmed without NAT, `bpf` for
    /// all of it (netfilter no longer sees it), `legacy` never.
    #[arg(long, env = "WEFT_HOST_ROUTING", value_enum, default_value_t = HostRouting::Auto)]
    pub host_routing: HostRouting,
    /// Masquerade pods' traffic to destinations outside the cluster network
    /// (as flannel's --ip-masq: pod-to-pod traffic keeps its source).
    #[arg(long, env = "FLANNELD_IP_MASQ")]
    pub ip_masq: bool,
    /// Masquerade with random source ports rather than fully random ones.
    #[arg(long, env = "FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE")]
    pub ip_masq_fully_random_disable: bool,
    /// Accept forwarded traffic from and to the cluster network in
    /// iptables' FORWARD chain, whose policy may be DROP (as Docker sets
    /// it); `--iptables-forward-rules=false` leaves that chain alone.
    #[arg(long, env = "FLANNELD_IPTABLES_FORWARD_RULES", default_value_t = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub iptables_forward_rules: bool,
    /// The node's WireGuard private key (the wireguard backend), where
    /// flannel keeps it: read if it exists, made (0400) if not.
    #[arg(long, env = "WIREGUARD_KEY_FILE", default_value = crate::dataplane::wireguard::DEFAULT_KEY_FILE)]
    pub wireguard_key_file: PathBuf,
    /// Log every packet the dataplane drops, with the reason and the
    /// addresses (for debugging; `weft trace-drops on|off` switches it at
    /// run time; off, a drop costs one flag test more).
    #[arg(long, env = "WEFT_TRACE_DROPS")]
    pub trace_drops: bool,
    /// How often each peer is probed through the tunnel (continuous peer
    /// health), in seconds; longer where --peer-probe-rate needs it. 0
    /// turns the probes off.
    #[arg(long, env = "WEFT_PEER_PROBE_INTERVAL", default_value_t = 10.0,
          value_parser = probe_interval)]
    pub peer_probe_interval: f64,
    /// Probes a second this node sends at most (retries included): with
    /// many peers, each is probed less often instead.
    #[arg(long, env = "WEFT_PEER_PROBE_RATE", default_value_t = 20.0,
          value_parser = probe_rate)]
    pub peer_probe_rate: f64,
    /// Measure each IPv4 peer's path MTU through the tunnel and use it
    /// per peer (pods get the uplink's full overlay MTU; a path with a
    /// smaller hop gets its own, answered with ICMP). Off where
    /// `Backend.MTU` pins one MTU or the peer probes are off;
    /// `--path-mtu=false`: one overlay MTU for every peer, as flannel.
    #[arg(long, env = "WEFT_PATH_MTU", default_value_t = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub path_mtu: bool,
    /// Export each peer's reachability and round trip as series of their
    /// own (they grow with the square of the cluster; off: aggregates only).
    #[arg(long, env = "WEFT_PEER_METRICS")]
    pub peer_metrics: bool,
    /// Puts a fault into the programs on purpose, to prove that the
    /// self-test refuses them (tests of the upgrade gate only).
    #[arg(long, hide = true, value_enum)]
    pub inject_fault: Option<Fault>,
    /// Runs as if the kernel lacked this optional feature (`weft doctor`
    /// lists them), to test what the node does without it (tests only).
    #[arg(long, hide = true, value_name = "FEATURE")]
    pub kernel_feature_off: Vec<String>,
    /// Capacity of the peer maps: remote subnets this node can reach.
    /// Leases beyond it are not programmed (and reported).
    #[arg(long, env = "WEFT_MAX_PEERS", default_value_t = dataplane_common::MAX_PEERS,
          value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub max_peers: u32,
    #[command(flatten)]
    pub state: StateArgs,
    /// Where the CNI IPAM plugin (host-local) records the addresses it
    /// gives pods; read to tell when no pod holds an old subnet's address.
    #[arg(
        long,
        env = "WEFT_CNI_IPAM_DIR",
        default_value = "/var/lib/cni/networks"
    )]
    pub cni_ipam_dir: PathBuf,
    /// libcni's cache directory (the container runtime's): the results of
    /// attachments under `results/` show the pods Weft's plugin did not
    /// attach (flannel's, on a node moved from flannel), which are adopted
    /// for host routing.
    #[arg(long, env = "WEFT_CNI_CACHE_DIR", default_value = crate::cni::DEFAULT_CACHE_DIR)]
    pub cni_cache_dir: PathBuf,
    #[command(flatten)]
    pub pins: PinArgs,
    /// Address of the health and metrics server.
    #[arg(long, env = "FLANNELD_HEALTHZ_IP", default_value = "0.0.0.0")]
    pub healthz_ip: std::net::IpAddr,
    /// Port of the health and metrics server (/healthz, /readyz, /metrics);
    /// 0 disables it.
    #[arg(long, env = "FLANNELD_HEALTHZ_PORT", default_value_t = 0)]
    pub healthz_port: u16,
    /// Address of a listener of its own for /metrics (for Prometheus), so
    /// the health server can stay on loopback.
    #[arg(long, env = "WEFT_METRICS_IP", default_value = "0.0.0.0")]
    pub metrics_ip: std::net::IpAddr,
    /// Port of the /metrics listener; 0 (the default): none, /metrics is on
    /// the health server.
    #[arg(long, env = "WEFT_METRICS_PORT", default_value_t = 0)]
    pub metrics_port: u16,
    /// Seconds between retries when no subnet is free or the config is unusable.
    #[arg(long, env = "WEFT_RETRY_INTERVAL", default_value_t = 10)]
    pub retry_interval: u64,
}

fn probe_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v == 0.0 || (1.0..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err("0 (off) or between 1 and 3600 seconds".into())
    }
}

fn probe_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.1..=1000.0).contains(&v) {
        Ok(v)
    } else {
        Err("between 0.1 and 1000 probes a second".into())
    }
}
