//! Many keys into a test's etcd at once: transactions of up to 128 puts
//! (etcd's `--max-txn-ops`) and at most 1 MiB (under its 1.5 MiB request
//! limit), from inside the namespace etcd listens in; and etcd's own count
//! of the requests it served, from its metrics.

use anyhow::{Context as _, Result};

use crate::{netns::Netns, weft_cluster::ETCD_IP};

const TXN_OPS: usize = 128;
const TXN_BYTES: usize = 1 << 20;

/// Puts every `(key, value)` into the etcd at `ETCD_IP` from inside `ns`,
/// raw bytes as they are; returns how many.
pub fn put_all(ns: &Netns, kvs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<usize> {
    let endpoint = format!("http://{ETCD_IP}:2379");
    ns.run(move || -> Result<usize> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut client = etcd_client::Client::connect([endpoint], None).await?;
            let (mut ops, mut bytes, mut n) = (Vec::new(), 0, 0);
            for (k, v) in kvs {
                bytes += k.len() + v.len();
                ops.push(etcd_client::TxnOp::put(k, v, None));
                n += 1;
                if ops.len() == TXN_OPS || bytes >= TXN_BYTES {
                    let txn = etcd_client::Txn::new().and_then(std::mem::take(&mut ops));
                    client.txn(txn).await.context("a transaction of puts")?;
                    bytes = 0;
                }
            }
            if !ops.is_empty() {
                client.txn(etcd_client::Txn::new().and_then(ops)).await?;
            }
            Ok(n)
        })
    })?
}

/// Deletes every key under `prefix` from inside `ns`.
pub fn delete_prefix(ns: &Netns, prefix: &str) -> Result<()> {
    let endpoint = format!("http://{ETCD_IP}:2379");
    let prefix = prefix.to_string();
    ns.run(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut client = etcd_client::Client::connect([endpoint], None).await?;
            client
                .delete(
                    prefix,
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                )
                .await?;
            Ok(())
        })
    })?
}

/// How many requests of `method` (`Range`, `Txn`, `Watch`, ...) etcd has
/// served, from its metrics (`grpc_server_handled_total`, or for streams
/// `grpc_server_started_total`), summed over result codes.
pub fn served(ns: &Netns, method: &str) -> Result<f64> {
    let ip = ETCD_IP.parse()?;
    let (_, body) = crate::weft_cluster::http_get(ns, ip, 2379, "/metrics")?;
    Ok(count(&body, "grpc_server_started_total", method))
}

/// Messages the etcd member at `ip` (reached from `ns`) received and sent,
/// on its streams and as unary requests, of every method
/// (`grpc_server_msg_received_total`, `grpc_server_msg_sent_total`).
pub fn messages(ns: &Netns, ip: std::net::Ipv4Addr) -> Result<(f64, f64)> {
    let (_, body) = crate::weft_cluster::http_get(ns, ip, 2379, "/metrics")?;
    let sum = |family: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok((
        sum("grpc_server_msg_received_total"),
        sum("grpc_server_msg_sent_total"),
    ))
}

/// Requests of `method` the etcd member at `ip` (reached from `ns`) began.
pub fn served_at(ns: &Netns, ip: std::net::Ipv4Addr, method: &str) -> Result<f64> {
    let (_, body) = crate::weft_cluster::http_get(ns, ip, 2379, "/metrics")?;
    Ok(count(&body, "grpc_server_started_total", method))
}

fn count(body: &str, family: &str, method: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| l.contains(&format!("grpc_method=\"{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every key under `prefix` with its mod revision, read from `endpoints`
/// (comma separated) from inside `ns`.
pub fn revisions(
    ns: &Netns,
    endpoints: &str,
    prefix: &str,
) -> Result<std::collections::BTreeMap<String, i64>> {
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_string).collect();
    let prefix = prefix.to_string();
    ns.run(move || -> Result<std::collections::BTreeMap<String, i64>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut client = etcd_client::Client::connect(endpoints, None).await?;
            let resp = client
                .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                .await?;
            Ok(resp
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        kv.mod_revision(),
                    )
                })
                .collect())
        })
    })?
}
