//! Where the tools `cargo xtask setup` installs outside Debian's packages
//! live: the user's cache, the Python virtualenv, promtool. Setup writes
//! them; the tests and the VM runner find them there.

use std::path::PathBuf;

pub(crate) fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// The virtualenv's bin directory (on PATH for virtme-ng, whose `vng`
/// runs `virtme-run` from there).
pub(crate) fn venv_bin() -> PathBuf {
    home().join(".cache/weft/venv/bin")
}

/// PyPI's kubernetes-validate, in the virtualenv.
pub(crate) fn kubernetes_validate_bin() -> PathBuf {
    venv_bin().join("kubernetes-validate")
}

/// Prometheus's `promtool`.
pub(crate) fn promtool_bin() -> PathBuf {
    home().join(".cache/weft/bin/promtool")
}
