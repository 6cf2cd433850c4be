//! The tests of `acquire`.

use super::super::store::Listing;
use super::*;
use crate::mac::MacAddr;
use ipnet::Ipv4Net;
use rand::SeedableRng as _;

fn cfg() -> NetworkConfig {
    NetworkConfig::parse(br#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap()
}

fn v4(s: &str) -> Subnets {
    Subnets::v4(s.parse().unwrap())
}

fn me(n: &str, ip: [u8; 4]) -> Identity {
    Identity {
        node_id: n.into(),
        public_ip: Some(Ipv4Addr::from(ip)),
        public_ipv6: None,
    }
}

fn value(m: &Identity) -> LeaseAttrs {
    LeaseAttrs::vxlan(
        m.public_ip.unwrap(),
        1,
        MacAddr([2, 0, 0, 0, 0, 1]),
        &m.node_id,
    )
}

fn kv(subnet: &str, v: &LeaseAttrs, lease: i64, rev: i64) -> KeyValue {
    let s: Ipv4Net = subnet.parse().unwrap();
    KeyValue {
        key: format!("/p/subnets/{}", super::super::key::to_key(&s)),
        value: v.to_json().into_bytes(),
        create_revision: rev,
        mod_revision: rev,
        version: 1,
        lease,
    }
}

fn run_plan(
    m: &Identity,
    preferred: Option<&str>,
    kvs: Vec<KeyValue>,
    lease: Option<i64>,
) -> (Plan, Vec<KeyValue>) {
    let c = cfg();
    let v = value(m);
    let req = AcquireRequest {
        subnets_prefix: "/p/subnets/",
        config: &c,
        me: m,
        value: &v,
        ttl: 60,
        preferred: preferred.map(|p| Subnets::v4(p.parse().unwrap())),
        lease_id: lease,
        not_from: &[],
    };
    let listing = Listing { revision: 10, kvs };
    let entries = parse_listing("/p/subnets/", &listing);
    plan(
        &req,
        &entries,
        lease,
        &mut rand::rngs::StdRng::seed_from_u64(1),
    )
}

#[test]
fn a_preference_never_touches_an_existing_key() {
    let a = me("a", [198, 18, 0, 1]);
    let b = me("b", [198, 18, 0, 2]);
    // B holds 10.5.7.0/24; A prefers it (stale subnet file).
    let (p, _) = run_plan(
        &a,
        Some("10.5.7.0/24"),
        vec![kv("10.5.7.0/24", &value(&b), 7, 3)],
        None,
    );
    match p {
        Plan::Create(s) => assert_ne!(s.to_string(), "10.5.7.0/24"),
        other => panic!("expected a new subnet, got {other:?}"),
    }
}

#[test]
fn a_free_preference_is_created() {
    let a = me("a", [198, 18, 0, 1]);
    let (p, _) = run_plan(&a, Some("10.5.9.0/24"), vec![], None);
    assert_eq!(p, Plan::Create(v4("10.5.9.0/24")));
    // Outside SubnetMin..SubnetMax or misaligned: ignored.
    let (p, _) = run_plan(&a, Some("10.5.0.0/24"), vec![], None);
    assert_ne!(p, Plan::Create(v4("10.5.0.0/24")));
    let (p, _) = run_plan(&a, Some("10.5.9.0/25"), vec![], None);
    assert!(matches!(p, Plan::Create(s) if s.v4.unwrap().prefix_len() == 24));
}

#[test]
fn own_keys_are_reclaimed_and_strangers_are_not() {
    let a = me("a", [198, 18, 0, 1]);
    let b = me("b", [198, 18, 0, 2]);
    let mine = kv("10.5.3.0/24", &value(&a), 5, 4);
    let (p, _) = run_plan(&a, None, vec![mine.clone()], Some(99));
    assert!(
        matches!(p, Plan::Reclaim { ref kv, reservation: false, from: None, .. } if kv.key == mine.key)
    );
    // Same key with our current lease and value: adopted without a write.
    let (p, _) = run_plan(
        &a,
        None,
        vec![kv("10.5.3.0/24", &value(&a), 99, 4)],
        Some(99),
    );
    assert!(matches!(p, Plan::Adopt(..)));
    // Another node (another PublicIP) never takes it.
    let (p, _) = run_plan(&b, None, vec![mine.clone()], None);
    assert!(matches!(p, Plan::Create(s) if s.to_string() != "10.5.3.0/24"));
}

#[test]
fn a_replaced_machine_takes_back_the_lease_of_its_address() {
    let a = me("a", [198, 18, 0, 1]);
    // The same address with a new node id (reinstalled, a new
    // machine-id): the old lease is taken over, fenced by its revision.
    let replaced = me("a-new", [198, 18, 0, 1]);
    let old = kv("10.5.3.0/24", &value(&a), 5, 4);
    let (p, extras) = run_plan(&replaced, None, vec![old.clone()], None);
    assert!(
        matches!(p, Plan::Reclaim { ref kv, ref from, .. } if kv.key == old.key && from.as_deref() == Some("a")),
        "{p:?}"
    );
    assert!(extras.is_empty(), "another node's key is never removed");
    // Of two, the older (the one every node takes for the address).
    let newer = kv("10.5.9.0/24", &value(&me("x", [198, 18, 0, 1])), 6, 8);
    let (p, _) = run_plan(&replaced, None, vec![newer, old.clone()], None);
    assert!(
        matches!(p, Plan::Reclaim { ref kv, .. } if kv.key == old.key),
        "{p:?}"
    );
    // Our own key wins over any of them.
    let mine = kv("10.5.7.0/24", &value(&replaced), 7, 9);
    let (p, _) = run_plan(&replaced, None, vec![old.clone(), mine.clone()], None);
    assert!(
        matches!(p, Plan::Reclaim { ref kv, from: None, .. } if kv.key == mine.key),
        "{p:?}"
    );
}

#[test]
fn a_live_node_claiming_our_address_is_waited_for() {
    let a = me("a", [198, 18, 0, 1]);
    let clone = me("a-clone", [198, 18, 0, 1]);
    let c = cfg();
    let v = value(&clone);
    let not_from = ["a".to_string()];
    let req = AcquireRequest {
        subnets_prefix: "/p/subnets/",
        config: &c,
        me: &clone,
        value: &v,
        ttl: 60,
        preferred: None,
        lease_id: None,
        not_from: &not_from,
    };
    let kvs = vec![kv("10.5.3.0/24", &value(&a), 5, 4)];
    let entries = parse_listing("/p/subnets/", &Listing { revision: 5, kvs });
    let (p, _) = plan(
        &req,
        &entries,
        None,
        &mut rand::rngs::StdRng::seed_from_u64(1),
    );
    assert!(
        matches!(p, Plan::Conflict(AcquireError::Conflict { ref node, .. }) if node == "a"),
        "{p:?}"
    );
}

#[test]
fn reservations_for_our_ip_are_used_without_a_lease_and_no_one_else_gets_them() {
    let a = me("a", [198, 18, 0, 1]);
    let b = me("b", [198, 18, 0, 2]);
    let mut reserved = LeaseAttrs::parse(br#"{"PublicIP":"198.18.0.1"}"#).unwrap();
    reserved.node_id = None;
    let r = kv("10.5.200.0/24", &reserved, 0, 2);
    let (p, _) = run_plan(&a, Some("10.5.4.0/24"), vec![r.clone()], None);
    assert!(
        matches!(
            p,
            Plan::Reclaim {
                reservation: true,
                ..
            }
        ),
        "{p:?}"
    );
    let (p, _) = run_plan(&b, Some("10.5.200.0/24"), vec![r], None);
    assert!(matches!(p, Plan::Create(s) if s.to_string() != "10.5.200.0/24"));
}

#[test]
fn leftover_keys_of_this_node_are_removed() {
    let a = me("a", [198, 18, 0, 1]);
    let k1 = kv("10.5.3.0/24", &value(&a), 5, 4);
    let k2 = kv("10.5.8.0/24", &value(&a), 6, 9);
    let (p, extras) = run_plan(&a, Some("10.5.3.0/24"), vec![k1.clone(), k2.clone()], None);
    assert!(matches!(p, Plan::Reclaim { ref kv, .. } if kv.key == k1.key));
    assert_eq!(extras, vec![k2]);
}

#[test]
fn out_of_subnets_counts_what_holds_them() {
    let c =
        NetworkConfig::parse(br#"{"Network":"10.9.0.0/28","Backend":{"Type":"vxlan"}}"#).unwrap();
    assert_eq!(c.ipv4.as_ref().unwrap().subnet_count(), 3);
    let b = me("b", [198, 18, 0, 2]);
    let kvs = vec![
        kv("10.9.0.4/30", &value(&b), 1, 1),
        kv("10.9.0.8/30", &value(&b), 0, 1),
        KeyValue {
            key: "/p/subnets/10.9.0.12-30".into(),
            value: b"garbage".to_vec(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 3,
        },
    ];
    let a = me("a", [198, 18, 0, 1]);
    let v = value(&a);
    let req = AcquireRequest {
        subnets_prefix: "/p/subnets/",
        config: &c,
        me: &a,
        value: &v,
        ttl: 60,
        preferred: None,
        lease_id: None,
        not_from: &[],
    };
    let entries = parse_listing("/p/subnets/", &Listing { revision: 1, kvs });
    let (p, _) = plan(
        &req,
        &entries,
        None,
        &mut rand::rngs::StdRng::seed_from_u64(1),
    );
    let Plan::OutOfSubnets(e) = p else {
        panic!("{p:?}")
    };
    assert_eq!(
        e.to_string(),
        "out of subnets: all 3 subnets from 10.9.0.4 to 10.9.0.12 are taken (2 by leases, 1 by reservations, 0 by other keys)"
    );
}

#[test]
fn keys_of_ours_that_no_longer_fit_the_config_are_not_reclaimed() {
    let a = me("a", [198, 18, 0, 1]);
    // Ours by node id and address, but of another prefix length, or
    // outside SubnetMin..SubnetMax: a new subnet, and the key is left
    // alone (not reclaimed, not removed as a leftover).
    for stale in ["10.5.3.0/25", "10.5.0.0/24"] {
        let k = kv(stale, &value(&a), 5, 4);
        let (p, extras) = run_plan(&a, None, vec![k.clone()], Some(99));
        assert!(
            matches!(p, Plan::Create(s) if s.v4.unwrap().prefix_len() == 24 && s.v4.unwrap().to_string() != stale),
            "{stale}: {p:?}"
        );
        assert!(extras.is_empty(), "{stale}: {extras:?}");
    }
}

fn dual_cfg() -> NetworkConfig {
    NetworkConfig::parse(
        br#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:5::/56","Backend":{"Type":"vxlan"}}"#,
    )
    .unwrap()
}

fn dual_plan(m: &Identity, preferred: Option<Subnets>, kvs: Vec<KeyValue>) -> Plan {
    let c = dual_cfg();
    let v = value(m).with_v6(
        "fd00:18::1".parse().unwrap(),
        1,
        MacAddr([2, 0, 0, 0, 0, 9]),
    );
    let req = AcquireRequest {
        subnets_prefix: "/p/subnets/",
        config: &c,
        me: m,
        value: &v,
        ttl: 60,
        preferred,
        lease_id: None,
        not_from: &[],
    };
    let entries = parse_listing("/p/subnets/", &Listing { revision: 1, kvs });
    plan(
        &req,
        &entries,
        None,
        &mut rand::rngs::StdRng::seed_from_u64(3),
    )
    .0
}

#[test]
fn dual_stack_leases_pair_each_ipv4_subnet_with_the_ipv6_subnet_of_its_index() {
    let c = dual_cfg();
    let (p4, p6) = (c.ipv4.clone().unwrap(), c.ipv6.clone().unwrap());
    let mut a = me("a", [198, 18, 0, 1]);
    a.public_ipv6 = Some("fd00:18::1".parse().unwrap());
    let Plan::Create(s) = dual_plan(&a, None, vec![]) else {
        panic!("a fresh network has room")
    };
    let i = p4.index(&s.v4.unwrap()).unwrap();
    assert_eq!(s.v6, p6.nth(i), "{s}");
    assert_eq!(
        s.key(),
        format!(
            "{}-24&{}-64",
            s.v4.unwrap().network(),
            s.v6.unwrap().network()
        )
    );

    // A stale subnet file naming a pair no Weft node chooses: its IPv4
    // half is kept, with the IPv6 half of its own index.
    let stale = Subnets {
        v4: p4.nth(7),
        v6: p6.nth(3),
    };
    assert_eq!(
        dual_plan(&a, Some(stale), vec![]),
        Plan::Create(Subnets {
            v4: p4.nth(7),
            v6: p6.nth(7)
        })
    );

    // An IPv6 subnet held by a key of another pairing (a flannel node's)
    // makes its index unusable even though the IPv4 half is free.
    let b = me("b", [198, 18, 0, 2]);
    let held = KeyValue {
        key: format!(
            "/p/subnets/{}",
            Subnets {
                v4: p4.nth(200),
                v6: p6.nth(7)
            }
            .key()
        ),
        value: value(&b).to_json().into_bytes(),
        create_revision: 2,
        mod_revision: 2,
        version: 1,
        lease: 5,
    };
    let p = dual_plan(&a, Some(stale), vec![held]);
    assert!(
        matches!(p, Plan::Create(s) if s.v6 != p6.nth(7) && s.v4 != p4.nth(200)),
        "{p:?}"
    );
}

#[test]
fn ipv6_only_leases_use_flannels_empty_ipv4_half() {
    let c = NetworkConfig::parse(
        br#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:5::/56","Backend":{"Type":"vxlan"}}"#,
    )
    .unwrap();
    let a = Identity {
        node_id: "a".into(),
        public_ip: None,
        public_ipv6: Some("fd00:18::1".parse().unwrap()),
    };
    let v = LeaseAttrs::vxlan_v6_only(a.public_ipv6.unwrap(), 1, MacAddr([2, 0, 0, 0, 0, 1]), "a");
    let req = AcquireRequest {
        subnets_prefix: "/p/subnets/",
        config: &c,
        me: &a,
        value: &v,
        ttl: 60,
        preferred: None,
        lease_id: None,
        not_from: &[],
    };
    // Another IPv6-only node's key takes its IPv6 subnet only.
    let first = c.ipv6.as_ref().unwrap().nth(0).unwrap();
    let other = KeyValue {
        key: format!("/p/subnets/0.0.0.0-0&{}-64", first.network()),
        value: br#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:18::2"}"#.to_vec(),
        create_revision: 1,
        mod_revision: 1,
        version: 1,
        lease: 3,
    };
    let entries = parse_listing(
        "/p/subnets/",
        &Listing {
            revision: 1,
            kvs: vec![other],
        },
    );
    let (p, _) = plan(
        &req,
        &entries,
        None,
        &mut rand::rngs::StdRng::seed_from_u64(1),
    );
    let Plan::Create(s) = p else { panic!("{p:?}") };
    assert_eq!(s.v4, None);
    assert_ne!(s.v6, Some(first));
    assert!(s.key().starts_with("0.0.0.0-0&fd00:5:0:"), "{}", s.key());
}
