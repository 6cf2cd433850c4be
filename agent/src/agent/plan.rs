//! What this node runs as, decided before anything runs: what the host
//! has ([`Host`], probed through netlink) and what the agent makes of it
//! with the network config ([`NodePlan::build`], pure, unit-tested): the
//! identity and lease value it writes, the VTEP MACs, and the dataplane's
//! spec.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cli::{AgentArgs, DatapathKind},
    dataplane::{
        DataplaneSpec, Link, Netlink, PinDir, ProgramKernel,
        wireguard::{PrivateKey, WgSpec},
    },
    lease::{Identity, LeaseAttrs, NetworkConfig, Timing},
    mac::MacAddr,
    node,
};

/// What the host has, as far as the plan needs it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Host {
    pub(crate) node_id: String,
    /// The uplink (None: `--datapath none` with only `--public-ip` given).
    pub(crate) uplink: Option<Link>,
    /// The uplink's IPv4 address (or `--public-ip`).
    pub(crate) public_ip: Option<Ipv4Addr>,
    /// The IPv6 VTEP address, once the config says the network has IPv6.
    pub(crate) public_ipv6: Option<Ipv6Addr>,
    /// The MACs of flannel's devices for the network's VNI, on a node
    /// moving from flannel (`flannel.<VNI>`, `flannel-v6.<VNI>`).
    pub(crate) flannel_mac: Option<MacAddr>,
    pub(crate) flannel6_mac: Option<MacAddr>,
    /// What the kernel lets the programs do (its probes).
    pub(crate) kernel: ProgramKernel,
}

impl Host {
    /// The node id and the uplink, chosen before etcd is reached. With
    /// `--datapath none` and a given `--public-ip` alone, the address need
    /// not be local (tests, dry runs).
    pub(crate) async fn probe(args: &AgentArgs) -> Result<Self> {
        let node_id = node::node_id(args.node_id.as_deref(), Path::new("/etc/machine-id"))?;
        let choice = node::UplinkChoice {
            iface: args.iface.clone(),
            iface_regex: args.iface_regex.clone(),
            can_reach: args.iface_can_reach,
            public_ip: args.public_ip,
        };
        let only_public_ip =
            choice.iface.is_empty() && choice.iface_regex.is_empty() && choice.can_reach.is_none();
        let given = args.public_ip.is_some() || args.public_ipv6.is_some();
        let (uplink, public_ip) = match (args.datapath, given, only_public_ip) {
            (DatapathKind::None, true, true) => (None, args.public_ip),
            _ => {
                let nl = Netlink::new()?;
                let (l, ip) = node::uplink(&nl, &choice).await?;
                (Some(l), ip)
            }
        };
        Ok(Self {
            node_id,
            uplink,
            public_ip,
            ..Self::default()
        })
    }

    /// What the config makes the host needed for: the IPv6 VTEP address
    /// (when the network has IPv6) and flannel's devices for its VNI.
    pub(crate) async fn complete(
        &mut self,
        args: &AgentArgs,
        config: &NetworkConfig,
    ) -> Result<()> {
        self.public_ipv6 = match (&config.ipv6, &self.uplink) {
            (None, _) => None,
            (Some(_), Some(l)) => Some(node::public_ipv6(&Netlink::new()?, l, args.public_ipv6).await?),
            (Some(_), None) => Some(args.public_ipv6.context(
                "the network has IPv6: pass --public-ipv6 (or an uplink that has a global IPv6 address)",
            )?),
        };
        if args.datapath == DatapathKind::Ebpf {
            let links = Netlink::new()?.links().await?;
            let mac = |name: String| {
                links
                    .iter()
                    .find(|l| l.name == name && l.mac != [0; 6])
                    .map(|l| MacAddr(l.mac))
            };
            self.flannel_mac = mac(format!("flannel.{}", config.vni));
            self.flannel6_mac = mac(format!("flannel-v6.{}", config.vni));
        }
        Ok(())
    }
}

/// What the agent runs as on this node.
#[derive(Clone, Debug)]
pub(crate) struct NodePlan {
    pub(crate) me: Identity,
    /// What this node writes into its lease.
    pub(crate) value: LeaseAttrs,
    /// The dataplane's spec (None: `--datapath none`, or the wireguard
    /// backend).
    pub(crate) dataplane: Option<DataplaneSpec>,
    /// The wireguard backend's dataplane (None: `--datapath none`, or the
    /// vxlan backend).
    pub(crate) wireguard: Option<WgSpec>,
    pub(crate) timing: Timing,
    /// The uplink's MTU (1500 without one).
    pub(crate) uplink_mtu: u32,
}

