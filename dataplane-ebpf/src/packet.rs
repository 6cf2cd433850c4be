//! Bounds-checked access to packet bytes: the one place that turns packet
//! offsets into reads and writes.

use aya_ebpf::programs::TcContext;
use dataplane_common::Reason;

use crate::headers::csum_replace;

/// Reads a `T` at `off` bytes into the packet `[data, end)`, or None when
/// it does not lie entirely inside.
#[inline(always)]
pub(crate) fn read<T: Copy>(data: usize, end: usize, off: usize) -> Option<T> {
    if data + off + core::mem::size_of::<T>() > end {
        return None;
    }
    // SAFETY: the bytes lie inside the packet (checked above), and
    // read_unaligned has no alignment requirement.
    Some(unsafe { core::ptr::read_unaligned((data + off) as *const T) })
}

/// Writes `v` at `off` bytes into the packet, or returns false when it does
/// not fit.
#[inline(always)]
pub(crate) fn write<T: Copy>(data: usize, end: usize, off: usize, v: T) -> bool {
    if data + off + core::mem::size_of::<T>() > end {
        return false;
    }
    // SAFETY: the bytes lie inside the packet (checked above), the program
    // may write it (TC and XDP packet data is writable), and write_unaligned
    // has no alignment requirement.
    unsafe { core::ptr::write_unaligned((data + off) as *mut T, v) };
    true
}

/// The packet's bounds once its first `want` bytes (or all of it, if it is
/// shorter) are in the linear part, pulling them in if they are not.
#[inline(always)]
pub(crate) fn linear(ctx: &TcContext, want: usize) -> Result<(usize, usize), Reason> {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + want <= end {
        return Ok((data, end));
    }
    let n = if (ctx.len() as usize) < want {
        ctx.len()
    } else {
        want as u32
    };
    ctx.pull_data(n).map_err(|_| Reason::DropError)?;
    Ok((ctx.data(), ctx.data_end()))
}

/// An IPv6 address as two words (no memcmp in eBPF).
#[inline(always)]
fn words(x: &[u8; 16]) -> (u64, u64) {
    let w = |i: usize| {
        u64::from_ne_bytes([
            x[i],
            x[i + 1],
            x[i + 2],
            x[i + 3],
            x[i + 4],
            x[i + 5],
            x[i + 6],
            x[i + 7],
        ])
    };
    (w(0), w(8))
}

/// Whether two IPv6 addresses are equal.
#[inline(always)]
pub(crate) fn eq16(a: &[u8; 16], b: &[u8; 16]) -> bool {
    words(a) == words(b)
}

/// Whether the IPv6 address `a` lies in `net`/`mask` (a zero mask: no
/// subnet, nothing lies in it).
#[inline(always)]
pub(crate) fn in_subnet6(a: &[u8; 16], net: &[u8; 16], mask: &[u8; 16]) -> bool {
    let ((a0, a1), (n0, n1), (m0, m1)) = (words(a), words(net), words(mask));
    m0 != 0 && a0 & m0 == n0 && a1 & m1 == n1
}

/// Whether the IPv4 address `a` (network order) lies in `net`/`mask`
/// (network order; a zero mask: no subnet).
#[inline(always)]
pub(crate) fn in_subnet4(a: u32, net: u32, mask: u32) -> bool {
    mask != 0 && a & mask == net
}

/// Decrements the TTL of the IPv4 header at `off`, updating its checksum.
#[inline(always)]
pub(crate) fn dec_ttl(data: usize, end: usize, off: usize) -> bool {
    let (Some(w), Some(csum)) = (
        read::<[u8; 2]>(data, end, off + 8),
        read::<u16>(data, end, off + 10),
    ) else {
        return false;
    };
    let new = [w[0].wrapping_sub(1), w[1]];
    let csum = csum_replace(csum, u16::from_ne_bytes(w), u16::from_ne_bytes(new));
    write(data, end, off + 8, new) && write(data, end, off + 10, csum)
}
