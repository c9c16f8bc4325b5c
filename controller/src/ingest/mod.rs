//! Ingest: the gRPC endpoint agents stream flow batches to (what it accepts and refuses:
//! docs/behaviour.md §7.7; when it acknowledges: §1.10).
//!
//! Every stream is authenticated before a record is read: the agent presents its projected ServiceAccount
//! token (audience [`AUDIENCE`]), the controller checks it with a TokenReview, requires the agent's
//! ServiceAccount, and learns the agent's node from the pod the token is bound to. Records are accepted
//! only for pods the index places on that node, so a compromised agent cannot speak for other nodes; a
//! record for a pod the index has not seen yet waits for it a little ([`early_records`]).
//! Limits (records per batch, batches per second per stream, message size) are answered with a clear
//! status and counted; nothing an agent sends can crash the controller.
//!
//! **Acknowledged means written.** Learned edges wait in the [`Learner`] until the next flush.
//! A batch acknowledged before then would be lost if the controller stopped in between (crash,
//! rollout, lost Lease): the agent has already forgotten it. So, with [`IngestService::written`] set
//! (the controller binary always sets it), a batch that taught anything is acknowledged only once a
//! flush that started after it was merged has written every pending proposal ([`Flusher`]); until then
//! the agent keeps it in its resend buffer and resends it after a reconnect. Resends merge idempotently
//! (same edges, same rules), so the price of a restart is a few duplicate records, never a lost or
//! duplicated rule. Violation evidence is held the same way: while any policy exists, a batch is
//! acknowledged only once the evidence pass after it has found no violation in it that still waits for
//! its status patch ([`Holds`]). Batches that teach nothing and carry no evidence (refused records, or
//! only edges a flush has already written, with no policy in force) are acknowledged at once. A proposal whose write keeps failing holds back only
//! the acknowledgements of batches that taught it something ([`WaitsFor`]): one hostile or broken
//! proposal cannot stall every agent. Those agents' resend buffers rotate their oldest batches out,
//! which this controller has already merged.

pub mod admission;
pub mod auth_cache;
pub mod early_records;
pub mod flow_record;
pub mod tls;

use crate::cluster::index::Index;
use crate::cluster::watches::SharedIndex;
use crate::learn::flusher::{Flusher, Ledger};
use crate::learn::learner::{Learner, WaitsFor};
use crate::learn::proposal_writer::ProposalWriter;
use crate::learn::{ReportedConnection, Reporter};
use crate::monitor::violations::evidence::Evidence;
use early_records::EarlyRecords;
use flow_record::{BadRecord, Decoded, PeerFrom};
use futures::Stream;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use network_enforcer_api::uplink::encoded::{
    self,
    flow_uplink_server::{FlowUplink, FlowUplinkServer},
};
use network_enforcer_api::uplink::{self, BatchAck, FlowBatch, FlowRecord};
use prost::Message;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};

/// The audience agents' projected tokens must be issued for.
pub const AUDIENCE: &str = "network-enforcer";

/// Who is on the other end of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    /// The node the agent's pod runs on.
    pub node: String,
    /// The agent pod, `namespace/name`.
    pub pod: String,
}

/// Checks an agent's bearer token.
#[tonic::async_trait]
pub trait Authenticate: Send + Sync + 'static {
    async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status>;
}

/// Authenticates agents with a TokenReview against the API server.
pub struct TokenReviewAuthenticator {
    client: Client,
    /// `system:serviceaccount:<namespace>:<name>` of the agent.
    expected_user: String,
}

impl TokenReviewAuthenticator {
    /// Accepts tokens of ServiceAccount `namespace/name` only.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            client,
            expected_user: format!("system:serviceaccount:{namespace}:{name}"),
        }
    }
}

/// What a TokenReview's status says of an agent: the name and uid of the pod its token is bound to,
/// or why it is refused. The token must be authenticated *for our audience* (an empty `audiences`
/// means it is valid for the API server's own audience only: a stolen API token, refused), and belong
/// to the agents' ServiceAccount `expected_user`.
fn reviewed_agent(
    status: &k8s_openapi::api::authentication::v1::TokenReviewStatus,
    expected_user: &str,
) -> Result<(String, Option<String>), Status> {
    if status.authenticated != Some(true) {
        return Err(Status::unauthenticated(format!(
            "token rejected: {}",
            status.error.as_deref().unwrap_or("not authenticated")
        )));
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == AUDIENCE))
    {
        return Err(Status::unauthenticated(format!(
            "the token is not issued for audience {AUDIENCE:?}; mount a projected token with that audience"
        )));
    }
    let user = status.user.clone().unwrap_or_default();
    if user.username.as_deref() != Some(expected_user) {
        return Err(Status::permission_denied(format!(
            "{} is not the agent ServiceAccount ({expected_user})",
            user.username.unwrap_or_default(),
        )));
    }
    let claim = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(|v| v.first())
            .cloned()
    };
    let pod_name = claim("authentication.kubernetes.io/pod-name").ok_or_else(|| {
        Status::permission_denied("the token is not bound to a pod; mount a projected token")
    })?;
    Ok((pod_name, claim("authentication.kubernetes.io/pod-uid")))
}

#[tonic::async_trait]
impl Authenticate for TokenReviewAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Status::unavailable("could not verify the token right now; retry")
            })?;
        let status = reviewed.status.unwrap_or_default();
        let (pod_name, pod_uid) = reviewed_agent(&status, &self.expected_user)?;
        // The ServiceAccount (and so the pod) lives in the namespace of the username.
        let namespace = self
            .expected_user
            .split(':')
            .nth(2)
            .unwrap_or_default()
            .to_string();
        let pod = Api::<Pod>::namespaced(self.client.clone(), &namespace)
            .get_opt(&pod_name)
            .await
            .map_err(|_| Status::unavailable("could not look up the agent pod; retry"))?
            .ok_or_else(|| {
                Status::permission_denied(format!(
                    "agent pod {namespace}/{pod_name} does not exist"
                ))
            })?;
        if pod_uid.is_some() && pod.metadata.uid != pod_uid {
            return Err(Status::permission_denied("the token's pod was replaced"));
        }
        let node = pod
            .spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| Status::permission_denied("the agent pod is not scheduled on a node"))?;
        Ok(AgentIdentity {
            node,
            pod: format!("{namespace}/{pod_name}"),
        })
    }
}

