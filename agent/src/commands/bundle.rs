//! `weft bundle`: what a bug report needs from a node, in one JSON
//! document (`kubectl exec ... weft bundle > node.json` works in the
//! DaemonSet's container, which has no shell or tar). The commands that
//! report on the node run as they would by hand, this binary with the same
//! settings (passed in their environment variables, as every flag has
//! one), each bounded in time; a part that fails records its error and the
//! rest is still gathered.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use crate::cli::NodeArgs;

/// How long one part may take (doctor probes every peer).
const PART_TIMEOUT: Duration = Duration::from_secs(90);

pub(crate) async fn bundle(
    node: &NodeArgs,
    cni_conf_dir: &Path,
    output: Option<&Path>,
) -> Result<()> {
    let env = settings(node, cni_conf_dir);
    let mut doc = json!({
        "weft": env!("CARGO_PKG_VERSION"),
        "taken_at_unix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
    });
    for (part, args) in [
        ("status", &["status", "--json"][..]),
        ("doctor", &["doctor", "--json"]),
        ("leases", &["leases", "--json"]),
        ("endpoints", &["endpoints", "--json"]),
    ] {
        doc[part] = run(args, &env).await;
    }
    doc["pins"] = json!(files(&node.pins.bpffs_dir));
    doc["subnet_env"] = json!(read(&node.subnet_file.display().to_string()));
    doc["log_tail"] = match crate::cni::ask_agent_raw(&node.state.state_dir, "log-tail") {
        Ok(text) if text.trim() == "ok" => {
            json!({"error": "the agent predates weft bundle: it keeps no log tail"})
        }
        Ok(text) => json!(text.lines().collect::<Vec<_>>()),
        Err(e) => {
            json!({"error": format!("no agent answers in {}: {e}", node.state.state_dir.display())})
        }
    };
    let text = serde_json::to_string_pretty(&doc)?;
    match output {
        Some(p) => {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
            eprintln!("weft bundle: wrote {}", p.display());
        }
        None => println!("{text}"),
    }
    Ok(())
}

/// The settings the parts run with, as the environment variables their
/// flags read.
fn settings(node: &NodeArgs, cni_conf_dir: &Path) -> Vec<(&'static str, String)> {
    let e = &node.etcd;
    let mut env = vec![
        ("WEFT_BPFFS_DIR", node.pins.bpffs_dir.display().to_string()),
        ("WEFT_STATE_DIR", node.state.state_dir.display().to_string()),
        (
            "FLANNELD_SUBNET_FILE",
            node.subnet_file.display().to_string(),
        ),
        ("WEFT_CNI_CONF_DIR", cni_conf_dir.display().to_string()),
        ("FLANNELD_ETCD_ENDPOINTS", e.etcd_endpoints.join(",")),
        ("FLANNELD_ETCD_PREFIX", e.etcd_prefix.clone()),
        ("WEFT_ETCD_TIMEOUT", e.etcd_timeout.to_string()),
    ];
    for (k, v) in [
        ("FLANNELD_ETCD_CAFILE", &e.etcd_cafile),
        ("FLANNELD_ETCD_CERTFILE", &e.etcd_certfile),
        ("FLANNELD_ETCD_KEYFILE", &e.etcd_keyfile),
    ] {
        if let Some(p) = v {
            env.push((k, p.display().to_string()));
        }
    }
    if let Some(u) = &e.etcd_username {
        env.push(("FLANNELD_ETCD_USERNAME", u.clone()));
    }
    if let Some(p) = &e.etcd_password {
        env.push(("FLANNELD_ETCD_PASSWORD", p.clone()));
    }
    env
}

/// One part: `weft ARGS`, its JSON (or what it printed), and its error.
async fn run(args: &[&str], env: &[(&'static str, String)]) -> Value {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return json!({"error": format!("this binary's path: {e}")}),
    };
    let mut c = tokio::process::Command::new(exe);
    c.args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .env_remove("NOTIFY_SOCKET")
        .kill_on_drop(true);
    let out = match tokio::time::timeout(PART_TIMEOUT, c.output()).await {
        Err(_) => {
            return json!({"error": format!("weft {} took over {PART_TIMEOUT:?}", args.join(" "))});
        }
        Ok(Err(e)) => return json!({"error": format!("running weft {}: {e}", args.join(" "))}),
        Ok(Ok(o)) => o,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed: Option<Value> = serde_json::from_str(&stdout).ok();
    let mut part = json!({"exit_ok": out.status.success()});
    match parsed {
        Some(v) => part["output"] = v,
        None => part["output"] = json!(stdout),
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !stderr.is_empty() {
        part["stderr"] = json!(stderr);
    }
    part
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("(cannot read {path}: {e})"))
}

/// The files under `dir`, relative, sorted (the pins: maps, links,
/// program generations).
fn files(dir: &Path) -> Vec<String> {
    fn go(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(d) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                go(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap_or(&p).display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out.sort();
    out
}
