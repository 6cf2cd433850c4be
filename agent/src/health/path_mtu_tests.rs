//! The tests of `path_mtu`.

use super::*;

const T: Duration = Duration::from_secs(1);

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// The echo a peer sends back for a probe of `size` outer bytes.
fn echo(size: u32) -> usize {
    (size - dataplane_common::VXLAN_OVERHEAD) as usize
}

/// Runs the search against a path that carries up to `path` bytes,
/// answering or not, until it settles; returns the MTU told.
fn settle(p: &mut PathMtus, path: u32, mut now: Instant) -> (Option<u32>, Instant, usize) {
    let mut probes = 0;
    let mut told = None;
    for _ in 0..200 {
        p.expire(now);
        for (to, size, seq) in p.due(now, 10) {
            probes += 1;
            if size <= path {
                p.answered(seq, to, echo(size), now + Duration::from_millis(1));
            }
        }
        for (_, m) in p.take_changes() {
            told = Some(m);
        }
        if p.peers
            .values()
            .all(|e| e.in_flight.is_none() && e.next_at > Tick::of(now + T))
        {
            break;
        }
        now = p.next_event().unwrap().max(now + Duration::from_millis(1));
    }
    (told.flatten(), now, probes)
}

/// 50,000 peers: each record counts (a search and a health entry,
/// each beside an 18-byte key in a map and in a schedule).
#[test]
fn records_stay_small() {
    assert!(std::mem::size_of::<Search>() <= 64);
    assert!(std::mem::size_of::<super::super::table::Entry>() <= 64);
    assert_eq!(std::mem::size_of::<(Tick, IpNet)>(), 32);
}

#[test]
fn a_jumbo_path_is_found_in_two_probes() {
    let now = Instant::now();
    let mut p = PathMtus::new(9000, T, Duration::from_secs(10));
    p.upsert(net("10.244.2.0/24"), "192.0.2.2".parse().unwrap(), now);
    let (mtu, _, probes) = settle(&mut p, 9000, now);
    assert_eq!(mtu, Some(9000));
    assert_eq!(probes, 2, "the base size, then the uplink's");
}

#[test]
fn a_smaller_hop_is_found_among_the_plateaus() {
    let now = Instant::now();
    let mut p = PathMtus::new(9000, T, Duration::from_secs(10));
    p.upsert(net("10.244.3.0/24"), "192.0.2.3".parse().unwrap(), now);
    let (mtu, _, probes) = settle(&mut p, 1500, now);
    assert_eq!(mtu, Some(1500));
    assert!(probes <= 12, "{probes} probes");
    // A path between plateaus is measured at the plateau below it.
    let mut p = PathMtus::new(9000, T, Duration::from_secs(10));
    p.upsert(net("10.244.3.0/24"), "192.0.2.3".parse().unwrap(), now);
    assert_eq!(settle(&mut p, 1410, now).0, Some(1400));
}

#[test]
fn a_vtep_goes_back_to_the_base_size_once_no_peer_has_it() {
    let now = Instant::now();
    let mut p = PathMtus::new(9000, T, Duration::from_secs(10));
    let (shared, alone): (IpAddr, IpAddr) =
        ("192.0.2.2".parse().unwrap(), "192.0.2.3".parse().unwrap());
    let peers = [
        (net("10.244.2.0/24"), shared),
        (net("10.244.4.0/24"), shared),
        (net("10.244.3.0/24"), alone),
    ];
    p.set_peers(&peers, now);
    assert_eq!(settle(&mut p, 9000, now).0, Some(9000));
    p.take_changes();
    // One of the shared VTEP's subnets and the other VTEP's go at once.
    p.set_peers(&peers[..1], now);
    let IpAddr::V4(alone) = alone else { panic!() };
    assert_eq!(p.take_changes(), [(alone, None)]);
    assert_eq!(p.get(&peers[0].0).map(|m| m.mtu), Some(9000));
}

#[test]
fn a_path_that_shrinks_is_searched_again() {
    let now = Instant::now();
    let mut p = PathMtus::new(1500, T, Duration::from_secs(10));
    let s = net("10.244.3.0/24");
    p.upsert(s, "192.0.2.3".parse().unwrap(), now);
    let (mtu, now, _) = settle(&mut p, 1500, now);
    assert_eq!(mtu, Some(1500));
    assert_eq!(p.get(&s).unwrap().mtu, 1500);
    // The hop drops to 1400: the recheck at 1500 goes unanswered, the
    // MTU goes back to the base, and the search finds 1400.
    let mut told = Vec::new();
    let mut t = now;
    for _ in 0..100 {
        p.expire(t);
        for (to, size, seq) in p.due(t, 10) {
            if size <= 1400 {
                p.answered(seq, to, echo(size), t);
            }
        }
        told.extend(p.take_changes().into_iter().map(|(_, m)| m));
        if told.last() == Some(&Some(1400)) {
            break;
        }
        t = p.next_event().unwrap().max(t + Duration::from_millis(1));
    }
    assert_eq!(told, vec![None, Some(1400)]);
    assert!(
        t.duration_since(now) < Duration::from_secs(20),
        "{:?}",
        t.duration_since(now)
    );
}

