//! `subnet.env`, as flannel writes it, for the flannel CNI plugin:
//!
//! ```text
//! FLANNEL_NETWORK=10.244.0.0/16
//! FLANNEL_SUBNET=10.244.34.1/24
//! FLANNEL_MTU=1450
//! FLANNEL_IPMASQ=false
//! ```
//!
//! with IPv6, `FLANNEL_IPV6_NETWORK` and `FLANNEL_IPV6_SUBNET` after the
//! IPv4 lines (and no IPv4 lines on an IPv6-only network), as flannel
//! writes them.
//!
//! The subnets read back from it are only ever a preference (see
//! `acquire.rs`).

use std::{
    io::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use ipnet::{Ipv4Net, Ipv6Net};

use super::key::Subnets;

/// Default location, flannel's.
pub const DEFAULT_PATH: &str = "/run/flannel/subnet.env";

/// The IPv4 or IPv6 half of a subnet.env: the cluster network and this
/// node's subnet in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvFamily<N> {
    pub network: N,
    pub subnet: N,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetEnv {
    pub ipv4: Option<EnvFamily<Ipv4Net>>,
    pub ipv6: Option<EnvFamily<Ipv6Net>>,
    pub mtu: u32,
    pub ipmasq: bool,
}

impl SubnetEnv {
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(f) = &self.ipv4 {
            out += &format!(
                "FLANNEL_NETWORK={}\nFLANNEL_SUBNET={}/{}\n",
                f.network,
                first_host(&f.subnet),
                f.subnet.prefix_len()
            );
        }
        if let Some(f) = &self.ipv6 {
            out += &format!(
                "FLANNEL_IPV6_NETWORK={}\nFLANNEL_IPV6_SUBNET={}/{}\n",
                f.network,
                first_host6(&f.subnet),
                f.subnet.prefix_len()
            );
        }
        out + &format!("FLANNEL_MTU={}\nFLANNEL_IPMASQ={}\n", self.mtu, self.ipmasq)
    }

    /// The node's subnets.
    pub fn subnets(&self) -> Subnets {
        Subnets {
            v4: self.ipv4.map(|f| f.subnet),
            v6: self.ipv6.map(|f| f.subnet),
        }
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
        let written = (|| -> Result<()> {
            let mut f = std::fs::File::create(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            f.write_all(self.render().as_bytes())
                .with_context(|| format!("writing {}", tmp.display()))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            f.sync_all()
                .with_context(|| format!("syncing {}", tmp.display()))?;
            drop(f);
            std::fs::rename(&tmp, path)
                .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
        })();
        if written.is_err() {
            // Nothing half-written left behind (a full disk).
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// The first usable address of a subnet (FLANNEL_SUBNET's form, the gateway
/// the CNI plugin gives the bridge).
pub fn first_host(subnet: &Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(1))
}

/// [`first_host`] for an IPv6 subnet (FLANNEL_IPV6_SUBNET's form).
pub fn first_host6(subnet: &Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(subnet.network()).wrapping_add(1))
}

/// Why a subnet.env cannot be read back.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubnetEnvError {
    #[error("no FLANNEL_SUBNET or FLANNEL_IPV6_SUBNET line")]
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
        let subnets = parse_subnet_env(text)?;
        let ipv4 = match subnets.v4 {
            None => None,
            Some(subnet) => {
                let network = value("FLANNEL_NETWORK")
                    .ok_or(SubnetEnvError::MissingKey("FLANNEL_NETWORK"))?;
                let network: Ipv4Net = network
                    .parse()
                    .map_err(|_| SubnetEnvError::Malformed(format!("FLANNEL_NETWORK={network}")))?;
                Some(EnvFamily { network, subnet })
            }
        };
        let ipv6 = match subnets.v6 {
            None => None,
            Some(subnet) => {
                let network = value("FLANNEL_IPV6_NETWORK")
                    .ok_or(SubnetEnvError::MissingKey("FLANNEL_IPV6_NETWORK"))?;
                let network: Ipv6Net = network.parse().map_err(|_| {
                    SubnetEnvError::Malformed(format!("FLANNEL_IPV6_NETWORK={network}"))
                })?;
                Some(EnvFamily { network, subnet })
            }
        };
        let mtu = value("FLANNEL_MTU").ok_or(SubnetEnvError::MissingKey("FLANNEL_MTU"))?;
        let mtu: u32 = mtu
            .parse()
            .map_err(|_| SubnetEnvError::Malformed(format!("FLANNEL_MTU={mtu}")))?;
        let ipmasq = value("FLANNEL_IPMASQ") == Some("true");
        Ok(Self {
            ipv4,
            ipv6,
            mtu,
            ipmasq,
        })
    }
}

