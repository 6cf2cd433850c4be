//! Attaching pods with real CNI plugins, invoked the way a container runtime
//! (libcni) invokes them: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME`, `CNI_PATH` in the environment, the network config on
//! stdin; a conflist's plugins run in order on ADD, each given the previous
//! plugin's result as `prevResult`, and in reverse order on DEL.

use std::{
    io::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{Context as _, Result, bail};
use ipnet::{IpNet, Ipv4Net};
use serde_json::{Value, json};

use crate::netns::Netns;

/// Debian's containernetworking-plugins.
pub const SYSTEM_PLUGINS: &str = "/usr/lib/cni";

/// A network configuration list.
#[derive(Clone, Debug)]
pub struct ConfList {
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
    /// Directories to look for plugin binaries in (CNI_PATH).
    pub path: Vec<PathBuf>,
}

/// The network flannel's CNI plugin sets up for a node (it delegates to
/// `bridge` on cni0, gateway first address, with `host-local` over the
/// node's subnet): the subnet, MTU and network from subnet.env, host-local's
/// records under `ipam_dir`.
pub fn flannel_like(subnet: Ipv4Net, network: Ipv4Net, mtu: u32, ipam_dir: &Path) -> ConfList {
    ConfList {
        name: "cbr0".into(),
        cni_version: "1.0.0".into(),
        plugins: vec![json!({
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "isDefaultGateway": true,
            "hairpinMode": true,
            "ipMasq": false,
            "mtu": mtu,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet.to_string()}]],
                "routes": [{"dst": network.to_string()}],
                "dataDir": ipam_dir,
            },
        })],
        path: vec![PathBuf::from(SYSTEM_PLUGINS)],
    }
}

/// Weft's standalone plugin (as a cluster without flannel's plugin runs
/// it): it reads the agent's subnet.env and delegates to `bridge` and
/// `host-local` for every address family there, as flannel's plugin does.
pub fn weft_standalone(subnet_file: &Path, state_dir: &Path, ipam_dir: &Path) -> ConfList {
    let mut list = ConfList {
        name: "cbr0".into(),
        cni_version: "1.0.0".into(),
        plugins: vec![json!({
            "type": "weft",
            "subnetFile": subnet_file,
            "stateDir": state_dir,
            "dataDir": ipam_dir,
        })],
        path: vec![PathBuf::from(SYSTEM_PLUGINS)],
    };
    let weft_dir = crate::agent::weft_bin()
        .parent()
        .expect("the weft binary is in a directory")
        .to_path_buf();
    list.path.insert(0, weft_dir);
    list
}

/// flannel's plugin's network for a dual-stack node: one range and one
/// route per family, as it writes them from subnet.env.
pub fn flannel_like_dual(
    subnets: (Ipv4Net, ipnet::Ipv6Net),
    networks: (Ipv4Net, ipnet::Ipv6Net),
    mtu: u32,
    ipam_dir: &Path,
) -> ConfList {
    let mut c = flannel_like(subnets.0, networks.0, mtu, ipam_dir);
    let ipam = &mut c.plugins[0]["ipam"];
    ipam["ranges"] = json!([
        [{"subnet": subnets.0.to_string()}],
        [{"subnet": subnets.1.to_string()}]
    ]);
    ipam["routes"] = json!([
        {"dst": networks.0.to_string()},
        {"dst": networks.1.to_string()}
    ]);
    c
}

/// The CNI error a failed plugin printed (its JSON), from an error of
/// [`ConfList::exec`].
pub fn cni_error(e: &anyhow::Error) -> Option<Value> {
    let text = e.to_string();
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    serde_json::from_str(&text[start..=end]).ok()
}

/// Attaches pods to a bridge named `bridge` instead of `cni0` (its first
/// plugin's `bridge`).
pub fn rename_bridge(list: &mut ConfList, bridge: &str) {
    list.plugins[0]["bridge"] = json!(bridge);
}

/// Who a plugin runs for: the node the runtime runs on, the container and
/// its namespace (none for a DEL after the namespace is gone), the
/// interface name in it.
#[derive(Clone, Copy)]
pub struct Invocation<'a> {
    pub runtime_ns: &'a Netns,
    pub container_id: &'a str,
    pub pod: Option<&'a Netns>,
    pub ifname: &'a str,
    /// CNI_ARGS beyond `IgnoreUnknown=1` (e.g. `IP=10.244.3.7` for
    /// host-local).
    pub args: &'a str,
}

