//! The programs: loading them (reusing pinned maps of the right layout),
//! carrying peers over from maps an upgrade replaced, the config they read,
//! where each is attached and where decapsulation runs.

use anyhow::{Result, bail};
use dataplane_common::{
    CONFIG_F_IPV4, CONFIG_F_IPV6, CONFIG_F_KERNEL_RX, CONFIG_F_PATH_MTU, DataplaneConfig,
    map_names, program_names,
};

use super::devices::{DevicePrograms, Devices};
use crate::dataplane::config;
use crate::dataplane::maps::PeerMaps;
use crate::dataplane::programs::generations;
use crate::dataplane::programs::kernel::ProgramKernel;
use crate::dataplane::programs::links;
use crate::dataplane::programs::links::Hook;
use crate::dataplane::programs::loader;
use crate::dataplane::programs::loader::Attachment;
use crate::dataplane::programs::loader::LoadOptions;
use crate::dataplane::programs::loader::Loaded;
use crate::dataplane::programs::loader::Replaced;
use crate::dataplane::programs::loader::off_runtime;
use crate::dataplane::programs::selftest;
use crate::dataplane::trace;
use crate::dataplane::types::DataplaneSpec;
use crate::dataplane::types::DecapChoice;
use crate::dataplane::types::DecapHook;
use crate::dataplane::types::Family;
use crate::dataplane::types::HostRouting;
use crate::dataplane::types::XdpMode;
use crate::lease::Subnets;
use crate::sys::bpffs::PinDir;
use crate::sys::netlink::Link;

/// The loaded programs and where they are attached.
pub(crate) struct Programs {
    pub(crate) loaded: Loaded,
    pub(crate) attachments: Vec<Attachment>,
    /// Where decapsulation runs, and why.
    pub(crate) decap: DecapChoice,
    /// Forwards the programs' drop trace to the log (`--trace-drops`).
    trace: Option<trace::DropTrace>,
    /// What the self-test said of this build's programs.
    pub(crate) gate: Gate,
    /// The previous generation was put back (`weft rollback`).
    pub(crate) rolled_back: bool,
    /// Why the agent rolled the programs back itself (the check after the
    /// swap failed).
    pub(crate) rollback_reason: Option<String>,
    /// The programs in the links have reached the peers (or there were
    /// none to reach): see [`generations::mark_verified`].
    pub(crate) verified: bool,
}

/// The self-test of this build's programs, run before any of them is
/// attached, and what followed from it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gate {
    /// Cases run (0: no self-test, on a node without programs).
    pub(crate) cases: usize,
    /// The cases that failed (`program: case: why`), or why the self-test
    /// could not run; empty: every case passed.
    pub(crate) failed: Vec<String>,
    /// The programs running before this agent started were kept in the
    /// links (this build's failed).
    pub(crate) kept_running: bool,
}

/// Runs this build's programs, loaded as `spec` asks, on the golden frames
/// (see [`selftest`]) in a private instance of their own.
fn self_test(spec: &DataplaneSpec, opts: &LoadOptions) -> Gate {
    let root = spec.pins.root().to_path_buf();
    let opts = *opts;
    let wire = selftest::Wire {
        vni: spec.vni,
        port: spec.port,
    };
    let started = std::time::Instant::now();
    let r = spec
        .pins
        .ensure()
        .and_then(|()| off_runtime(move || selftest::run(&root, &opts, wire)));
    let gate = match r {
        Ok(outcomes) => Gate {
            cases: outcomes.len(),
            failed: outcomes
                .iter()
                .filter_map(|o| {
                    o.failure
                        .as_ref()
                        .map(|why| format!("{}: {}: {why}", o.program, o.name))
                })
                .collect(),
            kept_running: false,
        },
        Err(e) => Gate {
            cases: 0,
            failed: vec![format!("the self-test could not run: {e:#}")],
            kept_running: false,
        },
    };
    tracing::info!(
        cases = gate.cases,
        failed = gate.failed.len(),
        vni = wire.vni,
        port = wire.port,
        took = ?started.elapsed(),
        "self-test of this build's programs"
    );
    gate
}

