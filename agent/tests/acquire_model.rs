//! A model-based test of the acquisition protocol.
//!
//! The real `acquire` code runs against an in-memory key-value store with
//! etcd's compare semantics (create/mod revisions, leases that expire and take
//! their keys with them). Several agents run it at once; proptest chooses the
//! interleaving of their store operations step by step, plus the faults:
//! expiring time, paused agents, crashes with stale subnet files, operator
//! deletions, and writes whose outcome is lost (applied or not) as with a
//! timeout. Shrinking then finds the smallest failing schedule.
//!
//! Checked on every write, and after every acquisition:
//! - no write ever modifies or deletes a key whose value does not name the
//!   writer (the flannel #1289 class of bug);
//! - an acquisition only returns a key that exists, carries the returned etcd
//!   lease and create revision, and names the agent;
//! - once all agents are done, no node has two live keys.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    net::Ipv4Addr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use proptest::prelude::*;
use rand::SeedableRng as _;
use weft::{
    lease::{
        acquire::{AcquireError, AcquireRequest, AcquireStats, HeldLease, Identity, acquire},
        attrs::LeaseAttrs,
        config::NetworkConfig,
        store::{Compare, KeyValue, Listing, Op, Store, StoreError, TxnOutcome},
    },
    mac::MacAddr,
};

const PREFIX: &str = "/n/subnets/";
const TTL: i64 = 10;

#[derive(Default)]
struct World {
    rev: i64,
    now: i64,
    kvs: BTreeMap<String, KeyValue>,
    /// lease id -> expiry time
    leases: HashMap<i64, i64>,
    next_lease: i64,
    /// Per agent: make its next transaction fail, applied or not.
    faults: HashMap<usize, bool>,
}

impl World {
    fn expire(&mut self) {
        let now = self.now;
        let dead: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, e)| **e <= now)
            .map(|(l, _)| *l)
            .collect();
        for l in dead {
            self.leases.remove(&l);
            let keys: Vec<String> = self
                .kvs
                .values()
                .filter(|kv| kv.lease == l)
                .map(|kv| kv.key.clone())
                .collect();
            if !keys.is_empty() {
                self.rev += 1;
                for k in keys {
                    self.kvs.remove(&k);
                }
            }
        }
    }
}

/// One agent's handle on the shared world.
#[derive(Clone)]
struct MemStore {
    world: Arc<Mutex<World>>,
    agent: usize,
    me: Identity,
}

/// Returns Pending once, so every store operation is a scheduling point.
struct YieldOnce(bool);
impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

/// May `writer` rewrite or delete a key holding `old`? Only if the value
/// names it, or is a reservation/flannel lease for its PublicIP.
fn may_write(writer: &Identity, old: &KeyValue) -> bool {
    match LeaseAttrs::parse(&old.value) {
        Ok(a) => {
            a.public_ip == writer.public_ip
                && a.node_id.as_deref().is_none_or(|n| n == writer.node_id)
        }
        Err(_) => false,
    }
}

impl Store for MemStore {
    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        YieldOnce(false).await;
        let w = self.world.lock().unwrap();
        Ok(Listing {
            revision: w.rev,
            kvs: w
                .kvs
                .values()
                .filter(|kv| kv.key.starts_with(prefix))
                .cloned()
                .collect(),
        })
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        YieldOnce(false).await;
        Ok(self.world.lock().unwrap().kvs.get(key).cloned())
    }

    async fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<Op>,
        else_list: Option<&str>,
    ) -> Result<TxnOutcome, StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().unwrap();
        let fault = w.faults.remove(&self.agent);
        if fault == Some(false) {
            return Err(StoreError::Unavailable("timeout (not applied)".into()));
        }
        let ok = compares.iter().all(|c| match c {
            Compare::CreateRevision(k, r) => {
                w.kvs.get(k).map(|kv| kv.create_revision).unwrap_or(0) == *r
            }
            Compare::ModRevision(k, r) => w.kvs.get(k).map(|kv| kv.mod_revision).unwrap_or(0) == *r,
            Compare::Lease(k, l) => w.kvs.get(k).map(|kv| kv.lease).unwrap_or(0) == *l,
        });
        if ok {
            for op in &ops {
                if let Op::Put { lease, .. } = op
                    && *lease != 0
                    && !w.leases.contains_key(lease)
                {
                    return Err(StoreError::Other("requested lease not found".into()));
                }
            }
            w.rev += 1;
            let rev = w.rev;
            for op in ops {
                match op {
                    Op::Put { key, value, lease } => {
                        let kv = match w.kvs.get(&key) {
                            Some(old) => {
                                assert!(
                                    may_write(&self.me, old),
                                    "SAFETY: {:?} overwrote {key} holding {}",
                                    self.me,
                                    String::from_utf8_lossy(&old.value)
                                );
                                KeyValue {
                                    key: key.clone(),
                                    value,
                                    create_revision: old.create_revision,
                                    mod_revision: rev,
                                    version: old.version + 1,
                                    lease,
                                }
                            }
                            None => KeyValue {
                                key: key.clone(),
                                value,
                                create_revision: rev,
                                mod_revision: rev,
                                version: 1,
                                lease,
                            },
                        };
                        w.kvs.insert(key, kv);
                    }
                    Op::Delete { key } => {
                        if let Some(old) = w.kvs.get(&key) {
                            let a = LeaseAttrs::parse(&old.value).ok();
                            assert!(
                                a.is_some_and(|a| a.names(&self.me.node_id, self.me.public_ip)),
                                "SAFETY: {:?} deleted {key}",
                                self.me
                            );
                        }
                        w.kvs.remove(&key);
                    }
                }
            }
        }
        let listing = (!ok).then(|| Listing {
            revision: w.rev,
            kvs: else_list
                .map(|p| {
                    w.kvs
                        .values()
                        .filter(|kv| kv.key.starts_with(p))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
        });
        let outcome = TxnOutcome {
            succeeded: ok,
            revision: w.rev,
            listing,
        };
        if fault == Some(true) {
            return Err(StoreError::Unavailable("timeout (applied)".into()));
        }
        Ok(outcome)
    }

    async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().unwrap();
        w.next_lease += 1;
        let id = w.next_lease;
        let exp = w.now + ttl;
        w.leases.insert(id, exp);
        Ok(id)
    }

    fn pause(&self, _: Duration) -> impl Future<Output = ()> + Send {
        YieldOnce(false)
    }
}

