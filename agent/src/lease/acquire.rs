//! Fenced subnet acquisition.
//!
//! No two nodes can ever hold the same subnet because no write of ours can
//! touch a key that is not ours:
//!
//! - a new subnet is taken only by *creating* its key (`create_revision == 0`),
//!   attached to our etcd lease;
//! - an existing key is rewritten only if its value names our PublicIP and our
//!   node id (or it is an operator's reservation for our PublicIP, or
//!   flannel's lease for it), or names our PublicIP under another node id
//!   (a machine replaced at the same address, as flannel reuses the lease of
//!   its PublicIP), and only if it is still exactly the version we read
//!   (`mod_revision` compare); two live nodes that claim one address are
//!   caught by the holder, which stops taking the other's lease back;
//! - the subnet from the local subnet file is a *preference*: it is tried
//!   through create-if-absent and never used to update an existing key
//!   (flannel's bug #1289: a node coming back wrote its old subnet over
//!   another node's lease);
//! - a write whose outcome is unknown (timeout) is reconciled by reading again:
//!   a key naming us with our current lease is ours, so one node never leaves
//!   two keys behind.
//!
//! An attempt costs one read of the subnets prefix, one transaction, and one
//! lease grant; a lost race costs one more transaction, because a failed
//! transaction returns a fresh read of the prefix in the same round trip.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipnet::{Ipv4Net, Ipv6Net};
use rand::{Rng, seq::IndexedRandom as _};
use thiserror::Error;

use super::{
    attrs::LeaseAttrs,
    config::NetworkConfig,
    key::{Subnets, parse_key},
    pool::{self, Ipv4Pool, Ipv6Pool, Net, Pool},
    store::{Compare, KeyValue, Op, Page, Store, StoreError},
};
use crate::backoff::Backoff;

/// Who we are, as written in our lease: a VTEP address per family the
/// network has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub node_id: String,
    /// Our IPv4 VTEP address; None on an IPv6-only node.
    pub public_ip: Option<Ipv4Addr>,
    /// Our IPv6 VTEP address, when the network has IPv6.
    pub public_ipv6: Option<Ipv6Addr>,
}

impl Identity {
    /// The address our leases are known by (see `LeaseAttrs::node_addr`):
    /// the IPv4 VTEP, else the IPv6 one (flannel writes `0.0.0.0` as the
    /// PublicIP of an IPv6-only lease).
    pub fn addr(&self) -> IpAddr {
        match (self.public_ip, self.public_ipv6) {
            (Some(v4), _) => IpAddr::V4(v4),
            (None, Some(v6)) => IpAddr::V6(v6),
            (None, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        }
    }
}

/// The subnets we hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLease {
    pub subnet: Subnets,
    pub key: String,
    /// Our etcd lease; 0 when we hold an operator's reservation (no TTL).
    pub lease_id: i64,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub attrs: LeaseAttrs,
    /// The node id the key named before we took it over (it named our
    /// PublicIP under that id: a replaced machine).
    pub taken_from: Option<String>,
}

impl HeldLease {
    pub fn is_reservation(&self) -> bool {
        self.lease_id == 0
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AcquireError {
    #[error(
        "out of subnets: all {total} subnets from {min} to {max} are taken ({leased} by leases, {reserved} by reservations, {other} by other keys)"
    )]
    OutOfSubnets {
        total: u64,
        leased: u64,
        reserved: u64,
        other: u64,
        min: IpAddr,
        max: IpAddr,
    },
    #[error("lost {0} races for a free subnet in a row")]
    Contended(u32),
    #[error(
        "the lease {key} names this node's public IP for node {node:?}, a live node that claims this address too"
    )]
    Conflict { node: String, key: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What one acquisition cost, for logs and the lease benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcquireStats {
    pub requests: u32,
    /// Transactions that lost a race or whose outcome had to be re-read.
    pub retries: u32,
}

/// Everything one acquisition needs.
pub struct AcquireRequest<'a> {
    /// `<prefix>/subnets/`.
    pub subnets_prefix: &'a str,
    pub config: &'a NetworkConfig,
    pub me: &'a Identity,
    /// The value we write (must name `me`).
    pub value: &'a LeaseAttrs,
    /// TTL of the etcd lease we attach, in seconds.
    pub ttl: i64,
    /// The subnets we would like (from the subnet file, or the ones we held).
    pub preferred: Option<Subnets>,
    /// An etcd lease we already hold and may attach (None: grant one).
    pub lease_id: Option<i64>,
    /// Node ids whose leases of our PublicIP we must not take over: live
    /// nodes that claim our address too (a conflict, see the holder).
    pub not_from: &'a [String],
}

