//! Cluster proposals in monitor (docs/behaviour.md §4.9): the flows their ClusterNetworkPolicies
//! would deny ([`Monitored`]) are recorded in the proposal's own status, with the bookkeeping of a
//! WorkloadNetworkPolicy's ([`violations::sync`]: merge, clear, acknowledge, the same caps), the
//! same repeat window, pending queue, claims and OTLP events. Their key has no namespace.

use super::*;
use network_enforcer_api::keys::{PROMOTE_LABEL, PROMOTE_MONITOR};

/// The pending-observation key of cluster proposal `name` (cluster-scoped: no namespace).
pub(super) fn proposal_key(name: &str) -> PolicyKey {
    PolicyKey {
        namespace: String::new(),
        name: name.to_string(),
    }
}

/// Whether `proposal` is in monitor: labelled `promote=monitor`, named, not being deleted.
pub(super) fn monitored(proposal: &ClusterNetworkPolicyProposal) -> bool {
    proposal.labels().get(PROMOTE_LABEL).map(String::as_str) == Some(PROMOTE_MONITOR)
        && proposal.metadata.deletion_timestamp.is_none()
        && proposal.metadata.name.is_some()
}

impl StatusSync {
    /// The cluster proposals in monitor ([`monitored`]), but those whose name a ClusterNetworkPolicy
    /// in force holds that was not created from them: promoting such a proposal is refused
    /// (`NameTaken`), so what it would deny in that one's place is nothing it could ever enforce.
    pub(super) fn monitored_proposals(&self) -> Vec<Arc<ClusterNetworkPolicyProposal>> {
        self.cluster_proposals
            .state()
            .into_iter()
            .filter(|p| monitored(p))
            .filter(|p| {
                let name = p.name_any();
                self.cluster_policies
                    .get(&kube::runtime::reflector::ObjectRef::new(&name))
                    .is_none_or(|policy| crate::policy::cluster_promote::is_ours(&policy))
            })
            .collect()
    }

    /// The cluster proposals whose status the status pass writes: those in monitor, and any other
    /// (not being deleted) that observations still wait for: attributed while it was in monitor,
    /// they are written although it left monitor since (protect, or the label removed).
    pub(super) fn proposals_to_write(&self) -> Vec<Arc<ClusterNetworkPolicyProposal>> {
        let state = self.state.lock().expect("state lock");
        self.cluster_proposals
            .state()
            .into_iter()
            .filter(|p| {
                monitored(p)
                    || (p.metadata.deletion_timestamp.is_none()
                        && p.metadata.name.is_some()
                        && state.pending.len_of(&proposal_key(&p.name_any())) > 0)
            })
            .collect()
    }

    /// `view` with the `proposals` in force; `None` without any.
    pub(super) fn monitored_view(
        view: &ClusterView,
        proposals: &[Arc<ClusterNetworkPolicyProposal>],
    ) -> Option<Monitored> {
        Monitored::new(
            view,
            proposals.iter().map(|p| NamedClusterPolicy {
                name: p.name_any(),
                spec: p.spec.policy.clone(),
            }),
        )
    }

    /// Syncs one proposal's violation fields (see the module docs), patching them when they
    /// changed, with the copy's `resourceVersion` as precondition. Records are cleared only while
    /// the proposal is in monitor with the spec `monitored` judges by (a copy read after a conflict
    /// may say otherwise): a proposal that left monitor keeps what it recorded.
    pub(super) async fn sync_proposal(
        &self,
        proposal: &ClusterNetworkPolicyProposal,
        monitored: Option<&Monitored>,
    ) -> Result<PolicySync, SyncError> {
        let Some(name) = proposal.metadata.name.as_deref() else {
            return Err(SyncError::Unnamed);
        };
        let key = proposal_key(name);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let (observations, read) = self.state.lock().expect("state lock").pending.read(&key);
        let current = proposal
            .status
            .as_ref()
            .map(|s| s.violation_status())
            .unwrap_or_default();
        let judge = monitored
            .filter(|m| self::monitored(proposal) && m.judges(name, &proposal.spec.policy));
        let outcome = violations::sync(
            SyncInput {
                status: Some(&current),
                generation: proposal.metadata.generation,
                annotations: proposal.metadata.annotations.as_ref(),
                observations: &observations,
                now: &now,
            },
            |record| judge.is_some_and(|m| m.allows_now(record)),
        );
        let api = Api::<ClusterNetworkPolicyProposal>::all(self.client.clone());
        if outcome.status_changed {
            let patch = status::status_patch(proposal, &outcome, None);
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(SyncError::Patch)?;
        }
        let done = PolicySync {
            patched: outcome.status_changed,
            observations: observations.len(),
            acknowledged: outcome.acknowledged.len(),
            annotations_removed: 0,
        };
        Ok(self
            .written(&api, proposal, &key, read, &outcome, done)
            .await)
    }
}

#[cfg(test)]
mod tests;
