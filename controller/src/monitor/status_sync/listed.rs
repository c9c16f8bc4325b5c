//! Whether the stores evidence is judged against have completed their first list
//! (docs/behaviour.md §1.10, §3.1).
//!
//! A watch that has not listed holds an empty or partial store. Judged against it, a record finds
//! no policy (or no NetworkPolicy that allows its flow, or no labels on its namespace), nothing is
//! recorded, and its batch is acknowledged: an agent then forgets a violation nobody wrote. So
//! every pass that judges evidence (the evidence pass, the protect gate's replay, the status pass,
//! and the edges `check --from-cluster` reads) asks [`StatusSync::listed`] first; until every watch
//! has listed, evidence stays queued and its batches stay unacknowledged.

use super::*;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use std::sync::atomic::AtomicU8;

/// How often [`StatusSync::wait_ready`] looks again.
const LISTED_POLL: Duration = Duration::from_millis(200);

/// A watch whose first list evidence waits for: the `watch` label of
/// `evidence_waiting_for_watch`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Watch {
    /// WorkloadNetworkPolicies: which policy records a flow, and whether any does.
    policies,
    /// NetworkPolicies: the others in force beside a policy, any of which can allow its flows.
    network_policies,
    /// Namespaces: their labels, which namespace selectors match.
    namespaces,
    /// The cluster index (pods, Services, endpoints, workloads, Jobs, nodes):
    /// [`SharedIndex::ready`].
    index,
    /// ClusterNetworkPolicies, when the cluster serves them (else this watch counts as listed).
    cluster_policies,
    /// ClusterNetworkPolicyProposals (those in monitor record violations), when served.
    cluster_proposals,
    /// The protect gate's history as the previous leader persisted it ([`history_store`]): read
    /// before new flows are added, so that a flow seen again merges into its old edge.
    edge_history,
}

impl Watch {
    pub const ALL: [Watch; 7] = [
        Watch::policies,
        Watch::network_policies,
        Watch::namespaces,
        Watch::index,
        Watch::cluster_policies,
        Watch::cluster_proposals,
        Watch::edge_history,
    ];

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The label set of `evidence_waiting_for_watch`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabel {
    pub watch: Watch,
}

/// Which watches have completed their first list. Read from the stores themselves
/// ([`StatusSync::listed`]), never kept beside them: one value, one source of truth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    pub policies: bool,
    pub network_policies: bool,
    pub namespaces: bool,
    pub index: bool,
    pub cluster_policies: bool,
    pub cluster_proposals: bool,
    pub edge_history: bool,
}

impl Listed {
    /// Every watch has listed.
    pub const ALL: Listed = Listed {
        policies: true,
        network_policies: true,
        namespaces: true,
        index: true,
        cluster_policies: true,
        cluster_proposals: true,
        edge_history: true,
    };

    /// Whether `watch` has listed.
    pub fn has(self, watch: Watch) -> bool {
        match watch {
            Watch::policies => self.policies,
            Watch::network_policies => self.network_policies,
            Watch::namespaces => self.namespaces,
            Watch::index => self.index,
            Watch::cluster_policies => self.cluster_policies,
            Watch::cluster_proposals => self.cluster_proposals,
            Watch::edge_history => self.edge_history,
        }
    }

    /// The watches evidence still waits for, in [`Watch::ALL`] order; empty once all have listed.
    pub fn waiting_for(self) -> Vec<Watch> {
        Watch::ALL.into_iter().filter(|w| !self.has(*w)).collect()
    }

    /// Whether evidence may be judged: every watch it is judged against has listed.
    pub fn complete(self) -> bool {
        self == Listed::ALL
    }

    /// The watches waited for, one bit each (to log only when they change).
    fn waiting_bits(self) -> u8 {
        self.waiting_for().into_iter().map(Watch::bit).sum()
    }
}

/// Whether a record handed in now may be evidence, so that its batch's acknowledgement waits for
/// the evidence pass: yes while the policies have not listed (any policy may exist), else while
/// any policy exists. Read from the store at hand-in, not from the last pass: a policy created
/// since would judge the record at the next pass, after an acknowledgement that did not wait.
pub fn evidence_may_count(policies_listed: bool, policies: usize) -> bool {
    !policies_listed || policies > 0
}

