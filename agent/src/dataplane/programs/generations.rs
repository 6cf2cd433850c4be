//! Program generations: the programs in the links (`programs/`) and the
//! ones they replaced (`programs-previous/`), pinned by name under the
//! agent's pin directory.
//!
//! An agent that installs its programs moves the current generation to
//! `programs-previous/` and pins its own as `programs/`; every attach, and
//! every check that a program is still attached, goes through
//! `programs/`. So `weft rollback` (or the agent itself) puts the previous
//! generation back by swapping it into each link and swapping the two
//! directories, and a running agent follows. Each generation records its
//! map layout version as an empty directory `layout-v<N>` inside it (a bpf
//! filesystem holds no regular files): a rollback stays within one layout.
//!
//! A generation that has reached the node's peers through the real devices
//! (the agent's check after a swap, or after the first sync) is marked
//! `verified` the same way. An install keeps a verified previous
//! generation rather than replace it by one never verified: an agent
//! killed between its swap and its check (an OOM kill, a second rollout,
//! a power loss) leaves the last good programs to roll back to.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::programs::{
    Program, SchedClassifier, Xdp,
    links::{FdLink, LinkType, PinnedLink},
    tc::SchedClassifierLink,
    xdp::XdpLink,
};
use aya_obj::programs::XdpAttachType;
use dataplane_common::{LAYOUT_VERSION, program_names};

use crate::dataplane::netkit;
use crate::dataplane::programs::ids::program_info;
use crate::dataplane::programs::ids::program_name;
use crate::sys::bpffs::PinDir;

/// Every program of the object, by name; `true` for the XDP one.
const ALL: [(&str, bool); 9] = [
    (program_names::ENCAP, false),
    (program_names::ENCAP6, false),
    (program_names::TUNNEL_RX, false),
    (program_names::DECAP_XDP, true),
    (program_names::DECAP_TC, false),
    (program_names::FROM_POD, false),
    (program_names::DELIVER, false),
    (program_names::FROM_WG, false),
    (program_names::FROM_POD_WG, false),
];

pub(crate) const CURRENT: &str = "programs";
pub(crate) const PREVIOUS: &str = "programs-previous";
/// The marker of a generation that has reached the peers.
const VERIFIED: &str = "verified";

fn current(pins: &PinDir) -> PathBuf {
    pins.root().join(CURRENT)
}

fn previous(pins: &PinDir) -> PathBuf {
    pins.root().join(PREVIOUS)
}

/// The programs of one generation, opened from their pins.
pub(crate) type Generation = HashMap<String, Program>;

/// Pins `programs` (loaded, by name) as the current generation; the
/// generation it replaces becomes the previous one (an older previous one
/// is dropped). Nothing attached changes. A program the kernel could not
/// load where it is optional (the XDP one) is simply not in it.
pub(crate) fn install(pins: &PinDir, programs: &BTreeMap<String, OwnedFd>) -> Result<()> {
    // Programs an earlier release attached without pinning a generation
    // become the previous one all the same.
    if !current(pins).exists() && pins.has_links() {
        running(pins)?;
        // They were forwarding: the best known to roll back to.
        mark_verified(pins)?;
    }
    let staging = pins.root().join("programs-new");
    remove_dir(&staging)?;
    std::fs::create_dir_all(staging.join(layout_marker(LAYOUT_VERSION)))
        .with_context(|| format!("creating {}", staging.display()))?;
    for (name, is_xdp) in ALL {
        let Some(fd) = programs.get(name) else {
            if is_xdp {
                continue;
            }
            bail!("program {name} was not loaded");
        };
        crate::sys::bpf::pin(fd.as_fd(), &staging.join(name))
            .with_context(|| format!("pinning program {name}"))?;
    }
    let (cur, prev) = (current(pins), previous(pins));
    if cur.exists() {
        if !is_verified(&cur) && is_verified(&prev) {
            // Never verified (its agent died before its check): the last
            // verified generation stays the one to roll back to.
            tracing::warn!(
                "the programs installed last never reached the peers: keeping the verified ones before them to roll back to"
            );
            remove_dir(&cur)?;
        } else {
            remove_dir(&prev)?;
            rename(&cur, &prev)?;
        }
    }
    rename(&staging, &cur)
}

