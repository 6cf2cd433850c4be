//! `subnet.env`, as flannel writes it, for the flannel CNI plugin:
//!
//! ```text
//! FLANNEL_NETWORK=10.244.0.0/16
//! FLANNEL_SUBNET=10.244.34.1/24
//! FLANNEL_MTU=1450
//! FLANNEL_IPMASQ=false
//! ```
//!
//! The subnet read back from it is only ever a preference (see `acquire.rs`).

use std::{
    io::Write as _,
    net::Ipv4Addr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use ipnet::Ipv4Net;

/// Default location, flannel's.
#[cfg(feature = "agent")]
pub(crate) const DEFAULT_PATH: &str = "/run/flannel/subnet.env";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetEnv {
    pub network: Ipv4Net,
    pub subnet: Ipv4Net,
    pub mtu: u32,
    pub ipmasq: bool,
}

impl SubnetEnv {
    pub fn render(&self) -> String {
        format!(
            "FLANNEL_NETWORK={}\nFLANNEL_SUBNET={}/{}\nFLANNEL_MTU={}\nFLANNEL_IPMASQ={}\n",
            self.network,
            first_host(&self.subnet),
            self.subnet.prefix_len(),
            self.mtu,
            self.ipmasq
        )
    }

    /// Writes the file atomically (temp file in the same directory, fsync,
    /// rename), mode 0644.
    pub fn write(&self, path: &Path) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp: PathBuf = dir.join(format!(
            ".{}.tmp-{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(self.render().as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        Ok(())
    }
}

/// The first usable address of a subnet (FLANNEL_SUBNET's form, the gateway
/// the CNI plugin gives the bridge).
pub fn first_host(subnet: &Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(1))
}

/// Why a subnet.env cannot be read back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubnetEnvError {
    #[error("no FLANNEL_SUBNET line")]
    Missing,
    #[error("no {0} line")]
    MissingKey(&'static str),
    #[error("{0} is malformed")]
    Malformed(String),
}

impl SubnetEnv {
    /// Reads a whole subnet.env (what the CNI plugin needs of it).
    pub fn parse(text: &str) -> Result<Self, SubnetEnvError> {
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
        };
        let subnet = parse_subnet_env(text)?;
        let network =
            value("FLANNEL_NETWORK").ok_or(SubnetEnvError::MissingKey("FLANNEL_NETWORK"))?;
        let network: Ipv4Net = network
            .parse()
            .map_err(|_| SubnetEnvError::Malformed(format!("FLANNEL_NETWORK={network}")))?;
        let mtu = value("FLANNEL_MTU").ok_or(SubnetEnvError::MissingKey("FLANNEL_MTU"))?;
        let mtu: u32 = mtu
            .parse()
            .map_err(|_| SubnetEnvError::Malformed(format!("FLANNEL_MTU={mtu}")))?;
        let ipmasq = value("FLANNEL_IPMASQ") == Some("true");
        Ok(Self {
            network,
            subnet,
            mtu,
            ipmasq,
        })
    }
}

/// The subnet named by FLANNEL_SUBNET in the text of a subnet.env.
pub fn parse_subnet_env(text: &str) -> Result<Ipv4Net, SubnetEnvError> {
    let v = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("FLANNEL_SUBNET="))
        .ok_or(SubnetEnvError::Missing)?;
    let bad = || SubnetEnvError::Malformed(format!("FLANNEL_SUBNET={v}"));
    let (ip, len) = v.split_once('/').ok_or_else(bad)?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    Ok(Ipv4Net::new(ip, len).map_err(|_| bad())?.trunc())
}

/// The subnet named by FLANNEL_SUBNET in an existing file: None when there
/// is no file; an error when the file cannot be read or makes no sense.
#[cfg(feature = "agent")]
pub(crate) fn read_subnet(path: &Path) -> Result<Option<Ipv4Net>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    parse_subnet_env(&text)
        .map(Some)
        .with_context(|| format!("{}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_flannel_and_reads_back() {
        let env = SubnetEnv {
            network: "10.244.0.0/16".parse().unwrap(),
            subnet: "10.244.34.0/24".parse().unwrap(),
            mtu: 1450,
            ipmasq: false,
        };
        assert_eq!(
            env.render(),
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.34.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
        );
        let dir = std::env::temp_dir().join(format!("weft-subnet-env-{}", std::process::id()));
        let path = dir.join("subnet.env");
        env.write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(read_subnet(&path).unwrap(), Some(env.subnet));
        assert_eq!(read_subnet(&dir.join("absent")).unwrap(), None);
        std::fs::write(&path, "FLANNEL_SUBNET=banana\n").unwrap();
        assert!(read_subnet(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
