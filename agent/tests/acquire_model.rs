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
//! The oracle of ownership is independent of the code under test: the
//! model remembers who *created* each key (an agent, or the operator's
//! reservation for a PublicIP, or junk an operator wrote) and forgets it when
//! the key is deleted or expires; it never reads lease values to decide.
//!
//! Checked on every write, after every acquisition and after every step:
//! - no write ever modifies or deletes a key another agent created (the
//!   flannel #1289 class of bug), except a node at the same PublicIP taking
//!   over its lease (a replaced machine; the key is then that node's), and
//!   only the node a reservation is for may write it;
//! - an acquisition only returns a key that exists, carries the returned etcd
//!   lease and create revision, is the agent's own, and whose subnet
//!   overlaps no other key inside the network;
//! - at every step, no two agents that still hold their key hold
//!   overlapping subnets;
//! - once all agents are done, no node has two live keys.
//!
//! Faults: expiring time, pauses, crashes with stale subnet files, operator
//! deletions, transactions whose outcome is lost (applied or not), and
//! failing `list` and `grant` calls (a failed grant may have been applied).
//!
//! Each schedule runs on an IPv4, a dual-stack or an IPv6-only network. On
//! a dual-stack network both halves of every key are checked (no two holders
//! share an IPv4 or an IPv6 subnet), and stale subnet files may name any
//! pair, including pairs no Weft node would choose.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use proptest::prelude::*;
use rand::SeedableRng as _;
use weft::{
    lease::{
        AcquireError, AcquireRequest, AcquireStats, Compare, HeldLease, Identity, KeepAlive,
        KeyValue, LeaseAttrs, Listing, NetworkConfig, Op, Store, StoreError, Subnets, TxnOutcome,
        WatchResponse, WatchStream, acquire, parse_key,
    },
    mac::MacAddr,
};

const PREFIX: &str = "/n/subnets/";
const TTL: i64 = 10;

/// Who created a key: the oracle's view, kept from the writes themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    /// The node that created (or took over) the key, and its address.
    Agent(String, IpAddr),
    /// An operator's reservation for this PublicIP (PublicIPv6 on an
    /// IPv6-only network).
    Reservation(IpAddr),
    /// A key an operator wrote that no agent may ever take.
    Foreign,
}

/// A failure injected into an agent's next call of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The next transaction times out; `true`: it was applied anyway.
    Txn(bool),
    /// The next list fails.
    List,
    /// The next grant times out; `true`: the lease was granted anyway.
    Grant(bool),
}

#[derive(Default)]
struct World {
    rev: i64,
    now: i64,
    kvs: BTreeMap<String, KeyValue>,
    owners: HashMap<String, Owner>,
    /// lease id -> expiry time
    leases: HashMap<i64, i64>,
    next_lease: i64,
    /// Per agent: faults to inject, by kind of call.
    faults: HashMap<usize, Vec<Fault>>,
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
                    self.owners.remove(&k);
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

impl World {
    /// Takes the fault of this kind queued for `agent`, if any.
    fn fault(&mut self, agent: usize, kind: fn(&Fault) -> bool) -> Option<Fault> {
        let q = self.faults.get_mut(&agent)?;
        let i = q.iter().position(kind)?;
        Some(q.remove(i))
    }
}

/// May `writer` put to the existing `key`? Only if it created it (or took
/// it over), or it is at the creator's PublicIP (a replaced machine), or it
/// is a reservation for the writer's PublicIP.
fn may_put(owners: &HashMap<String, Owner>, writer: &Identity, key: &str) -> bool {
    match owners.get(key) {
        Some(Owner::Agent(id, addr)) => *id == writer.node_id || *addr == writer.addr(),
        Some(Owner::Reservation(ip)) => *ip == writer.addr(),
        Some(Owner::Foreign) | None => false,
    }
}

/// The acquisition does not follow leases or keep them alive (the holder
/// does, tested on the crate's own in-memory etcd): this model has no
/// watch or keep-alive to give, so neither type has a value.
enum NotModelled {}

impl WatchStream for NotModelled {
    async fn next(&mut self) -> Result<Option<WatchResponse>, StoreError> {
        match *self {}
    }
    async fn request_progress(&mut self) {
        match *self {}
    }
}

impl KeepAlive for NotModelled {
    async fn renew(&mut self) -> Result<i64, StoreError> {
        match *self {}
    }
}

impl Store for MemStore {
    type Watch = NotModelled;
    type KeepAlive = NotModelled;

