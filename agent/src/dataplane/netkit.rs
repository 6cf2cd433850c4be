//! Programs on netkit devices, through the `bpf(2)` system call itself:
//! aya 0.14 creates TCX, XDP and other links but not netkit's
//! (`BPF_LINK_CREATE` with `BPF_NETKIT_PRIMARY` or `BPF_NETKIT_PEER`). This
//! is the small wrapper Weft uses until aya has it; it does what aya does
//! for TCX: create a link, swap its program (`BPF_LINK_UPDATE`), query what
//! runs at a hook (`BPF_PROG_QUERY`), pin and open a link.
//!
//! A netkit pair is managed from the host only: both hooks are named by
//! the *primary*'s (the host side's) index, the peer hook being the
//! program that runs when the pod transmits (in the pod's own transmit
//! path, with the packet already on the primary), the primary hook the one
//! that runs when the host transmits to the pod.

use std::{
    io,
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd},
    path::Path,
};

use crate::sys::bpf::{Attr, BPF_LINK_CREATE, BPF_LINK_UPDATE, BPF_PROG_QUERY, bpf, owned};
pub(crate) use crate::sys::bpf::{open_pin, pin};

/// A netkit pair's hook (`enum bpf_attach_type`). Weft runs a program at
/// the peer hook only: what the host transmits to a pod
/// (`BPF_NETKIT_PRIMARY`, 54) needs none of Weft's, and what Weft delivers
/// into a pod enters the peer directly (`bpf_redirect_peer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NetkitHook {
    /// What the pod transmits (from the pod).
    Peer = 55,
}

/// Attaches `prog` (a `BPF_PROG_TYPE_SCHED_CLS` program: netkit runs TC
/// programs, whose verdicts it shares) at `hook` of the netkit pair whose
/// primary is `primary_ifindex`, after what runs there already. The link
/// lasts as long as its descriptor or a pin of it, or until the device
/// goes.
pub(crate) fn attach(
    prog: BorrowedFd<'_>,
    primary_ifindex: u32,
    hook: NetkitHook,
) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    // link_create: prog_fd, target_ifindex, attach_type, flags, then
    // netkit's relative_fd and expected_revision (none: append).
    a.put_u32(0, prog.as_raw_fd() as u32)
        .put_u32(4, primary_ifindex)
        .put_u32(8, hook as u32);
    bpf(BPF_LINK_CREATE, &mut a).map(owned)
}

/// Swaps the program `link` runs for `prog`, atomically: packets see one
/// or the other, never neither.
pub(crate) fn update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut a = Attr::new();
    // link_update: link_fd, new_prog_fd, flags, old_prog_fd.
    a.put_u32(0, link.as_raw_fd() as u32)
        .put_u32(4, prog.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut a).map(|_| ())
}

/// The ids of the programs that run at `hook` of the pair whose primary is
/// `primary_ifindex`, in order. `ENXIO` if that device is not a netkit,
/// `EACCES` if it is a pair's peer, `ENODEV` if there is no such device.
pub(crate) fn query(primary_ifindex: u32, hook: NetkitHook) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    let mut a = Attr::new();
    // query: target_ifindex, attach_type, query_flags, attach_flags,
    // prog_ids, count.
    a.put_u32(0, primary_ifindex)
        .put_u32(4, hook as u32)
        .put_u64(16, ids.as_mut_ptr() as u64)
        .put_u32(24, ids.len() as u32);
    bpf(BPF_PROG_QUERY, &mut a)?;
    let n = (a.u32_at(24) as usize).min(ids.len());
    Ok(ids[..n].to_vec())
}

/// Attaches `prog` at `hook` of the pair whose primary is
/// `primary_ifindex` and pins the link at `pin_path`, or, where a link is
/// pinned there already, swaps `prog` into it. Returns whether an existing
/// link was reused.
pub(crate) fn attach_pinned(
    prog: impl AsFd,
    primary_ifindex: u32,
    hook: NetkitHook,
    pin_path: &Path,
) -> io::Result<bool> {
    if let Some(link) = open_pin(pin_path)? {
        match update(link.as_fd(), prog.as_fd()) {
            Ok(()) => return Ok(true),
            // The device went and came back with this index, or the pin
            // is not a link: attach anew.
            Err(e) => {
                tracing::warn!(pin = %pin_path.display(), error = %e, "pinned netkit link is unusable; attaching anew");
                std::fs::remove_file(pin_path)?;
            }
        }
    }
    let link = attach(prog.as_fd(), primary_ifindex, hook)?;
    pin(link.as_fd(), pin_path)?;
    Ok(false)
}