/// Limits on what one agent stream may send.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_records_per_batch: usize,
    pub max_batches_per_second: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_records_per_batch: 10_000,
            max_batches_per_second: 20,
        }
    }
}

/// Where accepted records go: the index to resolve them, the learner to learn from them, and the
/// status sync that turns them into violation evidence (docs/behaviour.md §3).
pub struct Learning {
    pub index: Arc<SharedIndex>,
    pub learner: Arc<Learner>,
    /// Whose leadership decides whether agents' streams are taken.
    pub writer: Arc<ProposalWriter>,
    /// Every accepted record is also handed here (never blocks); `None`: no violations recorded.
    pub evidence: Option<Arc<dyn crate::monitor::status_sync::EvidenceSink>>,
    /// Records that arrived before the index knew their pod ([`early_records`]).
    pub early: EarlyRecords,
}

/// Turns a record into a learning observation, or `None` for records that teach nothing (failed attempts,
/// denials: those are violation evidence, not learning).
pub fn observation(
    record: &FlowRecord,
    index: &Index,
    node: &str,
) -> Result<Option<ReportedConnection>, BadRecord> {
    let decoded = flow_record::decode(record, index, Some(node))?;
    Ok(learned(record, &decoded, Reporter::Node))
}

/// What `record`, read as `decoded`, teaches: `None` for records that teach nothing.
fn learned(
    record: &FlowRecord,
    decoded: &Decoded,
    reporter: Reporter,
) -> Option<ReportedConnection> {
    let learns = matches!(
        uplink::Outcome::try_from(record.outcome),
        Ok(uplink::Outcome::Established | uplink::Outcome::Datagram)
    );
    learns.then(|| ReportedConnection {
        local: decoded.local.clone(),
        peer: decoded.peer,
        port: decoded.port,
        protocol: decoded.protocol,
        opened: decoded.opened,
        at_ms: decoded.at_ms,
        reporter,
    })
}

/// How far ahead of this controller's clock an agent's clock may run before its times are not
/// believed.
pub const CLOCK_SKEW_MS: i64 = 60_000;

/// A record whose times lie in the future (beyond [`CLOCK_SKEW_MS`]) gets them set to `now_ms`: an
/// agent's clock or a hostile agent must not date violations ahead, where they would outrank real
/// ones and never age out.
pub fn clamp_times(record: &FlowRecord, now_ms: i64) -> Cow<'_, FlowRecord> {
    let limit = now_ms.saturating_add(CLOCK_SKEW_MS);
    if record.last_seen_ms <= limit && record.first_seen_ms <= limit {
        return Cow::Borrowed(record);
    }
    let mut clamped = record.clone();
    clamped.last_seen_ms = clamped.last_seen_ms.min(now_ms);
    clamped.first_seen_ms = clamped.first_seen_ms.min(clamped.last_seen_ms);
    Cow::Owned(clamped)
}

impl Learning {
    /// Takes in a batch from the agent on `node`: returns the acknowledgement.
    pub fn accept(&self, node: &str, batch: &FlowBatch) -> BatchAck {
        let records = batch.records.iter().map(|r| Ok(Cow::Borrowed(r)));
        self.take_in_as(node, batch.sequence, records, Reporter::Node)
            .0
    }

    /// [`Learning::accept`] for records of a cluster-wide source the controller reads itself (Calico
    /// Goldmane), filed under the node of their local pod: they may teach both sides of a connection.
    pub fn accept_from_cluster_source(&self, node: &str, batch: &FlowBatch) -> BatchAck {
        let records = batch.records.iter().map(|r| Ok(Cow::Borrowed(r)));
        self.take_in_as(node, batch.sequence, records, Reporter::Cluster)
            .0
    }

    /// [`Learning::accept`] for a batch as it came off an agent's stream, its records decoded one by
    /// one here (a record that does not decode is refused alone), also saying what the
    /// acknowledgement must wait for: the proposals the batch gave edges no flush has decided yet,
    /// and the status patch of its violation evidence.
    pub fn take_in(&self, node: &str, batch: &encoded::FlowBatch) -> (BatchAck, Holds) {
        let records = batch.records.iter().map(|bytes| {
            FlowRecord::decode(bytes.clone())
                .map(Cow::Owned)
                .map_err(BadRecord::Malformed)
        });
        self.take_in_as(node, batch.sequence, records, Reporter::Node)
    }