    async fn watch(&self, _: &str, _: i64) -> Result<NotModelled, StoreError> {
        Err(StoreError::Other(
            "the acquisition model has no watch".into(),
        ))
    }

    async fn keep_alive(&self, _: i64) -> Result<NotModelled, StoreError> {
        Err(StoreError::Other(
            "the acquisition model has no keep-alive".into(),
        ))
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().unwrap();
        if w.fault(self.agent, |f| *f == Fault::List).is_some() {
            return Err(StoreError::Unavailable("list timed out".into()));
        }
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
        let fault = w.fault(self.agent, |f| matches!(f, Fault::Txn(_)));
        if fault == Some(Fault::Txn(false)) {
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
                        let kv = match w.kvs.get(&key).cloned() {
                            Some(old) => {
                                assert!(
                                    may_put(&w.owners, &self.me, &key),
                                    "SAFETY: {:?} overwrote {key} (created by {:?}) holding {}",
                                    self.me,
                                    w.owners.get(&key),
                                    String::from_utf8_lossy(&old.value)
                                );
                                if let Some(Owner::Agent(..)) = w.owners.get(&key) {
                                    // A takeover makes it the writer's.
                                    w.owners.insert(
                                        key.clone(),
                                        Owner::Agent(self.me.node_id.clone(), self.me.addr()),
                                    );
                                }
                                KeyValue {
                                    key: key.clone(),
                                    value,
                                    create_revision: old.create_revision,
                                    mod_revision: rev,
                                    version: old.version + 1,
                                    lease,
                                }
                            }
                            None => {
                                w.owners.insert(
                                    key.clone(),
                                    Owner::Agent(self.me.node_id.clone(), self.me.addr()),
                                );
                                KeyValue {
                                    key: key.clone(),
                                    value,
                                    create_revision: rev,
                                    mod_revision: rev,
                                    version: 1,
                                    lease,
                                }
                            }
                        };
                        w.kvs.insert(key, kv);
                    }
                    Op::Delete { key } => {
                        if w.kvs.contains_key(&key) {
                            assert!(
                                matches!(w.owners.get(&key), Some(Owner::Agent(id, _)) if *id == self.me.node_id),
                                "SAFETY: {:?} deleted {key} of {:?}",
                                self.me,
                                w.owners.get(&key)
                            );
                        }
                        w.kvs.remove(&key);
                        w.owners.remove(&key);
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
            listing: listing.map(Into::into),
        };
        if fault == Some(Fault::Txn(true)) {
            return Err(StoreError::Unavailable("timeout (applied)".into()));
        }
        Ok(outcome)
    }

    async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().unwrap();
        let fault = w.fault(self.agent, |f| matches!(f, Fault::Grant(_)));
        if fault == Some(Fault::Grant(false)) {
            return Err(StoreError::Unavailable("grant timed out".into()));
        }
        w.next_lease += 1;
        let id = w.next_lease;
        let exp = w.now + ttl;
        w.leases.insert(id, exp);
        if fault == Some(Fault::Grant(true)) {
            // Granted, but the answer was lost: the lease just expires.
            return Err(StoreError::Unavailable("grant timed out (applied)".into()));
        }
        Ok(id)
    }

    fn pause(&self, _: Duration) -> impl Future<Output = ()> + Send {
        YieldOnce(false)
    }
}

type Outcome = (Result<HeldLease, AcquireError>, AcquireStats, Option<i64>);

struct Node {
    store: MemStore,
    preferred: Option<Subnets>,
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
        let mac = MacAddr::derived(me.node_id.as_bytes());
        let value = match (me.public_ip, me.public_ipv6) {
            (Some(v4), None) => LeaseAttrs::vxlan(v4, 1, mac, &me.node_id),
            (None, Some(v6)) => LeaseAttrs::vxlan_v6_only(v6, 1, mac, &me.node_id),
            (Some(v4), Some(v6)) => LeaseAttrs::vxlan(v4, 1, mac, &me.node_id).with_v6(v6, 1, mac),
            (None, None) => unreachable!("a node has a VTEP of some family"),
        };
        let req = AcquireRequest {
            subnets_prefix: PREFIX,
            config: &cfg,
            me: &me,
            value: &value,
            ttl: TTL,
            preferred,
            lease_id: None,
            not_from: &[],
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        acquire(&store, &req, &mut rng).await
    }));
}

