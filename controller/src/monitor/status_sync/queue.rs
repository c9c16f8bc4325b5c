//! Evidence in: the queue ingest hands accepted records to, and when they are safe to acknowledge.

use super::*;

/// At most this many records wait in the [`EvidenceQueue`] between two passes. Each is an
/// [`Evidence`] of fixed size (its local pod is shared with the index), so this bounds the memory
/// too: about 22 MB. A pass starts at half of it; the other half is what arrives during a pass
/// (at 1,000 agents on two cores, 200,000 records were not always enough).
pub const MAX_QUEUED_RECORDS: usize = 400_000;

impl EvidenceQueue {
    /// Resolves once the queue has reached half its bound since the last call (or since the queue
    /// was made, for the first call).
    pub async fn half_full(&self) {
        self.half_full.notified().await;
    }

    /// Takes every queued record.
    pub fn drain(&self) -> Vec<Evidence> {
        self.drain_numbered().0
    }

    /// Takes every queued record, for a pass to attribute; the drain stays *attributing* (not
    /// settled, nor anything after it) until the returned [`Drain`] is dropped, which the pass
    /// does once its observations are pending.
    pub(super) fn drain_numbered(&self) -> (Vec<Evidence>, Drain<'_>) {
        let mut queued = self.queued_records.lock().expect("evidence lock");
        self.queued.set(0);
        queued.drains += 1;
        let number = queued.drains;
        queued.attributing.insert(number);
        // The queue's buffer itself: nothing copied, and nothing kept between passes.
        let records = std::mem::take(&mut queued.records).into();
        (
            records,
            Drain {
                queue: self,
                number,
            },
        )
    }

    /// Drains so far.
    pub(super) fn drains(&self) -> u64 {
        self.queued_records.lock().expect("evidence lock").drains
    }

    /// The newest drain up to `drain` that [`EvidenceQueue::settle`] may settle once nothing is
    /// pending: none a pass is still attributing, nor any after it. Read *before* looking at what
    /// is pending: a pass that ends in between has made its observations pending by then.
    pub(super) fn settleable(&self, drain: u64) -> u64 {
        let queued = self.queued_records.lock().expect("evidence lock");
        settleable(drain, queued.attributing.first().copied())
    }

    /// Every observation of drains up to `drain` is in a status.
    pub(super) fn settle(&self, drain: u64) {
        self.settled.send_if_modified(|settled| {
            let newer = drain > *settled;
            if newer {
                *settled = drain;
            }
            newer
        });
    }

    /// Tells every stream to check its held acknowledgements again, as a new settled drain does
    /// (their claims may have been persisted).
    pub(super) fn wake(&self) {
        self.settled.send_modify(|_| {});
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

impl EvidenceSink for EvidenceQueue {
    fn accepted(&self, evidence: Evidence) {
        let mut queued = self.queued_records.lock().expect("evidence lock");
        if queued.records.len() >= MAX_QUEUED_RECORDS {
            queued.records.pop_front();
            self.dropped.inc();
        }
        queued.records.push_back(evidence);
        self.queued.set(queued.records.len() as i64);
        // Once per fill: a queue stays half full until it is drained.
        if queued.records.len() == MAX_QUEUED_RECORDS / 2 {
            self.half_full.notify_one();
        }
    }

    fn hold(&self) -> Option<u64> {
        let monitoring = self.proposals.as_ref().is_some_and(|(store, served)| {
            !served.listed(store) || store.find(cluster_proposals::monitored).is_some()
        });
        let may_count = monitoring
            || self
                .policies
                .as_ref()
                .is_none_or(|(store, listed)| evidence_may_count(listed.get(), store.len()));
        // Read after the records were pushed: the next drain takes them, or one already did.
        may_count.then(|| self.drains())
    }

    fn settled_after(&self, mark: u64) -> bool {
        *self.settled.borrow() > mark
    }

    fn settled(&self) -> Option<watch::Receiver<u64>> {
        Some(self.settled.subscribe())
    }
}

/// A drain a pass is attributing ([`EvidenceQueue::drain_numbered`]); dropped once its observations
/// are pending.
pub(super) struct Drain<'a> {
    queue: &'a EvidenceQueue,
    number: u64,
}

impl Drain<'_> {
    pub(super) fn number(&self) -> u64 {
        self.number
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The pass died with the drain's records: what they would have recorded is unknown, so
            // they, and every batch after them, are never settled here. Their agents keep them and
            // resend them to the next leader, rather than forget them unjudged.
            tracing::error!(
                drain = self.number,
                "an evidence pass failed: batches from now on are not acknowledged by this controller"
            );
            return;
        }
        self.queue
            .queued_records
            .lock()
            .expect("evidence lock")
            .attributing
            .remove(&self.number);
    }
}

/// The newest drain up to `drain` that may be settled while the oldest drain still being
/// attributed is `oldest_attributing`: only drains before it (drains are numbered from 1).
pub(super) fn settleable(drain: u64, oldest_attributing: Option<u64>) -> u64 {
    oldest_attributing.map_or(drain, |oldest| drain.min(oldest.saturating_sub(1)))
}
