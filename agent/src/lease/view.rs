//! The one place that decides what each lease in etcd is to this node: our
//! own, a peer, or rejected (with a reason).
//!
//! The watch feeds etcd's changes in; the view keeps every lease (its
//! cache, the one copy on the node) and decides. A verdict depends on the
//! lease itself and on the leases it contends with for a subnet, a VTEP
//! address or a WireGuard key (the older wins), and on theirs in turn: a
//! change is decided again over that set only (its contenders, found
//! through an index), so a lease put and deleted every few milliseconds
//! beside 50,000 others costs the work of a handful, and a rejected lease
//! is still re-evaluated whenever it or a rival changes. After a fresh list,
//! or when our own subnet changes, every lease is decided again; a key that
//! stops being ours (taken by another node after our lease was lost) then
//! becomes that node's peer as soon as we hold another subnet.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use ipnet::IpNet;

use super::{
    acquire::{HeldLease, Identity},
    cache::{Change, Lease, LeaseCache, LeaseEvent, Skipped, Snapshot},
    config::NetworkConfig,
    key::Subnets,
    validate::{Rejection, check},
};
use crate::{
    metrics::Metrics,
    peer::{Peer, PeerUpdate},
    wgkey::WgKey,
};

/// Our lease is gone.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Lost {
    pub(crate) why: String,
    /// The node id our key names now, if another node took it.
    pub(crate) to: Option<String>,
}

/// What a batch of lease events means for this node.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// What the dataplane must change, in order.
    pub(crate) updates: Vec<PeerUpdate>,
    /// Our lease is gone, and why.
    pub(crate) lost: Option<Lost>,
    /// The events added up to etcd's state at this revision.
    pub(crate) synced: Option<i64>,
}

/// What two leases may contend for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Contended {
    Subnet(IpNet),
    Vtep(IpAddr),
    Key(WgKey),
}

fn contended(peers: &[Peer]) -> impl Iterator<Item = Contended> + '_ {
    peers.iter().flat_map(|p| {
        [Contended::Subnet(p.subnet), Contended::Vtep(p.vtep)]
            .into_iter()
            .chain(p.key.map(Contended::Key))
    })
}

/// A lease that passed its own checks: it is a peer unless an older lease
/// takes what it claims.
struct Candidate {
    peers: Vec<Peer>,
    /// The subnets it won (all of its peers', or none).
    won: bool,
}

pub(crate) struct LeaseView {
    config: NetworkConfig,
    me: Identity,
    held: Option<HeldLease>,
    /// Every lease: the one copy.
    leases: LeaseCache,
    /// The peers the dataplane was told about.
    peers: HashMap<IpNet, Peer>,
    /// Leases rejected, with the revision the rejection was logged at.
    rejected: HashMap<Arc<str>, (Rejection, i64)>,
    /// How many are rejected, by reason.
    rejected_counts: BTreeMap<&'static str, u64>,
    /// The leases that passed their own checks, by key.
    candidates: HashMap<Arc<str>, Candidate>,
    /// The candidates that claim each thing.
    index: HashMap<Contended, Vec<Arc<str>>>,
    metrics: Arc<Metrics>,
    /// Between a [`LeaseEvent::Listing`] and its [`LeaseEvent::Synced`]:
    /// the set is incomplete, deciding waits (one decision for a list of
    /// 50,000 leases, not one per batch of events).
    listing: bool,
    /// Leases decided (checked and ordered) so far, for the tests of how
    /// much work a change costs.
    decided: u64,
    /// The keys of the last list that held no lease.
    skipped: Skipped,
}