/// The subnets named by FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET in the text
/// of a subnet.env (at least one).
pub fn parse_subnet_env(text: &str) -> Result<Subnets, SubnetEnvError> {
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
    };
    let v4 = match line("FLANNEL_SUBNET") {
        None => None,
        Some(v) => {
            let bad = || SubnetEnvError::Malformed(format!("FLANNEL_SUBNET={v}"));
            let (ip, len) = v.split_once('/').ok_or_else(bad)?;
            let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
            let len: u8 = len.parse().map_err(|_| bad())?;
            Some(Ipv4Net::new(ip, len).map_err(|_| bad())?.trunc())
        }
    };
    let v6 = match line("FLANNEL_IPV6_SUBNET") {
        None => None,
        Some(v) => {
            let bad = || SubnetEnvError::Malformed(format!("FLANNEL_IPV6_SUBNET={v}"));
            let (ip, len) = v.split_once('/').ok_or_else(bad)?;
            let ip: Ipv6Addr = ip.parse().map_err(|_| bad())?;
            let len: u8 = len.parse().map_err(|_| bad())?;
            Some(Ipv6Net::new(ip, len).map_err(|_| bad())?.trunc())
        }
    };
    if v4.is_none() && v6.is_none() {
        return Err(SubnetEnvError::Missing);
    }
    Ok(Subnets { v4, v6 })
}

/// The subnets named in an existing file: None when there is no file; an
/// error when the file cannot be read or makes no sense.
pub fn read_subnet(path: &Path) -> Result<Option<Subnets>> {
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
            ipv4: Some(EnvFamily {
                network: "10.244.0.0/16".parse().unwrap(),
                subnet: "10.244.34.0/24".parse().unwrap(),
            }),
            ipv6: None,
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
        assert_eq!(read_subnet(&path).unwrap(), Some(env.subnets()));
        assert_eq!(read_subnet(&dir.join("absent")).unwrap(), None);
        std::fs::write(&path, "FLANNEL_SUBNET=banana\n").unwrap();
        assert!(read_subnet(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dual_stack_and_ipv6_only_as_flannel_writes_them() {
        let v6 = EnvFamily {
            network: "fd00:10:244::/56".parse().unwrap(),
            subnet: "fd00:10:244:22::/64".parse().unwrap(),
        };
        let dual = SubnetEnv {
            ipv4: Some(EnvFamily {
                network: "10.244.0.0/16".parse().unwrap(),
                subnet: "10.244.34.0/24".parse().unwrap(),
            }),
            ipv6: Some(v6),
            mtu: 1430,
            ipmasq: true,
        };
        assert_eq!(
            dual.render(),
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.34.1/24\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:22::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=true\n"
        );
        assert_eq!(SubnetEnv::parse(&dual.render()).unwrap(), dual);
        let only = SubnetEnv {
            ipv4: None,
            ipv6: Some(v6),
            mtu: 1430,
            ipmasq: false,
        };
        assert_eq!(
            only.render(),
            "FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:22::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=false\n"
        );
        assert_eq!(SubnetEnv::parse(&only.render()).unwrap(), only);
        assert_eq!(only.subnets().v4, None);
        for bad in [
            "FLANNEL_IPV6_SUBNET=fd00::1\nFLANNEL_MTU=1450\n",
            "FLANNEL_IPV6_SUBNET=10.0.0.1/24\n",
            "FLANNEL_MTU=1450\n",
        ] {
            assert!(parse_subnet_env(bad).is_err(), "{bad}");
        }
        assert_eq!(
            SubnetEnv::parse("FLANNEL_IPV6_SUBNET=fd00::1/64\nFLANNEL_MTU=1450\n"),
            Err(SubnetEnvError::MissingKey("FLANNEL_IPV6_NETWORK"))
        );
    }
}