    fn take_in_as<'a>(
        &self,
        node: &str,
        sequence: u64,
        records: impl ExactSizeIterator<Item = Result<Cow<'a, FlowRecord>, BadRecord>>,
        reporter: Reporter,
    ) -> (BatchAck, Holds) {
        let index = self.index.index.read().expect("index lock");
        let metrics = self.learner.metrics();
        let now_ms = crate::cluster::watches::now_ms();
        if self.early.due(now_ms) {
            self.settle_early(&index, now_ms, false);
        }
        let (mut accepted, mut rejected, mut reason) = (0u32, 0u32, String::new());
        let mut waits = WaitsFor::default();
        let mut evidence_handed = false;
        let mut early = false;
        let received = records.len() as u64;
        for original in records {
            let result = original.and_then(|original| {
                let record = clamp_times(&original, now_ms);
                if matches!(record, Cow::Owned(_)) {
                    metrics.resolved("future_time_clamped", 1);
                }
                let from = Arrival {
                    node,
                    reporter,
                    at_ms: now_ms,
                };
                let taken = self.take_one(&index, from, &record, &mut waits, &mut evidence_handed);
                match taken {
                    Err(BadRecord::UnknownLocalPod(pod)) => {
                        let grace_ms = self.learner.resolution_grace_ms();
                        match self.early.hold(node, reporter, &record, now_ms, grace_ms) {
                            Ok(until_ms) => {
                                metrics.resolved("local_pod_deferred", 1);
                                metrics.records_waiting_for_pod.inc();
                                waits.defer_until(until_ms);
                                early = true;
                                Ok(Ok(()))
                            }
                            Err(why) => {
                                if why == early_records::NoWait::Full {
                                    metrics.resolved("local_pod_waiting_full", 1);
                                }
                                Err(BadRecord::UnknownLocalPod(pod))
                            }
                        }
                    }
                    taken => taken,
                }
            });
            match result {
                Ok(Ok(())) => accepted += 1,
                Ok(Err(unresolved)) => {
                    // Accepted (well-formed, authorized) but not resolvable yet: counted, not an error.
                    accepted += 1;
                    tracing::debug!(%unresolved, "record not resolvable");
                }
                Err(refused) => {
                    rejected += 1;
                    metrics.record_rejected(refused.label());
                    if reason.is_empty() {
                        reason = refused.to_string();
                    }
                }
            }
        }
        metrics.records_received.inc_by(received);
        if rejected > 0 {
            tracing::warn!(node, sequence, rejected, %reason, "refused records");
        }
        (
            BatchAck {
                sequence,
                accepted,
                rejected,
                reason,
            },
            Holds {
                proposals: waits,
                evidence: self
                    .evidence
                    .as_ref()
                    .filter(|_| evidence_handed)
                    .and_then(|e| e.hold()),
                early,
            },
        )
    }

    /// Takes in one record as it arrived (`from`): learns from it (adding what its
    /// acknowledgement waits for to `waits`) and hands it to the evidence sink. `Ok(Err(_))`: accepted
    /// but not resolvable.
    fn take_one(
        &self,
        index: &Index,
        from: Arrival<'_>,
        record: &FlowRecord,
        waits: &mut WaitsFor,
        evidence_handed: &mut bool,
    ) -> Result<Result<(), String>, BadRecord> {
        let metrics = self.learner.metrics();
        let decoded = flow_record::decode(record, index, Some(from.node))?;
        let learning = match learned(record, &decoded, from.reporter) {
            Some(o) => {
                if decoded.peer_from != PeerFrom::Address {
                    metrics.resolved(decoded.peer_from.label(), 1);
                }
                self.learner
                    .observe_or_wait(index, &o, from.at_ms, waits)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            None => {
                metrics.resolved("not_learned", 1);
                Ok(())
            }
        };
        if let Some(sink) = &self.evidence
            && let Some(evidence) = Evidence::of(record, decoded)
        {
            sink.accepted(evidence);
            *evidence_handed = true;
        }
        Ok(learning)
    }

    /// Takes in the records that waited for their pod and whose pod the index now knows, and refuses
    /// those whose grace is over at `now_ms`. Called by batches as they come (`wait: false`: not when
    /// another thread is at it) and before every flush (`wait: true`).
    ///
    /// A record is taken in as of its arrival: should its peer then wait for the index too, that
    /// wait ends when its batch's does (both are the grace from its arrival), so the flush that
    /// releases the batch's acknowledgement decides it.
    pub fn settle_early(&self, index: &Index, now_ms: i64, wait: bool) {
        let Some(_settling) = self.early.settling(wait) else {
            return;
        };
        let decided = self.early.take_decided(index, now_ms);
        let metrics = self.learner.metrics();
        metrics
            .records_waiting_for_pod
            .dec_by((decided.placed.len() + decided.expired.len()) as i64);
        // One log line per settling, not per record: a hostile agent may name many pods.
        let mut refused: Option<(u64, String, BadRecord)> = None;
        for early in decided.placed {
            let from = Arrival {
                node: &early.node,
                reporter: early.reporter,
                at_ms: early.arrived_ms,
            };
            let taken = self.take_one(
                index,
                from,
                &early.record,
                &mut WaitsFor::default(),
                &mut false,
            );
            match taken {
                Ok(_) => metrics.resolved("local_pod_deferred_resolved", 1),
                Err(why) => {
                    metrics.record_rejected(why.label());
                    let first = refused.get_or_insert((0, early.node, why));
                    first.0 += 1;
                }
            }
        }
        if let Some((records, node, reason)) = refused {
            tracing::warn!(records, first_node = %node, first_reason = %reason,
                "refused records that waited for their pod");
        }
        let Some(first) = decided.expired.first() else {
            return;
        };
        if now_ms == i64::MAX {
            // On the way out: not refused, their batches are not acknowledged and come again.
            tracing::info!(
                records = decided.expired.len(),
                "records still waiting for their pods are left to their agents to send again"
            );
            return;
        }
        let expired = decided.expired.len() as u64;
        metrics.resolved("local_pod_deferred_expired", expired);
        metrics.records_rejected_by("unknown_local_pod", expired);
        let pod = first
            .record
            .local
            .as_ref()
            .map(flow_record::describe_local)
            .unwrap_or_default();
        tracing::warn!(records = expired, first_node = %first.node, first_pod = %pod,
            "refused records: their pods did not reach the index within the resolution grace");
    }
}

impl crate::learn::flusher::SettleFirst for Learning {
    fn settle_first(&self, index: &Index, now_ms: i64) {
        // Even when none waits: a batch's look may have taken the last ones out and be merging them.
        self.settle_early(index, now_ms, true);
    }
}

/// Who sent a record (the node whose stream it came on, and as what) and when it arrived.
#[derive(Clone, Copy, Debug)]
struct Arrival<'a> {
    node: &'a str,
    reporter: Reporter,
    at_ms: i64,
}

/// What a batch's acknowledgement waits for (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// The writes of these proposals.
    pub proposals: WaitsFor,
    /// The status patch of violations found in its records: a mark of the evidence sink
    /// ([`crate::monitor::status_sync::EvidenceSink::hold`]).
    pub evidence: Option<u64>,
    /// Some of its records waited for their pod ([`early_records`]): once `proposals` are written
    /// (their wait is over, so they were taken in or refused), the evidence mark is taken again, to
    /// cover what they were found to be.
    pub early: bool,
}

