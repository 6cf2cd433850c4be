//! rtnetlink notifications: a device, an address or a route changed
//! somewhere on the node. Any of them may mean something Weft set up was
//! removed (a `systemctl restart networking`, an operator's mistake), so
//! each one wakes the agent to check and repair at once, rather than at the
//! next periodic pass.

use std::sync::Arc;

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
            if !is_our_new_route(&m) {
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
