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
//! pods), plus namespaces and NetworkPolicies from this module's own watches.

use crate::cluster::index::Index;
use crate::cluster::watches::SharedIndex;
use crate::monitor::edge_history::{self, EdgeHistory, GateReport};
use crate::monitor::evaluate::attribution::{self, AllowedNow, PolicyKey, PolicySet, RuleMatch};
use crate::monitor::evaluate::view::{ClusterView, Endpoint, NamedPolicy};
use crate::monitor::otlp::ViolationSink;
use crate::monitor::violations::evidence::{
    Evidence, EvidenceKind, Pending, REPEAT_WINDOW, RepeatFilter, WorkloadNames, observed_flows,
};
use crate::monitor::violations::{self, SyncInput, SyncOutcome};
use crate::policy::protect_gate;
use crate::policy::rule_usage::{self, RuleRef, UsageTracker};
use crate::reconcile::publish_with;
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
use network_enforcer_api::{
    AcknowledgedViolation, Backend, Direction, PolicyMode, RuleUsage, WorkloadNetworkPolicy,
    WorkloadRef,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::de::DeserializeOwned;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// At most this many records wait in the [`EvidenceQueue`] between two passes. Each is an
/// [`Evidence`] of fixed size (its local pod is shared with the index), so this bounds the memory
/// too: about 16 MB. A pass starts at half of it; the other half is what arrives during a pass
/// (at 1,000 agents on two cores, 200,000 records were not always enough).
pub const MAX_QUEUED_RECORDS: usize = 400_000;

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

/// Records waiting for the next evidence pass; bounded, dropping the oldest.
///
/// It also tells ingest when evidence is safe to acknowledge: an agent forgets an acknowledged batch, so
/// a violation found in it must be in a policy's status by then (or the controller's restart would lose
/// it). Drains are numbered; a drain is *settled* once every observation it produced has been patched
/// into a status (at once when it produced none). A batch handed in before drain `n` began is settled
/// once drain `n` is.
#[derive(Debug, Default)]
pub struct EvidenceQueue {
    queued_records: Mutex<Queued>,
    /// Records dropped because the queue was full (`evidence_records_dropped_total`).
    dropped: Counter,
    /// Records queued now (`evidence_queue_records`).
    queued: Gauge,
    /// The newest settled drain.
    settled: watch::Sender<u64>,
    /// Whether a policy existed at the last attribution: without one no record is evidence.
    policies_exist: AtomicBool,
    /// Woken when the queue reaches half its bound: the next pass starts then rather than at its
    /// interval.
    half_full: tokio::sync::Notify,
}

/// The queue's records.
#[derive(Debug, Default)]
struct Queued {
    records: VecDeque<Evidence>,
    /// Drains so far; counted under the lock, so a record is either in drain `n` or handed in after it.
    drains: u64,
}

impl EvidenceQueue {
    /// Resolves once the queue has reached half its bound since the last call (or since the queue
    /// was made, for the first call).
    pub async fn half_full(&self) {
        self.half_full.notified().await;
    }

    /// Takes every queued record.
    pub fn drain(&self) -> Vec<Evidence> {
        self.drain_numbered().0
    }

    /// Takes every queued record; also returns the drain's number.
    fn drain_numbered(&self) -> (Vec<Evidence>, u64) {
        let mut queued = self.queued_records.lock().expect("evidence lock");
        self.queued.set(0);
        queued.drains += 1;
        // The queue's buffer itself: nothing copied, and nothing kept between passes.
        let records = std::mem::take(&mut queued.records).into();
        (records, queued.drains)
    }

    /// Drains so far.
    fn drains(&self) -> u64 {
        self.queued_records.lock().expect("evidence lock").drains
    }

    /// Every observation of drains up to `drain` is in a status.
    fn settle(&self, drain: u64) {
        self.settled.send_if_modified(|settled| {
            let newer = drain > *settled;
            if newer {
                *settled = drain;
            }
            newer
        });
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

impl EvidenceSink for EvidenceQueue {
    fn accepted(&self, evidence: Evidence) {
        let mut queued = self.queued_records.lock().expect("evidence lock");
        if queued.records.len() >= MAX_QUEUED_RECORDS {
            queued.records.pop_front();
            self.dropped.inc();
        }
        queued.records.push_back(evidence);
        self.queued.set(queued.records.len() as i64);
        // Once per fill: a queue stays half full until it is drained.
        if queued.records.len() == MAX_QUEUED_RECORDS / 2 {
            self.half_full.notify_one();
        }
    }

    fn hold(&self) -> Option<u64> {
        // Read after the records were pushed: the next drain takes them, or one already did.
        self.policies_exist
            .load(Ordering::Acquire)
            .then(|| self.drains())
    }

    fn settled_after(&self, mark: u64) -> bool {
        *self.settled.borrow() > mark
    }

    fn settled(&self) -> Option<watch::Receiver<u64>> {
        Some(self.settled.subscribe())
    }
}

/// Settings of the status sync.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace's policies and NetworkPolicies; `None` watches all.
    pub namespace: Option<String>,
    /// How often statuses are synced and patched (`--status-update-interval`).
    pub interval: Duration,
    /// How often queued evidence is attributed (the policy's mode at that moment is the action).
    pub evidence_interval: Duration,
    /// See [`REPEAT_WINDOW`].
    pub repeat_window: Duration,
    /// Whether ipBlocks match pod IPs (see [`ClusterView::set_ip_blocks_match_pods`]); false for Cilium.
    pub ip_blocks_match_pods: bool,
    /// The name Events are reported under.
    pub reporter: String,
    /// The instance reporting Events, usually the pod name.
    pub instance: Option<String>,
    /// Bounds of the edge history behind the protect gate (`--edge-history-*`).
    pub history: edge_history::Bounds,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: None,
            interval: Duration::from_secs(30),
            evidence_interval: Duration::from_secs(1),
            repeat_window: REPEAT_WINDOW,
            ip_blocks_match_pods: true,
            reporter: "network-enforcer-controller".into(),
            instance: None,
            history: edge_history::Bounds::default(),
        }
    }
}

