//! The plugin's own writes to host routing's maps, so that no entry can
//! send a pod's traffic to a dead veth while the agent is away: ADD points
//! the pod's addresses at its veth, DEL removes what points at the
//! deleted pod's veth. The agent reconciles the maps with the records
//! anyway (at start and on every sync); this only closes the gap until it
//! does. The agent says where its maps are (`<stateDir>/bpffs-dir`); no
//! such file, or maps of another layout version (an agent of another
//! version), and nothing is written.

use std::path::Path;

use super::record::Record;
use crate::dataplane::{EndpointMap, PinDir, pod_ifs};

fn maps(state_dir: &Path) -> Option<EndpointMap> {
    EndpointMap::open(&PinDir::announced(state_dir)?).ok()
}

/// ADD: the pod's addresses now reach its veth.
pub(crate) fn program(state_dir: &Path, rec: &Record) {
    let Some(mut m) = maps(state_dir) else {
        return;
    };
    let eps = rec.endpoints();
    for (ifindex, p) in pod_ifs(&eps) {
        let _ = m.set_pod_if(ifindex, &p);
    }
    for e in &eps {
        let _ = m.set(e.ip, &e.entry());
    }
}

/// DEL: whatever still points at the deleted pod's veth goes.
pub(crate) fn unprogram(state_dir: &Path, rec: &Record) {
    let Some(mut m) = maps(state_dir) else {
        return;
    };
    let Ok(all) = m.all() else {
        return;
    };
    for e in rec.endpoints() {
        if all
            .get(&e.ip)
            .is_some_and(|ep| ep.ifindex == rec.host_ifindex)
        {
            let _ = m.remove(e.ip);
        }
    }
    let _ = m.remove_pod_if(rec.host_ifindex);
}