/// The wait after a lost race: random, up to 10 ms, 20 ms, ... 320 ms.
const RACE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(320));

/// Lost races before giving up this round (the caller retries later).
pub(super) const MAX_ATTEMPTS: u32 = 10;

/// How many of the first free subnets a new subnet is drawn from (flannel
/// draws from 100; a wider window halves lost races when many nodes start
/// at once, see `cargo xtask bench leases`).
const CANDIDATES: usize = 256;

/// One key under the subnets prefix, parsed.
#[derive(Clone, Debug)]
struct Entry {
    subnet: Option<Subnets>,
    kv: KeyValue,
    attrs: Option<LeaseAttrs>,
}

/// What to do next, given a read of the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Plan {
    /// The key is already ours exactly as we want it.
    Adopt(KeyValue, Subnets),
    /// Rewrite our own key (or our reservation, or the key of a replaced
    /// machine at our address: `from`) if unchanged since we read it.
    Reclaim {
        kv: KeyValue,
        subnet: Subnets,
        reservation: bool,
        from: Option<String>,
    },
    /// Create free subnets' key.
    Create(Subnets),
    OutOfSubnets(AcquireError),
    /// A live node that claims our address holds its lease.
    Conflict(AcquireError),
}

#[cfg(test)]
fn parse_listing(prefix: &str, listing: &super::store::Listing) -> Vec<Entry> {
    listing
        .kvs
        .iter()
        .filter_map(|kv| entry(prefix, kv.clone(), None))
        .collect()
}

/// A key as the plan sees it: None for a key that names no subnet (the
/// plan never looks at one). Of a value, only its parse is kept, and its
/// bytes only where the key may be ours (it names `me`'s address; None:
/// always), so a read of many large junk values costs their parse, not
/// their size.
fn entry(prefix: &str, mut kv: KeyValue, me: Option<&Identity>) -> Option<Entry> {
    let subnet = kv
        .key
        .strip_prefix(prefix)
        .and_then(|s| parse_key(s).ok())?;
    let attrs = LeaseAttrs::parse(&kv.value).ok();
    if let Some(me) = me
        && attrs.as_ref().is_none_or(|a| a.node_addr() != me.addr())
    {
        kv.value = Vec::new();
    }
    Some(Entry {
        subnet: Some(subnet),
        attrs,
        kv,
    })
}

/// Reads the subnets prefix page by page (from `first`, a page a failed
/// transaction returned, when given) into entries, each page parsed and
/// dropped before the next is read.
async fn read_entries<S: Store>(
    store: &S,
    req: &AcquireRequest<'_>,
    first: Option<Page>,
    stats: &mut AcquireStats,
) -> Result<Vec<Entry>, StoreError> {
    let prefix = req.subnets_prefix;
    let mut page = match first {
        Some(p) => p,
        None => {
            stats.requests += 1;
            store.list_page(prefix, prefix.as_bytes(), 0).await?
        }
    };
    let mut entries = Vec::new();
    loop {
        let revision = page.revision;
        entries.extend(
            page.kvs
                .into_iter()
                .filter_map(|kv| entry(prefix, kv, Some(req.me))),
        );
        if !page.more {
            return Ok(entries);
        }
        stats.requests += 1;
        page = store.list_page(prefix, &page.next, revision).await?;
    }
}