/// Polls one agent's acquisition once; checks what it returns.
fn step(node: &mut Node, world: &Arc<Mutex<World>>, cfg: &NetworkConfig) {
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
                may_put(&w.owners, &node.store.me, &held.key),
                "{:?} acquired {}, created by {:?}",
                node.store.me,
                held.key,
                w.owners.get(&held.key)
            );
            // Its subnets overlap no other key's inside the network.
            for (key, _) in w.kvs.iter().filter(|(k, _)| **k != held.key) {
                let Ok(other) = parse_key(key.strip_prefix(PREFIX).unwrap()) else {
                    continue;
                };
                assert!(
                    !overlaps_in(cfg, &other, &held.subnet),
                    "{} acquired {} overlapping {key}",
                    node.store.me.node_id,
                    held.subnet
                );
            }
            node.preferred = Some(held.subnet);
            node.held = Some(held);
        }
    }
}

#[derive(Clone, Debug)]
enum Action {
    Step(usize),
    /// A fault in one of the agent's next calls.
    Fault(usize, Fault),
    Tick(i64),
    Pause(usize),
    Resume(usize),
    Crash(usize),
    /// The agent notices its key is gone or no longer its own, and re-acquires.
    Notice(usize),
    /// An operator deletes the n-th key.
    DeleteKey(usize),
    /// The agent restarts with a subnet file naming the k-th IPv4 subnet
    /// and the j-th IPv6 subnet (stale, edited, or copied from a clone).
    StaleFile(usize, u64, u64),
}

fn action(n: usize) -> impl Strategy<Value = Action> {
    prop_oneof![
        10 => (0..n).prop_map(Action::Step),
        1 => (0..n, any::<bool>()).prop_map(|(a, b)| Action::Fault(a, Fault::Txn(b))),
        1 => (0..n).prop_map(|a| Action::Fault(a, Fault::List)),
        1 => (0..n, any::<bool>()).prop_map(|(a, b)| Action::Fault(a, Fault::Grant(b))),
        2 => (1i64..6).prop_map(Action::Tick),
        1 => (0..n).prop_map(Action::Pause),
        1 => (0..n).prop_map(Action::Resume),
        1 => (0..n).prop_map(Action::Crash),
        2 => (0..n).prop_map(Action::Notice),
        1 => (0usize..8).prop_map(Action::DeleteKey),
        1 => (0..n, 0u64..8, 0u64..8).prop_map(|(a, k, j)| Action::StaleFile(a, k, j)),
    ]
}

/// Whether two networks share an address (the oracle's own arithmetic).
fn overlaps(a: &ipnet::Ipv4Net, b: &ipnet::Ipv4Net) -> bool {
    let (a0, a1) = (u32::from(a.network()), u32::from(a.broadcast()));
    let (b0, b1) = (u32::from(b.network()), u32::from(b.broadcast()));
    a0 <= b1 && b0 <= a1
}

fn overlaps6(a: &ipnet::Ipv6Net, b: &ipnet::Ipv6Net) -> bool {
    let (a0, a1) = (u128::from(a.network()), u128::from(a.broadcast()));
    let (b0, b1) = (u128::from(b.network()), u128::from(b.broadcast()));
    a0 <= b1 && b0 <= a1
}

/// Whether `a` and `b` share an address in a family of the network, inside
/// the network (keys outside it take nothing).
fn overlaps_in(cfg: &NetworkConfig, a: &Subnets, b: &Subnets) -> bool {
    let v4 = match (cfg.network(), a.v4, b.v4) {
        (Some(n), Some(x), Some(y)) => n.contains(&x) && n.contains(&y) && overlaps(&x, &y),
        _ => false,
    };
    let v6 = match (cfg.ipv6_network(), a.v6, b.v6) {
        (Some(n), Some(x), Some(y)) => n.contains(&x) && n.contains(&y) && overlaps6(&x, &y),
        _ => false,
    };
    v4 || v6
}