/// Parses a duration as the chart writes it (`30s`, `1m30s`, `500ms`, `1.5h`, `7d`; see
/// [`network_enforcer_api::duration`]). Zero is refused: the sync would spin.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    // Far above any interval that makes sense here.
    const MAX: Duration = Duration::from_secs(366 * 86_400);
    match network_enforcer_api::duration::parse_duration(text, MAX) {
        Ok(d) if d.is_zero() => Err(format!("duration {text:?} must be greater than zero")),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
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

struct Writers {
    policies: Writer<WorkloadNetworkPolicy>,
    network_policies: Writer<NetworkPolicy>,
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
}

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
    /// Status patches that failed, by reason: `conflict` (the copy was older than the object; retried
    /// at once from a fresh read) or `error` (retried next interval).
    pub patch_failures: Family<Reason, Counter>,
}

impl SyncMetrics {
    fn patch_failed(&self, reason: &str) {
        self.patch_failures
            .get_or_create(&Reason {
                reason: reason.into(),
            })
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
    policies: Store<WorkloadNetworkPolicy>,
    network_policies: Store<NetworkPolicy>,
    namespaces: Store<Namespace>,
    writers: Mutex<Option<Writers>>,
    state: Mutex<State>,
    /// Every flow that went through, for the protect gate ([`StatusSync::replay`]).
    history: Mutex<EdgeHistory>,
    /// Strict protect policies the gate holds in monitor: their evidence counts as monitor's.
    held: Mutex<HashSet<PolicyKey>>,
    passes: AtomicU64,
    /// Set once every watch of this sync and the index have listed ([`StatusSync::wait_ready`]):
    /// evidence evaluated before that would meet half-listed policies and pods, and a violation
    /// missed then would be acknowledged to its agent and lost.
    ready: AtomicBool,
    metrics: SyncMetrics,
}

impl StatusSync {
    /// A status sync over `index` (kept current by [`crate::cluster::watches::run`]) reporting to `sink`.
    /// Start it with [`StatusSync::run`] (or [`StatusSync::watches`] plus your own passes).
    pub fn new(
        client: Client,
        index: Arc<SharedIndex>,
        settings: Settings,
        sink: Arc<dyn ViolationSink>,
    ) -> Arc<Self> {
        let (policies, policies_writer) = reflector::store();
        let (network_policies, network_policies_writer) = reflector::store();
        let (namespaces, namespaces_writer) = reflector::store();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: settings.reporter.clone(),
                instance: settings.instance.clone(),
            },
        );
        let queue = EvidenceQueue {
            // Until the first pass has listed the policies, any record may be evidence.
            policies_exist: AtomicBool::new(true),
            ..EvidenceQueue::default()
        };
        let metrics = SyncMetrics {
            evidence_dropped: queue.dropped.clone(),
            evidence_queued: queue.queued.clone(),
            ..SyncMetrics::default()
        };
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
            }),
            history: Mutex::new(EdgeHistory::new(settings.history)),
            held: Mutex::default(),
            settings,
            policies,
            network_policies,
            namespaces,
            writers: Mutex::new(Some(Writers {
                policies: policies_writer,
                network_policies: network_policies_writer,
                namespaces: namespaces_writer,
            })),
            passes: AtomicU64::new(0),
            ready: AtomicBool::new(false),
        })
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

    /// Runs the watches and the passes until the process stops.
    pub async fn run(self: Arc<Self>) {
        tokio::join!(self.clone().watches(), self.passes_forever());
    }

    /// Runs the watches this sync needs besides the index: WorkloadNetworkPolicies and
    /// NetworkPolicies in scope, namespaces cluster-wide. Only the first call watches.
    pub async fn watches(self: Arc<Self>) {
        let Some(writers) = self.writers.lock().expect("writers lock").take() else {
            return;
        };
        let scoped = |client: &Client| match &self.settings.namespace {
            Some(ns) => (
                Api::<WorkloadNetworkPolicy>::namespaced(client.clone(), ns),
                Api::<NetworkPolicy>::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
        let (policies, network_policies) = scoped(&self.client);
        tokio::join!(
            reflect(policies, writers.policies),
            reflect(network_policies, writers.network_policies),
            reflect(
                Api::<Namespace>::all(self.client.clone()),
                writers.namespaces
            ),
        );
    }

    /// Waits until every watch of this sync and the index have listed once; evidence is attributed
    /// from then on ([`StatusSync::attribute_evidence`]).
    pub async fn wait_ready(&self) {
        let _ = self.policies.wait_until_ready().await;
        let _ = self.network_policies.wait_until_ready().await;
        let _ = self.namespaces.wait_until_ready().await;
        while !self.index.ready() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.ready.store(true, Ordering::Release);
    }

    /// Whether [`StatusSync::wait_ready`] has returned.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Attributes evidence every `evidence_interval` and whenever the queue is half full, and syncs
    /// statuses every `interval`.
    pub async fn passes_forever(self: Arc<Self>) {
        self.wait_ready().await;
        tracing::info!(interval = ?self.settings.interval, "status sync started");
        let mut evidence = tokio::time::interval(self.settings.evidence_interval);
        let mut status = tokio::time::interval(self.settings.interval);
        for tick in [&mut evidence, &mut status] {
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = evidence.tick() => {
                    self.attribute_evidence_off_runtime().await;
                }
                _ = self.queue.half_full() => {
                    self.attribute_evidence_off_runtime().await;
                    // The regular pass comes an interval after this one.
                    evidence.reset();
                }
                _ = status.tick() => {
                    self.attribute_evidence_off_runtime().await;
                    let report = self.sync_all().await;
                    if report.patched > 0 || report.failed > 0 {
                        tracing::info!(?report, "synced policy statuses");
                    }
                }
            }
        }
    }

    /// [`StatusSync::attribute_evidence`] on the blocking pool: a pass over a full queue is CPU work
    /// that would hold up one of the runtime's workers (and the streams and writes it runs).
    async fn attribute_evidence_off_runtime(self: &Arc<Self>) {
        let sync = self.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || sync.attribute_evidence()).await {
            tracing::error!(%error, "an evidence pass failed");
        }
    }

    /// Completed [`StatusSync::sync_all`] passes.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Acquire)
    }

    /// Observations waiting for policy `namespace/name`.
    pub fn pending(&self, namespace: &str, name: &str) -> usize {
        self.state
            .lock()
            .expect("state lock")
            .pending
            .len_of(&PolicyKey {
                namespace: namespace.into(),
                name: name.into(),
            })
    }

    /// The evaluator's view now (what [`StatusSync::sync_policy`] evaluates against).
    pub fn current_view(&self) -> ClusterView {
        let index = self.index.index.read().expect("index lock");
        self.view(&index)
    }

    /// The evaluator's view now: the index's pods, the watched namespaces and NetworkPolicies.
    fn view(&self, index: &Index) -> ClusterView {
        let namespaces = self.namespaces.state();
        let network_policies = self.network_policies.state();
        let mut view = ClusterView::from_index(
            index,
            namespaces
                .iter()
                .map(|ns| (ns.name_any(), ns.labels().clone())),
            network_policies
                .iter()
                .filter_map(|np| NamedPolicy::from_network_policy(np)),
        );
        view.set_ip_blocks_match_pods(self.settings.ip_blocks_match_pods);
        view
    }

    /// Attributes the queued records to the policies in force; returns how many observations were
    /// queued for a status patch. Before [`StatusSync::wait_ready`] has returned it does nothing: the
    /// records stay queued (and unacknowledged) until the policies and pods they are judged against
    /// have been listed.
    pub fn attribute_evidence(&self) -> usize {
        if !self.is_ready() {
            return 0;
        }
        let (records, drain) = self.queue.drain_numbered();
        let policies = self.policies.state();
        // A strict protect policy the gate holds renders nothing yet: what it sees counts as monitor's.
        let held = self.held.lock().expect("held lock").clone();
        let as_monitor: Vec<WorkloadNetworkPolicy> = policies
            .iter()
            .filter(|p| held.contains(&policy_key(p)))
            .map(|p| {
                let mut p = p.as_ref().clone();
                p.spec.mode = PolicyMode::Monitor;
                p
            })
            .collect();
        let set = PolicySet::new(
            policies
                .iter()
                .filter(|p| !held.contains(&policy_key(p)))
                .map(|p| p.as_ref())
                .chain(&as_monitor),
        );
        self.queue
            .policies_exist
            .store(!set.is_empty(), Ordering::Release);
        self.metrics.policies_evaluated.set(policies.len() as i64);
        if records.is_empty() {
            self.settle_if_written(drain);
            return 0;
        }
        let backends: HashMap<PolicyKey, Backend> = policies
            .iter()
            .map(|p| (policy_key(p), p.spec.backend))
            .collect();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let index = self.index.index.read().expect("index lock");
        let view = self.view(&index);
        let mut state = self.state.lock().expect("state lock");
        let mut history = self.history.lock().expect("history lock");
        let mut queued = 0;
        let mut matches: Vec<RuleMatch> = Vec::new();
        // Each policy's rules with their fingerprints, computed once per pass for the policies used.
        let mut rules: HashMap<PolicyKey, Vec<RuleRef>> = HashMap::new();
        let mut names = std::mem::take(&mut state.names);
        for Evidence { kind, record } in &records {
            let kind = *kind;
            let flows = match observed_flows(&index, &view, &mut names, record, &now) {
                Ok(flows) => flows,
                Err(unresolved) => {
                    self.metrics.evidence_unresolved.inc();
                    tracing::debug!(%unresolved, "evidence not resolvable");
                    continue;
                }
            };
            for flow in flows {
                if kind != EvidenceKind::Blocked {
                    let to_api_server = match flow.destination.endpoint {
                        Endpoint::Ip(ip) => index.is_api_server(ip, flow.port),
                        Endpoint::Pod(_) => false,
                    };
                    history.record(&flow, to_api_server);
                }
                if set.is_empty() {
                    continue;
                }
                matches.clear();
                let attributed =
                    match attribution::attribute_with_usage(&view, &set, &flow, Some(&mut matches))
                    {
                        Ok(attributed) => attributed,
                        Err(error) => {
                            tracing::debug!(%error, "evidence not evaluable");
                            continue;
                        }
                    };
                for used in &matches {
                    let rules = rules.entry(used.policy.clone()).or_insert_with(|| {
                        policies
                            .iter()
                            .find(|p| policy_key(p) == used.policy)
                            .map(|p| rule_usage::rules_of(&p.spec))
                            .unwrap_or_default()
                    });
                    let peer = peer_of(&flow, used.direction);
                    let at = flow.seen_at.0.as_millisecond();
                    for rule in used.rules.iter().filter_map(|&i| rules.get(i)) {
                        state.usage.record(&used.policy, rule, &peer, at);
                    }
                }
                let at = flow.seen_at.0.as_millisecond();
                for a in attributed {
                    if !kind.counts_for(a.action()) || !state.repeats.admit_key(a.repeat_key(), at)
                    {
                        continue;
                    }
                    let (policy, observation) = (a.key(), a.observation());
                    let backend = backends
                        .get(&policy)
                        .copied()
                        .unwrap_or(Backend::Kubernetes);
                    self.sink.observed(backend, &observation);
                    tracing::debug!(?policy, ?observation, "violation observed");
                    state.pending.push(policy, observation);
                    queued += 1;
                }
            }
        }
        state.repeats.forget_before(now.0.as_millisecond());
        history.forget_expired(now.0.as_millisecond());
        names.end_pass(|name| history.interned(name));
        state.names = names;
        self.metrics.history_edges.set(history.len() as i64);
        let evicted = history.evicted();
        self.metrics
            .history_evicted
            .inc_by(evicted.saturating_sub(self.metrics.history_evicted.get()));
        drop(history);
        self.count_pending(&mut state);
        drop(state);
        self.settle_if_written(drain);
        queued
    }

    /// Replays the edge history against `policy` (the protect gate, [`EdgeHistory::replay`]) with the
    /// cluster as it is now. Evidence queued before this call is attributed first, so the replay sees
    /// every flow ingest accepted. `None` before [`StatusSync::wait_ready`] has returned: the history
    /// is not complete yet (the gate says so and checks again later).
    pub fn replay(&self, policy: &WorkloadNetworkPolicy) -> Option<GateReport> {
        if !self.is_ready() {
            return None;
        }
        self.attribute_evidence();
        let view = self.current_view();
        Some(
            self.history
                .lock()
                .expect("history lock")
                .replay(&view, policy),
        )
    }

    /// Notes whether the gate holds `policy` in monitor (its evidence then counts as monitor's).
    pub fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool) {
        let mut set = self.held.lock().expect("held lock");
        if held {
            set.insert(policy_key(policy));
        } else {
            set.remove(&policy_key(policy));
        }
    }

    /// Edges the protect gate's history holds now.
    pub fn history_len(&self) -> usize {
        self.history.lock().expect("history lock").len()
    }

    /// Marks drains up to `drain` settled when no observation waits for a patch.
    fn settle_if_written(&self, drain: u64) {
        if self.state.lock().expect("state lock").pending.is_empty() {
            self.queue.settle(drain);
        }
    }

    /// Syncs every policy's status once (see the module docs).
    pub async fn sync_all(&self) -> PassReport {
        // Everything drained so far is pending or written; what this pass writes settles it.
        let drained = self.queue.drains();
        let policies = self.policies.state();
        let keys: HashSet<PolicyKey> = policies.iter().map(|p| policy_key(p)).collect();
        let gone = {
            let mut state = self.state.lock().expect("state lock");
            let gone = state.pending.retain_policies(|k| keys.contains(k));
            state.usage.retain_policies(|k| keys.contains(k));
            self.metrics.dropped("policy_deleted", gone as u64);
            self.count_pending(&mut state);
            gone
        };
        if gone > 0 {
            tracing::info!(
                observations = gone,
                "dropped observations of deleted policies"
            );
        }
        let view = self.current_view();
        let mut report = PassReport::default();
        for policy in policies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            report.policies += 1;
            match self.sync_policy_or_reread(policy, &view).await {
                Ok(done) => {
                    report.patched += usize::from(done.patched);
                    report.observations += done.observations;
                    report.acknowledged += done.acknowledged;
                }
                Err(error) => {
                    report.failed += 1;
                    tracing::warn!(
                        namespace = ?policy.namespace(), name = %policy.name_any(), %error,
                        "status sync failed; pending observations are kept and retried"
                    );
                }
            }
        }
        self.settle_if_written(drained);
        self.passes.fetch_add(1, Ordering::AcqRel);
        report
    }

    /// [`StatusSync::sync_policy`], retried once from a copy read now when the patch conflicts: the
    /// watch had not yet delivered another writer's change (usually the policy reconciler's
    /// conditions, written right after a promotion), and waiting an interval for it could meet the
    /// next change again.
    pub async fn sync_policy_or_reread(
        &self,
        policy: &WorkloadNetworkPolicy,
        view: &ClusterView,
    ) -> Result<PolicySync, SyncError> {
        let error = match self.sync_policy(policy, view).await {
            Err(SyncError::Patch(kube::Error::Api(e))) if e.code == 409 => e,
            Err(error) => {
                if matches!(error, SyncError::Patch(_)) {
                    self.metrics.patch_failed("error");
                }
                return Err(error);
            }
            done => return done,
        };
        self.metrics.patch_failed("conflict");
        tracing::debug!(
            namespace = ?policy.namespace(), name = %policy.name_any(), error = %error.message,
            "status patch conflicted; retrying from a fresh read"
        );
        let (Some(namespace), Some(name)) = (
            policy.metadata.namespace.as_deref(),
            policy.metadata.name.as_deref(),
        ) else {
            return Err(SyncError::Unnamed);
        };
        let fresh = Api::<WorkloadNetworkPolicy>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(SyncError::Reread)?;
        let retried = self.sync_policy(&fresh, view).await;
        if let Err(SyncError::Patch(e)) = &retried {
            let reason = match e {
                kube::Error::Api(e) if e.code == 409 => "conflict",
                _ => "error",
            };
            self.metrics.patch_failed(reason);
        }
        retried
    }

    /// Syncs one policy's status from `policy` (its status, annotations and `resourceVersion`):
    /// patches it if it changed, then removes consumed annotations and reports acknowledgements.
    /// A patch against a stale `policy` fails with a conflict and keeps the observations pending.
    pub async fn sync_policy(
        &self,
        policy: &WorkloadNetworkPolicy,
        view: &ClusterView,
    ) -> Result<PolicySync, SyncError> {
        let (Some(namespace), Some(name)) = (
            policy.metadata.namespace.as_deref(),
            policy.metadata.name.as_deref(),
        ) else {
            return Err(SyncError::Unnamed);
        };
        let key = policy_key(policy);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let current_usage = policy
            .status
            .as_ref()
            .map(|s| s.rule_usage.as_slice())
            .unwrap_or_default();
        let (observations, read, usage) = {
            let state = self.state.lock().expect("state lock");
            let (observations, read) = state.pending.read(&key);
            let usage = rule_usage::merge(
                current_usage,
                &rule_usage::rules_of(&policy.spec),
                state.usage.of(&key),
                &now,
            );
            (observations, read, usage)
        };
        let usage_changed = usage.as_slice() != current_usage;
        let allowed_now = AllowedNow::new(view, policy);
        let outcome = violations::sync(
            SyncInput {
                status: policy.status.as_ref(),
                generation: policy.metadata.generation,
                annotations: policy.metadata.annotations.as_ref(),
                observations: &observations,
                now: &now,
            },
            |record| allowed_now.record(record),
        );
        let api = Api::<WorkloadNetworkPolicy>::namespaced(self.client.clone(), namespace);
        let patched = outcome.status_changed || usage_changed;
        if patched {
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(status_patch(policy, &outcome, &usage)),
            )
            .await
            .map_err(SyncError::Patch)?;
        }
        {
            let mut state = self.state.lock().expect("state lock");
            state.pending.commit(&key, read);
            self.count_pending(&mut state);
        }
        let regarding = policy.object_ref(&());
        for acknowledged in &outcome.acknowledged {
            self.sink.acknowledged(acknowledged);
            publish_with(
                &self.recorder,
                &regarding,
                EventType::Normal,
                "ViolationAcknowledged",
                "Acknowledge",
                acknowledged_note(acknowledged),
            )
            .await;
        }
        let mut done = PolicySync {
            patched,
            observations: observations.len(),
            acknowledged: outcome.acknowledged.len(),
            annotations_removed: 0,
        };
        if outcome.remove_annotations.is_empty() {
            return Ok(done);
        }
        let annotations: serde_json::Map<String, serde_json::Value> = outcome
            .remove_annotations
            .iter()
            .map(|k| (k.clone(), serde_json::Value::Null))
            .collect();
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                done.annotations_removed = annotations.len();
                for unknown in &outcome.unknown {
                    publish_with(
                        &self.recorder,
                        &regarding,
                        EventType::Warning,
                        "UnknownViolationAcknowledgement",
                        "Acknowledge",
                        format!(
                            "annotation {} removed: {}",
                            unknown.annotation, unknown.problem
                        ),
                    )
                    .await;
                }
            }
            // The status is recorded; the annotations are removed at the next interval (an already
            // acknowledged id is then removed silently, an unknown one with its Event).
            Err(error) => tracing::warn!(
                namespace, name, %error, "could not remove acknowledge annotations; retrying next interval"
            ),
        }
        Ok(done)
    }
}