type Outcome = (Result<HeldLease, AcquireError>, AcquireStats, Option<i64>);

struct Node {
    store: MemStore,
    preferred: Option<weft::lease::subnet::Ipv4Net>,
    running: Option<Pin<Box<dyn Future<Output = Outcome>>>>,
    held: Option<HeldLease>,
    paused: bool,
    seed: u64,
}

fn start(node: &mut Node, cfg: &NetworkConfig) {
    let store = node.store.clone();
    let cfg = cfg.clone();
    let preferred = node.preferred;
    let me = store.me.clone();
    let seed = node.seed;
    node.seed += 1;
    node.held = None;
    node.running = Some(Box::pin(async move {
        let value = LeaseAttrs::vxlan(
            me.public_ip,
            1,
            MacAddr::derived(me.node_id.as_bytes()),
            &me.node_id,
        );
        let req = AcquireRequest {
            subnets_prefix: PREFIX,
            config: &cfg,
            me: &me,
            value: &value,
            ttl: TTL,
            preferred,
            lease_id: None,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        acquire(&store, &req, &mut rng).await
    }));
}

/// Polls one agent's acquisition once; checks what it returns.
fn step(node: &mut Node, world: &Arc<Mutex<World>>) {
    let Some(fut) = node.running.as_mut() else {
        return;
    };
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if let Poll::Ready((r, _, _)) = fut.as_mut().poll(&mut cx) {
        node.running = None;
        if let Ok(held) = r {
            let w = world.lock().unwrap();
            let kv = w
                .kvs
                .get(&held.key)
                .unwrap_or_else(|| panic!("acquired {} but the key is absent", held.key));
            assert_eq!(
                kv.create_revision, held.create_revision,
                "create revision of {}",
                held.key
            );
            assert_eq!(kv.lease, held.lease_id, "lease of {}", held.key);
            assert!(
                LeaseAttrs::parse(&kv.value)
                    .unwrap()
                    .names(&node.store.me.node_id, node.store.me.public_ip)
            );
            node.preferred = Some(held.subnet);
            node.held = Some(held);
        }
    }
}

#[derive(Clone, Debug)]
enum Action {
    Step(usize),
    /// The agent's next transaction times out; `bool`: whether it was applied.
    Fault(usize, bool),
    Tick(i64),
    Pause(usize),
    Resume(usize),
    Crash(usize),
    /// The agent notices its key is gone or no longer its own, and re-acquires.
    Notice(usize),
    /// An operator deletes the n-th key.
    DeleteKey(usize),
}

fn action(n: usize) -> impl Strategy<Value = Action> {
    prop_oneof![
        10 => (0..n).prop_map(Action::Step),
        1 => (0..n, any::<bool>()).prop_map(|(a, b)| Action::Fault(a, b)),
        2 => (1i64..6).prop_map(Action::Tick),
        1 => (0..n).prop_map(Action::Pause),
        1 => (0..n).prop_map(Action::Resume),
        1 => (0..n).prop_map(Action::Crash),
        2 => (0..n).prop_map(Action::Notice),
        1 => (0usize..8).prop_map(Action::DeleteKey),
    ]
}

fn run(n: usize, small: bool, reservation: bool, actions: Vec<Action>) {
    let cfg = NetworkConfig::parse(if small {
        br#"{"Network":"10.9.0.0/28","Backend":{"Type":"vxlan"}}"#
    } else {
        br#"{"Network":"10.9.0.0/27","Backend":{"Type":"vxlan"}}"#
    })
    .unwrap();
    let world = Arc::new(Mutex::new(World::default()));
    if reservation {
        // An operator's reservation for node 0's PublicIP.
        let mut w = world.lock().unwrap();
        w.rev += 1;
        let rev = w.rev;
        w.kvs.insert(
            format!("{PREFIX}10.9.0.8-30"),
            KeyValue {
                key: format!("{PREFIX}10.9.0.8-30"),
                value: br#"{"PublicIP":"198.18.0.1"}"#.to_vec(),
                create_revision: rev,
                mod_revision: rev,
                version: 1,
                lease: 0,
            },
        );
    }
    // Nodes 0 and 1 are clones: same PublicIP, different node ids.
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| {
            let ip = if i == 1 {
                Ipv4Addr::new(198, 18, 0, 1)
            } else {
                Ipv4Addr::new(198, 18, 0, 1 + i as u8)
            };
            Node {
                store: MemStore {
                    world: world.clone(),
                    agent: i,
                    me: Identity {
                        node_id: format!("node-{i}"),
                        public_ip: ip,
                    },
                },
                preferred: None,
                running: None,
                held: None,
                paused: false,
                seed: i as u64 * 1000,
            }
        })
        .collect();
    for node in nodes.iter_mut() {
        start(node, &cfg);
    }

    for a in actions {
        match a {
            Action::Step(i) if !nodes[i].paused => step(&mut nodes[i], &world),
            Action::Step(_) => {}
            Action::Fault(i, applied) => {
                world.lock().unwrap().faults.insert(i, applied);
            }
            Action::Tick(dt) => {
                let mut w = world.lock().unwrap();
                w.now += dt;
                // Keep-alives of running, unpaused holders.
                let now = w.now;
                for node in &nodes {
                    if let Some(h) = &node.held
                        && !node.paused
                        && let Some(exp) = w.leases.get_mut(&h.lease_id)
                        && *exp > now - dt
                    {
                        *exp = now + TTL;
                    }
                }
                w.expire();
            }
            Action::Pause(i) => nodes[i].paused = true,
            Action::Resume(i) => nodes[i].paused = false,
            Action::Crash(i) => {
                // Restart with the subnet file it last wrote (maybe stale).
                nodes[i].paused = false;
                start(&mut nodes[i], &cfg);
            }
            Action::Notice(i) => {
                let lost = nodes[i].held.as_ref().is_some_and(|h| {
                    let w = world.lock().unwrap();
                    w.kvs.get(&h.key).is_none_or(|kv| {
                        kv.create_revision != h.create_revision || kv.lease != h.lease_id
                    })
                });
                if lost && !nodes[i].paused {
                    start(&mut nodes[i], &cfg);
                }
            }
            Action::DeleteKey(k) => {
                let mut w = world.lock().unwrap();
                if let Some(key) = w.kvs.keys().nth(k).cloned() {
                    w.rev += 1;
                    w.kvs.remove(&key);
                }
            }
        }
    }

    // Let everyone finish.
    for node in nodes.iter_mut() {
        node.paused = false;
        for _ in 0..10_000 {
            if node.running.is_none() {
                break;
            }
            step(node, &world);
        }
        assert!(node.running.is_none(), "an acquisition never finished");
    }
    let w = world.lock().unwrap();
    for node in &nodes {
        let mine = w
            .kvs
            .values()
            .filter(|kv| kv.lease != 0)
            .filter(|kv| {
                LeaseAttrs::parse(&kv.value)
                    .is_ok_and(|a| a.node_id.as_deref() == Some(&node.store.me.node_id))
            })
            .count();
        // A crash can leave the previous key until the next acquisition
        // reclaims or removes it; a node that just acquired has one.
        if node.held.is_some() {
            assert!(mine <= 1, "{} has {mine} live keys", node.store.me.node_id);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn acquisition_is_safe_under_any_interleaving(
        n in 2usize..6,
        small in any::<bool>(),
        reservation in any::<bool>(),
        actions in prop::collection::vec(action(5), 0..250),
    ) {
        let actions: Vec<Action> = actions
            .into_iter()
            .filter(|a| !matches!(a, Action::Step(i) | Action::Fault(i, _) | Action::Pause(i) | Action::Resume(i) | Action::Crash(i) | Action::Notice(i) if *i >= n))
            .collect();
        run(n, small, reservation, actions);
    }
}
