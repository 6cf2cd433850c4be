//! subnet.env: written for the subnets held (what the CNI plugin hands
//! addresses out of), kept current, and never left naming subnets this
//! node no longer holds.

use super::*;

impl Agent {
    /// As flanneld: READY=1 for systemd (`Type=notify`) once the lease is
    /// held, the dataplane is up and subnet.env names the subnet. Sent
    /// from the loop (its signal handlers in place) and after each write
    /// there; systemd takes the first and ignores the rest.
    pub(super) fn notify_ready(&self) {
        if let Some(subnets) = self.subnet
            && !self.subnet_file_pending
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
        let Some(subnets) = self.subnet else {
            return;
        };
        match self.write_subnet_env(subnets) {
            Ok(()) => {
                let again = self.subnet_file_pending;
                self.subnet_file_pending = false;
                if again {
                    tracing::info!(file = %self.subnet_file.display(), "the subnet file is written again");
                    self.notify_ready();
                }
            }
            Err(e) => {
                if !self.subnet_file_pending {
                    let names = lease::read_subnet(&self.subnet_file).ok().flatten();
                    let removed = names != Some(subnets)
                        && match std::fs::remove_file(&self.subnet_file) {
                            Ok(()) => true,
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                            Err(r) => {
                                tracing::error!(file = %self.subnet_file.display(), error = %r, "cannot remove the subnet file naming other subnets");
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
                self.subnet_file_pending = true;
            }
        }
        self.metrics
            .set_subnet_file_current(!self.subnet_file_pending);
    }

    /// Writes subnet.env for `subnets`, with the current overlay MTU.
    fn write_subnet_env(&self, subnets: Subnets) -> Result<()> {
        let mtu = self.dataplane.mtu().unwrap_or_else(|| {
            let overhead = if self.config.wireguard.is_some() {
                lease::WIREGUARD_OVERHEAD
            } else if subnets.v6.is_some() {
                dataplane_common::VXLAN6_OVERHEAD
            } else {
                dataplane_common::VXLAN_OVERHEAD
            };
            self.config.mtu.unwrap_or(self.uplink_mtu) - overhead
        });
        let env = SubnetEnv {
            ipv4: self
                .config
                .network()
                .zip(subnets.v4)
                .map(|(network, subnet)| EnvFamily { network, subnet }),
            ipv6: self
                .config
                .ipv6_network()
                .zip(subnets.v6)
                .map(|(network, subnet)| EnvFamily { network, subnet }),
            mtu,
            ipmasq: self.ip_masq,
        };
        env.write(&self.subnet_file)
            .with_context(|| format!("writing {}", self.subnet_file.display()))?;
        tracing::info!(file = %self.subnet_file.display(), subnet = %subnets, mtu, ipmasq = self.ip_masq, "wrote the subnet file");
        Ok(())
    }
}