impl LeaseView {
    pub(crate) fn new(
        _subnets_prefix: &str,
        config: NetworkConfig,
        me: Identity,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            me,
            held: None,
            leases: LeaseCache::default(),
            peers: HashMap::new(),
            rejected: HashMap::new(),
            rejected_counts: Rejection::REASONS.iter().map(|r| (*r, 0)).collect(),
            candidates: HashMap::new(),
            index: HashMap::new(),
            metrics,
            listing: false,
            decided: 0,
            skipped: Skipped::default(),
        }
    }

    /// We hold `held` now (first acquisition, or after a loss): the peer set
    /// is decided again around it.
    pub(crate) fn set_held(&mut self, held: &HeldLease) -> Vec<PeerUpdate> {
        self.held = Some(held.clone());
        self.decide_all()
    }

    /// Whether `lease` is the key we hold, as we wrote it.
    fn is_ours(&self, lease: &Lease) -> bool {
        self.held.as_ref().is_some_and(|h| {
            lease.key == h.key
                && lease.create_revision == h.create_revision
                && lease.lease_id == h.lease_id
                && lease.attrs.names(&self.me.node_id, self.me.addr())
        })
    }

    fn is_own_key(&self, key: &str) -> bool {
        self.held.as_ref().is_some_and(|h| h.key == key)
    }

    /// The subnets of the peers decided so far (what the dataplane should
    /// hold once the view is in step with etcd).
    pub(crate) fn peer_subnets(&self) -> HashSet<IpNet> {
        self.peers.keys().copied().collect()
    }

    /// The leases rejected, with why.
    pub(crate) fn rejected(&self) -> impl Iterator<Item = (&str, &Rejection)> {
        self.rejected.iter().map(|(k, (why, _))| (&**k, why))
    }

    /// How many leases are rejected.
    pub(crate) fn rejected_count(&self) -> usize {
        self.rejected.len()
    }

    /// The keys of the last list that held no lease.
    pub(crate) fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// How many leases are known (every node's, ours included).
    pub(crate) fn lease_count(&self) -> usize {
        self.leases.count()
    }

    /// Every lease known, and the etcd cluster they came from (what a
    /// restart resumes from).
    pub(crate) fn known(&self) -> (u64, impl Iterator<Item = &Lease>) {
        (self.leases.cluster(), self.leases.leases())
    }

    /// What a batch from the watch means for this node: a fresh list
    /// first, if any, then each key's last change.
    pub(crate) fn apply(&mut self, snapshot: Option<Snapshot>, changes: Vec<Change>) -> Outcome {
        let mut events = Vec::new();
        if let Some(mut s) = snapshot {
            self.skipped = std::mem::take(&mut s.skipped);
            events = self.leases.resync(s);
        }
        events.extend(changes.into_iter().filter_map(|c| self.leases.change(c)));
        self.apply_changes(events)
    }

    /// Applies changes of leases (the cache has them already; tests feed
    /// them directly).
    fn apply_changes(&mut self, events: Vec<LeaseEvent>) -> Outcome {
        let mut out = Outcome::default();
        let mut changed: Vec<String> = Vec::new();
        let mut all = false;
        for ev in events {
            #[cfg(test)]
            self.leases.record(&ev);
            match ev {
                LeaseEvent::Added(l) | LeaseEvent::Changed { new: l, .. } => {
                    if self.is_own_key(&l.key) && !self.is_ours(&l) {
                        out.lost = Some(Lost {
                            why: format!(
                                "our key {} now belongs to {} (node {:?}, lease {:x})",
                                l.key,
                                l.attrs.node_addr(),
                                l.attrs.node_id,
                                l.lease_id
                            ),
                            to: l.attrs.node_id.clone(),
                        });
                    }
                    changed.push(l.key);
                }
                LeaseEvent::Removed(l) => {
                    if self.is_own_key(&l.key) {
                        out.lost = Some(Lost {
                            why: format!("our key {} was deleted", l.key),
                            to: None,
                        });
                    }
                    changed.push(l.key);
                }
                LeaseEvent::Listing => self.listing = true,
                LeaseEvent::Synced { revision } => {
                    self.listing = false;
                    all = true;
                    out.synced = Some(revision);
                }
            }
        }
        if !self.listing {
            out.updates = if all {
                self.decide_all()
            } else {
                self.decide_changed(&changed)
            };
        }
        out
    }

    /// What `key` is on its own: None for one of ours (neither a peer nor
    /// rejected), else its peers or why not.
    fn own_verdict(&self, l: &Lease) -> Option<Result<Vec<Peer>, Rejection>> {
        if self.is_ours(l) || l.attrs.names(&self.me.node_id, self.me.addr()) {
            return None;
        }
        Some(
            check(&l.subnet, &l.attrs, &self.config, Some(&self.me)).map(|mut peers| {
                for p in &mut peers {
                    p.since = l.create_revision;
                }
                peers
            }),
        )
    }

    fn unindex(&mut self, key: &Arc<str>, peers: &[Peer]) {
        for c in contended(peers) {
            if let Some(v) = self.index.get_mut(&c) {
                v.retain(|k| k != key);
                if v.is_empty() {
                    self.index.remove(&c);
                }
            }
        }
    }

    fn set_rejected(&mut self, key: Arc<str>, why: Rejection, rev: i64) {
        let logged = self
            .rejected
            .get(&key)
            .is_some_and(|(w, r)| *w == why && *r == rev);
        if !logged {
            tracing::warn!(key = %key, reason = %why.name(), "rejecting lease: {why}");
        }
        *self.rejected_counts.entry(why.name()).or_default() += 1;
        if let Some((old, _)) = self.rejected.insert(key, (why, rev)) {
            *self.rejected_counts.entry(old.name()).or_default() -= 1;
        }
    }

    fn clear_rejected(&mut self, key: &str, accepted: bool) {
        if let Some((old, _)) = self.rejected.remove(key) {
            *self.rejected_counts.entry(old.name()).or_default() -= 1;
            if accepted {
                tracing::info!(key = %key, "lease accepted after re-evaluation");
            }
        }
    }

    /// Decides every lease again; returns what changed for the dataplane.
    fn decide_all(&mut self) -> Vec<PeerUpdate> {
        self.candidates.clear();
        self.index.clear();
        let keys: Vec<String> = self.leases.leases().map(|l| l.key.clone()).collect();
        let stale: Vec<Arc<str>> = self
            .rejected
            .keys()
            .filter(|k| !self.leases.contains(k))
            .cloned()
            .collect();
        for k in stale {
            self.clear_rejected(&k, false);
        }
        let updates = self.decide_keys(keys.iter().map(String::as_str), true);
        self.metrics.set_rejected(self.rejected_counts.clone());
        updates
    }

    /// Decides the changed keys again, with every lease they contend with
    /// (before or after the change), and theirs.
    fn decide_changed(&mut self, changed: &[String]) -> Vec<PeerUpdate> {
        if changed.is_empty() {
            return Vec::new();
        }
        let updates = self.decide_keys(changed.iter().map(String::as_str), false);
        self.metrics.set_rejected(self.rejected_counts.clone());
        updates
    }

    /// Checks `keys` again, then orders every candidate they are connected
    /// to through what they contend for (with `all`, every candidate), and
    /// applies the verdicts.
    fn decide_keys<'a>(
        &mut self,
        keys: impl Iterator<Item = &'a str>,
        all: bool,
    ) -> Vec<PeerUpdate> {
        // What the component lost: subnets won before.
        let mut was: HashMap<IpNet, Peer> = HashMap::new();
        let mut seeds: Vec<Contended> = Vec::new();
        for key in keys {
            let key: Arc<str> = match self.candidates.get_key_value(key) {
                Some((k, _)) => k.clone(),
                None => Arc::from(key),
            };
            if let Some(old) = self.candidates.remove(&key) {
                if old.won {
                    was.extend(old.peers.iter().map(|p| (p.subnet, *p)));
                }
                seeds.extend(contended(&old.peers));
                self.unindex(&key, &old.peers);
            }
            let verdict = self
                .leases
                .get(&key)
                .and_then(|l| Some((self.own_verdict(l)?, l.mod_revision)));
            match verdict {
                Some((Ok(peers), _)) => {
                    for c in contended(&peers) {
                        self.index.entry(c).or_default().push(key.clone());
                        seeds.push(c);
                    }
                    self.candidates
                        .insert(key.clone(), Candidate { peers, won: false });
                }
                Some((Err(why), rev)) => self.set_rejected(key.clone(), why, rev),
                None => self.clear_rejected(&key, false),
            }
        }
        // The component: every candidate reachable through what is
        // contended.
        let mut component: HashSet<Arc<str>> = HashSet::new();
        if all {
            component.extend(self.candidates.keys().cloned());
        } else {
            let mut seen: HashSet<Contended> = HashSet::new();
            let mut queue: VecDeque<Contended> = seeds.into_iter().collect();
            while let Some(c) = queue.pop_front() {
                if !seen.insert(c) {
                    continue;
                }
                for k in self.index.get(&c).into_iter().flatten() {
                    if component.insert(k.clone()) {
                        queue.extend(contended(&self.candidates[k].peers));
                    }
                }
            }
        }
        for k in &component {
            let c = self.candidates.get_mut(k).expect("indexed");
            if std::mem::take(&mut c.won) {
                for p in &c.peers {
                    was.insert(p.subnet, *p);
                }
            }
        }
        self.decided += component.len() as u64;
        let d = order(
            component.iter().map(|k| {
                let l = self.leases.get(k).expect("a candidate is a known lease");
                (l, self.candidates[k].peers.clone())
            }),
            self.held.as_ref().map(|h| h.subnet),
        );
        for (key, (why, rev)) in d.rejected {
            let key = component
                .get(key.as_str())
                .expect("of the component")
                .clone();
            self.set_rejected(key, why, rev);
        }
        let mut now: HashMap<IpNet, Peer> = HashMap::new();
        for key in d.winners {
            let key = component
                .get(key.as_str())
                .expect("of the component")
                .clone();
            self.clear_rejected(&key, true);
            let c = self.candidates.get_mut(&key).expect("a candidate");
            c.won = true;
            for p in &c.peers {
                now.insert(p.subnet, *p);
            }
        }
        self.diff(was, now, all)
    }

    /// The dataplane's changes from the subnets `was` (won before by what
    /// was decided again) to `now`. With `all`, every peer not in `now`
    /// goes.
    fn diff(
        &mut self,
        was: HashMap<IpNet, Peer>,
        now: HashMap<IpNet, Peer>,
        all: bool,
    ) -> Vec<PeerUpdate> {
        let gone: Vec<IpNet> = if all {
            self.peers
                .keys()
                .filter(|s| !now.contains_key(*s))
                .copied()
                .collect()
        } else {
            was.keys()
                .filter(|s| !now.contains_key(*s))
                .copied()
                .collect()
        };
        let mut removes: Vec<IpNet> = gone
            .into_iter()
            .filter(|s| self.peers.remove(s).is_some())
            .collect();
        removes.sort();
        let mut upserts: Vec<Peer> = now
            .into_values()
            .filter(|p| self.peers.get(&p.subnet) != Some(p))
            .collect();
        upserts.sort_by_key(|p| p.subnet);
        for p in &upserts {
            self.peers.insert(p.subnet, *p);
        }
        removes
            .into_iter()
            .map(PeerUpdate::Remove)
            .chain(upserts.into_iter().map(PeerUpdate::Upsert))
            .collect()
    }
}

