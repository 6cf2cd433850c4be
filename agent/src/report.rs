//! The agent's report for `weft status`: `<state-dir>/status.json`, written
//! whenever what it says changes.
//!
//! `weft status` reads the kernel (pinned maps, links, routes) itself; this
//! adds what only the agent knows: peers it could not program and why,
//! leases it rejected and why, and whether it waits for pods to leave an old
//! subnet.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

/// The file's name in the state directory.
pub(crate) const FILE: &str = "status.json";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Report {
    pub(crate) subnet: Option<String>,
    pub(crate) ready: bool,
    /// The subnet this node held before its lease was lost and it got
    /// another, while local pods still have addresses in it.
    pub(crate) old_subnet: Option<OldSubnet>,
    /// Peers not (fully) programmed.
    pub(crate) problems: Vec<PeerProblem>,
    /// Leases this node does not program (the first
    /// [`Report::REJECTED_SHOWN`] by key).
    pub(crate) rejected: Vec<RejectedLease>,
    /// How many leases are rejected in all.
    #[serde(default)]
    pub(crate) rejected_total: usize,
    /// Keys under the subnets prefix that held no lease in the watch's last
    /// list: how many, and the first few with why.
    #[serde(default)]
    pub(crate) skipped_keys: u64,
    #[serde(default)]
    pub(crate) skipped_examples: Vec<(String, String)>,
    /// `--host-routing`.
    pub(crate) host_routing: String,
    /// Local pods host routing reaches directly.
    pub(crate) endpoints: usize,
    /// How many of the pods' registrations were adopted from the runtime's
    /// CNI result cache (pods Weft's plugin did not attach).
    #[serde(default)]
    pub(crate) endpoints_adopted: usize,
    /// Pods' registrations not fit for host routing, and why (their pods
    /// take the host stack).
    #[serde(default)]
    pub(crate) endpoints_rejected: Vec<RejectedEndpoint>,
    /// Where decapsulation runs, and why.
    pub(crate) decap: Option<Decap>,
    /// `--ip-masq`.
    #[serde(default)]
    pub(crate) masquerade: bool,
    /// The drop trace (`--trace-drops`, `weft trace-drops`).
    #[serde(default)]
    pub(crate) trace_drops: bool,
    /// The overlay device's MTU.
    #[serde(default)]
    pub(crate) mtu: Option<u32>,
    /// Another live node that claims this node's public IP.
    #[serde(default)]
    pub(crate) conflict: Option<IpConflict>,
    /// The agent's process id (`weft doctor` compares its mount namespace
    /// with the host's).
    #[serde(default)]
    pub(crate) pid: Option<u32>,
    /// The programs in use: the self-test of this build's, whether an
    /// upgrade was refused or rolled back, their ids.
    #[serde(default)]
    pub(crate) programs: Option<Programs>,
    /// Each peer as the continuous probes find it.
    #[serde(default)]
    pub(crate) peer_health: Vec<PeerHealth>,
    /// The kernel's features as probed at start.
    #[serde(default)]
    pub(crate) kernel: Option<Kernel>,
}

/// The kernel the dataplane runs on, and which of its features Weft has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Kernel {
    pub(crate) release: String,
    pub(crate) features: Vec<KernelFeature>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KernelFeature {
    pub(crate) name: String,
    pub(crate) required: bool,
    pub(crate) available: bool,
    /// What the probe found (the kernel's words where it refused).
    pub(crate) detail: String,
    /// Where it is missing: what is lost, and what the node does instead.
    #[serde(default)]
    pub(crate) lost: Option<String>,
    #[serde(default)]
    pub(crate) instead: Option<String>,
}

impl Kernel {
    pub(crate) fn of(k: &crate::dataplane::KernelFeatures) -> Self {
        let degraded = k.degraded();
        Self {
            release: k.release.clone(),
            features: k
                .features
                .iter()
                .map(|f| {
                    let d = degraded.iter().find(|d| d.feature == f.name);
                    KernelFeature {
                        name: f.name.clone(),
                        required: f.required,
                        available: f.available,
                        detail: f.detail.clone(),
                        lost: d.map(|d| d.lost.to_string()),
                        instead: d.map(|d| d.instead.to_string()),
                    }
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PeerHealth {
    pub(crate) subnet: String,
    pub(crate) vtep: String,
    /// reachable, unreachable or unknown.
    pub(crate) state: String,
    /// The last answered probe's round trip, in µs (to 0.1 ms).
    pub(crate) rtt_us: Option<u64>,
    /// Why the last probe failed, while it has.
    pub(crate) error: Option<String>,
    /// The largest outer packet the path to it was measured to carry
    /// (per-peer path MTU), and when (seconds since the epoch).
    #[serde(default)]
    pub(crate) path_mtu: Option<u32>,
    #[serde(default)]
    pub(crate) path_mtu_measured: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Programs {
    pub(crate) selftest_cases: usize,
    pub(crate) selftest_failed: Vec<String>,
    pub(crate) upgrade_refused: bool,
    pub(crate) rolled_back: bool,
    #[serde(default)]
    pub(crate) rollback_reason: Option<String>,
    /// The programs in the links have reached the peers (a report of an
    /// earlier release says nothing: taken as verified).
    #[serde(default = "yes")]
    pub(crate) verified: bool,
    pub(crate) ids: std::collections::BTreeMap<String, u32>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IpConflict {
    /// The other node's id.
    pub(crate) node: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Decap {
    pub(crate) hook: String,
    pub(crate) why: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OldSubnet {
    pub(crate) subnet: String,
    pub(crate) pods: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PeerProblem {
    pub(crate) subnet: String,
    pub(crate) vtep: String,
    pub(crate) problem: String,
    pub(crate) error: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RejectedEndpoint {
    /// The attachment: container id and interface name.
    pub(crate) owner: String,
    pub(crate) why: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RejectedLease {
    pub(crate) key: String,
    pub(crate) reason: String,
    pub(crate) detail: String,
}

/// Writes reports, skipping those equal to the last one written.
pub(crate) struct Reporter {
    path: PathBuf,
    last: Option<Report>,
}

impl Report {
    /// How many rejected leases the report names.
    pub(crate) const REJECTED_SHOWN: usize = 100;
}

impl Reporter {
    pub(crate) fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(FILE),
            last: None,
        }
    }

    pub(crate) fn write(&mut self, r: Report) {
        if self.last.as_ref() == Some(&r) {
            return;
        }
        match write_atomically(&self.path, &r) {
            Ok(()) => self.last = Some(r),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot write the status report"),
        }
    }
}

fn write_atomically(path: &Path, r: &Report) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{FILE}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(r)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// The last report the agent wrote, if any.
pub(crate) fn read(state_dir: &Path) -> Option<Report> {
    let text = std::fs::read(state_dir.join(FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}