/// Every two agents that still hold their key hold disjoint subnets. An
/// agent holds its key while the key is the one it acquired, carries its
/// etcd lease and names it (a reservation has no lease: a machine at the
/// same address that took it over holds it now).
fn no_two_holders_overlap(nodes: &[Node], world: &Arc<Mutex<World>>, cfg: &NetworkConfig) {
    let w = world.lock().unwrap();
    let holding: Vec<&HeldLease> = nodes
        .iter()
        .filter_map(|n| Some((n, n.held.as_ref()?)))
        .filter(|(n, h)| {
            w.kvs.get(&h.key).is_some_and(|kv| {
                kv.create_revision == h.create_revision
                    && kv.lease == h.lease_id
                    && LeaseAttrs::parse(&kv.value)
                        .is_ok_and(|a| a.node_id.as_deref() == Some(&n.store.me.node_id))
            })
        })
        .map(|(_, h)| h)
        .collect();
    for (i, a) in holding.iter().enumerate() {
        for b in &holding[i + 1..] {
            assert!(
                !overlaps_in(cfg, &a.subnet, &b.subnet),
                "two holders of overlapping subnets: {} ({}) and {} ({})",
                a.key,
                a.subnet,
                b.key,
                b.subnet
            );
        }
    }
}

/// Puts a key no agent may take (the oracle owns it as foreign).
fn junk(world: &Arc<Mutex<World>>, key: &str, value: &[u8]) {
    let mut w = world.lock().unwrap();
    w.rev += 1;
    let rev = w.rev;
    let key = format!("{PREFIX}{key}");
    w.owners.insert(key.clone(), Owner::Foreign);
    w.kvs.insert(
        key.clone(),
        KeyValue {
            key,
            value: value.to_vec(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        },
    );
}

/// The address families of the network a schedule runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Families {
    V4,
    Dual,
    V6,
}

