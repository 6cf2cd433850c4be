//! The programs' life cycle, from the kernel's answer to what they may do
//! to their retirement: what the kernel offers, probed (`kernel/`, with
//! `kfuncs.rs` and `btf.rs`, the little of BTF read); the embedded object
//! (`object.rs`) loaded with this kernel's answers (`load.rs`), pinned,
//! attached and adopted across upgrades (`loader.rs`); the current and
//! previous generations, kept for a rollback (`generations.rs`); the golden
//! frames run against them before they take traffic (`selftest/`); and a
//! kernel program's identity (`ids.rs`).

pub(crate) mod btf;
pub(crate) mod generations;
pub(crate) mod ids;
pub(crate) mod kernel;
pub(crate) mod kfuncs;
pub(crate) mod links;
pub(crate) mod load;
pub(crate) mod loader;
pub(crate) mod object;
pub(crate) mod selftest;
