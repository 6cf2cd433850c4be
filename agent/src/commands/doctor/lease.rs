//! subnet.env against the lease in etcd: the subnets it names must be
//! leased to this node (its VTEP addresses, each family the node has).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use super::{DoctorArgs, findings::Findings};
use crate::lease::{EtcdStore, LeaseAttrs, Store as _, SubnetEnv};

/// This node's VTEP addresses, as its datapath is configured.
pub(super) struct Vteps {
    pub(super) v4: Option<Ipv4Addr>,
    pub(super) v6: Option<Ipv6Addr>,
}

/// The first family whose lease address is not ours: (theirs, ours).
fn mismatch(lease: &LeaseAttrs, ours: &Vteps) -> Option<(IpAddr, IpAddr)> {
    if let Some(v4) = ours.v4
        && lease.public_ip != v4
    {
        return Some((lease.public_ip.into(), v4.into()));
    }
    match (ours.v6, lease.public_ipv6) {
        (Some(v6), Some(theirs)) if theirs != v6 => Some((theirs.into(), v6.into())),
        (Some(v6), None) => Some((IpAddr::V4(lease.public_ip), v6.into())),
        _ => None,
    }
}

pub(super) async fn check(
    f: &mut Findings,
    a: &DoctorArgs<'_>,
    env: &anyhow::Result<Option<SubnetEnv>>,
    ours: &Vteps,
) {
    let subnets = match env {
        Ok(Some(e)) => e.subnets(),
        Ok(None) => {
            f.fail(
                "subnet",
                format!("no {}", a.node.subnet_file.display()),
                "the agent writes it once it holds a lease and its datapath is up",
            );
            return;
        }
        Err(e) => {
            f.fail(
                "subnet",
                format!("{e:#}"),
                "restart the agent (it rewrites the file)",
            );
            return;
        }
    };
    let key = format!("{}/subnets/{}", a.node.etcd.prefix(), subnets.key());
    let mut o = a.node.etcd.options();
    o.request_timeout = Duration::from_secs(2);
    let got = tokio::time::timeout(Duration::from_secs(4), async {
        let store = EtcdStore::connect(&o).await?;
        anyhow::Ok(store.get(&key).await?)
    })
    .await;
    let ours_text = [ours.v4.map(IpAddr::V4), ours.v6.map(IpAddr::V6)]
        .into_iter()
        .flatten()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match got {
        Err(_) | Ok(Err(_)) => f.warn(
            "subnet",
            format!("{subnets} (subnet.env); etcd did not answer, the lease is not checked"),
            "check --etcd-endpoints and the TLS flags (weft leases shows what etcd holds)",
        ),
        Ok(Ok(None)) => f.fail(
            "subnet",
            format!("subnet.env names {subnets}, but etcd has no lease {key}"),
            "the agent re-acquires a lease when it loses one: check its log; a stale subnet.env is rewritten",
        ),
        Ok(Ok(Some(kv))) => match LeaseAttrs::parse(&kv.value) {
            Ok(l) => match mismatch(&l, ours) {
                None => f.ok(
                    "subnet",
                    format!("{subnets}: subnet.env and the lease in etcd agree ({ours_text})"),
                ),
                Some((theirs, mine)) => f.fail(
                    "subnet",
                    format!("subnet.env names {subnets}, whose lease belongs to {theirs} (this node is {mine})"),
                    "restart the agent: it acquires a subnet of its own and rewrites subnet.env",
                ),
            },
            Err(e) => f.fail(
                "subnet",
                format!("the lease {key} is malformed: {e}"),
                "delete the key; the agent writes a new one",
            ),
        },
    }
}
