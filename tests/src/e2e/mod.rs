//! The whole product in the local cluster, as users run it: our images built from the workspace's
//! binaries, our chart `helm install`ed ([`release`]), real workloads and traffic sent from inside their
//! pods ([`workload`]), and the end-to-end scenario (docs/development.md) over all of it
//! ([`scenario`]). Used by `tests/tests/chart_install.rs`, `tests/tests/e2e.rs`, `cargo xtask demo` and
//! `cargo xtask bench e2e`.
//!
//! Everything here is synchronous (kubectl, helm, ctr as child processes), so the xtask commands can use
//! it without a runtime.

pub mod guardrail;
pub mod latency;
pub mod release;
pub mod scenario;
pub mod sources;
pub mod workload;

use anyhow::{Result, bail};

pub use crate::wait::poll;

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// From now on SIGINT (Ctrl-C) and SIGTERM only set a flag ([`interrupted`]), so that a long-running
/// command (the demo) can clean up what it created instead of dying on the spot. Child processes get
/// the default handlers back when they exec.
pub fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// True once SIGINT or SIGTERM arrived after [`catch_interrupts`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Fails when [`interrupted`]: call between steps so that a Ctrl-C unwinds through the clean-up guards.
pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}
