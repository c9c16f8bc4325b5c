//! The way out of `run`: what a replica that led writes before it exits.

use crate::app::App;
use crate::monitor::status_sync::StatusSync;
use std::time::Duration;

/// The longest the last flush may take (the pod's grace period is longer).
const LAST_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// A replica that led until now writes what only it holds. Unacknowledged agent batches would be
/// resent to the next leader anyway; Goldmane's flows and violation observations would not. After a
/// lost Lease (`still_leading` false) the proposals are left to the new leader (the writer writes
/// only while leading), but the violation observations are still patched into statuses: those
/// patches carry the cached resourceVersion, so they cannot overwrite what the new leader wrote
/// meanwhile (a conflict just fails), and the records merge. A replica whose status sync has run
/// has led.
pub async fn last_flush(app: &App, status_sync: &StatusSync, still_leading: bool) {
    if !(app.writer.is_leader() || status_sync.passes() > 0) {
        return;
    }
    let last = async {
        let report = app.flusher.last_flush().await;
        // Only a sync that has run before has listed the policies the observations belong to.
        let synced = if status_sync.passes() > 0 {
            if !still_leading {
                status_sync.stop_persisting_claims();
            }
            status_sync.attribute_evidence();
            let synced = status_sync.sync_all().await;
            // The history as it is now, for the next leader; not after a lost Lease: a new leader
            // may already have read and written it.
            if still_leading {
                status_sync.persist_history().await;
            }
            Some(synced)
        } else {
            None
        };
        tracing::info!(?report, ?synced, "last flush before exit");
    };
    if tokio::time::timeout(LAST_FLUSH_TIMEOUT, last)
        .await
        .is_err()
    {
        tracing::warn!("the last flush did not finish within {LAST_FLUSH_TIMEOUT:?}");
    }
}

/// Resolves on SIGTERM (Kubernetes) or Ctrl-C: `run` then stops serving at once (agents' streams
/// never end on their own, so a graceful gRPC shutdown would wait for the kill) and writes what is
/// pending.
pub fn signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use anyhow::Context as _;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("stopping: writing pending proposals and violations, flushing OTLP events");
    })
}
