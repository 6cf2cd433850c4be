//! The check that the programs in the links reach the peers, run beside
//! the loop on a thread of its own, and what its outcome does.

use super::*;

/// The check of the programs in the links, while it runs or waits.
#[derive(Default)]
pub(super) struct Verify {
    /// Running on a thread of its own (an exit does not wait for it).
    pub(super) running: Option<std::thread::JoinHandle<Result<usize, String>>>,
    /// When the next check may start (after one that failed).
    pub(super) at: Option<tokio::time::Instant>,
}

impl Agent {
    /// Checks, once the peer table is complete, that the programs in the
    /// links reach a sample of the peers where nothing proved it before
    /// (nothing answered before a swap, or there was no swap: a reboot);
    /// the node is not ready until they do. A failed check puts back the
    /// previous generation where it is verified; otherwise it is tried
    /// again 2 s after.
    pub(super) fn verify_programs(&mut self) {
        if self
            .verify
            .running
            .as_ref()
            .is_some_and(|h| !h.is_finished())
        {
            return;
        }
        if let Some(h) = self.verify.running.take() {
            let checked = h
                .join()
                .unwrap_or_else(|_| Err("the check did not finish".into()));
            match self.dataplane.verify(checked) {
                Ok(Verified::Reached(0)) => tracing::warn!(
                    "no sampled peer answers on the underlay: nothing to check the programs in the links against (checked again at the next start)"
                ),
                Ok(Verified::Reached(n)) => {
                    tracing::info!(
                        answered = n,
                        "the programs in the links reach the peers: verified"
                    )
                }
                Ok(Verified::RolledBack(why)) => {
                    tracing::error!(%why, "the programs in the links do not reach the peers: rolled back to the verified programs before them");
                }
                Ok(Verified::Lost(why)) => {
                    tracing::error!(%why, "the programs in the links do not reach the peers and no verified programs are pinned to roll back to: not ready, checking again");
                    self.verify.at = Some(tokio::time::Instant::now() + VERIFY_RETRY);
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "cannot act on the check of the programs");
                    self.verify.at = Some(tokio::time::Instant::now() + VERIFY_RETRY);
                }
            }
            return;
        }
        if !self.held.synced
            || self
                .verify
                .at
                .is_some_and(|t| tokio::time::Instant::now() < t)
        {
            return;
        }
        let Some(targets) = self.dataplane.unverified_targets() else {
            return;
        };
        if targets.is_empty() {
            // No peers: nothing to reach (the generation stays unmarked).
            if let Err(e) = self.dataplane.verify(Ok(0)) {
                tracing::error!(error = %format!("{e:#}"), "cannot act on the check of the programs");
            }
            return;
        }
        tracing::info!(
            peers = targets.len(),
            "checking that the programs in the links reach the peers"
        );
        match std::thread::Builder::new()
            .name("weft-verify".into())
            .spawn(move || crate::dataplane::check_reach(&targets))
        {
            Ok(h) => self.verify.running = Some(h),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the check of the programs");
                self.verify.at = Some(tokio::time::Instant::now() + VERIFY_RETRY);
            }
        }
    }
}
