//! The runtime's network config: the first one in the CNI config directory
//! is the one a runtime uses, and it must run Weft's plugin.

use std::path::{Path, PathBuf};

use super::findings::Findings;

pub(super) fn check(f: &mut Findings, dir: &Path) {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(r) => r
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "conflist" || e == "conf" || e == "json")
            })
            .collect(),
        Err(e) => {
            f.fail(
                "cni",
                format!("cannot read {}: {e}", dir.display()),
                "weft install-cni writes the network config there",
            );
            return;
        }
    };
    files.sort();
    let Some(first) = files.first() else {
        f.fail(
            "cni",
            format!("no network config in {}: pods cannot start", dir.display()),
            "weft install-cni (the DaemonSet's init container runs it)",
        );
        return;
    };
    let text = std::fs::read_to_string(first).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let types: Vec<&str> = match v["plugins"].as_array() {
        Some(ps) => ps.iter().filter_map(|p| p["type"].as_str()).collect(),
        None => v["type"].as_str().into_iter().collect(),
    };
    if types.contains(&"weft") {
        f.ok(
            "cni",
            format!(
                "{} ({}) is the runtime's network, with Weft's plugin",
                first.display(),
                types.join(", ")
            ),
        );
    } else {
        f.fail(
            "cni",
            format!("the runtime uses {} (plugins: {}), which does not run Weft's plugin: pods are not registered for host routing", first.display(), if types.is_empty() { "none readable".into() } else { types.join(", ") }),
            "weft install-cni, or add {\"type\": \"weft\"} at the end of that conflist's plugins",
        );
    }
}
