//! The network configuration the runtime hands the plugin on stdin.
//!
//! ```json
//! {"cniVersion": "1.0.0", "name": "cbr0", "type": "weft",
//!  "subnetFile": "/run/flannel/subnet.env", "stateDir": "/run/weft",
//!  "bridge": "cni0", "dataDir": "/var/lib/cni/networks",
//!  "delegate": {"hairpinMode": true}, "podDevice": "veth"}
//! ```
//!
//! All fields but `cniVersion`, `name` and `type` are optional; a chained
//! invocation also carries `prevResult`.
//!
//! The config is not trusted more than the runtime's environment: whoever
//! can write a network attachment (a Multus NetworkAttachmentDefinition is
//! namespaced) must not get root on the node through it. So `delegate` may
//! set only the bridge plugin's own behaviour ([`DELEGATE_KEYS`]: never the
//! plugin to run, the bridge, the IPAM or any path); `bridge` is an
//! interface name, and one that exists must be a bridge (never the
//! uplink); and every path is absolute and under the roots that belong to
//! it ([`Roots`]).

use std::path::{Component, PathBuf};

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
    /// `podDevice`: `veth` (the default: the bridge delegate makes it) or
    /// `netkit` (the plugin makes a netkit pair; standalone only).
    pub(crate) netkit: bool,
}

/// What `delegate` may set: the bridge plugin's settings of its own
/// behaviour (flannel's DaemonSet sets `hairpinMode` and
/// `isDefaultGateway`).
pub(crate) const DELEGATE_KEYS: [&str; 13] = [
    "hairpinMode",
    "isGateway",
    "isDefaultGateway",
    "forceAddress",
    "ipMasq",
    "mtu",
    "promiscMode",
    "vlan",
    "preserveDefaultVlan",
    "macspoofchk",
    "enabledad",
    "disableContainerInterface",
    "portIsolation",
];

/// The directories each path of the config must lie under. The defaults
/// are where Weft and flannel keep them; `WEFT_CNI_ROOTS` (colon-separated,
/// from the runtime's environment, which a network config cannot set)
/// adds roots for all three.
pub(crate) struct Roots {
    state: Vec<PathBuf>,
    subnet_file: Vec<PathBuf>,
    data: Vec<PathBuf>,
}

impl Roots {
    pub(crate) fn from_env() -> Self {
        let extra: Vec<PathBuf> = std::env::var_os("WEFT_CNI_ROOTS")
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| p.is_absolute())
                    .collect()
            })
            .unwrap_or_default();
        let with = |defaults: &[&str]| -> Vec<PathBuf> {
            defaults
                .iter()
                .map(PathBuf::from)
                .chain(extra.iter().cloned())
                .collect()
        };
        Self {
            state: with(&["/run/weft", "/var/run/weft"]),
            subnet_file: with(&["/run/flannel", "/var/run/flannel", "/run/weft"]),
            data: with(&["/var/lib/cni"]),
        }
    }
}

/// `path` (the config's `field`) if it is absolute, has no `..` and lies
/// under one of `roots`; the CNI error (code 7) otherwise.
fn under(field: &str, path: PathBuf, roots: &[PathBuf]) -> Result<PathBuf, CniError> {
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if plain && roots.iter().any(|r| path.starts_with(r)) {
        return Ok(path);
    }
    Err(CniError::new(
        Code::InvalidConfig,
        format!(
            "{field} {} must be an absolute path (without ..) under {}",
            path.display(),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    ))
}

/// Whether `name` can be a network interface's name.
fn is_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
}

/// A CNI plugin's name (`type`), as libcni accepts it: a file name, never
/// a path (CVE-2021-20206).
pub(crate) fn check_plugin_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
        return Err(CniError::new(
            Code::InvalidConfig,
            format!("plugin type {name:?} is not a plugin name (no path, no separator)"),
        ));
    }
    Ok(())
}

/// The version the delegates are spoken to in: CNI 1.1 added verbs (STATUS,
/// GC), not fields, so a 1.1.0 network goes to the delegates as 1.0.0,
/// which the plugins of distributions still on CNI 1.0 (Debian's bridge and
/// host-local) accept; their result is the same document either way.
pub(crate) fn delegate_version(version: &str) -> &str {
    if version == "1.1.0" { "1.0.0" } else { version }
}

