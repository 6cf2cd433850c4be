//! A subnet held, and held again elsewhere after a loss: the dataplane
//! moved to it, and the pods left on the old subnet counted until they
//! are gone.

use super::*;

/// The subnets this node holds, held before, and is acquiring again.
#[derive(Default)]
pub(super) struct Held {
    /// Our subnets, once held.
    pub(super) subnet: Option<Subnets>,
    /// The subnets we held before a loss moved us, while local pods still
    /// hold addresses in them (how many).
    pub(super) old: Option<(Subnets, usize)>,
    /// While a lost lease is acquired again, beside the loop: the subnets
    /// held before.
    pub(super) relocating: Option<Option<Subnets>>,
    /// Whether the peer set has been complete once.
    pub(super) synced: bool,
}

impl Agent {
    /// We hold `held`: the dataplane goes up around it, then subnet.env
    /// tells the CNI plugin, then the peers are decided around it.
    pub(super) async fn took(&mut self, held: &HeldLease) -> Result<()> {
        self.dataplane.set_subnet(held.subnet).await?;
        if let Some(c) = self.dataplane.counters() {
            self.metrics.set_counters(c);
        }
        if self.health.prober.is_none()
            && let Some(mut settings) = self.health.settings
        {
            settings.path_mtu = self.dataplane.path_mtu_ceiling();
            settings.port = self.dataplane.vxlan_port();
            settings.vtep = self.dataplane.vtep4();
            let p = health::Prober::start(settings)?;
            self.metrics.set_health(p.view());
            self.health.prober = Some(p);
        }
        if let Some(l) = self.dataplane.liberal() {
            self.metrics.set_liberal(l);
        }
        self.held.subnet = Some(held.subnet);
        self.publish_subnet_env();
        let updates = self.view.set_held(held);
        self.apply(&updates).await
    }

    /// Our lease is gone: go back through the fenced path (the same subnet
    /// if it is still free, else a new one), on a task of its own. Until
    /// it holds one, the dataplane keeps the old subnet and goes on
    /// following the peers, and the node is not ready.
    pub(super) fn relocate(
        &mut self,
        why: &str,
        to: Option<&str>,
    ) -> tokio::task::JoinHandle<HeldLease> {
        self.metrics.set_ready(false);
        let old = self.holder.lose(why, to);
        self.held.relocating = Some(old);
        tokio::spawn(self.holder.acquisition(old).run())
    }

    /// The acquisition after a loss holds `held`: move the dataplane there.
    pub(super) async fn relocated(&mut self, held: HeldLease) -> Result<()> {
        self.holder.install(held.clone());
        self.took(&held).await?;
        if let Some(Some(old)) = self.held.relocating.take()
            && old != held.subnet
        {
            // Only the halves that changed leave pods behind.
            let old = Subnets {
                v4: old.v4.filter(|s| Some(*s) != held.subnet.v4),
                v6: old.v6.filter(|s| Some(*s) != held.subnet.v6),
            };
            let pods = pods::in_subnet(&self.pods.cni_ipam_dir, &old);
            tracing::warn!(
                %old,
                new = %held.subnet,
                pods_on_old_subnet = pods.len(),
                "this node's subnet changed: its pods on the old subnet cannot be reached any more and must be recreated (the node stays not ready until they are; see docs/architecture/leases.md, \"When a node's subnet changes\")"
            );
            if !pods.is_empty() {
                self.held.old = Some((old, pods.len()));
            }
        }
        Ok(())
    }

    /// While we wait for pods to leave an old subnet: how many are left.
    pub(super) fn check_old_subnet(&mut self) {
        let Some((old, before)) = self.held.old else {
            return;
        };
        let left = pods::in_subnet(&self.pods.cni_ipam_dir, &old).len();
        if left == 0 {
            tracing::info!(%old, "no local pod holds an address of the old subnet any more");
            self.held.old = None;
        } else {
            if left != before {
                tracing::warn!(%old, pods = left, "local pods still hold addresses of the old subnet");
            }
            self.held.old = Some((old, left));
        }
    }
}
