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

/// Messages etcd received on its streams and as unary requests, of every
/// method (`grpc_server_msg_received_total`).
pub fn messages_received(ns: &Netns) -> Result<f64> {
    let ip = ETCD_IP.parse()?;
    let (_, body) = crate::weft_cluster::http_get(ns, ip, 2379, "/metrics")?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

fn count(body: &str, family: &str, method: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| l.contains(&format!("grpc_method=\"{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