impl Programs {
    /// Loads this build's programs, reusing pinned maps of the right
    /// layout; returns the pinned maps this load replaced. Where programs
    /// run already (`adopting`: an upgrade or a restart), this build's go
    /// through the self-test first: programs that pass become the
    /// installed generation (attached by [`Programs::attach`]); programs
    /// that fail are never attached: the running ones keep running if
    /// their maps fit this build (then the agent goes on with them and
    /// reports the refusal), else the agent stands down with an error and
    /// leaves programs and maps as they are. On a node without programs
    /// nothing carries traffic yet: they are installed at once (the
    /// verifier still checks them as it loads them).
    pub(super) fn load(spec: &DataplaneSpec, adopting: bool) -> Result<(Self, Vec<Replaced>)> {
        let opts = LoadOptions {
            max_peers: spec.max_peers,
            fault: spec.fault,
            kernel: spec.kernel,
        };
        let mut gate = if adopting {
            self_test(spec, &opts)
        } else {
            Gate::default()
        };
        if !gate.failed.is_empty() {
            for f in &gate.failed {
                tracing::error!(case = %f, "this build's programs failed a self-test case");
            }
            let first = &gate.failed[0];
            if !loader::maps_fit(&spec.pins, &opts)? {
                bail!(
                    "this build's programs failed {} of {} self-test cases (first: {first}) and need another map layout: the running programs keep their maps, and this agent stands down",
                    gate.failed.len(),
                    gate.cases
                );
            }
            tracing::error!(
                failed = gate.failed.len(),
                cases = gate.cases,
                "upgrade refused: the programs running before keep running"
            );
            gate.kept_running = true;
        }
        let pins = spec.pins.clone();
        let keep = gate.kept_running;
        let mut loaded = off_runtime(move || -> Result<Loaded> {
            let mut l = Loaded::load(&pins, &opts)?;
            if keep {
                l.keep_running()?;
            } else {
                l.install()?;
            }
            Ok(l)
        })?;
        let replaced = loaded.take_replaced();
        Ok((
            Self {
                loaded,
                attachments: Vec::new(),
                decap: DecapChoice {
                    hook: DecapHook::Tc,
                    why: String::new(),
                },
                trace: None,
                gate,
                rolled_back: false,
                rollback_reason: None,
                verified: false,
            },
            replaced,
        ))
    }

    /// Puts the previous generation back into the links (see
    /// [`generations`]) because `why`, and attaches from it from now on.
    pub(super) fn roll_back(&mut self, why: String) -> Result<()> {
        let pins = self.loaded.pins().clone();
        let swapped = off_runtime(move || generations::rollback(&pins))?;
        self.loaded.follow_pins()?;
        tracing::warn!(links = swapped.len(), programs = ?self.loaded.active_ids(), "rolled back");
        self.rolled_back = true;
        self.rollback_reason = Some(why);
        Ok(())
    }

    /// The programs in the links reached the peers: so marked in their
    /// generation.
    pub(super) fn verified(&mut self) -> Result<()> {
        generations::mark_verified(self.loaded.pins())?;
        self.verified = true;
        Ok(())
    }

    /// Whether a verified previous generation can be rolled back to.
    pub(super) fn can_roll_back(&self) -> bool {
        generations::previous_verified(self.loaded.pins())
    }

    /// Whether the kernel has conntrack's kfuncs for the programs.
    pub(crate) fn has_conntrack(&self) -> bool {
        self.loaded.has_conntrack()
    }

    /// Attaches the programs to the uplink and the overlay devices.
    pub(super) fn attach(&mut self, spec: &DataplaneSpec, devices: &Devices) -> Result<()> {
        let bypass = spec.host_routing != HostRouting::Legacy;
        let kernel = ProgramKernel {
            xdp: spec.kernel.xdp && self.loaded.has_xdp(),
            ..spec.kernel
        };
        let plan = decap_plan(spec.xdp_mode, &devices.uplink, kernel, bypass);
        let devs = devices.attachable();
        let (pins, uplink) = (spec.pins.clone(), spec.uplink.clone());
        let loaded = &mut self.loaded;
        let (attachments, decap) =
            off_runtime(move || attach(loaded, &pins, &uplink, &devs, plan, bypass))?;
        self.attachments = attachments;
        self.decap = decap;
        Ok(())
    }

    /// Logs where everything is attached.
    pub(super) fn log(&self, host_routing: HostRouting) {
        tracing::info!(hook = self.decap.hook.as_str(), why = %self.decap.why, host_routing = host_routing.as_str(), "decapsulation");
        for a in &self.attachments {
            tracing::info!(
                program = a.program,
                iface = %a.iface,
                hook = a.hook.name(),
                xdp_mode = a.xdp_mode.map_or("-", |m| m.as_str()),
                adopted = a.adopted,
                "program attached"
            );
        }
    }

