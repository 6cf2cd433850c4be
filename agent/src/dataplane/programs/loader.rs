//! Loads Weft's eBPF object and attaches its programs through pinned links.
//!
//! Maps are pinned by name under `<pins>/maps` and links under `<pins>/links`,
//! one file per attach point named `<kind>-<ifname>-<ifindex>`. An agent that
//! starts where pins already exist loads the programs again and swaps them
//! into the existing links atomically (`bpf_link_update`), so traffic never
//! sees a moment without a program, and the maps keep their entries.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::maps::{MapData, MapInfo};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        LinkOrder, Program, SchedClassifier, TcAttachType, Xdp, XdpMode as AyaXdpMode,
        links::{FdLink, LinkError},
        tc::{SchedClassifierLink, TcAttachOptions},
        xdp::XdpLink,
    },
};
use aya_obj::maps::PinningType;
use dataplane_common::map_names;

use crate::sys::bpf::ProgType;

use crate::dataplane::netkit;
use crate::dataplane::netkit::NetkitHook;
use crate::dataplane::programs::generations;
use crate::dataplane::programs::generations::Generation;
use crate::dataplane::programs::kernel::ProgramKernel;
use crate::dataplane::programs::kfuncs;
use crate::dataplane::programs::kfuncs::KernelBtf;
use crate::dataplane::programs::links::{
    Hook, attached_programs, ifindex, link_pin_path, open_pinned_link, os_error, remove_pin,
};
use crate::dataplane::programs::load;
use crate::dataplane::programs::object::OBJECT;
use crate::dataplane::types::XdpMode;
use crate::sys::bpffs::PinDir;

/// The outcome of one attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub program: &'static str,
    pub iface: String,
    pub hook: Hook,
    /// The XDP mode in use (None for TC).
    pub xdp_mode: Option<XdpMode>,
    /// True when an existing pinned link was reused (the program swapped in
    /// place), false when a new link was created.
    pub adopted: bool,
}

fn aya_mode(mode: XdpMode) -> AyaXdpMode {
    match mode {
        XdpMode::Native => AyaXdpMode::Driver,
        XdpMode::Generic => AyaXdpMode::Skb,
        XdpMode::Auto | XdpMode::Off => AyaXdpMode::Default,
    }
}

/// How to load the object.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Capacity of the peer maps.
    pub max_peers: u32,
    /// A fault put into the programs on purpose (`dataplane_common::FAULT_*`;
    /// the agent's hidden `--inject-fault`, for tests of the upgrade gate).
    pub fault: u32,
    /// What the kernel lets the programs do.
    pub kernel: ProgramKernel,
}

impl LoadOptions {
    /// The defaults, for the kernel `kernel` says this is.
    pub fn for_kernel(kernel: ProgramKernel) -> Self {
        Self {
            max_peers: dataplane_common::MAX_PEERS,
            fault: dataplane_common::FAULT_NONE,
            kernel,
        }
    }
}

/// A pinned map that this load did not reuse, still open so its contents
/// can be carried over.
pub(crate) struct Replaced {
    pub(crate) name: String,
    pub(crate) old: MapData,
    /// The old map's layout version.
    pub(crate) version: u32,
}

/// The loaded object: programs ready to attach, maps pinned.
pub struct Loaded {
    /// The maps (aya created or reused them) and the drop trace's buffer.
    ebpf: Ebpf,
    /// This load's programs, in the kernel (not attached anywhere yet).
    programs: BTreeMap<String, OwnedFd>,
    /// The programs attaches use: the current generation's pins (see
    /// [`generations`]), after [`Loaded::install`] or
    /// [`Loaded::keep_running`].
    active: Generation,
    pins: PinDir,
    replaced: Vec<Replaced>,
    conntrack: bool,
    /// The XDP program is part of this load (the kernel has XDP for it).
    xdp: bool,
}

