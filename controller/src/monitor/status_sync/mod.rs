//! The status sync (docs/design.md, "Violations"): flow records become violation records on the
//! WorkloadNetworkPolicies that deny them.
//!
//! - **Evidence in.** Ingest hands every accepted record to an [`EvidenceQueue`] (never blocking: a
//!   full queue drops its oldest record and counts it). Every `evidence_interval`, and as soon as the
//!   queue is half full (at a high record rate a fixed interval would drop what a pass could take),
//!   the queued records are resolved against the controller's [`Index`] (IP history, Services),
//!   evaluated against the policies in force ([`attribution::attribute`]: egress first; a protect
//!   egress denial hides the flow from the destination's ingress policy), filtered by what evidence
//!   counts for the policy's mode ([`EvidenceKind::counts_for`]) and by the repeat window
//!   ([`RepeatFilter`]), reported to the [`ViolationSink`], and queued per policy ([`Pending`]).
//!   A blocked record whose peer the index could not place yet reaches the queue only once it is
//!   placed or the resolution grace is over ([`crate::ingest::waiting`]); the pass counts what it
//!   came to ([`WaitedOutcome`]: a pod the policies allow is a startup drop, no violation).
//!   The rules that allowed each flow are noted in a [`UsageTracker`] (rule usage, docs/api.md).
//! - **Status out.** Every `interval` (`--status-update-interval`, default 30s) each policy's status
//!   goes through [`violations::sync`] (merge, clear, acknowledge, counters) and [`rule_usage::merge`]
//!   (`ruleUsage`). Only a changed status is patched: a JSON merge patch of the violation fields and
//!   `ruleUsage` alone on the status subresource (the policy reconciler owns `conditions`), in one
//!   write per policy and interval whatever the traffic, with the cached `resourceVersion` as a
//!   precondition, so a patch
//!   computed from a stale copy fails instead of overwriting newer records. Pending observations are
//!   forgotten only once the patch that contains them succeeded; a conflicting patch is computed
//!   again at once from a fresh read, any other failed patch at the next interval. Then consumed `acknowledge-<id>` annotations are removed, with
//!   an Event per acknowledged record and per unknown id, and `acknowledged` reported to the sink.
//!
//! The evaluator's [`ClusterView`] is derived from the index at each pass (one source of truth for
//! pods), plus NetworkPolicies from the shared watch ([`PolicyObjects`]) and namespaces from this
//! module's own watch. Nothing is judged
//! before all of them have listed ([`Listed`]): evidence waits, queued and unacknowledged.