impl NetConf {
    pub(crate) fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        Self::parse_with(stdin, &Roots::from_env())
    }

    pub(crate) fn parse_with(stdin: &[u8], roots: &Roots) -> Result<Self, CniError> {
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
        if let Some(k) = delegate
            .keys()
            .find(|k| !DELEGATE_KEYS.contains(&k.as_str()))
        {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "delegate may not set {k:?}: it sets only the bridge plugin's {}",
                    DELEGATE_KEYS.join(", ")
                ),
            ));
        }
        let netkit = match v.get("podDevice") {
            None | Some(Value::Null) => false,
            Some(Value::String(d)) if d == "veth" => false,
            Some(Value::String(d)) if d == "netkit" => true,
            Some(other) => {
                return Err(CniError::new(
                    Code::InvalidConfig,
                    format!("podDevice {other} is neither \"veth\" nor \"netkit\""),
                ));
            }
        };
        let prev_result = v.get("prevResult").filter(|p| !p.is_null()).cloned();
        let bridge = field("bridge").unwrap_or_else(|| "cni0".into());
        if !is_ifname(&bridge) {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!("bridge {bridge:?} is not an interface name"),
            ));
        }
        if let Ok(driver) = crate::sys::ethtool::driver(&bridge)
            && driver != "bridge"
        {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!("bridge {bridge:?} exists and is not a bridge (its driver is {driver})"),
            ));
        }
        let path = |k: &str, default: Option<&str>, roots: &[PathBuf]| {
            field(k)
                .or_else(|| default.map(str::to_string))
                .map(|p| under(k, PathBuf::from(p), roots))
                .transpose()
        };
        Ok(Self {
            cni_version,
            name,
            subnet_file: path(
                "subnetFile",
                Some("/run/flannel/subnet.env"),
                &roots.subnet_file,
            )?
            .expect("a default"),
            state_dir: path("stateDir", Some("/run/weft"), &roots.state)?.expect("a default"),
            bridge,
            data_dir: path("dataDir", None, &roots.data)?.map(|p| p.display().to_string()),
            delegate,
            prev_result,
            netkit,
        })
    }

    /// host-local's data directory, if the config names one.
    pub(crate) fn data_dir(&self) -> Option<&str> {
        self.data_dir.as_deref()
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
            "cniVersion": delegate_version(&self.cni_version),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn roots() -> Roots {
        Roots {
            state: vec!["/run/weft".into()],
            subnet_file: vec!["/run/flannel".into()],
            data: vec!["/var/lib/cni".into()],
        }
    }

    fn parse(extra: &str) -> Result<NetConf, CniError> {
        let conf = format!(r#"{{"cniVersion":"1.0.0","name":"cbr0","type":"weft"{extra}}}"#);
        NetConf::parse_with(conf.as_bytes(), &roots())
    }

    fn code(r: Result<NetConf, CniError>) -> String {
        match r {
            Ok(_) => "accepted".into(),
            Err(e) => {
                let v: Value = serde_json::from_str(&e.to_json("1.0.0")).unwrap();
                format!("{} {}", v["code"], v["msg"])
            }
        }
    }

    #[test]
    fn delegate_sets_only_the_bridges_behaviour() {
        assert!(parse(r#","delegate":{"hairpinMode":true,"isDefaultGateway":true}"#).is_ok());
        for bad in [
            r#","delegate":{"type":"/tmp/x"}"#,
            r#","delegate":{"type":"../x"}"#,
            r#","delegate":{"bridge":"eth0"}"#,
            r#","delegate":{"ipam":{"type":"host-local","dataDir":"/etc"}}"#,
            r#","delegate":{"name":"other"}"#,
        ] {
            let c = code(parse(bad));
            assert!(c.starts_with("7 "), "{bad}: {c}");
        }
    }

    #[test]
    fn paths_lie_under_their_roots() {
        let ok = parse(
            r#","stateDir":"/run/weft/x","subnetFile":"/run/flannel/subnet.env","dataDir":"/var/lib/cni/networks""#,
        )
        .unwrap();
        assert_eq!(ok.state_dir, Path::new("/run/weft/x"));
        for bad in [
            r#","stateDir":"/tmp/weft""#,
            r#","stateDir":"run/weft""#,
            r#","stateDir":"/run/weft/../../etc""#,
            r#","subnetFile":"/etc/shadow""#,
            r#","dataDir":"/var/lib/cni/../../../etc""#,
            r#","dataDir":"/""#,
        ] {
            let c = code(parse(bad));
            assert!(c.starts_with("7 "), "{bad}: {c}");
        }
    }

    #[test]
    fn the_pod_device_is_veth_or_standalone_netkit() {
        assert!(!parse("").unwrap().netkit);
        assert!(!parse(r#","podDevice":"veth""#).unwrap().netkit);
        assert!(parse(r#","podDevice":"netkit""#).unwrap().netkit);
        for bad in [r#","podDevice":"macvlan""#, r#","podDevice":1"#] {
            let c = code(parse(bad));
            assert!(c.starts_with("7 "), "{bad}: {c}");
        }
    }

    #[test]
    fn the_bridge_is_an_interface_name() {
        for bad in [
            r#","bridge":"../eth0""#,
            r#","bridge":"a/b""#,
            r#","bridge":"""#,
        ] {
            let c = code(parse(bad));
            assert!(c.starts_with("7 "), "{bad}: {c}");
        }
    }

    #[test]
    fn plugin_names_are_names() {
        assert!(check_plugin_name("bridge").is_ok());
        for bad in ["/tmp/x", "../x", "a/b", "..", ".", "", "a\\b"] {
            assert!(check_plugin_name(bad).is_err(), "{bad}");
        }
    }
}
