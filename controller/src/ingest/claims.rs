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
//! In memory, and bounded: per node the [`INSTANCES_PER_NODE`] latest agent processes (a restarted
//! agent never resends its predecessor's batches), per instance at most [`COUNTING_PER_INSTANCE`]
//! batches still waiting for their acknowledgement and the last [`SETTLED_PER_INSTANCE`]
//! acknowledged ones (an acknowledgement lost on a breaking stream is followed at once by the resend).
//! What falls out is counted (`evidence_claims_dropped_total`); a batch resent after that counts
//! again. A new leader starts with no claims (see the docs for what that means).

use super::Holds;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

/// Agent processes remembered per node: the current one and its predecessor (a DaemonSet rolling
/// update with a surge runs both for a while).
pub const INSTANCES_PER_NODE: usize = 2;
/// Batches of one agent process whose evidence was handed on and whose acknowledgement has not gone
/// yet. Above the acknowledgements one stream may have waiting (4,096) and far above what an agent
/// keeps to resend (256 batches by default).
pub const COUNTING_PER_INSTANCE: usize = 8_192;
/// Acknowledged batches remembered per agent process, for an acknowledgement lost on the way.
pub const SETTLED_PER_INSTANCE: usize = 256;

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

/// What a batch arriving now is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Not seen before (or not recognisable): take it in whole. `Some`: it is claimed; once merged,
    /// set what its acknowledgement waits for there ([`Claims::merged`]).
    First(Option<FirstAttempt>),
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
#[derive(Debug, Default)]
pub struct Claims {
    nodes: Mutex<HashMap<String, VecDeque<InstanceClaims>>>,
}

#[derive(Debug)]
struct InstanceClaims {
    instance: u64,
    counting: BTreeMap<u64, FirstAttempt>,
    /// Ascending.
    settled: VecDeque<u64>,
}

/// What [`Claims::begin`] had to forget to stay in its bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub batches: u64,
}

impl Claims {
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
                instances.push_front(InstanceClaims {
                    instance: name.instance,
                    counting: BTreeMap::new(),
                    settled: VecDeque::new(),
                });
                while instances.len() > INSTANCES_PER_NODE {
                    if let Some(old) = instances.pop_back() {
                        dropped.batches += old.counting.len() as u64;
                    }
                }
                0
            }
        };
        let claims = &mut instances[i];
        if claims.settled.binary_search(&name.sequence).is_ok() {
            return (Attempt::Counted, dropped);
        }
        if let Some(first) = claims.counting.get(&name.sequence) {
            return (Attempt::Repeat(first.clone()), dropped);
        }
        let first = FirstAttempt::default();
        claims.counting.insert(name.sequence, first.clone());
        while claims.counting.len() > COUNTING_PER_INSTANCE {
            claims.counting.pop_first();
            dropped.batches += 1;
        }
        (Attempt::First(Some(first)), dropped)
    }

    /// The first attempt `first` has been merged: its acknowledgement waits for `holds` at flush mark
    /// `mark`. A batch whose records handed nothing to the evidence sink is unclaimed again (a
    /// repeat of it is harmless).
    pub fn merged(&self, name: BatchName<'_>, first: &FirstAttempt, mark: u64, holds: &Holds) {
        let _ = first.set((mark, holds.clone()));
        if holds.evidence.is_none() && !holds.evidence_later {
            let mut nodes = self.nodes.lock().expect("claims lock");
            if let Some(claims) = instance_of(&mut nodes, name) {
                claims.counting.remove(&name.sequence);
            }
        }
    }

    /// An acknowledgement of batch `name` went out: its evidence is in statuses.
    pub fn acknowledged(&self, name: BatchName<'_>) {
        let mut nodes = self.nodes.lock().expect("claims lock");
        let Some(claims) = instance_of(&mut nodes, name) else {
            return;
        };
        if claims.counting.remove(&name.sequence).is_none() {
            return;
        }
        let at = claims.settled.partition_point(|s| *s < name.sequence);
        claims.settled.insert(at, name.sequence);
        while claims.settled.len() > SETTLED_PER_INSTANCE {
            claims.settled.pop_front();
        }
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
        let Attempt::First(Some(first)) = first else {
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
        let (Attempt::First(Some(first)), _) = claims.begin(name("a", 7, 1)) else {
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
    fn a_batch_without_evidence_or_of_an_agent_without_instance_is_not_claimed() {
        let claims = Claims::default();
        let (Attempt::First(Some(first)), _) = claims.begin(name("a", 7, 1)) else {
            panic!("claimed");
        };
        claims.merged(name("a", 7, 1), &first, 1, &Holds::default());
        assert!(matches!(
            claims.begin(name("a", 7, 1)).0,
            Attempt::First(Some(_))
        ));
        assert_eq!(claims.begin(name("a", 0, 1)).0, Attempt::First(None));
        assert_eq!(claims.begin(name("a", 0, 1)).0, Attempt::First(None));
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
        for sequence in 1..=SETTLED_PER_INSTANCE as u64 + 1 {
            let (Attempt::First(Some(first)), _) = claims.begin(name("b", 7, sequence)) else {
                panic!("claimed");
            };
            claims.merged(name("b", 7, sequence), &first, 1, &with_evidence(1));
            claims.acknowledged(name("b", 7, sequence));
        }
        assert!(matches!(
            claims.begin(name("b", 7, 1)).0,
            Attempt::First(Some(_))
        ));
        assert_eq!(claims.begin(name("b", 7, 2)).0, Attempt::Counted);
    }
}
