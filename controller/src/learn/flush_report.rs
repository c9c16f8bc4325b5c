//! What one flush did ([`FlushReport`]): filled by the proposal writer per proposal, summed by the
//! flusher, read by the ledger and the logs. Its own file, below both.

use std::collections::BTreeSet;

/// The outcome of one flush.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FlushReport {
    /// Proposals created or updated.
    pub written: usize,
    /// Of those, proposals created.
    pub created: usize,
    /// Proposals whose spec already held every edge.
    pub unchanged: usize,
    /// Proposals skipped because a policy was promoted from them.
    pub promoted: usize,
    /// Proposals whose write failed; their edges wait for the next flush.
    pub failed: usize,
    /// Those proposals, by [`crate::learn::learner::Learner::proposal_key`]: acknowledgements waiting for one of them
    /// wait for a later flush; the others need not ([`crate::ingest::ledger::WaitsFor`]).
    pub failed_proposals: BTreeSet<u64>,
    /// Proposals the API server refused for their content (invalid or too large); their new edges
    /// were dropped and logged.
    pub refused: usize,
    /// Conflicts (409) retried.
    pub conflicts: usize,
    /// External peers not learned because their proposal and port had reached the cap.
    pub capped: usize,
    /// Proposals not learned into because their spec is not what the controller wrote
    /// ([`crate::learn::provenance`]).
    pub foreign: usize,
}

impl FlushReport {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &FlushReport) {
        // Destructured: a new field must be added here too.
        let FlushReport {
            written,
            created,
            unchanged,
            promoted,
            failed,
            failed_proposals,
            refused,
            conflicts,
            capped,
            foreign,
        } = other;
        self.written += written;
        self.created += created;
        self.unchanged += unchanged;
        self.promoted += promoted;
        self.failed += failed;
        self.failed_proposals.extend(failed_proposals);
        self.refused += refused;
        self.conflicts += conflicts;
        self.capped += capped;
        self.foreign += foreign;
    }
}
