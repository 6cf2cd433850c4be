//! Weft's CNI plugin (`"type": "weft"`), run by a container runtime as the
//! `weft` binary with `CNI_COMMAND` in its environment (CNI spec 1.1: ADD,
//! DEL, CHECK, STATUS, GC, VERSION).
//!
//! - Standalone (no `prevResult`): does what flannel's plugin does (reads
//!   subnet.env, delegates to `bridge` with `host-local` over the node's
//!   subnet, its MTU and masquerade setting), then registers the endpoint.
//! - Chained after the plugin that attached the pod (flannel's, or `bridge`
//!   configured like it): reads `prevResult`, registers the endpoint, and
//!   passes the result on.
//!
//! Registering an endpoint writes a record into `<stateDir>/endpoints/` (the
//! plugin's own result cache) and tells the agent over
//! `<stateDir>/cni.sock`; with the agent down, ADD still succeeds and the
//! pod takes the host stack until the agent, back, reads the record.
//!
//! STATUS answers 0 while the node's agent is ready and error 50 (not
//! available) while it is not or is not running; GC releases what the
//! plugin holds for attachments the runtime no longer names (`gc.rs`).

mod adopt;
mod config;
mod delegate;
mod error;
mod fastpath;
mod gc;
mod netkit;
mod notify;
mod proxy;
mod record;

use std::{io::Read as _, process::ExitCode};

use serde_json::{Value, json};

pub(crate) use adopt::{DEFAULT_CACHE_DIR, adopted};
pub(crate) use notify::{Listener, ask as ask_agent, ask_raw as ask_agent_raw, remove_socket};
pub(crate) use record::{Record as EndpointRecord, forget, records};

use self::record::Record;

use self::{
    config::NetConf,
    error::{CniError, Code},
};

/// The CNI versions this plugin speaks.
const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Whether this process was started as a CNI plugin.
pub(crate) fn invoked() -> bool {
    std::env::var_os("CNI_COMMAND").is_some() && std::env::args_os().len() == 1
}

/// The plugin: reads the config on stdin, prints the result (or a CNI
/// error) on stdout.
pub(crate) fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let version = std::io::stdin()
        .read_to_end(&mut stdin)
        .ok()
        .and_then(|_| serde_json::from_slice::<Value>(&stdin).ok())
        .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
        .unwrap_or_else(|| "1.0.0".to_string());
    match run(&stdin) {
        Ok(Some(out)) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            println!("{}", e.to_json(&version));
            ExitCode::FAILURE
        }
    }
}

/// The environment a runtime sets.
struct Env {
    command: String,
    container_id: String,
    netns: String,
    ifname: String,
    path: Vec<String>,
    /// The Kubernetes pod CNI_ARGS names, if any.
    pod: Option<record::Pod>,
}

fn env_var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn env() -> Result<Env, CniError> {
    let e = Env {
        command: env_var("CNI_COMMAND"),
        container_id: env_var("CNI_CONTAINERID"),
        netns: env_var("CNI_NETNS"),
        ifname: env_var("CNI_IFNAME"),
        path: env_var("CNI_PATH")
            .split(':')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
        pod: record::Pod::from_cni_args(&env_var("CNI_ARGS")),
    };
    // STATUS and GC concern the network, not one attachment: libcni sets
    // no container, netns or interface for them.
    if !matches!(e.command.as_str(), "VERSION" | "STATUS" | "GC") {
        let ok_id = !e.container_id.is_empty()
            && e.container_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !ok_id {
            return Err(CniError::new(
                Code::InvalidEnv,
                format!(
                    "CNI_CONTAINERID {:?} is missing or not [A-Za-z0-9_.-]+",
                    e.container_id
                ),
            ));
        }
        if e.ifname.is_empty() || e.ifname.len() > 15 || e.ifname.contains('/') {
            return Err(CniError::new(
                Code::InvalidEnv,
                format!("CNI_IFNAME {:?} is not an interface name", e.ifname),
            ));
        }
        if e.command != "DEL" && e.netns.is_empty() {
            return Err(CniError::new(Code::InvalidEnv, "CNI_NETNS is missing"));
        }
    }
    Ok(e)
}

