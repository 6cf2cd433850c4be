//! rtnetlink notifications: a device, an address or a route changed
//! somewhere on the node. Any of them may mean something Weft set up was
//! removed (a `systemctl restart networking`, an operator's mistake), so
//! each one wakes the agent to check and repair at once, rather than at the
//! next periodic pass. What Weft changed itself wakes nothing: the addition
//! of one of its routes, and the removal of one it removed (a lease put and
//! deleted every few milliseconds must not make the agent check every route
//! ten times a second).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use rtnetlink::{
    constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_LINK},
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{RouteNetlinkMessage, route::RouteProtocol},
    sys::{AsyncSocket as _, SocketAddr},
};
use tokio::sync::Notify;

/// Subscribes to link, IPv4 address and IPv4 route notifications in this
/// thread's network namespace; `changed` is notified (coalescing: many
/// notifications before the agent looks count once) for each, except the
/// addition of one of Weft's own routes (nothing to repair there, and tens of
/// thousands arrive when as many leases do).
pub(crate) fn watch(changed: Arc<Notify>) -> Result<tokio::task::JoinHandle<()>> {
    let (mut conn, _handle, mut messages) =
        rtnetlink::new_connection().context("opening a netlink socket for notifications")?;
    conn.socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(
            0,
            RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE,
        ))
        .context("subscribing to link, address and route notifications")?;
    Ok(tokio::spawn(async move {
        let conn = tokio::spawn(conn);
        while let Some((m, _)) = messages.next().await {
            if !is_our_new_route(&m) && !is_our_own_removal(&m) {
                changed.notify_one();
            }
        }
        conn.abort();
    }))
}

fn is_our_new_route(m: &NetlinkMessage<RouteNetlinkMessage>) -> bool {
    matches!(
        &m.payload,
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(r))
            if r.header.protocol == RouteProtocol::Other(crate::sys::netlink::ROUTE_PROTOCOL)
    )
}

/// The removals of Weft's routes Weft itself asked for and the kernel has
/// not reported yet, by destination.
static OWN_REMOVALS: Mutex<Option<HashMap<(IpAddr, u8), u32>>> = Mutex::new(None);

/// More outstanding than this: something is off (reports lost); forget
/// them (at worst, one more check).
const OWN_REMOVALS_MAX: usize = 65_536;

/// Weft is about to remove its route to `dst/len`: its report wakes no one.
pub(crate) fn removing(dst: IpAddr, len: u8) {
    let mut m = OWN_REMOVALS.lock().expect("removals lock");
    let m = m.get_or_insert_with(HashMap::new);
    if m.len() >= OWN_REMOVALS_MAX {
        m.clear();
    }
    *m.entry((dst, len)).or_default() += 1;
}

/// The removal of `dst/len` was not done after all (there was no route).
pub(crate) fn not_removed(dst: IpAddr, len: u8) {
    take(dst, len);
}

fn take(dst: IpAddr, len: u8) -> bool {
    let mut m = OWN_REMOVALS.lock().expect("removals lock");
    let Some(m) = m.as_mut() else { return false };
    match m.get_mut(&(dst, len)) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            m.remove(&(dst, len));
            true
        }
        None => false,
    }
}

fn is_our_own_removal(m: &NetlinkMessage<RouteNetlinkMessage>) -> bool {
    use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute};
    let NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(r)) = &m.payload else {
        return false;
    };
    if r.header.protocol != RouteProtocol::Other(crate::sys::netlink::ROUTE_PROTOCOL) {
        return false;
    }
    let dst = r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    });
    dst.is_some_and(|d| take(d, r.header.destination_prefix_length))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_removals_weft_asked_for_are_its_own() {
        let a: IpAddr = "10.9.1.0".parse().unwrap();
        removing(a, 24);
        removing(a, 24);
        assert!(take(a, 24) && take(a, 24), "each removal once");
        assert!(!take(a, 24), "a third is someone else's");
        removing(a, 24);
        not_removed(a, 24);
        assert!(!take(a, 24));
    }
}
