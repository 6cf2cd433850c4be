//! What the running kernel offers the dataplane, found out by probing it:
//! each program type, helper, map type and kfunc the programs use is
//! asked of the kernel itself (small programs and maps it is asked to
//! load, see [`probe`]), and the attach types are read from its BTF (not
//! its version: distributions backport, configurations and hardening
//! patches remove). Checked when the agent starts, before it takes a
//! lease, and by `weft doctor`, with the same words; kept per boot in the
//! state directory, so a restart does not probe again.
//!
//! Each feature is required (the agent refuses to start without it,
//! naming it, before anything is taken) or optional (without it that
//! feature alone is lost: one warning names it, what it costs and what the
//! node does instead; `weft status`, `weft doctor` and the
//! `weft_kernel_feature` metric say the same).

pub(crate) mod object;
pub(crate) mod probe;
mod program_kernel;

pub use program_kernel::ProgramKernel;

use std::{
    hash::{Hash as _, Hasher as _},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use self::probe::Verdict;
use crate::dataplane::programs::btf::Btf;
use crate::dataplane::programs::kfuncs::{KernelBtf, KfuncSource, MODULE as KFUNC_MODULE};
use crate::sys::{bpf::ProgType, fs::kernel_release};

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The probes' results in the state directory.
pub(crate) const CACHE_FILE: &str = "kernel-features.json";

/// The features, by name (the `feature` label of `weft_kernel_feature`).
pub(crate) mod names {
    pub(crate) const BTF: &str = "btf";
    pub(crate) const TCX: &str = "tcx";
    pub(crate) const MAPS: &str = "maps";
    pub(crate) const TC: &str = "tc_programs";
    pub(crate) const XDP: &str = "xdp_decap";
    pub(crate) const XDP_MARK: &str = "xdp_decap_mark";
    pub(crate) const CONNTRACK: &str = "conntrack_kfuncs";
    pub(crate) const NETKIT: &str = "netkit";
}

/// A feature Weft uses: what it is, whether Weft runs without it, and
/// what its loss costs.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) required: bool,
    /// What the kernel is asked for.
    pub(crate) what: &'static str,
    /// Without it (optional features): what is lost, and what the node
    /// does instead.
    pub(crate) lost: &'static str,
    pub(crate) instead: &'static str,
}

/// Every feature, in the order they are reported.
pub(crate) const SPECS: [Spec; 8] = [
    Spec {
        name: names::BTF,
        required: true,
        what: "the kernel's BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF=y)",
        lost: "",
        instead: "",
    },
    Spec {
        name: names::TCX,
        required: true,
        what: "TCX links (BPF_TCX_INGRESS, Linux 6.6): every TC program attaches through one",
        lost: "",
        instead: "",
    },
    Spec {
        name: names::MAPS,
        required: true,
        what: "the map types the programs use",
        lost: "",
        instead: "",
    },
    Spec {
        name: names::TC,
        required: true,
        what: "TC programs and every helper they call (encapsulation, decapsulation, host routing)",
        lost: "",
        instead: "",
    },
    Spec {
        name: names::XDP,
        required: false,
        what: "XDP programs and the helpers decapsulation calls in them",
        lost: "decapsulation in XDP",
        instead: "decapsulates in TC on the uplink, as with --xdp-mode off",
    },
    Spec {
        name: names::XDP_MARK,
        required: false,
        what: "bpf_xdp_adjust_meta in XDP programs (marks the frames XDP decapsulated for host routing)",
        lost: "host routing for frames decapsulated in XDP",
        instead: "--xdp-mode auto decapsulates in TC where host routing is on (its fast path into pods kept); under --xdp-mode native or generic frames decapsulated in XDP take the host stack",
    },
    Spec {
        name: names::CONNTRACK,
        required: false,
        what: "conntrack's kfuncs (bpf_skb_ct_lookup, bpf_ct_release, bpf_ct_change_timeout, bpf_ct_change_status) in vmlinux's BTF or the nf_conntrack module's, and the options' size they take",
        lost: "the fast path of --host-routing auto (it asks conntrack which flows may bypass the host stack)",
        instead: "under auto every flow takes the host stack, as under legacy, and pods' sources are still checked at their veth; --host-routing bpf still bypasses, without asking conntrack",
    },
    Spec {
        name: names::NETKIT,
        required: false,
        what: "netkit devices and links (CONFIG_NETKIT, BPF_NETKIT_PEER, Linux 6.7)",
        lost: "netkit pods (the CNI plugin's \"podDevice\": \"netkit\")",
        instead: "pods attach with veth pairs; the plugin refuses a netkit attachment with a clear error",
    },
];

