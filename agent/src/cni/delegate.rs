//! Running another CNI plugin (the delegate, `bridge`) from `CNI_PATH`,
//! the way the runtime ran this one.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
};

use serde_json::Value;

use super::{
    Env,
    error::{CniError, Code},
};

/// Runs the plugin named by `conf["type"]` with `command`; returns what it
/// printed (its result, or null for DEL and CHECK).
pub(crate) fn exec(
    conf: &Value,
    command: &str,
    env: &Env,
    prev: Option<&Value>,
) -> Result<Value, CniError> {
    let ty = conf["type"]
        .as_str()
        .ok_or_else(|| CniError::new(Code::InvalidConfig, "the delegate has no type"))?;
    super::config::check_plugin_name(ty)?;
    let bin = env
        .path
        .iter()
        .map(|d| Path::new(d).join(ty))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                Code::InvalidConfig,
                format!("no CNI plugin {ty:?} in CNI_PATH ({})", env.path.join(":")),
            )
        })?;
    let mut conf = conf.clone();
    if let Some(p) = prev {
        conf["prevResult"] = p.clone();
    }
    // The attachment's own variables, not this process's: GC runs the
    // delegate for attachments other than the one it was called for.
    let mut child = Command::new(&bin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", env.path.join(":"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CniError::new(Code::Io, format!("cannot run {}", bin.display()))
                .with_details(e.to_string())
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(conf.to_string().as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| {
        CniError::new(Code::Io, format!("running {ty}")).with_details(e.to_string())
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // The delegate's own CNI error, passed on with its message.
        let v: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        let msg = v["msg"].as_str().unwrap_or("failed");
        return Err(
            CniError::new(Code::Plugin, format!("{ty} {command}: {msg}")).with_details(
                format!(
                    "{} {}",
                    v["details"].as_str().unwrap_or(""),
                    String::from_utf8_lossy(&out.stderr).trim()
                )
                .trim()
                .to_string(),
            ),
        );
    }
    if stdout.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&stdout).map_err(|e| {
        CniError::new(
            Code::Decode,
            format!("{ty} printed something that is not JSON"),
        )
        .with_details(e.to_string())
    })
}
