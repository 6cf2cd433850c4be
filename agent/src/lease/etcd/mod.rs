//! The etcd client: connection options (endpoints, TLS, auth), and the
//! [`Store`] implementation the lease protocol runs on.
//!
//! As the Kubernetes API server talks to etcd: every request requires the
//! member to have a leader (a member cut off from its peers answers
//! "no leader" instead of serving stale reads, and cancels watches), auth
//! tokens are refreshed when they expire, and prefix reads are paginated at
//! one revision so no response comes near gRPC's 4 MiB message limit.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, RwLock,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions, Txn, TxnOp,
    TxnOpResponse,
};

use super::store::{Compare, KeyValue, Listing, Op, Page, Store, StoreError, TxnOutcome};

mod streams;

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

/// Where Debian, Fedora and Alpine keep the system's trusted CAs (one PEM
/// bundle); `SSL_CERT_FILE` overrides.
const SYSTEM_ROOTS: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Prefix reads ask for at most this many keys per response (a lease is
/// about 200 bytes; values above [`MAX_VALUE_BYTES`] are junk anyway). A
/// page too large for one gRPC message (a few junk values of etcd's
/// 1.5 MiB maximum) is asked for again with half as many keys, down to one.
pub(crate) const LIST_PAGE: i64 = 1000;

/// What a page should weigh: the next page asks for as many keys as the
/// last one's would make this many bytes (at most [`LIST_PAGE`], at least
/// one). etcd builds a response whole before the client can refuse it, so
/// a prefix of large junk values must not be asked for 1,000 at a time
/// on every page; three quarters of the client's 4 MiB message keep a
/// page of leases (or of 4 KB junk) as large as ever.
const PAGE_BYTES: usize = 3 << 20;

/// The keys to ask for after a page whose `n` keys weighed `bytes`.
fn keys_for(n: usize, bytes: usize) -> i64 {
    if n == 0 {
        return LIST_PAGE;
    }
    let each = (bytes / n).max(1);
    i64::try_from(PAGE_BYTES / each)
        .unwrap_or(LIST_PAGE)
        .clamp(1, LIST_PAGE)
}

/// Lease values larger than this are malformed (a real one is 200 to 400
/// bytes). Only this much (and one byte more, to tell) of any value is
/// kept once read, so what etcd holds bounds nothing in the agent: a page
/// of junk values is cut down as it arrives and dropped before the next.
pub(crate) const MAX_VALUE_BYTES: usize = 4096;

/// Keys longer than this cannot be a lease's (the longest,
/// `<prefix>/subnets/<IPv4>-32&<IPv6>-128`, is a few hundred bytes with any
/// sane prefix); only this much of one is kept, marked so it never parses.
pub(crate) const MAX_KEY_BYTES: usize = 1024;

impl EtcdOptions {
    /// `with_user`: false for the health checker's per-member clients,
    /// which only ask for status (no auth needed).
    fn connect_options(&self, with_user: bool) -> Result<ConnectOptions> {
        let mut o = ConnectOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let (true, Some(u), Some(p)) = (with_user, &self.username, &self.password) {
            o = o
                .with_user(u.clone(), p.clone())
                .with_auto_token_refresh(true);
        }
        if self.tls() {
            let mut tls = TlsOptions::new();
            let (what, pem) = match &self.cafile {
                Some(ca) => (
                    format!("--etcd-cafile {}", ca.display()),
                    std::fs::read(ca)
                        .with_context(|| format!("reading --etcd-cafile {}", ca.display()))?,
                ),
                None => {
                    let path = system_roots()?;
                    (
                        format!("the system's trusted CAs ({})", path.display()),
                        std::fs::read(&path)
                            .with_context(|| format!("reading {}", path.display()))?,
                    )
                }
            };
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                bail!("{what} holds no PEM certificate");
            }
            tls = tls.ca_certificate(Certificate::from_pem(pem));
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

    /// A digest of the TLS files' contents (None without TLS files). It
    /// changes when any of them is rewritten, and when a Kubernetes Secret
    /// volume swaps its `..data` link to new files (the paths stay, what
    /// they lead to changes).
    pub(crate) fn tls_files_digest(&self) -> Option<u64> {
        use std::hash::{Hash as _, Hasher as _};
        let files: Vec<&PathBuf> = [&self.cafile, &self.certfile, &self.keyfile]
            .into_iter()
            .flatten()
            .collect();
        if files.is_empty() {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for f in files {
            match std::fs::read(f) {
                Ok(b) => b.hash(&mut h),
                Err(e) => e.kind().hash(&mut h),
            }
        }
        Some(h.finish())
    }

    /// Whether the endpoints are https:// (all of them, see
    /// [`EtcdOptions::validate`]).
    fn tls(&self) -> bool {
        self.endpoints.iter().any(|e| e.starts_with("https://"))
    }

    /// Validates the endpoints (scheme and form) and the flags against each
    /// other, before any connection.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            bail!("--etcd-endpoints is empty");
        }
        let https = self
            .endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https != 0 && https != self.endpoints.len() {
            bail!(
                "--etcd-endpoints mixes http:// and https:// ({}): use one scheme for every member",
                self.endpoints.join(",")
            );
        }
        if https == 0 {
            for (flag, given) in [
                ("--etcd-cafile", self.cafile.is_some()),
                ("--etcd-certfile", self.certfile.is_some()),
                ("--etcd-keyfile", self.keyfile.is_some()),
            ] {
                if given {
                    bail!(
                        "{flag} is given but the etcd endpoints are http://, which would send it nowhere: use https:// endpoints"
                    );
                }
            }
        }
        if self.certfile.is_some() != self.keyfile.is_some() {
            bail!("--etcd-certfile and --etcd-keyfile must be given together");
        }
        if self.username.is_some() != self.password.is_some() {
            bail!("--etcd-username and --etcd-password must be given together");
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

/// The system's CA bundle.
fn system_roots() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
        return Ok(PathBuf::from(p));
    }
    SYSTEM_ROOTS
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .map(Path::to_path_buf)
        .with_context(|| {
            format!(
                "https:// endpoints without --etcd-cafile use the system's trusted CAs, and there is no CA bundle here ({}); pass --etcd-cafile",
                SYSTEM_ROOTS.join(", ")
            )
        })
}

/// Whether an error from connecting means the credentials were refused
/// (which retrying cannot fix).
pub(crate) fn is_auth_refused(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::InvalidArgument && s.message().contains("authentication failed"))
}

/// An etcd connection with a count of the requests made through it. The
/// client can be replaced ([`EtcdStore::reconnect`]: certificates read
/// again); clones share it.
#[derive(Clone)]
pub struct EtcdStore {
    client: Arc<RwLock<Client>>,
    opts: EtcdOptions,
    requests: Arc<AtomicU64>,
    /// Bumped on every reconnect, so the watch moves to the new client.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    /// The digest of the TLS files as the current client read them (taken
    /// before reading, so a change racing the read is seen again later).
    tls_read: Arc<std::sync::Mutex<Option<u64>>>,
    /// How many keys the next page asks for ([`keys_for`] of the last).
    page_keys: Arc<AtomicI64>,
}

impl EtcdStore {
    /// Connects. Without credentials no request is made until the first
    /// operation; with them, this authenticates (and fails if etcd cannot
    /// be reached: see [`EtcdStore::connect_retrying`]).
    pub async fn connect(opts: &EtcdOptions) -> Result<Self> {
        opts.validate()?;
        let digest = opts.tls_files_digest();
        let client = connect_client(opts, true).await?;
        Ok(Self {
            client: Arc::new(RwLock::new(client)),
            opts: opts.clone(),
            requests: Arc::new(AtomicU64::new(0)),
            generation: Arc::new(tokio::sync::watch::channel(0).0),
            tls_read: Arc::new(std::sync::Mutex::new(digest)),
            page_keys: Arc::new(AtomicI64::new(LIST_PAGE)),
        })
    }

    /// Connects, waiting for etcd with backoff while it cannot be reached
    /// (an agent started before etcd, a TLS file not there yet). Credentials
    /// etcd refuses are an error at once.
    /// Each failure counts as an etcd error in `metrics`.
    pub(crate) async fn connect_retrying(
        opts: &EtcdOptions,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self> {
        opts.validate()?;
        let mut retry = crate::backoff::Retry::new(crate::backoff::ETCD);
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
        loop {
            match Self::connect(opts).await {
                Ok(s) => return Ok(s),
                Err(e)
                    if e.chain().any(|c| {
                        c.downcast_ref::<etcd_client::Error>()
                            .is_some_and(is_auth_refused)
                    }) =>
                {
                    return Err(e.context(
                        "etcd refused --etcd-username/--etcd-password (wrong user or password)",
                    ));
                }
                Err(e) => {
                    metrics.inc_etcd_error();
                    let wait = retry.failed(0, &mut rng);
                    tracing::warn!(error = %format!("{e:#}"), retry_in = ?wait, "cannot connect to etcd; waiting for it");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Connects again with the same options, reading the certificate files
    /// again (on SIGHUP, after they were replaced on disk). In-flight
    /// requests finish on the old connection; the watch restarts on the new.
    pub async fn reconnect(&self) -> Result<()> {
        let digest = self.opts.tls_files_digest();
        let mut c = connect_client(&self.opts, true).await?;
        // The connection may be made lazily: a request proves the files
        // work (a wrong certificate fails its handshake) before the client
        // that works is replaced.
        tokio::time::timeout(self.opts.request_timeout, c.status())
            .await
            .map_err(|_| anyhow::anyhow!("etcd did not answer with the new connection"))?
            .context("etcd refused the new connection")?;
        *self.client.write().expect("client lock") = c;
        *self.tls_read.lock().expect("tls lock") = digest;
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// Whether the TLS files' contents differ from what the current
    /// connection was made with (rotated certificates, a Secret volume's
    /// swap): compared with the files as read at connect time, so a change
    /// made while the agent was still starting is not missed.
    pub(crate) fn tls_files_changed(&self) -> bool {
        self.opts.tls_files_digest() != *self.tls_read.lock().expect("tls lock")
    }

    pub fn client(&self) -> Client {
        self.client.read().expect("client lock").clone()
    }

    pub(crate) fn options(&self) -> &EtcdOptions {
        &self.opts
    }

    /// Changes whenever the client is replaced.
    pub(crate) fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Connects a client to one member only, without credentials (for its
    /// status).
    pub(crate) async fn member_client(&self, endpoint: &str) -> Result<Client> {
        Client::connect([endpoint], Some(self.opts.connect_options(false)?))
            .await
            .with_context(|| format!("connecting to etcd member {endpoint}"))
    }

    /// Takes a member out of the client's rotation, or puts it back.
    pub(crate) async fn set_in_rotation(&self, endpoint: &str, on: bool) -> Result<()> {
        let c = self.client();
        if on {
            c.add_endpoint(endpoint).await?;
        } else {
            c.remove_endpoint(endpoint).await?;
        }
        Ok(())
    }

    /// One page of `prefix` from `from` on, at `revision` (0: the current
    /// one), of as many keys as the last page's size says fit in
    /// [`PAGE_BYTES`]. A page too large for one gRPC message (a few junk
    /// values of etcd's 1.5 MiB maximum) is asked for again with half as
    /// many keys, down to one.
    async fn page(&self, prefix: &str, from: &[u8], revision: i64) -> Result<Page, StoreError> {
        let end = prefix_end(prefix);
        let mut limit = self.page_keys.load(Ordering::Relaxed);
        loop {
            self.count();
            // Ranges come in key order.
            let mut o = GetOptions::new().with_range(end.clone()).with_limit(limit);
            if revision > 0 {
                o = o.with_revision(revision);
            }
            match self.client().get(from.to_vec(), Some(o)).await {
                Ok(resp) => {
                    self.weighed(resp.kvs());
                    let rev = resp.header().map(|h| h.revision()).unwrap_or_default();
                    let mut page = page_of(
                        if revision > 0 { revision } else { rev },
                        resp.kvs(),
                        resp.more(),
                    );
                    page.cluster = resp.header().map(|h| h.cluster_id()).unwrap_or_default();
                    return Ok(page);
                }
                Err(e) if too_large(&e) && limit > 1 => {
                    limit = (limit / 2).max(1);
                    self.page_keys.store(limit, Ordering::Relaxed);
                    tracing::warn!(
                        prefix,
                        limit,
                        "a page of the prefix is larger than a gRPC message (junk values?); reading fewer keys per page"
                    );
                }
                Err(e) => return Err(store_error(e)),
            }
        }
    }

    /// The next page's size, from what this one's keys weighed.
    fn weighed(&self, kvs: &[etcd_client::KeyValue]) {
        let bytes = kvs.iter().map(|kv| kv.key().len() + kv.value().len()).sum();
        self.page_keys
            .store(keys_for(kvs.len(), bytes), Ordering::Relaxed);
    }

    /// The seconds left of an etcd lease; None once it has expired.
    pub async fn ttl(&self, lease_id: i64) -> Result<Option<i64>, StoreError> {
        self.count();
        let ttl = self
            .client()
            .lease_time_to_live(lease_id, None)
            .await
            .map_err(store_error)?
            .ttl();
        Ok((ttl >= 0).then_some(ttl))
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

/// Whether a response was refused for being larger than a gRPC message.
fn too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::OutOfRange && s.message().contains("too large"))
}

/// The end of the range of keys that start with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

async fn connect_client(opts: &EtcdOptions, with_user: bool) -> Result<Client> {
    Client::connect(&opts.endpoints, Some(opts.connect_options(with_user)?))
        .await
        .with_context(|| format!("connecting to etcd at {}", opts.endpoints.join(",")))
}

/// A page of a range's keys; its cursor from the last key's raw bytes.
fn page_of(revision: i64, kvs: &[etcd_client::KeyValue], more: bool) -> Page {
    let mut next = kvs.last().map(|kv| kv.key().to_vec()).unwrap_or_default();
    next.push(0);
    Page {
        revision,
        cluster: 0,
        kvs: kvs.iter().map(to_kv).collect(),
        more: more && !kvs.is_empty(),
        next,
    }
}

pub(crate) fn to_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    let key = match kv.key() {
        k if k.len() > MAX_KEY_BYTES => format!(
            "{}\u{0}(a key of {} bytes)",
            String::from_utf8_lossy(&k[..MAX_KEY_BYTES]),
            k.len()
        ),
        k => String::from_utf8_lossy(k).into_owned(),
    };
    let value = kv.value();
    KeyValue {
        key,
        value: value[..value.len().min(MAX_VALUE_BYTES + 1)].to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

impl Store for EtcdStore {
    type Watch = streams::EtcdWatch;
    type KeepAlive = streams::EtcdKeepAlive;

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let mut listing = Listing::default();
        let mut page = self.page(prefix, prefix.as_bytes(), 0).await?;
        listing.revision = page.revision;
        loop {
            listing.kvs.append(&mut page.kvs);
            if !page.more {
                return Ok(listing);
            }
            page = self.page(prefix, &page.next, listing.revision).await?;
        }
    }

    async fn list_page(
        &self,
        prefix: &str,
        from: &[u8],
        revision: i64,
    ) -> Result<Page, StoreError> {
        self.page(prefix, from, revision).await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.count();
        let resp = self.client().get(key, None).await.map_err(store_error)?;
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
            // The first page only: the rest, if any, is read after at the
            // same revision.
            txn = txn.or_else(vec![TxnOp::get(
                prefix,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_limit(self.page_keys.load(Ordering::Relaxed)),
                ),
            )]);
        }
        let resp = match self.client().txn(txn).await {
            Ok(r) => r,
            // Only the else branch's listing makes a response this large (a
            // put's or a delete's is a few bytes): the transaction failed,
            // and the listing is read page by page instead.
            Err(e) if too_large(&e) && else_list.is_some() => {
                let prefix = else_list.unwrap_or_default();
                let first = self.page(prefix, prefix.as_bytes(), 0).await?;
                return Ok(TxnOutcome {
                    succeeded: false,
                    revision: first.revision,
                    listing: Some(first),
                });
            }
            Err(e) => return Err(store_error(e)),
        };
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let listing = if resp.succeeded() {
            None
        } else {
            resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => {
                    self.weighed(g.kvs());
                    Some(page_of(revision, g.kvs(), g.more()))
                }
                _ => None,
            })
        };
        Ok(TxnOutcome {
            succeeded: resp.succeeded(),
            revision,
            listing,
        })
    }

    async fn holds_revision(&self, key: &str, revision: i64) -> Result<Option<u64>, StoreError> {
        self.count();
        let o = GetOptions::new().with_revision(revision).with_count_only();
        match self.client().get(key, Some(o)).await {
            Ok(r) => Ok(Some(r.header().map(|h| h.cluster_id()).unwrap_or_default())),
            // Compacted away, or a revision this etcd has not reached (its
            // data restored from an older backup): a list it is.
            Err(etcd_client::Error::GRpcStatus(s))
                if s.code() == tonic::Code::OutOfRange
                    && (s.message().contains("compacted") || s.message().contains("future")) =>
            {
                Ok(None)
            }
            Err(e) => Err(store_error(e)),
        }
    }

    async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        self.count();
        let resp = self
            .client()
            .lease_grant(ttl, None)
            .await
            .map_err(store_error)?;
        Ok(resp.id())
    }

    async fn watch(&self, prefix: &str, revision: i64) -> Result<Self::Watch, StoreError> {
        Self::Watch::start(self, prefix, revision).await
    }

    async fn keep_alive(&self, lease: i64) -> Result<Self::KeepAlive, StoreError> {
        Self::KeepAlive::start(self, lease).await
    }
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn a_page_weighs_about_three_mebibytes() {
        // Leases of about 250 bytes: as many as ever.
        assert_eq!(keys_for(1000, 250_000), LIST_PAGE);
        // 4,000-byte values: 786 a page.
        assert_eq!(keys_for(1000, 4_000_000), 786);
        // 60 KiB values: 51 a page (3 MiB), not 1,000 (60 MiB).
        assert_eq!(keys_for(62, 62 * 60 * 1024), 51);
        // 1.4 MiB values: two a page.
        assert_eq!(keys_for(2, 2 * 1400 * 1024), 2);
        // An empty page says nothing: back to the most.
        assert_eq!(keys_for(0, 0), LIST_PAGE);
        assert_eq!(keys_for(3, 0), LIST_PAGE);
    }
}