pub(crate) fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

/// One feature on this kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Feature {
    pub(crate) name: String,
    pub(crate) required: bool,
    pub(crate) available: bool,
    /// What the probes found: where it is missing, the kernel's words.
    pub(crate) detail: String,
}

/// The probes' verdict on the running kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KernelFeatures {
    /// `uname -r`.
    pub(crate) release: String,
    /// The boot the probes ran in.
    pub(crate) boot_id: String,
    /// Which build of the programs was asked about.
    pub(crate) object: String,
    pub(crate) features: Vec<Feature>,
    /// How many bytes of `bpf_ct_opts` conntrack's lookup takes here (12
    /// where it takes both; None without the kfuncs).
    pub(crate) ct_opts_size: Option<u32>,
    /// The kernel's id of the `nf_conntrack` module's BTF the kfuncs were
    /// found in (None: vmlinux's, or no kfuncs). A module unloaded and
    /// loaded again within the boot has another: the kept results are
    /// then probed again rather than reported with the old one.
    #[serde(default)]
    pub(crate) ct_module_btf_id: Option<u32>,
    /// Read from the state directory, not probed by this process.
    #[serde(skip)]
    pub(crate) cached: bool,
}

impl KernelFeatures {
    /// The features of the running kernel: the probes' results kept in
    /// `state_dir` for this boot, kernel and build, else probed now (and
    /// kept there if `keep`, where it can be written: the agent keeps
    /// them, `weft doctor` only reads).
    pub(crate) fn probe(state_dir: Option<&Path>, keep: bool) -> Self {
        let (release, boot_id, object) = identity();
        if let Some(dir) = state_dir
            && let Some(k) = read_cache(&dir.join(CACHE_FILE))
            && k.release == release
            && k.boot_id == boot_id
            && k.object == object
            && k.module_unchanged()
        {
            return Self { cached: true, ..k };
        }
        let k = Self::run_probes(release, boot_id, object);
        if let Some(dir) = state_dir.filter(|_| keep)
            && let Err(e) = write_cache(&dir.join(CACHE_FILE), &k)
        {
            tracing::debug!(error = %format!("{e:#}"), "cannot keep the kernel probes' results");
        }
        k
    }

    /// Whether the module BTF the kept results name is still the
    /// kernel's (always, where they name none).
    fn module_unchanged(&self) -> bool {
        match self.ct_module_btf_id {
            None => true,
            Some(id) => crate::sys::bpf::kernel_btf(KFUNC_MODULE)
                .ok()
                .flatten()
                .is_some_and(|o| o.id == id),
        }
    }

    fn run_probes(release: String, boot_id: String, object: String) -> Self {
        let mut k = Self {
            release,
            boot_id,
            object,
            features: Vec::new(),
            ct_opts_size: None,
            ct_module_btf_id: None,
            cached: false,
        };
        let raw = match std::fs::read(VMLINUX) {
            Ok(r) => r,
            Err(e) => {
                let why = if Path::new(VMLINUX).exists() {
                    format!("{VMLINUX} cannot be read: {e}")
                } else {
                    format!("no {VMLINUX}: the kernel was built without CONFIG_DEBUG_INFO_BTF")
                };
                k.set(names::BTF, Err(why));
                return k;
            }
        };
        let btf = match Btf::parse(&raw) {
            Ok(b) => b,
            Err(e) => {
                k.set(
                    names::BTF,
                    Err(format!("{VMLINUX} cannot be parsed: {e:#}")),
                );
                return k;
            }
        };
        k.set(names::BTF, Ok(VMLINUX.to_string()));
        k.set(
            names::TCX,
            if btf.has_enumerator("BPF_TCX_INGRESS") {
                Ok("BPF_TCX_INGRESS in the kernel's BTF".into())
            } else {
                Err("no BPF_TCX_INGRESS in the kernel's BTF (Linux 6.6 added TCX links)".into())
            },
        );
        k.set(
            names::NETKIT,
            if !btf.has_enumerator("BPF_NETKIT_PEER") {
                Err("no BPF_NETKIT_PEER in the kernel's BTF (Linux 6.7 added netkit)".into())
            } else {
                match probe::netkit() {
                    Verdict::Accepted => {
                        Ok("netkit devices, and BPF_NETKIT_PEER in the kernel's BTF".into())
                    }
                    Verdict::Refused(why) => Err(why),
                }
            },
        );
        match stubbed_uses() {
            Ok(uses) => k.probe_object(&uses),
            Err(e) => {
                // The build's own object cannot be read: nothing can load.
                let why = format!("the programs' object cannot be read: {e:#}");
                k.set(names::MAPS, Err(why.clone()));
                k.set(names::TC, Err(why));
            }
        }
        k.probe_conntrack();
        k
    }