impl Loaded {
    /// Loads the embedded object. Maps pinned under `pins` with exactly the
    /// layout this object expects (type, key and value size, capacity,
    /// flags) are reused with their contents; any other pin of that name is
    /// replaced (kept open for [`Loaded::take_replaced`]), as are maps
    /// missing here but pinned by another layout version; the rest are
    /// created and pinned.
    pub fn load(pins: &PinDir, opts: &LoadOptions) -> Result<Self> {
        pins.ensure()?;
        let replaced = check_pins(pins, opts)?;
        // The drop trace's records are always compiled in; the config's
        // CONFIG_F_TRACE_DROPS says at run time whether a drop is logged.
        let level = aya_log::Level::Warn as u8;
        // The conntrack kfuncs, resolved against this kernel where its
        // probe found them (else stubbed: then no flow passes the gate;
        // the agent said so once at start).
        let btf = match opts.kernel.ct_opts_size {
            None => None,
            Some(_) => match KernelBtf::read() {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "the conntrack kfuncs are gone since the kernel was probed: no flow bypasses the host stack under --host-routing auto");
                    None
                }
            },
        };
        let object = kfuncs::resolve(OBJECT, btf.as_ref())?;
        let o = btf.as_ref().map(|b| b.nf_conn).unwrap_or_default();
        let xdp_meta = u32::from(opts.kernel.xdp_mark);
        let ct_opts_size = opts.kernel.ct_opts_size.unwrap_or(12);
        let ebpf = EbpfLoader::new()
            .override_global(aya_log::LEVEL, &level, true)
            .override_global("XDP_META", &xdp_meta, true)
            .override_global("CT_OPTS_SZ", &ct_opts_size, true)
            .override_global("NF_CONN_STATUS_OFF", &o.status, true)
            .override_global("NF_CONN_TIMEOUT_OFF", &o.timeout, true)
            .override_global("NF_CONN_TCP_STATE_OFF", &o.tcp_state, true)
            .override_global("NF_CONN_TCP_FLAGS0_OFF", &o.tcp_flags[0], true)
            .override_global("NF_CONN_TCP_FLAGS1_OFF", &o.tcp_flags[1], true)
            .override_global("FAULT", &opts.fault, true)
            .map_max_entries(map_names::PEERS, opts.max_peers)
            .map_max_entries(map_names::VTEPS, opts.max_peers)
            .map_max_entries(map_names::PEERS6, opts.max_peers)
            .map_max_entries(map_names::VTEPS6, opts.max_peers)
            .default_map_pin_directory(pins.maps())
            .load(object.bytes())
            .context("loading the eBPF object's maps")?;
        // The module's BTF (conntrack a module), held until the programs
        // are loaded: each then holds the module itself.
        let module = match &btf {
            Some(b) => b.open_module()?,
            None => None,
        };
        let mut programs = BTreeMap::new();
        let mut xdp = opts.kernel.xdp;
        for (name, p) in load::load_all(object.bytes(), &ebpf, module.as_ref())? {
            match (p.ty, p.fd) {
                (ProgType::Xdp, _) if !opts.kernel.xdp => {}
                (_, Ok(fd)) => {
                    programs.insert(name, fd);
                }
                // XDP decapsulation is optional: TC decapsulates instead.
                (ProgType::Xdp, Err(e)) => {
                    tracing::warn!(program = %name, error = %e, "the kernel refuses the XDP decapsulation program: decapsulating in TC");
                    xdp = false;
                }
                (ty, Err(e)) => {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("loading {} program {name}", ty.as_str()));
                }
            }
        }
        Ok(Self {
            ebpf,
            programs,
            active: Generation::new(),
            pins: pins.clone(),
            replaced,
            conntrack: btf.is_some(),
            xdp,
        })
    }

    /// Makes this load's programs the current generation (pinned; the one
    /// before becomes the previous generation) and the ones attaches use.
    /// Nothing attached changes until they are attached. The XDP program
    /// is left out where the kernel has no XDP for it, or refuses it: XDP
    /// decapsulation is optional (TC decapsulates instead).
    pub fn install(&mut self) -> Result<()> {
        generations::install(&self.pins, &self.programs)?;
        self.active = generations::open(&self.pins)?;
        Ok(())
    }

    /// Attaches use the programs running now instead of this load's (an
    /// upgrade whose programs failed their self-test).
    pub(crate) fn keep_running(&mut self) -> Result<()> {
        self.active = generations::running(&self.pins)?;
        Ok(())
    }

    /// Follows the current generation's pins where they changed under us
    /// (`weft rollback`); returns whether they had.
    pub(crate) fn follow_pins(&mut self) -> Result<bool> {
        let pinned = generations::current_ids(&self.pins)?;
        if pinned.is_empty() || pinned == generations::ids(&self.active) {
            return Ok(false);
        }
        self.active = generations::open(&self.pins)?;
        Ok(true)
    }

    pub(crate) fn pins(&self) -> &PinDir {
        &self.pins
    }

    /// The ids of the programs attaches use, by name.
    pub(crate) fn active_ids(&self) -> std::collections::HashMap<String, u32> {
        generations::ids(&self.active)
    }

    fn active_mut(&mut self, program: &str) -> Result<&mut Program> {
        self.active.get_mut(program).ok_or_else(|| {
            anyhow!(
                "program {program} is not among the installed programs ({})",
                self.pins.root().display()
            )
        })
    }

    /// Whether the conntrack kfuncs were resolved (the gate of
    /// `--host-routing auto` works).
    pub(crate) fn has_conntrack(&self) -> bool {
        self.conntrack
    }

    /// Whether the XDP decapsulation program can be attached.
    pub(crate) fn has_xdp(&self) -> bool {
        self.xdp
            && self
                .active
                .contains_key(dataplane_common::program_names::DECAP_XDP)
    }

    /// Whether `a`'s program, as loaded here, is still attached where `a`
    /// says (a device deleted, or a link unpinned or detached, detaches it).
    pub(crate) fn is_attached(&self, a: &Attachment) -> Result<bool> {
        let id = self
            .active
            .get(a.program)
            .ok_or_else(|| anyhow!("program {} is not among the installed programs", a.program))?
            .info()
            .with_context(|| format!("reading the id of program {}", a.program))?
            .id();
        if ifindex(&a.iface).is_err() {
            return Ok(false);
        }
        Ok(attached_programs(a.hook, &a.iface)?.contains(&id))
    }

    /// Runs `program` once on `frame` (`BPF_PROG_TEST_RUN`, nothing
    /// attached): its return value and the frame it left.
    pub(crate) fn test_run(&mut self, program: &str, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        let fd = self
            .programs
            .get(program)
            .ok_or_else(|| anyhow!("program {program} is not loaded"))?;
        // Room for what encapsulation adds.
        crate::sys::bpf::test_run(fd.as_fd(), frame, 256)
            .with_context(|| format!("test run of {program}"))
    }

    /// The pinned maps this load replaced.
    pub(crate) fn take_replaced(&mut self) -> Vec<Replaced> {
        std::mem::take(&mut self.replaced)
    }

    /// The reader of the programs' drop trace (aya-log's ring buffer). It
    /// owns the buffer, so the loaded object may be dropped after this.
    pub(crate) fn drop_logger(&mut self) -> Result<aya_log::EbpfLogger<&'static dyn log::Log>> {
        aya_log::EbpfLogger::init(&mut self.ebpf)
            .context("opening the eBPF programs' log buffer for the drop trace")
    }

    /// Attaches the XDP program `program` to `iface`. Modes are tried in the
    /// order given (e.g. native, then generic); a pinned link from an earlier
    /// run is updated in place instead, keeping its mode.
    pub fn attach_xdp(
        &mut self,
        program: &'static str,
        iface: &str,
        modes: &[XdpMode],
    ) -> Result<Attachment> {
        let ifindex = ifindex(iface)?;
        let pin = self.link_pin(Hook::Xdp, iface, ifindex);
        let prog: &mut Xdp = self.active_mut(program)?.try_into()?;
        if let Some(old) = open_pinned_link(&pin)? {
            let swapped = XdpLink::try_from(old)
                .map_err(anyhow::Error::from)
                .and_then(|link| prog.attach_to_link(link).map_err(anyhow::Error::from));
            match swapped {
                Ok(_) => {
                    return Ok(Attachment {
                        program,
                        iface: iface.to_string(),
                        hook: Hook::Xdp,
                        xdp_mode: None,
                        adopted: true,
                    });
                }
                Err(e) => {
                    tracing::warn!(pin = %pin.display(), error = %e, "pinned XDP link is unusable; attaching anew");
                    remove_pin(&pin)?;
                }
            }
        }
        let mut last_err = None;
        for mode in modes {
            match prog.attach_to_if_index(ifindex, aya_mode(*mode)) {
                Ok(id) => {
                    let link = prog.take_link(id)?;
                    let fd: FdLink = link.try_into().map_err(|e: LinkError| {
                        anyhow!("XDP on {iface} was attached through netlink, not a bpf link, so it cannot be pinned: {e}")
                    })?;
                    fd.pin(&pin)
                        .with_context(|| format!("pinning the XDP link at {}", pin.display()))?;
                    return Ok(Attachment {
                        program,
                        iface: iface.to_string(),
                        hook: Hook::Xdp,
                        xdp_mode: Some(*mode),
                        adopted: false,
                    });
                }
                Err(e) => {
                    tracing::debug!(iface, mode = mode.as_str(), error = %e, "XDP attach failed");
                    last_err = Some(anyhow::Error::from(e));
                }
            }
        }
        Err(last_err
            .unwrap_or_else(|| anyhow!("no XDP mode to try"))
            .context(format!("attaching XDP program {program} to {iface}")))
    }

    /// Attaches the TC program `program` to `iface` at `hook` (TCX link).
    pub fn attach_tc(
        &mut self,
        program: &'static str,
        iface: &str,
        hook: Hook,
    ) -> Result<Attachment> {
        let attach_type = match hook {
            Hook::TcIngress => TcAttachType::Ingress,
            Hook::TcEgress => TcAttachType::Egress,
            Hook::NetkitPeer => return self.attach_netkit(program, iface),
            Hook::Xdp => bail!("attach_tc called with the XDP hook"),
        };
        let ifindex = ifindex(iface)?;
        let pin = self.link_pin(hook, iface, ifindex);
        let prog: &mut SchedClassifier = self.active_mut(program)?.try_into()?;
        let attachment = |adopted| Attachment {
            program,
            iface: iface.to_string(),
            hook,
            xdp_mode: None,
            adopted,
        };
        if let Some(old) = open_pinned_link(&pin)? {
            let swapped = SchedClassifierLink::try_from(old)
                .map_err(anyhow::Error::from)
                .and_then(|link| prog.attach_to_link(link).map_err(anyhow::Error::from));
            match swapped {
                Ok(_) => return Ok(attachment(true)),
                Err(e) => {
                    tracing::warn!(pin = %pin.display(), error = %e, "pinned TC link is unusable; attaching anew");
                    remove_pin(&pin)?;
                }
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let id = loop {
            match prog.attach_with_options(
                iface,
                attach_type,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            ) {
                Ok(id) => break id,
                // A link of this program unpinned a moment ago is still
                // attached (release is asynchronous): wait for it to go.
                Err(e)
                    if os_error(&e) == Some(libc::EEXIST)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("attaching TC program {program} to {iface} {}", hook.name())
                    });
                }
            }
        };
        let link = prog.take_link(id)?;
        let fd: FdLink = link
            .try_into()
            .map_err(|e: LinkError| anyhow!("TC link on {iface} cannot be pinned: {e}"))?;
        fd.pin(&pin)
            .with_context(|| format!("pinning the TC link at {}", pin.display()))?;
        Ok(attachment(false))
    }

    /// Attaches the TC program `program` at the peer hook of the netkit
    /// pair whose primary is `iface` (what the pod transmits), through a
    /// pinned link as every other attach; a link pinned by an earlier run
    /// gets `program` swapped in.
    pub fn attach_netkit(&mut self, program: &'static str, iface: &str) -> Result<Attachment> {
        let ifindex = ifindex(iface)?;
        let pin = self.link_pin(Hook::NetkitPeer, iface, ifindex);
        let prog: &mut SchedClassifier = self.active_mut(program)?.try_into()?;
        let fd = prog
            .fd()
            .with_context(|| format!("program {program} is not loaded"))?;
        let adopted = netkit::attach_pinned(fd, ifindex, NetkitHook::Peer, &pin)
            .with_context(|| format!("attaching TC program {program} to netkit {iface}'s peer"))?;
        Ok(Attachment {
            program,
            iface: iface.to_string(),
            hook: Hook::NetkitPeer,
            xdp_mode: None,
            adopted,
        })
    }

    fn link_pin(&self, hook: Hook, iface: &str, ifindex: u32) -> PathBuf {
        link_pin_path(&self.pins, hook, iface, ifindex)
    }
}

