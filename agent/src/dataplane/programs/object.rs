//! The eBPF object this build carries: the programs of `dataplane-ebpf/`,
//! built by `build.rs`, parsed and loaded by the loader and probed by the
//! kernel checks.

/// The eBPF object built from `dataplane-ebpf/` (see `build.rs`).
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/weft-dataplane"));
