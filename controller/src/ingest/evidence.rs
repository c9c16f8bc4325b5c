//! What ingest hands on as violation evidence: each accepted record read once ([`Evidence`], what it
//! says about its flow: [`EvidenceKind`]) and the sink it goes to ([`EvidenceSink`], the status
//! sync's queue in the running controller). Defined here, where records come in, so ingest and its
//! waits for the index hand evidence on without importing the monitor stage that judges it.

use crate::ingest::claims::ClaimGate;
use crate::ingest::flow_record::Decoded;
use network_enforcer_api::PolicyMode;
use network_enforcer_api::uplink::{self, FlowRecord};
use tokio::sync::watch;

/// What a record says about a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvidenceKind {
    /// The flow went through: an established TCP connection, or a datagram the peer received.
    WentThrough,
    /// A UDP datagram was sent; whether it arrived is unknown to the sender.
    Sent,
    /// The flow did not go through: a TCP attempt that never established, or a CNI/mesh denial.
    Blocked,
}

impl EvidenceKind {
    /// The kind of evidence `record` is; `None` for records with an unknown outcome.
    pub fn of(record: &FlowRecord) -> Option<Self> {
        let outbound = record.direction == uplink::Direction::Outbound as i32;
        match uplink::Outcome::try_from(record.outcome).ok()? {
            uplink::Outcome::Established => Some(EvidenceKind::WentThrough),
            uplink::Outcome::Datagram if outbound => Some(EvidenceKind::Sent),
            uplink::Outcome::Datagram => Some(EvidenceKind::WentThrough),
            // A dry-run denial (ztunnel, Hubble audit) let the connection through: monitor evidence.
            uplink::Outcome::Denied if record.dry_run => Some(EvidenceKind::WentThrough),
            uplink::Outcome::Failed | uplink::Outcome::Denied => Some(EvidenceKind::Blocked),
            // A DNS answer, no connection (cluster::names).
            uplink::Outcome::Resolved | uplink::Outcome::Unspecified => None,
        }
    }

    /// Whether this evidence records a violation on a policy in `mode`: a flow that went through
    /// (or a datagram sent) violates a monitor policy; one that was blocked (or a datagram sent,
    /// whose arrival the sender cannot know) a protect policy (docs/behaviour.md §3.5).
    pub fn counts_for(self, mode: PolicyMode) -> bool {
        match mode {
            PolicyMode::Monitor => matches!(self, EvidenceKind::WentThrough | EvidenceKind::Sent),
            PolicyMode::Protect => matches!(self, EvidenceKind::Sent | EvidenceKind::Blocked),
        }
    }
}

/// An accepted record as violation evidence: what ingest read from it, kept until the next evidence
/// pass. Small (no strings of the agent's; its local pod shared with the index) because up to
/// [`crate::monitor::status_sync::MAX_QUEUED_RECORDS`] of them wait between two passes.
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    pub kind: EvidenceKind,
    pub record: Decoded,
    /// It waited for the index to place its peer ([`Evidence::may_wait_for_peer`]): the pass
    /// counts what it came to ([`crate::monitor::violations::evidence::WaitedOutcome`]).
    pub waited_for_peer: bool,
    /// The claim of the agent batch it came in, told when the record counted
    /// ([`ClaimGate`]); `None` for cluster sources and unnamed batches.
    pub claim: Option<ClaimGate>,
}

impl Evidence {
    /// `record`, read as `decoded`, as evidence; `None` for a record with an unknown outcome.
    pub fn of(record: &FlowRecord, decoded: Decoded) -> Option<Evidence> {
        Some(Evidence {
            kind: EvidenceKind::of(record)?,
            record: decoded,
            waited_for_peer: false,
            claim: None,
        })
    }

    /// Whether this evidence may wait for the index to place its peer, as learning does
    /// (docs/behaviour.md §1.3, §3.2): blocked connections only. A new pod's first packets can be
    /// refused by a node that has not learned the pod's address yet; judged at once, the pod would
    /// be a bare address, and a violation the policy does not make. Evidence of connections that
    /// went through is judged at once, as before.
    pub fn may_wait_for_peer(&self) -> bool {
        self.kind == EvidenceKind::Blocked
    }
}

/// Where ingest hands every accepted record, as violation evidence. Must return at once.
pub trait EvidenceSink: Send + Sync {
    /// An authenticated agent's record was accepted; this is what ingest read from it.
    fn accepted(&self, evidence: Evidence);

    /// Called after handing records in: the mark to wait for ([`EvidenceSink::settled_after`]) before
    /// acknowledging them, or `None` when they need no wait (no policy, so no record is evidence).
    fn hold(&self) -> Option<u64> {
        None
    }

    /// Whether every violation found in records handed in before `mark` was taken is in a status.
    fn settled_after(&self, _mark: u64) -> bool {
        true
    }

    /// Changes whenever [`EvidenceSink::settled_after`] may have become true.
    fn settled(&self) -> Option<watch::Receiver<u64>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(outcome: uplink::Outcome, direction: uplink::Direction) -> FlowRecord {
        FlowRecord {
            outcome: outcome as i32,
            direction: direction as i32,
            ..FlowRecord::default()
        }
    }

    #[test]
    fn evidence_kinds_and_the_modes_they_count_for() {
        use uplink::Direction::{Inbound, Outbound};
        use uplink::Outcome::{Datagram, Denied, Established, Failed, Unspecified};
        let cases = [
            (Established, Outbound, Some(EvidenceKind::WentThrough)),
            (Established, Inbound, Some(EvidenceKind::WentThrough)),
            (Datagram, Outbound, Some(EvidenceKind::Sent)),
            (Datagram, Inbound, Some(EvidenceKind::WentThrough)),
            (Failed, Outbound, Some(EvidenceKind::Blocked)),
            (Denied, Inbound, Some(EvidenceKind::Blocked)),
            (Unspecified, Outbound, None),
        ];
        for (outcome, direction, kind) in cases {
            assert_eq!(
                EvidenceKind::of(&record(outcome, direction)),
                kind,
                "{outcome:?} {direction:?}"
            );
        }
        let dry_run = FlowRecord {
            dry_run: true,
            ..record(Denied, Inbound)
        };
        assert_eq!(EvidenceKind::of(&dry_run), Some(EvidenceKind::WentThrough));
        let counts = |kind: EvidenceKind| {
            (
                kind.counts_for(PolicyMode::Monitor),
                kind.counts_for(PolicyMode::Protect),
            )
        };
        assert_eq!(counts(EvidenceKind::WentThrough), (true, false));
        assert_eq!(counts(EvidenceKind::Sent), (true, true));
        assert_eq!(counts(EvidenceKind::Blocked), (false, true));
    }
}
