//! Keeping the agent's resident set small: one allocator arena, and freed
//! memory given back to the system.
//!
//! glibc's allocator gives each thread that allocates an arena of its own
//! (up to eight per CPU); the agent's threads (the async runtime, the
//! netlink and loader helpers, the conntrack marker) each leave one behind
//! holding what they freed. With 5,000 peers that was 13 of the agent's
//! 29.6 MiB (`cargo xtask bench control-plane`: 16.7 MiB with one arena).
//! The agent allocates little on its hot paths, so one arena costs nothing
//! measurable.
//!
//! The agent's largest allocations are transient: the kernel's BTF parsed
//! at start (a few MiB of type information, read to check the kernel and
//! to load the programs) and a batch of thousands of leases decoded,
//! validated and programmed at once. glibc's allocator keeps what was freed
//! in its arenas (one per thread that allocated), so the resident set stays
//! at the peak long after; trimming after those moments returns it. With
//! another allocator (musl's, in the static image) this does nothing.

/// The size from which an allocation is a mapping of its own, returned to
/// the system when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 256 << 10;

/// One allocator arena for every thread, and large blocks always mapped
/// apart; call before starting threads.
///
/// glibc raises its mmap threshold to the largest block freed so far (up
/// to 32 MiB), after which multi-MiB temporaries (a route dump of every
/// peer's route, a batch of leases decided at once) land in the arena and
/// stay resident between trims. A fixed threshold keeps them mappings.
pub(crate) fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes tunables of the allocator; called
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns the allocator's free memory to the system, where it can.
pub(crate) fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own
    // arenas; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
