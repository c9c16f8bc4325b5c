//! Prometheus metrics of the controller, served on `/metrics` by [`crate::runtime::http`].
//!
//! One [`ControllerMetrics`] per process, cloned into whatever counts (the clones share the same atomics).
//! [`crate::app::AppBuilder::metrics`] hands one to the learner, the writer and the status sync, and
//! the gRPC service counts through the learner ([`crate::learn::learner::Learner::metrics`]): all count
//! into one registry. Every name carries the `network_enforcer_controller` prefix:
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `records_received_total` | | flow records received in batches (accepted or rejected) |
//! | `records_rejected_total` | `reason` | records refused (malformed, or for a pod not on the agent's node) |
//! | `batches_refused_total` | `reason` | batches that ended their stream (wrong node, rate, size, not leader) |
//! | `resolutions_total` | `outcome` | what accepted records resolved to (peer kind, or why nothing) |
//! | `proposal_writes_total` | `result` | per-proposal flush results (created, updated, unchanged, ...) |
//! | `proposal_write_duration_seconds` | | time to write one proposal (reads, write, status) |
//! | `pending_proposals` / `pending_edges` | | the write queue: proposals and edges waiting for a flush |
//! | `token_reviews_total` | `result` | agent authentication results |
//! | `agent_streams` | | agent streams currently open |
//! | `agent_streams_closed_total` | `reason` | streams the controller closed: replaced, expired, pod_deleted |
//! | `acks_waiting` | | batch acknowledgements held until the flush that writes their edges |
//! | `batch_repeats_total` | | resent batches recognised: learned from, their evidence not counted again |
//! | `evidence_claims_dropped_total` | | claims of counted batches forgotten to stay in bounds (a resend of one counts again) |
//! | `waits_total` / `waiting` | `waiter`, `outcome` | what waits for the index: records for their pod, observations and evidence for their peer ([`crate::ingest::waiting`]) |
//! | `leader` | | 1 while this replica holds the leader Lease |
//! | `reconcile_runs_total` / `reconcile_failures_total` / `reconcile_duration_seconds` | `controller` | each reconciler's runs, failures and time |
//!
//! Other modules register their own metrics with [`ControllerMetrics::register`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use std::sync::{Arc, Mutex};

/// A label set with one label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

/// A label set with one `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

/// What a learned flow's peer resolved to: an `outcome` of `resolutions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    Workload = 0,
    HostNetwork = 1,
    Node = 2,
    External = 3,
}

impl PeerKind {
    /// Every kind, in discriminant order.
    pub const ALL: [PeerKind; 4] = [
        PeerKind::Workload,
        PeerKind::HostNetwork,
        PeerKind::Node,
        PeerKind::External,
    ];

    /// The `outcome` label value.
    pub fn label(self) -> &'static str {
        match self {
            PeerKind::Workload => "workload",
            PeerKind::HostNetwork => "host_network",
            PeerKind::Node => "node",
            PeerKind::External => "external",
        }
    }
}

/// A label set with one `result` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// The reconcilers, as the `controller` label of the reconcile metrics.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub enum Reconciler {
    #[allow(non_camel_case_types)]
    policy,
    #[allow(non_camel_case_types)]
    proposal,
}

/// A label set with one `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcilerLabel {
    pub controller: Reconciler,
}

/// Runs, failures and durations of the reconcilers (`reconcile_runs_total`,
/// `reconcile_failures_total`, `reconcile_duration_seconds`, by `controller`). Cheap to clone; counts
/// nowhere visible until [`ReconcileMetrics::register`]ed.
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    runs: Family<ReconcilerLabel, Counter>,
    failures: Family<ReconcilerLabel, Counter>,
    duration: Family<ReconcilerLabel, Histogram, fn() -> Histogram>,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        fn buckets() -> Histogram {
            // 1 ms .. ~16 s.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 15,
            ))
        }
        Self {
            runs: Family::default(),
            failures: Family::default(),
            duration: Family::new_with_constructor(buckets as fn() -> Histogram),
        }
    }
}

impl ReconcileMetrics {
    /// Registers these on the process's registry.
    pub fn register(&self, metrics: &ControllerMetrics) {
        metrics.register(
            "reconcile_runs",
            "Reconciles run, by controller",
            self.runs.clone(),
        );
        metrics.register(
            "reconcile_failures",
            "Reconciles that failed (retried after a backoff), by controller",
            self.failures.clone(),
        );
        metrics.register(
            "reconcile_duration_seconds",
            "Time one reconcile took, by controller",
            self.duration.clone(),
        );
    }