fn is_verified(generation: &Path) -> bool {
    generation.join(VERIFIED).is_dir()
}

/// Marks the current generation verified: it reached the peers.
pub(crate) fn mark_verified(pins: &PinDir) -> Result<()> {
    let dir = current(pins).join(VERIFIED);
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

/// Whether the current generation is verified.
pub(crate) fn current_verified(pins: &PinDir) -> bool {
    is_verified(&current(pins))
}

/// Whether a verified previous generation of this map layout is pinned
/// (one a rollback can put back).
pub(crate) fn previous_verified(pins: &PinDir) -> bool {
    let prev = previous(pins);
    is_verified(&prev) && layout_of(&prev) == Some(LAYOUT_VERSION)
}

/// The current generation, opened from its pins.
pub(crate) fn open(pins: &PinDir) -> Result<Generation> {
    open_dir(&current(pins))
}

fn open_dir(dir: &Path) -> Result<Generation> {
    let mut out = HashMap::new();
    for (name, xdp) in ALL {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let p = if xdp {
            Program::Xdp(Xdp::from_pin(&path, XdpAttachType::Interface)?)
        } else {
            Program::SchedClassifier(SchedClassifier::from_pin(&path)?)
        };
        out.insert(name.to_string(), p);
    }
    Ok(out)
}

/// The programs running now, as a generation: the current pins, or (where
/// an agent of an earlier release left no program pins) the programs in
/// the links, which are pinned as the current generation then.
pub(crate) fn running(pins: &PinDir) -> Result<Generation> {
    let cur = current(pins);
    if cur.exists() {
        return open(pins);
    }
    std::fs::create_dir_all(&cur).with_context(|| format!("creating {}", cur.display()))?;
    for (name, id) in linked_programs(pins)? {
        let Some((_, xdp)) = ALL.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let path = cur.join(&name);
        if path.exists() {
            continue;
        }
        let info = program_info(id).ok_or_else(|| anyhow!("program {name} (id {id}) is gone"))?;
        let mut p = if *xdp {
            Program::Xdp(Xdp::from_program_info(
                info,
                name.clone().into(),
                XdpAttachType::Interface,
            )?)
        } else {
            Program::SchedClassifier(SchedClassifier::from_program_info(
                info,
                name.clone().into(),
            )?)
        };
        p.pin(&path)
            .with_context(|| format!("pinning the running program {name}"))?;
    }
    open(pins)
}

/// (program name, program id) of what each pinned link runs.
fn linked_programs(pins: &PinDir) -> Result<Vec<(String, u32)>> {
    Ok(links(pins)?
        .into_iter()
        .map(|l| (l.program, l.program_id))
        .collect())
}

/// A pinned link and the program it runs.
struct Linked {
    path: PathBuf,
    link: FdLink,
    program: String,
    program_id: u32,
}

/// Every pinned link whose program is known (a link that cannot be opened
/// or read is left out).
fn links(pins: &PinDir) -> Result<Vec<Linked>> {
    let paths: Vec<PathBuf> = match std::fs::read_dir(pins.links()) {
        Ok(d) => d.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(e).with_context(|| format!("reading {}", pins.links().display()));
        }
    };
    Ok(paths
        .into_iter()
        .filter_map(|path| {
            let link: FdLink = PinnedLink::from_pin(&path).ok()?.into();
            let program_id = link.info().ok()?.program_id();
            let program = program_name(program_id)?;
            Some(Linked {
                path,
                link,
                program,
                program_id,
            })
        })
        .collect())
}

/// The ids of a generation's programs, by name.
pub(crate) fn ids(g: &Generation) -> HashMap<String, u32> {
    g.iter()
        .filter_map(|(n, p)| p.info().ok().map(|i| (n.clone(), i.id())))
        .collect()
}

