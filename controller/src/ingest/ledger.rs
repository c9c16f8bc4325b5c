//! What acknowledgements wait for: the proposals a batch taught ([`WaitsFor`]) and what the flushes
//! wrote ([`Ledger`]). Pure bookkeeping, defined where acknowledgements are sent (docs/behaviour.md
//! §1.10); the learner fills the one and the flusher the other.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;

/// The proposals whose next write an acknowledgement waits for: those a batch gave edges no flush has
/// decided yet. A proposal whose write keeps failing then holds back only the batches that taught it
/// something. Bounded: a batch that touched more than [`WaitsFor::MAX_PROPOSALS`] proposals waits for a
/// flush in which nothing failed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WaitsFor {
    proposals: Vec<u64>,
    everything: bool,
    /// An observation waits for the index ([`crate::ingest::waiting`]) until then (ms since the
    /// epoch): only a flush that starts later, with no failure, has surely written it.
    deferred_until_ms: Option<i64>,
}

impl WaitsFor {
    /// Proposals remembered one by one before the batch waits for everything.
    pub const MAX_PROPOSALS: usize = 64;

    /// Waits for every proposal.
    pub fn everything() -> Self {
        Self {
            proposals: Vec::new(),
            everything: true,
            deferred_until_ms: None,
        }
    }

    /// Adds an observation that waits for the index until `until_ms`.
    pub fn defer_until(&mut self, until_ms: i64) {
        self.deferred_until_ms = Some(self.deferred_until_ms.map_or(until_ms, |d| d.max(until_ms)));
    }

    /// Adds the proposal `key` (`Learner::proposal_key`).
    pub fn add(&mut self, key: u64) {
        if self.everything || self.proposals.contains(&key) {
            return;
        }
        if self.proposals.len() == Self::MAX_PROPOSALS {
            self.proposals = Vec::new();
            self.everything = true;
        } else {
            self.proposals.push(key);
        }
    }

    /// Nothing to wait for: the acknowledgement may go at once.
    pub fn is_nothing(&self) -> bool {
        !self.everything && self.proposals.is_empty() && self.deferred_until_ms.is_none()
    }

    /// Whether a flush that started at `started_ms`, in which `failed` proposals failed (and every
    /// other was written), wrote all this waits for.
    pub fn written_despite(&self, started_ms: i64, failed: &BTreeSet<u64>) -> bool {
        if let Some(until) = self.deferred_until_ms {
            // Where a waiting observation goes is known only once it is learned.
            return started_ms >= until && failed.is_empty();
        }
        if failed.is_empty() {
            return true;
        }
        !self.everything && !self.proposals.iter().any(|p| failed.contains(p))
    }
}

/// What the flushes wrote, for the acknowledgements that wait for them. Pure bookkeeping.
#[derive(Debug)]
pub struct Ledger {
    /// Flushes started so far.
    started: AtomicU64,
    /// The newest flush this replica made as leader (0: none yet), and the proposals it failed to
    /// write. Everything else merged before that flush started is in the API server.
    written: watch::Sender<Written>,
}

/// What the newest flush made as leader wrote (see [`Ledger::written_for`]).
#[derive(Debug, Default)]
pub struct Written {
    flush: u64,
    /// When that flush started, ms since the epoch.
    started_ms: i64,
    failed: BTreeSet<u64>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            started: AtomicU64::new(0),
            written: watch::channel(Written::default()).0,
        }
    }
}

impl Ledger {
    /// Counts a flush as started; returns its number.
    pub fn begin(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Records what flush `number`, made as leader and started at `started_ms`, wrote.
    pub fn finish(&self, number: u64, started_ms: i64, failed: &BTreeSet<u64>) {
        self.written.send_if_modified(|w| {
            let newer = number > w.flush;
            if newer {
                *w = Written {
                    flush: number,
                    started_ms,
                    failed: failed.clone(),
                };
            }
            newer
        });
    }

    /// The mark of something merged just now (call it after merging): it is written once
    /// [`Ledger::written_for`] says so for this mark.
    pub fn mark(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Whether everything merged before `mark` was taken for the proposals `waits` names has been
    /// written.
    pub fn written_for(&self, mark: u64, waits: &WaitsFor) -> bool {
        let w = self.written.borrow();
        w.flush > mark && waits.written_despite(w.started_ms, &w.failed)
    }

    /// Whether everything merged before `mark` was taken has been written, for every proposal.
    pub fn written_after(&self, mark: u64) -> bool {
        self.written_for(mark, &WaitsFor::everything())
    }

    /// The number of the newest flush recorded.
    pub fn latest(&self) -> u64 {
        self.written.borrow().flush
    }

    /// Changes whenever a flush made as leader is recorded.
    pub fn subscribe(&self) -> watch::Receiver<Written> {
        self.written.subscribe()
    }
}
