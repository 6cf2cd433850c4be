//! The names of the devices the VXLAN backend makes, by VNI (flannel's,
//! with `weft` for `flannel`): what the backend creates and what teardown
//! removes.

/// The overlay device's name for a VNI (flannel: `flannel.<VNI>`).
pub(crate) fn device_name(vni: u32) -> String {
    format!("weft.{vni}")
}

/// The IPv6 overlay device's name for a VNI (flannel: `flannel-v6.<VNI>`).
pub(crate) fn device6_name(vni: u32) -> String {
    format!("weft-v6.{vni}")
}

/// The receive device of a node without IPv6 (with IPv6, the IPv6 device
/// receives for both families).
pub(crate) fn receive_device_name(vni: u32) -> String {
    format!("weft-rx.{vni}")
}
