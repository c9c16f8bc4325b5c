//! The flusher: the one owner of the flush and acknowledgement cycle (docs/behaviour.md §1.10).
//!
//! Learned edges wait in the [`Learner`] until a flush has the [`ProposalWriter`] write them. A flush here, and only
//! here: settles what waited for the index ([`crate::ingest::waiting`]), writes
//! every pending proposal, and records what it wrote in a ledger. The ingest holds back a batch's
//! acknowledgement until the ledger says that what the batch taught is in the API server
//! ([`Ledger::mark`] after merging, then [`Ledger::written_for`]); it never flushes itself.
//!
//! Why a ledger of flushes suffices: a flush takes, at its start, every pending edge an
//! acknowledgement can wait for (every edge no flush has decided yet); a failed proposal's edges go
//! back to pending before the next flush starts (flushes run one after another), so a flush in which
//! a proposal did not fail has written everything merged for it before it started, including the
//! edges of its earlier failures.
//!
//! When: every `--flush-interval-seconds`, and soon after an edge never seen before
//! ([`Learner::new_edges`]): once the rest of its burst is in ([`NEW_EDGE_SETTLE`]) and no more often
//! than every [`NEW_EDGE_MIN_GAP`], so a storm of new connections cannot turn into a storm of API
//! writes. A flush writes the proposals with undecided edges ([`Learner::take_undecided`]); the
//! proposals agents merely repeat (an API read each, to find nothing new) are written by a regular
//! flush every [`RECHECK_REPEATS_EVERY`], which restores an edge a proposal lost. So neither the
//! acknowledgements waiting for a flush nor the API server pay for the repeats every few seconds.

use crate::cluster::watches::{self, SharedIndex};
use crate::ingest::Learning;
use crate::ingest::ledger::Ledger;
use crate::learn::Target;
use crate::learn::flush_report::FlushReport;
use crate::learn::learner::{Learner, PendingEdges};
use crate::learn::proposal_writer::{ProposalWriter, refused_for_good};
use futures::StreamExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After the first new edge of a burst, how long the flusher waits for the rest of it.
pub const NEW_EDGE_SETTLE: Duration = Duration::from_millis(100);
/// The least time between two flushes woken by new edges.
pub const NEW_EDGE_MIN_GAP: Duration = Duration::from_millis(500);
/// How often a regular flush also writes the proposals whose pending edges all repeat what a flush
/// wrote before ([`Learner::take_pending`]): reading each of them back is what restores
/// an edge a proposal lost, e.g. one deleted by hand, and doing it at every flush would read every
/// proposal agents keep reporting every few seconds.
pub const RECHECK_REPEATS_EVERY: Duration = Duration::from_secs(60);
/// Proposals a flush writes at once: proposals are separate objects, and several writes at once keep
/// a flush (and the acknowledgements waiting for it) short when many proposals have new edges.
const CONCURRENT_WRITES: usize = 8;

/// See the module docs. One per writer; flushes run one after another ([`Flusher::run`] and the
/// last flush on the way out are never concurrent).
pub struct Flusher {
    index: Arc<SharedIndex>,
    learner: Arc<Learner>,
    writer: Arc<ProposalWriter>,
    ledger: Arc<Ledger>,
    /// Ingest, whose records, observations and evidence wait for the index
    /// ([`crate::ingest::waiting`]).
    waiting: Option<Arc<Learning>>,
}

impl Flusher {
    /// A flusher of what `learner` learned through `writer`; what waits for the index
    /// ([`Flusher::with_waiting`]) settles against `index`.
    pub fn new(
        index: Arc<SharedIndex>,
        learner: Arc<Learner>,
        writer: Arc<ProposalWriter>,
    ) -> Self {
        Self {
            index,
            learner,
            writer,
            ledger: Arc::default(),
            waiting: None,
        }
    }

    /// Settles what waits for the index in `learning` ([`Learning::settle`]) at the start of every
    /// flush.
    pub fn with_waiting(mut self, learning: Arc<Learning>) -> Self {
        self.waiting = Some(learning);
        self
    }

    /// What the flushes wrote (for the acknowledgements that wait for them).
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The learner this flushes.
    pub fn learner(&self) -> &Arc<Learner> {
        &self.learner
    }

    /// Settles what waited for the index and whose grace is over, then writes every pending
    /// proposal; when this replica leads (so the flush really wrote), records which proposals failed.
    pub async fn flush(&self) -> FlushReport {
        self.flush_settling(watches::now_ms(), Take::Everything)
            .await
    }

