//! Who this node is: its node id, its uplink and its public IP.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

use crate::dataplane::{Link, Netlink};

/// The node id: given, or /etc/machine-id.
pub(crate) fn node_id(given: Option<&str>, machine_id: &Path) -> Result<String> {
    if let Some(id) = given {
        let id = id.trim();
        if id.is_empty() {
            bail!("--node-id is empty");
        }
        return Ok(id.to_string());
    }
    let id = std::fs::read_to_string(machine_id).with_context(|| {
        format!(
            "no --node-id given and {} cannot be read; pass --node-id",
            machine_id.display()
        )
    })?;
    let id = id.trim();
    if id.is_empty() {
        bail!("{} is empty; pass --node-id", machine_id.display());
    }
    Ok(id.to_string())
}

/// How the uplink is chosen: flannel's flags, in flannel's precedence.
#[derive(Clone, Debug, Default)]
pub(crate) struct UplinkChoice {
    /// `--iface`: names or IPv4 addresses, the first that exists wins.
    pub(crate) iface: Vec<String>,
    /// `--iface-regex`: matched against addresses, then names.
    pub(crate) iface_regex: Vec<String>,
    /// `--iface-can-reach`: the interface the route to it goes out of.
    pub(crate) can_reach: Option<Ipv4Addr>,
    /// `--public-ip`.
    pub(crate) public_ip: Option<Ipv4Addr>,
}

/// The uplink and the public IP, chosen as flannel chooses them: the first
/// `--iface` that exists; else the first `--iface-regex` that matches an
/// interface's address, then an interface's name; else the interface
/// `--iface-can-reach` is routed through; else the one carrying
/// `--public-ip`; else the device of the default route. The public IP is
/// `--public-ip` if given, else the address matched, else the interface's
/// first IPv4 address; None when it has none (an IPv6-only node: the
/// caller decides whether the network needs one).
pub(crate) async fn uplink(
    nl: &Netlink,
    choice: &UplinkChoice,
) -> Result<(Link, Option<Ipv4Addr>)> {
    let mut ifaces: Vec<(Link, Vec<(Ipv4Addr, u8)>)> = Vec::new();
    for l in nl.links().await? {
        let addrs = nl.addresses(l.index).await?;
        ifaces.push((l, addrs));
    }
    ifaces.sort_by_key(|(l, _)| l.index);
    let (link, matched) = if !choice.iface.is_empty() {
        choose_iface(&ifaces, &choice.iface)
            .with_context(|| format!("no interface matches --iface {}", choice.iface.join(",")))?
    } else if !choice.iface_regex.is_empty() {
        choose_regex(&ifaces, &choice.iface_regex)?
    } else if let Some(dst) = choice.can_reach {
        let src = source_toward(dst)?;
        let (l, _) = ifaces
            .iter()
            .find(|(_, a)| a.iter().any(|(ip, _)| *ip == src))
            .with_context(|| {
                format!("--iface-can-reach {dst}: no interface carries {src}, the source address toward it")
            })?;
        (l.clone(), Some(src))
    } else if let Some(ip) = choice.public_ip {
        match ifaces.iter().find(|(_, a)| a.iter().any(|(a, _)| *a == ip)) {
            Some((l, _)) => (l.clone(), None),
            None => bail!(
                "no interface carries --public-ip {ip}; pass --iface too ({})",
                candidates(&ifaces)
            ),
        }
    } else {
        let oif = match nl.default_route_oif().await? {
            Some(i) => Some(i),
            None => nl.default_route6_oif().await?,
        };
        let Some(oif) = oif else {
            bail!(
                "there is no default route to pick the uplink from; pass --iface, --iface-regex or --iface-can-reach ({})",
                candidates(&ifaces)
            );
        };
        let (l, _) = ifaces
            .iter()
            .find(|(l, _)| l.index == oif)
            .context("the default route's device vanished")?;
        (l.clone(), None)
    };
    let ip = choice.public_ip.or(matched).or_else(|| {
        ifaces
            .iter()
            .find(|(l, _)| l.index == link.index)
            .and_then(|(_, a)| a.first())
            .map(|(ip, _)| *ip)
    });
    Ok((link, ip))
}

/// The IPv6 VTEP address: `--public-ipv6`, else the uplink's first global
/// IPv6 address.
pub(crate) async fn public_ipv6(
    nl: &Netlink,
    uplink: &Link,
    given: Option<Ipv6Addr>,
) -> Result<Ipv6Addr> {
    if let Some(ip) = given {
        return Ok(ip);
    }
    match nl.addresses6(uplink.index).await?.first() {
        Some((ip, _)) => Ok(*ip),
        None => bail!(
            "the network has IPv6 but {} has no global IPv6 address to use as the IPv6 VTEP; pass --public-ipv6",
            uplink.name
        ),
    }
}

type Iface = (Link, Vec<(Ipv4Addr, u8)>);

