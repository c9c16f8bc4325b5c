//! The proposal writer: writes one proposal's learned edges into the API server (docs/behaviour.md
//! §1.8 to §1.10). The [`crate::learn::flusher::Flusher`] calls it once per proposal and flush with the
//! edges the [`crate::learn::learner::Learner`] collected.
//!
//! A write computes the full desired spec from the current object plus the new edges
//! ([`learn::merge_within`], linear in rules + edges) and writes only when that changes it, with
//! optimistic concurrency (resourceVersion, retried on 409) and field manager `network-enforcer`.
//! The current object comes from the shared watch of proposals when it holds the proposal
//! ([`ProposalWriter::with_cache`]): under a burst of new edges the API server's time is the limit,
//! and a GET was a third of the requests of a write. A cached copy that lags fails the replace with
//! 409, and the retry reads the object; a decision not to write (nothing new, another backend, not
//! signed) is taken on the object read from the API only, since a lagging copy may still hold what
//! was deleted or edited out since. A
//! proposal whose policy exists is left alone, so a promoted proposal is never re-created; one whose
//! spec the controller did not sign is not written into. What the limits left out is counted, logged
//! and reported with `ExternalPeersCapped` / `LearningCapped` Events on the proposal.

use crate::learn::flush_report::FlushReport;
use crate::learn::learner::MAX_PENDING_EDGES;
use crate::learn::provenance::{Provenance, SigningKey};
use crate::learn::{self, Edge, Target};
use crate::runtime::metrics::ControllerMetrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use network_enforcer_api::keys::{FIELD_MANAGER, PROMOTED_FROM_LABEL};
use network_enforcer_api::naming::promoted_from_value;
use network_enforcer_api::{
    Backend, Protocol, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How many times a write is retried on a conflict within one flush.
const CONFLICT_RETRIES: usize = 3;

/// The most a proposal may weigh as JSON: etcd refuses objects over 1.5 MiB, and a proposal this big is
/// no longer reviewable anyway. Edges that would pass it are left out and reported.
pub const MAX_PROPOSAL_BYTES: usize = 1024 * 1024;

/// Whether the API server refused a write for what it holds (invalid, or too large), or holds a
/// proposal (or a policy of its name) this build cannot read (a newer release's values): writing the
/// same edges again cannot succeed, so they are dropped (and reported) instead of holding up every
/// agent's acknowledgements. (A write whose answer alone does not decode happened: [`ProposalWriter::write`]
/// counts it written.)
pub fn refused_for_good(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if matches!(e.code, 400 | 413 | 422))
        || matches!(error, kube::Error::SerdeError(_))
}

/// See the module docs.
pub struct ProposalWriter {
    client: Client,
    backend: Backend,
    recorder: Recorder,
    metrics: ControllerMetrics,
    /// Leadership, when replicas elect a leader; `None`: this replica always writes.
    leader: Option<tokio::sync::watch::Receiver<crate::runtime::leader::Leadership>>,
    /// Signs every proposal written, and leaves alone those not signed with it.
    signing_key: Option<Arc<SigningKey>>,
    /// What one proposal may hold.
    limits: learn::Limits,
    /// The proposals the reconcilers watch; `None`: every write reads its proposal from the API.
    cache: Option<Store<WorkloadNetworkPolicyProposal>>,
}

