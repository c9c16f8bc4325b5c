//! Taking in a batch: each record decoded, checked against the agent's node, learned from and
//! handed on as evidence, or left to wait for its pod.

use super::*;

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
    learns.then(|| ReportedConnection::of(decoded, reporter))
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
        self.take_in_as(node, batch.sequence, records, Reporter::Node, true, None)
            .0
    }

    /// [`Learning::accept`] for records of a cluster-wide source the controller reads itself (Calico
    /// Goldmane), filed under the node of their local pod: they may teach both sides of a connection.
    pub fn accept_from_cluster_source(&self, node: &str, batch: &FlowBatch) -> BatchAck {
        let records = batch.records.iter().map(|r| Ok(Cow::Borrowed(r)));
        self.take_in_as(node, batch.sequence, records, Reporter::Cluster, true, None)
            .0
    }

    /// [`Learning::accept`] for a batch as it came off an agent's stream, its records decoded one by
    /// one here (a record that does not decode is refused alone), also saying what the
    /// acknowledgement must wait for: the proposals the batch gave edges no flush has decided yet,
    /// and the status patch of its violation evidence.
    ///
    /// A batch resent after its evidence was handed on ([`claims`]) is taken in for learning only,
    /// and waits for what its first attempt waits for ([`Holds::repeat_of`]).
    pub fn take_in(&self, node: &str, batch: &encoded::FlowBatch) -> (BatchAck, Holds) {
        let name = claims::BatchName {
            node,
            instance: batch.instance,
            sequence: batch.sequence,
        };
        let (attempt, dropped) = self.claims.begin(name);
        let metrics = self.learner.metrics();
        if dropped.batches > 0 {
            metrics.evidence_claims_dropped.inc_by(dropped.batches);
        }
        if !attempt.counts() {
            metrics.batch_repeats.inc();
            tracing::debug!(
                node,
                instance = batch.instance,
                sequence = batch.sequence,
                "a resent batch: learned from, its evidence not counted again"
            );
        }
        let records = batch.records.iter().map(|bytes| {
            FlowRecord::decode(bytes.clone())
                .map(Cow::Owned)
                .map_err(BadRecord::Malformed)
        });
        let gate = match &attempt {
            claims::Attempt::First(Some(claimed)) => Some(claimed.gate.clone()),
            _ => None,
        };
        let (ack, mut holds) = self.take_in_as(
            node,
            batch.sequence,
            records,
            Reporter::Node,
            attempt.counts(),
            gate.as_ref(),
        );
        holds.gate = gate;
        let first = match attempt {
            claims::Attempt::First(claimed) => claimed.map(|c| c.first),
            claims::Attempt::Repeat(first) => {
                holds.repeat_of = Some(Box::new(RepeatOf::new(first)));
                None
            }
            claims::Attempt::Counted => None,
        };
        holds.claim = (batch.instance != 0).then(|| Claim {
            instance: batch.instance,
            sequence: batch.sequence,
            first,
        });
        (ack, holds)
    }

    fn take_in_as<'a>(
        &self,
        node: &str,
        sequence: u64,
        records: impl ExactSizeIterator<Item = Result<Cow<'a, FlowRecord>, BadRecord>>,
        reporter: Reporter,
        counts: bool,
        gate: Option<&ClaimGate>,
    ) -> (BatchAck, Holds) {
        let index = self.index.index.read().expect("index lock");
        let metrics = self.learner.metrics();
        let now_ms = crate::cluster::watches::now_ms();
        if self.early.due(now_ms) {
            self.settle_early(&index, now_ms, false);
        }
        let (mut accepted, mut rejected, mut reason) = (0u32, 0u32, String::new());
        let mut waits = WaitsFor::default();
        let mut evidence = Handed::default();
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
                    counts,
                    gate,
                };
                let taken = self.take_one(&index, from, &record, &mut waits, &mut evidence);
                match taken {
                    Err(BadRecord::UnknownLocalPod(pod)) => {
                        let grace_ms = self.learner.resolution_grace_ms();
                        match self.early.hold_as(
                            node,
                            reporter,
                            &record,
                            now_ms,
                            grace_ms,
                            claims::Counts { counts, gate },
                        ) {
                            Ok(until_ms) => {
                                metrics.resolved("local_pod_deferred", 1);
                                metrics.records_waiting_for_pod.inc();
                                waits.defer_until(until_ms);
                                evidence.later |= counts;
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
                    .filter(|_| evidence.now)
                    .and_then(|e| e.hold()),
                evidence_later: evidence.later,
                ..Holds::default()
            },
        )
    }

    /// Takes in one record as it arrived (`from`): learns from it (adding what its
    /// acknowledgement waits for to `waits`) and hands it to the evidence sink, now or, when it is a
    /// blocked connection whose peer the index cannot place yet, once the learner's wait for the
    /// index is over ([`Learner::evidence_or_wait`]; noted in `evidence`). `Ok(Err(_))`: accepted but
    /// not resolvable.
    fn take_one(
        &self,
        index: &Index,
        from: Arrival<'_>,
        record: &FlowRecord,
        waits: &mut WaitsFor,
        evidence: &mut Handed,
    ) -> Result<Result<(), String>, BadRecord> {
        let metrics = self.learner.metrics();
        if flow_record::is_resolution(record) {
            let resolution = flow_record::decode_resolution(record, index, Some(from.node))?;
            metrics.resolved(self.resolved(index, &resolution), 1);
            return Ok(Ok(()));
        }
        let decoded = flow_record::decode(record, index, Some(from.node))?;
        if let Some(why) = decoded.peer_name.left_out() {
            metrics.resolved(why, 1);
            tracing::debug!(node = from.node, why, "a record's peer name was left out");
        }
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
        if let Some(sink) = self.evidence.as_ref().filter(|_| from.counts)
            && let Some(mut e) = Evidence::of(record, decoded)
        {
            e.claim = from.gate.cloned();
            match self.learner.evidence_or_wait(index, e, from.at_ms, waits) {
                Some(e) => {
                    sink.accepted(e);
                    evidence.now = true;
                }
                None => evidence.later = true,
            }
        }
        Ok(learning)
    }

    /// Keeps what a resolution says for protect policies (`cluster::names`); returns the `outcome`
    /// of `resolutions_total` it counts as.
    fn resolved(&self, index: &Index, r: &flow_record::Resolution) -> &'static str {
        let Some(names) = &self.names else {
            return "name_resolution_unused";
        };
        // Only outside addresses: a name of a pod or a Service is what the index says it is.
        if !matches!(
            index.resolve_ref(r.address, 0, Protocol::TCP, r.at_ms),
            ResolvedRef::Address(FlowEnd::External(_), _)
        ) {
            return "name_resolution_in_cluster";
        }
        let w = &r.local.endpoint;
        let kind = match (w.kind, &w.foreign_controller) {
            (Some(kind), _) => kind,
            (None, None) => WorkloadKind::Pod,
            // No policy can target it.
            (None, Some(_)) => return "name_resolution_unused",
        };
        let key = WorkloadKey {
            namespace: w.namespace.clone(),
            kind,
            name: w.name.clone(),
        };
        match names.observe(key, &r.name, r.address, r.at_ms) {
            Change::NewAddress => {
                tracing::debug!(
                    namespace = %w.namespace, workload = %w.name, name = %r.name, address = %r.address,
                    "a name has a new address"
                );
                "name_resolution_new"
            }
            Change::Refreshed => "name_resolution_known",
        }
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
                counts: early.counts,
                gate: early.gate.as_ref(),
            };
            // Its batch's acknowledgement already waits for the grace from its arrival, and then
            // takes the evidence mark again (`Holds::evidence_later`).
            let taken = self.take_one(
                index,
                from,
                &early.record,
                &mut WaitsFor::default(),
                &mut Handed::default(),
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

/// Whether a batch's evidence went to the evidence sink now, and whether some of it will later (it
/// waits for its pod, or for its peer): what its acknowledgement waits for ([`Holds`]).
#[derive(Clone, Copy, Debug, Default)]
struct Handed {
    now: bool,
    later: bool,
}

/// Who sent a record (the node whose stream it came on, and as what) and when it arrived.
#[derive(Clone, Copy, Debug)]
struct Arrival<'a> {
    node: &'a str,
    reporter: Reporter,
    at_ms: i64,
    /// Whether its records count as violation evidence (not a resent batch's: [`claims`]).
    counts: bool,
    /// Its batch's claim, which the evidence pass tells when a record of it counted.
    gate: Option<&'a ClaimGate>,
}