impl crate::ui::EdgeSource for StatusSync {
    fn edges_in(&self, namespace: &str, limit: usize) -> (Vec<edge_history::HistoryEdge>, bool) {
        self.history
            .lock()
            .expect("history lock")
            .edges_in(namespace, limit)
    }
}

impl protect_gate::History for StatusSync {
    fn replay(&self, policy: &WorkloadNetworkPolicy) -> Option<GateReport> {
        StatusSync::replay(self, policy)
    }

    fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool) {
        StatusSync::hold(self, policy, held)
    }
}

fn policy_key(policy: &WorkloadNetworkPolicy) -> PolicyKey {
    PolicyKey {
        namespace: policy.metadata.namespace.clone().unwrap_or_default(),
        name: policy.metadata.name.clone().unwrap_or_default(),
    }
}

/// The merge patch of the violation fields and `ruleUsage` of the status (not `conditions`, which the
/// policy reconciler owns), with the copy's `resourceVersion` as precondition. Empty lists are sent
/// as `[]` so that a merge patch clears them.
fn status_patch(
    policy: &WorkloadNetworkPolicy,
    outcome: &SyncOutcome,
    usage: &[RuleUsage],
) -> serde_json::Value {
    let status = &outcome.status;
    let mut patch = serde_json::json!({
        "status": {
            "observedGeneration": status.observed_generation,
            "violationCount": status.violation_count,
            "activeViolationCount": status.active_violation_count,
            "violations": status.violations,
            "acknowledgedViolations": status.acknowledged_violations,
            "ruleUsage": usage,
        }
    });
    if let Some(version) = policy.resource_version() {
        patch["metadata"] = serde_json::json!({"resourceVersion": version});
    }
    patch
}