    /// Reconciles of `controller` run so far.
    pub fn runs(&self, controller: Reconciler) -> u64 {
        self.runs
            .get_or_create(&ReconcilerLabel { controller })
            .get()
    }

    /// Counts one reconcile of `controller` that took `seconds`.
    pub fn observe(&self, controller: Reconciler, seconds: f64, failed: bool) {
        let label = ReconcilerLabel { controller };
        self.runs.get_or_create(&label).inc();
        if failed {
            self.failures.get_or_create(&label).inc();
        }
        self.duration.get_or_create(&label).observe(seconds);
    }
}

/// What waits for the index, as the `waiter` label ([`crate::ingest::waiting::Waiter`]).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum Waiter {
    /// A record waiting for its local pod.
    record,
    /// An observation waiting for its peer.
    observation,
    /// Evidence of a blocked connection waiting for its peer.
    evidence,
}

/// What became of something that waits for the index, as the `outcome` label.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum WaitOutcome {
    /// It started waiting.
    waits,
    /// It repeats an observation that waits already, and waits in its place.
    repeat,
    /// The index placed what it waited for.
    placed,
    /// Its grace ran out.
    expired,
    /// The queue (or its node's share) was full: decided at once.
    full,
}

/// A label set of `waits_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    pub waiter: Waiter,
    pub outcome: WaitOutcome,
}

/// A label set of the `waiting` gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaiterLabel {
    pub waiter: Waiter,
}

/// What waits for the index (`waits_total{waiter, outcome}`, the gauge `waiting{waiter}`). Cheap to
/// clone; counts nowhere visible until registered ([`ControllerMetrics::waits`] is).
#[derive(Clone, Debug, Default)]
pub struct WaitMetrics {
    waits: Family<WaitLabels, Counter>,
    waiting: Family<WaiterLabel, Gauge>,
}

impl WaitMetrics {
    /// Counts `n` of `waiter` with `outcome`.
    pub fn count(&self, waiter: Waiter, outcome: WaitOutcome, n: u64) {
        self.waits
            .get_or_create(&WaitLabels { waiter, outcome })
            .inc_by(n);
    }

    /// How many of `waiter` wait now.
    pub fn waiting(&self, waiter: Waiter) -> Gauge {
        self.waiting.get_or_create(&WaiterLabel { waiter }).clone()
    }

    /// How many of `waiter` had `outcome` so far.
    pub fn get(&self, waiter: Waiter, outcome: WaitOutcome) -> u64 {
        self.waits
            .get_or_create(&WaitLabels { waiter, outcome })
            .get()
    }
}

