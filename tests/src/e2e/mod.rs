//! The whole product in the local cluster, as users run it: our images built from the workspace's
//! binaries, our chart `helm install`ed ([`release`]), real workloads and traffic sent from inside their
//! pods. Used by `tests/tests/chart_install.rs`, `tests/tests/e2e.rs`, `cargo xtask demo`
//! and `cargo xtask bench e2e`.
//!
//! Everything here is synchronous (kubectl, helm, ctr as child processes), so the xtask commands can use
//! it without a runtime.

pub mod release;

use anyhow::{Result, bail};
use std::time::{Duration, Instant};

/// Polls `check` every `every` until it returns `Some`, failing after `timeout` with `what`, the last
/// error and `describe()` (what the cluster looked like) to make the failure readable.
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
    describe: impl Fn() -> String,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what}{}\n{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default(),
                describe()
            );
        }
        std::thread::sleep(every);
    }
}