    /// The program types, helpers and map types of the object.
    fn probe_object(&mut self, uses: &object::Uses) {
        let mut maps = Ok(Vec::new());
        for (ty, (name, m)) in &uses.maps {
            match probe::map(m) {
                Verdict::Accepted => {
                    if let Ok(v) = &mut maps {
                        v.push(object::map_type_name(*ty));
                    }
                }
                Verdict::Refused(why) => {
                    let line = format!("{} ({name}): {why}", object::map_type_name(*ty));
                    maps = Err(match maps {
                        Err(prev) => format!("{prev}; {line}"),
                        Ok(_) => line,
                    });
                }
            }
        }
        self.set(names::MAPS, maps.map(|v| v.join(", ")));

        let mut results: Vec<(&'static str, Result<String, String>)> = Vec::new();
        for (ty, feature) in [(ProgType::SchedCls, names::TC), (ProgType::Xdp, names::XDP)] {
            if let Verdict::Refused(why) = probe::program_type(ty) {
                results.push((feature, Err(format!("{} programs: {why}", ty.as_str()))));
                continue;
            }
            let mut ok = Vec::new();
            let mut refused: Vec<String> = Vec::new();
            let mut mark = None;
            for ((t, id), programs) in &uses.helpers {
                if *t != ty {
                    continue;
                }
                let name = object::helper_name(*id);
                let verdict = probe::helper(ty, *id);
                // The XDP frame mark is a feature of its own: the
                // programs call it behind a load-time constant.
                if ty == ProgType::Xdp && *id == HELPER_XDP_ADJUST_META {
                    mark = Some(match verdict {
                        Verdict::Accepted => Ok(format!("{name} in XDP")),
                        Verdict::Refused(why) => Err(format!("{name} in XDP: {why}")),
                    });
                    continue;
                }
                match verdict {
                    Verdict::Accepted => ok.push(name),
                    Verdict::Refused(why) => refused.push(format!(
                        "{name} in {} (called by {}): {why}",
                        ty.as_str(),
                        programs.iter().cloned().collect::<Vec<_>>().join(", ")
                    )),
                }
            }
            let r = if refused.is_empty() {
                Ok(format!("{} helpers: {}", ok.len(), ok.join(", ")))
            } else {
                Err(refused.join("; "))
            };
            if ty == ProgType::Xdp {
                let decap_ok = r.is_ok();
                results.push((feature, r));
                results.push((
                    names::XDP_MARK,
                    match mark {
                        _ if !decap_ok => Err("no XDP decapsulation on this kernel".into()),
                        Some(m) => m,
                        None => Err("the programs do not call bpf_xdp_adjust_meta".into()),
                    },
                ));
            } else {
                results.push((feature, r));
            }
        }
        for (f, r) in results {
            self.set(f, r);
        }
    }

    /// The conntrack kfuncs: resolved in the kernel's BTF (vmlinux's, or
    /// the `nf_conntrack` module's, the module loaded first if it is not),
    /// loaded in a program and run with each size of options, smallest
    /// first (12 is what every kernel with the kfuncs takes; 16, with
    /// conntrack zones, only Linux 6.11 and later).
    fn probe_conntrack(&mut self) {
        let r = KernelBtf::read()
            .and_then(|btf| Ok((btf.open_module()?, btf)))
            .map_err(|e| format!("{e:#}"))
            .and_then(|(module, btf)| {
                let k = probe::Kfuncs {
                    lookup: btf.kfuncs["bpf_skb_ct_lookup"],
                    release: btf.kfuncs["bpf_ct_release"],
                    module: module.as_ref().map(std::os::fd::AsFd::as_fd),
                };
                let mut refusals = Vec::new();
                for n in [12, 16] {
                    match probe::conntrack(&k, n) {
                        Verdict::Accepted => {
                            self.ct_opts_size = Some(n);
                            self.ct_module_btf_id = match &btf.source {
                                KfuncSource::Module { btf_id, .. } => Some(*btf_id),
                                KfuncSource::Vmlinux => None,
                            };
                            return Ok(format!(
                                "in {}; lookups take {n} bytes of options",
                                btf.source
                            ));
                        }
                        Verdict::Refused(why) => refusals.push(why),
                    }
                }
                Err(format!("in {}, but {}", btf.source, refusals.join("; ")))
            });
        self.set(names::CONNTRACK, r);
    }

    fn set(&mut self, name: &'static str, r: Result<String, String>) {
        let spec = spec(name).expect("a known feature");
        let (available, detail) = match r {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        let f = Feature {
            name: name.to_string(),
            required: spec.required,
            available,
            detail,
        };
        match self.features.iter_mut().find(|f| f.name == name) {
            Some(old) => *old = f,
            None => {
                self.features.push(f);
                let order = |n: &str| SPECS.iter().position(|s| s.name == n);
                self.features.sort_by_key(|f| order(&f.name));
            }
        }
    }

    /// Whether the kernel has feature `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.features.iter().any(|f| f.name == name && f.available)
    }

    /// What the probes found of feature `name`, where the kernel has it
    /// (for the conntrack kfuncs: where they are, and the options' size).
    pub(crate) fn found(&self, name: &str) -> Option<&str> {
        self.features
            .iter()
            .find(|f| f.name == name && f.available)
            .map(|f| f.detail.as_str())
    }

    /// Turns off optional features as if the kernel lacked them (a test's
    /// switch, `--kernel-feature-off`). A required one cannot be.
    pub(crate) fn turn_off(&mut self, names: &[String]) -> anyhow::Result<()> {
        for n in names {
            let spec = spec(n).ok_or_else(|| {
                anyhow::anyhow!(
                    "--kernel-feature-off {n}: no such kernel feature (optional ones: {})",
                    optional_names().join(", ")
                )
            })?;
            if spec.required {
                anyhow::bail!("--kernel-feature-off {n}: a required feature cannot be turned off");
            }
            self.set(spec.name, Err("turned off (--kernel-feature-off)".into()));
            if spec.name == names::CONNTRACK {
                self.ct_opts_size = None;
                self.ct_module_btf_id = None;
            }
            if spec.name == names::XDP {
                self.set(
                    names::XDP_MARK,
                    Err("no XDP decapsulation on this kernel".into()),
                );
            }
        }
        Ok(())
    }

    /// Why Weft cannot run here (the required features missing), in
    /// words for an operator; None when it can.
    pub(crate) fn missing(&self) -> Option<String> {
        let missing: Vec<String> = SPECS
            .iter()
            .filter(|s| s.required && !self.has(s.name))
            .map(|s| {
                let detail = self
                    .features
                    .iter()
                    .find(|f| f.name == s.name)
                    .map_or("not probed (an earlier requirement is missing)", |f| {
                        f.detail.as_str()
                    });
                format!("{} ({}): {detail}", s.name, s.what)
            })
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "Linux {} lacks what Weft needs: {}",
                self.release,
                missing.join("; ")
            )
        })
    }

    /// The optional features this kernel lacks, each with what it costs
    /// and what the node does instead.
    pub(crate) fn degraded(&self) -> Vec<Degraded> {
        self.features
            .iter()
            .filter(|f| !f.required && !f.available)
            .filter_map(|f| {
                let s = spec(&f.name)?;
                Some(Degraded {
                    feature: s.name,
                    why: f.detail.clone(),
                    lost: s.lost,
                    instead: s.instead,
                })
            })
            .collect()
    }
}

