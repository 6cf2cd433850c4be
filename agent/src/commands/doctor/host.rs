//! The host's side: the kernel, the bpffs the pins live on, reverse-path
//! filtering and the uplink's offloads.

use std::path::Path;

use super::findings::Findings;
use crate::{
    dataplane::{KernelFeatures, kernel_features, read_iface_sysctl, read_sysctl},
    sys::{
        ethtool::{gro, tx_checksum},
        fs::{filesystem_seen_by, host_pid, is_bpffs, mount_namespace},
    },
};

pub(super) fn kernel(f: &mut Findings, state_dir: &Path) {
    // The agent's own probes (kept for this boot in its state directory,
    // or run now), in its words.
    let k = KernelFeatures::probe(Some(state_dir), false);
    match k.missing() {
        Some(missing) => f.fail("kernel", missing, "upgrade the kernel"),
        None => {
            let have = k.features.iter().filter(|f| f.available).count();
            f.ok(
                "kernel",
                format!(
                    "Linux {} with BTF and TCX links: {have} of {} kernel features Weft uses ({})",
                    k.release,
                    k.features.len(),
                    k.features
                        .iter()
                        .filter(|f| f.available)
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        }
    }
    // Where the fast path's kfuncs come from: vmlinux, or the module and
    // its BTF id.
    if let Some(ct) = k.found(kernel_features::CONNTRACK) {
        f.ok("kernel", format!("{}: {ct}", kernel_features::CONNTRACK));
    }
    for d in k.degraded() {
        f.warn("kernel", d.to_string(), fix(d.feature));
    }
}

/// What brings an optional feature back.
fn fix(feature: &str) -> &'static str {
    match feature {
        kernel_features::CONNTRACK => {
            "a kernel whose conntrack has BTF (CONFIG_NF_CONNTRACK=y, or =m with CONFIG_DEBUG_INFO_BTF_MODULES=y) for the fast path"
        }
        kernel_features::XDP_MARK | kernel_features::XDP => {
            "nothing to do under --xdp-mode auto: TC decapsulates and keeps the fast path"
        }
        kernel_features::NETKIT => "Linux 6.7 or later for netkit pods; veth pods work",
        _ => "a kernel with this feature",
    }
}

/// A mount's propagation (`/proc/<pid>/mountinfo`'s optional fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Propagation {
    Shared,
    Slave,
    Private,
}

/// Whether the agent's pins are the host's. What matters is the bpffs
/// instance under the pin directory, not the mount's propagation: a
/// container given the host's bpffs shares its pins even through a private
/// bind, and one that mounted a bpffs of its own loses them with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pins {
    /// The agent is in the host's mount namespace (a plain daemon).
    HostNamespace,
    /// The agent has a mount namespace of its own whose pin directory is
    /// the host's bpffs.
    HostFilesystem,
    /// The agent's pin directory is a bpffs of its own mount namespace.
    OwnFilesystem,
    /// Not known: no status report names the agent, or the host's
    /// namespaces cannot be seen from here.
    Unknown,
}

/// Decides [`Pins`] from the mount namespaces of the agent and the host,
/// and the filesystem each sees at the pin directory.
fn classify(
    agent_ns: Option<u64>,
    host_ns: Option<u64>,
    agent_fs: Option<u64>,
    host_fs: Option<u64>,
) -> Pins {
    match (agent_ns, host_ns) {
        (Some(a), Some(h)) if a == h => Pins::HostNamespace,
        (Some(_), Some(_)) => match (agent_fs, host_fs) {
            (Some(a), Some(h)) if a == h => Pins::HostFilesystem,
            // Another instance, or none at all on the host at that path.
            (Some(_), _) => Pins::OwnFilesystem,
            (None, _) => Pins::Unknown,
        },
        _ => Pins::Unknown,
    }
}

pub(super) fn bpffs(f: &mut Findings, pins: &Path, agent_pid: Option<u32>) {
    // The pin directory, or the nearest existing parent.
    let mut at = pins.to_path_buf();
    while !at.exists() {
        if !at.pop() {
            break;
        }
    }
    if !is_bpffs(&at).unwrap_or(false) {
        f.fail(
            "bpffs",
            format!("{} is not on a bpffs", at.display()),
            format!("mount -t bpf bpf {} (setup does)", at.display()),
        );
        return;
    }
    let host = host_pid();
    let verdict = classify(
        agent_pid.and_then(mount_namespace),
        host.and_then(mount_namespace),
        agent_pid.and_then(|p| filesystem_seen_by(p, &at)),
        host.and_then(|p| filesystem_seen_by(p, &at)),
    );
    let mount = mount_of(&at, "/proc/self/mountinfo");
    let point = mount
        .as_ref()
        .map_or_else(|| at.display().to_string(), |m| m.0.clone());
    let seen = format!("{} on bpffs {point}", pins.display());
    match verdict {
        Pins::HostNamespace => f.ok(
            "bpffs",
            format!("{seen} (the agent is in the host's mount namespace)"),
        ),
        Pins::HostFilesystem => f.ok(
            "bpffs",
            format!("{seen} (the agent's mount namespace has the host's bpffs there)"),
        ),
        Pins::OwnFilesystem => f.fail(
            "bpffs",
            format!("the agent's pins under {} are on a bpffs of its own mount namespace, not the host's: they go with its container, and a restarted agent cannot adopt its programs", pins.display()),
            format!("give the agent the host's bpffs: mount -t bpf bpf {point} on the host before it starts (in Kubernetes: the host's /sys/fs/bpf as a hostPath volume with mountPropagation: Bidirectional)"),
        ),
        Pins::Unknown => match mount.map(|m| m.1) {
            Some(Propagation::Private) => f.warn(
                "bpffs",
                format!("{seen}, a private mount; whether the agent's pins are the host's cannot be told from here (no status report names the agent, or the host's namespaces are hidden)"),
                "run weft doctor on the host, with the agent's --state-dir",
            ),
            _ => f.ok("bpffs", seen),
        },
    }
}

