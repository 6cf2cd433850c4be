//! `weft status`: this node at a glance, from the pinned maps and links,
//! the subnet file, netlink, and (if reachable) etcd.

use anyhow::Result;

use crate::{
    cli::NodeArgs,
    dataplane::{Counters, EndpointMap, PeerMaps, PinDir},
    lease, report,
};

mod gather;
mod text;
mod wireguard;

use self::text::print_kernel;

pub(crate) async fn status(node: &NodeArgs, json_out: bool) -> Result<()> {
    let (pins, state) = (&node.pins, &node.state);
    let dir = PinDir::new(&pins.bpffs_dir);
    // The wireguard backend: its devices, and host routing's programs
    // where they run (`CONFIG_F_WIREGUARD`; `legacy`: no maps).
    let wireguard = crate::dataplane::wireguard::devices_here()?;
    let wg_maps = PeerMaps::open(&dir)
        .and_then(|m| m.config())
        .map(|c| c.flags & dataplane_common::CONFIG_F_WIREGUARD != 0);
    if !wireguard.is_empty() && !matches!(wg_maps, Ok(false)) {
        let fast = match wg_maps {
            Ok(_) => Some(wireguard::FastView {
                counters: Counters::open(&dir)?.all()?,
                endpoints: EndpointMap::open(&dir)?.all()?.len(),
            }),
            Err(_) => None,
        };
        return wireguard::print(
            &wireguard,
            fast,
            lease::read_subnet(&node.subnet_file).ok().flatten(),
            report::read(&state.state_dir),
            json_out,
        );
    }
    let status = gather::gather(&dir, node).await?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        text::print(&status, &state.state_dir);
    }
    Ok(())
}
