//! The addresses local pods hold, as the CNI IPAM plugin recorded them.
//!
//! host-local (what flannel's CNI plugin and Weft's delegate to) keeps one
//! file per allocated address in `<dir>/<network name>/<ip>`, and removes
//! it on CNI DEL.

use std::{net::Ipv4Addr, path::Path};

use ipnet::Ipv4Net;

/// Allocated addresses under `ipam_dir` that lie in `subnet`.
pub(crate) fn in_subnet(ipam_dir: &Path, subnet: &Ipv4Net) -> Vec<Ipv4Addr> {
    let Ok(networks) = std::fs::read_dir(ipam_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for net in networks.filter_map(|e| e.ok()) {
        let Ok(files) = std::fs::read_dir(net.path()) else {
            continue;
        };
        for f in files.filter_map(|e| e.ok()) {
            if let Ok(ip) = f.file_name().to_string_lossy().parse::<Ipv4Addr>()
                && subnet.contains(&ip)
            {
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
            "last_reserved_ip.0",
            "lock",
        ] {
            std::fs::write(net.join(f), "x").unwrap();
        }
        let s: Ipv4Net = "10.5.3.0/24".parse().unwrap();
        assert_eq!(
            in_subnet(&dir, &s),
            vec![Ipv4Addr::new(10, 5, 3, 10), Ipv4Addr::new(10, 5, 3, 11)]
        );
        assert!(in_subnet(&dir.join("absent"), &s).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
