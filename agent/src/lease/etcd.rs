//! The etcd client: connection options (endpoints, TLS, auth), and the
//! [`Store`] implementation the lease protocol runs on.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions, Txn, TxnOp,
    TxnOpResponse,
};

use super::store::{Compare, KeyValue, Listing, Op, Store, StoreError, TxnOutcome};

/// How to reach etcd (flanneld's flags).
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub cafile: Option<PathBuf>,
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Per-request deadline.
    pub request_timeout: Duration,
}

impl EtcdOptions {
    fn connect_options(&self) -> Result<ConnectOptions> {
        let mut o = ConnectOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => o = o.with_user(u.clone(), p.clone()),
            (Some(_), None) | (None, Some(_)) => {
                bail!("--etcd-username and --etcd-password must be given together")
            }
            (None, None) => {}
        }
        let tls_wanted = self.cafile.is_some()
            || self.certfile.is_some()
            || self.endpoints.iter().any(|e| e.starts_with("https://"));
        if tls_wanted {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.cafile {
                let pem = std::fs::read(ca)
                    .with_context(|| format!("reading --etcd-cafile {}", ca.display()))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            match (&self.certfile, &self.keyfile) {
                (Some(c), Some(k)) => {
                    let cert = std::fs::read(c)
                        .with_context(|| format!("reading --etcd-certfile {}", c.display()))?;
                    let key = std::fs::read(k)
                        .with_context(|| format!("reading --etcd-keyfile {}", k.display()))?;
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                (None, None) => {}
                _ => bail!("--etcd-certfile and --etcd-keyfile must be given together"),
            }
            o = o.with_tls(tls);
        }
        Ok(o)
    }

    /// Validates the endpoints (scheme and form) before any connection.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            bail!("--etcd-endpoints is empty");
        }
        for e in &self.endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .with_context(|| {
                    format!("etcd endpoint {e:?} must start with http:// or https://")
                })?;
            if rest.is_empty() || rest.contains('/') && !rest.ends_with('/') {
                bail!("etcd endpoint {e:?} must look like http://host:port");
            }
        }
        Ok(())
    }
}

/// An etcd connection with a count of the requests made through it.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    requests: Arc<AtomicU64>,
}

impl EtcdStore {
    /// Connects (lazily: no request is made until the first operation).
    pub async fn connect(opts: &EtcdOptions) -> Result<Self> {
        opts.validate()?;
        let client = Client::connect(&opts.endpoints, Some(opts.connect_options()?))
            .await
            .with_context(|| format!("connecting to etcd at {}", opts.endpoints.join(",")))?;
        Ok(Self {
            client,
            requests: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Requests made so far (reads, transactions, grants).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) fn store_error(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match &e {
        E::GRpcStatus(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) =>
        {
            StoreError::Unavailable(s.message().to_string())
        }
        E::TransportError(_) | E::IoError(_) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Other(e.to_string()),
    }
}

pub(crate) fn to_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

impl Store for EtcdStore {
    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.count();
        let resp = self
            .client
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(store_error)?;
        Ok(Listing {
            revision: resp.header().map(|h| h.revision()).unwrap_or_default(),
            kvs: resp.kvs().iter().map(to_kv).collect(),
        })
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.count();
        let resp = self
            .client
            .clone()
            .get(key, None)
            .await
            .map_err(store_error)?;
        Ok(resp.kvs().first().map(to_kv))
    }

    async fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<Op>,
        else_list: Option<&str>,
    ) -> Result<TxnOutcome, StoreError> {
        use etcd_client::{Compare as C, CompareOp::Equal};
        self.count();
        let when: Vec<C> = compares
            .into_iter()
            .map(|c| match c {
                Compare::CreateRevision(k, r) => C::create_revision(k, Equal, r),
                Compare::ModRevision(k, r) => C::mod_revision(k, Equal, r),
                Compare::Lease(k, l) => C::lease(k, Equal, l),
            })
            .collect();
        let then: Vec<TxnOp> = ops
            .into_iter()
            .map(|op| match op {
                Op::Put { key, value, lease } => {
                    let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
                    TxnOp::put(key, value, opts)
                }
                Op::Delete { key } => TxnOp::delete(key, None),
            })
            .collect();
        let mut txn = Txn::new().when(when).and_then(then);
        if let Some(prefix) = else_list {
            txn = txn.or_else(vec![TxnOp::get(
                prefix,
                Some(GetOptions::new().with_prefix()),
            )]);
        }
        let resp = self.client.clone().txn(txn).await.map_err(store_error)?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let listing = if resp.succeeded() {
            None
        } else {
            resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => Some(Listing {
                    revision,
                    kvs: g.kvs().iter().map(to_kv).collect(),
                }),
                _ => None,
            })
        };
        Ok(TxnOutcome {
            succeeded: resp.succeeded(),
            revision,
            listing,
        })
    }

    async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        self.count();
        let resp = self
            .client
            .clone()
            .lease_grant(ttl, None)
            .await
            .map_err(store_error)?;
        Ok(resp.id())
    }
}