/// An optional feature this kernel lacks.
#[derive(Clone, Debug)]
pub(crate) struct Degraded {
    pub(crate) feature: &'static str,
    /// What the probe saw.
    pub(crate) why: String,
    pub(crate) lost: &'static str,
    pub(crate) instead: &'static str,
}

impl std::fmt::Display for Degraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}. Lost: {}. Instead: {}",
            self.feature, self.why, self.lost, self.instead
        )
    }
}

/// `BPF_FUNC_xdp_adjust_meta`.
const HELPER_XDP_ADJUST_META: u32 = 54;

pub(crate) fn optional_names() -> Vec<&'static str> {
    SPECS
        .iter()
        .filter(|s| !s.required)
        .map(|s| s.name)
        .collect()
}

/// What the object asks of the kernel, its kfunc calls stubbed out (those
/// are probed on their own).
fn stubbed_uses() -> anyhow::Result<object::Uses> {
    let stubbed = crate::dataplane::programs::kfuncs::resolve(
        crate::dataplane::programs::object::OBJECT,
        None,
    )?;
    object::uses(stubbed.bytes())
}

/// (kernel release, boot id, build of the programs).
fn identity() -> (String, String, String) {
    let release = kernel_release().unwrap_or_else(|| "unknown".into());
    let boot_id = std::fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    crate::dataplane::programs::object::OBJECT.hash(&mut h);
    let object = format!("{}-{:016x}", env!("CARGO_PKG_VERSION"), h.finish());
    (release, boot_id, object)
}

