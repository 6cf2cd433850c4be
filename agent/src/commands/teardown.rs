//! `weft teardown`: removes everything Weft set up on this node.

use anyhow::Result;

use crate::{
    cli::{PinArgs, StateArgs},
    dataplane::{self, Netlink, PeerMaps, PinDir},
};

pub(crate) async fn teardown(pins: &PinArgs, state: &StateArgs) -> Result<()> {
    let dir = PinDir::new(&pins.bpffs_dir);
    let vni = PeerMaps::open(&dir)
        .and_then(|m| m.config())
        .map(|c| c.vni)
        .ok();
    let vnis: Vec<u32> = match vni {
        Some(v) => vec![v],
        None => {
            // No pinned config: remove whatever overlay devices are there.
            let nl = Netlink::new()?;
            nl.links()
                .await?
                .iter()
                .filter_map(|l| l.name.strip_prefix("weft.").and_then(|v| v.parse().ok()))
                .collect()
        }
    };
    let mut removed = Vec::new();
    for vni in vnis.iter().copied().chain(vnis.is_empty().then_some(1)) {
        removed.extend(dataplane::teardown(&dir, vni, &state.state_dir).await?);
    }
    if crate::cni::remove_socket(&state.state_dir) {
        removed.push(format!(
            "the agent's socket in {}",
            state.state_dir.display()
        ));
    }
    if removed.is_empty() {
        println!("nothing to remove");
    }
    for r in removed {
        println!("removed {r}");
    }
    Ok(())
}
