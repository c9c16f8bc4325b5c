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
        let keys: HashSet<PolicyKey> = policies.iter().map(|p| policy_key(p)).collect();
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
            report.policies += 1;
            match self.sync_policy_or_reread(policy, &view).await {
                Ok(done) => {
                    report.patched += usize::from(done.patched);
                    report.observations += done.observations;
                    report.acknowledged += done.acknowledged;
                    self.state
                        .lock()
                        .expect("state lock")
                        .failing
                        .remove(&policy_key(policy));
                }
                Err(error) => {
                    report.failed += 1;
                    tracing::warn!(
                        namespace = ?policy.namespace(), name = %policy.name_any(), %error,
                        "status sync failed; pending observations are kept and retried"
                    );
                    self.failed_again(policy, &error).await;
                }
            }
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
    async fn failed_again(&self, policy: &WorkloadNetworkPolicy, error: &SyncError) {
        let (failed, pending) = {
            let mut state = self.state.lock().expect("state lock");
            let key = policy_key(policy);
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
        tracing::warn!(namespace = ?policy.namespace(), name = %policy.name_any(), %note,
            "status writes failing");
        publish_with(
            &self.recorder,
            &policy.object_ref(&()),
            EventType::Warning,
            "StatusWriteFailing",
            "SyncStatus",
            note,
        )
        .await;
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
            "violationHistory": status.violation_history,
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