/// The mount point holding `path` in `mountinfo`, and its propagation.
fn mount_of(path: &Path, mountinfo: &str) -> Option<(String, Propagation)> {
    let path = std::fs::canonicalize(path).ok()?;
    let info = std::fs::read_to_string(mountinfo).ok()?;
    deepest_mount(&path, &info)
}

fn deepest_mount(path: &Path, info: &str) -> Option<(String, Propagation)> {
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = f.get(4)?.to_string();
            let sep = f.iter().position(|x| *x == "-")?;
            let opts = f.get(6..sep)?;
            let p = if opts.iter().any(|o| o.starts_with("shared:")) {
                Propagation::Shared
            } else if opts.iter().any(|o| o.starts_with("master:")) {
                Propagation::Slave
            } else {
                Propagation::Private
            };
            path.starts_with(&point).then_some((point, p))
        })
        // The deepest mount (the last of equal depth wins: mounted later).
        .fold(None, |best: Option<(String, Propagation)>, m| match &best {
            Some(b) if b.0.len() > m.0.len() => best,
            _ => Some(m),
        })
}

pub(super) fn rp_filter(f: &mut Findings, uplink: &str) {
    let all = read_sysctl("net.ipv4.conf.all.rp_filter").unwrap_or_default();
    let dev = read_iface_sysctl("ipv4", uplink, "rp_filter").unwrap_or_default();
    // The kernel uses the larger of the two.
    let effective = all.clone().max(dev.clone());
    if effective == "1" {
        f.fail(
            "rp_filter",
            format!("strict on {uplink} (all={all}, {uplink}={dev}): decapsulated packets from other nodes' pods are dropped"),
            format!("sysctl -w net.ipv4.conf.{uplink}.rp_filter=2 net.ipv4.conf.all.rp_filter=2 (the agent sets the first)"),
        );
    } else {
        f.ok("rp_filter", format!("{uplink}: {dev}, all: {all}"));
    }
}

pub(super) fn offloads(f: &mut Findings, uplink: &str, xdp: bool) {
    let driver = std::fs::read_link(format!("/sys/class/net/{uplink}/device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "virtual".into());
    let on_off = |b: Option<bool>| match b {
        Some(true) => "on",
        Some(false) => "off",
        None => "unknown",
    };
    let gro = gro(uplink).ok();
    let csum = tx_checksum(uplink).ok();
    if xdp && gro == Some(false) {
        f.warn(
            "offloads",
            format!("GRO is off on {uplink}, where XDP decapsulates: decapsulated TCP is not merged, throughput suffers"),
            format!("ethtool -K {uplink} gro on (the agent turns it on at start)"),
        );
    } else if driver == "vmxnet3" && csum == Some(true) {
        f.warn(
            "offloads",
            format!("{uplink} uses vmxnet3 with transmit checksum offload: some versions corrupt VXLAN checksums on UDP 8472 (flannel #1279)"),
            format!("ethtool -K {uplink} tx-checksum-ip-generic off, if pods across nodes see TCP stalls"),
        );
    } else {
        f.ok(
            "offloads",
            format!(
                "{uplink} ({driver}): GRO {}, transmit checksum offload {}",
                on_off(gro),
                on_off(csum)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_judged_by_the_filesystem_not_the_propagation() {
        use Pins::*;
        // A plain daemon: the host's namespace, whatever the mounts.
        assert_eq!(classify(Some(1), Some(1), Some(7), Some(7)), HostNamespace);
        assert_eq!(classify(Some(1), Some(1), None, None), HostNamespace);
        // A container given the host's bpffs, and one with its own.
        assert_eq!(classify(Some(2), Some(1), Some(7), Some(7)), HostFilesystem);
        assert_eq!(classify(Some(2), Some(1), Some(8), Some(7)), OwnFilesystem);
        assert_eq!(classify(Some(2), Some(1), Some(8), None), OwnFilesystem);
        // What cannot be seen is not judged.
        assert_eq!(classify(None, Some(1), None, Some(7)), Unknown);
        assert_eq!(classify(Some(2), None, Some(8), None), Unknown);
        assert_eq!(classify(Some(2), Some(1), None, Some(7)), Unknown);
    }

    #[test]
    fn the_deepest_mount_holds_a_path() {
        let info = "\
22 1 0:21 / / rw shared:1 - ext4 /dev/vda rw
30 22 0:30 / /sys/fs/bpf rw,nosuid shared:9 - bpf bpf rw
41 30 0:41 / /sys/fs/bpf/weft rw master:12 - bpf bpf rw
42 30 0:42 / /sys/fs/bpf/other rw - bpf bpf rw
";
        let at = |p: &str| deepest_mount(Path::new(p), info);
        assert_eq!(
            at("/sys/fs/bpf/weft/maps"),
            Some(("/sys/fs/bpf/weft".into(), Propagation::Slave))
        );
        assert_eq!(
            at("/sys/fs/bpf/other"),
            Some(("/sys/fs/bpf/other".into(), Propagation::Private))
        );
        assert_eq!(
            at("/sys/fs/bpf"),
            Some(("/sys/fs/bpf".into(), Propagation::Shared))
        );
        assert_eq!(at("/etc"), Some(("/".into(), Propagation::Shared)));
    }
}
