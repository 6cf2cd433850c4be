//! The local pods host routing reaches: the CNI plugin's records and the
//! runtime's cache (pods other plugins attached) made the dataplane's
//! endpoints.

use super::*;

impl Agent {
    /// Makes host routing's local pods match the endpoint records the CNI
    /// plugin wrote; forgets records whose pod is gone.
    pub(super) async fn sync_endpoints(&mut self) {
        if self.host_routing == HostRouting::Legacy {
            return;
        }
        let records = cni::records(&self.state_dir);
        // Pods attached without Weft's plugin (a node moved from flannel):
        // found in the runtime's result cache, so they are fast at once.
        let (adopted, skipped) = cni::adopted(&self.cni_cache_dir, &self.cni_ipam_dir, &records);
        if adopted.len() != self.endpoints_adopted {
            tracing::info!(
                pods = adopted.len(),
                cache = %self.cni_cache_dir.display(),
                "pods attached without Weft's plugin, adopted from the runtime's CNI result cache"
            );
            self.endpoints_adopted = adopted.len();
        }
        let want: Vec<_> = records
            .iter()
            .chain(&adopted)
            .flat_map(|r| r.endpoints())
            .collect();
        match self.dataplane.sync_endpoints(&want).await {
            Ok(mut s) => {
                s.rejected.extend(
                    skipped
                        .into_iter()
                        .map(|(entry, why)| (format!("CNI cache {entry}"), why)),
                );
                for owner in &s.gone {
                    tracing::info!(owner, "forgetting the endpoint of a pod whose veth is gone");
                    cni::forget(&self.state_dir, owner);
                }
                if s.active != self.endpoints {
                    tracing::info!(endpoints = s.active, "local pods reached by host routing");
                }
                self.endpoints = s.active;
                self.endpoints_rejected = s.rejected;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot program the local endpoints; retrying")
            }
        }
    }
}
