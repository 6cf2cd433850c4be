//! `weft doctor`: checks this node and says what to fix.
//!
//! Each check prints `ok`, `warn` or `FAIL`, what it saw, and for anything
//! short of ok the fix (with `--json`, one document: `passed`, `failed`,
//! `warnings` and `checks`, each with `check`, `level`, `saw` and `fix`).
//! The exit status is non-zero when a check failed.
//! Checks that need the agent's pins say so when it is not running. Each
//! concern is a file: the host ([`host`]), the datapath ([`dataplane`]),
//! the lease ([`lease`]), the peers ([`peers`]) and the CNI config
//! ([`cni`]); every family the datapath runs is checked.

mod cni;
mod dataplane;
mod findings;
mod host;
mod lease;
mod peers;
mod wireguard;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result};
use dataplane_common::{CONFIG_F_IPV4, CONFIG_F_IPV6, Reason};

use self::findings::Findings;
use crate::{
    cli::NodeArgs,
    dataplane::{Counters, DecapHook, Family, Netlink, PeerMaps, PinDir},
    lease::SubnetEnv,
    report,
};

/// Where the CNI network configs are, and the node's files.
pub(crate) struct DoctorArgs<'a> {
    pub(crate) node: &'a NodeArgs,
    pub(crate) cni_conf_dir: &'a Path,
    pub(crate) probe_timeout: Duration,
    /// The report as one JSON document instead of text.
    pub(crate) json: bool,
}

pub(crate) async fn doctor(a: DoctorArgs<'_>) -> Result<()> {
    let mut f = Findings::new(a.json);
    let agent = report::read(&a.node.state.state_dir);
    host::kernel(&mut f, &a.node.state.state_dir);
    host::bpffs(
        &mut f,
        &a.node.pins.bpffs_dir,
        agent.as_ref().and_then(|r| r.pid),
    );
    let dir = PinDir::new(&a.node.pins.bpffs_dir);
    // The wireguard backend: its devices are what to check.
    let wg = crate::dataplane::wireguard::devices_here()?;
    let wg_maps = PeerMaps::open(&dir)
        .and_then(|m| m.config())
        .map(|c| c.flags & dataplane_common::CONFIG_F_WIREGUARD != 0);
    if !wg.is_empty() && !matches!(wg_maps, Ok(false)) {
        wireguard::check(&mut f, &wg);
        return f.finish();
    }
    match PeerMaps::open(&dir).and_then(|m| Ok((m.config()?, m))) {
        Err(e) => f.fail(
            "datapath",
            format!(
                "no pinned maps under {}: {e:#}",
                a.node.pins.bpffs_dir.display()
            ),
            "start the agent (weft agent), or give its --bpffs-dir",
        ),
        Ok((cfg, maps)) => {
            let nl = Netlink::new()?;
            let Some(uplink) = nl.link_by_index(cfg.uplink_ifindex).await? else {
                f.fail(
                    "uplink",
                    format!("ifindex {} is gone", cfg.uplink_ifindex),
                    "restart the agent: it chooses the uplink at start",
                );
                return f.finish();
            };
            let families: Vec<Family> = [(Family::V4, CONFIG_F_IPV4), (Family::V6, CONFIG_F_IPV6)]
                .into_iter()
                .filter(|(_, flag)| cfg.flags & flag != 0)
                .map(|(family, _)| family)
                .collect();
            let devices = dataplane::devices(&nl, cfg.vni, &families).await?;
            dataplane::programs(&mut f, &nl, &dir, &uplink.name, &devices, agent.as_ref()).await?;
            host::rp_filter(&mut f, &uplink.name);
            let xdp = agent
                .as_ref()
                .and_then(|r| r.decap.as_ref())
                .is_some_and(|d| d.hook != DecapHook::Tc.as_str());
            host::offloads(&mut f, &uplink.name, xdp);
            let env = read_env(&a.node.subnet_file);
            let env_mtu = env.as_ref().ok().and_then(|e| e.as_ref()).map(|e| e.mtu);
            dataplane::mtu(&mut f, uplink.mtu, &devices, env_mtu);
            if let Ok(c) = Counters::open(&dir).and_then(|c| c.get(Reason::Fragmented)) {
                dataplane::fragments(&mut f, c.packets, uplink.mtu);
            }
            dataplane::paths(&mut f, agent.as_ref(), uplink.mtu);
            let vteps = lease::Vteps {
                v4: families
                    .contains(&Family::V4)
                    .then(|| Ipv4Addr::from(cfg.local_addr_be.to_ne_bytes())),
                v6: families
                    .contains(&Family::V6)
                    .then(|| Ipv6Addr::from(cfg.local_addr6)),
            };
            lease::check(&mut f, &a, &env, &vteps).await;
            let peers: Vec<_> = maps.peers()?.into_values().collect();
            let paths = agent
                .as_ref()
                .map(|r| {
                    r.peer_health
                        .iter()
                        .filter_map(|h| Some((h.subnet.parse().ok()?, h.path_mtu?)))
                        .collect()
                })
                .unwrap_or_default();
            peers::probe(&mut f, &peers, &devices, cfg.port, a.probe_timeout, &paths);
        }
    }
    cni::check(&mut f, a.cni_conf_dir);
    f.finish()
}

/// subnet.env, if there is one.
fn read_env(path: &Path) -> Result<Option<SubnetEnv>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    SubnetEnv::parse(&text)
        .map(Some)
        .with_context(|| format!("{}", path.display()))
}
