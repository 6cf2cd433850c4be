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

use super::subnet::Ipv4Net;

/// Default location, flannel's.
pub const DEFAULT_PATH: &str = "/run/flannel/subnet.env";

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
            self.subnet.first_host(),
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

/// The subnet named by FLANNEL_SUBNET in an existing file: None when there
/// is no file; an error when the file cannot be read or makes no sense.
pub fn read_subnet(path: &Path) -> Result<Option<Ipv4Net>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    for line in text.lines() {
        if let Some(v) = line.trim().strip_prefix("FLANNEL_SUBNET=") {
            let (ip, len) = v.split_once('/').with_context(|| {
                format!("{}: FLANNEL_SUBNET={v} is not ADDR/LEN", path.display())
            })?;
            let ip: Ipv4Addr = ip
                .parse()
                .with_context(|| format!("{}: FLANNEL_SUBNET={v}: bad address", path.display()))?;
            let len: u8 = len.parse().ok().filter(|l| *l <= 32).with_context(|| {
                format!("{}: FLANNEL_SUBNET={v}: bad prefix length", path.display())
            })?;
            return Ok(Some(Ipv4Net::containing(ip, len)));
        }
    }
    anyhow::bail!("{} has no FLANNEL_SUBNET line", path.display())
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
