//! glibc malloc settings the agent and the controller share (docs/operations.md, memory).
//!
//! glibc gives each thread that contends for the allocator an arena of its own, up to 8 per core, and
//! an arena keeps what its threads freed. A server whose buffers are allocated on one thread and freed
//! on another (an async runtime's workers, a blocking pool) then holds several copies of its working set.

/// Caps glibc's malloc arenas at `arenas`: threads then reuse the memory other threads freed instead of
/// each growing an arena of its own. Call it before any thread starts. A no-op off glibc.
pub fn bound_malloc_arenas(arenas: i32) {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = arenas;
}

/// Hands memory freed after a burst back to the kernel: glibc keeps freed memory for reuse, and pages it
/// never reuses would stay resident. A no-op off glibc.
pub fn release_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