/// Why a key is ours to rewrite.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Claim {
    /// It names our node id and PublicIP.
    Own,
    /// No node id: an operator's reservation for our PublicIP, or a lease
    /// flannel wrote for it (a node moving from flannel to Weft takes it
    /// over).
    Unnamed,
    /// Our PublicIP under another node id: the machine that held it was
    /// replaced (reinstalled, its address reused, its machine-id new).
    Replaced(String),
}

/// Whether `e` is a key we may rewrite, and why (see [`Claim`]). Only keys
/// that fit the config (flannel's `isSubnetConfigCompat`: `SubnetLen`,
/// between `SubnetMin` and `SubnetMax`) are ever reclaimed, and never a
/// key of a node in `not_from`.
fn claim(e: &Entry, me: &Identity, cfg: &NetworkConfig, not_from: &[String]) -> Option<Claim> {
    let a = e.attrs.as_ref()?;
    let subnet = e.subnet?;
    if a.node_addr() != me.addr() || !cfg.is_assignable(&subnet) {
        return None;
    }
    match &a.node_id {
        Some(n) if *n == me.node_id => Some(Claim::Own),
        Some(n) if not_from.contains(n) => None,
        Some(n) => Some(Claim::Replaced(n.clone())),
        None => Some(Claim::Unnamed),
    }
}

/// The first key naming our PublicIP under a node of `not_from`, if any.
fn conflicting<'a>(
    entries: &'a [Entry],
    me: &Identity,
    cfg: &NetworkConfig,
    not_from: &[String],
) -> Option<(&'a Entry, String)> {
    entries.iter().find_map(|e| {
        let a = e.attrs.as_ref()?;
        let n = a.node_id.as_ref()?;
        let fits = e.subnet.is_some_and(|s| cfg.is_assignable(&s));
        (a.node_addr() == me.addr() && fits && not_from.contains(n)).then(|| (e, n.clone()))
    })
}

