//! What Weft asks of netfilter, as nftables rules written over netlink.
//!
//! Weft's own table `ip weft`, replaced whole in one transaction (so there is
//! never a moment without its rules, across a restart or an upgrade), holds:
//!
//! - chain `track` (`--host-routing auto`): `ct state` and a counter, no
//!   verdict. The kernel only tracks connections in a network namespace once
//!   some rule needs it (kube-proxy's do on any Kubernetes node); host
//!   routing asks conntrack which flows the host stack let through.
//! - chain `mss` (per-peer path MTU, IPv4): `ip daddr <network> tcp flags
//!   syn tcp option maxseg size set rt mtu`, at the forward hook's mangle
//!   priority: a peer's route carries its path's MTU, so TCP between pods
//!   starts at the path's size.
//! - chain `postrouting` (`--ip-masq`), flannel's masquerade rules:
//!
//!   ```text
//!   meta mark & 0x4000 == 0x4000                return   # kube-proxy masquerades these
//!   ip saddr <subnet>  ip daddr <network>       return   # pod to pod: never NATed
//!   ip saddr <network> ip daddr <subnet>        return
//!   ip saddr != <network> ip daddr <subnet>     return   # outside to a local pod: keep its source
//!   ip saddr <network> ip daddr != 224.0.0.0/4  masquerade fully-random
//!   ip saddr != <network> ip daddr <network>    masquerade fully-random
//!   # (random, not fully-random, with --ip-masq-fully-random-disable)
//!   ```
//!
//! With IPv6, table `ip6 weft` holds the same chains for IPv6 (flannel's
//! ip6tables rules: the multicast exemption is `ff00::/8`), and the forward
//! rules go into ip6tables' `FORWARD` chain too.
//!
//! A base chain's `return` ends that chain only, so other tools' tables
//! (kube-proxy's, Docker's) keep working exactly as beside flannel's chain.
//!
//! `--iptables-forward-rules` (flannel's default): a FORWARD policy of DROP
//! (as Docker sets it) lives in iptables' own `filter` table, and an accept
//! in Weft's table cannot overrule a drop there. So two rules (`ip saddr
//! <network> accept`, `ip daddr <network> accept`, comment
//! [`FORWARD_COMMENT`]) are appended to iptables' `FORWARD` chain when it
//! exists (iptables-nft), as flannel appends its own: rules already there
//! (a NetworkPolicy's drop) still decide first, only the policy is
//! overruled. They are found again by their comment, replaced in one
//! transaction, and removed by `weft teardown`. Nothing else in that chain
//! is touched.

use anyhow::Result;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::sys::nftables::{
    self, ChainSpec, Expr, Family, MASQ_RANDOM_FULLY, NF_INET_FORWARD, NF_INET_POST_ROUTING, Rule,
    TableSpec,
};

/// Weft's table.
pub(crate) const TABLE: &str = "weft";
/// iptables-nft's table and chain the forward rules go into.
const IPTABLES_TABLE: &str = "filter";
const IPTABLES_FORWARD: &str = "FORWARD";
/// The comment that marks Weft's rules in iptables' `FORWARD` chain.
pub(crate) const FORWARD_COMMENT: &str = "weft: forward pod traffic";
/// `NF_NAT_RANGE_PROTO_RANDOM` (iptables' `--random`).
const MASQ_RANDOM: u32 = 0x4;
/// The mark kube-proxy sets on packets it masquerades itself.
const KUBE_PROXY_MASQ_MARK: u32 = 0x4000;

/// What netfilter should hold for this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NetfilterSpec {
    /// The cluster network (flannel's `Network`), with IPv4.
    pub(crate) network: Option<Ipv4Net>,
    /// This node's pod subnet, with IPv4.
    pub(crate) subnet: Option<Ipv4Net>,
    /// The cluster's IPv6 network and this node's IPv6 subnet, with IPv6.
    pub(crate) network6: Option<Ipv6Net>,
    pub(crate) subnet6: Option<Ipv6Net>,
    /// Make conntrack track connections (for host routing's gate).
    pub(crate) track: bool,
    /// Masquerade pods' traffic leaving the cluster network; `Some(true)`:
    /// with fully random source ports.
    pub(crate) masquerade: Option<bool>,
    /// Accept forwarded cluster traffic in iptables' FORWARD chain.
    pub(crate) forward_rules: bool,
    /// Clamp forwarded TCP SYNs' MSS to the route of their destination
    /// (per-peer path MTU: a peer's route carries its path's MTU).
    pub(crate) clamp_mss: bool,
}