    /// The flush woken by new edges: [`Flusher::flush`], writing only the proposals with an edge no
    /// flush has decided yet ([`Learner::take_undecided`]); the rest waits for the regular flush.
    pub async fn flush_new(&self) -> FlushReport {
        self.flush_settling(watches::now_ms(), Take::Undecided)
            .await
    }

    /// The flush on the way out: the observations and evidence still waiting for the index are
    /// decided as it resolves them now; records still waiting for their pod are left to their agents
    /// (their batches were not acknowledged).
    pub async fn last_flush(&self) -> FlushReport {
        self.flush_settling(i64::MAX, Take::Everything).await
    }

    async fn flush_settling(&self, now_ms: i64, take: Take) -> FlushReport {
        self.settle_waiting(now_ms);
        let leading = self.writer.is_leader();
        // No later than the settling: what waited until before it was decided, so is in this flush.
        let started_ms = watches::now_ms().min(now_ms);
        let number = self.ledger.begin();
        let report = self.write_pending(take).await;
        self.learner.metrics().flushes.inc();
        if leading {
            self.ledger
                .finish(number, started_ms, &report.failed_proposals);
        }
        report
    }

    /// Writes the proposals with pending edges `take` names.
    async fn write_pending(&self, take: Take) -> FlushReport {
        if !self.writer.is_leader() {
            // A follower learns nothing (its ingest refuses streams); anything left from before it
            // lost the lead waits, and is written if it leads again.
            return FlushReport::default();
        }
        let batch = match take {
            Take::Everything => self.learner.take_pending(),
            Take::Undecided => self.learner.take_undecided(),
        };
        let mut writes = futures::stream::iter(batch)
            .map(|(target, edges)| self.write_one(target, edges))
            .buffer_unordered(CONCURRENT_WRITES);
        let mut report = FlushReport::default();
        while let Some(one) = writes.next().await {
            report.add(&one);
        }
        drop(writes);
        self.learner.count_pending();
        report
    }

    /// Writes one proposal's pending edges: what happened, as a report of its own. Written or refused
    /// for good, its edges are decided; a failed write puts them back for the next flush.
    async fn write_one(&self, target: Target, edges: PendingEdges) -> FlushReport {
        let mut report = FlushReport::default();
        // Refused while pending: already counted; the write's Event names them too.
        let pending_capped = edges.capped().clone();
        let overflow = edges.overflow();
        let edges = edges.into_ordered();
        let started = Instant::now();
        let result = self
            .writer
            .write(&target, &edges, (&pending_capped, overflow), &mut report)
            .await;
        let metrics = self.learner.metrics();
        metrics
            .write_duration
            .observe(started.elapsed().as_secs_f64());
        self.writer
            .count(&FlushReport::default(), &report, result.is_err());
        if result.as_ref().map_or_else(refused_for_good, |_| true) {
            self.learner.decided(&target, &edges);
        }
        match result {
            Ok(()) => {}
            Err(error) if refused_for_good(&error) => {
                report.refused += 1;
                metrics.resolved("write_refused", edges.len() as u64);
                tracing::error!(proposal = %target.name(), namespace = %target.workload.namespace, %error,
                    edges = edges.len(),
                    "the API server refused the proposal; its new edges are dropped (writing them again cannot succeed)");
            }
            Err(error) => {
                report.failed += 1;
                report
                    .failed_proposals
                    .insert(self.learner.proposal_key(&target));
                tracing::warn!(proposal = %target.name(), namespace = %target.workload.namespace, %error,
                    "writing a proposal failed; its edges are kept for the next flush");
                self.learner.keep_for_retry(target, edges);
            }
        }
        report
    }

    /// Flushes every `every`, and soon after a new edge (see the module docs); runs until dropped.
    pub async fn run(&self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        let mut last_flush = tokio::time::Instant::now();
        // The first regular flush takes everything.
        let mut last_recheck: Option<tokio::time::Instant> = None;
        loop {
            let take = tokio::select! {
                _ = tick.tick() => {
                    let now = tokio::time::Instant::now();
                    let take = regular_take(last_recheck, now);
                    if take == Take::Everything {
                        last_recheck = Some(now);
                    }
                    take
                }
                () = self.learner.new_edges().notified() => {
                    let at = (tokio::time::Instant::now() + NEW_EDGE_SETTLE)
                        .max(last_flush + NEW_EDGE_MIN_GAP);
                    tokio::time::sleep_until(at).await;
                    Take::Undecided
                }
            };
            last_flush = tokio::time::Instant::now();
            let report = self.flush_settling(watches::now_ms(), take).await;
            if report != FlushReport::default() {
                tracing::info!(?report, "flushed proposals");
            }
        }
    }