fn run(stdin: &[u8]) -> Result<Option<String>, CniError> {
    let env = env()?;
    if env.command == "VERSION" {
        return Ok(Some(version_reply(stdin)));
    }
    let conf = NetConf::parse(stdin)?;
    supported(&conf.cni_version)?;
    match env.command.as_str() {
        "ADD" => add(&conf, &env).map(Some),
        "DEL" => del(&conf, &env).map(|()| None),
        "CHECK" => check(&conf, &env).map(|()| None),
        "STATUS" => status(&conf).map(|()| None),
        "GC" => gc::gc(&conf, &env, stdin).map(|()| None),
        other => Err(CniError::new(
            Code::InvalidEnv,
            format!("CNI_COMMAND {other:?} is not ADD, DEL, CHECK, STATUS, GC or VERSION"),
        )),
    }
}

/// The answer to VERSION: the config's version echoed (1.0.0 when there is
/// none) and the versions spoken.
fn version_reply(stdin: &[u8]) -> String {
    let conf: Value = serde_json::from_slice(stdin).unwrap_or(json!({}));
    json!({
        "cniVersion": conf["cniVersion"].as_str().unwrap_or("1.0.0"),
        "supportedVersions": VERSIONS,
    })
    .to_string()
}

/// Whether this plugin speaks `version`; the CNI error (code 1) if not.
fn supported(version: &str) -> Result<(), CniError> {
    if VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(CniError::new(
        Code::IncompatibleVersion,
        format!(
            "cniVersion {version} is not supported (supported: {})",
            VERSIONS.join(", ")
        ),
    ))
}

fn add(conf: &NetConf, env: &Env) -> Result<String, CniError> {
    let (result, delegate) = match &conf.prev_result {
        Some(_) if conf.netkit => {
            return Err(CniError::new(
                Code::InvalidConfig,
                "podDevice netkit is for the standalone plugin: chained, the plugins before Weft's made the pod's device (a veth)",
            ));
        }
        Some(prev) => (prev.clone(), None),
        None if conf.netkit => {
            let d = conf.delegate_config()?;
            let ipam = netkit::ipam_config(&d);
            let mtu = d["mtu"].as_u64().unwrap_or(1500) as u32;
            let owner = record::owner(&env.container_id, &env.ifname);
            (
                netkit::add(&ipam, mtu, &conf.state_dir, &conf.bridge, env, &owner)?,
                Some(ipam),
            )
        }
        None => {
            let d = conf.delegate_config()?;
            let result = delegate::exec(&d, "ADD", env, None)?;
            // The bridge may be new: it answers for the netkit pods.
            netkit::proxy_registered(&conf.state_dir, &conf.bridge);
            (result, Some(d))
        }
    };
    // A delegate spoken to in an older version answers in it; the runtime
    // gets the network's.
    let mut result = result;
    result["cniVersion"] = serde_json::json!(conf.cni_version);
    let mut rec = Record::from_result(
        &conf.name,
        &conf.bridge,
        env.container_id.clone(),
        env.ifname.clone(),
        &env.netns,
        &result,
        delegate,
    )?;
    rec.pod = env.pod.clone();
    record::write(&conf.state_dir, &rec)?;
    fastpath::program(&conf.state_dir, &rec);
    notify::agent(&conf.state_dir);
    Ok(result.to_string())
}