/// The ids of the current generation's pins, by name (without keeping
/// them open).
pub(crate) fn current_ids(pins: &PinDir) -> Result<HashMap<String, u32>> {
    Ok(ids(&open(pins)?))
}

/// Whether a previous generation is pinned, and its layout version.
fn previous_layout(pins: &PinDir) -> Option<u32> {
    layout_of(&previous(pins))
}

fn layout_of(dir: &Path) -> Option<u32> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .find_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("layout-v")?
                .parse()
                .ok()
        })
}

fn layout_marker(version: u32) -> String {
    format!("layout-v{version}")
}

/// One link a rollback changed.
#[derive(Clone, Debug)]
pub struct Swapped {
    pub link: String,
    pub program: String,
    pub from_id: u32,
    pub to_id: u32,
}

/// Puts the previous generation back: makes it the current generation and
/// the replaced one the previous, then swaps it into every link that runs
/// a program of the replaced one (atomically per link). Refused where no
/// previous generation is pinned or it has another map layout than the
/// maps in use.
pub(crate) fn rollback(pins: &PinDir) -> Result<Vec<Swapped>> {
    let prev_dir = previous(pins);
    let Some(layout) = previous_layout(pins) else {
        bail!(
            "no previous programs are pinned under {} (nothing was upgraded here, or it was rolled back already)",
            prev_dir.display()
        );
    };
    if layout != LAYOUT_VERSION {
        bail!(
            "the previous programs use map layout version {layout}, this agent's maps version {LAYOUT_VERSION}: roll back by running the previous agent release"
        );
    }
    let mut prev = open_dir(&prev_dir)?;
    // The directories first: an agent that looks between the two steps
    // finds the previous generation current and attaches it itself.
    let (cur, tmp) = (current(pins), pins.root().join("programs-swap"));
    remove_dir(&tmp)?;
    rename(&cur, &tmp)?;
    rename(&prev_dir, &cur)?;
    rename(&tmp, &prev_dir)?;
    let mut out = Vec::new();
    for Linked {
        path,
        link,
        program: name,
        program_id: from_id,
    } in links(pins)?
    {
        let Some(p) = prev.get_mut(&name) else {
            continue;
        };
        let to_id = p.info()?.id();
        if to_id != from_id {
            swap_into(p, link, &path)
                .with_context(|| format!("swapping {name} into {}", path.display()))?;
        }
        out.push(Swapped {
            link: path
                .file_name()
                .map(|n| n.to_string_lossy().replace(':', "."))
                .unwrap_or_default(),
            program: name,
            from_id,
            to_id,
        });
    }
    Ok(out)
}

/// Replaces the program `link` (pinned at `path`) runs by `p`
/// (`bpf_link_update`).
fn swap_into(p: &mut Program, link: FdLink, path: &Path) -> Result<()> {
    if link.info()?.link_type()? == LinkType::Netkit {
        // aya has no netkit links: the pin is opened and updated directly.
        let Program::SchedClassifier(p) = p else {
            bail!("a netkit link runs only TC programs");
        };
        let fd = netkit::open_pin(path)?.ok_or_else(|| anyhow!("the pin is gone"))?;
        netkit::update(fd.as_fd(), p.fd()?.as_fd())?;
        return Ok(());
    }
    match p {
        Program::SchedClassifier(p) => {
            p.attach_to_link(SchedClassifierLink::try_from(link)?)?;
        }
        Program::Xdp(p) => {
            p.attach_to_link(XdpLink::try_from(link)?)?;
        }
        _ => bail!("neither an XDP nor a TC program"),
    }
    Ok(())
}

/// Removes both generations' pins (teardown).
pub(crate) fn remove_all(pins: &PinDir) -> Result<()> {
    for d in [current(pins), previous(pins)] {
        remove_dir(&d)?;
    }
    Ok(())
}

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to)
        .with_context(|| format!("renaming {} to {}", from.display(), to.display()))
}
