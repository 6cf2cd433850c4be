//! Giving freed memory back to the system.
//!
//! The agent's largest allocations are transient: the kernel's BTF parsed
//! at start (a few MiB of type information, read to check the kernel and
//! to load the programs) and a batch of thousands of leases decoded,
//! validated and programmed at once. glibc's allocator keeps what was freed
//! in its arenas (one per thread that allocated), so the resident set stays
//! at the peak long after; trimming after those moments returns it. With
//! another allocator (musl's, in the static image) this does nothing.

/// Returns the allocator's free memory to the system, where it can.
pub(crate) fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own
    // arenas; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