fn del(conf: &NetConf, env: &Env) -> Result<(), CniError> {
    let owner = record::owner(&env.container_id, &env.ifname);
    let rec = record::read(&conf.state_dir, &owner);
    match rec.as_ref().map(|r| (r.delegate.as_ref(), r.netkit)) {
        // A netkit pod: its pair goes, then its addresses (with the IPAM
        // config ADD used).
        Some((Some(ipam), true)) => {
            let ips = rec.as_ref().map(Record::ips).unwrap_or_default();
            netkit::del(ipam, &conf.state_dir, &conf.bridge, &ips, env, &owner)?;
        }
        // Standalone: what ADD delegated to gets the DEL, with the config it
        // had then (subnet.env may have changed or be gone since).
        Some((Some(d), _)) => {
            delegate::exec(d, "DEL", env, conf.prev_result.as_ref())?;
        }
        // Chained: the plugins before this one clean up themselves.
        Some((None, _)) => {}
        // Nothing registered (DEL without ADD, a second DEL, or an ADD that
        // died before registering): a standalone config still releases
        // whatever the delegate may hold, as best it can.
        None => {
            if conf.prev_result.is_none()
                && let Ok(d) = conf.delegate_config()
            {
                if conf.netkit {
                    let _ = netkit::del(
                        &netkit::ipam_config(&d),
                        &conf.state_dir,
                        &conf.bridge,
                        &[],
                        env,
                        &owner,
                    );
                } else {
                    let _ = delegate::exec(&d, "DEL", env, None);
                }
            }
        }
    }
    if let Some(rec) = &rec {
        fastpath::unprogram(&conf.state_dir, rec);
        record::remove(&conf.state_dir, &owner)?;
        notify::agent(&conf.state_dir);
    }
    Ok(())
}

/// STATUS: ready to serve ADD with the fast path when the node's agent is.
fn status(conf: &NetConf) -> Result<(), CniError> {
    notify::agent_status(&conf.state_dir).map_err(|why| CniError::new(Code::NotAvailable, why))
}

fn check(conf: &NetConf, env: &Env) -> Result<(), CniError> {
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(Code::InvalidConfig, "CHECK needs prevResult"))?;
    let owner = record::owner(&env.container_id, &env.ifname);
    let rec = record::read(&conf.state_dir, &owner).ok_or_else(|| {
        CniError::new(
            Code::UnknownContainer,
            format!("no endpoint registered for {owner}"),
        )
    })?;
    if let Some(d) = &rec.delegate {
        delegate::exec(d, "CHECK", env, Some(prev))?;
    }
    let now = Record::from_result(
        &conf.name,
        &conf.bridge,
        env.container_id.clone(),
        env.ifname.clone(),
        &env.netns,
        prev,
        rec.delegate.clone(),
    )?;
    if (now.ip, &now.other_ips, now.pod_mac, now.host_if.as_str())
        != (rec.ip, &rec.other_ips, rec.pod_mac, rec.host_if.as_str())
    {
        return Err(CniError::new(
            Code::Plugin,
            format!(
                "the endpoint registered for {owner} ({} {} on {}) is not the pod's ({} {} on {})",
                rec.ip, rec.pod_mac, rec.host_if, now.ip, now.pod_mac, now.host_if
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_echoes_the_config_and_lists_what_is_spoken() {
        let v: Value = serde_json::from_str(&version_reply(br#"{"cniVersion":"0.4.0"}"#)).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(
            v["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
        // No config (or not JSON): the spec's current version.
        for stdin in [&b""[..], b"not json", b"{}"] {
            let v: Value = serde_json::from_str(&version_reply(stdin)).unwrap();
            assert_eq!(v["cniVersion"], "1.0.0", "{stdin:?}");
        }
    }

    #[test]
    fn an_unsupported_version_is_error_code_1() {
        for ok in VERSIONS {
            assert!(supported(ok).is_ok(), "{ok}");
        }
        for bad in ["0.2.0", "2.0.0", "", "1.0"] {
            let e = supported(bad).unwrap_err();
            let v: Value = serde_json::from_str(&e.to_json("1.0.0")).unwrap();
            assert_eq!(v["code"], 1, "{bad}");
            assert!(
                v["msg"].as_str().unwrap().contains("is not supported"),
                "{v}"
            );
        }
    }
}