/// The verdict on a set of candidates.
struct Order {
    /// The keys whose peers are accepted.
    winners: Vec<String>,
    /// Rejected candidates by key, with the lease's mod revision.
    rejected: Vec<(String, (Rejection, i64))>,
}

/// Orders candidates (leases that passed their own checks, with their
/// peers): of two overlapping leases, and of two leases of different nodes
/// with one PublicIP (or PublicIPv6, or WireGuard key), the older (lower
/// create revision, then key) wins, so every node decides the same way.
/// A lease is decided as a whole (both halves of a dual-stack lease, or
/// neither). (Two leases of one node, or two flannel leases, may share a
/// PublicIP: a node that moved to another subnet keeps its old lease until
/// it expires.)
fn order<'a>(
    candidates: impl Iterator<Item = (&'a Lease, Vec<Peer>)>,
    own: Option<Subnets>,
) -> Order {
    let mut candidates: Vec<(&Lease, Vec<Peer>)> = candidates.collect();
    candidates
        .sort_by(|(a, _), (b, _)| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    let mut out = Order {
        winners: Vec::new(),
        rejected: Vec::new(),
    };
    // Accepted subnets all have the configured length and are aligned, so
    // two overlap only when they are equal.
    let mut winners: HashMap<IpNet, &str> = HashMap::new();
    let mut vteps: HashMap<IpAddr, (&Option<String>, &str)> = HashMap::new();
    let mut keys: HashMap<WgKey, (&Option<String>, IpAddr, &str)> = HashMap::new();
    for (l, peers) in &candidates {
        let verdict = peers.iter().find_map(|p| {
            if own.is_some_and(|o| o.overlaps_net(&p.subnet)) {
                Some(Rejection::OverlapsOwn)
            } else if let Some(k) = winners.get(&p.subnet) {
                Some(Rejection::OverlapsPeer(k.to_string()))
            } else if let Some((node, k)) = vteps.get(&p.vtep)
                && **node != l.attrs.node_id
            {
                Some(Rejection::PublicIpTaken(k.to_string()))
            } else if let Some(key) = p.key
                && let Some((node, vtep, k)) = keys.get(&key)
                && (**node != l.attrs.node_id || (node.is_none() && *vtep != p.vtep))
            {
                // One key is one node: a second node with it would take
                // the first one's traffic on the WireGuard device.
                Some(Rejection::PublicKeyTaken(k.to_string()))
            } else {
                None
            }
        });
        match verdict {
            Some(r) => out.rejected.push((l.key.clone(), (r, l.mod_revision))),
            None => {
                for p in peers {
                    winners.insert(p.subnet, &l.key);
                    vteps.entry(p.vtep).or_insert((&l.attrs.node_id, &l.key));
                    if let Some(key) = p.key {
                        keys.entry(key)
                            .or_insert((&l.attrs.node_id, p.vtep, &l.key));
                    }
                }
                out.winners.push(l.key.clone());
            }
        }
    }
    out
}

/// The verdict on a set of leases.
pub(crate) struct Decision {
    /// Rejected leases by key, with the lease's mod revision.
    pub(crate) rejected: HashMap<String, (Rejection, i64)>,
}

/// Decides which leases are rejected, all at once (`weft leases`). `me` (when
/// known) and `own` are this node and its subnets; `is_ours` picks out our
/// own key. Leases naming our node id and address are leftovers of ours:
/// neither peers nor rejected.
pub(crate) fn decide<'a>(
    leases: impl Iterator<Item = &'a Lease>,
    config: &NetworkConfig,
    me: Option<&Identity>,
    own: Option<Subnets>,
    is_ours: impl Fn(&Lease) -> bool,
) -> Decision {
    let mut rejected = HashMap::new();
    let mut candidates: Vec<(&Lease, Vec<Peer>)> = Vec::new();
    for l in leases {
        if is_ours(l) || me.is_some_and(|m| l.attrs.names(&m.node_id, m.addr())) {
            continue;
        }
        match check(&l.subnet, &l.attrs, config, me) {
            Ok(mut p) => {
                for p in &mut p {
                    p.since = l.create_revision;
                }
                candidates.push((l, p))
            }
            Err(r) => {
                rejected.insert(l.key.clone(), (r, l.mod_revision));
            }
        }
    }
    rejected.extend(order(candidates.into_iter(), own).rejected);
    Decision { rejected }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{lease::attrs::LeaseAttrs, mac::MacAddr};
    use ipnet::Ipv4Net;
    use std::net::Ipv4Addr;

    fn cfg() -> NetworkConfig {
        NetworkConfig::parse(br#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap()
    }

    fn me() -> Identity {
        Identity {
            node_id: "me".into(),
            public_ip: Some(Ipv4Addr::new(198, 18, 0, 1)),
            public_ipv6: None,
        }
    }

    fn lease(subnet: &str, ip: [u8; 4], node: &str, rev: i64) -> Lease {
        let subnet: Ipv4Net = subnet.parse().unwrap();
        Lease {
            key: format!("/p/subnets/{}", crate::lease::key::to_key(&subnet)),
            subnet: Subnets::v4(subnet),
            attrs: LeaseAttrs::vxlan(Ipv4Addr::from(ip), 1, MacAddr([2, 0, 0, 0, 0, ip[3]]), node),
            lease_id: 100 + rev,
            create_revision: rev,
            mod_revision: rev,
        }
    }

    fn held(l: &Lease) -> HeldLease {
        HeldLease {
            subnet: l.subnet,
            key: l.key.clone(),
            lease_id: l.lease_id,
            create_revision: l.create_revision,
            mod_revision: l.mod_revision,
            attrs: l.attrs.clone(),
            taken_from: None,
        }
    }

    fn view() -> LeaseView {
        LeaseView::new("/p/subnets/", cfg(), me(), Arc::new(Metrics::default()))
    }

    #[test]
    fn our_own_key_is_never_a_peer_and_its_loss_is_reported_once() {
        let mut v = view();
        let mine = lease("10.5.1.0/24", [198, 18, 0, 1], "me", 3);
        let peer = lease("10.5.2.0/24", [198, 18, 0, 2], "b", 4);
        assert!(v.set_held(&held(&mine)).is_empty());
        let o = v.apply_changes(vec![
            LeaseEvent::Added(mine.clone()),
            LeaseEvent::Added(peer.clone()),
            LeaseEvent::Synced { revision: 4 },
        ]);
        assert_eq!(o.lost, None);
        assert_eq!(o.synced, Some(4));
        assert!(
            matches!(o.updates.as_slice(), [PeerUpdate::Upsert(p)] if Some(p.subnet) == peer.subnet.v4.map(IpNet::V4))
        );

        // Node b takes our key after our lease expired.
        let mut taken = lease("10.5.1.0/24", [198, 18, 0, 2], "b", 9);
        taken.key = mine.key.clone();
        let o = v.apply_changes(vec![
            LeaseEvent::Removed(mine.clone()),
            LeaseEvent::Added(taken.clone()),
        ]);
        assert!(o.lost.is_some());
        assert!(
            o.updates.is_empty(),
            "rejected while it overlaps our subnet"
        );
        // Once we hold another subnet, b's lease on our old key is a peer.
        let mine2 = lease("10.5.3.0/24", [198, 18, 0, 1], "me", 10);
        let u = v.set_held(&held(&mine2));
        assert!(
            matches!(u.as_slice(), [PeerUpdate::Upsert(p)] if Some(p.subnet) == taken.subnet.v4.map(IpNet::V4) && p.vtep == taken.attrs.public_ip),
            "{u:?}"
        );
    }

    #[test]
    fn the_older_of_two_overlapping_leases_wins_and_rivals_are_re_evaluated() {
        let mut v = view();
        v.set_held(&held(&lease("10.5.1.0/24", [198, 18, 0, 1], "me", 1)));
        let old = lease("10.5.2.0/24", [198, 18, 0, 2], "b", 5);
        let mut dup = lease("10.5.2.0/24", [198, 18, 0, 3], "c", 7);
        dup.key = format!("{}&fd00::-64", old.key);
        let o = v.apply_changes(vec![
            LeaseEvent::Added(dup.clone()),
            LeaseEvent::Added(old.clone()),
        ]);
        assert!(
            matches!(o.updates.as_slice(), [PeerUpdate::Upsert(p)] if p.vtep == old.attrs.public_ip)
        );
        // The winner goes away: the rival is accepted in its place.
        let o = v.apply_changes(vec![LeaseEvent::Removed(old)]);
        assert!(
            matches!(o.updates.as_slice(), [PeerUpdate::Upsert(p)] if p.vtep == dup.attrs.public_ip),
            "{:?}",
            o.updates
        );
    }

    #[test]
    fn one_public_ip_belongs_to_the_node_with_the_older_lease() {
        let mut v = view();
        v.set_held(&held(&lease("10.5.1.0/24", [198, 18, 0, 1], "me", 1)));
        let b = lease("10.5.2.0/24", [198, 18, 0, 2], "b", 5);
        let b_moved = lease("10.5.3.0/24", [198, 18, 0, 2], "b", 6);
        let intruder = lease("10.5.4.0/24", [198, 18, 0, 2], "x", 7);
        let o = v.apply_changes(vec![
            LeaseEvent::Added(intruder.clone()),
            LeaseEvent::Added(b_moved),
            LeaseEvent::Added(b),
        ]);
        let subnets: Vec<String> = o
            .updates
            .iter()
            .map(|u| match u {
                PeerUpdate::Upsert(p) => p.subnet.to_string(),
                PeerUpdate::Remove(s) => format!("-{s}"),
            })
            .collect();
        assert_eq!(
            subnets,
            ["10.5.2.0/24", "10.5.3.0/24"],
            "one node's two leases"
        );
        assert_eq!(
            v.rejected[intruder.key.as_str()].0.name(),
            "public_ip_taken"
        );
    }

    #[test]
    fn hostile_leases_are_rejected_and_honest_ones_still_programmed() {
        let mut v = view();
        v.set_held(&held(&lease("10.5.1.0/24", [198, 18, 0, 1], "me", 1)));
        let mut hostile = vec![
            lease("10.5.1.0/24", [198, 18, 0, 9], "x", 2),
            lease("10.5.3.0/24", [127, 0, 0, 1], "x", 3),
        ];
        let mut lo = lease("10.5.4.0/24", [198, 18, 0, 9], "x", 4);
        lo.subnet = Subnets::v4("127.0.0.0/8".parse().unwrap());
        lo.key = "/p/subnets/127.0.0.0-8".into();
        hostile.push(lo);
        let honest = lease("10.5.5.0/24", [198, 18, 0, 5], "e", 5);
        let mut evs: Vec<LeaseEvent> = hostile.into_iter().map(LeaseEvent::Added).collect();
        evs.push(LeaseEvent::Added(honest.clone()));
        let o = v.apply_changes(evs);
        assert_eq!(
            o.updates,
            vec![PeerUpdate::Upsert(Peer {
                since: honest.create_revision,
                ..Peer::v4(
                    honest.subnet.v4.unwrap(),
                    honest.attrs.public_ip,
                    MacAddr([2, 0, 0, 0, 0, 5]),
                )
            })]
        );
        assert_eq!(v.rejected.len(), 3);
        let names: std::collections::BTreeSet<_> =
            v.rejected.values().map(|(r, _)| r.name()).collect();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["outside_network", "overlaps_own", "public_ip"]
        );
    }

    /// The peers and rejections `decide` (every lease at once) gives.
    fn from_scratch(v: &LeaseView) -> (Vec<Peer>, Vec<(String, String)>) {
        let mut fresh = LeaseView::new("/p/subnets/", cfg(), me(), Arc::new(Metrics::default()));
        if let Some(h) = &v.held {
            fresh.set_held(h);
        }
        let all: Vec<LeaseEvent> = v.leases.leases().cloned().map(LeaseEvent::Added).collect();
        fresh.apply_changes(all);
        snapshot_of(&fresh)
    }

    fn snapshot_of(v: &LeaseView) -> (Vec<Peer>, Vec<(String, String)>) {
        let mut peers: Vec<Peer> = v.peers.values().copied().collect();
        peers.sort_by_key(|p| p.subnet);
        let mut rejected: Vec<(String, String)> = v
            .rejected
            .iter()
            .map(|(k, (why, _))| (k.to_string(), why.to_string()))
            .collect();
        rejected.sort();
        (peers, rejected)
    }

    /// Thousands of random changes among leases that contend for a few
    /// subnets and addresses: deciding only what a change touches gives,
    /// after every batch, exactly what deciding everything again gives.
    #[test]
    fn deciding_what_changed_equals_deciding_everything() {
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut v = view();
        v.set_held(&held(&lease("10.5.1.0/24", [198, 18, 0, 1], "me", 1)));
        let mut rev = 10;
        for round in 0..3000 {
            let mut batch = Vec::new();
            for _ in 0..rng.random_range(1..4) {
                rev += 1;
                // Few subnets, addresses and nodes: many contend.
                let subnet = format!("10.5.{}.0/24", rng.random_range(1..8));
                let ip = [198, 18, 0, rng.random_range(1..7)];
                let node = ["a", "b", "c", "me"][rng.random_range(0..4)];
                let key = format!("/p/subnets/k{}", rng.random_range(0..12));
                let mut l = lease(&subnet, ip, node, rev);
                l.key = key.clone();
                l.create_revision = v.leases.get(&key).map_or(rev, |o| o.create_revision);
                if rng.random_bool(0.3) {
                    if let Some(old) = v.leases.get(&key) {
                        batch.push(LeaseEvent::Removed(old.clone()));
                    }
                } else {
                    match v.leases.get(&key) {
                        Some(old) => batch.push(LeaseEvent::Changed {
                            old: old.clone(),
                            new: l,
                        }),
                        None => batch.push(LeaseEvent::Added(l)),
                    }
                }
                // Each event seen by the cache before the next is drawn.
                if let Some(ev) = batch.last() {
                    v.leases.record(ev);
                }
            }
            v.apply_changes(batch);
            assert_eq!(snapshot_of(&v), from_scratch(&v), "after round {round}");
        }
    }

    /// A lease put and deleted again and again beside 5,000 others costs
    /// the work of the few it contends with, not of all 5,000.
    #[test]
    fn a_change_decides_only_what_it_contends_with() {
        let mut v = view();
        v.set_held(&held(&lease("10.5.1.0/24", [198, 18, 0, 1], "me", 1)));
        let big = NetworkConfig::parse(
            br#"{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        v.config = big;
        let mut all = Vec::new();
        for i in 0..5000u32 {
            let n = i + 2000;
            let mut l = lease(
                "10.5.2.0/24",
                [198, 19, (n >> 8) as u8, n as u8],
                &format!("n{i}"),
                10 + i as i64,
            );
            let subnet: ipnet::Ipv4Net =
                format!("10.{}.{}.0/24", n >> 8, n & 0xff).parse().unwrap();
            l.subnet = Subnets::v4(subnet);
            l.key = format!("/p/subnets/{}", crate::lease::key::to_key(&subnet));
            all.push(LeaseEvent::Added(l));
        }
        all.push(LeaseEvent::Synced { revision: 6000 });
        let o = v.apply_changes(all);
        assert_eq!(o.updates.len(), 5000);
        let before = v.decided;
        let churn = lease("10.200.0.0/24", [198, 20, 0, 1], "x", 7000);
        for _ in 0..100 {
            let o = v.apply_changes(vec![LeaseEvent::Added(churn.clone())]);
            assert_eq!(o.updates.len(), 1);
            let o = v.apply_changes(vec![LeaseEvent::Removed(churn.clone())]);
            assert_eq!(o.updates.len(), 1);
        }
        assert!(
            v.decided - before <= 200,
            "{} leases decided for 200 changes",
            v.decided - before
        );
        assert_eq!(v.peers.len(), 5000);
    }
}
