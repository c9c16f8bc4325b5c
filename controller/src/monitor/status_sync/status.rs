//! Status out: each policy's status synced and patched, and its acknowledgements consumed.

use super::*;

impl StatusSync {
    /// Syncs every policy's status once (see the module docs). Nothing until every watch evidence
    /// is judged against has listed ([`StatusSync::listed`]): against a policy store not listed
    /// yet, every pending observation's policy would look deleted, and with nothing pending left
    /// the drains nobody judged yet would be settled.
    pub async fn sync_all(&self) -> PassReport {
        if !self.is_ready() {
            return PassReport::default();
        }
        // Everything drained so far is pending or written; what this pass writes settles it.
        let drained = self.queue.drains();
        let policies = self.policies.state();
        let monitored = self.monitored_proposals();
        let proposals = self.proposals_to_write();
        let keys: HashSet<PolicyKey> = policies
            .iter()
            .map(|p| policy_key(p))
            .chain(proposals.iter().map(|p| proposal_key(&p.name_any())))
            .collect();
        let gone = {
            let mut state = self.state.lock().expect("state lock");
            let gone = state.pending.retain_policies(|k| keys.contains(k));
            state.usage.retain_policies(|k| keys.contains(k));
            state.failing.retain(|k, _| keys.contains(k));
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
            let synced = self.sync_policy_or_reread(policy, &view).await;
            self.tally(&mut report, policy.as_ref(), policy_key(policy), synced)
                .await;
        }
        let monitored = Self::monitored_view(&view, &monitored);
        let api = Api::<ClusterNetworkPolicyProposal>::all(self.client.clone());
        for proposal in &proposals {
            let first = self.sync_proposal(proposal, monitored.as_ref()).await;
            let synced = match self.after(first, proposal.as_ref(), &api).await {
                Next::Done(done) => done,
                Next::Again(fresh) => {
                    self.retried(self.sync_proposal(&fresh, monitored.as_ref()).await)
                }
            };
            let key = proposal_key(&proposal.name_any());
            self.tally(&mut report, proposal.as_ref(), key, synced)
                .await;
        }
        {
            let state = self.state.lock().expect("state lock");
            let parked = state
                .failing
                .values()
                .filter(|n| **n >= FAILED_PASSES_BEFORE_PARKED)
                .count();
            self.metrics.status_writes_failing.set(parked as i64);
        }
        // The claims of what this pass wrote, before the acknowledgements of what it counted.
        self.persist_claims(drained).await;
        self.settle_if_written(drained);
        self.metrics.status_passes.inc();
        report
    }

    /// Counts one more failed pass for `policy`; at the [`FAILED_PASSES_BEFORE_PARKED`]th in a row
    /// its pending observations stop holding back acknowledgements, which a Warning Event says.
    pub(super) async fn failed_again<K: Resource<DynamicType = ()>>(
        &self,
        policy: &K,
        key: PolicyKey,
        error: &SyncError,
    ) {
        let (failed, pending) = {
            let mut state = self.state.lock().expect("state lock");
            let failed = state.failing.entry(key.clone()).or_default();
            *failed += 1;
            let failed = *failed;
            (failed, state.pending.len_of(&key))
        };
        if failed != FAILED_PASSES_BEFORE_PARKED {
            return;
        }
        let note = format!(
            "the status could not be written in {failed} passes in a row ({error}); its {pending} \
             pending violation observations are kept and retried every pass, but no longer hold \
             back the agents' acknowledgements: a controller that stops before they are written \
             loses them"
        );
        tracing::warn!(namespace = ?policy.meta().namespace, name = ?policy.meta().name, %note,
            "status writes failing");
        self.event(
            &policy.object_ref(&()),
            EventType::Warning,
            "StatusWriteFailing",
            "SyncStatus",
            note,
        )
        .await;
    }