impl NodePlan {
    pub(crate) fn build(
        args: &AgentArgs,
        config: &NetworkConfig,
        host: Host,
        request_timeout: Duration,
    ) -> Result<Self> {
        // The VTEP addresses the network's families need.
        let public_ip = match (&config.ipv4, host.public_ip) {
            (None, _) => None,
            (Some(_), Some(ip)) => Some(ip),
            (Some(_), None) => bail!(
                "the network has IPv4 but {} has no IPv4 address to use as the public IP; pass --public-ip",
                host.uplink
                    .as_ref()
                    .map_or("this node", |l| l.name.as_str())
            ),
        };
        let public_ipv6 = config.ipv6.as_ref().and(host.public_ipv6);
        if config.ipv6.is_some() && public_ipv6.is_none() {
            bail!(
                "the network has IPv6 but this node has no IPv6 VTEP address; pass --public-ipv6"
            );
        }
        // One VTEP MAC per node id and address, stable across restarts: it
        // goes into the lease and into the dataplane. On a node moving from
        // flannel, flannel's device's MAC instead, while that device
        // exists: the other nodes go on addressing frames to it, and
        // flannel's device (which drops frames for another MAC) keeps
        // decapsulating until Weft's programs take over. The IPv6 device has
        // a MAC of its own, as flannel's `flannel-v6.<VNI>` has.
        let node_id = &host.node_id;
        let vtep_mac = host.flannel_mac.unwrap_or_else(|| {
            MacAddr::derived(
                format!("{node_id}/{}", public_ip.unwrap_or(Ipv4Addr::UNSPECIFIED)).as_bytes(),
            )
        });
        let vtep6_mac = match (public_ipv6, host.flannel6_mac) {
            (Some(_), Some(mac)) => mac,
            (v6, _) => MacAddr::derived(
                format!("{node_id}/{}", v6.unwrap_or(Ipv6Addr::UNSPECIFIED)).as_bytes(),
            ),
        };
        let me = Identity {
            node_id: node_id.clone(),
            public_ip,
            public_ipv6,
        };
        let uplink_mtu = host.uplink.as_ref().map_or(1500, |l| l.mtu);
        if let Some(wg) = &config.wireguard {
            let key = PrivateKey::load_or_create(&args.wireguard_key_file)?;
            let value = LeaseAttrs::wireguard(
                public_ip,
                public_ipv6,
                key.public(),
                (wg.listen_port, wg.listen_port_v6),
                node_id,
            );
            let wireguard = match (args.datapath, host.uplink) {
                (DatapathKind::None, _) => None,
                (DatapathKind::Ebpf, None) => bail!("the dataplane needs an uplink (--iface)"),
                (DatapathKind::Ebpf, Some(uplink)) => Some(WgSpec {
                    config: wg.clone(),
                    key,
                    underlay_mtu: config.mtu.unwrap_or(uplink.mtu),
                    uplink: uplink.name,
                    state_dir: args.state.state_dir.clone(),
                    network: config.network(),
                    network6: config.ipv6_network(),
                    masquerade: args.ip_masq.then_some(!args.ip_masq_fully_random_disable),
                    forward_rules: args.iptables_forward_rules,
                    host_routing: args.host_routing,
                    pins: PinDir::new(&args.pins.bpffs_dir),
                    max_peers: args.max_peers,
                    kernel: host.kernel,
                }),
            };
            return Ok(Self {
                me,
                value,
                dataplane: None,
                wireguard,
                timing: Timing {
                    ttl: Duration::from_secs(args.subnet_lease_ttl),
                    renew_margin: Duration::from_secs(args.subnet_lease_renew_margin * 60),
                    request_timeout,
                    retry_interval: retry_interval(args),
                },
                uplink_mtu,
            });
        }
        let value = lease_value(&me, config.vni, vtep_mac, vtep6_mac);
        let dataplane = match (args.datapath, host.uplink) {
            (DatapathKind::None, _) => None,
            (DatapathKind::Ebpf, None) => bail!("the eBPF datapath needs an uplink (--iface)"),
            (DatapathKind::Ebpf, Some(uplink)) => Some(DataplaneSpec {
                uplink: uplink.name,
                public_ip,
                public_ipv6,
                vni: config.vni,
                port: config.port,
                vtep_mac,
                vtep6_mac,
                xdp_mode: args.xdp_mode,
                pins: PinDir::new(&args.pins.bpffs_dir),
                max_peers: args.max_peers,
                fault: args
                    .inject_fault
                    .map_or(dataplane_common::FAULT_NONE, |f| f.value()),
                host_routing: args.host_routing,
                state_dir: args.state.state_dir.clone(),
                network: config.network(),
                network6: config.ipv6_network(),
                masquerade: args.ip_masq.then_some(!args.ip_masq_fully_random_disable),
                forward_rules: args.iptables_forward_rules,
                underlay_mtu: config.mtu,
                direct_routing: config.direct_routing,
                path_mtu: args.path_mtu && config.mtu.is_none() && args.peer_probe_interval > 0.0,
                kernel: host.kernel,
            }),
        };
        Ok(Self {
            me,
            value,
            dataplane,
            wireguard: None,
            timing: Timing {
                ttl: Duration::from_secs(args.subnet_lease_ttl),
                renew_margin: Duration::from_secs(args.subnet_lease_renew_margin * 60),
                request_timeout,
                retry_interval: retry_interval(args),
            },
            uplink_mtu,
        })
    }