/// Unpins every map pinned with a layout other than the one `OBJECT` and
/// `opts` expect, keeping it open; also opens the maps that only an older
/// layout version pinned.
fn check_pins(pins: &PinDir, opts: &LoadOptions) -> Result<Vec<Replaced>> {
    let object = aya_obj::Object::parse(OBJECT).context("parsing the eBPF object")?;
    let mut replaced = Vec::new();
    for (name, def) in &object.maps {
        if def.pinning() != PinningType::ByName {
            continue;
        }
        let want = wanted_layout(name, def, opts);
        let path = pins.map(name);
        if path.exists() {
            let have = pinned_layout(&path)?;
            if have == want {
                continue;
            }
            tracing::warn!(
                map = %name,
                pinned = ?have,
                expected = ?want,
                "the pinned map has another layout (type, key size, value size, capacity, flags): replacing it"
            );
            let old = MapData::from_pin(&path)
                .with_context(|| format!("opening the pinned map {}", path.display()))?;
            remove_pin(&path)?;
            replaced.push(Replaced {
                name: name.clone(),
                old,
                version: dataplane_common::LAYOUT_VERSION,
            });
            continue;
        }
        for (version, dir) in pins.other_map_versions() {
            let old = dir.join(name);
            if version < dataplane_common::LAYOUT_VERSION
                && let Ok(data) = MapData::from_pin(&old)
            {
                tracing::info!(map = %name, from = %old.display(), "carrying the map over from layout version {version}");
                replaced.push(Replaced {
                    name: name.clone(),
                    old: data,
                    version,
                });
                break;
            }
        }
    }
    Ok(replaced)
}