use crate::cluster::index::Index;
use crate::cluster::index::Opened;
use crate::cluster::shared_watch::{self, PolicyObjects};
use crate::cluster::watches::SharedIndex;
use crate::ingest::claims::Claims;
use crate::ingest::evidence::{Evidence, EvidenceKind, EvidenceSink};
use crate::monitor::edge_history::{self, EdgeHistory};
use crate::monitor::evaluate::attribution::{self, AllowedNow, PolicyKey, PolicySet, RuleMatch};
use crate::monitor::evaluate::cluster_monitor::Monitored;
use crate::monitor::evaluate::view::{ClusterView, Endpoint, NamedClusterPolicy, NamedPolicy};
use crate::monitor::history_store;
use crate::monitor::otlp::ViolationSink;
use crate::monitor::violations::evidence::{
    Pending, REPEAT_WINDOW, RepeatFilter, WaitedOutcome, WorkloadNames, names_a_workload,
    observed_flows,
};
use crate::monitor::violations::{self, SyncInput, SyncOutcome};
use crate::policy::protect_gate;
use crate::policy::protect_gate::GateReport;
use crate::policy::rule_usage::{self, RuleRef, UsageTracker};
use crate::policy::validity::SharedBackends;
use crate::runtime::events::{publish_cluster_scoped, publish_with};
use crate::runtime::metrics::{ControllerMetrics, Reason};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposal;
use network_enforcer_api::{
    AcknowledgedViolation, Backend, Direction, PolicyMode, RuleUsage, WorkloadNetworkPolicy,
    WorkloadRef,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

mod attribute;
mod claims;
mod cluster_policies;
mod cluster_proposals;
use cluster_proposals::proposal_key;
mod history;
mod listed;
mod queue;
mod run;
mod settings;
mod status;

pub use listed::{Listed, Watch, WatchLabel, evidence_may_count};
pub use queue::MAX_QUEUED_RECORDS;
pub use settings::{Settings, parse_duration, parse_duration_or_zero};

/// Records waiting for the next evidence pass; bounded, dropping the oldest.
///
/// It also tells ingest when evidence is safe to acknowledge: an agent forgets an acknowledged batch, so
/// a violation found in it must be in a policy's status by then (or the controller's restart would lose
/// it). Drains are numbered; a drain is *settled* once it has been attributed and every observation it
/// produced has been patched into a status (at once when it produced none). A batch handed in before
/// drain `n` began is settled once drain `n` is.
#[derive(Debug, Default)]
pub struct EvidenceQueue {
    queued_records: Mutex<Queued>,
    /// Records dropped because the queue was full (`evidence_records_dropped_total`).
    dropped: Counter,
    /// Records queued now (`evidence_queue_records`).
    queued: Gauge,
    /// The newest settled drain.
    settled: watch::Sender<u64>,
    /// The status sync's store of policies: without one (listed and empty) no record is evidence.
    /// `None` (a queue of its own, in tests): every record may be.
    policies: Option<(Store<WorkloadNetworkPolicy>, shared_watch::Listed)>,
    /// Woken when the queue reaches half its bound: the next pass starts then rather than at its
    /// interval.
    half_full: tokio::sync::Notify,
    /// The status sync's store of cluster proposals and whether their kind is served: while one is
    /// in monitor, or the store has not listed yet (any may be), every record may be evidence,
    /// policies or not.
    proposals: Option<(
        Store<ClusterNetworkPolicyProposal>,
        Arc<cluster_policies::Served>,
    )>,
}

/// The queue's records.
#[derive(Debug, Default)]
struct Queued {
    records: VecDeque<Evidence>,
    /// Drains so far; counted under the lock, so a record is either in drain `n` or handed in after it.
    drains: u64,
    /// Drains a pass has taken and not yet attributed: their observations are not pending yet, so
    /// "nothing pending" says nothing about them, and neither they nor later drains are settled.
    attributing: BTreeSet<u64>,
}

/// Why one policy's sync failed; its observations stay pending and it is retried next interval.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("patching the status failed: {0}")]
    Patch(#[source] kube::Error),
    #[error("reading the policy after a conflicting patch failed: {0}")]
    Reread(#[source] kube::Error),
    #[error("the policy has no namespace or name")]
    Unnamed,
}

/// What one policy's sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySync {
    /// The status was patched.
    pub patched: bool,
    /// Observations recorded by the patch.
    pub observations: usize,
    /// Records acknowledged by the patch.
    pub acknowledged: usize,
    /// Acknowledge annotations removed (consumed or unknown).
    pub annotations_removed: usize,
}

/// What one pass over every policy did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub policies: usize,
    pub patched: usize,
    pub failed: usize,
    pub observations: usize,
    pub acknowledged: usize,
}

/// The writers of the watches the sync runs itself (the policies and NetworkPolicies come from the
/// shared watches, [`PolicyObjects`]).
struct Writers {
    cluster_policies: Writer<ClusterNetworkPolicy>,
    cluster_proposals: Writer<ClusterNetworkPolicyProposal>,
    namespaces: Writer<Namespace>,
}

#[derive(Debug)]
struct State {
    pending: Pending,
    repeats: RepeatFilter,
    /// [`Pending::dropped`] as last counted into the metrics.
    pending_dropped_counted: u64,
    /// The rules that allowed flows since the process started, merged into `ruleUsage` at each sync.
    usage: UsageTracker<PolicyKey>,
    /// The workload names evidence passes built, kept for the next pass.
    names: WorkloadNames,
    /// Policies whose status patch failed, with the passes in a row it did; from
    /// [`FAILED_PASSES_BEFORE_PARKED`] on, their pending observations no longer hold back
    /// acknowledgements ([`StatusSync::settle_if_written`]).
    failing: HashMap<PolicyKey, u32>,
}

