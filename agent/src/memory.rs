//! Keeping the agent's resident memory bounded (docs/operations.md, "The agent's memory").
//!
//! What the agent holds while it runs is small (the ring buffer, the edges of one flush interval, the
//! debug API's recent edges). What made its peak was the start: the kernel's BTF (5 MB or more) is
//! parsed three times by aya (loading the live programs, loading the start-up scan's iterator and
//! attaching it), and glibc gave each thread that did so its own arena, keeping what they freed.

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]
/// ([`network_enforcer_api::memory::bound_malloc_arenas`]). Call it before any thread starts.
pub fn bound_malloc_arenas() {
    network_enforcer_api::memory::bound_malloc_arenas(MALLOC_ARENAS);
}

/// glibc's malloc arenas the agent allows (glibc's default is 8 per core: 512 on a 64-core node).
/// The agent's hot path is one task; two arenas are enough to keep its threads from contending.
pub const MALLOC_ARENAS: i32 = 2;

pub use network_enforcer_api::memory::release_freed;