    /// Starts forwarding the drop trace to the log (whether the programs
    /// log drops is the config's, switched at run time).
    pub(super) fn start_trace(&mut self) -> Result<()> {
        let loaded = &mut self.loaded;
        let logger = off_runtime(move || loaded.drop_logger())?;
        self.trace = Some(trace::DropTrace::start(logger)?);
        Ok(())
    }

    /// Attaches again what is missing (a device was recreated, another
    /// program replaced ours); returns whether anything was.
    pub(super) fn heal(
        &mut self,
        spec: &DataplaneSpec,
        devices: &Devices,
        recreated: bool,
    ) -> Result<bool> {
        // `weft rollback` swapped the generations: attach from the new
        // current one from now on.
        if self.loaded.follow_pins()? {
            tracing::warn!(programs = ?self.loaded.active_ids(), "the programs were rolled back: following the pinned generation");
            self.rolled_back = true;
        }
        let device_programs: usize = devices.existing().map(|d| d.programs().len()).sum();
        let on_devices = self
            .attachments
            .iter()
            .filter(|a| a.iface != spec.uplink)
            .count();
        let detached = recreated || device_programs != on_devices || {
            let (loaded, attachments) = (&mut self.loaded, &self.attachments);
            // XDP's check asks rtnetlink on a runtime of its own.
            off_runtime(move || -> Result<bool> {
                for a in attachments {
                    if !loaded.is_attached(a)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            })?
        };
        if detached {
            self.attach(spec, devices)?;
        }
        Ok(detached)
    }
}

/// Carries peers over from pinned maps a load replaced (another capacity,
/// or an older layout with the same entries), so an upgrade keeps
/// forwarding. Maps whose entries differ are left to be filled from etcd.
pub(super) fn carry_over(maps: &mut PeerMaps, replaced: Vec<Replaced>) {
    for r in replaced {
        if r.name != map_names::PEERS && r.name != map_names::PEERS6 {
            continue;
        }
        match PeerMaps::read_peers(&r.name, r.old) {
            Ok(peers) => {
                let n = peers
                    .values()
                    .filter(|p| maps.upsert(p, None, false).is_ok())
                    .count();
                tracing::info!(
                    peers = n,
                    from_version = r.version,
                    "carried the peers over into the new peer map"
                );
            }
            Err(e) => tracing::warn!(
                error = %format!("{e:#}"),
                from_version = r.version,
                "the replaced peer map cannot be read; its peers come back from etcd"
            ),
        }
    }
}

/// What the programs read from the config map: our subnets, VTEPs, the
/// devices and their MTUs, which families are on, and how host routing
/// runs.
pub(super) fn config(
    spec: &DataplaneSpec,
    subnets: &Subnets,
    devices: &Devices,
    has_conntrack: bool,
    kernel_rx: bool,
) -> DataplaneConfig {
    let on = |f: Family| f.subnet(subnets).is_some() && spec.vtep(f).is_some();
    let node = config::node_config(subnets, spec.host_routing, has_conntrack);
    let v6 = devices.get(Family::V6);
    DataplaneConfig {
        vni: spec.vni,
        port: spec.port,
        local_addr_be: spec
            .public_ip
            .map_or(0, |ip| u32::from_ne_bytes(ip.octets())),
        uplink_ifindex: devices.uplink.index,
        uplink_mtu: devices.uplink.mtu,
        vtep_mac: spec.vtep_mac.0,
        uplink_mac: devices.uplink.mac,
        local_addr6: spec.public_ipv6.map_or([0; 16], |ip| ip.octets()),
        overlay6_ifindex: v6.and_then(|d| d.index).unwrap_or(0),
        overlay6_mtu: Family::V6.overlay_mtu(spec.underlay_mtu(devices.uplink.mtu)),
        vtep6_mac: spec.vtep6_mac.0,
        flags: node.flags
            | if kernel_rx { CONFIG_F_KERNEL_RX } else { 0 }
            | if on(Family::V4) { CONFIG_F_IPV4 } else { 0 }
            | if on(Family::V6) { CONFIG_F_IPV6 } else { 0 }
            | if spec.path_mtu { CONFIG_F_PATH_MTU } else { 0 },
        ..node
    }
}

/// Whether decapsulation will try XDP on `uplink` (which wants GRO on).
pub(super) fn tries_xdp(spec: &DataplaneSpec, uplink: &Link) -> bool {
    let bypass = spec.host_routing != HostRouting::Legacy;
    !decap_plan(spec.xdp_mode, uplink, spec.kernel, bypass)
        .0
        .is_empty()
}

/// The XDP modes to try for decapsulation (none: TC), and why, on a
/// kernel that lets the programs do what `kernel` says, with host routing
/// (`bypass`) or without.
fn decap_plan(
    mode: XdpMode,
    uplink: &Link,
    kernel: ProgramKernel,
    bypass: bool,
) -> (Vec<XdpMode>, String) {
    const NO_MARK: &str = "this kernel refuses bpf_xdp_adjust_meta in XDP, which marks the frames XDP decapsulated for host routing (kernel feature xdp_decap_mark)";
    match mode {
        XdpMode::Off => (vec![], "--xdp-mode off".into()),
        XdpMode::Native | XdpMode::Generic if !kernel.xdp => (
            vec![],
            format!("--xdp-mode {}, but this kernel has no XDP for decapsulation (kernel feature xdp_decap): TC", mode.as_str()),
        ),
        XdpMode::Native | XdpMode::Generic if bypass && !kernel.xdp_mark => (
            vec![mode],
            format!("--xdp-mode {}; {NO_MARK}: the frames it decapsulates take the host stack (--xdp-mode auto or off keeps the fast path into pods)", mode.as_str()),
        ),
        XdpMode::Native => (vec![XdpMode::Native], "--xdp-mode native".into()),
        XdpMode::Generic => (vec![XdpMode::Generic], "--xdp-mode generic".into()),
        XdpMode::Auto if uplink.kind.as_deref() == Some("veth") => (
            vec![],
            "the uplink is a veth: XDP on a veth strips GSO from its peer and copies every frame, TC keeps the large packets".into(),
        ),
        XdpMode::Auto if !kernel.xdp => (
            vec![],
            "this kernel has no XDP for decapsulation (kernel feature xdp_decap): TC".into(),
        ),
        XdpMode::Auto if bypass && !kernel.xdp_mark => (
            vec![],
            format!("{NO_MARK}: TC keeps host routing's fast path into pods"),
        ),
        XdpMode::Auto => (
            vec![XdpMode::Native],
            "native XDP on a device driver: decapsulated before the stack, merged by GRO after".into(),
        ),
    }
}

fn attach(
    loaded: &mut Loaded,
    pins: &PinDir,
    uplink: &str,
    devices: &[(String, DevicePrograms)],
    (xdp_modes, why): (Vec<XdpMode>, String),
    bypass: bool,
) -> Result<(Vec<Attachment>, DecapChoice)> {
    let mut out = Vec::new();
    for (dev, programs) in devices {
        for (program, hook) in *programs {
            out.push(loaded.attach_tc(program, dev, *hook)?);
        }
    }
    let xdp = if xdp_modes.is_empty() {
        None
    } else {
        match loaded.attach_xdp(program_names::DECAP_XDP, uplink, &xdp_modes) {
            Ok(a) => Some(a),
            // Auto only tries native XDP, and falls back to TC.
            Err(e) if xdp_modes == [XdpMode::Native] && why.starts_with("native") => {
                tracing::info!(uplink, error = %format!("{e:#}"), "no native XDP on the uplink; decapsulating in TC");
                None
            }
            Err(e) => return Err(e),
        }
    };
    let decap = match xdp {
        Some(a) => {
            let hook = match a.xdp_mode {
                Some(XdpMode::Generic) => DecapHook::XdpGeneric,
                _ => DecapHook::XdpNative,
            };
            out.push(a);
            // After GRO, XDP-decapsulated frames for local pods go straight
            // into them (host routing); nothing else needs TC.
            if bypass {
                out.push(loaded.attach_tc(program_names::DELIVER, uplink, Hook::TcIngress)?);
            } else {
                links::detach(pins, Hook::TcIngress, uplink)?;
            }
            DecapChoice { hook, why }
        }
        None => {
            links::detach(pins, Hook::Xdp, uplink)?;
            out.push(loaded.attach_tc(program_names::DECAP_TC, uplink, Hook::TcIngress)?);
            let why = if xdp_modes.is_empty() {
                why
            } else {
                "the driver has no native XDP".into()
            };
            DecapChoice {
                hook: DecapHook::Tc,
                why,
            }
        }
    };
    Ok((out, decap))
}