    /// Publishes an Event about `regarding`, a namespaced or a cluster-scoped object.
    pub(super) async fn event(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if regarding.namespace.is_some() {
            publish_with(&self.recorder, regarding, type_, reason, action, note).await;
        } else {
            let reporter = Reporter {
                controller: self.settings.reporter.clone(),
                instance: self.settings.instance.clone(),
            };
            let type_ = match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            };
            publish_cluster_scoped(
                &self.client,
                &reporter,
                regarding.clone(),
                type_,
                reason,
                action,
                note,
            )
            .await;
        }
    }

    /// Adds what syncing `object` (of pending key `key`) did to `report`; a failure counts one more
    /// failed pass for it ([`StatusSync::failed_again`]).
    async fn tally<K: Resource<DynamicType = ()>>(
        &self,
        report: &mut PassReport,
        object: &K,
        key: PolicyKey,
        synced: Result<PolicySync, SyncError>,
    ) {
        report.policies += 1;
        match synced {
            Ok(done) => {
                report.patched += usize::from(done.patched);
                report.observations += done.observations;
                report.acknowledged += done.acknowledged;
                self.state.lock().expect("state lock").failing.remove(&key);
            }
            Err(error) => {
                report.failed += 1;
                tracing::warn!(
                    namespace = ?object.meta().namespace, name = ?object.meta().name, %error,
                    "status sync failed; pending observations are kept and retried"
                );
                self.failed_again(object, key, &error).await;
            }
        }
    }

    /// What follows the first sync of `object`: done, or once more from a copy read now through
    /// `api` when the patch conflicted: the watch had not yet delivered another writer's change
    /// (usually the policy reconciler's conditions, written right after a promotion), and waiting
    /// an interval for it could meet the next change again.
    pub(super) async fn after<K>(
        &self,
        first: Result<PolicySync, SyncError>,
        object: &K,
        api: &Api<K>,
    ) -> Next<K>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
    {
        let error = match first {
            Err(SyncError::Patch(kube::Error::Api(e))) if e.code == 409 => e,
            Err(error) => {
                if matches!(error, SyncError::Patch(_)) {
                    self.metrics.patch_failed("error");
                }
                return Next::Done(Err(error));
            }
            done => return Next::Done(done),
        };
        self.metrics.patch_failed("conflict");
        let Some(name) = object.meta().name.as_deref() else {
            return Next::Done(Err(SyncError::Unnamed));
        };
        tracing::debug!(
            namespace = ?object.meta().namespace, name, error = %error.message,
            "status patch conflicted; retrying from a fresh read"
        );
        match api.get(name).await {
            Ok(fresh) => Next::Again(fresh),
            Err(error) => Next::Done(Err(SyncError::Reread(error))),
        }
    }

    /// The second sync after a conflict ([`StatusSync::after`]), its failure counted.
    pub(super) fn retried(
        &self,
        retried: Result<PolicySync, SyncError>,
    ) -> Result<PolicySync, SyncError> {
        if let Err(SyncError::Patch(e)) = &retried {
            let reason = match e {
                kube::Error::Api(e) if e.code == 409 => "conflict",
                _ => "error",
            };
            self.metrics.patch_failed(reason);
        }
        retried
    }

    /// [`StatusSync::sync_policy`], once more from a fresh read when the patch conflicts
    /// ([`StatusSync::after`]).
    pub async fn sync_policy_or_reread(
        &self,
        policy: &WorkloadNetworkPolicy,
        view: &ClusterView,
    ) -> Result<PolicySync, SyncError> {
        let api = Api::<WorkloadNetworkPolicy>::namespaced(
            self.client.clone(),
            policy.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let first = self.sync_policy(policy, view).await;
        match self.after(first, policy, &api).await {
            Next::Done(done) => done,
            Next::Again(fresh) => self.retried(self.sync_policy(&fresh, view).await),
        }
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
                &Patch::Merge(status_patch(policy, &outcome, Some(&usage))),
            )
            .await
            .map_err(SyncError::Patch)?;
        }
        let done = PolicySync {
            patched,
            observations: observations.len(),
            acknowledged: outcome.acknowledged.len(),
            annotations_removed: 0,
        };
        Ok(self.written(&api, policy, &key, read, &outcome, done).await)
    }

    /// After a successful patch (or none needed) of `object`'s status: its observations up to
    /// `read` are no longer pending, its acknowledgements are reported and its consumed
    /// annotations removed.
    pub(super) async fn written<K>(
        &self,
        api: &Api<K>,
        object: &K,
        key: &PolicyKey,
        read: crate::monitor::violations::evidence::Read,
        outcome: &SyncOutcome,
        mut done: PolicySync,
    ) -> PolicySync
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
    {
        let name = object.meta().name.as_deref().unwrap_or_default();
        {
            let mut state = self.state.lock().expect("state lock");
            state.pending.commit(key, read);
            self.count_pending(&mut state);
        }
        let regarding = object.object_ref(&());
        for acknowledged in &outcome.acknowledged {
            self.sink.acknowledged(acknowledged);
            self.event(
                &regarding,
                EventType::Normal,
                "ViolationAcknowledged",
                "Acknowledge",
                acknowledged_note(acknowledged),
            )
            .await;
        }
        if outcome.remove_annotations.is_empty() {
            return done;
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
                    self.event(
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
                namespace = ?object.meta().namespace, name, %error,
                "could not remove acknowledge annotations; retrying next interval"
            ),
        }
        done
    }
}

/// What follows a status sync whose patch may have conflicted ([`StatusSync::after`]).
pub(super) enum Next<K> {
    Done(Result<PolicySync, SyncError>),
    /// Sync once more from this copy, read after the conflict.
    Again(K),
}

/// The merge patch of the violation fields and `ruleUsage` (a policy's; a cluster proposal has
/// none) of `object`'s status (not `conditions`, which the policy reconciler and the cluster
/// proposals' render loop own), with the copy's `resourceVersion` as precondition. Empty lists are
/// sent as `[]` so that a merge patch clears them.
pub(super) fn status_patch<K: Resource>(
    object: &K,
    outcome: &SyncOutcome,
    usage: Option<&[RuleUsage]>,
) -> serde_json::Value {
    let status = &outcome.status;
    let mut patch = serde_json::json!({
        "status": {
            "observedGeneration": status.observed_generation,
            "violationCount": status.violation_count,
            "activeViolationCount": status.active_violation_count,
            "violationHistory": status.violation_history,
            "violations": status.violations,
            "acknowledgedViolations": status.acknowledged_violations,
        }
    });
    if let Some(usage) = usage {
        patch["status"]["ruleUsage"] = serde_json::json!(usage);
    }
    if let Some(version) = object.resource_version() {
        patch["metadata"] = serde_json::json!({"resourceVersion": version});
    }
    patch
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