/// Status passes in a row whose patch of a policy failed before that policy's pending observations
/// stop holding back the acknowledgements of every agent's batches (docs/behaviour.md §3.7): a
/// status that cannot be written (too large, refused by an admission webhook, a conflict storm)
/// must not stall the evidence of every other policy.
pub const FAILED_PASSES_BEFORE_PARKED: u32 = 3;

/// The status sync's Prometheus metrics; [`StatusSync::register_metrics`] adds them to the process's
/// registry. Every loss of evidence is counted somewhere here.
#[derive(Clone, Debug, Default)]
pub struct SyncMetrics {
    /// Accepted records dropped before evaluation because the evidence queue was full.
    pub evidence_dropped: Counter,
    /// Records waiting for the next evidence pass.
    pub evidence_queued: Gauge,
    /// Records that resolved to no flow (a Service without backends). A record whose local pod is
    /// unknown or that is malformed is refused at ingest and never queued.
    pub evidence_unresolved: Counter,
    /// Observations dropped before a status patch recorded them, by reason: `policy_queue_full`
    /// ([`crate::monitor::violations::evidence::MAX_PENDING_PER_POLICY`]) or `policy_deleted`.
    pub observations_dropped: Family<Reason, Counter>,
    /// Observations waiting for the status patch that records them.
    pub pending_observations: Gauge,
    /// WorkloadNetworkPolicies the last evidence pass evaluated records against.
    pub policies_evaluated: Gauge,
    /// Edges held by the protect gate's history.
    pub history_edges: Gauge,
    /// Edges evicted from that history by its bound (the least recently seen first).
    pub history_evicted: Counter,
    /// Edges the last persisting of the history wrote ([`history_store`]).
    pub history_persisted: Gauge,
    /// Edges the last persisting left out by its bound (the least recently seen).
    pub history_persist_cut: Gauge,
    /// Persistings or restorings of the history that failed (API errors, damaged shards).
    pub history_store_failures: Counter,
    /// Edges taken in from the persisted history when this controller became the leader.
    pub history_restored: Gauge,
    /// Agent processes whose claims the last write of the evidence claims held.
    pub claims_persisted: Gauge,
    /// Sequences the writes of the claims left out to fit their ConfigMap.
    pub claims_cut: Counter,
    /// Reads or writes of the persisted evidence claims that failed (API errors, damaged data).
    pub claims_store_failures: Counter,
    /// Agent processes whose claims were read when this controller became the leader.
    pub claims_restored: Gauge,
    /// Status patches that failed, by reason: `conflict` (the copy was older than the object; retried
    /// at once from a fresh read) or `error` (retried next interval).
    pub patch_failures: Family<Reason, Counter>,
    /// Blocked records whose peer waited for the index, by what they came to ([`WaitedOutcome`]):
    /// `startup_drop` counts the refusals of new pods the policies allow.
    pub waited_for_peer: Family<WaitedLabel, Counter>,
    /// 1 while evidence waits for the first list of that watch ([`Listed`]), 0 once it has listed.
    pub waiting_for_watch: Family<WatchLabel, Gauge>,
    /// Completed status passes ([`StatusSync::sync_all`]): the first runs as soon as every watch
    /// has listed, then one every `interval`.
    pub status_passes: Counter,
    /// Policies whose status patch failed [`FAILED_PASSES_BEFORE_PARKED`] passes in a row or more:
    /// their observations are retried but no longer hold back acknowledgements.
    pub status_writes_failing: Gauge,
    /// ClusterNetworkPolicies in the cluster that apply to nothing (invalid specs).
    pub cluster_policies_invalid: Gauge,
}

/// The label of `evidence_waited_for_peer_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct WaitedLabel {
    pub outcome: WaitedOutcome,
}

impl SyncMetrics {
    fn patch_failed(&self, reason: &str) {
        self.patch_failures
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
    }

    fn waited_for_peer(&self, outcome: WaitedOutcome) {
        self.waited_for_peer
            .get_or_create(&WaitedLabel { outcome })
            .inc();
    }

    fn dropped(&self, reason: &str, n: u64) {
        if n > 0 {
            self.observations_dropped
                .get_or_create(&Reason {
                    reason: reason.into(),
                })
                .inc_by(n);
        }
    }
}