/// The far end of `flow` for a policy of `direction`, as one string per distinct peer: the workload,
/// else the address, else the identity.
fn peer_of(flow: &attribution::ObservedFlow, direction: Direction) -> String {
    let w: &WorkloadRef = match direction {
        Direction::Ingress => &flow.source.workload,
        Direction::Egress => &flow.destination.workload,
    };
    if !w.owner_name.is_empty() {
        format!("{}/{}/{}", w.namespace, w.owner_kind, w.owner_name)
    } else if !w.address.is_empty() {
        w.address.clone()
    } else {
        w.identity.clone()
    }
}

fn acknowledged_note(a: &AcknowledgedViolation) -> String {
    let v = &a.violation;
    let side = |w: &network_enforcer_api::WorkloadRef| {
        if w.owner_name.is_empty() {
            w.address.clone()
        } else {
            format!("{}/{}", w.namespace, w.owner_name)
        }
    };
    format!(
        "violation {} ({:?} {} -> {}:{}) acknowledged: {}",
        v.id,
        v.protocol,
        side(&v.source),
        side(&v.dest),
        v.dst_port.map_or_else(|| "?".into(), |p| p.to_string()),
        a.reason
    )
}

async fn reflect<K>(api: Api<K>, writer: Writer<K>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(kind = %K::kind(&()), %error, "watch failed; retrying with backoff");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_the_chart_writes_them() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["", "30", "s", "30x", "1m30", "0s", "-1s", "1..5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Evidence of a connection from a pod the tests' index does not hold, told apart by `at_ms`.
    fn evidence(at_ms: i64) -> Evidence {
        Evidence {
            kind: EvidenceKind::WentThrough,
            record: crate::ingest::flow_record::Decoded {
                local: Arc::default(),
                peer: std::net::IpAddr::from([192, 0, 2, 1]),
                peer_from: crate::ingest::flow_record::PeerFrom::Address,
                port: 443,
                protocol: network_enforcer_api::Protocol::TCP,
                opened: crate::learn::Opened::Outbound,
                at_ms,
            },
        }
    }

    #[test]
    fn the_evidence_queue_never_blocks_and_drops_the_oldest() {
        let queue = EvidenceQueue::default();
        for at in 0..(MAX_QUEUED_RECORDS as i64 + 2) {
            queue.accepted(evidence(at));
        }
        assert_eq!(queue.dropped(), 2);
        let records = queue.drain();
        assert_eq!(records.len(), MAX_QUEUED_RECORDS);
        assert_eq!(records[0].record.at_ms, 2);
        assert!(queue.drain().is_empty());
    }

    /// The queue's bound in records is a bound in memory: an entry holds no string of the agent's
    /// (a local pod is shared with the index), so a full queue is about 16 MB whatever the records
    /// carried.
    #[test]
    fn a_queued_record_is_small_and_holds_no_strings_of_its_own() {
        assert!(
            std::mem::size_of::<Evidence>() <= 48,
            "{} bytes",
            std::mem::size_of::<Evidence>()
        );
        let pod = Arc::new(crate::cluster::index::PodRecord {
            namespace: "n".repeat(1024 * 1024),
            ..Default::default()
        });
        let queue = EvidenceQueue::default();
        for at in 0..1_000 {
            let mut e = evidence(at);
            e.record.local = pod.clone();
            queue.accepted(e);
        }
        assert_eq!(Arc::strong_count(&pod), 1_001, "one pod, shared");
        queue.drain();
        assert_eq!(Arc::strong_count(&pod), 1, "released by the drain");
    }

    fn observation(port: i32) -> crate::monitor::violations::Observation {
        crate::monitor::violations::Observation {
            timestamp: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            source: network_enforcer_api::WorkloadRef::default(),
            dest: network_enforcer_api::WorkloadRef::default(),
            protocol: network_enforcer_api::Protocol::TCP,
            dst_port: Some(port),
            action: network_enforcer_api::PolicyMode::Protect,
            direction: network_enforcer_api::Direction::Ingress,
            denying_policy_namespace: "shop".into(),
            denying_policy_name: "web".into(),
        }
    }

    /// The line of `name` (with labels) in the metrics text, as a number.
    fn metric(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// A status sync whose API server is never reached.
    fn offline_sync() -> Arc<StatusSync> {
        StatusSync::new(
            network_enforcer_tests::fixture::offline_client(),
            Arc::new(SharedIndex::default()),
            Settings::default(),
            Arc::new(crate::monitor::otlp::Disabled),
        )
    }

    #[tokio::test]
    async fn a_half_full_queue_calls_for_a_pass_once_per_fill() {
        use futures::FutureExt;
        let queue = EvidenceQueue::default();
        for fill in 0..2 {
            for at in 0..(MAX_QUEUED_RECORDS / 2 - 1) as i64 {
                queue.accepted(evidence(at));
            }
            assert!(queue.half_full().now_or_never().is_none(), "fill {fill}");
            queue.accepted(evidence(0));
            assert!(queue.half_full().now_or_never().is_some(), "fill {fill}");
            queue.accepted(evidence(0));
            assert!(
                queue.half_full().now_or_never().is_none(),
                "fill {fill}: once until the next drain"
            );
            queue.drain();
        }
    }

    #[tokio::test]
    async fn dropped_evidence_and_pending_observations_are_metrics() {
        let sync = offline_sync();
        let registry = ControllerMetrics::new();
        sync.register_metrics(&registry);
        let evidence = sync.evidence();
        for at in 0..(MAX_QUEUED_RECORDS as i64 + 3) {
            evidence.accepted(self::evidence(at));
        }
        let text = registry.encode();
        let p = "network_enforcer_controller_";
        assert_eq!(
            metric(&text, &format!("{p}evidence_records_dropped_total")),
            Some(3.0)
        );
        assert_eq!(
            metric(&text, &format!("{p}evidence_queue_records")),
            Some(MAX_QUEUED_RECORDS as f64)
        );
        assert_eq!(sync.queue.drain().len(), MAX_QUEUED_RECORDS);
        assert_eq!(
            metric(&registry.encode(), &format!("{p}evidence_queue_records")),
            Some(0.0)
        );

        // One policy's queue overflows by 2, then the policy is gone (no policy is in the store).
        {
            let mut state = sync.state.lock().unwrap();
            let key = PolicyKey {
                namespace: "shop".into(),
                name: "web".into(),
            };
            for port in 0..(crate::monitor::violations::evidence::MAX_PENDING_PER_POLICY as i32 + 2)
            {
                state.pending.push(key.clone(), observation(port));
            }
            sync.count_pending(&mut state);
        }
        let text = registry.encode();
        let max = crate::monitor::violations::evidence::MAX_PENDING_PER_POLICY as f64;
        assert_eq!(
            metric(&text, &format!("{p}pending_violation_observations")),
            Some(max)
        );
        let dropped = |text: &str, reason: &str| {
            metric(
                text,
                &format!("{p}violation_observations_dropped_total{{reason=\"{reason}\"}}"),
            )
        };
        assert_eq!(dropped(&text, "policy_queue_full"), Some(2.0));
        let report = sync.sync_all().await;
        assert_eq!(report.policies, 0);
        let text = registry.encode();
        assert_eq!(dropped(&text, "policy_deleted"), Some(max));
        assert_eq!(
            dropped(&text, "policy_queue_full"),
            Some(2.0),
            "counted once"
        );
        assert_eq!(
            metric(&text, &format!("{p}pending_violation_observations")),
            Some(0.0)
        );
    }

    /// An offline sync whose watches have listed an empty cluster, as [`StatusSync::watches`] would;
    /// returns the stores' writers to add objects by hand.
    async fn listed_offline_sync() -> (Arc<StatusSync>, Writers) {
        let sync = StatusSync::new(
            network_enforcer_tests::fixture::offline_client(),
            Arc::new(SharedIndex::listed(crate::cluster::index::Index::default())),
            Settings::default(),
            Arc::new(crate::monitor::otlp::Disabled),
        );
        let mut writers = sync.writers.lock().unwrap().take().unwrap();
        writers
            .policies
            .apply_watcher_event(&watcher::Event::InitDone);
        writers
            .network_policies
            .apply_watcher_event(&watcher::Event::InitDone);
        writers
            .namespaces
            .apply_watcher_event(&watcher::Event::InitDone);
        sync.wait_ready().await;
        (sync, writers)
    }

    /// An ingress policy of Deployment `shop/web` that isolates every pod of `shop`, in `mode`.
    fn web_ingress(mode: &str) -> WorkloadNetworkPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": mode,
                     "targetRef": {"kind": "Deployment", "name": "web"},
                     "kubernetes": {"podSelector": {}, "policyTypes": ["Ingress"]}}
        }))
        .unwrap()
    }

    /// Evidence handed in before the policies, NetworkPolicies and namespaces are listed is kept
    /// (and held from acknowledgement) rather than judged against half-listed stores, by the passes
    /// and by the protect gate's replay alike.
    #[tokio::test]
    async fn no_evidence_is_judged_before_the_watches_have_listed() {
        let sync = offline_sync();
        let evidence = sync.evidence();
        evidence.accepted(self::evidence(0));
        let mark = evidence
            .hold()
            .expect("before the policies are listed, any record may be evidence");
        let policy = web_ingress("protect");
        assert!(sync.replay(&policy).is_none(), "no history before listing");
        assert_eq!(sync.attribute_evidence(), 0);
        assert_eq!(sync.metrics().evidence_queued.get(), 1, "still queued");
        assert!(!evidence.settled_after(mark), "not acknowledged");
        assert_eq!(sync.queue.drain().len(), 1);
    }

    #[tokio::test]
    async fn evidence_is_settled_only_once_its_violations_are_written() {
        let (sync, mut writers) = listed_offline_sync().await;
        let evidence = sync.evidence();
        let record = self::evidence(0);
        // No policy known: nothing is evidence, nothing to wait for.
        sync.attribute_evidence();
        evidence.accepted(record.clone());
        assert_eq!(evidence.hold(), None);
        sync.attribute_evidence();

        // A policy appears.
        let policy = web_ingress("monitor");
        writers
            .policies
            .apply_watcher_event(&watcher::Event::Apply(policy.clone()));
        sync.attribute_evidence();

        // Handed in: waits for the next drain to settle.
        evidence.accepted(record.clone());
        let mark = evidence.hold().expect("a policy exists: evidence waits");
        assert!(!evidence.settled_after(mark));
        // That drain finds a violation (here put in by hand: the record resolves to no pod), so it
        // is not settled while the violation waits for its status patch...
        {
            let mut state = sync.state.lock().unwrap();
            state.pending.push(policy_key(&policy), observation(18080));
        }
        sync.attribute_evidence();
        assert!(
            !evidence.settled_after(mark),
            "the violation is not written yet"
        );
        // ...and is once the patch has recorded it.
        {
            let mut state = sync.state.lock().unwrap();
            let key = policy_key(&policy);
            let read = state.pending.read(&key).1;
            state.pending.commit(&key, read);
        }
        sync.attribute_evidence();
        assert!(evidence.settled_after(mark));
        // Something handed in later waits for a later drain.
        evidence.accepted(record.clone());
        let later = evidence.hold().unwrap();
        assert!(!evidence.settled_after(later));
        sync.attribute_evidence();
        assert!(evidence.settled_after(later));
    }
}
