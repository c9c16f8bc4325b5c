//! The evidence claims persisted between leaders ([`crate::ingest::claims_store`]): read before any
//! batch is taken, written after the statuses and before the acknowledgements they allow.

use super::*;
use crate::ingest::claims_store::{self, StoreError};

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
            match store.load().await {
                Ok(persisted) => break persisted,
                Err(error @ StoreError::Corrupt { .. }) => {
                    self.metrics.claims_store_failures.inc();
                    tracing::warn!(%error, "the persisted evidence claims are left out");
                    break Vec::new();
                }
                Err(error) if wait <= Duration::from_secs(4) => {
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
                    break Vec::new();
                }
            }
        };
        let processes = persisted.len();
        let dropped = self.claims.restore(persisted);
        self.metrics.claims_restored.set(processes as i64);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "persisted evidence claims beyond the bounds are left out"
            );
        }
        tracing::info!(processes, store = store.name(), "evidence claims read");
    }

    /// A replica that lost its Lease writes no claims any more: the new leader may have read and
    /// written them already.
    pub fn stop_persisting_claims(&self) {
        self.claims_writable.store(false, Ordering::Release);
    }

    /// The end of a status pass while drains' claims wait to be persisted: once every observation
    /// of the drains up to `drained` (but those still being attributed) is written, the claims of
    /// the batches whose evidence that covers are persisted, and only then are those drains settled
    /// (so their acknowledgements go). A failing write is logged and counted and settles anyway: a crash
    /// before the next write may then count a resent batch twice (docs/behaviour.md §3.6), which
    /// is better than holding every agent's acknowledgements behind the ConfigMap.
    pub(super) async fn save_claims_then_settle(&self, drained: u64) {
        let target = self.queue.settleable(drained);
        if !self.all_written() {
            return;
        }
        if let Some(store) = &self.settings.claims_store
            && self.claims_writable.load(Ordering::Acquire)
        {
            let snapshot = self.claims.snapshot(|mark| mark < target);
            let processes = snapshot.len();
            let (bytes, cut) = claims_store::encode(&snapshot);
            let mut written = self.claims_written.lock().await;
            if written.as_deref() != Some(&bytes[..]) {
                match store.save(bytes.clone()).await {
                    Ok(()) => {
                        self.metrics.claims_persisted.set(processes as i64);
                        if cut > 0 {
                            self.metrics.claims_cut.inc_by(cut);
                            tracing::warn!(
                                cut,
                                "the persisted evidence claims are full: older batches are left out"
                            );
                        }
                        *written = Some(bytes);
                    }
                    Err(error) => {
                        self.metrics.claims_store_failures.inc();
                        tracing::warn!(%error, "persisting the evidence claims failed; acknowledging anyway");
                    }
                }
            }
        }
        // Drains up to the target are covered (or, after a failure, given up on).
        self.claims_unsaved
            .lock()
            .expect("claims lock")
            .retain(|d| *d > target);
        self.settle_written(target);
    }
}