    /// The flannel devices whose MACs the plan keeps, for the log.
    pub(crate) fn log(&self, host: &Host, vni: u32) {
        if let Some(mac) = host.flannel_mac {
            tracing::info!(device = %format!("flannel.{vni}"), %mac, "keeping flannel's VTEP MAC while its device exists");
        }
        if let (Some(_), Some(mac)) = (self.me.public_ipv6, host.flannel6_mac) {
            tracing::info!(device = %format!("flannel-v6.{vni}"), %mac, "keeping flannel's IPv6 VTEP MAC while its device exists");
        }
        if let Some(v6) = self.me.public_ipv6 {
            tracing::info!(public_ipv6 = %v6, "IPv6 VTEP");
        }
    }
}

pub(crate) fn retry_interval(args: &AgentArgs) -> Duration {
    Duration::from_secs(args.retry_interval.max(1))
}

/// What this node writes into its lease: its IPv4 VTEP, its IPv6 VTEP, or
/// both.
fn lease_value(me: &Identity, vni: u32, mac: MacAddr, mac6: MacAddr) -> LeaseAttrs {
    match (me.public_ip, me.public_ipv6) {
        (Some(v4), None) => LeaseAttrs::vxlan(v4, vni, mac, &me.node_id),
        (Some(v4), Some(v6)) => LeaseAttrs::vxlan(v4, vni, mac, &me.node_id).with_v6(v6, vni, mac6),
        (None, Some(v6)) => LeaseAttrs::vxlan_v6_only(v6, vni, mac6, &me.node_id),
        (None, None) => LeaseAttrs::vxlan(Ipv4Addr::UNSPECIFIED, vni, mac, &me.node_id),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(extra: &[&str]) -> AgentArgs {
        let mut argv = vec!["weft", "agent", "--etcd-endpoints", "http://127.0.0.1:2379"];
        argv.extend(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Agent(a) => *a,
            _ => unreachable!(),
        }
    }

    fn config(json: &str) -> NetworkConfig {
        NetworkConfig::parse(json.as_bytes()).unwrap()
    }

    fn uplink() -> Link {
        Link {
            index: 2,
            name: "eth0".into(),
            mtu: 9000,
            mac: [2, 0, 0, 0, 0, 1],
            up: true,
            arp: true,
            kind: None,
            xdp: None,
            peer_netns: None,
            netkit_primary: false,
        }
    }

    fn host() -> Host {
        Host {
            node_id: "node-a".into(),
            uplink: Some(uplink()),
            public_ip: Some("198.18.0.1".parse().unwrap()),
            ..Host::default()
        }
    }

    const V4: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":4}}"#;
    const DUAL: &str = r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#;
    const V6: &str = r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#;

    #[test]
    fn an_ipv4_node() {
        let p = NodePlan::build(&args(&[]), &config(V4), host(), Duration::from_secs(2)).unwrap();
        assert_eq!(p.me.public_ip, Some("198.18.0.1".parse().unwrap()));
        assert_eq!(p.me.public_ipv6, None);
        assert_eq!(p.uplink_mtu, 9000);
        let spec = p.dataplane.unwrap();
        assert_eq!((spec.uplink.as_str(), spec.vni), ("eth0", 4));
        assert_eq!(spec.vtep_mac, p.value.vxlan_data().unwrap().vtep_mac);
        // The MAC follows the node id and address, the same at every start.
        let again = NodePlan::build(&args(&[]), &config(V4), host(), Duration::ZERO).unwrap();
        assert_eq!(again.dataplane.unwrap().vtep_mac, spec.vtep_mac);
        let mut other = host();
        other.node_id = "node-b".into();
        let b = NodePlan::build(&args(&[]), &config(V4), other, Duration::ZERO).unwrap();
        assert_ne!(b.dataplane.unwrap().vtep_mac, spec.vtep_mac);
    }

    #[test]
    fn both_families_or_one_and_what_each_needs() {
        let mut h = host();
        h.public_ipv6 = Some("fd00:18::1".parse().unwrap());
        let p = NodePlan::build(&args(&[]), &config(DUAL), h.clone(), Duration::ZERO).unwrap();
        assert_eq!(p.value.public_ip, "198.18.0.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(p.value.public_ipv6, h.public_ipv6);
        let spec = p.dataplane.unwrap();
        assert_ne!(spec.vtep_mac, spec.vtep6_mac);
        assert!(spec.network.is_some() && spec.network6.is_some());
        // IPv6 only: no IPv4 address is needed, none is written.
        let mut h6 = h.clone();
        h6.public_ip = None;
        let p = NodePlan::build(&args(&[]), &config(V6), h6, Duration::ZERO).unwrap();
        assert_eq!(p.me.public_ip, None);
        assert_eq!(p.value.public_ip, Ipv4Addr::UNSPECIFIED);
        // A family the network has but the node lacks: a clear error.
        let mut no4 = h.clone();
        no4.public_ip = None;
        let e = NodePlan::build(&args(&[]), &config(DUAL), no4, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("pass --public-ip"), "{e}");
        let e = NodePlan::build(&args(&[]), &config(DUAL), host(), Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("pass --public-ipv6"), "{e}");
    }

    #[test]
    fn flannels_macs_are_kept_while_its_devices_exist() {
        let mut h = host();
        h.public_ipv6 = Some("fd00:18::1".parse().unwrap());
        h.flannel_mac = Some(MacAddr([0x0a, 1, 2, 3, 4, 5]));
        h.flannel6_mac = Some(MacAddr([0x0a, 1, 2, 3, 4, 6]));
        let p = NodePlan::build(&args(&[]), &config(DUAL), h, Duration::ZERO).unwrap();
        let spec = p.dataplane.unwrap();
        assert_eq!(spec.vtep_mac, MacAddr([0x0a, 1, 2, 3, 4, 5]));
        assert_eq!(spec.vtep6_mac, MacAddr([0x0a, 1, 2, 3, 4, 6]));
    }

    #[test]
    fn flags_reach_the_spec_and_the_timing() {
        let a = args(&[
            "--datapath",
            "none",
            "--subnet-lease-ttl",
            "30",
            "--retry-interval",
            "0",
        ]);
        let p = NodePlan::build(&a, &config(V4), host(), Duration::from_secs(3)).unwrap();
        assert!(p.dataplane.is_none(), "--datapath none");
        assert_eq!(p.timing.ttl, Duration::from_secs(30));
        assert_eq!(
            p.timing.retry_interval,
            Duration::from_secs(1),
            "at least 1 s"
        );
        assert_eq!(p.timing.request_timeout, Duration::from_secs(3));
        let mut no_uplink = host();
        no_uplink.uplink = None;
        let e = NodePlan::build(&args(&[]), &config(V4), no_uplink, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("needs an uplink"), "{e}");
        let p =
            NodePlan::build(&args(&["--ip-masq"]), &config(V4), host(), Duration::ZERO).unwrap();
        assert_eq!(p.dataplane.unwrap().masquerade, Some(true));
    }
}
