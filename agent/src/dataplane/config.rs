//! What every program config holds whatever the backend: the node's pod
//! subnets, conntrack's timeouts for the fast path to refresh, and how host
//! routing runs. The backends add their devices and families.

use dataplane_common::{
    CONFIG_F_BYPASS, CONFIG_F_CT_GATE, CONFIG_F_READY, CONFIG_F_SOURCE_CHECK, CONFIG_F_TRACE_DROPS,
    DataplaneConfig,
};

use super::{conntrack, trace, types::HostRouting};
use crate::lease::Subnets;

/// The config's common part (flags: ready, host routing's, the drop
/// trace's).
pub(crate) fn node_config(
    subnets: &Subnets,
    host_routing: HostRouting,
    has_conntrack: bool,
) -> DataplaneConfig {
    let ct = conntrack::Refresh::read();
    DataplaneConfig {
        subnet4_be: subnets
            .v4
            .map_or(0, |s| u32::from_ne_bytes(s.network().octets())),
        mask4_be: subnets
            .v4
            .map_or(0, |s| u32::from_ne_bytes(s.netmask().octets())),
        subnet6: subnets.v6.map_or([0; 16], |s| s.network().octets()),
        mask6: subnets.v6.map_or([0; 16], |s| s.netmask().octets()),
        ct_tcp_timeout_ms: ct.tcp_ms,
        ct_udp_timeout_ms: ct.udp_ms,
        ct_tcp_refresh_jiffies: ct.tcp_jiffies,
        ct_udp_refresh_jiffies: ct.udp_jiffies,
        ct_udp_unreplied_ms: ct.udp_unreplied_ms,
        ct_udp_unreplied_refresh_jiffies: ct.udp_unreplied_jiffies,
        flags: CONFIG_F_READY
            | if trace::on() { CONFIG_F_TRACE_DROPS } else { 0 }
            | match host_routing {
                HostRouting::Legacy => 0,
                HostRouting::Bpf => CONFIG_F_BYPASS,
                HostRouting::Auto if has_conntrack => CONFIG_F_BYPASS | CONFIG_F_CT_GATE,
                // Without conntrack's kfuncs nothing can tell which flows
                // netfilter would let through unchanged: no bypass, but
                // pods' sources are still checked.
                HostRouting::Auto => CONFIG_F_SOURCE_CHECK,
            },
        ..DataplaneConfig::default()
    }
}
