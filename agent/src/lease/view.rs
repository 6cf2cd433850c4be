//! The one place that decides what each lease in etcd is to this node: our
//! own, a peer, or rejected (with a reason).
//!
//! The watch feeds etcd's changes in; the view keeps every lease (its
//! cache, the one copy on the node), and after each batch decides the whole
//! peer set again from scratch, so a
//! rejected lease is re-evaluated whenever it or a rival changes, and a key
//! that stops being ours (taken by another node after our lease was lost)
//! becomes that node's peer as soon as we hold another subnet.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use ipnet::IpNet;

use super::{
    acquire::{HeldLease, Identity},
    cache::{Lease, LeaseCache, LeaseEvent},
    config::NetworkConfig,
    key::Subnets,
    store::WatchEvent,
    validate::{Rejection, check},
};
use crate::{
    metrics::Metrics,
    peer::{Peer, PeerUpdate},
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

pub(crate) struct LeaseView {
    config: NetworkConfig,
    me: Identity,
    held: Option<HeldLease>,
    /// Every lease: the one copy.
    leases: LeaseCache,
    /// The peers the dataplane was told about.
    peers: HashMap<IpNet, Peer>,
    /// Leases rejected, with the revision the rejection was logged at.
    rejected: HashMap<String, (Rejection, i64)>,
    metrics: Arc<Metrics>,
    /// Between a [`LeaseEvent::Listing`] and its [`LeaseEvent::Synced`]:
    /// the set is incomplete, deciding waits (one decision for a list of
    /// 50,000 leases, not one per batch of events).
    listing: bool,
}

impl LeaseView {
    pub(crate) fn new(
        subnets_prefix: &str,
        config: NetworkConfig,
        me: Identity,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            me,
            held: None,
            leases: LeaseCache::new(subnets_prefix, Some(metrics.clone())),
            peers: HashMap::new(),
            rejected: HashMap::new(),
            metrics,
            listing: false,
        }
    }

    /// We hold `held` now (first acquisition, or after a loss): the peer set
    /// is decided again around it.
    pub(crate) fn set_held(&mut self, held: &HeldLease) -> Vec<PeerUpdate> {
        self.held = Some(held.clone());
        self.decide()
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
    pub(crate) fn rejected(&self) -> impl Iterator<Item = (&String, &Rejection)> {
        self.rejected.iter().map(|(k, (why, _))| (k, why))
    }

    /// What a batch of the watch's events means for this node.
    pub(crate) fn apply(&mut self, events: Vec<WatchEvent>) -> Outcome {
        let changes: Vec<LeaseEvent> = events
            .into_iter()
            .flat_map(|ev| self.leases.take(ev))
            .collect();
        self.apply_changes(changes)
    }

    /// Applies changes of leases (the cache has them already; tests feed
    /// them directly).
    fn apply_changes(&mut self, events: Vec<LeaseEvent>) -> Outcome {
        let mut out = Outcome::default();
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
                }
                LeaseEvent::Removed(l) => {
                    if self.is_own_key(&l.key) {
                        out.lost = Some(Lost {
                            why: format!("our key {} was deleted", l.key),
                            to: None,
                        });
                    }
                }
                LeaseEvent::Listing => self.listing = true,
                LeaseEvent::Synced { revision } => {
                    self.listing = false;
                    out.synced = Some(revision);
                }
            }
        }
        if !self.listing {
            out.updates = self.decide();
        }
        out
    }

    /// Decides every lease again; returns what changed for the dataplane.
    fn decide(&mut self) -> Vec<PeerUpdate> {
        let own = self.held.as_ref().map(|h| h.subnet);
        let d = decide(
            self.leases.leases(),
            &self.config,
            Some(&self.me),
            own,
            |l| self.is_ours(l),
        );
        // Log each rejection once per version of the lease.
        let mut rejected = HashMap::new();
        for (key, (why, rev)) in d.rejected {
            let logged = self
                .rejected
                .get(&key)
                .is_some_and(|(w, r)| *w == why && *r == rev);
            if !logged {
                tracing::warn!(key = %key, reason = %why.name(), "rejecting lease: {why}");
            }
            rejected.insert(key, (why, rev));
        }
        for key in self.rejected.keys() {
            if !rejected.contains_key(key) && self.leases.contains(key) {
                tracing::info!(key = %key, "lease accepted after re-evaluation");
            }
        }
        self.rejected = rejected;
        let mut counts: BTreeMap<&'static str, u64> =
            Rejection::REASONS.iter().map(|r| (*r, 0)).collect();
        for (why, _) in self.rejected.values() {
            *counts.entry(why.name()).or_default() += 1;
        }
        self.metrics.set_rejected(counts);

        let mut updates: Vec<PeerUpdate> = self
            .peers
            .keys()
            .filter(|s| !d.accepted.contains_key(*s))
            .map(|s| PeerUpdate::Remove(*s))
            .collect();
        updates.sort_by_key(|u| match u {
            PeerUpdate::Remove(s) | PeerUpdate::Upsert(Peer { subnet: s, .. }) => *s,
        });
        let mut upserts: Vec<PeerUpdate> = d
            .accepted
            .values()
            .filter(|p| self.peers.get(&p.subnet) != Some(*p))
            .map(|p| PeerUpdate::Upsert(*p))
            .collect();
        upserts.sort_by_key(|u| match u {
            PeerUpdate::Remove(s) | PeerUpdate::Upsert(Peer { subnet: s, .. }) => *s,
        });
        updates.extend(upserts);
        self.peers = d.accepted;
        updates
    }
}

/// The verdict on a set of leases.
pub(crate) struct Decision {
    pub(crate) accepted: HashMap<IpNet, Peer>,
    /// Rejected leases by key, with the lease's mod revision.
    pub(crate) rejected: HashMap<String, (Rejection, i64)>,
}

/// Decides which leases are peers. `me` (when known) and `own` are this
/// node and its subnets; `is_ours` picks out our own key. Leases naming our
/// node id and address are leftovers of ours: neither peers nor rejected.
/// A lease is decided as a whole (both halves of a dual-stack lease, or
/// neither). Of two overlapping leases, and of two leases of different
/// nodes with one PublicIP (or PublicIPv6), the older (lower create
/// revision, then key) wins, so every node decides the same way. (Two
/// leases of one node, or two flannel leases, may share a PublicIP: a node
/// that moved to another subnet keeps its old lease until it expires.)
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
    candidates
        .sort_by(|(a, _), (b, _)| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    // Accepted subnets all have the configured length and are aligned, so
    // two overlap only when they are equal.
    let mut accepted: HashMap<IpNet, Peer> = HashMap::new();
    let mut winners: HashMap<IpNet, &str> = HashMap::new();
    let mut vteps: HashMap<IpAddr, (&Option<String>, &str)> = HashMap::new();
    let mut keys: HashMap<crate::wgkey::WgKey, (&Option<String>, IpAddr, &str)> = HashMap::new();
    for (l, peers) in candidates {
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
            Some(r) => {
                rejected.insert(l.key.clone(), (r, l.mod_revision));
            }
            None => {
                for p in peers {
                    winners.insert(p.subnet, &l.key);
                    vteps.entry(p.vtep).or_insert((&l.attrs.node_id, &l.key));
                    if let Some(key) = p.key {
                        keys.entry(key)
                            .or_insert((&l.attrs.node_id, p.vtep, &l.key));
                    }
                    accepted.insert(p.subnet, p);
                }
            }
        }
    }
    Decision { accepted, rejected }
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
        assert_eq!(v.rejected[&intruder.key].0.name(), "public_ip_taken");
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
}
