//! Which batches' violation evidence this controller has counted (docs/behaviour.md §3.8, "One
//! occurrence counts once").
//!
//! An agent resends every batch it holds no acknowledgement for: after its stream closed while the
//! acknowledgement was held (waiting for the proposals' write or the violations' status patch), or
//! when the acknowledgement was lost on the way. The resent records must teach again (learning is
//! idempotent, and a controller that lost its memory needs them), but their violations were already
//! handed to the status sync: counted again, `violationCount` would count one occurrence twice. So
//! the first attempt of a batch whose records went to the evidence sink is claimed here under its
//! name, (node, agent instance, sequence) ([`FlowBatch::instance`](network_enforcer_api::uplink::FlowBatch)):
//! a repeat is taken in for learning only, and its acknowledgement waits for what the first
//! attempt's waited for, so it is never acknowledged before the first attempt's violations are in a
//! status.
//!
//! Bounded: per node the [`INSTANCES_PER_NODE`] latest agent processes (a restarted agent never
//! resends its predecessor's batches), per instance at most [`COUNTING_PER_INSTANCE`] batches still
//! waiting for their acknowledgement, and the judged ones (acknowledged, or whose records handed
//! nothing to count) as at most [`RANGES_PER_INSTANCE`] ranges of sequences: an agent numbers its
//! batches in order, so they are one range but for batches it dropped or that are still waiting.
//! What falls out is counted (`evidence_claims_dropped_total`); a batch resent after that counts
//! again.
//!
//! The judged ranges, and the claims whose evidence is in statuses already, are what the leader
//! persists ([`Claims::snapshot`], [`super::claims_store`]), and what a new leader reads
//! ([`Claims::restore`]) before it takes any batch ([`Claims::ready`]): a batch resent to it is then
//! recognised too. A first attempt whose records an evidence pass counted is acknowledged only
//! once a persisted snapshot holds it ([`ClaimGate`]): that is checked where the acknowledgement
//! goes, so no pass can release it early.

use super::Holds;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Agent processes remembered per node: the current one and its predecessor (a DaemonSet rolling
/// update with a surge runs both for a while).
pub const INSTANCES_PER_NODE: usize = 2;
/// Batches of one agent process whose evidence was handed on and whose acknowledgement has not gone
/// yet. Above the acknowledgements one stream may have waiting (4,096) and far above what an agent
/// keeps to resend (256 batches by default).
pub const COUNTING_PER_INSTANCE: usize = 8_192;
/// Ranges of judged sequences remembered per agent process; past it the lowest are forgotten.
pub const RANGES_PER_INSTANCE: usize = 16;

/// The name of a batch across reconnects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchName<'a> {
    pub node: &'a str,
    /// The agent process; 0 (an agent that does not say) is never claimed.
    pub instance: u64,
    pub sequence: u64,
}

/// What the first attempt of a batch waits for before its acknowledgement, once its merge has ended:
/// its flush mark and [`Holds`]. Shared by every repeat of the batch.
pub type FirstAttempt = Arc<OnceLock<(u64, Holds)>>;

/// What a claimed first attempt's evidence came to, shared by the records it handed on (an evidence
/// pass notes when it queued an observation from one, [`ClaimGate::counted`]) and by its
/// acknowledgement ([`ClaimGate::may_acknowledge`]): a batch that counted is acknowledged only once
/// a persisted snapshot of the claims holds it, so that a new leader knows it.
#[derive(Clone, Debug)]
pub struct ClaimGate(Arc<GateState>);

#[derive(Debug)]
struct GateState {
    /// The evidence mark every record of the batch waits for; [`NO_MARK`] until the batch is merged
    /// and while some of its evidence is still to be handed on.
    mark: AtomicU64,
    counted: AtomicBool,
    persisted: AtomicBool,
    /// Whether claims are persisted at all (else there is nothing to wait for).
    required: bool,
}

const NO_MARK: u64 = u64::MAX;

impl ClaimGate {
    fn new(required: bool) -> Self {
        ClaimGate(Arc::new(GateState {
            mark: AtomicU64::new(NO_MARK),
            counted: AtomicBool::new(false),
            persisted: AtomicBool::new(false),
            required,
        }))
    }

