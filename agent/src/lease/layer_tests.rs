//! The lease layer end to end on the in-memory etcd ([`super::memory`]):
//! the holder acquires and keeps a lease alive, another node's watch and
//! view make it a peer, and the lease's end (expiry, revocation, an outage,
//! a compaction of the watch's history) reaches both as it would with etcd.
//! Time is tokio's paused clock: minutes of TTLs run in milliseconds.

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    sync::{Arc, atomic::AtomicUsize},
    time::Duration,
};

use ipnet::IpNet;
use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use super::{
    acquire::{HeldLease, Identity},
    attrs::LeaseAttrs,
    config::NetworkConfig,
    holder::{LeaseHolder, Timing, wait_for_config},
    inbox::Inbox,
    memory::MemStore,
    store::Store as _,
    view::LeaseView,
    watch::Watch,
};
use crate::{mac::MacAddr, metrics::Metrics};

const PREFIX: &str = "/coreos.com/network";
const CONFIG: &[u8] = br#"{"Network":"10.5.0.0/16","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#;
const TIMING: Timing = Timing {
    ttl: Duration::from_secs(6),
    renew_margin: Duration::from_secs(2),
    request_timeout: Duration::from_secs(1),
    retry_interval: Duration::from_secs(1),
};

fn identity(n: u8) -> (Identity, LeaseAttrs) {
    let ip = Ipv4Addr::new(198, 18, 0, n);
    let node = format!("node-{n}");
    let attrs = LeaseAttrs::vxlan(ip, 1, MacAddr([2, 0, 0, 0, 0, n]), &node);
    let me = Identity {
        node_id: node,
        public_ip: Some(ip),
        public_ipv6: None,
    };
    (me, attrs)
}

struct Node {
    holder: LeaseHolder<MemStore>,
    held: HeldLease,
    metrics: Arc<Metrics>,
}

async fn node(store: &MemStore, cfg: &NetworkConfig, n: u8) -> Node {
    let (me, attrs) = identity(n);
    let metrics = Arc::new(Metrics::default());
    let mut holder = LeaseHolder::new(
        store.clone(),
        PREFIX,
        cfg.clone(),
        me,
        attrs,
        TIMING,
        metrics.clone(),
    );
    let held = holder.acquire(None).await;
    Node {
        holder,
        held,
        metrics,
    }
}

/// A node's view of the others, fed by its own watch.
struct Follower {
    view: LeaseView,
    inbox: Arc<Inbox>,
    task: JoinHandle<()>,
    metrics: Arc<Metrics>,
}

impl Follower {
    fn start(store: &MemStore, cfg: &NetworkConfig, n: u8, held: &HeldLease) -> Self {
        let metrics = Arc::new(Metrics::default());
        let subnets = format!("{PREFIX}/subnets/");
        let mut view = LeaseView::new(&subnets, cfg.clone(), identity(n).0, metrics.clone());
        view.set_held(held);
        let inbox = Arc::new(Inbox::default());
        let task = tokio::spawn(
            Watch {
                store: store.clone(),
                prefix: subnets,
                inbox: inbox.clone(),
                metrics: metrics.clone(),
                moved: Arc::new(Notify::new()),
                trouble: Arc::new(Notify::new()),
                nodes: Arc::new(AtomicUsize::new(0)),
            }
            .run(None),
        );
        Self {
            view,
            inbox,
            task,
            metrics,
        }
    }