/// One family's cluster network and node subnet.
#[derive(Clone, Copy)]
struct Nets {
    family: Family,
    network: IpNet,
    subnet: IpNet,
    multicast: IpNet,
}

impl NetfilterSpec {
    /// Whether Weft's tables have anything to hold.
    fn wants_table(&self, family: Family) -> bool {
        self.track || self.masquerade.is_some() || self.clamp_mss && family == Family::Ip
    }

    /// The families this node has, with their networks.
    fn families(&self) -> Vec<Nets> {
        let mut out = Vec::new();
        if let (Some(network), Some(subnet)) = (self.network, self.subnet) {
            out.push(Nets {
                family: Family::Ip,
                network: network.into(),
                subnet: subnet.into(),
                multicast: "224.0.0.0/4".parse().expect("a valid network"),
            });
        }
        if let (Some(network), Some(subnet)) = (self.network6, self.subnet6) {
            out.push(Nets {
                family: Family::Ip6,
                network: network.into(),
                subnet: subnet.into(),
                multicast: "ff00::/8".parse().expect("a valid network"),
            });
        }
        out
    }

    /// Weft's tables, one per family.
    #[cfg(test)]
    fn tables(&self) -> Vec<TableSpec> {
        self.families().into_iter().map(|n| self.table(n)).collect()
    }

    fn table(&self, n: Nets) -> TableSpec {
        let mut chains = Vec::new();
        if self.track {
            chains.push(ChainSpec {
                name: "track",
                kind: "filter",
                hook: NF_INET_FORWARD,
                priority: 0,
                rules: vec![Rule {
                    exprs: vec![Expr::CtState, Expr::Counter],
                    comment: "weft: make conntrack track forwarded flows",
                }],
            });
        }
        if self.clamp_mss && n.family == Family::Ip {
            chains.push(ChainSpec {
                name: "mss",
                kind: "filter",
                hook: NF_INET_FORWARD,
                // mangle
                priority: -150,
                rules: vec![Rule {
                    exprs: vec![
                        Expr::daddr(n.network, false),
                        Expr::TcpSyn,
                        Expr::ClampMssToRoute,
                    ],
                    comment: "weft: clamp MSS to the peer's path MTU",
                }],
            });
        }
        if let Some(fully_random) = self.masquerade {
            let (net, sub) = (n.network, n.subnet);
            let flags = if fully_random {
                MASQ_RANDOM_FULLY
            } else {
                MASQ_RANDOM
            };
            let comment = "weft: masquerade";
            let rule = |exprs: Vec<Expr>| Rule { exprs, comment };
            chains.push(ChainSpec {
                name: "postrouting",
                kind: "nat",
                hook: NF_INET_POST_ROUTING,
                // srcnat
                priority: 100,
                rules: vec![
                    rule(vec![Expr::MarkAll(KUBE_PROXY_MASQ_MARK), Expr::Return]),
                    rule(vec![
                        Expr::saddr(sub, false),
                        Expr::daddr(net, false),
                        Expr::Return,
                    ]),
                    rule(vec![
                        Expr::saddr(net, false),
                        Expr::daddr(sub, false),
                        Expr::Return,
                    ]),
                    rule(vec![
                        Expr::saddr(net, true),
                        Expr::daddr(sub, false),
                        Expr::Return,
                    ]),
                    rule(vec![
                        Expr::saddr(net, false),
                        Expr::daddr(n.multicast, true),
                        Expr::Counter,
                        Expr::Masquerade { flags },
                    ]),
                    rule(vec![
                        Expr::saddr(net, true),
                        Expr::daddr(net, false),
                        Expr::Counter,
                        Expr::Masquerade { flags },
                    ]),
                ],
            });
        }
        TableSpec {
            family: n.family,
            name: TABLE,
            chains,
        }
    }

