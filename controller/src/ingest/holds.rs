//! What a batch's acknowledgement waits for before it may go.

use super::*;

/// What a batch's acknowledgement waits for (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// The writes of these proposals.
    pub proposals: WaitsFor,
    /// The status patch of violations found in its records: a mark of the evidence sink
    /// ([`crate::monitor::status_sync::EvidenceSink::hold`]).
    pub evidence: Option<u64>,
    /// Some of its evidence is handed to the evidence sink after the batch was merged: records that
    /// waited for their pod ([`early_records`]), or blocked connections whose peer waited for the
    /// index ([`crate::learn::deferrals`]). Their waits end with the grace, which `proposals` waits
    /// for too: once `proposals` are written (so the waits are over and the evidence was handed on),
    /// the evidence mark is taken again, to cover it.
    pub evidence_later: bool,
}

impl Holds {
    /// Nothing to wait for: the acknowledgement may go at once.
    pub fn is_nothing(&self) -> bool {
        self.proposals.is_nothing() && self.evidence.is_none() && !self.evidence_later
    }

    /// Whether the acknowledgement of a batch merged at `mark` may go: its proposals are written
    /// (`written`) and its evidence is in statuses (`evidence`). A batch with evidence handed on
    /// later takes its evidence mark again once its wait is over (see [`Holds::evidence_later`]).
    /// Checked again whenever a flush or an evidence pass ends.
    pub fn ready(
        &mut self,
        mark: u64,
        written: &Ledger,
        evidence: Option<&dyn crate::monitor::status_sync::EvidenceSink>,
    ) -> bool {
        // Not only the oldest batch: one behind a batch that waits for a failing proposal may be
        // written already (agents acknowledge per sequence).
        let proposals_written =
            self.proposals.is_nothing() || written.written_for(mark, &self.proposals);
        if self.evidence_later && proposals_written {
            self.evidence_later = false;
            self.evidence = self.evidence.max(evidence.and_then(|e| e.hold()));
        }
        !self.evidence_later
            && proposals_written
            && self
                .evidence
                .is_none_or(|m| evidence.is_none_or(|e| e.settled_after(m)))
    }
}