    /// Applies what the watch hands over until the peers are `want` (or
    /// 60 s of tokio time).
    async fn until(&mut self, what: &str, want: &[IpNet]) -> Duration {
        let want: HashSet<IpNet> = want.iter().copied().collect();
        let start = Instant::now();
        while self.view.peer_subnets() != want {
            tokio::time::timeout(Duration::from_secs(60), self.inbox.wait())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{what}: peers {:?}, want {want:?}",
                        self.view.peer_subnets()
                    )
                });
            self.drain();
        }
        start.elapsed()
    }

    /// Applies what arrived meanwhile.
    fn drain(&mut self) {
        let b = self.inbox.take();
        self.view.apply(b.snapshot, b.changes);
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn metric(m: &Metrics, name: &str) -> f64 {
    m.render(0)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}

fn v4(h: &HeldLease) -> IpNet {
    IpNet::V4(h.subnet.v4.expect("an IPv4 subnet"))
}

async fn setup() -> (MemStore, NetworkConfig) {
    let store = MemStore::default();
    store.put(&format!("{PREFIX}/config"), CONFIG);
    let cfg = wait_for_config(&store, PREFIX, TIMING.retry_interval, &Metrics::default()).await;
    (store, cfg)
}

/// A lease kept alive stays a peer long past its TTL; once its holder is
/// gone it expires within the TTL and leaves the other node's view.
#[tokio::test(start_paused = true)]
async fn a_kept_lease_stays_and_an_abandoned_one_leaves_within_its_ttl() {
    let (store, cfg) = setup().await;
    let a = node(&store, &cfg, 1).await;
    let b = node(&store, &cfg, 2).await;
    assert_ne!(a.held.subnet, b.held.subnet);
    let mut fb = Follower::start(&store, &cfg, 2, &b.held);
    fb.until("a is b's peer", &[v4(&a.held)]).await;

    tokio::time::sleep(TIMING.ttl * 10).await;
    fb.drain();
    assert_eq!(fb.view.peer_subnets(), HashSet::from([v4(&a.held)]));
    assert_eq!(metric(&a.metrics, "weft_lease_held"), 1.0);
    assert!(store.get(&a.held.key).await.unwrap().is_some());

    drop(a);
    let took = fb.until("a's lease expired", &[]).await;
    assert!(took <= TIMING.ttl + Duration::from_secs(1), "{took:?}");
    assert_eq!(metric(&b.metrics, "weft_lease_held"), 1.0);
}

/// etcd revokes our lease: the keeper notices at its next renewal, the
/// holder gives the subnet up and acquires again, and the other node's
/// view follows the key away and back.
#[tokio::test(start_paused = true)]
async fn a_revoked_lease_is_noticed_and_acquired_again() {
    let (store, cfg) = setup().await;
    let mut a = node(&store, &cfg, 1).await;
    let b = node(&store, &cfg, 2).await;
    let mut fb = Follower::start(&store, &cfg, 2, &b.held);
    fb.until("a is b's peer", &[v4(&a.held)]).await;

    store.revoke(a.held.lease_id);
    let noticed = Instant::now();
    tokio::time::timeout(TIMING.ttl, a.holder.expired())
        .await
        .expect("the holder notices the revocation within a TTL");
    assert!(noticed.elapsed() <= TIMING.ttl / 3 + TIMING.request_timeout);
    let old = a.holder.lose("revoked", None).expect("a held a subnet");
    assert_eq!(metric(&a.metrics, "weft_lease_lost_total"), 1.0);
    fb.until("a's key is gone", &[]).await;

    let again = a.holder.acquire(Some(old)).await;
    assert_eq!(again.subnet, a.held.subnet, "the old subnet was free");
    assert_ne!(again.lease_id, a.held.lease_id);
    fb.until("a is back", &[v4(&again)]).await;
}

/// An outage shorter than the TTL loses nothing: keep-alives resume, the
/// watch starts again after the last revision it delivered (no list) and
/// knows the same peers. A compaction of history the watch has delivered
/// does not disturb it (as in etcd, only a watch started from a compacted
/// revision is cancelled); one past what it delivered, met when it starts
/// again, makes it list once.
#[tokio::test(start_paused = true)]
async fn an_outage_and_a_compaction_lose_nothing() {
    let (store, cfg) = setup().await;
    let a = node(&store, &cfg, 1).await;
    let b = node(&store, &cfg, 2).await;
    let mut fb = Follower::start(&store, &cfg, 2, &b.held);
    fb.until("a is b's peer", &[v4(&a.held)]).await;
    assert_eq!(metric(&fb.metrics, "weft_watch_lists_total"), 1.0);

    store.set_down(true);
    tokio::time::sleep(TIMING.ttl / 2).await;
    store.set_down(false);
    tokio::time::sleep(TIMING.ttl * 3).await;
    fb.drain();
    assert_eq!(fb.view.peer_subnets(), HashSet::from([v4(&a.held)]));
    assert!(store.get(&a.held.key).await.unwrap().is_some());
    assert!(metric(&a.metrics, "weft_etcd_errors_total") >= 1.0);
    assert!(
        metric(&fb.metrics, "weft_watch_resumes_total") >= 1.0,
        "the broken watch started again"
    );
    assert_eq!(
        metric(&fb.metrics, "weft_watch_lists_total"),
        1.0,
        "without a list"
    );

    store.compact();
    let c = node(&store, &cfg, 3).await;
    fb.until("c joins after the compaction", &[v4(&a.held), v4(&c.held)])
        .await;
    assert_eq!(metric(&fb.metrics, "weft_watch_lists_total"), 1.0);

    // Down while c's lease is put and a compaction passes it: back, the
    // watch finds its revision gone and lists, once.
    store.set_down(true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.set_down(false);
    let d = node(&store, &cfg, 4).await;
    store.set_down(true);
    store.compact();
    store.set_down(false);
    fb.until(
        "d seen through a list",
        &[v4(&a.held), v4(&c.held), v4(&d.held)],
    )
    .await;
    assert_eq!(metric(&fb.metrics, "weft_watch_lists_total"), 2.0);
    drop(c);
    fb.until("c's lease expired", &[v4(&a.held), v4(&d.held)])
        .await;
}
