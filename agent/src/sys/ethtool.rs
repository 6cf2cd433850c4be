//! `SIOCETHTOOL`: the one setting the datapath needs, GRO on the uplink;
//! what `weft doctor` reads (GRO, transmit checksum offload); and a
//! device's driver (which tells a veth from a bridge, in any mount
//! namespace, unlike sysfs).
//!
//! Decapsulated packets are handed to the stack by XDP (XDP_PASS); GRO then
//! merges the inner TCP segments before they are routed to the pods. Physical
//! NICs have GRO on by default; a veth uplink does not, and without it every
//! decapsulated frame is routed on its own.

use std::{ffi::CString, io};

use anyhow::{Context as _, Result, bail};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_GDRVINFO: u32 = 0x03;

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ethtool_drvinfo`.
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    counts: [u32; 5],
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ioctl(iface: &str, cmd: u32, data: u32) -> Result<u32> {
    let mut value = EthtoolValue { cmd, data };
    raw(iface, (&mut value as *mut EthtoolValue).cast())?;
    Ok(value.data)
}

/// The driver of `iface`: "veth", "bridge", "netkit", "virtio_net", ...
pub(crate) fn driver(iface: &str) -> Result<String> {
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        counts: [0; 5],
    };
    raw(iface, (&mut info as *mut DrvInfo).cast())?;
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// SIOCETHTOOL on `iface` with the command block at `data` (its first word
/// the command; the kernel reads and writes it by that command's size).
fn raw(iface: &str, data: *mut libc::c_void) -> Result<()> {
    let name = CString::new(iface)?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        bail!("interface name {iface:?} is too long");
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    for (d, s) in req.name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a datagram socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("socket for ethtool");
    }
    // SAFETY: SIOCETHTOOL with a valid ifreq pointing at a command block
    // the caller sized for its command.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req as *mut IfReq) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the fd we opened.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err).with_context(|| format!("ethtool on {iface}"));
    }
    Ok(())
}

/// Turns GRO on for `iface`; returns whether it was off.
pub(crate) fn ensure_gro(iface: &str) -> Result<bool> {
    if ioctl(iface, ETHTOOL_GGRO, 0)? != 0 {
        return Ok(false);
    }
    ioctl(iface, ETHTOOL_SGRO, 1)?;
    Ok(true)
}

/// Whether GRO is on for `iface`.
pub(crate) fn gro(iface: &str) -> Result<bool> {
    Ok(ioctl(iface, ETHTOOL_GGRO, 0)? != 0)
}

/// Whether transmit checksum offload is on for `iface`.
pub(crate) fn tx_checksum(iface: &str) -> Result<bool> {
    Ok(ioctl(iface, ETHTOOL_GTXCSUM, 0)? != 0)
}