/// The first of `wanted` (names or addresses) that exists, and the address
/// if it was given as one.
fn choose_iface(ifaces: &[Iface], wanted: &[String]) -> Result<(Link, Option<Ipv4Addr>)> {
    for w in wanted {
        let w = w.trim();
        if let Ok(ip) = w.parse::<Ipv4Addr>() {
            if let Some((l, _)) = ifaces.iter().find(|(_, a)| a.iter().any(|(a, _)| *a == ip)) {
                return Ok((l.clone(), Some(ip)));
            }
        } else if let Some((l, _)) = ifaces.iter().find(|(l, _)| l.name == w) {
            return Ok((l.clone(), None));
        }
    }
    bail!("{}", candidates(ifaces))
}

/// The first regex, in order, that matches an interface's address (then,
/// failing that, its name).
fn choose_regex(ifaces: &[Iface], patterns: &[String]) -> Result<(Link, Option<Ipv4Addr>)> {
    for p in patterns {
        let re = regex::Regex::new(p)
            .with_context(|| format!("--iface-regex {p:?} is not a valid regular expression"))?;
        for (l, addrs) in ifaces {
            if let Some((ip, _)) = addrs.iter().find(|(ip, _)| re.is_match(&ip.to_string())) {
                return Ok((l.clone(), Some(*ip)));
            }
        }
        if let Some((l, _)) = ifaces.iter().find(|(l, _)| re.is_match(&l.name)) {
            return Ok((l.clone(), None));
        }
    }
    bail!(
        "no interface address or name matches --iface-regex {} ({})",
        patterns.join(" "),
        candidates(ifaces)
    )
}

/// What there is to choose from, for error messages.
fn candidates(ifaces: &[Iface]) -> String {
    let list: Vec<String> = ifaces
        .iter()
        .map(|(l, a)| {
            let addrs: Vec<String> = a.iter().map(|(ip, len)| format!("{ip}/{len}")).collect();
            if addrs.is_empty() {
                l.name.clone()
            } else {
                format!("{} {}", l.name, addrs.join(" "))
            }
        })
        .collect();
    format!("interfaces here: {}", list.join(", "))
}

/// The source address the kernel picks toward `dst` (a route lookup: a
/// UDP socket is connected, which sends nothing).
fn source_toward(dst: Ipv4Addr) -> Result<Ipv4Addr> {
    let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .context("opening a socket for a route lookup")?;
    sock.connect((dst, 9))
        .with_context(|| format!("--iface-can-reach {dst}: no route to it"))?;
    match sock.local_addr()?.ip() {
        std::net::IpAddr::V4(ip) => Ok(ip),
        std::net::IpAddr::V6(ip) => bail!("--iface-can-reach {dst}: an IPv6 source {ip}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            mtu: 1500,
            mac: [0; 6],
            up: true,
            arp: true,
            kind: None,
            xdp: None,
            peer_netns: None,
            netkit_primary: false,
        }
    }

    fn ifaces() -> Vec<Iface> {
        vec![
            (link(1, "lo"), vec![("127.0.0.1".parse().unwrap(), 8)]),
            (link(2, "eth0"), vec![("192.168.1.5".parse().unwrap(), 24)]),
            (link(3, "eth1"), vec![("10.0.0.7".parse().unwrap(), 8)]),
        ]
    }

    #[test]
    fn iface_takes_the_first_that_exists_by_name_or_address() {
        let i = ifaces();
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (l, ip) = choose_iface(&i, &w(&["eth9", "10.0.0.7", "eth0"])).unwrap();
        assert_eq!(
            (l.name.as_str(), ip),
            ("eth1", Some("10.0.0.7".parse().unwrap()))
        );
        let (l, ip) = choose_iface(&i, &w(&["eth0", "eth1"])).unwrap();
        assert_eq!((l.name.as_str(), ip), ("eth0", None));
        let e = choose_iface(&i, &w(&["eth9", "1.2.3.4"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("eth0 192.168.1.5/24") && e.contains("eth1 10.0.0.7/8"),
            "{e}"
        );
    }

    #[test]
    fn iface_regex_matches_addresses_before_names() {
        let i = ifaces();
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Matches eth1's name and eth0's address: addresses come first.
        let (l, ip) = choose_regex(&i, &w(&["^eth1$|^192\\.168\\."])).unwrap();
        assert_eq!(
            (l.name.as_str(), ip),
            ("eth0", Some("192.168.1.5".parse().unwrap()))
        );
        let (l, ip) = choose_regex(&i, &w(&["^nomatch$", "^eth1$"])).unwrap();
        assert_eq!((l.name.as_str(), ip), ("eth1", None));
        let e = choose_regex(&i, &w(&["^wlan"])).unwrap_err().to_string();
        assert!(e.contains("^wlan") && e.contains("interfaces here"), "{e}");
        let e = choose_regex(&i, &w(&["("])).unwrap_err().to_string();
        assert!(e.contains("not a valid regular expression"), "{e}");
    }
}