    fn forward_rules_list(network: IpNet) -> Vec<Rule> {
        [true, false]
            .into_iter()
            .map(|src| Rule {
                exprs: vec![
                    if src {
                        Expr::saddr(network, false)
                    } else {
                        Expr::daddr(network, false)
                    },
                    Expr::Counter,
                    Expr::Accept,
                ],
                comment: FORWARD_COMMENT,
            })
            .collect()
    }
}

/// Writes everything `spec` asks for (Weft's tables replaced whole, the
/// forward rules replaced), or removes what it no longer asks for.
pub(crate) fn apply(spec: &NetfilterSpec) -> Result<()> {
    let families = spec.families();
    for family in [Family::Ip, Family::Ip6] {
        let nets = families.iter().find(|n| n.family == family);
        match nets {
            Some(n) if spec.wants_table(family) => nftables::apply_table(&spec.table(*n))?,
            _ => {
                nftables::remove_table(family, TABLE)?;
            }
        }
        // iptables' chain belongs to another tool, which may be writing it
        // right now: a failure here is reported and left to the next check
        // (every 2 s), never fatal.
        let r = match nets {
            Some(n) if spec.forward_rules => {
                nftables::has_chain(family, IPTABLES_TABLE, IPTABLES_FORWARD).and_then(|has| {
                    if has {
                        nftables::replace_rules_in(
                            family,
                            IPTABLES_TABLE,
                            IPTABLES_FORWARD,
                            FORWARD_COMMENT,
                            &NetfilterSpec::forward_rules_list(n.network),
                        )?;
                    }
                    Ok(())
                })
            }
            _ => remove_forward_rules(family).map(drop),
        };
        if let Err(e) = r {
            tracing::warn!(family = family.name(), error = %format!("{e:#}"), "cannot write Weft's rules in iptables' FORWARD chain yet; the next check tries again");
        }
    }
    Ok(())
}

/// Puts back what something else removed; returns what was repaired:
/// `nftables` (Weft's tables), `forward_rules` (iptables' FORWARD chain
/// appeared, or Weft's rules in it went missing).
pub(crate) fn heal(spec: &NetfilterSpec) -> Result<Vec<&'static str>> {
    let mut repaired = Vec::new();
    for n in spec.families() {
        let f = n.family;
        if spec.wants_table(f) {
            let table = spec.table(n);
            let complete = nftables::has_table(f, TABLE)?
                && table
                    .chains
                    .iter()
                    .map(|c| nftables::has_chain(f, TABLE, c.name))
                    .collect::<Result<Vec<bool>>>()?
                    .into_iter()
                    .all(|b| b)
                && table.chains.iter().all(|c| {
                    nftables::handles_with_comment(f, TABLE, c.name, c.rules[0].comment)
                        .is_ok_and(|h| h.len() == c.rules.len())
                });
            if !complete {
                nftables::apply_table(&table)?;
                if !repaired.contains(&"nftables") {
                    repaired.push("nftables");
                }
            }
        }
        if spec.forward_rules && nftables::has_chain(f, IPTABLES_TABLE, IPTABLES_FORWARD)? {
            let want = NetfilterSpec::forward_rules_list(n.network);
            let have = nftables::handles_with_comment(
                f,
                IPTABLES_TABLE,
                IPTABLES_FORWARD,
                FORWARD_COMMENT,
            )?;
            if have.len() != want.len() {
                nftables::replace_rules_in(
                    f,
                    IPTABLES_TABLE,
                    IPTABLES_FORWARD,
                    FORWARD_COMMENT,
                    &want,
                )?;
                if !repaired.contains(&"forward_rules") {
                    repaired.push("forward_rules");
                }
            }
        }
    }
    Ok(repaired)
}

/// Removes Weft's rules from iptables' (or ip6tables') FORWARD chain;
/// returns how many.
fn remove_forward_rules(family: Family) -> Result<usize> {
    if !nftables::has_chain(family, IPTABLES_TABLE, IPTABLES_FORWARD)? {
        return Ok(0);
    }
    nftables::replace_rules_in(
        family,
        IPTABLES_TABLE,
        IPTABLES_FORWARD,
        FORWARD_COMMENT,
        &[],
    )
}