/// The status sync. See the module docs.
pub struct StatusSync {
    client: Client,
    index: Arc<SharedIndex>,
    queue: Arc<EvidenceQueue>,
    sink: Arc<dyn ViolationSink>,
    recorder: Recorder,
    settings: Settings,
    /// The shared watches the policies and NetworkPolicies below come from (started by
    /// [`StatusSync::watches`]).
    objects: Arc<PolicyObjects>,
    policies: Store<WorkloadNetworkPolicy>,
    network_policies: Store<NetworkPolicy>,
    cluster_policies: Store<ClusterNetworkPolicy>,
    /// Whether [`StatusSync::cluster_policies`] is watched ([`cluster_policies::Served`]).
    cluster_policies_served: cluster_policies::Served,
    /// ClusterNetworkPolicyProposals: those in monitor record violations ([`cluster_proposals`]).
    cluster_proposals: Store<ClusterNetworkPolicyProposal>,
    cluster_proposals_served: Arc<cluster_policies::Served>,
    namespaces: Store<Namespace>,
    writers: Mutex<Option<Writers>>,
    state: Mutex<State>,
    /// Every flow that went through, for the protect gate ([`StatusSync::replay`]).
    history: Mutex<EdgeHistory>,
    /// Strict protect policies the gate holds in monitor: their evidence counts as monitor's.
    held: Mutex<HashSet<PolicyKey>>,
    /// When this sync first judged evidence (the history started filling), and whether the history
    /// was seeded from the policies' violation records then ([`StatusSync::seed_history`]).
    started: std::sync::OnceLock<std::time::Instant>,
    /// Whether the history a previous leader persisted has been read (or there is none to read:
    /// no store configured); evidence waits for it ([`listed::Watch::edge_history`]).
    history_restored: std::sync::atomic::AtomicBool,
    /// Whether that history was read whole (or there is no store): only then is it persisted again,
    /// and are cluster proposals learned from it.
    history_read: std::sync::atomic::AtomicBool,
    /// What the last persisting of the history wrote, so an unchanged history is not written again
    /// (`None`: nothing yet; the first persisting always writes, which also replaces what an older
    /// leader wrote).
    history_written: tokio::sync::Mutex<Option<history_store::Encoded>>,
    /// The invalid ClusterNetworkPolicies last reported, and why ([`StatusSync::view`]).
    invalid_cluster_policies: Mutex<BTreeMap<String, String>>,
    /// The view the web view's answers were last judged against, and when it was built.
    recent_view: Mutex<Option<(std::time::Instant, Arc<ClusterView>)>>,
    /// What evidence was last said to wait for ([`StatusSync::listed`]).
    last_waiting: listed::LastWaiting,
    /// The batches whose evidence was counted ([`crate::ingest::claims`]), shared with ingest.
    claims: Arc<Claims>,
    /// False once the claims may not be written: they could not be read, or the Lease was lost.
    claims_writable: std::sync::atomic::AtomicBool,
    /// What the last write of the claims wrote (an unchanged snapshot is not written again).
    claims_written: tokio::sync::Mutex<
        Option<(
            Vec<crate::ingest::claims::Persisted>,
            Vec<crate::ingest::source_cursors::PersistedCursor>,
        )>,
    >,
    metrics: SyncMetrics,
}