fn plan(
    req: &AcquireRequest<'_>,
    entries: &[Entry],
    lease_id: Option<i64>,
    rng: &mut impl Rng,
) -> (Plan, Vec<KeyValue>) {
    let value = req.value.to_json().into_bytes();
    let mut ours: Vec<(&Entry, Claim)> = entries
        .iter()
        .filter_map(|e| Some((e, claim(e, req.me, req.config, req.not_from)?)))
        .collect();
    // Preference: an operator's reservation, then the preferred subnet, then
    // the key most recently written; a replaced machine's key only when
    // nothing else names us, the oldest first (the one every node takes
    // for our address).
    ours.sort_by_key(|(e, c)| {
        let replaced = matches!(c, Claim::Replaced(_));
        (
            replaced,
            if replaced { e.kv.create_revision } else { 0 },
            e.kv.lease != 0,
            e.subnet != req.preferred,
            std::cmp::Reverse(e.kv.mod_revision),
        )
    });
    if let Some((chosen, how)) = ours.first() {
        let subnet = chosen.subnet.expect("claim checked the key");
        // Other leased keys naming this node are leftovers: remove them.
        // Reservations, flannel's keys and other nodes' keys are never
        // removed.
        let extras = ours[1..]
            .iter()
            .filter(|(e, c)| *c == Claim::Own && e.kv.lease != 0)
            .map(|(e, _)| e.kv.clone())
            .collect();
        let reservation = chosen.kv.lease == 0;
        let current =
            chosen.kv.value == value && (reservation || Some(chosen.kv.lease) == lease_id);
        let plan = if current {
            Plan::Adopt(chosen.kv.clone(), subnet)
        } else {
            Plan::Reclaim {
                kv: chosen.kv.clone(),
                subnet,
                reservation,
                from: match how {
                    Claim::Replaced(n) => Some(n.clone()),
                    _ => None,
                },
            }
        };
        return (plan, extras);
    }
    // A live node that claims our address holds a lease for it: no second
    // lease for the address (every other node would reject it), but wait
    // for that one to go.
    if let Some((e, node)) = conflicting(entries, req.me, req.config, req.not_from) {
        return (
            Plan::Conflict(AcquireError::Conflict {
                node,
                key: e.kv.key.clone(),
            }),
            Vec::new(),
        );
    }

    // Nothing of ours: every existing key inside the network takes the
    // subnets it overlaps, in each family: reservations, malformed values
    // and narrower keys whatever they hold, wider keys (another SubnetLen)
    // where they hold a lease (see `Taken::new`); a key no config of the
    // network could have handed out (the network itself, a supernet such
    // as 0.0.0.0-0) is not a claim on every subnet.
    let cfg = req.config;
    let taken = Taken::new(cfg, entries);
    if let Some(p) = req.preferred
        && let Some(p) = preferred_fenced(cfg, p)
        && taken.is_free(&p)
    {
        return (Plan::Create(p), Vec::new());
    }
    match taken.free_subnets().choose(rng) {
        Some(s) => (Plan::Create(*s), Vec::new()),
        None => {
            let in_range: Vec<&Entry> = entries
                .iter()
                .filter(|e| e.subnet.is_some_and(|s| cfg.is_assignable(&s)))
                .collect();
            let leased = in_range.iter().filter(|e| e.kv.lease != 0).count() as u64;
            let reserved = in_range.iter().filter(|e| e.kv.lease == 0).count() as u64;
            let (total, min, max) = pool_extent(cfg);
            (
                Plan::OutOfSubnets(AcquireError::OutOfSubnets {
                    total,
                    leased,
                    reserved,
                    other: total.saturating_sub(leased + reserved),
                    min,
                    max,
                }),
                Vec::new(),
            )
        }
    }
}

/// The subnets the keys under the prefix take, in each family's pool
/// (see [`Pool::taken_by`]).
struct Taken {
    v4: Option<(Ipv4Pool, pool::Taken)>,
    v6: Option<(Ipv6Pool, pool::Taken)>,
}

impl Taken {
    fn new(cfg: &NetworkConfig, entries: &[Entry]) -> Self {
        // A key takes what it overlaps whatever it holds when it is no
        // wider than the pool's subnets (its own subnet, or the one it lies
        // in: it is never written over). A wider key (a node of an older,
        // shorter SubnetLen) takes every subnet it overlaps only where its
        // value is a lease: four keys of a quarter of the network each
        // with a junk value, anyone's to write, would otherwise take the
        // whole pool.
        let half = |len: u8, leased: bool, own: u8| leased || len >= own;
        let v4: Vec<Ipv4Net> = entries
            .iter()
            .filter_map(|e| Some((e.subnet?.v4?, e.attrs.is_some())))
            .filter(|(n, leased)| {
                cfg.ipv4
                    .as_ref()
                    .is_some_and(|p| half(n.prefix_len(), *leased, p.subnet_len))
            })
            .map(|(n, _)| n)
            .collect();
        let v6: Vec<Ipv6Net> = entries
            .iter()
            .filter_map(|e| Some((e.subnet?.v6?, e.attrs.is_some())))
            .filter(|(n, leased)| {
                cfg.ipv6
                    .as_ref()
                    .is_some_and(|p| half(n.prefix_len(), *leased, p.subnet_len))
            })
            .map(|(n, _)| n)
            .collect();
        Taken {
            v4: cfg.ipv4.clone().map(|p| {
                let t = p.taken(v4.iter());
                (p, t)
            }),
            v6: cfg.ipv6.clone().map(|p| {
                let t = p.taken(v6.iter());
                (p, t)
            }),
        }
    }

