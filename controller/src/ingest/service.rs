//! The gRPC service: an agent's stream, from authentication to the acknowledgement of each batch.

use super::*;

/// Acknowledgements of one stream that wait for a flush, oldest first, with the mark of each.
/// Bounded: an agent that keeps sending while nothing gets written is told to back off.
const MAX_WAITING_ACKS: usize = 4096;

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
            self.learning.metrics.batch_refused("index_not_synced");
            return Err(Status::unavailable(
                "the controller is still listing the cluster; retry shortly",
            ));
        }
        let metrics = self.learning.metrics.clone();
        if let Some(status) = not_leader(self.learning.leader.as_ref()) {
            metrics.batch_refused("not_leader");
            return Err(status);
        }
        if !self.learning.claims.ready() {
            metrics.batch_refused("claims_unread");
            return Err(Status::unavailable(
                "the controller is reading the evidence claims the last leader persisted; retry shortly",
            ));
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
        // The node counts as observed while the stream lives (dropped with the stream's task).
        let present = self
            .presence
            .connected(&agent.node, crate::cluster::watches::now_ms());
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let learning = self.learning.clone();
        let limits = self.limits.clone();
        let written = self.written.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let metrics = learning.metrics.clone();
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
            let mut waiting: VecDeque<(u64, Holds, BatchAck, Option<Claim>)> = VecDeque::new();
            let mut flushed = written.as_ref().map(|w| w.subscribe());
            let evidence = learning.evidence.clone();
            let mut settled = evidence.as_ref().and_then(|e| e.settled());
            // The (flush, settled evidence) `waiting` was last checked against.
            let mut checked = (0, 0);
            let mut inbound_open = true;
            'stream: loop {
                let now = (
                    written.as_ref().map_or(0, |w| w.latest()),
                    settled.as_ref().map_or(0, |s| *s.borrow()),
                );
                if let Some(w) = written.as_ref().filter(|_| now != checked) {
                    checked = now;
                    let mut ready = Vec::new();
                    for (mark, mut holds, ack, claim) in std::mem::take(&mut waiting) {
                        if holds.ready(mark, w, evidence.as_deref()) {
                            ready.push((ack, claim));
                        } else {
                            waiting.push_back((mark, holds, ack, claim));
                        }
                    }
                    for (ack, claim) in ready {
                        metrics.acks_waiting.dec();
                        if tx.send(Ok(ack)).await.is_err() {
                            break 'stream;
                        }
                        acknowledged(&learning, &agent.node, claim.as_ref());
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
                        // Checked again even when the value is the same: the evidence sink also
                        // wakes streams when claims were persisted (`ClaimGate`).
                        checked = (u64::MAX, u64::MAX);
                        continue;
                    }
                };
                if window.0.elapsed() >= Duration::from_secs(1) {
                    window = (Instant::now(), 0);
                }
                window.1 += 1;
                let refusal = if let Some(status) = not_leader(learning.leader.as_ref()) {
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
                if let Some(health) = batch.health {
                    present.reported(batch.instance, health);
                }
                let Ok((reply, mut holds)) = merge(&learning, &agent.node, batch).await else {
                    break;
                };
                // Marked after merging: a flush that starts later takes these edges.
                let mark = written.as_ref().map_or(0, |w| w.mark());
                let claim = holds.claim.take();
                if let Some(claim) = &claim
                    && let Some(first) = &claim.first
                {
                    let name = claims::BatchName {
                        node: &agent.node,
                        instance: claim.instance,
                        sequence: claim.sequence,
                    };
                    let forgotten = learning.claims.merged(name, first, mark, &holds);
                    metrics.evidence_claims_dropped.inc_by(forgotten);
                }
                match &written {
                    Some(_) if !holds.is_nothing() => {
                        waiting.push_back((mark, holds, reply, claim));
                        // Checked again even if no flush comes: the evidence may settle first.
                        checked = (u64::MAX, u64::MAX);
                        metrics.acks_waiting.inc();
                    }
                    _ => {
                        if tx.send(Ok(reply)).await.is_err() {
                            break;
                        }
                        acknowledged(&learning, &agent.node, claim.as_ref());
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

/// The acknowledgement of `claim`'s batch went out: a resend of it is learned from only.
fn acknowledged(learning: &Learning, node: &str, claim: Option<&Claim>) {
    if let Some(claim) = claim {
        let forgotten = learning.claims.acknowledged(claims::BatchName {
            node,
            instance: claim.instance,
            sequence: claim.sequence,
        });
        learning.metrics.evidence_claims_dropped.inc_by(forgotten);
    }
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
fn not_leader(leader: &dyn Leading) -> Option<Status> {
    if leader.is_leader() {
        return None;
    }
    Some(Status::unavailable(format!(
        "this controller replica is not the leader (leader: {}); reconnect through the Service",
        leader.leader_hint().unwrap_or_else(|| "unknown".into())
    )))
}

/// Decrements the gauge when dropped.
struct GaugeGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