/// (type, key size, value size, capacity, flags) of a map.
type Layout = (u32, u32, u32, u32, u32);

fn wanted_layout(name: &str, def: &aya_obj::maps::Map, opts: &LoadOptions) -> Layout {
    let max_entries = match name {
        map_names::PEERS | map_names::VTEPS | map_names::PEERS6 | map_names::VTEPS6 => {
            opts.max_peers
        }
        _ => def.max_entries(),
    };
    (
        def.map_type(),
        def.key_size(),
        def.value_size(),
        max_entries,
        def.map_flags(),
    )
}

fn pinned_layout(path: &Path) -> Result<Layout> {
    let info = MapInfo::from_pin(path)
        .with_context(|| format!("reading the pinned map {}", path.display()))?;
    Ok((
        info.map_type().map_or(u32::MAX, |t| t as u32),
        info.key_size(),
        info.value_size(),
        info.max_entries(),
        info.map_flags(),
    ))
}

/// Whether this object, loaded with `opts`, would reuse every pinned map
/// as it is (no map of another layout, no pins of another layout version):
/// then the programs running now and this load's share their maps.
pub(crate) fn maps_fit(pins: &PinDir, opts: &LoadOptions) -> Result<bool> {
    if !pins.other_map_versions().is_empty() {
        return Ok(false);
    }
    let object = aya_obj::Object::parse(OBJECT).context("parsing the eBPF object")?;
    for (name, def) in &object.maps {
        let path = pins.map(name);
        if def.pinning() == PinningType::ByName
            && path.exists()
            && pinned_layout(&path)? != wanted_layout(name, def, opts)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Removes the map pins of other layout versions (once this version's
/// programs are attached, nothing uses them).
pub(crate) fn remove_other_versions(pins: &PinDir) -> Result<()> {
    for (version, dir) in pins.other_map_versions() {
        tracing::info!(dir = %dir.display(), version, "removing the map pins of another layout version");
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Runs blocking loader code (which may start its own netlink runtime) on a
/// fresh thread: it inherits this thread's network namespace, which a pooled
/// blocking thread might not.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("loader thread panicked"))
}