impl Holds {
    /// Nothing to wait for: the acknowledgement may go at once.
    pub fn is_nothing(&self) -> bool {
        self.proposals.is_nothing() && self.evidence.is_none() && !self.early
    }

    /// Whether the acknowledgement of a batch merged at `mark` may go: its proposals are written
    /// (`written`) and its evidence is in statuses (`evidence`). A batch whose records waited for
    /// their pod takes its evidence mark again once its wait is over (see [`Holds::early`]).
    /// Checked again whenever a flush or an evidence pass ends.
    pub fn ready(
        &mut self,
        mark: u64,
        written: &Ledger,
        evidence: Option<&dyn crate::monitor::status_sync::EvidenceSink>,
    ) -> bool {
        // Not only the oldest batch: one behind a batch that waits for a failing proposal may be
        // written already (agents acknowledge per sequence).
        let proposals_written =
            self.proposals.is_nothing() || written.written_for(mark, &self.proposals);
        if self.early && proposals_written {
            self.early = false;
            self.evidence = self.evidence.max(evidence.and_then(|e| e.hold()));
        }
        !self.early
            && proposals_written
            && self
                .evidence
                .is_none_or(|m| evidence.is_none_or(|e| e.settled_after(m)))
    }
}

/// Acknowledgements of one stream that wait for a flush, oldest first, with the mark of each.
/// Bounded: an agent that keeps sending while nothing gets written is told to back off.
const MAX_WAITING_ACKS: usize = 4096;

/// The gRPC service.
pub struct IngestService {
    pub authenticator: Arc<dyn Authenticate>,
    pub learning: Arc<Learning>,
    pub limits: Limits,
    /// How many streams, one per agent pod, and for how long ([`admission`]).
    pub admission: Arc<admission::Admission>,
    /// `Some`: acknowledge a batch that taught something only once a flush counted here has written
    /// it (what the controller does; see the module docs). `None`: acknowledge once merged in memory
    /// (for tests that flush by hand).
    pub written: Option<Arc<Flusher>>,
}

/// The largest batch message an agent may send, encoded.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

impl IngestService {
    /// The gRPC service to serve: the one the controller binary runs and the tests start.
    pub fn into_server(self) -> FlowUplinkServer<Self> {
        FlowUplinkServer::new(self).max_decoding_message_size(MAX_BATCH_BYTES)
    }
}