    /// An evidence pass queued an observation from one of the batch's records for a status.
    pub fn counted(&self) {
        self.0.counted.store(true, Ordering::Release);
    }

    /// The evidence mark the batch's records wait for, once known: the first one set stays (a
    /// repeat's copy may take a later one again, which would move the batch out of a snapshot that
    /// already holds it).
    pub fn set_mark(&self, mark: u64) {
        let _ = self.0.mark.compare_exchange(
            NO_MARK,
            mark.min(NO_MARK - 1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    fn mark(&self) -> Option<u64> {
        Some(self.0.mark.load(Ordering::Acquire)).filter(|m| *m != NO_MARK)
    }

    /// A persisted snapshot holds the batch, or persisting it was given up (a failed write): its
    /// acknowledgement may go.
    pub fn persisted(&self) {
        self.0.persisted.store(true, Ordering::Release);
    }

    fn is_open(&self) -> bool {
        self.0.persisted.load(Ordering::Acquire)
    }

    /// Whether the batch's acknowledgement may go as far as the claims go: it counted nothing, or
    /// a persisted snapshot holds it, or claims are not persisted.
    pub fn may_acknowledge(&self) -> bool {
        !self.0.required
            || !self.0.counted.load(Ordering::Acquire)
            || self.0.persisted.load(Ordering::Acquire)
    }
}

impl PartialEq for ClaimGate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ClaimGate {}

/// Whether records count as violation evidence ([`Attempt::counts`]) and, for a claimed batch, the
/// claim they count for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts<'a> {
    pub counts: bool,
    pub gate: Option<&'a ClaimGate>,
}

/// A claimed first attempt: where to set what its acknowledgement waits for once merged
/// ([`Claims::merged`]), and its gate, which its records carry to the evidence pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub first: FirstAttempt,
    pub gate: ClaimGate,
}

/// What a batch arriving now is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Not seen before (or not recognisable): take it in whole. `Some`: it is claimed.
    First(Option<Claimed>),
    /// Its evidence was handed on by an attempt whose acknowledgement has not gone yet: learn from it
    /// only, and acknowledge it once the first attempt's waits are over.
    Repeat(FirstAttempt),
    /// Its evidence is in statuses already (an acknowledgement went): learn from it only.
    Counted,
}

impl Attempt {
    /// Whether the batch's records count as violation evidence.
    pub fn counts(&self) -> bool {
        matches!(self, Attempt::First(_))
    }
}

/// The claims of every node (see the module docs).
#[derive(Debug)]
pub struct Claims {
    nodes: Mutex<HashMap<String, VecDeque<InstanceClaims>>>,
    /// Where the cluster sources the controller reads itself stand, persisted with the claims.
    pub cursors: super::source_cursors::SourceCursors,
    /// False until a persisted copy was read ([`Claims::restore`]); batches are refused until then.
    ready: AtomicBool,
    /// Whether claims are persisted: then a batch that counted waits for a snapshot that holds it.
    persisting: bool,
}

impl Default for Claims {
    fn default() -> Self {
        Claims {
            nodes: Mutex::default(),
            cursors: Default::default(),
            ready: AtomicBool::new(true),
            persisting: false,
        }
    }
}

#[derive(Debug)]
struct InstanceClaims {
    instance: u64,
    counting: BTreeMap<u64, Claimed>,
    /// Batches whose evidence is in statuses or that had none.
    judged: Ranges,
}

impl InstanceClaims {
    fn new(instance: u64) -> Self {
        InstanceClaims {
            instance,
            counting: BTreeMap::new(),
            judged: Ranges::default(),
        }
    }
}

