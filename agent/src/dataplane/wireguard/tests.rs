//! The tests of `wireguard`.

use super::*;
use crate::mac::MacAddr;
use std::net::{Ipv4Addr, Ipv6Addr};

fn peer(subnet: &str, vtep: IpAddr, since: i64) -> Peer {
    Peer {
        subnet: subnet.parse().unwrap(),
        vtep,
        mac: MacAddr([0; 6]),
        key: None,
        since,
    }
}

fn permutations<T: Copy>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            out.push(p);
        }
    }
    out
}

#[test]
fn a_moved_node_is_reached_at_its_newest_address_in_any_order() {
    let old = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    let new = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9));
    let old6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1));
    let new6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 9));
    // The node's old lease (revision 5) and, after its address
    // changed, its new one (revision 9), each dual-stack.
    let peers = [
        peer("10.5.1.0/24", old, 5),
        peer("fd10:0:0:1::/64", old6, 5),
        peer("10.5.7.0/24", new, 9),
        peer("fd10:0:0:7::/64", new6, 9),
    ];
    let mut orders = 0;
    for order in permutations(&[0, 1, 2, 3]) {
        let ps: Vec<&Peer> = order.iter().map(|&i| &peers[i]).collect();
        assert_eq!(endpoint(&ps, WgMode::Auto), Some(new), "{order:?}");
        assert_eq!(endpoint(&ps, WgMode::Ipv4), Some(new), "{order:?}");
        assert_eq!(endpoint(&ps, WgMode::Ipv6), Some(new6), "{order:?}");
        orders += 1;
    }
    assert_eq!(orders, 24);
    // Only the old lease's IPv6 half left: its address, not nothing.
    let ps = [&peers[0], &peers[1], &peers[2]];
    assert_eq!(endpoint(&ps, WgMode::Ipv6), Some(old6));
}
