//! The addresses local pods hold, as the CNI IPAM plugin recorded them.
//!
//! host-local (what flannel's CNI plugin and Weft's delegate to) keeps one
//! file per allocated address in `<dir>/<network name>/<ip>`, and removes
//! it on CNI DEL.

use std::{net::IpAddr, path::Path};

use crate::lease::Subnets;

/// Allocated addresses under `ipam_dir` that lie in one of `subnets`.
pub(crate) fn in_subnet(ipam_dir: &Path, subnets: &Subnets) -> Vec<IpAddr> {
    let Ok(networks) = std::fs::read_dir(ipam_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for net in networks.filter_map(|e| e.ok()) {
        let Ok(files) = std::fs::read_dir(net.path()) else {
            continue;
        };
        for f in files.filter_map(|e| e.ok()) {
            let Ok(ip) = f.file_name().to_string_lossy().parse::<IpAddr>() else {
                continue;
            };
            let inside = match ip {
                IpAddr::V4(a) => subnets.v4.is_some_and(|s| s.contains(&a)),
                IpAddr::V6(a) => subnets.v6.is_some_and(|s| s.contains(&a)),
            };
            if inside {
                out.push(ip);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_host_local_allocations() {
        let dir = std::env::temp_dir().join(format!("weft-ipam-{}", std::process::id()));
        let net = dir.join("cbr0");
        std::fs::create_dir_all(&net).unwrap();
        for f in [
            "10.5.3.10",
            "10.5.3.11",
            "10.5.4.10",
            "fd00:5:0:3::a",
            "fd00:5:0:4::a",
            "last_reserved_ip.0",
            "lock",
        ] {
            std::fs::write(net.join(f), "x").unwrap();
        }
        let s = crate::lease::parse_key("10.5.3.0-24").unwrap();
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(in_subnet(&dir, &s), vec![v4("10.5.3.10"), v4("10.5.3.11")]);
        let dual = crate::lease::parse_key("10.5.3.0-24&fd00:5:0:3::-64").unwrap();
        assert_eq!(in_subnet(&dir, &dual).len(), 3);
        assert!(in_subnet(&dir.join("absent"), &s).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
