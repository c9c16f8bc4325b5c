//! What a batch's acknowledgement waits for before it may go.

use super::*;
use claims::FirstAttempt;

/// What a batch's acknowledgement waits for (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// The writes of these proposals.
    pub proposals: WaitsFor,
    /// The status patch of violations found in its records: a mark of the evidence sink
    /// ([`crate::ingest::evidence::EvidenceSink::hold`]).
    pub evidence: Option<u64>,
    /// Some of its evidence is handed to the evidence sink after the batch was merged: records that
    /// waited for their pod, or blocked connections whose peer waited for the index
    /// ([`super::waiting`]). Their waits end with the grace, which `proposals` waits
    /// for too: once `proposals` are written (so the waits are over and the evidence was handed on),
    /// the evidence mark is taken again, to cover it.
    pub evidence_later: bool,
    /// A resent batch whose first attempt's evidence was handed on ([`claims`]): it also waits for
    /// what that attempt's acknowledgement waits for.
    pub repeat_of: Option<Box<RepeatOf>>,
    /// The batch's name in the [`claims`], for the stream to report its merge and acknowledgement
    /// (taken out by the stream; never part of what is waited for).
    pub claim: Option<Claim>,
    /// A claimed first attempt's gate: once its evidence counted, it waits for a persisted snapshot
    /// of the claims that holds it ([`claims::ClaimGate`]).
    pub gate: Option<claims::ClaimGate>,
}

/// A batch named by its agent process ([`claims::BatchName`] without the node, which is the stream's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    pub instance: u64,
    pub sequence: u64,
    /// `Some` for a claimed first attempt: where to set what its acknowledgement waits for.
    pub first: Option<FirstAttempt>,
}

/// A repeat's wait for its batch's first attempt: what that attempt waits for, copied once its merge
/// has ended (from then on this copy is checked, as the first attempt's own is on its stream).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepeatOf {
    attempt: FirstAttempt,
    copied: Option<(u64, Holds)>,
}

impl RepeatOf {
    pub fn new(attempt: FirstAttempt) -> Self {
        Self {
            attempt,
            copied: None,
        }
    }
}

impl Holds {
    /// Nothing to wait for: the acknowledgement may go at once.
    pub fn is_nothing(&self) -> bool {
        self.proposals.is_nothing()
            && self.evidence.is_none()
            && !self.evidence_later
            && self.repeat_of.is_none()
    }

    /// Whether the acknowledgement of a batch merged at `mark` may go: its proposals are written
    /// (`written`) and its evidence is in statuses (`evidence`). A batch with evidence handed on
    /// later takes its evidence mark again once its wait is over (see [`Holds::evidence_later`]).
    /// Checked again whenever a flush or an evidence pass ends.
    pub fn ready(
        &mut self,
        mark: u64,
        written: &Ledger,
        evidence: Option<&dyn crate::ingest::evidence::EvidenceSink>,
    ) -> bool {
        if let Some(repeat) = &mut self.repeat_of {
            if repeat.copied.is_none() {
                repeat.copied = repeat.attempt.get().cloned();
            }
            let Some((first_mark, first)) = &mut repeat.copied else {
                return false;
            };
            if !first.ready(*first_mark, written, evidence) {
                return false;
            }
        }
        // Not only the oldest batch: one behind a batch that waits for a failing proposal may be
        // written already (agents acknowledge per sequence).
        let proposals_written =
            self.proposals.is_nothing() || written.written_for(mark, &self.proposals);
        if self.evidence_later && proposals_written {
            self.evidence_later = false;
            self.evidence = self.evidence.max(evidence.and_then(|e| e.hold()));
            if let Some(gate) = &self.gate {
                match self.evidence {
                    Some(mark) => gate.set_mark(mark),
                    // No mark to persist it by (no policy now): it waits for no snapshot.
                    None => gate.persisted(),
                }
            }
        }
        !self.evidence_later
            && proposals_written
            && self
                .evidence
                .is_none_or(|m| evidence.is_none_or(|e| e.settled_after(m)))
            && self.gate.as_ref().is_none_or(|g| g.may_acknowledge())
    }
}
