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
        let metrics = &self.metrics;
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
        let metrics = &self.metrics;
        let now_ms = crate::cluster::watches::now_ms();
        if self.waiting.due(now_ms) {
            self.settle(&index, now_ms, Look::Batch);
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
                        let counts = claims::Counts { counts, gate };
                        match self.waiting.record(node, reporter, &record, now_ms, counts) {
                            Ok(until_ms) => {
                                waits.defer_until(until_ms);
                                evidence.later |= counts.counts;
                                Ok(Ok(()))
                            }
                            Err(_) => Err(BadRecord::UnknownLocalPod(pod)),
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

    /// Takes in one record as it arrived (`from`): learns from it, now or once the index places
    /// its peer (adding what its acknowledgement waits for to `waits`), and hands it to the evidence
    /// sink, now or, when it is a blocked connection whose peer the index cannot place yet, once its
    /// wait is over ([`waiting`]; noted in `evidence`). `Ok(Err(_))`: accepted but not resolvable.
    fn take_one(
        &self,
        index: &Index,
        from: Arrival<'_>,
        record: &FlowRecord,
        waits: &mut WaitsFor,
        evidence: &mut Handed,
    ) -> Result<Result<(), String>, BadRecord> {
        let metrics = &self.metrics;
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
                self.learn_or_wait(index, from.node, &o, from.at_ms, waits)
            }
            None => {
                metrics.resolved("not_learned", 1);
                Ok(())
            }
        };
        let peer = decoded.peer;
        if let Some(sink) = self.evidence.as_ref().filter(|_| from.counts)
            && let Some(mut e) = Evidence::of(record, decoded)
        {
            e.claim = from.gate.cloned();
            match self
                .waiting
                .evidence(index, from.node, from.reporter, e, from.at_ms)
            {
                Ok(e) => {
                    sink.accepted(e);
                    evidence.now = true;
                }
                Err(until_ms) => {
                    tracing::debug!(%peer, node = from.node,
                        "a blocked connection waits for the index to place its peer");
                    waits.defer_until(until_ms);
                    evidence.later = true;
                }
            }
        }
        Ok(learning)
    }

    /// Learns `obs`, from `node`, now or, when the index cannot place its peer yet, once it does or
    /// the grace is over ([`waiting`]); its batch's acknowledgement waits as long (`waits`).
    fn learn_or_wait(
        &self,
        index: &Index,
        node: &str,
        obs: &ReportedConnection,
        now_ms: i64,
        waits: &mut WaitsFor,
    ) -> Result<(), String> {
        let flows = match self.waiting.observation(index, node, obs, now_ms) {
            Admitted::Now(flows) => flows,
            // A repeat's batch waits for its own grace: usually the observation it repeats was
            // decided and written by then; when not, that one's own batch still waits for it.
            Admitted::Waits(until_ms) | Admitted::Repeat(until_ms) => {
                waits.defer_until(until_ms);
                return Ok(());
            }
        };
        self.learner
            .learn(index, obs, flows, waits)
            .map(|_| ())
            .map_err(|e| e.to_string())
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

    /// Decides what waited for the index ([`waiting`]) and is placed now or out of grace at
    /// `now_ms` (`i64::MAX`: everything, on the way out): records whose pod the index now knows are
    /// taken in, those out of grace refused; observations are learned and evidence handed on as the
    /// index resolves them now. Called by batches as they come (records only, and not when another
    /// thread is at it) and before every flush (even when none waits: a batch's look may have taken
    /// the last ones out and be merging them).
    pub fn settle(&self, index: &Index, now_ms: i64, look: Look) {
        let Some(_settling) = self.waiting.settling(look == Look::Flush) else {
            return;
        };
        // A record taken in may wait for its peer in turn, as of its arrival: when that wait is over
        // too, a second look decides it now, as the flush that releases its batch expects.
        for _ in 0..2 {
            let decided = self.waiting.take_decided(index, now_ms, look);
            let taken_in = decided.records.iter().any(|(_, placed)| *placed);
            self.decide(index, now_ms, decided);
            if !taken_in {
                break;
            }
        }
    }

    /// Takes in, refuses, learns and hands on what [`Learning::settle`] took out.
    fn decide(&self, index: &Index, now_ms: i64, decided: waiting::Decided) {
        let metrics = &self.metrics;
        // One log line per settling, not per record: a hostile agent may name many pods.
        let mut refused: Option<(u64, Arc<str>, BadRecord)> = None;
        let mut expired: Option<(u64, Arc<str>, String)> = None;
        for (early, placed) in decided.records {
            if !placed {
                let first = expired.get_or_insert_with(|| {
                    let pod = early.record.local.as_ref().map(flow_record::describe_local);
                    (0, early.node.clone(), pod.unwrap_or_default())
                });
                first.0 += 1;
                continue;
            }
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
            if let Err(why) = taken {
                metrics.record_rejected(why.label());
                let first = refused.get_or_insert((0, early.node.clone(), why));
                first.0 += 1;
            }
        }
        if let Some((records, node, reason)) = refused {
            tracing::warn!(records, first_node = %node, first_reason = %reason,
                "refused records that waited for their pod");
        }
        if let Some((records, node, pod)) = expired {
            if now_ms == i64::MAX {
                // On the way out: not refused, their batches are not acknowledged and come again.
                tracing::info!(
                    records,
                    "records still waiting for their pods are left to their agents to send again"
                );
            } else {
                metrics.records_rejected_by("unknown_local_pod", records);
                tracing::warn!(records, first_node = %node, first_pod = %pod,
                    "refused records: their pods did not reach the index within the resolution grace");
            }
        }
        let mut edges = 0;
        for (obs, flows) in decided.observations {
            edges += self
                .learner
                .learn(index, &obs, flows, &mut WaitsFor::default())
                .unwrap_or(0);
        }
        if edges > 0 {
            tracing::debug!(
                edges,
                waiting = self.waiting.len(),
                "learned flows that waited for the index"
            );
        }
        if let Some(sink) = &self.evidence {
            for e in decided.evidence {
                sink.accepted(e);
            }
        }
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
