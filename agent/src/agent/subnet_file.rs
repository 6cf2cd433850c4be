//! subnet.env: written for the subnets held (what the CNI plugin hands
//! addresses out of), kept current, and never left naming subnets this
//! node no longer holds.

use super::*;

/// subnet.env: where it is, what it says besides the subnets, and whether
/// a write is owed.
pub(super) struct SubnetEnvFile {
    pub(super) path: PathBuf,
    pub(super) config: NetworkConfig,
    pub(super) uplink_mtu: u32,
    /// `--ip-masq` (FLANNEL_IPMASQ).
    pub(super) ip_masq: bool,
    /// Writing it for our subnets failed: the tick tries again, and the
    /// node is not ready until it is written.
    pub(super) pending: bool,
}

impl Agent {
    /// As flanneld: READY=1 for systemd (`Type=notify`) once the lease is
    /// held, the dataplane is up and subnet.env names the subnet. Sent
    /// from the loop (its signal handlers in place) and after each write
    /// there; systemd takes the first and ignores the rest.
    pub(super) fn notify_ready(&self) {
        if let Some(subnets) = self.held.subnet
            && !self.subnet_env.pending
        {
            crate::sys::sd_notify::notify(&format!(
                "READY=1\nSTATUS=holding {subnets}; dataplane up"
            ));
        }
    }

    /// Writes subnet.env for the subnets held. When that fails (a full
    /// disk), a file naming other subnets is removed (the CNI plugin would
    /// hand out addresses of a subnet another node may hold now; without
    /// the file it refuses), the node is not ready, and each tick tries
    /// again; the agent goes on serving its peers meanwhile.
    pub(super) fn publish_subnet_env(&mut self) {
        let Some(subnets) = self.held.subnet else {
            return;
        };
        match self.write_subnet_env(subnets) {
            Ok(()) => {
                let again = self.subnet_env.pending;
                self.subnet_env.pending = false;
                if again {
                    tracing::info!(file = %self.subnet_env.path.display(), "the subnet file is written again");
                    self.notify_ready();
                }
            }
            Err(e) => {
                if !self.subnet_env.pending {
                    let names = lease::read_subnet(&self.subnet_env.path).ok().flatten();
                    let removed = names != Some(subnets)
                        && match std::fs::remove_file(&self.subnet_env.path) {
                            Ok(()) => true,
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                            Err(r) => {
                                tracing::error!(file = %self.subnet_env.path.display(), error = %r, "cannot remove the subnet file naming other subnets");
                                false
                            }
                        };
                    tracing::error!(
                        error = %format!("{e:#}"),
                        subnet = %subnets,
                        removed_stale = removed,
                        "cannot write the subnet file; trying again each second, not ready until it is written"
                    );
                }
                self.subnet_env.pending = true;
            }
        }
        self.metrics
            .set_subnet_file_current(!self.subnet_env.pending);
    }

    /// Writes subnet.env for `subnets`, with the current overlay MTU.
    fn write_subnet_env(&self, subnets: Subnets) -> Result<()> {
        let mtu = self.dataplane.mtu().unwrap_or_else(|| {
            let overhead = if self.subnet_env.config.wireguard.is_some() {
                lease::WIREGUARD_OVERHEAD
            } else if subnets.v6.is_some() {
                dataplane_common::VXLAN6_OVERHEAD
            } else {
                dataplane_common::VXLAN_OVERHEAD
            };
            self.subnet_env
                .config
                .mtu
                .unwrap_or(self.subnet_env.uplink_mtu)
                - overhead
        });
        let env = SubnetEnv {
            ipv4: self
                .subnet_env
                .config
                .network()
                .zip(subnets.v4)
                .map(|(network, subnet)| EnvFamily { network, subnet }),
            ipv6: self
                .subnet_env
                .config
                .ipv6_network()
                .zip(subnets.v6)
                .map(|(network, subnet)| EnvFamily { network, subnet }),
            mtu,
            ipmasq: self.subnet_env.ip_masq,
        };
        env.write(&self.subnet_env.path)
            .with_context(|| format!("writing {}", self.subnet_env.path.display()))?;
        tracing::info!(file = %self.subnet_env.path.display(), subnet = %subnets, mtu, ipmasq = self.subnet_env.ip_masq, "wrote the subnet file");
        Ok(())
    }
}
