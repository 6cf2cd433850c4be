//! The local pods host routing reaches: the CNI plugin's records and the
//! runtime's cache (pods other plugins attached) made the dataplane's
//! endpoints.

use super::*;

/// The local pods host routing reaches, as last synced.
pub(super) struct Pods {
    pub(super) host_routing: HostRouting,
    /// Local pods host routing reaches directly.
    pub(super) endpoints: usize,
    /// Pods of those that Weft's plugin did not attach.
    pub(super) adopted: usize,
    /// Where the CNI plugin writes its endpoint records.
    pub(super) state_dir: PathBuf,
    /// libcni's cache directory (results of attachments Weft did not make).
    pub(super) cni_cache_dir: PathBuf,
    /// host-local's allocations (the addresses pods hold).
    pub(super) cni_ipam_dir: PathBuf,
    /// Registrations not fit for host routing: (owner, why).
    pub(super) rejected: Vec<(String, String)>,
}

impl Pods {
    pub(super) fn new(args: &AgentArgs) -> Self {
        Self {
            host_routing: args.host_routing,
            endpoints: 0,
            adopted: 0,
            state_dir: args.state.state_dir.clone(),
            cni_cache_dir: args.cni_cache_dir.clone(),
            cni_ipam_dir: args.cni_ipam_dir.clone(),
            rejected: Vec::new(),
        }
    }
}

impl Agent {
    /// Makes host routing's local pods match the endpoint records the CNI
    /// plugin wrote; forgets records whose pod is gone.
    pub(super) async fn sync_endpoints(&mut self) {
        if self.pods.host_routing == HostRouting::Legacy {
            return;
        }
        let records = cni::records(&self.pods.state_dir);
        // Pods attached without Weft's plugin (a node moved from flannel):
        // found in the runtime's result cache, so they are fast at once.
        let (adopted, skipped) =
            cni::adopted(&self.pods.cni_cache_dir, &self.pods.cni_ipam_dir, &records);
        if adopted.len() != self.pods.adopted {
            tracing::info!(
                pods = adopted.len(),
                cache = %self.pods.cni_cache_dir.display(),
                "pods attached without Weft's plugin, adopted from the runtime's CNI result cache"
            );
            self.pods.adopted = adopted.len();
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
                    cni::forget(&self.pods.state_dir, owner);
                }
                if s.active != self.pods.endpoints {
                    tracing::info!(endpoints = s.active, "local pods reached by host routing");
                }
                self.pods.endpoints = s.active;
                self.pods.rejected = s.rejected;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot program the local endpoints; retrying")
            }
        }
    }
}