fn read_cache(path: &Path) -> Option<KernelFeatures> {
    let raw = std::fs::read(path).ok()?;
    let k: KernelFeatures = serde_json::from_slice(&raw).ok()?;
    // A file of another shape, or one that names a feature unknown here.
    (k.features.len() == SPECS.len() && k.features.iter().all(|f| spec(&f.name).is_some()))
        .then_some(k)
}

fn write_cache(path: &Path, k: &KernelFeatures) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{CACHE_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(k)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_runs_weft() {
        // The machines the tests run on are 6.6 or later (the VM runner's
        // 6.1 checks the refusal, through the agent).
        let k = KernelFeatures::probe(None, false);
        assert!(k.missing().is_none(), "{:?}", k.missing());
        assert_eq!(k.features.len(), SPECS.len(), "{k:?}");
        assert!(!k.cached);
    }

    #[test]
    fn results_are_kept_per_boot_kernel_and_build() {
        let dir = std::env::temp_dir().join(format!("weft-kf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = KernelFeatures::probe(Some(&dir), true);
        assert!(!first.cached);
        let again = KernelFeatures::probe(Some(&dir), true);
        assert!(again.cached);
        assert_eq!(again.features, first.features);
        // Another boot's results are not used.
        let mut other = first.clone();
        other.boot_id = "another boot".into();
        other.features[0].detail = "stale".into();
        write_cache(&dir.join(CACHE_FILE), &other).unwrap();
        let fresh = KernelFeatures::probe(Some(&dir), true);
        assert!(!fresh.cached);
        assert_ne!(fresh.features[0].detail, "stale");
        // Results naming a module BTF the kernel no longer holds (the
        // module unloaded, or loaded again under another id) are not used.
        let mut gone = fresh.clone();
        gone.ct_module_btf_id = Some(u32::MAX);
        gone.features[0].detail = "stale".into();
        write_cache(&dir.join(CACHE_FILE), &gone).unwrap();
        let fresh = KernelFeatures::probe(Some(&dir), true);
        assert!(!fresh.cached);
        assert_ne!(fresh.features[0].detail, "stale");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_feature_turned_off_is_lost_and_a_required_one_cannot_be() {
        let mut k = KernelFeatures::probe(None, false);
        k.turn_off(&[names::CONNTRACK.to_string()]).unwrap();
        assert!(!k.has(names::CONNTRACK));
        assert_eq!(k.ct_opts_size, None);
        let d = k.degraded();
        assert!(d.iter().any(|d| d.feature == names::CONNTRACK), "{d:?}");
        assert!(k.missing().is_none());
        assert!(k.turn_off(&[names::TC.to_string()]).is_err());
        assert!(k.turn_off(&["nonsense".to_string()]).is_err());
    }

    #[test]
    fn a_missing_required_feature_is_a_refusal_naming_it() {
        let mut k = KernelFeatures::probe(None, false);
        k.set(
            names::TCX,
            Err("no BPF_TCX_INGRESS in the kernel's BTF".into()),
        );
        let m = k.missing().expect("refused");
        assert!(m.contains("tcx") && m.contains("Linux 6.6"), "{m}");
    }
}