impl ProposalWriter {
    /// A writer of `backend` proposals through `client`.
    pub fn new(client: Client, backend: Backend) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            },
        );
        Self {
            client,
            backend,
            recorder,
            metrics: ControllerMetrics::new(),
            leader: None,
            signing_key: None,
            limits: learn::Limits::default(),
            cache: None,
        }
    }

    /// Starts each write from `proposals`' copy of its proposal, when it has one, instead of a GET
    /// (see the module docs). A proposal missing from it is read from the API: a watch that has not
    /// caught up yet is no proof that the proposal does not exist.
    pub fn with_cache(mut self, proposals: Store<WorkloadNetworkPolicyProposal>) -> Self {
        self.cache = Some(proposals);
        self
    }

    /// The cached copy of proposal `namespace/name`, if the cache holds it.
    fn cached(&self, namespace: &str, name: &str) -> Option<WorkloadNetworkPolicyProposal> {
        let cache = self.cache.as_ref()?;
        let proposal = cache.get(&ObjectRef::new(name).within(namespace))?;
        Some(proposal.as_ref().clone())
    }

    /// Merges within `limits` (the learner's: [`crate::learn::learner::Learner::limits`]).
    pub fn with_limits(mut self, limits: learn::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Writes only while `leadership` says this replica leads; the ingest feeding this writer refuses
    /// agents' streams otherwise (they reconnect through the Service and land on the leader).
    pub fn with_leader(
        mut self,
        leadership: tokio::sync::watch::Receiver<crate::runtime::leader::Leadership>,
    ) -> Self {
        self.leader = Some(leadership);
        self
    }

    /// Whether this replica may write (always, without leader election).
    pub fn is_leader(&self) -> bool {
        self.leader.as_ref().is_none_or(|l| l.borrow().leader)
    }

    /// The leader last seen, for the hint in refusals.
    pub fn leader_hint(&self) -> Option<String> {
        self.leader.as_ref().and_then(|l| l.borrow().holder.clone())
    }

    /// Signs every proposal it writes with `key`, and does not write into a proposal whose spec is not
    /// what it signed ([`crate::learn::provenance`]).
    pub fn with_signing_key(mut self, key: Option<Arc<SigningKey>>) -> Self {
        self.signing_key = key;
        self
    }

    /// Counts into `metrics` (the process's registry) instead of a private one.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics this writer counts into.
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    /// Counts what one proposal's write did, from the report before and after it.
    pub fn count(&self, before: &FlushReport, after: &FlushReport, failed: bool) {
        for _ in before.conflicts..after.conflicts {
            self.metrics.proposal_write("conflict");
        }
        if failed {
            self.metrics.proposal_write("failed");
        } else if after.created > before.created {
            self.metrics.proposal_write("created");
        } else if after.written > before.written {
            self.metrics.proposal_write("updated");
        } else if after.promoted > before.promoted {
            self.metrics.proposal_write("promoted");
        } else {
            self.metrics.proposal_write("unchanged");
        }
    }

    /// Counts, logs and reports with Events on `proposal` what the merge left out: external peers past
    /// the fan-out cap (`ExternalPeersCapped`), ports, peers and edges past the other limits
    /// (`LearningCapped`).
    async fn report_capped(
        &self,
        target: &Target,
        proposal: Option<&WorkloadNetworkPolicyProposal>,
        merged: &learn::Merged,
        (pending_capped, overflow): (&BTreeMap<(Protocol, u16), usize>, usize),
        size_capped: usize,
        report: &mut FlushReport,
    ) {
        // Those refused while pending were counted then; those the merge refused are counted now.
        let merge_total: usize = merged.capped.values().sum();
        self.metrics.resolved("external_capped", merge_total as u64);
        let mut external = pending_capped.clone();
        for (port, n) in &merged.capped {
            *external.entry(*port).or_default() += n;
        }
        if !external.is_empty() {
            report.capped += external.values().sum::<usize>();
            let ports: Vec<String> = external
                .iter()
                .map(|((proto, port), n)| format!("{n} on {}/{port}", proto.as_str()))
                .collect();
            let note = format!(
                "external peers not learned: {} (at most {} addresses per port; raise \
                 --max-external-peers-per-port, or add a CIDR rule to the policy)",
                ports.join(", "),
                self.limits.max_external_peers
            );
            self.warn_event(target, proposal, "ExternalPeersCapped", note)
                .await;
        }
        let mut parts = Vec::new();
        for (n, outcome, what) in [
            (
                merged.ports_capped,
                "ports_capped",
                format!(
                    "ports on rules already holding {} port entries (--max-ports-per-rule)",
                    self.limits.max_ports_per_rule
                ),
            ),
            (
                merged.rules_capped,
                "rules_capped",
                format!(
                    "peers past {} rules (--max-rules-per-proposal)",
                    self.limits.max_rules
                ),
            ),
            (
                overflow,
                "pending_overflow",
                format!(
                    "edges past {MAX_PENDING_EDGES} waiting for one write (learned later if seen again)"
                ),
            ),
            (
                size_capped,
                "size_capped",
                format!(
                    "edges that would take the object past {} KiB",
                    MAX_PROPOSAL_BYTES / 1024
                ),
            ),
        ] {
            if n > 0 {
                report.capped += n;
                self.metrics.resolved(outcome, n as u64);
                parts.push(format!("{n} {what}"));
            }
        }
        if !parts.is_empty() {
            let note = format!(
                "not learned: {}; a workload reaching this many ports or peers is better allowed by \
                 a hand-written range or CIDR rule",
                parts.join(", ")
            );
            self.warn_event(target, proposal, "LearningCapped", note)
                .await;
        }
    }

    /// Logs `note` and publishes it as a Warning Event with `reason` on `proposal`, if it exists.
    async fn warn_event(
        &self,
        target: &Target,
        proposal: Option<&WorkloadNetworkPolicyProposal>,
        reason: &str,
        note: String,
    ) {
        tracing::warn!(proposal = %target.name(), namespace = %target.workload.namespace, %note, reason,
            "learning limited");
        if let Some(p) = proposal {
            crate::runtime::events::publish_with(
                &self.recorder,
                &p.object_ref(&()),
                EventType::Warning,
                reason,
                "Learn",
                note,
            )
            .await;
        }
    }

    /// Whether a policy was promoted from proposal `namespace/name`.
    async fn promoted(&self, namespace: &str, name: &str) -> Result<bool, kube::Error> {
        let policies: Api<WorkloadNetworkPolicy> = Api::namespaced(self.client.clone(), namespace);
        Ok(policies.get_opt(name).await?.is_some_and(|policy| {
            policy
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(PROMOTED_FROM_LABEL))
                == Some(&promoted_from_value(name))
        }))
    }

    /// Writes `edges` into `target`'s proposal (what the pending set refused, `pending_capped`, goes
    /// into its Events too), adding what happened to `report`.
    pub async fn write(
        &self,
        target: &Target,
        edges: &[Edge],
        pending_capped: (&BTreeMap<(Protocol, u16), usize>, usize),
        report: &mut FlushReport,
    ) -> Result<(), kube::Error> {
        let ns = &target.workload.namespace;
        let name = target.name();
        let proposals: Api<WorkloadNetworkPolicyProposal> =
            Api::namespaced(self.client.clone(), ns);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        // The cached copy is trusted for a write only: the replace's resourceVersion precondition
        // checks it. Every decision not to write is made on the object as the API server holds it,
        // since a copy that lags may still hold what was since deleted or edited out.
        let mut cached = self.cached(ns, &name);
        let mut conflicts = 0;
        while conflicts < CONFLICT_RETRIES {
            let from_cache = cached.is_some();
            let existing = match cached.take() {
                Some(copy) => Some(copy),
                None => proposals.get_opt(&name).await?,
            };
            // Only a missing proposal may have been promoted (promotion deletes it): then learning
            // must not create it again. A leftover that still exists is deleted by its reconciler.
            if existing.is_none() && self.promoted(ns, &name).await? {
                report.promoted += 1;
                return Ok(());
            }
            let mut desired = existing
                .clone()
                .unwrap_or_else(|| learn::new_proposal(target, self.backend));
            if desired.spec.backend != self.backend {
                if from_cache {
                    continue;
                }
                tracing::warn!(proposal = %name, namespace = %ns, "proposal has another backend; not learning into it");
                return Ok(());
            }
            if let (Some(key), Some(current)) = (&self.signing_key, &existing) {
                let provenance = key.check(current);
                if provenance != Provenance::Learned {
                    if from_cache {
                        continue;
                    }
                    // Writing into it would sign rules the controller never learned.
                    report.foreign += 1;
                    self.metrics
                        .resolved("proposal_not_learned_into", edges.len() as u64);
                    self.warn_event(
                        target,
                        Some(current),
                        provenance.reason(),
                        provenance.message().into(),
                    )
                    .await;
                    return Ok(());
                }
            }
            let (merged, size_capped) =
                learn::merge_within(&mut desired, edges, &self.limits, MAX_PROPOSAL_BYTES);
            if !merged.changed && existing.is_some() {
                if from_cache {
                    continue;
                }
                report.unchanged += 1;
                self.report_capped(
                    target,
                    existing.as_ref(),
                    &merged,
                    pending_capped,
                    size_capped,
                    report,
                )
                .await;
                return Ok(());
            }
            if let Some(key) = &self.signing_key {
                key.sign_into(&mut desired);
            }
            let written = match existing {
                Some(_) => proposals.replace(&name, &params, &desired).await,
                None => proposals.create(&params, &desired).await,
            };
            let created = existing.is_none();
            match written {
                Ok(object) => {
                    if !merged.wildcards.is_empty() {
                        tracing::info!(proposal = %name, namespace = %target.workload.namespace,
                            wildcards = ?merged.wildcards, "sibling names learned as wildcards");
                    }
                    report.written += 1;
                    report.created += usize::from(created);
                    self.report_capped(
                        target,
                        Some(&object),
                        &merged,
                        pending_capped,
                        size_capped,
                        report,
                    )
                    .await;
                    let status = serde_json::json!({"status": {
                        "peerCount": learn::peer_count(&desired.spec),
                        "lastLearnedTime": Time(k8s_openapi::jiff::Timestamp::now()),
                    }});
                    match proposals
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                    {
                        // Patched; only the answer does not decode (see below).
                        Ok(_) | Err(kube::Error::SerdeError(_)) => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
                // The API server took the write and answered with an object this build cannot
                // read (a newer release's values in it): the edges are in, not refused.
                Err(kube::Error::SerdeError(error)) => {
                    tracing::warn!(proposal = %name, namespace = %ns, %error,
                        "proposal written; the API server's answer does not decode");
                    report.written += 1;
                    report.created += usize::from(created);
                    return Ok(());
                }
                // Changed or deleted since it was read (409; 404 would also mean deleted): read it
                // again. A cached copy that lagged does not use up a retry.
                Err(kube::Error::Api(e)) if e.code == 409 || (e.code == 404 && !created) => {
                    report.conflicts += 1;
                    conflicts += usize::from(!from_cache);
                }
                Err(e) => return Err(e),
            }
        }
        Err(kube::Error::Api(
            kube::core::Status::failure(
                &format!(
                    "proposal {ns}/{name} kept changing under us ({CONFLICT_RETRIES} conflicts)"
                ),
                "Conflict",
            )
            .with_code(409)
            .boxed(),
        ))
    }
}

impl crate::runtime::leader::Leading for ProposalWriter {
    fn is_leader(&self) -> bool {
        ProposalWriter::is_leader(self)
    }

    fn leader_hint(&self) -> Option<String> {
        ProposalWriter::leader_hint(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::index::{FlowEnd, WorkloadEndpoint};
    use network_enforcer_api::{Direction, WorkloadKind};
    use std::sync::Mutex;

    /// A stand-in API server that holds no proposal and no policy, takes every write, and answers
    /// each with the object as a newer release would hold it (a backend this build does not know).
    async fn api_answering_newer_objects() -> (Client, Arc<Mutex<Vec<String>>>) {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let router = axum::Router::new().fallback(
            move |method: http::Method, uri: http::Uri, body: bytes::Bytes| {
                let seen = seen.clone();
                async move {
                    seen.lock()
                        .unwrap()
                        .push(format!("{method} {}", uri.path()));
                    let json = [(http::header::CONTENT_TYPE, "application/json")];
                    if method == http::Method::GET {
                        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                            "status": "Failure", "reason": "NotFound", "code": 404});
                        return (http::StatusCode::NOT_FOUND, json, status.to_string());
                    }
                    let mut object: serde_json::Value = match method {
                        http::Method::POST => serde_json::from_slice(&body).unwrap(),
                        _ => serde_json::json!({
                            "apiVersion": "network-enforcer.kubewarden.io/v1alpha1",
                            "kind": "WorkloadNetworkPolicyProposal",
                            "metadata": {"name": "deployment-api-egress", "namespace": "shop"},
                            "spec": {}}),
                    };
                    object["spec"]["backend"] = "a-backend-of-a-newer-release".into();
                    (http::StatusCode::CREATED, json, object.to_string())
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let config = kube::Config::new(format!("http://{address}").parse().unwrap());
        (Client::try_from(config).unwrap(), requests)
    }

    /// A write the API server took is written, though its answer does not decode: its edges are in
    /// the proposal, and reporting them refused (dropped) would tell the user they were lost.
    #[tokio::test]
    async fn a_write_whose_answer_does_not_decode_is_counted_written_not_refused() {
        let (client, requests) = api_answering_newer_objects().await;
        let writer = ProposalWriter::new(client, Backend::Kubernetes);
        let target = Target {
            workload: Arc::new(WorkloadEndpoint {
                namespace: "shop".into(),
                kind: Some(WorkloadKind::Deployment),
                name: "api".into(),
                ..WorkloadEndpoint::default()
            }),
            kind: WorkloadKind::Deployment,
            direction: Direction::Egress,
        };
        let edges = [Edge::Kubernetes {
            peer: FlowEnd::External("192.0.2.7".parse().unwrap()),
            protocol: Protocol::TCP,
            port: 443,
        }];
        let mut report = FlushReport::default();
        let result = writer
            .write(&target, &edges, (&BTreeMap::new(), 0), &mut report)
            .await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!((report.written, report.created), (1, 1), "{report:?}");
        let requests = requests.lock().unwrap();
        assert!(
            requests.iter().any(|r| r.starts_with("POST ")),
            "{requests:?}"
        );
    }
}