/// Sequences as ascending, disjoint, non-adjacent inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// The ranges of `pairs` (in any order, overlapping or not), in O(n log n).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut sorted: Vec<(u64, u64)> = pairs
            .into_iter()
            .map(|(lo, hi)| (lo.min(hi), lo.max(hi)))
            .collect();
        sorted.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
        for (lo, hi) in sorted {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        Ranges(merged)
    }

    /// How many sequences the ranges hold (saturating).
    pub fn len_sequences(&self) -> u64 {
        self.0
            .iter()
            .map(|(lo, hi)| (hi - lo).saturating_add(1))
            .fold(0u64, u64::saturating_add)
    }

    pub fn contains(&self, sequence: u64) -> bool {
        let at = self.0.partition_point(|(_, hi)| *hi < sequence);
        self.0.get(at).is_some_and(|(lo, _)| *lo <= sequence)
    }

    pub fn insert(&mut self, sequence: u64) {
        self.insert_range(sequence, sequence);
    }

    /// Adds `lo..=hi`, merging it with the ranges it overlaps or touches.
    pub fn insert_range(&mut self, lo: u64, hi: u64) {
        // The first range that ends at or after lo - 1, and the first that starts after hi + 1.
        let start = self.0.partition_point(|(_, h)| h.saturating_add(1) < lo);
        let end = self.0.partition_point(|(l, _)| *l <= hi.saturating_add(1));
        let (mut lo, mut hi) = (lo, hi);
        if start < end {
            lo = lo.min(self.0[start].0);
            hi = hi.max(self.0[end - 1].1);
        }
        self.0.splice(start..end, [(lo, hi)]);
    }

    /// Keeps the `max` highest ranges; returns how many sequences were forgotten.
    pub fn keep_highest(&mut self, max: usize) -> u64 {
        let cut = self.0.len().saturating_sub(max);
        let cut = Ranges(self.0.drain(..cut).collect());
        cut.len_sequences()
    }

    pub fn pairs(&self) -> &[(u64, u64)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What to persist ([`Claims::snapshot`]).
#[derive(Debug, Default)]
pub struct Snapshot {
    pub claims: Vec<Persisted>,
    /// The cluster sources' cursors ([`super::source_cursors::SourceCursors::advance`]).
    pub cursors: Vec<super::source_cursors::PersistedCursor>,
    /// The gates to open once it is written (closed now).
    pub gates: Vec<ClaimGate>,
    /// Sequences left out to stay within [`RANGES_PER_INSTANCE`].
    pub cut: u64,
}

/// One agent process's judged batches as persisted ([`Claims::snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Persisted {
    pub node: String,
    pub instance: u64,
    pub ranges: Ranges,
}

/// What [`Claims::begin`] had to forget to stay in its bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub batches: u64,
}

impl Claims {
    /// Claims that a persisted copy will be read into ([`Claims::restore`]): until then not
    /// [`Claims::ready`].
    pub fn unread() -> Self {
        Claims {
            ready: AtomicBool::new(false),
            persisting: true,
            ..Claims::default()
        }
    }

    /// Whether batches may be taken: the persisted claims were read, or none are persisted.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Takes in what a previous leader persisted (every range as judged) and makes the claims
    /// [`Claims::ready`]; `persisted` is empty when nothing could be read. Returns how many sequences
    /// were forgotten to stay within the bounds.
    pub fn restore(&self, persisted: Vec<Persisted>) -> u64 {
        let mut dropped: u64 = 0;
        {
            let mut nodes = self.nodes.lock().expect("claims lock");
            for entry in persisted {
                let instances = nodes.entry(entry.node).or_default();
                let claims = match instances.iter().position(|c| c.instance == entry.instance) {
                    Some(i) => &mut instances[i],
                    None if instances.len() < INSTANCES_PER_NODE => {
                        // Behind the ones this process has seen already: those are newer.
                        instances.push_back(InstanceClaims::new(entry.instance));
                        instances.back_mut().expect("just pushed")
                    }
                    None => {
                        dropped = dropped.saturating_add(entry.ranges.len_sequences());
                        continue;
                    }
                };
                for (lo, hi) in entry.ranges.pairs() {
                    claims.judged.insert_range(*lo, *hi);
                }
                dropped = dropped.saturating_add(claims.judged.keep_highest(RANGES_PER_INSTANCE));
            }
        }
        self.ready.store(true, Ordering::Release);
        dropped
    }

