//! The batches the controller has not acknowledged yet, kept for resending.

use super::*;

/// Unacknowledged records an agent keeps by default. The controller holds the acknowledgement of a
/// record whose peer it cannot place yet (an external address) for its resolution grace (30 s), so
/// this must hold that long of new edges: one pod spraying new peers reaches its own edge cap (10 000)
/// and its server's (10 000) within one flush, and both wait. 50 000 leaves room for that and the
/// node's normal traffic (about 250 bytes each in memory).
pub const DEFAULT_MAX_PENDING_RECORDS: usize = 50_000;

/// What [`ResendBuffer::push`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The sequence number given to the new batch.
    pub sequence: u64,
    /// The sequence numbers of the oldest batches, dropped to make room (empty when there was room).
    pub dropped: Vec<u64>,
}

/// The batches sent (or still to send) that the controller has not acknowledged yet, oldest first, with
/// at most `capacity` of them and at most `max_records` records in all (except that the newest batch is
/// always kept). Pure: no I/O, no clock.
#[derive(Debug)]
pub struct ResendBuffer {
    capacity: usize,
    max_records: usize,
    /// Records in `pending`.
    records: usize,
    next_sequence: u64,
    /// This process's [`FlowBatch::instance`].
    instance: u64,
    /// Ordered by sequence number (pushes take increasing numbers; acks only remove).
    pending: VecDeque<FlowBatch>,
    dropped: u64,
}

impl ResendBuffer {
    /// An empty buffer holding at most `capacity` batches (at least one). Sequence numbers start at 1.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            max_records: usize::MAX,
            records: 0,
            next_sequence: 1,
            instance: random_instance(),
            pending: VecDeque::with_capacity(capacity),
            dropped: 0,
        }
    }

    /// The same buffer, also limited to `max_records` records in all.
    pub fn with_max_records(mut self, max_records: usize) -> Self {
        self.max_records = max_records;
        self
    }

    /// The same buffer, numbering its batches as agent process `instance` (not 0).
    pub fn with_instance(mut self, instance: u64) -> Self {
        self.instance = instance.max(1);
        self
    }

    /// The agent process's [`FlowBatch::instance`] this buffer numbers its batches with.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Numbers `records` as the next batch of `node` and keeps it until acknowledged; first drops the
    /// oldest batches until it fits.
    pub fn push(&mut self, node: &str, records: Vec<FlowRecord>) -> Pushed {
        self.push_with_health(node, records, None)
    }

    /// [`ResendBuffer::push`], the batch carrying what the agent lost so far.
    pub fn push_with_health(
        &mut self,
        node: &str,
        records: Vec<FlowRecord>,
        health: Option<AgentHealth>,
    ) -> Pushed {
        let mut dropped = Vec::new();
        while self.pending.len() >= self.capacity
            || self.records.saturating_add(records.len()) > self.max_records
        {
            let Some(oldest) = self.pending.pop_front() else {
                break;
            };
            self.records -= oldest.records.len();
            self.dropped += 1;
            dropped.push(oldest.sequence);
        }
        self.records += records.len();
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.pending.push_back(FlowBatch {
            sequence,
            node: node.to_string(),
            records,
            instance: self.instance,
            health,
        });
        Pushed { sequence, dropped }
    }

    /// Forgets the batch `sequence` once the controller took it in. Returns false when no such batch is
    /// pending (already acknowledged, dropped, or never sent: a duplicate ack after a resend is normal).
    pub fn ack(&mut self, sequence: u64) -> bool {
        match self.pending.binary_search_by_key(&sequence, |b| b.sequence) {
            Ok(i) => {
                let batch = self.pending.remove(i).expect("found");
                self.records -= batch.records.len();
                true
            }
            Err(_) => false,
        }
    }

    /// The oldest pending batch numbered `from` or later: what to send next on a stream that has sent
    /// everything below `from` (0 on a new stream: resend everything).
    pub fn next_from(&self, from: u64) -> Option<&FlowBatch> {
        let i = self.pending.partition_point(|b| b.sequence < from);
        self.pending.get(i)
    }

    /// Whether batch `sequence` is still waiting for its acknowledgement.
    pub fn contains(&self, sequence: u64) -> bool {
        self.next_from(sequence)
            .is_some_and(|b| b.sequence == sequence)
    }

    /// The unacknowledged batches, oldest first.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = &FlowBatch> {
        self.pending.iter()
    }

    /// Number of unacknowledged batches.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Number of records in the unacknowledged batches.
    pub fn records(&self) -> usize {
        self.records
    }

    /// Whether every batch has been acknowledged (or dropped).
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Batches dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The most batches kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A process instance id: random (the standard library's per-process random hash keys, mixed with
/// the time and the process id), never 0. It only has to differ between an agent and its restarts.
fn random_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.write_u128(now.as_nanos());
    hasher.write_u32(std::process::id());
    hasher.finish().max(1)
}
