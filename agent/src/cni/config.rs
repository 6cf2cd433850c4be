//! The network configuration the runtime hands the plugin on stdin.
//!
//! ```json
//! {"cniVersion": "1.0.0", "name": "cbr0", "type": "weft",
//!  "subnetFile": "/run/flannel/subnet.env", "stateDir": "/run/weft",
//!  "bridge": "cni0", "dataDir": "/var/lib/cni/networks",
//!  "delegate": {"hairpinMode": true}}
//! ```
//!
//! All fields but `cniVersion`, `name` and `type` are optional; a chained
//! invocation also carries `prevResult`.

use std::path::PathBuf;

use serde_json::{Map, Value, json};

use super::error::{CniError, Code};
use crate::lease::SubnetEnv;

pub(crate) struct NetConf {
    pub(crate) cni_version: String,
    pub(crate) name: String,
    pub(crate) subnet_file: PathBuf,
    pub(crate) state_dir: PathBuf,
    /// The bridge pods are attached to (and whose MAC is their gateway's).
    pub(crate) bridge: String,
    /// host-local's data directory, if not its default.
    data_dir: Option<String>,
    /// Settings that override what the delegate (`bridge`) gets.
    delegate: Map<String, Value>,
    pub(crate) prev_result: Option<Value>,
}

impl NetConf {
    pub(crate) fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let v: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(Code::Decode, "the network config on stdin is not JSON")
                .with_details(e.to_string())
        })?;
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let cni_version = field("cniVersion")
            .ok_or_else(|| CniError::new(Code::InvalidConfig, "cniVersion is missing"))?;
        let name =
            field("name").ok_or_else(|| CniError::new(Code::InvalidConfig, "name is missing"))?;
        let delegate = match v.get("delegate") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return Err(CniError::new(
                    Code::InvalidConfig,
                    "delegate must be an object of bridge plugin settings",
                ));
            }
        };
        Ok(Self {
            cni_version,
            name,
            subnet_file: field("subnetFile")
                .unwrap_or_else(|| "/run/flannel/subnet.env".into())
                .into(),
            state_dir: field("stateDir")
                .unwrap_or_else(|| "/run/weft".into())
                .into(),
            bridge: field("bridge").unwrap_or_else(|| "cni0".into()),
            data_dir: field("dataDir"),
            delegate,
            prev_result: v.get("prevResult").filter(|p| !p.is_null()).cloned(),
        })
    }

    /// The `bridge` + `host-local` config flannel's plugin would delegate
    /// to, from subnet.env.
    pub(crate) fn delegate_config(&self) -> Result<Value, CniError> {
        let text = std::fs::read_to_string(&self.subnet_file).map_err(|e| {
            CniError::new(
                Code::Io,
                format!(
                    "cannot read {} (is the Weft agent running on this node?)",
                    self.subnet_file.display()
                ),
            )
            .with_details(e.to_string())
        })?;
        let env = SubnetEnv::parse(&text).map_err(|e| {
            CniError::new(
                Code::InvalidConfig,
                format!("{}: {e}", self.subnet_file.display()),
            )
        })?;
        // One range and one route per address family, IPv4 first, as
        // flannel's plugin writes them.
        let mut ranges = Vec::new();
        let mut routes = Vec::new();
        if let Some(f) = &env.ipv4 {
            ranges.push(json!([{"subnet": f.subnet.trunc().to_string()}]));
            routes.push(json!({"dst": f.network.to_string()}));
        }
        if let Some(f) = &env.ipv6 {
            ranges.push(json!([{"subnet": f.subnet.trunc().to_string()}]));
            routes.push(json!({"dst": f.network.to_string()}));
        }
        let mut ipam = json!({
            "type": "host-local",
            "ranges": ranges,
            "routes": routes,
        });
        if let Some(d) = &self.data_dir {
            ipam["dataDir"] = json!(d);
        }
        let mut d = json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "isDefaultGateway": true,
            "hairpinMode": true,
            // As flannel's plugin: the bridge masquerades only when the
            // agent does not.
            "ipMasq": !env.ipmasq,
            "mtu": env.mtu,
            "ipam": ipam,
        });
        for (k, v) in &self.delegate {
            d[k] = v.clone();
        }
        Ok(d)
    }
}