    /// What to persist so that a new leader recognises what this one counted: every judged range,
    /// and every claimed batch whose evidence is in statuses (`written(mark)` for the mark all its
    /// records wait for) though its acknowledgement may not have gone; with the gates of those
    /// batches, to open once the snapshot is written ([`ClaimGate::persisted`]); and the cluster
    /// sources' cursors, moved over the windows whose evidence is written.
    pub fn snapshot(&self, written: impl Fn(u64) -> bool) -> Snapshot {
        let nodes = self.nodes.lock().expect("claims lock");
        let (mut out, mut gates, mut cut) = (Vec::new(), Vec::new(), 0u64);
        for (node, instances) in nodes.iter() {
            // Newest process first, as they are kept: a restore keeps that order.
            for claims in instances {
                let mut ranges = claims.judged.clone();
                for (sequence, claimed) in &claims.counting {
                    if claimed.gate.mark().is_some_and(&written) {
                        ranges.insert(*sequence);
                        if !claimed.gate.is_open() {
                            gates.push(claimed.gate.clone());
                        }
                    }
                }
                // The judged ranges are bounded as they grow; claims may split more. What is cut
                // is counted, and its gates open all the same (it would never be held).
                cut = cut.saturating_add(ranges.keep_highest(RANGES_PER_INSTANCE));
                if !ranges.is_empty() {
                    out.push(Persisted {
                        node: node.clone(),
                        instance: claims.instance,
                        ranges,
                    });
                }
            }
        }
        drop(nodes);
        // By node only: each node's processes stay newest first.
        out.sort_by(|a, b| a.node.cmp(&b.node));
        Snapshot {
            claims: out,
            cursors: self.cursors.advance(&written),
            gates,
            cut,
        }
    }

    /// A batch named `name` arrives: claims it if it is new. Every batch that may carry evidence
    /// goes through here before its records are taken in.
    pub fn begin(&self, name: BatchName<'_>) -> (Attempt, Dropped) {
        let mut dropped = Dropped::default();
        if name.instance == 0 {
            return (Attempt::First(None), dropped);
        }
        let mut nodes = self.nodes.lock().expect("claims lock");
        let instances = nodes.entry(name.node.to_string()).or_default();
        let i = match instances.iter().position(|c| c.instance == name.instance) {
            Some(i) => i,
            None => {
                // A new agent process: the latest first, the oldest forgotten.
                instances.push_front(InstanceClaims::new(name.instance));
                while instances.len() > INSTANCES_PER_NODE {
                    if let Some(old) = instances.pop_back() {
                        dropped.batches += old.counting.len() as u64;
                        // Forgotten, so never in a snapshot: their acknowledgements go.
                        old.counting.values().for_each(|c| c.gate.persisted());
                    }
                }
                0
            }
        };
        let claims = &mut instances[i];
        if claims.judged.contains(name.sequence) {
            return (Attempt::Counted, dropped);
        }
        if let Some(claimed) = claims.counting.get(&name.sequence) {
            return (Attempt::Repeat(claimed.first.clone()), dropped);
        }
        let claimed = Claimed {
            first: FirstAttempt::default(),
            gate: ClaimGate::new(self.persisting),
        };
        claims.counting.insert(name.sequence, claimed.clone());
        while claims.counting.len() > COUNTING_PER_INSTANCE {
            if let Some((_, forgotten)) = claims.counting.pop_first() {
                forgotten.gate.persisted();
            }
            dropped.batches += 1;
        }
        (Attempt::First(Some(claimed)), dropped)
    }

    /// The first attempt `first` has been merged: its acknowledgement waits for `holds` at flush mark
    /// `mark`. A batch whose records handed nothing to the evidence sink is judged at once: a
    /// resend has nothing to count either (and the batch keeps its agent's range whole).
    /// Returns how many sequences were forgotten to stay within the bounds.
    pub fn merged(
        &self,
        name: BatchName<'_>,
        first: &FirstAttempt,
        mark: u64,
        holds: &Holds,
    ) -> u64 {
        // Before the first attempt is published: a repeat copies it.
        if let Some(gate) = &holds.gate
            && let Some(evidence) = holds.evidence
            && !holds.evidence_later
        {
            // Evidence handed on later takes its mark then ([`Holds::ready`]).
            gate.set_mark(evidence);
        }
        let _ = first.set((mark, holds.clone()));
        if holds.evidence.is_none() && !holds.evidence_later {
            return self.judge(name);
        }
        0
    }

