//! What the programs may do on this kernel, as the loader and the
//! self-test need it: three answers taken from the kernel's probes.

use crate::dataplane::programs::kernel::{KernelFeatures, names};

/// What the running kernel lets the programs do, from its probes:
/// decided once when the agent starts, the same for
/// every load and self-test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramKernel {
    /// XDP programs load (`weft_decap`).
    pub xdp: bool,
    /// XDP programs may call `bpf_xdp_adjust_meta` (the mark `weft_deliver`
    /// knows XDP's frames by).
    pub xdp_mark: bool,
    /// The conntrack kfuncs, and how many bytes of options a lookup takes;
    /// None: the calls are stubbed out (no flow passes the gate).
    pub ct_opts_size: Option<u32>,
}

impl ProgramKernel {
    pub(crate) fn of(k: &KernelFeatures) -> Self {
        Self {
            xdp: k.has(names::XDP),
            xdp_mark: k.has(names::XDP_MARK),
            ct_opts_size: k.has(names::CONNTRACK).then_some(k.ct_opts_size).flatten(),
        }
    }

    /// This kernel, probed now (`weft selftest` and other one-off loads).
    pub fn probe() -> Self {
        Self::of(&KernelFeatures::probe(None, false))
    }
}
