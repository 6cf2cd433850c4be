//! Which leases become peers of the dataplane, and how lease events turn
//! into peer updates.
//!
//! A lease is a peer when it is another node's vxlan lease with usable
//! backend data. Our own lease, or any lease naming our public IP, never is
//! (the node would encapsulate to itself). Leases of other backends are
//! ignored; vxlan leases with bad backend data are skipped with a warning.

use std::net::Ipv4Addr;

use crate::{
    lease::{subnet::Ipv4Net, watch::Lease, watch::LeaseEvent},
    mac::MacAddr,
};

/// One remote subnet and the VTEP that serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    pub subnet: Ipv4Net,
    pub vtep: Ipv4Addr,
    pub mac: MacAddr,
}

/// What the dataplane must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerUpdate {
    /// Install, or replace in place, the peer for this subnet.
    Upsert(Peer),
    /// Remove the peer of this subnet.
    Remove(Ipv4Net),
}

/// Our own lease as the filter sees it.
pub struct Me<'a> {
    pub key: &'a str,
    pub public_ip: Ipv4Addr,
}

pub fn peer_of(lease: &Lease, me: &Me<'_>) -> Option<Peer> {
    if lease.key == me.key || lease.attrs.public_ip == me.public_ip {
        return None;
    }
    if lease.attrs.backend_type != "vxlan" {
        tracing::debug!(key = %lease.key, backend = %lease.attrs.backend_type, "ignoring a lease of another backend");
        return None;
    }
    match lease.attrs.vxlan_data() {
        Ok(d) => Some(Peer {
            subnet: lease.subnet,
            vtep: lease.attrs.public_ip,
            mac: d.vtep_mac,
        }),
        Err(e) => {
            tracing::warn!(key = %lease.key, error = %e, "skipping a vxlan lease with bad backend data");
            None
        }
    }
}

/// The dataplane updates one lease event calls for.
pub fn updates(ev: &LeaseEvent, me: &Me<'_>) -> Vec<PeerUpdate> {
    match ev {
        LeaseEvent::Added(l) => peer_of(l, me).map(PeerUpdate::Upsert).into_iter().collect(),
        LeaseEvent::Removed(l) => peer_of(l, me)
            .map(|p| PeerUpdate::Remove(p.subnet))
            .into_iter()
            .collect(),
        LeaseEvent::Changed { old, new } => match (peer_of(old, me), peer_of(new, me)) {
            // A replace in place: the map entry is overwritten atomically, so
            // no packet ever sees the subnet without a VTEP.
            (_, Some(p)) => vec![PeerUpdate::Upsert(p)],
            (Some(o), None) => vec![PeerUpdate::Remove(o.subnet)],
            (None, None) => vec![],
        },
        LeaseEvent::Synced { .. } => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::attrs::LeaseAttrs;

    fn lease(subnet: &str, ip: [u8; 4], backend: &str) -> Lease {
        let mut attrs =
            LeaseAttrs::vxlan(Ipv4Addr::from(ip), 1, MacAddr([2, 0, 0, 0, 0, ip[3]]), "n");
        attrs.backend_type = backend.into();
        let subnet: Ipv4Net = subnet.parse().unwrap();
        Lease {
            key: format!("/p/subnets/{}", subnet.to_key()),
            subnet,
            attrs,
            lease_id: 1,
            create_revision: 1,
            mod_revision: 1,
        }
    }

    #[test]
    fn own_and_foreign_backend_leases_are_never_peers() {
        let me = Me {
            key: "/p/subnets/10.5.1.0-24",
            public_ip: Ipv4Addr::new(198, 18, 0, 1),
        };
        assert_eq!(
            peer_of(&lease("10.5.1.0/24", [198, 18, 0, 1], "vxlan"), &me),
            None
        );
        assert_eq!(
            peer_of(&lease("10.5.9.0/24", [198, 18, 0, 1], "vxlan"), &me),
            None,
            "names our IP"
        );
        assert_eq!(
            peer_of(&lease("10.5.2.0/24", [198, 18, 0, 2], "host-gw"), &me),
            None
        );
        let p = peer_of(&lease("10.5.2.0/24", [198, 18, 0, 2], "vxlan"), &me).unwrap();
        assert_eq!(p.vtep, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(p.mac, MacAddr([2, 0, 0, 0, 0, 2]));
    }

    #[test]
    fn changes_become_one_in_place_upsert() {
        let me = Me {
            key: "/p/subnets/10.5.1.0-24",
            public_ip: Ipv4Addr::new(198, 18, 0, 1),
        };
        let old = lease("10.5.2.0/24", [198, 18, 0, 2], "vxlan");
        let new = lease("10.5.2.0/24", [198, 18, 0, 3], "vxlan");
        let u = updates(
            &LeaseEvent::Changed {
                old: old.clone(),
                new,
            },
            &me,
        );
        assert!(
            matches!(u.as_slice(), [PeerUpdate::Upsert(p)] if p.vtep == Ipv4Addr::new(198, 18, 0, 3))
        );
        let gone = lease("10.5.2.0/24", [198, 18, 0, 2], "host-gw");
        let u = updates(&LeaseEvent::Changed { old, new: gone }, &me);
        assert_eq!(u, vec![PeerUpdate::Remove("10.5.2.0/24".parse().unwrap())]);
    }
}