    /// Decides what waited for the index and is placed now or out of grace.
    fn settle_waiting(&self, now_ms: i64) {
        if let Some(learning) = &self.waiting {
            let index = self.index.index.read().expect("index lock");
            learning.settle(&index, now_ms, crate::ingest::waiting::Look::Flush);
        }
    }
}

/// What the regular flush at `now` takes, when the last one that took everything was at
/// `last_recheck` ([`RECHECK_REPEATS_EVERY`]).
fn regular_take(last_recheck: Option<tokio::time::Instant>, now: tokio::time::Instant) -> Take {
    match last_recheck {
        Some(at) if now.saturating_duration_since(at) < RECHECK_REPEATS_EVERY => Take::Undecided,
        _ => Take::Everything,
    }
}

/// Which pending proposals a flush writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Take {
    Everything,
    /// Those an acknowledgement may wait for ([`Learner::take_undecided`]).
    Undecided,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::index::Index;
    use crate::ingest::ledger::WaitsFor;
    use crate::ingest::observation;
    use k8s_openapi::api::core::v1::Pod;
    use network_enforcer_api::uplink::{self, FlowRecord, LocalPod};
    use serde_json::json;
    use std::collections::BTreeSet;

    #[test]
    fn a_regular_flush_rechecks_repeated_proposals_once_a_minute() {
        let start = tokio::time::Instant::now();
        let s = Duration::from_secs;
        for (last_recheck, now, take) in [
            (None, start, Take::Everything),
            (Some(start), start, Take::Undecided),
            (Some(start), start + s(2), Take::Undecided),
            (Some(start), start + s(59), Take::Undecided),
            (Some(start), start + s(60), Take::Everything),
            (Some(start + s(1)), start, Take::Undecided),
        ] {
            assert_eq!(
                regular_take(last_recheck, now),
                take,
                "{last_recheck:?} {now:?}"
            );
        }
    }

    /// An index holding pod shop/web-1 of Deployment web (through its ReplicaSet) on node-a, so its
    /// flows make proposals.
    fn web_deployment_index() -> Index {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-web-1",
                         "labels": {"app": "web", "pod-template-hash": "abc"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "web-abc", "uid": "uid-rs", "controller": true}]},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        }))
        .unwrap();
        let mut index = Index::default();
        index.apply_pod(&pod, 1_000);
        index
    }

    /// An outbound TCP connection of shop/web-1 to 10.0.0.9.
    fn record() -> FlowRecord {
        FlowRecord {
            local: Some(LocalPod {
                namespace: "shop".into(),
                name: "web-1".into(),
                uid: String::new(),
            }),
            peer_ip: vec![10, 0, 0, 9],
            port: 8080,
            protocol: uplink::Protocol::Tcp as i32,
            direction: uplink::Direction::Outbound as i32,
            outcome: uplink::Outcome::Established as i32,
            last_seen_ms: 2_000,
            ..FlowRecord::default()
        }
    }

    /// A writer whose API server refuses connections.
    fn unreachable_writer() -> ProposalWriter {
        ProposalWriter::new(
            network_enforcer_tests::fixture::offline_client(),
            network_enforcer_api::Backend::Kubernetes,
        )
    }

    fn flusher(index: Index, writer: ProposalWriter) -> Flusher {
        let learner = Learner::new(network_enforcer_api::Backend::Kubernetes, BTreeSet::new());
        Flusher::new(
            Arc::new(SharedIndex::listed(index)),
            Arc::new(learner),
            Arc::new(writer),
        )
    }

    #[tokio::test]
    async fn a_never_seen_edge_wakes_the_flusher_and_a_repeat_does_not() {
        let index = web_deployment_index();
        let flusher = flusher(web_deployment_index(), unreachable_writer());
        let learner = flusher.learner();
        let woken = || async {
            tokio::time::timeout(Duration::from_millis(50), learner.new_edges().notified())
                .await
                .is_ok()
        };
        let obs = observation(&record(), &index, "node-a").unwrap().unwrap();
        learner.observe(&index, &obs).unwrap();
        assert!(woken().await, "a new edge wakes the flusher");
        // The same edge again, pending or after a flush (here a failed one): no wake-up.
        learner.observe(&index, &obs).unwrap();
        flusher.flush().await;
        learner.observe(&index, &obs).unwrap();
        assert!(!woken().await, "a repeat must not wake the flusher");
    }

    #[tokio::test]
    async fn only_a_flush_that_wrote_everything_marks_what_was_merged_before_it() {
        let index = web_deployment_index();
        let flushes = flusher(web_deployment_index(), unreachable_writer());
        let learner = flushes.learner();
        let obs = observation(&record(), &index, "node-a").unwrap().unwrap();
        assert!(learner.observe(&index, &obs).unwrap() > 0);
        let mark = flushes.ledger().mark();
        assert!(!flushes.ledger().written_after(mark), "nothing flushed yet");
        let report = flushes.flush().await;
        assert_eq!(report.failed, 1, "{report:?}");
        assert_eq!(report.failed_proposals.len(), 1, "{report:?}");
        assert!(
            !flushes.ledger().written_after(mark),
            "a failed write acknowledges nothing"
        );
        assert_eq!(learner.pending_proposals(), 1, "kept for the next flush");

        // A follower's flush writes nothing, so it marks nothing either.
        let (leadership, follower) =
            tokio::sync::watch::channel(crate::runtime::leader::Leadership {
                leader: false,
                ..Default::default()
            });
        let following = self::flusher(
            web_deployment_index(),
            unreachable_writer().with_leader(follower),
        );
        assert!(following.learner().observe(&index, &obs).unwrap() > 0);
        let mark = following.ledger().mark();
        assert_eq!(following.flush().await, FlushReport::default());
        assert!(!following.ledger().written_after(mark));
        drop(leadership);

        // With nothing pending a flush succeeds and marks everything merged before it.
        let empty = self::flusher(web_deployment_index(), unreachable_writer());
        let mark = empty.ledger().mark();
        assert_eq!(empty.flush().await.failed, 0);
        assert!(empty.ledger().written_after(mark));
        assert!(
            !empty.ledger().written_after(empty.ledger().mark()),
            "later merges wait for a later flush"
        );
    }

    #[test]
    fn a_failing_proposal_holds_back_only_the_batches_that_taught_it() {
        let flushes = Ledger::default();
        let waits = |keys: &[u64]| {
            let mut w = WaitsFor::default();
            keys.iter().for_each(|k| w.add(*k));
            w
        };
        let report = |failed: &[u64]| FlushReport {
            failed: failed.len(),
            failed_proposals: failed.iter().copied().collect(),
            ..FlushReport::default()
        };
        let mark = flushes.mark();
        let first = flushes.begin();
        flushes.finish(first, 0, &report(&[7]).failed_proposals);
        // (what the batch waits for, written after a flush in which proposal 7 failed?)
        let cases = [
            (waits(&[1]), true),
            (waits(&[1, 2, 3]), true),
            (waits(&[7]), false),
            (waits(&[1, 7]), false),
            (WaitsFor::everything(), false),
            (
                waits(&(0..=WaitsFor::MAX_PROPOSALS as u64 + 8).collect::<Vec<_>>()),
                false,
            ),
        ];
        for (w, written) in &cases {
            assert_eq!(flushes.written_for(mark, w), *written, "{w:?}");
        }
        assert!(!flushes.written_after(mark));
        // A later flush in which 7 is written releases everything merged before the first one.
        let second = flushes.begin();
        flushes.finish(second, 0, &report(&[]).failed_proposals);
        for (w, _) in &cases {
            assert!(flushes.written_for(mark, w), "{w:?}");
        }
        // But nothing merged after the second flush started.
        assert!(!flushes.written_for(flushes.mark(), &waits(&[1])));
        // An older flush finishing late changes nothing.
        flushes.finish(first, 0, &report(&[1]).failed_proposals);
        assert!(flushes.written_for(mark, &waits(&[1])));
    }

    #[test]
    fn a_record_waiting_for_the_index_is_released_by_a_flush_after_its_grace() {
        let flushes = Ledger::default();
        let mut waits = WaitsFor::default();
        waits.add(3);
        waits.defer_until(5_000);
        assert!(!waits.is_nothing());
        let mark = flushes.mark();
        // (flush started at, proposals failed in it, written)
        let cases: [(i64, &[u64], bool); 4] = [
            (4_000, &[], false),
            (5_000, &[9], false),
            (6_000, &[], true),
            (7_000, &[3], false),
        ];
        for (started, failed, written) in cases {
            let number = flushes.begin();
            let report = FlushReport {
                failed: failed.len(),
                failed_proposals: failed.iter().copied().collect(),
                ..FlushReport::default()
            };
            flushes.finish(number, started, &report.failed_proposals);
            assert_eq!(
                flushes.written_for(mark, &waits),
                written,
                "{started} {failed:?}"
            );
        }
    }
}