    /// Whether each half of `s` is a free subnet of its pool.
    fn is_free(&self, s: &Subnets) -> bool {
        fn half<N: Net>(pool: &Option<(Pool<N>, pool::Taken)>, n: Option<N>) -> bool {
            match (pool, n) {
                (Some((p, t)), Some(n)) => p.index(&n).is_some_and(|i| t.is_free(i)),
                (None, None) => true,
                _ => false,
            }
        }
        half(&self.v4, s.v4) && half(&self.v6, s.v6)
    }

    /// The first free subnets (up to [`CANDIDATES`]) a new lease is drawn
    /// from. A dual-stack lease takes the IPv6 subnet of the same index as
    /// its IPv4 subnet: the create-if-absent transaction fences the key,
    /// and with every Weft node pairing subnets the same way, a unique IPv4
    /// half makes the IPv6 half unique too (two keys `A&X` and `B&X` can
    /// never both be created by Weft nodes). The search costs as many steps
    /// as there are keys, however large the pools.
    fn free_subnets(&self) -> Vec<Subnets> {
        let pools: Vec<&pool::Taken> = [
            self.v4.as_ref().map(|(_, t)| t),
            self.v6.as_ref().map(|(_, t)| t),
        ]
        .into_iter()
        .flatten()
        .collect();
        let count = [
            self.v4.as_ref().map(|(p, _)| p.subnet_count()),
            self.v6.as_ref().map(|(p, _)| p.subnet_count()),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0);
        pool::free_in_all(&pools, count, CANDIDATES)
            .into_iter()
            .map(|i| Subnets {
                v4: self.v4.as_ref().and_then(|(p, _)| p.nth(i)),
                v6: self.v6.as_ref().and_then(|(p, _)| p.nth(i)),
            })
            .collect()
    }
}

/// The subnets a preference may be created as: only what this config can
/// hand out, and for a dual-stack lease only the pairing every Weft node
/// uses (the preferred IPv4 subnet with its own IPv6 subnet), so a stale
/// subnet file can never create a second key for an IPv6 subnet.
fn preferred_fenced(cfg: &NetworkConfig, p: Subnets) -> Option<Subnets> {
    match (&cfg.ipv4, &cfg.ipv6) {
        (Some(p4), Some(p6)) => {
            let i = p4.index(&p.v4?)?;
            Some(Subnets {
                v4: p.v4,
                v6: Some(p6.nth(i)?),
            })
        }
        _ => cfg.is_assignable(&p).then_some(p),
    }
}

/// How many leases the config can hand out, and the first and last
/// subnet's address (IPv4 when the network has it).
fn pool_extent(cfg: &NetworkConfig) -> (u64, IpAddr, IpAddr) {
    match (&cfg.ipv4, &cfg.ipv6) {
        (Some(p4), v6) => (
            v6.as_ref().map_or(p4.subnet_count(), |p6| {
                p4.subnet_count().min(p6.subnet_count())
            }),
            p4.subnet_min.into(),
            p4.subnet_max.into(),
        ),
        (None, Some(p6)) => (
            p6.subnet_count(),
            p6.subnet_min.into(),
            p6.subnet_max.into(),
        ),
        (None, None) => (
            0,
            Ipv4Addr::UNSPECIFIED.into(),
            Ipv4Addr::UNSPECIFIED.into(),
        ),
    }
}

/// Acquires a subnet. Returns the held lease and the etcd lease id granted
/// (if any) along the way, even on failure, so the caller can reuse it.
pub async fn acquire<S: Store>(
    store: &S,
    req: &AcquireRequest<'_>,
    rng: &mut (impl Rng + Send),
) -> (Result<HeldLease, AcquireError>, AcquireStats, Option<i64>) {
    let mut stats = AcquireStats::default();
    let mut lease_id = req.lease_id;
    let r = acquire_inner(store, req, rng, &mut stats, &mut lease_id).await;
    (r, stats, lease_id)
}

