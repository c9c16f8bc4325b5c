//! The evidence claims persisted between leaders ([`crate::ingest::claims_store`]): read before any
//! batch is taken, written after the statuses and before the acknowledgements they allow.

use super::*;
use crate::ingest::claims_store::{self, StoreError};

/// The longest one read of the persisted claims may take: agents' streams wait for it.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest one write may take: acknowledgements of what counted wait for it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

impl StatusSync {
    /// Reads the claims a previous leader persisted into the ingest's [`Claims`], which take batches
    /// from then on. An API error is retried (1, 2, 4 s); after that this leader starts without them
    /// and never writes over them. Damaged data is said and written over.
    pub async fn restore_claims(&self) {
        let Some(store) = &self.settings.claims_store else {
            return;
        };
        if self.claims.ready() {
            return;
        }
        let mut wait = Duration::from_secs(1);
        let persisted = loop {
            let read = tokio::time::timeout(READ_TIMEOUT, store.load())
                .await
                .unwrap_or_else(|_| Err(StoreError::TimedOut(store.name().to_string())));
            match read {
                Ok(persisted) => break persisted,
                Err(error @ StoreError::Corrupt { .. }) => {
                    self.metrics.claims_store_failures.inc();
                    tracing::warn!(%error, "the persisted evidence claims are left out");
                    break Default::default();
                }
                // Forbidden (the ConfigMap's RBAC is missing) does not pass with time.
                Err(error) if wait <= Duration::from_secs(4) && !error.is_forbidden() => {
                    self.metrics.claims_store_failures.inc();
                    tracing::warn!(%error, retry_in = ?wait, "reading the persisted evidence claims failed");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(error) => {
                    self.metrics.claims_store_failures.inc();
                    self.claims_writable.store(false, Ordering::Release);
                    tracing::warn!(%error,
                        "the persisted evidence claims could not be read: starting without them (a batch \
                         the last leader counted may count again if resent) and not writing over them");
                    break Default::default();
                }
            }
        };
        let processes = persisted.claims.len();
        // The cursors first: the sources wait for the claims to be ready, then read them.
        let sources = persisted.cursors.len();
        self.claims.cursors.restore(persisted.cursors);
        let dropped = self.claims.restore(persisted.claims);
        self.metrics.claims_restored.set(processes as i64);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "persisted evidence claims beyond the bounds are left out"
            );
        }
        tracing::info!(
            processes,
            sources,
            store = store.name(),
            "evidence claims read"
        );
    }

    /// A replica that lost its Lease writes no claims any more: the new leader may have read and
    /// written them already.
    pub fn stop_persisting_claims(&self) {
        self.claims_writable.store(false, Ordering::Release);
    }

    /// At the end of a status pass, once every observation of the drains up to `drained` (but
    /// those still being attributed) is written: persists the claims of the batches whose evidence
    /// those drains hold, then lets their acknowledgements go ([`crate::ingest::claims::ClaimGate::persisted`]). A batch
    /// that counted is never acknowledged before that ([`crate::ingest::claims::ClaimGate::may_acknowledge`]). An
    /// unchanged snapshot is not written again. A failing write is logged and counted and lets the
    /// acknowledgements go anyway: a crash before the next write may then count a resent batch
    /// twice (docs/behaviour.md §3.6), which is better than holding every agent's
    /// acknowledgements behind one ConfigMap.
    pub(super) async fn persist_claims(&self, drained: u64) {
        let Some(store) = &self.settings.claims_store else {
            return;
        };
        let target = self.queue.settleable(drained);
        if !self.all_written() {
            return;
        }
        let snapshot = self.claims.snapshot(|mark| mark < target);
        if self.claims_writable.load(Ordering::Acquire) {
            let mut written = self.claims_written.lock().await;
            let unchanged = written.as_ref().is_some_and(|(claims, cursors)| {
                *claims == snapshot.claims && *cursors == snapshot.cursors
            });
            if !unchanged {
                let (bytes, cut) = claims_store::encode(&snapshot.claims, &snapshot.cursors);
                let saved = tokio::time::timeout(WRITE_TIMEOUT, store.save(bytes))
                    .await
                    .unwrap_or_else(|_| Err(StoreError::TimedOut(store.name().to_string())));
                match saved {
                    Ok(()) => {
                        self.metrics
                            .claims_persisted
                            .set(snapshot.claims.len() as i64);
                        // Counted once per snapshot written, not per pass.
                        let cut = cut.saturating_add(snapshot.cut);
                        if cut > 0 {
                            self.metrics.claims_cut.inc_by(cut);
                            tracing::warn!(
                                cut,
                                "the persisted evidence claims are full: older batches are left out"
                            );
                        }
                        *written = Some((snapshot.claims, snapshot.cursors));
                    }
                    Err(error) => {
                        self.metrics.claims_store_failures.inc();
                        tracing::warn!(%error, "persisting the evidence claims failed; acknowledging anyway");
                    }
                }
            }
        }
        if snapshot.gates.is_empty() {
            return;
        }
        for gate in &snapshot.gates {
            gate.persisted();
        }
        // Streams check their held acknowledgements again.
        self.queue.wake();
    }
}