fn network(families: Families, small: bool) -> NetworkConfig {
    let v4 = if small {
        r#""Network":"10.9.0.0/28""#
    } else {
        r#""Network":"10.9.0.0/27""#
    };
    // Small: 3 subnets of each family; large: 7 IPv4 and 15 IPv6 subnets.
    let v6 = if small {
        r#""EnableIPv6":true,"IPv6Network":"fd00:9::/124""#
    } else {
        r#""EnableIPv6":true,"IPv6Network":"fd00:9::/120","IPv6SubnetLen":124"#
    };
    let fields = match families {
        Families::V4 => v4.to_string(),
        Families::Dual => format!("{v4},{v6}"),
        Families::V6 => format!(r#""EnableIPv4":false,{v6}"#),
    };
    NetworkConfig::parse(format!(r#"{{{fields},"Backend":{{"Type":"vxlan"}}}}"#).as_bytes())
        .unwrap()
}

/// The subnets a stale subnet file names: the k-th IPv4 and the j-th IPv6
/// subnet of the network (or the network's first, when out of range).
fn stale_pair(cfg: &NetworkConfig, k: u64, j: u64) -> Subnets {
    Subnets {
        v4: cfg.ipv4.as_ref().and_then(|p| p.nth(k).or(p.nth(0))),
        v6: cfg.ipv6.as_ref().and_then(|p| p.nth(j).or(p.nth(0))),
    }
}

fn put_reservation(world: &Arc<Mutex<World>>, cfg: &NetworkConfig) {
    // An operator's reservation for node 0's address, on a pair no
    // Weft node would choose (the last IPv4 subnet with the first IPv6 one).
    let v4 = cfg
        .ipv4
        .as_ref()
        .map(|p| p.nth(p.subnet_count() - 1).unwrap());
    let v6 = cfg.ipv6.as_ref().map(|p| p.nth(0).unwrap());
    let key = format!("{PREFIX}{}", Subnets { v4, v6 }.key());
    let (value, owner): (&[u8], IpAddr) = if v4.is_some() {
        (
            br#"{"PublicIP":"198.18.0.1"}"#,
            Ipv4Addr::new(198, 18, 0, 1).into(),
        )
    } else {
        (
            br#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:18::1"}"#,
            "fd00:18::1".parse::<Ipv6Addr>().unwrap().into(),
        )
    };
    let mut w = world.lock().unwrap();
    w.rev += 1;
    let rev = w.rev;
    w.kvs.insert(
        key.clone(),
        KeyValue {
            key: key.clone(),
            value: value.to_vec(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        },
    );
    w.owners.insert(key, Owner::Reservation(owner));
}

fn run(
    n: usize,
    families: Families,
    small: bool,
    reservation: bool,
    junk_keys: bool,
    actions: Vec<Action>,
) {
    let cfg = network(families, small);
    let world = Arc::new(Mutex::new(World::default()));
    if reservation {
        put_reservation(&world, &cfg);
    }
    if junk_keys {
        // A supernet key must not make every subnet look taken; a /31
        // inside the network takes its /30 whatever it holds, and so does
        // an IPv6 key narrower than the pool's subnets (a wider key takes
        // what it overlaps only when it holds a lease: see leases.rs).
        junk(&world, "0.0.0.0-0", br#"{"PublicIP":"198.18.0.9"}"#);
        junk(&world, "10.9.0.4-31", b"not json");
        junk(&world, "0.0.0.0-0&fd00:9::8-127", b"not json");
    }
    // Nodes 0 and 1 are clones: same addresses, different node ids.
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| {
            let k = if i == 1 { 1 } else { 1 + i as u8 };
            let v4 = Ipv4Addr::new(198, 18, 0, k);
            let v6: Ipv6Addr = format!("fd00:18::{k}").parse().unwrap();
            let (public_ip, public_ipv6) = match families {
                Families::V4 => (Some(v4), None),
                Families::Dual => (Some(v4), Some(v6)),
                Families::V6 => (None, Some(v6)),
            };
            Node {
                store: MemStore {
                    world: world.clone(),
                    agent: i,
                    me: Identity {
                        node_id: format!("node-{i}"),
                        public_ip,
                        public_ipv6,
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
            Action::Step(i) if !nodes[i].paused => step(&mut nodes[i], &world, &cfg),
            Action::Step(_) => {}
            Action::Fault(i, f) => {
                world.lock().unwrap().faults.entry(i).or_default().push(f);
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
                let me = nodes[i].store.me.node_id.clone();
                let lost = nodes[i].held.as_ref().is_some_and(|h| {
                    let w = world.lock().unwrap();
                    w.kvs.get(&h.key).is_none_or(|kv| {
                        kv.create_revision != h.create_revision
                            || kv.lease != h.lease_id
                            || LeaseAttrs::parse(&kv.value)
                                .is_ok_and(|a| a.node_id.as_deref() != Some(&me))
                    })
                });
                if lost && !nodes[i].paused {
                    start(&mut nodes[i], &cfg);
                }
            }
            Action::StaleFile(i, k, j) => {
                nodes[i].paused = false;
                nodes[i].preferred = Some(stale_pair(&cfg, k, j));
                start(&mut nodes[i], &cfg);
            }
            Action::DeleteKey(k) => {
                let mut w = world.lock().unwrap();
                if let Some(key) = w.kvs.keys().nth(k).cloned() {
                    w.rev += 1;
                    w.kvs.remove(&key);
                    w.owners.remove(&key);
                }
            }
        }
        no_two_holders_overlap(&nodes, &world, &cfg);
    }

    // Let everyone finish.
    for node in nodes.iter_mut() {
        node.paused = false;
        for _ in 0..10_000 {
            if node.running.is_none() {
                break;
            }
            step(node, &world, &cfg);
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
        families in prop_oneof![Just(Families::V4), Just(Families::Dual), Just(Families::V6)],
        small in any::<bool>(),
        reservation in any::<bool>(),
        junk_keys in any::<bool>(),
        actions in prop::collection::vec(action(5), 0..250),
    ) {
        let actions: Vec<Action> = actions
            .into_iter()
            .filter(|a| !matches!(a, Action::Step(i) | Action::Fault(i, _) | Action::Pause(i) | Action::Resume(i) | Action::Crash(i) | Action::Notice(i) | Action::StaleFile(i, _, _) if *i >= n))
            .collect();
        run(n, families, small, reservation, junk_keys, actions);
    }
}