    /// An acknowledgement of batch `name` went out: its evidence is in statuses. Returns how many
    /// sequences were forgotten to stay within the bounds.
    pub fn acknowledged(&self, name: BatchName<'_>) -> u64 {
        self.judge(name)
    }

    /// A claimed batch's evidence is in statuses, or it had none: from now on a resend is counted.
    /// Returns how many sequences were forgotten to stay within the bounds.
    fn judge(&self, name: BatchName<'_>) -> u64 {
        let mut nodes = self.nodes.lock().expect("claims lock");
        let Some(claims) = instance_of(&mut nodes, name) else {
            return 0;
        };
        let Some(claimed) = claims.counting.remove(&name.sequence) else {
            return 0;
        };
        // Judged without evidence, a record may still have counted (a policy came after the batch
        // was taken in): it waits for no snapshot.
        claimed.gate.persisted();
        claims.judged.insert(name.sequence);
        claims.judged.keep_highest(RANGES_PER_INSTANCE)
    }

    /// Batches claimed and not acknowledged yet, over all nodes.
    pub fn counting(&self) -> usize {
        let nodes = self.nodes.lock().expect("claims lock");
        nodes.values().flatten().map(|c| c.counting.len()).sum()
    }
}

fn instance_of<'a>(
    nodes: &'a mut HashMap<String, VecDeque<InstanceClaims>>,
    name: BatchName<'_>,
) -> Option<&'a mut InstanceClaims> {
    nodes
        .get_mut(name.node)?
        .iter_mut()
        .find(|c| c.instance == name.instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(node: &str, instance: u64, sequence: u64) -> BatchName<'_> {
        BatchName {
            node,
            instance,
            sequence,
        }
    }

    fn with_evidence(mark: u64) -> Holds {
        Holds {
            evidence: Some(mark),
            ..Holds::default()
        }
    }

    #[test]
    fn a_resent_batch_is_a_repeat_of_its_first_attempt_until_acknowledged_then_counted() {
        let claims = Claims::default();
        let (first, _) = claims.begin(name("a", 7, 1));
        let Attempt::First(Some(Claimed { first, .. })) = first else {
            panic!("a new batch is a claimed first attempt: {first:?}");
        };
        claims.merged(name("a", 7, 1), &first, 3, &with_evidence(9));
        let (repeat, _) = claims.begin(name("a", 7, 1));
        assert_eq!(repeat, Attempt::Repeat(first.clone()));
        assert_eq!(first.get(), Some(&(3, with_evidence(9))));
        assert!(!repeat.counts());

        claims.acknowledged(name("a", 7, 1));
        assert_eq!(claims.begin(name("a", 7, 1)).0, Attempt::Counted);
        assert_eq!(claims.counting(), 0);
    }

    #[test]
    fn the_same_sequence_of_another_node_or_agent_process_is_another_batch() {
        let claims = Claims::default();
        let (Attempt::First(Some(Claimed { first, .. })), _) = claims.begin(name("a", 7, 1)) else {
            panic!("claimed");
        };
        claims.merged(name("a", 7, 1), &first, 1, &with_evidence(1));
        for other in [name("b", 7, 1), name("a", 8, 1), name("a", 7, 2)] {
            assert!(
                matches!(claims.begin(other).0, Attempt::First(Some(_))),
                "{other:?}"
            );
        }
    }

    #[test]
    fn a_batch_without_evidence_is_judged_at_once_and_one_of_an_agent_without_instance_never() {
        let claims = Claims::default();
        let (Attempt::First(Some(Claimed { first, .. })), _) = claims.begin(name("a", 7, 1)) else {
            panic!("claimed");
        };
        claims.merged(name("a", 7, 1), &first, 1, &Holds::default());
        assert_eq!(claims.begin(name("a", 7, 1)).0, Attempt::Counted);
        assert_eq!(claims.counting(), 0);
        assert_eq!(claims.begin(name("a", 0, 1)).0, Attempt::First(None));
        assert_eq!(claims.begin(name("a", 0, 1)).0, Attempt::First(None));
    }

    #[test]
    fn ranges_merge_touching_and_overlapping_sequences_and_keep_the_highest() {
        type Pairs = &'static [(u64, u64)];
        let cases: &[(Pairs, Pairs)] = &[
            (&[], &[]),
            (&[(1, 1), (2, 2), (3, 3)], &[(1, 3)]),
            (&[(5, 9), (1, 2)], &[(1, 2), (5, 9)]),
            (&[(1, 2), (4, 5), (3, 3)], &[(1, 5)]),
            (&[(1, 10), (3, 4)], &[(1, 10)]),
            (&[(4, 6), (1, 20), (30, 31)], &[(1, 20), (30, 31)]),
            (&[(9, 7)], &[(7, 9)]),
            (
                &[(u64::MAX - 1, u64::MAX), (0, 0)],
                &[(0, 0), (u64::MAX - 1, u64::MAX)],
            ),
        ];
        for (given, want) in cases {
            let ranges = Ranges::from_pairs(given.iter().copied());
            assert_eq!(ranges.pairs(), *want, "{given:?}");
            for (lo, hi) in *want {
                assert!(ranges.contains(*lo) && ranges.contains(*hi), "{given:?}");
            }
        }
        let mut ranges = Ranges::from_pairs([(1, 3), (5, 5), (7, 8)]);
        assert!(!ranges.contains(4) && !ranges.contains(6) && !ranges.contains(9));
        assert_eq!(ranges.keep_highest(2), 3);
        assert_eq!(ranges.pairs(), &[(5, 5), (7, 8)]);
    }

    #[test]
    fn bounds_forget_the_oldest_and_count_what_they_forget() {
        let claims = Claims::default();
        let mut dropped = 0;
        for sequence in 1..=COUNTING_PER_INSTANCE as u64 + 3 {
            dropped += claims.begin(name("a", 7, sequence)).1.batches;
        }
        assert_eq!(dropped, 3);
        // The oldest are forgotten: resent now, they would count again.
        assert!(matches!(
            claims.begin(name("a", 7, 1)).0,
            Attempt::First(Some(_))
        ));
        // Two newer agent processes push the first one out, with its claims.
        assert_eq!(claims.begin(name("a", 8, 1)).1.batches, 0);
        assert_eq!(
            claims.begin(name("a", 9, 1)).1.batches,
            COUNTING_PER_INSTANCE as u64
        );
        // Every other batch acknowledged: one range each, the lowest forgotten past the bound.
        let mut forgotten = 0;
        for sequence in (1..=2 * RANGES_PER_INSTANCE as u64 + 2).step_by(2) {
            let (Attempt::First(Some(Claimed { first, .. })), _) =
                claims.begin(name("b", 7, sequence))
            else {
                panic!("claimed");
            };
            claims.merged(name("b", 7, sequence), &first, 1, &with_evidence(1));
            forgotten += claims.acknowledged(name("b", 7, sequence));
        }
        assert_eq!(forgotten, 1);
        assert!(matches!(
            claims.begin(name("b", 7, 1)).0,
            Attempt::First(Some(_))
        ));
        assert_eq!(claims.begin(name("b", 7, 3)).0, Attempt::Counted);
    }

    #[test]
    fn a_snapshot_holds_judged_ranges_and_claims_whose_evidence_is_written_and_restores_as_counted()
    {
        let claims = Claims::unread();
        claims.restore(Vec::new());
        // 1, 2: acknowledged. 3: evidence at mark 5, written. 4: evidence at mark 9, not written yet.
        // 5: evidence handed on later (its mark is its stream's until taken again). 6: merged
        // without evidence.
        let mut gates = Vec::new();
        for sequence in 1..=6 {
            let (Attempt::First(Some(Claimed { first, gate })), _) =
                claims.begin(name("a", 7, sequence))
            else {
                panic!("claimed");
            };
            let holds = match sequence {
                1..=3 => with_evidence(5),
                4 => with_evidence(9),
                5 => Holds {
                    evidence_later: true,
                    ..with_evidence(5)
                },
                _ => Holds::default(),
            };
            let holds = Holds {
                gate: Some(gate.clone()),
                ..holds
            };
            claims.merged(name("a", 7, sequence), &first, 1, &holds);
            gate.counted();
            gates.push(gate);
        }
        claims.acknowledged(name("a", 7, 1));
        claims.acknowledged(name("a", 7, 2));
        let snapshot = claims.snapshot(|mark| mark < 6);
        let (written, snapshot) = (snapshot.gates, snapshot.claims);
        assert_eq!(
            snapshot,
            vec![Persisted {
                node: "a".into(),
                instance: 7,
                ranges: Ranges::from_pairs([(1, 3), (6, 6)]),
            }]
        );
        // The counted batches not acknowledged yet wait for a snapshot that holds them (3 is in
        // this one); 6, judged without evidence, had no mark to be persisted by.
        assert!(gates[2..5].iter().all(|g| !g.may_acknowledge()));
        assert!(gates[5].may_acknowledge());
        assert_eq!(written, vec![gates[2].clone()]);
        for gate in &written {
            gate.persisted();
        }
        assert!(gates[2].may_acknowledge() && !gates[3].may_acknowledge());
        // The later evidence's mark, taken again: 5 is in the next snapshot.
        gates[4].set_mark(5);
        assert_eq!(
            claims.snapshot(|mark| mark < 6).gates,
            vec![gates[4].clone()]
        );
        // The first mark stays: a repeat's copy taking a later one does not move it.
        gates[4].set_mark(9);
        assert!(
            claims.snapshot(|mark| mark < 6).claims[0]
                .ranges
                .contains(5)
        );

        let next = Claims::unread();
        assert!(!next.ready());
        assert_eq!(next.restore(snapshot), 0);
        assert!(next.ready());
        for sequence in [1, 2, 3, 6] {
            assert_eq!(
                next.begin(name("a", 7, sequence)).0,
                Attempt::Counted,
                "{sequence}"
            );
        }
        for sequence in [4, 5, 7] {
            assert!(
                matches!(
                    next.begin(name("a", 7, sequence)).0,
                    Attempt::First(Some(_))
                ),
                "{sequence}"
            );
        }
        // A newer process of the node is not pushed out by what is restored.
        let later = Claims::unread();
        let _ = later.begin(name("a", 8, 1));
        let _ = later.begin(name("a", 9, 1));
        assert_eq!(later.restore(claims.snapshot(|_| true).claims), 6);
        assert!(matches!(
            later.begin(name("a", 9, 2)).0,
            Attempt::First(Some(_))
        ));
    }

    #[test]
    fn a_counted_claim_forgotten_by_the_bounds_waits_for_no_snapshot() {
        let claims = Claims::unread();
        claims.restore(Vec::new());
        let gate_of = |instance, sequence| {
            let (Attempt::First(Some(Claimed { gate, .. })), _) =
                claims.begin(name("a", instance, sequence))
            else {
                panic!("claimed");
            };
            gate.counted();
            gate
        };
        // Pushed out of its process's waiting claims by newer batches.
        let oldest = gate_of(7, 1);
        for sequence in 2..=COUNTING_PER_INSTANCE as u64 + 1 {
            let _ = claims.begin(name("a", 7, sequence));
        }
        assert!(oldest.may_acknowledge());
        // Its process pushed out by two newer ones.
        let waiting = gate_of(7, COUNTING_PER_INSTANCE as u64 + 2);
        assert!(!waiting.may_acknowledge());
        let _ = claims.begin(name("a", 8, 1));
        let _ = claims.begin(name("a", 9, 1));
        assert!(waiting.may_acknowledge());
    }

    #[test]
    fn without_persisting_a_counted_batch_waits_for_nothing() {
        let claims = Claims::default();
        let (Attempt::First(Some(Claimed { gate, .. })), _) = claims.begin(name("a", 7, 1)) else {
            panic!("claimed");
        };
        gate.counted();
        assert!(gate.may_acknowledge());
    }
}
