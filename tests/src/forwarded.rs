//! The packets of one TCP flow that a node's stack forwarded: those that
//! did not bypass it. The dataplane's own counters also count what the
//! agent itself sends through the stack (its peer and path MTU probes), a
//! few packets a second that are a percent of a short bulk flow's GSO
//! packets; a share of the flow's packets is read from the flow alone.

use crate::netns::Netns;
use anyhow::{Context, Result};

/// Counters in the forward hook of a node's namespace for one TCP port,
/// one per direction; removed on drop.
pub struct Forwarded<'a> {
    ns: &'a Netns,
    table: String,
}

impl<'a> Forwarded<'a> {
    /// Counts the forwarded packets to and from TCP `port` in `ns`.
    pub fn count(ns: &'a Netns, port: u16) -> Result<Self> {
        let table = crate::unique("weftfwd");
        ns.exec("nft", &["add", "table", "inet", &table])?;
        ns.exec(
            "nft",
            &[
                "add",
                "chain",
                "inet",
                &table,
                "counts",
                "{ type filter hook forward priority -400; policy accept; }",
            ],
        )?;
        for dir in ["dport", "sport"] {
            let p = port.to_string();
            ns.exec(
                "nft",
                &[
                    "add", "rule", "inet", &table, "counts", "tcp", dir, &p, "counter",
                ],
            )?;
        }
        Ok(Forwarded { ns, table })
    }

    /// Packets forwarded so far: (to the port, from the port).
    pub fn packets(&self) -> Result<(u64, u64)> {
        let out = self
            .ns
            .exec("nft", &["list", "chain", "inet", &self.table, "counts"])?;
        let counts: Vec<u64> = out
            .lines()
            .filter_map(|l| {
                let rest = l.split("counter packets ").nth(1)?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .collect();
        match counts[..] {
            [to, from] => Ok((to, from)),
            _ => None.with_context(|| format!("two counters in {out}")),
        }
    }
}

impl Drop for Forwarded<'_> {
    fn drop(&mut self) {
        let _ = self
            .ns
            .exec("nft", &["delete", "table", "inet", &self.table]);
    }
}