impl StatusSync {
    /// A status sync over `index` (kept current by [`crate::cluster::watches::run`]) reporting to `sink`.
    /// Start it with [`StatusSync::run`] (or [`StatusSync::watches`] plus your own passes).
    pub fn new(
        client: Client,
        index: Arc<SharedIndex>,
        objects: Arc<PolicyObjects>,
        settings: Settings,
        sink: Arc<dyn ViolationSink>,
    ) -> Arc<Self> {
        let policies = objects.policies.store();
        let network_policies = objects.network_policies.store();
        let (cluster_policies, cluster_policies_writer) = reflector::store();
        let (cluster_proposals, cluster_proposals_writer) = reflector::store();
        let cluster_proposals_served = Arc::new(cluster_policies::Served::default());
        let (namespaces, namespaces_writer) = reflector::store();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: settings.reporter.clone(),
                instance: settings.instance.clone(),
            },
        );
        let queue = EvidenceQueue {
            policies: Some((policies.clone(), objects.policies.listed_flag())),
            proposals: Some((cluster_proposals.clone(), cluster_proposals_served.clone())),
            ..EvidenceQueue::default()
        };
        let metrics = SyncMetrics {
            evidence_dropped: queue.dropped.clone(),
            evidence_queued: queue.queued.clone(),
            ..SyncMetrics::default()
        };
        let settings_history_absent = settings.history_store.is_none();
        let claims = Arc::new(if settings.claims_store.is_some() {
            Claims::unread()
        } else {
            Claims::default()
        });
        Arc::new(StatusSync {
            client,
            index,
            queue: Arc::new(queue),
            metrics,
            sink,
            recorder,
            state: Mutex::new(State {
                pending: Pending::default(),
                repeats: RepeatFilter::new(settings.repeat_window),
                pending_dropped_counted: 0,
                usage: UsageTracker::default(),
                names: WorkloadNames::default(),
                failing: HashMap::new(),
            }),
            history: Mutex::new(EdgeHistory::new(settings.history)),
            held: Mutex::default(),
            started: std::sync::OnceLock::new(),
            settings,
            objects,
            policies,
            network_policies,
            cluster_policies,
            cluster_policies_served: cluster_policies::Served::default(),
            cluster_proposals,
            cluster_proposals_served,
            namespaces,
            writers: Mutex::new(Some(Writers {
                cluster_policies: cluster_policies_writer,
                cluster_proposals: cluster_proposals_writer,
                namespaces: namespaces_writer,
            })),
            history_restored: std::sync::atomic::AtomicBool::new(settings_history_absent),
            history_read: std::sync::atomic::AtomicBool::new(true),
            history_written: tokio::sync::Mutex::default(),
            invalid_cluster_policies: Mutex::default(),
            recent_view: Mutex::default(),
            last_waiting: listed::LastWaiting::default(),
            claims,
            claims_writable: std::sync::atomic::AtomicBool::new(true),
            claims_written: tokio::sync::Mutex::default(),
        })
    }

    /// The evidence claims ingest takes batches through ([`crate::ingest::Learning::claims`]).
    pub fn claims(&self) -> Arc<Claims> {
        self.claims.clone()
    }

    /// Where ingest hands accepted records ([`crate::ingest::Learning::evidence`]).
    pub fn evidence(&self) -> Arc<dyn EvidenceSink> {
        self.queue.clone()
    }

    /// This sync's metrics (shared atomics).
    pub fn metrics(&self) -> &SyncMetrics {
        &self.metrics
    }

    /// Registers this sync's metrics on the process's registry.
    pub fn register_metrics(&self, metrics: &ControllerMetrics) {
        let m = &self.metrics;
        metrics.register(
            "evidence_records_dropped",
            "Accepted flow records dropped before evaluation because the evidence queue was full",
            m.evidence_dropped.clone(),
        );
        metrics.register(
            "evidence_queue_records",
            "Flow records waiting for the next evidence pass",
            m.evidence_queued.clone(),
        );
        metrics.register(
            "evidence_records_unresolved",
            "Flow records that resolved to no flow to evaluate (a Service without backends)",
            m.evidence_unresolved.clone(),
        );
        metrics.register(
            "violation_observations_dropped",
            "Violation observations dropped before a status patch recorded them: policy_queue_full \
             (too many waiting for one policy) or policy_deleted",
            m.observations_dropped.clone(),
        );
        metrics.register(
            "pending_violation_observations",
            "Violation observations waiting for the status patch that records them",
            m.pending_observations.clone(),
        );
        metrics.register(
            "evidence_policies",
            "WorkloadNetworkPolicies the last evidence pass evaluated flow records against",
            m.policies_evaluated.clone(),
        );
        metrics.register(
            "edge_history_edges",
            "Observed edges held for the protect gate",
            m.history_edges.clone(),
        );
        metrics.register(
            "edge_history_evicted",
            "Observed edges evicted from the protect gate's history by its bound (--edge-history-max-edges)",
            m.history_evicted.clone(),
        );
        metrics.register(
            "cluster_policies_invalid",
            "ClusterNetworkPolicies whose spec is invalid: they apply to nothing (the agent enforces \
             them the same way); the controller logs each one",
            m.cluster_policies_invalid.clone(),
        );
        metrics.register(
            "edge_history_persisted_edges",
            "Observed edges the last persisting of the protect gate's history wrote (ConfigMaps \
             --edge-history-configmap-N)",
            m.history_persisted.clone(),
        );
        metrics.register(
            "edge_history_persist_cut_edges",
            "Observed edges the last persisting left out because the ConfigMaps were full (the least \
             recently seen): a new leader will not know them until they are seen again",
            m.history_persist_cut.clone(),
        );
        metrics.register(
            "edge_history_store_failures",
            "Writes or reads of the persisted edge history that failed (API errors, damaged shards)",
            m.history_store_failures.clone(),
        );
        metrics.register(
            "edge_history_restored_edges",
            "Observed edges taken in from the persisted history when this controller became the leader",
            m.history_restored.clone(),
        );
        metrics.register(
            "evidence_claims_persisted_processes",
            "Agent processes whose evidence claims the last write held (ConfigMap \
             --evidence-claims-configmap): a new leader recognises their resent batches",
            m.claims_persisted.clone(),
        );
        metrics.register(
            "evidence_claims_persist_cut",
            "Batch sequences the writes of the evidence claims left out to fit their ConfigMap: resent \
             to a new leader, such a batch counts again",
            m.claims_cut.clone(),
        );
        metrics.register(
            "evidence_claims_store_failures",
            "Reads or writes of the persisted evidence claims that failed (API errors, damaged data)",
            m.claims_store_failures.clone(),
        );
        metrics.register(
            "evidence_claims_restored_processes",
            "Agent processes whose evidence claims were read when this controller became the leader",
            m.claims_restored.clone(),
        );
        metrics.register(
            "evidence_waited_for_peer",
            "Blocked connections whose peer address was no pod yet, held up to the resolution grace, \
             by what the evidence pass then found: startup_drop (the peer is a pod the policies allow: \
             refused only because a node had not learned its address yet; no violation), violation \
             (a pod they do not allow), unknown_address (still no pod: judged as the address)",
            m.waited_for_peer.clone(),
        );
        metrics.register(
            "evidence_waiting_for_watch",
            "1 while evidence waits for the first list of this watch (policies, network_policies, \
             namespaces, index, cluster_policies, cluster_proposals) or for the persisted edge history to be read \
             (edge_history): until every one is in, records stay queued and their batches \
             unacknowledged; 0 once it is",
            m.waiting_for_watch.clone(),
        );
        metrics.register(
            "status_passes",
            "Status sync passes completed: the first as soon as every watch has listed, then one \
             every --status-update-interval",
            m.status_passes.clone(),
        );
        metrics.register(
            "status_writes_failing",
            "Policies whose status patch failed 3 status passes in a row or more: their violation \
             observations are kept and retried every pass but no longer hold back agents' \
             acknowledgements (a Warning Event StatusWriteFailing names the error)",
            m.status_writes_failing.clone(),
        );
        metrics.register(
            "status_patch_failures",
            "WorkloadNetworkPolicy status patches that failed: conflict (retried at once from a fresh \
             read) or error (retried at the next interval)",
            m.patch_failures.clone(),
        );
    }

    /// Brings the pending-observation gauge and the queue-full drop counter up to date.
    fn count_pending(&self, state: &mut State) {
        let dropped = state.pending.dropped();
        self.metrics.dropped(
            "policy_queue_full",
            dropped.saturating_sub(state.pending_dropped_counted),
        );
        state.pending_dropped_counted = dropped;
        self.metrics
            .pending_observations
            .set(state.pending.len() as i64);
    }
}

fn policy_key(policy: &WorkloadNetworkPolicy) -> PolicyKey {
    PolicyKey {
        namespace: policy.metadata.namespace.clone().unwrap_or_default(),
        name: policy.metadata.name.clone().unwrap_or_default(),
    }
}
#[cfg(test)]
mod tests;