/// Whether `store`'s watch has completed its first list. A store whose writer is gone without
/// listing (its watch's task ended) has not: `wait_until_ready` fails then.
///
/// Only for the stores of this sync's own watches: polled, never awaited, the readiness is a oneshot
/// with room for one waker, and a poll from here would take the place of an awaiting task's (a
/// kube-runtime controller awaits its store's; the shared watches have a flag of their own,
/// [`crate::cluster::shared_watch::SharedWatch::listed`]).
pub(super) fn has_listed<K>(store: &Store<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    use futures::FutureExt;
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// What evidence was last said to wait for ([`Listed::waiting_bits`]); `NOT_YET` before the first
/// look, so the first look logs.
#[derive(Debug)]
pub(super) struct LastWaiting(AtomicU8);

impl LastWaiting {
    const NOT_YET: u8 = u8::MAX;
}

impl Default for LastWaiting {
    fn default() -> Self {
        Self(AtomicU8::new(Self::NOT_YET))
    }
}

impl StatusSync {
    /// Which watches evidence is judged against have completed their first list, read from their
    /// stores and the index now; also brings `evidence_waiting_for_watch` up to date, and logs
    /// when what evidence waits for changes.
    pub fn listed(&self) -> Listed {
        let listed = Listed {
            policies: self.objects.policies.listed(),
            network_policies: self.objects.network_policies.listed(),
            namespaces: has_listed(&self.namespaces),
            index: self.index.ready(),
            cluster_policies: self.cluster_policies_served.listed(&self.cluster_policies),
            cluster_proposals: self
                .cluster_proposals_served
                .listed(&self.cluster_proposals),
            edge_history: self.history_restored.load(Ordering::Acquire),
        };
        for watch in Watch::ALL {
            self.metrics
                .waiting_for_watch
                .get_or_create(&WatchLabel { watch })
                .set(i64::from(!listed.has(watch)));
        }
        let bits = listed.waiting_bits();
        if self.last_waiting.0.swap(bits, Ordering::AcqRel) != bits {
            if listed.complete() {
                tracing::info!(
                    "every watch evidence is judged against has listed: evidence passes start"
                );
            } else {
                tracing::info!(waiting_for = ?listed.waiting_for(),
                    "evidence waits for these watches to list: it stays queued and its batches unacknowledged");
            }
        }
        listed
    }

    /// Waits until every watch evidence is judged against has listed ([`StatusSync::listed`]). A
    /// watch that ended before listing never has: this then waits for ever, and so does evidence.
    pub async fn wait_ready(&self) {
        while !self.is_ready() {
            tokio::time::sleep(LISTED_POLL).await;
        }
    }

    /// Whether every watch evidence is judged against has listed.
    pub fn is_ready(&self) -> bool {
        self.listed().complete()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(policies: bool, network_policies: bool, namespaces: bool, index: bool) -> Listed {
        Listed {
            policies,
            network_policies,
            namespaces,
            index,
            cluster_policies: true,
            cluster_proposals: true,
            edge_history: true,
        }
    }

    #[test]
    fn evidence_waits_for_every_watch_it_is_judged_against() {
        use Watch::*;
        // (listed, waiting for)
        let cases = [
            (
                listed(false, false, false, false),
                vec![policies, network_policies, namespaces, index],
            ),
            (listed(false, true, true, true), vec![policies]),
            (listed(true, false, true, true), vec![network_policies]),
            (listed(true, true, false, true), vec![namespaces]),
            (listed(true, true, true, false), vec![index]),
            (
                listed(true, false, false, true),
                vec![network_policies, namespaces],
            ),
            (
                Listed {
                    cluster_policies: false,
                    ..Listed::ALL
                },
                vec![cluster_policies],
            ),
            (
                Listed {
                    cluster_proposals: false,
                    ..Listed::ALL
                },
                vec![cluster_proposals],
            ),
            (listed(true, true, true, true), vec![]),
        ];
        for (listed, waiting) in cases.clone() {
            assert_eq!(listed.waiting_for(), waiting, "{listed:?}");
            assert_eq!(listed.complete(), waiting.is_empty(), "{listed:?}");
        }
        let bits: std::collections::HashSet<u8> =
            cases.iter().map(|(l, _)| l.waiting_bits()).collect();
        assert_eq!(
            bits.len(),
            cases.len(),
            "each set of watches has its own bits"
        );
        assert_ne!(Listed::ALL.waiting_bits(), LastWaiting::NOT_YET);
    }

    #[test]
    fn a_record_may_be_evidence_until_the_policies_are_listed_and_while_any_exists() {
        // (policies listed, policies in the store, may count)
        let cases = [
            (false, 0, true),
            (false, 3, true),
            (true, 0, false),
            (true, 1, true),
        ];
        for (is_listed, policies, counts) in cases {
            assert_eq!(
                evidence_may_count(is_listed, policies),
                counts,
                "{is_listed} {policies}"
            );
        }
    }

    #[tokio::test]
    async fn a_store_has_listed_once_its_first_list_is_done_and_never_when_its_watch_ended() {
        let (store, mut writer) = reflector::store::<Namespace>();
        assert!(!has_listed(&store));
        writer.apply_watcher_event(&watcher::Event::Init);
        assert!(!has_listed(&store), "a list in progress");
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert!(has_listed(&store));
        drop(writer);
        assert!(has_listed(&store), "listed stays listed");

        let (store, writer) = reflector::store::<Namespace>();
        drop(writer);
        assert!(!has_listed(&store), "a watch that ended before listing");
    }
}
