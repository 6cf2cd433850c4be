//! Weft's eBPF programs: VXLAN encapsulation (TC) and decapsulation (XDP,
//! with a TC fallback), byte-compatible with the kernel's vxlan device,
//! host routing for pods, and the wireguard backend's fast path.
//!
//! Grouped by where they attach, as the programs of a node meet a packet:
//! - `pod/`: the host side of each pod's veth (what a pod sends, checked
//!   and taken to a remote node), and what is put into a pod;
//! - `overlay/`: the overlay devices (encapsulation, and what the kernel's
//!   vxlan device decapsulated);
//! - `uplink/`: the node's uplink (decapsulation in XDP or TC, and delivery
//!   to pods after GRO);
//! - `wireguard/`: the wireguard backend's pod and device programs.
//!
//! Each entry point is one `run::run` of a fallible body, which counts
//! its outcome exactly once: a verdict under its reason, or a drop under
//! the drop's reason (and, with `--trace-drops`, a log record). What they
//! share: the headers and packet access, the address families, the maps,
//! conntrack's gate and the drop trace.
#![no_std]
#![no_main]

mod ct;
mod family;
mod headers;
mod maps;
mod overlay;
mod packet;
mod pod;
mod run;
mod trace;
mod uplink;
mod verdict;
mod wireguard;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