/// Chains Weft's plugin after the others (flannel's config plus one line),
/// registering endpoints in the agent's `state_dir`.
pub fn chain_weft(list: &mut ConfList, state_dir: &Path) {
    list.plugins
        .push(json!({"type": "weft", "stateDir": state_dir}));
    let weft_dir = crate::agent::weft_bin()
        .parent()
        .expect("the weft binary is in a directory")
        .to_path_buf();
    if !list.path.contains(&weft_dir) {
        list.path.insert(0, weft_dir);
    }
}

/// What ADD returned, and what the pod got.
#[derive(Clone, Debug)]
pub struct Attached {
    pub result: Value,
    /// The IPv4 address (unspecified when the pod got none).
    pub ip: Ipv4Addr,
    pub ip6: Option<Ipv6Addr>,
    /// The host side of the pod's veth.
    pub host_if: String,
}

impl ConfList {
    /// The config one plugin gets on stdin.
    fn plugin_config(&self, plugin: &Value, prev: Option<&Value>) -> Value {
        let mut c = plugin.clone();
        c["name"] = json!(self.name);
        c["cniVersion"] = json!(self.cni_version);
        if let Some(p) = prev {
            c["prevResult"] = p.clone();
        }
        c
    }

    fn cni_path(&self) -> String {
        self.path
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// The binary of plugin `ty`, from the list's CNI_PATH.
    fn plugin_bin(&self, ty: &str) -> Result<PathBuf> {
        self.path
            .iter()
            .map(|d| d.join(ty))
            .find(|p| p.exists())
            .with_context(|| format!("no CNI plugin {ty:?} in {}", self.cni_path()))
    }

    /// Runs one plugin for `at`.
    pub fn exec(
        &self,
        at: &Invocation<'_>,
        command: &str,
        plugin: &Value,
        prev: Option<&Value>,
    ) -> Result<Value> {
        let Invocation {
            runtime_ns,
            container_id,
            pod,
            ifname,
            args,
        } = *at;
        let ty = plugin["type"].as_str().context("a plugin without a type")?;
        let bin = self.plugin_bin(ty)?;
        let config = serde_json::to_vec(&self.plugin_config(plugin, prev))?;
        let netns = pod
            .map(|p| p.path().display().to_string())
            .unwrap_or_default();
        let mut child = runtime_ns
            .command(bin.to_str().context("plugin path")?)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", self.cni_path())
            // The runtime's own environment: the tests keep agents' state
            // under the temp directory, which Weft's plugin accepts only
            // when told (a network config cannot tell it).
            .env("WEFT_CNI_ROOTS", std::env::temp_dir())
            .env(
                "CNI_ARGS",
                if args.is_empty() {
                    "IgnoreUnknown=1".to_string()
                } else {
                    format!("IgnoreUnknown=1;{args}")
                },
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting CNI plugin {ty}"))?;
        child.stdin.take().context("stdin")?.write_all(&config)?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "CNI {command} of {ty} failed ({}): {} {}",
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        if stdout.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&stdout).with_context(|| format!("{ty} printed {stdout:?}"))
    }

    /// A verb about the whole network (STATUS, GC) to the plugin of type
    /// `ty`, as libcni 1.2 calls it: the plugin's config with the list's
    /// name and version, for GC with `cni.dev/valid-attachments` (each
    /// `(container id, ifname)`, `None`: the key left out), and only
    /// `CNI_COMMAND` and `CNI_PATH` set.
    pub fn network_verb(
        &self,
        runtime_ns: &Netns,
        command: &str,
        ty: &str,
        valid: Option<&[(&str, &str)]>,
    ) -> Result<()> {
        let plugin = self
            .plugins
            .iter()
            .find(|p| p["type"] == ty)
            .with_context(|| format!("no plugin {ty:?} in the list"))?;
        let mut config = self.plugin_config(plugin, None);
        if let Some(v) = valid {
            config["cni.dev/valid-attachments"] = v
                .iter()
                .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
                .collect();
        }
        let bin = self.plugin_bin(ty)?;
        let mut child = runtime_ns
            .command(bin.to_str().context("plugin path")?)
            .env_remove("CNI_CONTAINERID")
            .env_remove("CNI_NETNS")
            .env_remove("CNI_IFNAME")
            .env("CNI_COMMAND", command)
            .env("CNI_PATH", self.cni_path())
            .env("WEFT_CNI_ROOTS", std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting CNI plugin {ty}"))?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(&serde_json::to_vec(&config)?)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "CNI {command} of {ty} failed ({}): {} {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// ADD through every plugin in order.
    pub fn add(
        &self,
        runtime_ns: &Netns,
        container_id: &str,
        pod: &Netns,
        ifname: &str,
    ) -> Result<Attached> {
        self.add_with(runtime_ns, container_id, pod, ifname, "")
    }

    /// ADD with extra CNI_ARGS.
    pub fn add_with(
        &self,
        runtime_ns: &Netns,
        container_id: &str,
        pod: &Netns,
        ifname: &str,
        args: &str,
    ) -> Result<Attached> {
        let at = Invocation {
            runtime_ns,
            container_id,
            pod: Some(pod),
            ifname,
            args,
        };
        let mut prev: Option<Value> = None;
        for plugin in &self.plugins {
            prev = Some(self.exec(&at, "ADD", plugin, prev.as_ref())?);
        }
        let result = prev.context("an empty plugin list")?;
        attached(result)
    }

    /// DEL through every plugin in reverse order, each with the result of
    /// the ADD (what libcni does from its cache).
    pub fn del(
        &self,
        runtime_ns: &Netns,
        container_id: &str,
        pod: Option<&Netns>,
        ifname: &str,
        prev: Option<&Value>,
    ) -> Result<()> {
        let at = Invocation {
            runtime_ns,
            container_id,
            pod,
            ifname,
            args: "",
        };
        for plugin in self.plugins.iter().rev() {
            self.exec(&at, "DEL", plugin, prev)?;
        }
        Ok(())
    }

    /// CHECK through every plugin in order.
    pub fn check(
        &self,
        runtime_ns: &Netns,
        container_id: &str,
        pod: &Netns,
        ifname: &str,
        prev: &Value,
    ) -> Result<()> {
        let at = Invocation {
            runtime_ns,
            container_id,
            pod: Some(pod),
            ifname,
            args: "",
        };
        for plugin in &self.plugins {
            self.exec(&at, "CHECK", plugin, Some(prev))?;
        }
        Ok(())
    }
}

/// libcni's result cache under `cache_dir` (containerd's and CRI-O's
/// `/var/lib/cni`): after an ADD the runtime keeps the network's result in
/// `results/<network>-<container id>-<ifname>` (`"kind": "cniCacheV1"`, the
/// network config base64-encoded), for DEL and CHECK; DEL removes it.
pub fn cache_result(
    cache_dir: &Path,
    net: &ConfList,
    container_id: &str,
    ifname: &str,
    netns: &Netns,
    result: &Value,
) -> Result<()> {
    let config = json!({"cniVersion": net.cni_version, "name": net.name, "plugins": net.plugins});
    let entry = json!({
        "kind": "cniCacheV1",
        "containerId": container_id,
        "config": base64(&serde_json::to_vec(&config)?),
        "ifName": ifname,
        "networkName": net.name,
        "netns": netns.path(),
        "result": result,
    });
    let dir = cache_dir.join("results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(format!("{}-{container_id}-{ifname}", net.name)),
        serde_json::to_vec(&entry)?,
    )?;
    Ok(())
}

/// Removes what [`cache_result`] wrote (libcni, after DEL).
pub fn uncache_result(cache_dir: &Path, net: &ConfList, container_id: &str, ifname: &str) {
    let _ = std::fs::remove_file(
        cache_dir
            .join("results")
            .join(format!("{}-{container_id}-{ifname}", net.name)),
    );
}

/// Standard base64, padded (Go's `[]byte` in JSON).
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The pod's address and host interface from a CNI result.
pub fn attached(result: Value) -> Result<Attached> {
    let ifaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    let addrs: Vec<IpNet> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["address"].as_str()?.parse().ok())
        .collect();
    if addrs.is_empty() {
        bail!("no address in the CNI result {result}");
    }
    let ip = addrs
        .iter()
        .find_map(|a| match a {
            IpNet::V4(n) => Some(n.addr()),
            IpNet::V6(_) => None,
        })
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    let ip6 = addrs.iter().find_map(|a| match a {
        IpNet::V6(n) => Some(n.addr()),
        IpNet::V4(_) => None,
    });
    // The host side of the veth: the interface in no sandbox that is not
    // the bridge (bridge's result lists the bridge, whatever it is called,
    // the host veth, which it names veth<hash>, and the container's
    // interface).
    let host: Vec<&str> = ifaces
        .iter()
        .filter(|i| i.get("sandbox").is_none_or(|s| s.as_str() == Some("")))
        .filter_map(|i| i["name"].as_str())
        .collect();
    let host_if = host
        .iter()
        .find(|n| n.starts_with("veth"))
        .or_else(|| host.iter().find(|n| **n != "cni0"))
        .copied()
        .unwrap_or_default()
        .to_string();
    Ok(Attached {
        result,
        ip,
        ip6,
        host_if,
    })
}

/// A container id a runtime might make up.
pub fn container_id(name: &str) -> String {
    format!("{name}{:0>56x}", std::process::id())
        .chars()
        .take(64)
        .collect()
}
