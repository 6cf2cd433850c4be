//! What the running kernel offers the dataplane, read from its BTF (not
//! its version: distributions backport). Checked when the agent starts,
//! before it takes a lease, and by `weft doctor`, with the same words.
//!
//! Required: BTF itself (the loader reads the kernel's types) and TCX links
//! (Linux 6.6: every TC program attaches through one). Optional: the
//! conntrack kfuncs in the kernel's own BTF (conntrack built in): without
//! them `--host-routing auto` sends every flow through the host stack.

use std::path::Path;

use super::{btf::Btf, kfuncs::KernelBtf};
use crate::sys::fs::kernel_release;

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The running kernel, as the dataplane sees it.
#[derive(Clone, Debug)]
pub(crate) struct KernelSupport {
    /// `uname -r`.
    pub(crate) release: String,
    /// What Weft needs and this kernel lacks, said for an operator; the
    /// agent refuses to start with it.
    pub(crate) missing: Option<String>,
    /// What Weft does without on this kernel, and what that costs.
    pub(crate) degraded: Vec<String>,
}

impl KernelSupport {
    /// Reads the running kernel's BTF.
    pub(crate) fn check() -> Self {
        let release = kernel_release().unwrap_or_else(|| "unknown".into());
        let raw = match std::fs::read(VMLINUX) {
            Ok(r) => r,
            Err(e) => {
                let missing = if Path::new(VMLINUX).exists() {
                    format!("Linux {release}: its BTF ({VMLINUX}) cannot be read: {e}")
                } else {
                    format!(
                        "Linux {release} has no BTF ({VMLINUX}): Weft needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
                    )
                };
                return Self {
                    release,
                    missing: Some(missing),
                    degraded: vec![],
                };
            }
        };
        Self::judge(
            release,
            &raw,
            KernelBtf::read().err().map(|e| format!("{e:#}")),
        )
    }

    /// The verdict on `raw` (the kernel's BTF), given why the conntrack
    /// kfuncs could not be resolved, if they could not.
    fn judge(release: String, raw: &[u8], no_kfuncs: Option<String>) -> Self {
        let btf = match Btf::parse(raw) {
            Ok(b) => b,
            Err(e) => {
                return Self {
                    missing: Some(format!(
                        "Linux {release}: its BTF ({VMLINUX}) cannot be parsed: {e:#}"
                    )),
                    release,
                    degraded: vec![],
                };
            }
        };
        let missing = (!btf.has_enumerator("BPF_TCX_INGRESS")).then(|| {
            format!(
                "Linux {release} has no TCX links (BPF_TCX_INGRESS, Linux 6.6): Weft attaches its TC programs through them and needs Linux 6.6 or later"
            )
        });
        let degraded = no_kfuncs
            .map(|why| {
                format!(
                    "no conntrack kfuncs in the kernel's own BTF ({why}): --host-routing auto sends every flow through the host stack. Weft calls them only where conntrack is built into the kernel (CONFIG_NF_CONNTRACK=y); where it is a module, as in Debian's and Ubuntu's kernels, they are in the module's BTF, which the loader cannot call yet"
                )
            })
            .into_iter()
            .collect();
        Self {
            release,
            missing,
            degraded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_has_tcx() {
        // The machines the tests run on are 6.6 or later (the VM runner's
        // 6.1 checks the refusal, through the agent).
        let k = KernelSupport::check();
        assert!(k.missing.is_none(), "{:?}", k.missing);
    }

    #[test]
    fn broken_btf_is_a_clear_refusal() {
        let k = KernelSupport::judge("6.6.0".into(), b"not btf", None);
        let m = k.missing.expect("refused");
        assert!(m.contains("cannot be parsed"), "{m}");
    }

    #[test]
    fn a_kernel_without_kfuncs_says_what_it_costs() {
        let raw = std::fs::read(VMLINUX).expect("this kernel's BTF");
        let k = KernelSupport::judge("6.12.0".into(), &raw, Some("no kfunc x".into()));
        assert_eq!(k.degraded.len(), 1);
        assert!(k.degraded[0].contains("every flow through the host stack"));
    }
}