#[test]
fn fragmentation_needed_only_makes_the_size_in_use_be_checked() {
    let now = Instant::now();
    let mut p = PathMtus::new(9000, T, Duration::from_secs(10));
    let s = net("10.244.3.0/24");
    let vtep: Ipv4Addr = "192.0.2.3".parse().unwrap();
    p.upsert(s, IpAddr::V4(vtep), now);
    let (mtu, now, _) = settle(&mut p, 1500, now);
    assert_eq!(mtu, Some(1500));
    p.take_changes();
    // A forged message naming 1280 (RFC 8899 4.6: a reason to probe):
    // the size in use is probed at once, it is still carried, and
    // nothing changes. A probe of the named size, which always gets
    // through, is never sent.
    p.hint(vtep, 1280, now);
    assert_eq!(p.hints, 1);
    let due = p.due(now, 10);
    assert_eq!(due.iter().map(|d| d.1).collect::<Vec<_>>(), [1500]);
    p.answered(due[0].2, due[0].0, echo(1500), now);
    assert!(p.take_changes().is_empty());
    assert_eq!(p.get(&s).unwrap().mtu, 1500);
    assert_eq!(p.hints_confirmed, 0);
    // Another hint so soon is not taken (a check a recheck period).
    p.hint(vtep, 1280, now);
    assert!(p.due(now, 10).is_empty());
    // Forged answers do not count: another size, another source.
    let now = now + Duration::from_secs(11);
    p.expire(now);
    p.hint(vtep, 1280, now);
    let due = p.due(now, 10);
    p.answered(due[0].2, due[0].0, echo(1280), now);
    p.answered(due[0].2, IpAddr::from([10, 9, 9, 9]), echo(1500), now);
    assert!(
        p.peers[&s].in_flight.is_some(),
        "still waiting for a real answer"
    );
    // The hop really drops to 1400 while a hint (naming 1280) is being
    // checked: the size in use is lost, so the named size is used at
    // once, and the search goes up from it to what is carried.
    let mut t = now;
    let mut told = Vec::new();
    for _ in 0..100 {
        p.expire(t);
        for (to, size, seq) in p.due(t, 10) {
            if size <= 1400 {
                p.answered(seq, to, echo(size), t);
            }
        }
        told.extend(p.take_changes().into_iter().map(|(_, m)| m));
        if told.last() == Some(&Some(1400)) {
            break;
        }
        t = p.next_event().unwrap().max(t + Duration::from_millis(1));
    }
    assert_eq!(told, vec![Some(1280), Some(1400)]);
    assert_eq!(p.hints_confirmed, 1);
    assert!(
        t.duration_since(now) < Duration::from_secs(20),
        "{:?}",
        t.duration_since(now)
    );
    // Sizes at or above the one in use, and below the floor, are no
    // news.
    let hints = p.hints;
    p.hint(vtep, 1400, t);
    p.hint(vtep, 576, t);
    assert_eq!(p.hints, hints);
}

#[test]
fn a_path_that_went_down_is_measured_again_from_the_top() {
    let now = Instant::now();
    let mut p = PathMtus::new(1500, T, Duration::from_secs(2));
    let s = net("10.244.3.0/24");
    p.upsert(s, "192.0.2.3".parse().unwrap(), now);
    let (mtu, now, _) = settle(&mut p, 1500, now);
    assert_eq!(mtu, Some(1500));
    // A cut: nothing gets through for 20 s.
    let mut t = now;
    while t < now + Duration::from_secs(20) {
        p.expire(t);
        let _ = p.due(t, 10);
        t = p.next_event().unwrap().max(t + Duration::from_millis(1));
    }
    assert!(p.get(&s).is_none(), "the cut took the measured size");
    // Lifted: the full size again, not what a search cut short went
    // down to (soon searched upwards again).
    for _ in 0..10 {
        t = settle(&mut p, 1500, t).1 + Duration::from_secs(2);
    }
    assert_eq!(p.get(&s).map(|m| m.mtu), Some(1500));
}

#[test]
fn a_flood_of_forged_hints_costs_probes_not_the_path() {
    let now = Instant::now();
    let mut p = PathMtus::new(1500, T, Duration::from_secs(2));
    let s = net("10.244.3.0/24");
    let vtep: Ipv4Addr = "192.0.2.3".parse().unwrap();
    p.upsert(s, IpAddr::V4(vtep), now);
    let (_, mut t, _) = settle(&mut p, 1500, now);
    let mut probes = 0;
    for _ in 0..3000 {
        // 100 hints a probe round, every one forged.
        for _ in 0..100 {
            p.hint(vtep, 1280, t);
        }
        p.expire(t);
        for (to, size, seq) in p.due(t, 10) {
            probes += 1;
            assert_eq!(size, 1500, "only the size in use is probed");
            p.answered(seq, to, echo(size), t);
        }
        t += Duration::from_millis(10);
    }
    assert!(p.take_changes().is_empty());
    assert_eq!(p.get(&s).unwrap().mtu, 1500);
    // One check per recheck period at most (2 s) over 30 s.
    assert!(probes <= 16, "{probes} probes");
}

#[test]
fn an_unreachable_peer_is_not_measured_and_ipv6_is_not_searched() {
    let now = Instant::now();
    let mut p = PathMtus::new(9000, T, Duration::from_secs(10));
    p.upsert(net("10.244.4.0/24"), "192.0.2.4".parse().unwrap(), now);
    p.upsert(net("fd00::/64"), "2001:db8::4".parse().unwrap(), now);
    assert_eq!(p.len(), 1);
    let (mtu, _, probes) = settle(&mut p, 0, now);
    assert_eq!(mtu, None);
    assert!(probes > 0);
    assert!(p.get(&net("10.244.4.0/24")).is_none());
}