async fn acquire_inner<S: Store>(
    store: &S,
    req: &AcquireRequest<'_>,
    rng: &mut (impl Rng + Send),
    stats: &mut AcquireStats,
    lease_id: &mut Option<i64>,
) -> Result<HeldLease, AcquireError> {
    let prefix = req.subnets_prefix;
    let value = req.value.to_json().into_bytes();
    let mut entries = read_entries(store, req, None, stats).await?;

    for attempt in 0..MAX_ATTEMPTS {
        let (plan, extras) = plan(req, &entries, *lease_id, rng);
        let (key, subnet, compare, attach, reservation, create_rev, from) = match plan {
            Plan::OutOfSubnets(e) | Plan::Conflict(e) => return Err(e),
            Plan::Adopt(kv, subnet) => {
                remove_extras(store, &extras, stats).await;
                return Ok(HeldLease {
                    subnet,
                    key: kv.key,
                    lease_id: kv.lease,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    attrs: req.value.clone(),
                    taken_from: None,
                });
            }
            Plan::Reclaim {
                kv,
                subnet,
                reservation,
                from,
            } => (
                kv.key.clone(),
                subnet,
                Compare::ModRevision(kv.key.clone(), kv.mod_revision),
                !reservation,
                reservation,
                Some(kv.create_revision),
                from,
            ),
            Plan::Create(subnet) => {
                let key = format!("{prefix}{}", subnet.key());
                (
                    key.clone(),
                    subnet,
                    Compare::CreateRevision(key, 0),
                    true,
                    false,
                    None,
                    None,
                )
            }
        };
        let lease = if attach {
            match *lease_id {
                Some(id) => id,
                None => {
                    stats.requests += 1;
                    let id = store.grant(req.ttl).await?;
                    *lease_id = Some(id);
                    id
                }
            }
        } else {
            0
        };
        stats.requests += 1;
        let put = Op::Put {
            key: key.clone(),
            value: value.clone(),
            lease,
        };
        match store.txn(vec![compare], vec![put], Some(prefix)).await {
            Ok(o) if o.succeeded => {
                remove_extras(store, &extras, stats).await;
                return Ok(HeldLease {
                    subnet,
                    key,
                    lease_id: if reservation { 0 } else { lease },
                    create_revision: create_rev.unwrap_or(o.revision),
                    mod_revision: o.revision,
                    attrs: req.value.clone(),
                    taken_from: from,
                });
            }
            Ok(o) => {
                stats.retries += 1;
                entries = read_entries(store, req, o.listing, stats).await?;
                tracing::debug!(%subnet, attempt, "lost the race for a subnet; choosing again");
                store.pause(RACE_BACKOFF.jittered(attempt, rng)).await;
            }
            Err(e) => {
                // The write may have been applied: read again and let the
                // plan find our key if it was.
                tracing::warn!(%subnet, error = %e, "lease write outcome unknown; re-reading");
                stats.retries += 1;
                store.pause(RACE_BACKOFF.jittered(attempt, rng)).await;
                entries = read_entries(store, req, None, stats).await?;
            }
        }
    }
    Err(AcquireError::Contended(MAX_ATTEMPTS))
}

async fn remove_extras<S: Store>(store: &S, extras: &[KeyValue], stats: &mut AcquireStats) {
    for kv in extras {
        stats.requests += 1;
        let r = store
            .txn(
                vec![Compare::ModRevision(kv.key.clone(), kv.mod_revision)],
                vec![Op::Delete {
                    key: kv.key.clone(),
                }],
                None,
            )
            .await;
        match r {
            Ok(o) if o.succeeded => {
                tracing::info!(key = %kv.key, "removed a leftover lease of this node")
            }
            Ok(_) => tracing::debug!(key = %kv.key, "leftover lease changed meanwhile; left alone"),
            Err(e) => {
                tracing::warn!(key = %kv.key, error = %e, "could not remove a leftover lease")
            }
        }
    }
}

#[cfg(test)]
#[path = "acquire_tests.rs"]
mod tests;