/// The controller's metrics. Cheap to clone.
#[derive(Clone)]
pub struct ControllerMetrics {
    registry: Arc<Mutex<Registry>>,
    pub records_received: Counter,
    /// Flushes of the proposal writer (each writes every proposal with pending edges).
    pub flushes: Counter,
    records_rejected: Family<Reason, Counter>,
    batches_refused: Family<Reason, Counter>,
    resolutions: Family<Outcome, Counter>,
    /// The `resolutions` series of every [`PeerKind`], looked up once: one of them is counted for
    /// every learned flow, and a lookup by label allocates and hashes its text.
    peer_kinds: [Counter; PeerKind::ALL.len()],
    proposal_writes: Family<ResultLabel, Counter>,
    /// Seconds per proposal write.
    pub write_duration: Histogram,
    pub pending_proposals: Gauge,
    pub pending_edges: Gauge,
    token_reviews: Family<ResultLabel, Counter>,
    pub agent_streams: Gauge,
    streams_closed: Family<Reason, Counter>,
    /// Batch acknowledgements held until a flush has written what the batch taught.
    pub acks_waiting: Gauge,
    /// What waits for the index ([`crate::ingest::waiting`]).
    pub waits: WaitMetrics,
    pub leader: Gauge,
    /// Resent batches whose evidence was counted already ([`crate::ingest::claims`]).
    pub batch_repeats: Counter,
    /// Claims of counted batches forgotten to stay within their bounds.
    pub evidence_claims_dropped: Counter,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    /// Registers every metric under the `network_enforcer_controller` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("network_enforcer_controller");
        let flushes = Counter::default();
        registry.register(
            "proposal_flushes",
            "Flushes of the learned edges into proposals (every --flush-interval-seconds, and soon after a new edge)",
            flushes.clone(),
        );
        let records_received = Counter::default();
        registry.register(
            "records_received",
            "Flow records in batches the controller accepted",
            records_received.clone(),
        );
        let records_rejected = Family::<Reason, Counter>::default();
        registry.register(
            "records_rejected",
            "Flow records refused, by reason",
            records_rejected.clone(),
        );
        let batches_refused = Family::<Reason, Counter>::default();
        registry.register(
            "batches_refused",
            "Batches refused with a gRPC status that ends the stream, by reason",
            batches_refused.clone(),
        );
        let resolutions = Family::<Outcome, Counter>::default();
        registry.register(
            "resolutions",
            "What accepted records resolved to: the peer's kind (workload, host_network, node, external) \
             or why nothing was learned",
            resolutions.clone(),
        );
        let proposal_writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "proposal_writes",
            "Proposal flush results: created, updated, unchanged, promoted (left alone), conflict (409: changed \
             since read, or the watch's copy lagged; retried), failed (kept for the next flush)",
            proposal_writes.clone(),
        );
        // 1 ms .. ~16 s.
        let write_duration = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15),
        );
        registry.register(
            "proposal_write_duration_seconds",
            "Time to write one proposal (read, write, status)",
            write_duration.clone(),
        );
        let pending_proposals = Gauge::default();
        registry.register(
            "pending_proposals",
            "Proposals with learned edges waiting for a flush (those only repeating written edges wait up to a minute, for the recheck)",
            pending_proposals.clone(),
        );
        let pending_edges = Gauge::default();
        registry.register(
            "pending_edges",
            "Learned edges waiting for a flush (repeats of written edges wait up to a minute, for the recheck)",
            pending_edges.clone(),
        );
        let token_reviews = Family::<ResultLabel, Counter>::default();
        registry.register(
            "token_reviews",
            "Agent authentications: authenticated, unauthenticated, permission_denied, unavailable",
            token_reviews.clone(),
        );
        let agent_streams = Gauge::default();
        registry.register(
            "agent_streams",
            "Agent streams currently open",
            agent_streams.clone(),
        );
        let streams_closed = Family::<Reason, Counter>::default();
        registry.register(
            "agent_streams_closed",
            "Agent streams the controller closed: replaced (the agent pod opened a newer one), expired \
             (token expiry or maximum age), pod_deleted",
            streams_closed.clone(),
        );
        let acks_waiting = Gauge::default();
        registry.register(
            "acks_waiting",
            "Batch acknowledgements held until the flush that writes their edges (agents resend \
             unacknowledged batches after a controller restart)",
            acks_waiting.clone(),
        );
        let waits = WaitMetrics::default();
        registry.register(
            "waits",
            "What waited for the index, by waiter (record: for its local pod; observation, evidence: \
             for its peer) and outcome (waits, repeat, placed, expired, full)",
            waits.waits.clone(),
        );
        registry.register(
            "waiting",
            "What waits for the index now, by waiter (up to the resolution grace; at most 100,000)",
            waits.waiting.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (or runs without leader election)",
            leader.clone(),
        );
        let batch_repeats = Counter::default();
        registry.register(
            "batch_repeats",
            "Resent batches (same agent process and sequence) whose violation evidence was counted \
             already: learned from again, not counted again",
            batch_repeats.clone(),
        );
        let evidence_claims_dropped = Counter::default();
        registry.register(
            "evidence_claims_dropped",
            "Claims of batches whose evidence was counted, forgotten to stay within their bounds: a \
             resend of one of them would count again",
            evidence_claims_dropped.clone(),
        );
        let peer_kinds = PeerKind::ALL.map(|kind| {
            resolutions
                .get_or_create(&Outcome {
                    outcome: kind.label().into(),
                })
                .clone()
        });
        Self {
            registry: Arc::new(Mutex::new(registry)),
            records_received,
            flushes,
            records_rejected,
            batches_refused,
            resolutions,
            peer_kinds,
            proposal_writes,
            write_duration,
            pending_proposals,
            pending_edges,
            token_reviews,
            agent_streams,
            streams_closed,
            acks_waiting,
            waits,
            leader,
            batch_repeats,
            evidence_claims_dropped,
        }
    }

    /// Registers another metric (name without the prefix; counters get `_total` appended).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .expect("metrics registry lock")
            .register(name, help, metric);
    }

    /// Counts a refused record.
    pub fn record_rejected(&self, reason: &str) {
        self.records_rejected_by(reason, 1);
    }

    /// Counts `n` records refused for `reason`.
    pub fn records_rejected_by(&self, reason: &str, n: u64) {
        self.records_rejected
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc_by(n);
    }

    /// Counts a stream the controller closed.
    pub fn stream_closed(&self, reason: &str) {
        self.streams_closed
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a refused batch (the stream ends with a status).
    pub fn batch_refused(&self, reason: &str) {
        self.batches_refused
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts `n` resolutions with `outcome`.
    pub fn resolved(&self, outcome: &str, n: u64) {
        self.resolutions
            .get_or_create(&Outcome {
                outcome: outcome.into(),
            })
            .inc_by(n);
    }

    /// Counts a learned flow whose peer resolved to `kind` (`resolutions_total{outcome}`).
    pub fn resolved_peer(&self, kind: PeerKind) {
        self.peer_kinds[kind as usize].inc();
    }

    /// Counts a proposal flush result.
    pub fn proposal_write(&self, result: &str) {
        self.proposal_writes
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts a TokenReview result.
    pub fn token_review(&self, result: &str) {
        self.token_reviews
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// The value of a labelled counter, for tests and the benchmark (`family` is the metric name without
    /// prefix and suffix, e.g. `proposal_writes`).
    pub fn count(&self, family: &str, label: &str) -> u64 {
        match family {
            "records_rejected" => self
                .records_rejected
                .get_or_create(&Reason {
                    reason: label.into(),
                })
                .get(),
            "batches_refused" => self
                .batches_refused
                .get_or_create(&Reason {
                    reason: label.into(),
                })
                .get(),
            "resolutions" => self
                .resolutions
                .get_or_create(&Outcome {
                    outcome: label.into(),
                })
                .get(),
            "proposal_writes" => self
                .proposal_writes
                .get_or_create(&ResultLabel {
                    result: label.into(),
                })
                .get(),
            "token_reviews" => self
                .token_reviews
                .get_or_create(&ResultLabel {
                    result: label.into(),
                })
                .get(),
            _ => 0,
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        network_enforcer_api::metrics::render(&self.registry.lock().expect("metrics registry lock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_counters_and_late_registrations_are_encoded() {
        let m = ControllerMetrics::new();
        m.records_received.inc_by(5);
        m.record_rejected("not_on_node");
        m.resolved("external", 2);
        m.resolved_peer(PeerKind::External);
        m.resolved_peer(PeerKind::Node);
        m.proposal_write("created");
        m.token_review("permission_denied");
        m.pending_proposals.set(3);
        m.write_duration.observe(0.01);
        let extra = Counter::<u64>::default();
        m.register(
            "flow_source_events",
            "Events from a flow source",
            extra.clone(),
        );
        extra.inc();
        let reconciles = ReconcileMetrics::default();
        reconciles.register(&m);
        reconciles.observe(Reconciler::policy, 0.002, false);
        reconciles.observe(Reconciler::policy, 0.5, true);
        reconciles.observe(Reconciler::proposal, 0.001, false);
        let text = m.encode();
        for line in [
            "network_enforcer_controller_reconcile_runs_total{controller=\"policy\"} 2",
            "network_enforcer_controller_reconcile_failures_total{controller=\"policy\"} 1",
            "network_enforcer_controller_reconcile_runs_total{controller=\"proposal\"} 1",
            "network_enforcer_controller_reconcile_duration_seconds_count{controller=\"policy\"} 2",
            "network_enforcer_controller_records_received_total 5",
            "network_enforcer_controller_records_rejected_total{reason=\"not_on_node\"} 1",
            // By label and through the peer kind's own series: the same counter.
            "network_enforcer_controller_resolutions_total{outcome=\"external\"} 3",
            "network_enforcer_controller_resolutions_total{outcome=\"node\"} 1",
            "network_enforcer_controller_resolutions_total{outcome=\"workload\"} 0",
            "network_enforcer_controller_proposal_writes_total{result=\"created\"} 1",
            "network_enforcer_controller_token_reviews_total{result=\"permission_denied\"} 1",
            "network_enforcer_controller_pending_proposals 3",
            "network_enforcer_controller_proposal_write_duration_seconds_count 1",
            "network_enforcer_controller_flow_source_events_total 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        assert_eq!(m.count("proposal_writes", "created"), 1);
        assert_eq!(m.count("records_rejected", "bad_port"), 0);
    }
}