fn bearer<T>(request: &Request<T>) -> Result<String, Status> {
    let value = request
        .metadata()
        .get("authorization")
        .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>`"))?
        .to_str()
        .map_err(|_| Status::unauthenticated("malformed authorization header"))?;
    value
        .strip_prefix("Bearer ")
        .map(str::to_string)
        .ok_or_else(|| Status::unauthenticated("authorization must be `Bearer <token>`"))
}

#[tonic::async_trait]
impl FlowUplink for IngestService {
    type StreamStream = Pin<Box<dyn Stream<Item = Result<BatchAck, Status>> + Send>>;

    async fn stream(
        &self,
        request: Request<Streaming<encoded::FlowBatch>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        if !self.learning.index.ready() {
            self.learning
                .learner
                .metrics()
                .batch_refused("index_not_synced");
            return Err(Status::unavailable(
                "the controller is still listing the cluster; retry shortly",
            ));
        }
        let metrics = self.learning.learner.metrics().clone();
        if let Some(status) = not_leader(&self.learning.writer) {
            metrics.batch_refused("not_leader");
            return Err(status);
        }
        // Before the token is reviewed: a flood of connections must not become a flood of reviews.
        let slot = self
            .admission
            .slot()
            .inspect_err(|_| metrics.batch_refused("too_many_streams"))?;
        let token = bearer(&request).inspect_err(|_| metrics.token_review("unauthenticated"))?;
        let agent = self
            .authenticator
            .authenticate(&token)
            .await
            .inspect_err(|status| {
                metrics.token_review(match status.code() {
                    tonic::Code::Unauthenticated => "unauthenticated",
                    tonic::Code::PermissionDenied => "permission_denied",
                    _ => "unavailable",
                })
            })?;
        metrics.token_review("authenticated");
        let now_s = crate::cluster::watches::now_ms() / 1000;
        let lifetime = self.admission.lifetime(&token, now_s);
        let mut registered = self.admission.register(&agent.pod);
        let recheck_every = self.admission.limits().recheck_every;
        tracing::info!(node = %agent.node, pod = %agent.pod, lifetime_s = lifetime.as_secs(),
            replaced_older = registered.replaced_older, "agent connected");
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let learning = self.learning.clone();
        let limits = self.limits.clone();
        let written = self.written.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let metrics = learning.learner.metrics().clone();
            metrics.agent_streams.inc();
            // Decremented however the stream ends.
            let _open = GaugeGuard(metrics.agent_streams.clone());
            let expired = tokio::time::sleep(lifetime);
            tokio::pin!(expired);
            let mut recheck = tokio::time::interval(recheck_every);
            recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Whether the index has held the agent's pod: only a pod seen there can be seen gone.
            let mut pod_seen = false;
            let mut window = (Instant::now(), 0u32);
            // Acks waiting for the flush that writes their batch's edges, with the batch's mark.
            let mut waiting: VecDeque<(u64, Holds, BatchAck)> = VecDeque::new();
            let mut flushed = written.as_ref().map(|w| w.ledger().subscribe());
            let evidence = learning.evidence.clone();
            let mut settled = evidence.as_ref().and_then(|e| e.settled());
            // The (flush, settled evidence) `waiting` was last checked against.
            let mut checked = (0, 0);
            let mut inbound_open = true;
            'stream: loop {
                let now = (
                    written.as_ref().map_or(0, |w| w.ledger().latest()),
                    settled.as_ref().map_or(0, |s| *s.borrow()),
                );
                if let Some(w) = written.as_ref().filter(|_| now != checked) {
                    checked = now;
                    let mut ready = Vec::new();
                    for (mark, mut holds, ack) in std::mem::take(&mut waiting) {
                        if holds.ready(mark, w.ledger(), evidence.as_deref()) {
                            ready.push(ack);
                        } else {
                            waiting.push_back((mark, holds, ack));
                        }
                    }
                    for ack in ready {
                        metrics.acks_waiting.dec();
                        if tx.send(Ok(ack)).await.is_err() {
                            break 'stream;
                        }
                    }
                }
                if !inbound_open && waiting.is_empty() {
                    break;
                }
                let batch = tokio::select! {
                    message = inbound.message(), if inbound_open => match message {
                        Ok(Some(batch)) => batch,
                        // The agent is done sending; its last acks still go out once written.
                        Ok(None) => {
                            inbound_open = false;
                            continue;
                        }
                        Err(status) => {
                            tracing::info!(node = %agent.node, %status, "agent stream ended");
                            break;
                        }
                    },
                    closed = &mut registered.replaced => {
                        // A dropped sender also means another stream took the pod's place.
                        let reason = closed.unwrap_or(admission::Closed::Replaced);
                        close(&tx, &metrics, &agent, reason).await;
                        break;
                    }
                    _ = &mut expired => {
                        close(&tx, &metrics, &agent, admission::Closed::Expired).await;
                        break;
                    }
                    _ = recheck.tick() => {
                        let present = agent_pod_present(&learning, &agent.pod);
                        if pod_seen && !present {
                            close(&tx, &metrics, &agent, admission::Closed::PodDeleted).await;
                            break;
                        }
                        pod_seen |= present;
                        continue;
                    }
                    changed = async {
                        let flush = async {
                            match flushed.as_mut() {
                                Some(rx) => rx.changed().await,
                                None => std::future::pending().await,
                            }
                        };
                        let evidence = async {
                            match settled.as_mut() {
                                Some(rx) => rx.changed().await,
                                None => std::future::pending().await,
                            }
                        };
                        tokio::select! {
                            changed = flush => changed,
                            changed = evidence => changed,
                        }
                    }, if !waiting.is_empty() => {
                        if changed.is_err() {
                            // The flush counter is gone: the controller is stopping. The agent
                            // resends what was not acknowledged.
                            break;
                        }
                        continue;
                    }
                };
                if window.0.elapsed() >= Duration::from_secs(1) {
                    window = (Instant::now(), 0);
                }
                window.1 += 1;
                let refusal = if let Some(status) = not_leader(&learning.writer) {
                    Some(("not_leader", status))
                } else if batch.node != agent.node {
                    Some((
                        "wrong_node",
                        Status::permission_denied(format!(
                            "batch claims node {:?} but the token belongs to a pod on node {:?}",
                            batch.node, agent.node
                        )),
                    ))
                } else if window.1 > limits.max_batches_per_second {
                    Some((
                        "rate_limited",
                        Status::resource_exhausted(format!(
                            "more than {} batches per second; slow down and reconnect",
                            limits.max_batches_per_second
                        )),
                    ))
                } else if batch.records.len() > limits.max_records_per_batch {
                    Some((
                        "too_many_records",
                        Status::invalid_argument(format!(
                            "batch {} has {} records; the limit is {}",
                            batch.sequence,
                            batch.records.len(),
                            limits.max_records_per_batch
                        )),
                    ))
                } else if waiting.len() >= MAX_WAITING_ACKS {
                    Some((
                        "writes_behind",
                        Status::unavailable(format!(
                            "{} batches wait for their proposals to be written; reconnect later \
                             (the unacknowledged batches are still to be resent)",
                            waiting.len()
                        )),
                    ))
                } else {
                    None
                };
                if let Some((reason, status)) = refusal {
                    metrics.batch_refused(reason);
                    tracing::warn!(node = %agent.node, %status, "agent stream refused");
                    let _ = tx.send(Err(status)).await;
                    break;
                }
                let Ok((reply, holds)) = merge(&learning, &agent.node, batch).await else {
                    break;
                };
                match &written {
                    Some(w) if !holds.is_nothing() => {
                        // Marked after merging: a flush that starts later takes these edges.
                        waiting.push_back((w.ledger().mark(), holds, reply));
                        // Checked again even if no flush comes: the evidence may settle first.
                        checked = (u64::MAX, u64::MAX);
                        metrics.acks_waiting.inc();
                    }
                    _ => {
                        if tx.send(Ok(reply)).await.is_err() {
                            break;
                        }
                    }
                }
            }
            metrics.acks_waiting.dec_by(waiting.len() as i64);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Tells the agent why its stream ends (it reconnects and resends what was not acknowledged).
async fn close(
    tx: &mpsc::Sender<Result<BatchAck, Status>>,
    metrics: &crate::runtime::metrics::ControllerMetrics,
    agent: &AgentIdentity,
    reason: admission::Closed,
) {
    metrics.stream_closed(reason.label());
    tracing::info!(node = %agent.node, pod = %agent.pod, reason = reason.label(), "agent stream closed");
    let _ = tx.send(Err(reason.status())).await;
}

/// Whether the index holds the agent pod `namespace/name`, not deleted.
fn agent_pod_present(learning: &Learning, pod: &str) -> bool {
    let Some((namespace, name)) = pod.split_once('/') else {
        return false;
    };
    let index = learning.index.index.read().expect("index lock");
    index.pod_exists(namespace, name)
}

/// Merges `batch` ([`Learning::take_in`]) on the blocking pool, at most one batch per core at a time.
/// Merging is CPU work: run on the async workers, a thousand busy streams would queue every other task
/// behind them, the flush that writes their edges (and releases their acknowledgements) included.
async fn merge(
    learning: &Arc<Learning>,
    node: &str,
    batch: encoded::FlowBatch,
) -> Result<(BatchAck, Holds), tokio::task::JoinError> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(Semaphore::new(cores))
    });
    // Never closed, so acquiring cannot fail; without a slot the merge would still be correct.
    let slot = slots.clone().acquire_owned().await.ok();
    let (learning, node) = (learning.clone(), node.to_string());
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        learning.take_in(&node, &batch)
    })
    .await
}

/// `UNAVAILABLE` with a hint when this replica does not lead: agents reconnect (with backoff) through the
/// Service, whose endpoints are the ready replicas, and readiness follows leadership.
fn not_leader(writer: &ProposalWriter) -> Option<Status> {
    if writer.is_leader() {
        return None;
    }
    Some(Status::unavailable(format!(
        "this controller replica is not the leader (leader: {}); reconnect through the Service",
        writer.leader_hint().unwrap_or_else(|| "unknown".into())
    )))
}

/// Decrements the gauge when dropped.
struct GaugeGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::uplink::LocalPod;
    use serde_json::json;
    use std::collections::BTreeSet;

    fn index_with_pod(node: &str) -> Index {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-web-1"},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        }))
        .unwrap();
        let mut index = Index::default();
        index.apply_pod(&pod, 1_000);
        index
    }

    /// The controller as tests of ingest need it: `index`, observations waiting up to `grace_ms`
    /// for it, accepted records handed to `evidence`.
    fn app_with(
        index: Index,
        grace_ms: i64,
        evidence: Arc<dyn crate::monitor::status_sync::EvidenceSink>,
    ) -> crate::app::App {
        crate::app::App::builder(
            network_enforcer_tests::fixture::offline_client(),
            network_enforcer_api::Backend::Kubernetes,
        )
        .index(Arc::new(SharedIndex::listed(index)))
        .configure_learner(move |l| l.with_resolution_grace(grace_ms))
        .evidence_sink(evidence)
        .build()
    }

    fn record(namespace: &str, name: &str, uid: &str) -> FlowRecord {
        FlowRecord {
            local: Some(LocalPod {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
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

    #[tokio::test]
    async fn a_record_that_does_not_decode_is_refused_alone() {
        let app = crate::app::App::builder(
            network_enforcer_tests::fixture::offline_client(),
            network_enforcer_api::Backend::Kubernetes,
        )
        .index(Arc::new(SharedIndex::listed(index_with_pod("node-a"))))
        .build();
        let good = prost::bytes::Bytes::from(record("shop", "web-1", "").encode_to_vec());
        // Field 1 (the local pod) announces 100 bytes and ends after one.
        let truncated = prost::bytes::Bytes::from_static(&[0x0a, 100, 0]);
        let batch = encoded::FlowBatch {
            sequence: 7,
            node: "node-a".into(),
            records: vec![good.clone(), truncated, good],
        };
        let (ack, _) = app.learning.take_in("node-a", &batch);
        assert_eq!((ack.sequence, ack.accepted, ack.rejected), (7, 2, 1));
        assert!(
            ack.reason.starts_with("record is not a valid FlowRecord"),
            "{}",
            ack.reason
        );
        let text = app.learner.metrics().encode();
        assert!(
            text.contains("records_rejected_total{reason=\"malformed\"} 1"),
            "{text}"
        );
    }

    /// The evidence pass judges what ingest read from a record (its local pod, the address standing
    /// for its peer), not a copy of the record: a record refused here, or one that says nothing about
    /// its flow, is not queued.
    #[tokio::test]
    async fn accepted_records_reach_the_evidence_queue_as_ingest_read_them() {
        use crate::monitor::violations::evidence::EvidenceKind;
        let queue = Arc::new(crate::monitor::status_sync::EvidenceQueue::default());
        let app = app_with(index_with_pod("node-a"), 0, queue.clone());
        let with = |uid: &str, outcome: uplink::Outcome| FlowRecord {
            outcome: outcome as i32,
            ..record("", "", uid)
        };
        let batch = FlowBatch {
            sequence: 3,
            node: "node-a".into(),
            records: vec![
                with("uid-web-1", uplink::Outcome::Established),
                with("uid-web-1", uplink::Outcome::Unspecified),
                with("uid-elsewhere", uplink::Outcome::Established),
                with("uid-web-1", uplink::Outcome::Failed),
            ],
        };
        let ack = app.learning.accept("node-a", &batch);
        assert_eq!((ack.accepted, ack.rejected), (3, 1), "{}", ack.reason);
        let queued: Vec<_> = queue
            .drain()
            .into_iter()
            .map(|e| {
                let r = e.record;
                (
                    e.kind,
                    r.local.name.clone(),
                    r.peer,
                    r.port,
                    r.opened,
                    r.at_ms,
                )
            })
            .collect();
        let peer = std::net::IpAddr::from([10, 0, 0, 9]);
        let web_1 = |kind| {
            let opened = crate::learn::Opened::Outbound;
            (kind, "web-1".to_string(), peer, 8080, opened, 2_000)
        };
        assert_eq!(
            queued,
            vec![
                web_1(EvidenceKind::WentThrough),
                web_1(EvidenceKind::Blocked)
            ]
        );
    }

    /// A labelled pod `name` at `ip` on `node`.
    fn pod_on(name: &str, ip: &str, node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                         "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
    }

    /// `batch` as it comes off an agent's stream.
    fn encoded_batch(sequence: u64, node: &str, records: &[FlowRecord]) -> encoded::FlowBatch {
        encoded::FlowBatch {
            sequence,
            node: node.into(),
            records: records
                .iter()
                .map(|r| prost::bytes::Bytes::from(r.encode_to_vec()))
                .collect(),
        }
    }

    /// The controller's watch can deliver a pod after its agent reported its first connections:
    /// those records wait for it (within the resolution grace) instead of being refused, so they
    /// are learned and judged once it comes.
    #[tokio::test]
    async fn records_that_arrive_before_their_pod_wait_for_it() {
        use crate::monitor::violations::evidence::EvidenceKind;
        let queue = Arc::new(crate::monitor::status_sync::EvidenceQueue::default());
        let mut index = index_with_pod("node-a");
        // The peer every record names (10.0.0.9).
        index.apply_pod(&pod_on("api", "10.0.0.9", "node-a"), 1_000);
        let app = app_with(index, 30_000, queue.clone());
        let failed = FlowRecord {
            outcome: uplink::Outcome::Failed as i32,
            ..record("shop", "web-2", "")
        };
        let records = [
            record("shop", "web-2", ""),
            failed,
            record("shop", "web-3", ""),
            record("shop", "never", ""),
        ];
        let (ack, holds) = app
            .learning
            .take_in("node-a", &encoded_batch(5, "node-a", &records));
        assert_eq!((ack.accepted, ack.rejected), (4, 0), "{}", ack.reason);
        assert!(holds.early && !holds.proposals.is_nothing(), "{holds:?}");
        assert_eq!(app.learning.early.len(), 4);
        assert_eq!(app.learner.pending_proposals(), 0);
        assert!(queue.drain().is_empty());

        // web-2 reaches the index on the node that reported it, web-3 on another node.
        {
            let mut index = app.index.index.write().unwrap();
            index.apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 2_000);
            index.apply_pod(&pod_on("web-3", "10.0.0.10", "node-b"), 2_000);
        }
        let now = crate::cluster::watches::now_ms();
        app.learning
            .settle_early(&app.index.index.read().unwrap(), now, true);
        assert_eq!(app.learning.early.len(), 1, "only `never` still waits");
        // web-2's egress and api's ingress.
        assert_eq!(app.learner.pending_proposals(), 2);
        let kinds: Vec<_> = queue
            .drain()
            .into_iter()
            .map(|e| (e.kind, e.record.local.name.clone()))
            .collect();
        assert_eq!(
            kinds,
            [
                (EvidenceKind::WentThrough, "web-2".to_string()),
                (EvidenceKind::Blocked, "web-2".to_string())
            ]
        );
        // The grace runs out for the pod that never comes.
        app.learning
            .settle_early(&app.index.index.read().unwrap(), now + 30_001, true);
        assert!(app.learning.early.is_empty());
        let text = app.learner.metrics().encode();
        for line in [
            "records_rejected_total{reason=\"not_on_node\"} 1",
            "records_rejected_total{reason=\"unknown_local_pod\"} 1",
            "resolutions_total{outcome=\"local_pod_deferred\"} 4",
            "resolutions_total{outcome=\"local_pod_deferred_resolved\"} 2",
            "resolutions_total{outcome=\"local_pod_deferred_expired\"} 1",
            "records_waiting_for_pod 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    /// Evidence whose marks can be settled by hand.
    #[derive(Default)]
    struct Marks {
        handed: std::sync::atomic::AtomicU64,
        taken: std::sync::atomic::AtomicU64,
        settled: std::sync::atomic::AtomicU64,
    }

    impl crate::monitor::status_sync::EvidenceSink for Marks {
        fn accepted(&self, _: Evidence) {
            self.handed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn hold(&self) -> Option<u64> {
            Some(self.taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
        }
        fn settled_after(&self, mark: u64) -> bool {
            self.settled.load(std::sync::atomic::Ordering::SeqCst) > mark
        }
    }

    /// A batch whose records waited for their pod is acknowledged once its wait is over and a flush
    /// wrote what they taught, and then only once the evidence they gave (handed in after the batch
    /// was merged) is in statuses: an agent forgets what was acknowledged.
    #[tokio::test]
    async fn a_batch_that_waited_for_its_pod_is_acknowledged_after_its_evidence() {
        use std::sync::atomic::Ordering;
        let marks = Arc::new(Marks::default());
        let app = app_with(index_with_pod("node-a"), 20, marks.clone());
        // A failed attempt: evidence, nothing to learn (and so nothing for the flush to write).
        let failed = FlowRecord {
            outcome: uplink::Outcome::Failed as i32,
            ..record("shop", "web-2", "")
        };
        let (ack, mut holds) = app
            .learning
            .take_in("node-a", &encoded_batch(1, "node-a", &[failed]));
        assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
        let mark = app.flusher.ledger().mark();
        let ledger = app.flusher.ledger();
        assert!(!holds.ready(mark, ledger, Some(&*marks)), "no flush yet");

        app.index
            .index
            .write()
            .unwrap()
            .apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 2_000);
        tokio::time::sleep(Duration::from_millis(30)).await;
        // The flush settles the record first: judged now, after the batch was merged.
        app.flusher.flush().await;
        assert_eq!(marks.handed.load(Ordering::SeqCst), 1);
        assert!(
            !holds.ready(mark, ledger, Some(&*marks)),
            "its evidence is not in a status yet"
        );
        assert_eq!(holds.evidence, Some(1), "the mark taken after the wait");
        marks.settled.store(2, Ordering::SeqCst);
        assert!(holds.ready(mark, ledger, Some(&*marks)));
    }

    #[test]
    fn records_name_the_pod_by_name_or_by_uid() {
        let index = index_with_pod("node-a");
        let by_name = observation(&record("shop", "web-1", ""), &index, "node-a")
            .unwrap()
            .unwrap();
        let by_uid = observation(&record("", "", "uid-web-1"), &index, "node-a")
            .unwrap()
            .unwrap();
        assert_eq!(by_name, by_uid);
        assert_eq!(
            (by_uid.local.namespace.as_str(), by_uid.local.name.as_str()),
            ("shop", "web-1")
        );
    }

    #[test]
    fn records_for_pods_elsewhere_or_unknown_are_refused() {
        let index = index_with_pod("node-a");
        for r in [record("shop", "web-1", ""), record("", "", "uid-web-1")] {
            assert!(matches!(
                observation(&r, &index, "node-b"),
                Err(BadRecord::NotOnNode(..))
            ));
        }
        assert!(matches!(
            observation(&record("", "", "uid-nope"), &index, "node-a"),
            Err(BadRecord::UnknownLocalPod(..))
        ));
        let mut failed = record("shop", "web-1", "");
        failed.outcome = uplink::Outcome::Failed as i32;
        assert_eq!(
            observation(&failed, &index, "node-a"),
            Ok(None),
            "failed attempts teach nothing"
        );
    }

    #[test]
    fn an_unknown_peer_address_falls_back_to_the_pod_the_source_named() {
        let mut index = index_with_pod("node-a");
        let peer: Pod = serde_json::from_value(json!({
            "metadata": {"name": "db-0", "namespace": "shop", "uid": "uid-db-0"},
            "spec": {"nodeName": "node-b", "serviceAccountName": "db", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.20"}
        }))
        .unwrap();
        index.apply_pod(&peer, 1_000);
        // The address (e.g. after SNAT) is no pod; Hubble named the peer pod.
        let mut r = record("shop", "web-1", "");
        r.peer_ip = vec![192, 0, 2, 1];
        let plain = observation(&r, &index, "node-a").unwrap().unwrap();
        assert_eq!(plain.peer, "192.0.2.1".parse::<std::net::IpAddr>().unwrap());
        r.peer = Some(uplink::Peer {
            namespace: "shop".into(),
            pod: "db-0".into(),
            principal: String::new(),
        });
        let named = observation(&r, &index, "node-a").unwrap().unwrap();
        assert_eq!(named.peer, "10.0.0.20".parse::<std::net::IpAddr>().unwrap());
        // ztunnel names it by principal only.
        r.peer = Some(uplink::Peer {
            principal: "cluster.local/ns/shop/sa/db".into(),
            ..uplink::Peer::default()
        });
        assert_eq!(observation(&r, &index, "node-a").unwrap().unwrap(), named);
    }

    #[test]
    fn times_in_the_future_are_clamped_to_now() {
        let now = 1_000_000;
        // (first, last) → expected (first, last), borrowed?
        let cases = [
            ((900_000, 999_000), (900_000, 999_000), true),
            (
                (900_000, now + CLOCK_SKEW_MS),
                (900_000, now + CLOCK_SKEW_MS),
                true,
            ),
            ((900_000, i64::MAX), (900_000, now), false),
            ((i64::MAX, i64::MAX), (now, now), false),
            (
                (now + 2 * CLOCK_SKEW_MS, now + 3 * CLOCK_SKEW_MS),
                (now, now),
                false,
            ),
        ];
        for ((first, last), expected, borrowed) in cases {
            let r = FlowRecord {
                first_seen_ms: first,
                last_seen_ms: last,
                ..FlowRecord::default()
            };
            let c = clamp_times(&r, now);
            assert_eq!(matches!(c, Cow::Borrowed(_)), borrowed, "{first} {last}");
            assert_eq!(
                (c.first_seen_ms, c.last_seen_ms),
                expected,
                "{first} {last}"
            );
        }
    }

    #[test]
    fn waits_for_names_each_proposal_once_up_to_its_bound() {
        let mut w = WaitsFor::default();
        assert!(w.is_nothing());
        w.add(3);
        w.add(3);
        assert_eq!(w, {
            let mut once = WaitsFor::default();
            once.add(3);
            once
        });
        assert!(!w.is_nothing());
        for k in 0..WaitsFor::MAX_PROPOSALS as u64 * 2 {
            w.add(k);
        }
        assert_eq!(w, WaitsFor::everything(), "past the bound it waits for all");
        assert!(w.written_despite(0, &BTreeSet::new()));
        assert!(!w.written_despite(0, &BTreeSet::from([1_000_000])));
    }

    #[test]
    fn a_review_must_authenticate_our_audience_our_account_and_a_pod() {
        use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
        let agent = "system:serviceaccount:ne:agent";
        let status = |authenticated: bool, audiences: Option<&[&str]>, user: &str, pod: bool| {
            TokenReviewStatus {
                authenticated: Some(authenticated),
                audiences: audiences.map(|a| a.iter().map(|s| s.to_string()).collect()),
                user: Some(UserInfo {
                    username: Some(user.to_string()),
                    extra: pod.then(|| {
                        [
                            (
                                "authentication.kubernetes.io/pod-name".to_string(),
                                vec!["agent-x".to_string()],
                            ),
                            (
                                "authentication.kubernetes.io/pod-uid".to_string(),
                                vec!["u1".to_string()],
                            ),
                        ]
                        .into()
                    }),
                    ..UserInfo::default()
                }),
                ..TokenReviewStatus::default()
            }
        };
        let ours: &[&str] = &[AUDIENCE];
        // (status, expected: Ok(pod) or the refusal's code)
        let cases = [
            (status(true, Some(ours), agent, true), Ok("agent-x")),
            (
                status(true, Some(&["api", AUDIENCE]), agent, true),
                Ok("agent-x"),
            ),
            (
                status(false, Some(ours), agent, true),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                status(true, None, agent, true),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                status(true, Some(&[]), agent, true),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                status(true, Some(&["https://kubernetes.default.svc"]), agent, true),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                status(true, Some(ours), "system:serviceaccount:ne:other", true),
                Err(tonic::Code::PermissionDenied),
            ),
            (
                status(true, Some(ours), agent, false),
                Err(tonic::Code::PermissionDenied),
            ),
        ];
        for (i, (status, expected)) in cases.into_iter().enumerate() {
            let got = reviewed_agent(&status, agent);
            match expected {
                Ok(pod) => assert_eq!(
                    got.ok(),
                    Some((pod.to_string(), Some("u1".to_string()))),
                    "case {i}"
                ),
                Err(code) => assert_eq!(got.map_err(|e| e.code()).err(), Some(code), "case {i}"),
            }
        }
    }

    #[test]
    fn deleted_pods_resolve_for_the_history_window_then_are_forgotten() {
        let mut index = index_with_pod("node-a");
        assert!(index.pod_exists("shop", "web-1"));
        index.delete_pod("shop", "web-1", 5_000);
        assert!(
            index.pod_by_uid("uid-web-1").is_some(),
            "late records still resolve"
        );
        assert!(
            !index.pod_exists("shop", "web-1"),
            "but the pod is gone (an agent pod's stream closes)"
        );
        index.forget_expired(5_000 + crate::cluster::index::IP_HISTORY_MS + 1);
        assert!(index.pod_by_uid("uid-web-1").is_none());
        assert!(index.pod("shop", "web-1").is_none());
    }
}