/// Removes everything Weft put into netfilter; returns what it removed.
pub(crate) fn remove() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for family in [Family::Ip, Family::Ip6] {
        if nftables::remove_table(family, TABLE)? {
            removed.push(format!("nftables table {} {TABLE}", family.name()));
        }
        let n = remove_forward_rules(family)?;
        if n > 0 {
            removed.push(format!(
                "{n} rules from {}'s {IPTABLES_FORWARD} chain (\"{FORWARD_COMMENT}\")",
                if family == Family::Ip {
                    "iptables"
                } else {
                    "ip6tables"
                }
            ));
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> NetfilterSpec {
        NetfilterSpec {
            network: Some("10.244.0.0/16".parse().unwrap()),
            subnet: Some("10.244.3.0/24".parse().unwrap()),
            network6: None,
            subnet6: None,
            track: false,
            masquerade: Some(true),
            forward_rules: true,
            clamp_mss: false,
        }
    }

    #[test]
    fn masquerade_rules_follow_flannel() {
        let tables = spec().tables();
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        assert_eq!(t.family, Family::Ip);
        assert_eq!(t.chains.len(), 1);
        let c = &t.chains[0];
        assert_eq!(
            (c.kind, c.hook, c.priority),
            ("nat", NF_INET_POST_ROUTING, 100)
        );
        assert_eq!(c.rules.len(), 6);
        assert_eq!(c.rules[0].exprs, vec![Expr::MarkAll(0x4000), Expr::Return]);
        // Traffic leaving the cluster network is masqueraded, fully random.
        assert_eq!(
            c.rules[4].exprs.last(),
            Some(&Expr::Masquerade {
                flags: MASQ_RANDOM_FULLY
            })
        );
        let mut s = spec();
        s.masquerade = Some(false);
        assert_eq!(
            s.tables()[0].chains[0].rules[5].exprs.last(),
            Some(&Expr::Masquerade { flags: MASQ_RANDOM })
        );
    }

    #[test]
    fn ipv6_gets_its_own_table_with_ipv6_addresses() {
        let mut s = spec();
        s.network6 = Some("fd00:10:244::/56".parse().unwrap());
        s.subnet6 = Some("fd00:10:244:3::/64".parse().unwrap());
        let tables = s.tables();
        assert_eq!(tables.len(), 2);
        let t6 = &tables[1];
        assert_eq!(t6.family, Family::Ip6);
        let rules = &t6.chains[0].rules;
        assert_eq!(
            rules[1].exprs[0],
            Expr::saddr("fd00:10:244:3::/64".parse::<Ipv6Net>().unwrap(), false)
        );
        assert!(
            matches!(rules[1].exprs[0], Expr::Addr { offset: 8, .. }),
            "ip6 saddr"
        );
        assert!(
            matches!(rules[4].exprs[1], Expr::Addr { offset: 24, negate: true, net } if net.to_string() == "ff00::/8")
        );
        // IPv6-only: no IPv4 table.
        s.network = None;
        s.subnet = None;
        assert_eq!(s.tables().len(), 1);
        assert_eq!(s.tables()[0].family, Family::Ip6);
    }

    #[test]
    fn mss_is_clamped_on_ipv4_syns_to_the_cluster_network() {
        let mut s = spec();
        s.masquerade = None;
        s.clamp_mss = true;
        s.network6 = Some("fd00:10:244::/56".parse().unwrap());
        s.subnet6 = Some("fd00:10:244:3::/64".parse().unwrap());
        let tables = s.tables();
        let c = &tables[0].chains;
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].name, c[0].hook, c[0].priority),
            ("mss", NF_INET_FORWARD, -150)
        );
        assert_eq!(
            c[0].rules[0].exprs,
            [
                Expr::daddr("10.244.0.0/16".parse::<IpNet>().unwrap(), false),
                Expr::TcpSyn,
                Expr::ClampMssToRoute
            ]
        );
        assert!(tables[1].chains.is_empty(), "IPv6 paths are not measured");
        assert!(s.wants_table(Family::Ip) && !s.wants_table(Family::Ip6));
    }

    #[test]
    fn no_table_without_masquerade_or_tracking() {
        let mut s = spec();
        s.masquerade = None;
        assert!(!s.wants_table(Family::Ip));
        s.track = true;
        assert!(s.wants_table(Family::Ip));
        assert_eq!(s.tables()[0].chains.len(), 1);
        assert_eq!(s.tables()[0].chains[0].name, "track");
    }
}
