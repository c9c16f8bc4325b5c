//! ClusterNetworkPolicyProposals on the leader (docs/behaviour.md §1.11, §4.9): every
//! `--cluster-proposals-interval` the namespace graph of the protect gate's history becomes the
//! proposals ([`crate::learn::cluster_policies`]), written when they change; every
//! [`RENDER_EVERY`] the promoted ones are put in force and drift is repaired
//! ([`crate::policy::cluster_promote`]).

use crate::learn::cluster_policies::{self, NamespaceGraph, Settings};
use crate::learn::provenance::{Provenance, SigningKey};
use crate::policy::cluster_promote::{self, MONITORED, RENDERED};
use crate::policy::conditions;
use crate::policy::render::MANAGED_BY_LABEL;
use crate::runtime::events::publish_cluster_scoped;
use crate::runtime::metrics::ControllerMetrics;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::Reporter;
use kube::{Client, Resource, ResourceExt};
use network_enforcer_api::cluster_network_policy::{
    ClusterNetworkPolicy, ClusterNetworkPolicySpec,
};
use network_enforcer_api::cluster_proposal::{
    ClusterNetworkPolicyProposal, ClusterNetworkPolicyProposalSpec,
};
use network_enforcer_api::keys::{FIELD_MANAGER, LEARNED_DIGEST_ANNOTATION, PROMOTE_LABEL};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// How often promoted proposals are checked against the cluster (creation, drift, removal).
pub const RENDER_EVERY: Duration = Duration::from_secs(10);

/// The loop (see the module docs).
pub struct ClusterProposals {
    pub client: Client,
    pub history: Arc<dyn NamespaceGraph>,
    pub settings: Settings,
    /// How often the proposals are learned again.
    pub every: Duration,
    pub reporter: Reporter,
    /// Signs what learning writes; promotion puts in force only what it signed.
    pub signing_key: Option<Arc<SigningKey>>,
    pub metrics: ProposalMetrics,
}

/// The loop's metrics (registered by [`ProposalMetrics::register`]).
#[derive(Clone, Debug, Default)]
pub struct ProposalMetrics {
    /// Proposals written by learning (created or changed).
    pub learned: Counter,
    /// Learned proposals deleted because their namespace was.
    pub removed: Counter,
    /// ClusterNetworkPolicies in force from promoted proposals after the last pass.
    pub in_force: Gauge,
    /// Passes (learning or promotion) that failed and are retried.
    pub failures: Counter,
}

impl ProposalMetrics {
    pub fn register(&self, metrics: &ControllerMetrics) {
        metrics.register(
            "cluster_proposals_learned",
            "ClusterNetworkPolicyProposals written by learning (created or changed)",
            self.learned.clone(),
        );
        metrics.register(
            "cluster_proposals_removed",
            "Learned ClusterNetworkPolicyProposals deleted because their namespace was",
            self.removed.clone(),
        );
        metrics.register(
            "cluster_proposals_in_force",
            "ClusterNetworkPolicies in force from promoted ClusterNetworkPolicyProposals",
            self.in_force.clone(),
        );
        metrics.register(
            "cluster_proposal_failures",
            "Passes of cluster proposal learning or promotion that failed (retried)",
            self.failures.clone(),
        );
    }
}

/// The proposals learning wrote for a namespace that no longer exists, by name: deleted, unless
/// promoted (what an admin approved stays until they remove it, and applies to a namespace of that
/// name created again).
pub fn gone<'a>(
    proposals: impl IntoIterator<Item = &'a ClusterNetworkPolicyProposal>,
    namespaces: &BTreeSet<String>,
) -> Vec<String> {
    proposals
        .into_iter()
        .filter(|p| {
            p.labels().get(MANAGED_BY_LABEL.0).map(String::as_str) == Some(MANAGED_BY_LABEL.1)
                && !p.labels().contains_key(PROMOTE_LABEL)
                && cluster_policies::subject_namespace(&p.spec.policy)
                    .is_some_and(|n| !namespaces.contains(n))
        })
        .map(|p| p.name_any())
        .collect()
}

/// What was last written of a proposal: its spec and notes.
type Written = HashMap<String, (ClusterNetworkPolicySpec, Vec<String>)>;

impl ClusterProposals {
    /// Learns and renders until the process stops; failures are logged and retried next time.
    pub async fn run(self) {
        let mut learn = tokio::time::interval(self.every);
        let mut render = tokio::time::interval(RENDER_EVERY);
        for tick in [&mut learn, &mut render] {
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        let mut written = Written::new();
        loop {
            tokio::select! {
                _ = learn.tick() => {
                    let learned = self.learn(&mut written).await;
                    if learned.is_err() {
                        self.metrics.failures.inc();
                    }
                    match learned {
                        Ok(()) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => tracing::warn!(
                            "the ClusterNetworkPolicyProposal CRD is not installed (helm does not \
                             upgrade CRDs): `kubectl apply --server-side -f charts/network-enforcer/crds/`; \
                             trying again next interval"
                        ),
                        Err(error) => tracing::warn!(%error, "learning cluster proposals failed; trying again next interval"),
                    }
                }
                _ = render.tick() => {
                    if let Err(error) = self.render().await {
                        self.metrics.failures.inc();
                        tracing::warn!(%error, "putting promoted cluster proposals in force failed; trying again");
                    }
                }
            }
        }
    }

    /// Writes the proposals the namespace graph calls for, those that changed since the last write.
    async fn learn(&self, written: &mut Written) -> Result<(), kube::Error> {
        // Until the history is complete (the watches have listed, the persisted history is read) a
        // partial graph would propose to deny what was seen.
        let Some(edges) = self.history.namespace_edges() else {
            return Ok(());
        };
        let namespaces = self.history.namespaces();
        let mut proposed = cluster_policies::propose(&edges, &self.settings);
        proposed.policies.retain(|p| {
            cluster_policies::subject_namespace(&p.spec).is_none_or(|n| namespaces.contains(n))
        });
        let api = Api::<ClusterNetworkPolicyProposal>::all(self.client.clone());
        let existing: HashMap<String, ClusterNetworkPolicyProposal> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        // A proposal deleted since it was written (by hand, or below) is written again when
        // learned, even as it was.
        written.retain(|name, _| existing.contains_key(name));
        for name in gone(existing.values(), &namespaces) {
            // As listed: one promoted or changed meanwhile is left for the next pass.
            let preconditions = existing.get(&name).map(|p| Preconditions {
                resource_version: p.resource_version(),
                uid: p.uid(),
            });
            let params = DeleteParams {
                preconditions,
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    self.metrics.removed.inc();
                    tracing::info!(proposal = %name, "cluster proposal of a deleted namespace removed");
                }
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
                Err(error) => return Err(error),
            }
            written.remove(&name);
        }
        for policy in proposed.policies {
            let name = policy.name_any();
            let notes: Vec<String> = proposed
                .notes
                .iter()
                .filter(|n| n.starts_with(&format!("{name}:")))
                .cloned()
                .collect();
            let now = (policy.spec.clone(), notes.clone());
            if written.get(&name) == Some(&now) {
                continue;
            }
            let current = existing.get(&name);
            // A promoted proposal is what an admin approved and what is in force: learning never
            // changes it (a graph that lost old edges would narrow the policy by itself). Unlabel
            // it to let learning update it, then promote it again.
            if current.is_some_and(|p| p.labels().contains_key(PROMOTE_LABEL)) {
                continue;
            }
            // After a restart: what an earlier leader wrote is not written again (its
            // lastLearnedTime says when it last changed), if it is still signed as learned.
            if !written.contains_key(&name)
                && let Some(current) = current
                && current.spec.policy == now.0
                && current.status.as_ref().map(|s| &s.notes) == Some(&now.1)
                && self.signing_key.as_ref().is_none_or(|k| {
                    k.check_spec(&current.metadata, &current.spec) == Provenance::Learned
                })
            {
                written.insert(name, now);
                continue;
            }
            let mut object = ClusterNetworkPolicyProposal::new(
                &name,
                ClusterNetworkPolicyProposalSpec {
                    policy: policy.spec,
                },
            );
            object.metadata.labels = Some(BTreeMap::from([(
                MANAGED_BY_LABEL.0.to_string(),
                MANAGED_BY_LABEL.1.to_string(),
            )]));
            if let Some(key) = &self.signing_key {
                object.metadata.annotations = Some(BTreeMap::from([(
                    LEARNED_DIGEST_ANNOTATION.to_string(),
                    key.sign_spec(&object.spec),
                )]));
            }
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let applied = api.patch(&name, &params, &Patch::Apply(&object)).await?;
            // Written out in full: an empty list must replace old notes (the typed status would
            // leave an empty one out of the merge patch).
            let status = serde_json::json!({"status": {
                "lastLearnedTime": Time(k8s_openapi::jiff::Timestamp::now()),
                "notes": notes,
            }});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            let widened = written
                .get(&name)
                .is_none_or(|(_, before)| *before != notes);
            if widened && !notes.is_empty() {
                publish_cluster_scoped(
                    &self.client,
                    &self.reporter,
                    reference(&applied),
                    "Warning",
                    "ProposalWidened",
                    "Observe",
                    notes.join("; "),
                )
                .await;
            }
            self.metrics.learned.inc();
            tracing::info!(proposal = %name, "cluster proposal learned");
            written.insert(name, now);
        }
        Ok(())
    }

    /// Puts the promoted proposals in force and reports each one's `Rendered` condition.
    async fn render(&self) -> Result<(), kube::Error> {
        let proposals = Api::<ClusterNetworkPolicyProposal>::all(self.client.clone());
        let listed = match proposals.list(&ListParams::default()).await {
            Ok(list) => list.items,
            // Our CRD not installed (an upgrade without applying it): nothing promoted; `learn`
            // says what to do, once a minute.
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => return Err(error),
        };
        let policies = Api::<ClusterNetworkPolicy>::all(self.client.clone());
        let (existing, served) = match policies.list(&ListParams::default()).await {
            Ok(list) => (list.items, true),
            Err(kube::Error::Api(status)) if status.code == 404 => (Vec::new(), false),
            Err(error) => return Err(error),
        };
        let plan = cluster_promote::plan(&listed, &existing, served, self.signing_key.as_deref());
        let in_force = plan.conditions.iter().filter(|(_, c)| c.status).count();
        self.metrics.in_force.set(in_force as i64);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for policy in &plan.apply {
            let name = policy.name_any();
            match existing.iter().find(|p| p.name_any() == name) {
                // Drift: replaced whole, so fields someone else added go too (a forced apply
                // would keep fields another manager owns).
                Some(current) => {
                    let mut replacement = policy.clone();
                    replacement.metadata.resource_version =
                        current.metadata.resource_version.clone();
                    policies
                        .replace(&name, &Default::default(), &replacement)
                        .await?;
                }
                None => {
                    policies
                        .patch(&name, &params, &Patch::Apply(policy))
                        .await?;
                }
            }
            tracing::info!(policy = %name, "ClusterNetworkPolicy put in force from its proposal");
        }
        for name in &plan.delete {
            match policies.delete(name, &Default::default()).await {
                Ok(_) => {
                    tracing::info!(policy = %name, "ClusterNetworkPolicy of a proposal no longer promoted deleted")
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for (name, desired) in &plan.conditions {
            let Some(proposal) = listed.iter().find(|p| p.name_any() == *name) else {
                continue;
            };
            let mut status = proposal.status.clone().unwrap_or_default();
            let before = status
                .conditions
                .iter()
                .find(|c| c.type_ == RENDERED)
                .cloned();
            if !conditions::set(
                &mut status.conditions,
                desired,
                proposal.meta().generation,
                &now,
            ) {
                continue;
            }
            let patch = serde_json::json!({"status": {"conditions": status.conditions}});
            proposals
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            if !desired.status && before.is_none_or(|b| b.reason != desired.reason) {
                publish_cluster_scoped(
                    &self.client,
                    &self.reporter,
                    reference(proposal),
                    // Monitor is asked for: said, not warned.
                    if desired.reason == MONITORED {
                        "Normal"
                    } else {
                        "Warning"
                    },
                    &desired.reason,
                    "Observe",
                    desired.message.clone(),
                )
                .await;
            }
        }
        Ok(())
    }
}

/// A reference to `proposal` for its Events.
fn reference(proposal: &ClusterNetworkPolicyProposal) -> ObjectReference {
    ObjectReference {
        api_version: Some(ClusterNetworkPolicyProposal::api_version(&()).into_owned()),
        kind: Some(ClusterNetworkPolicyProposal::kind(&()).into_owned()),
        name: proposal.metadata.name.clone(),
        uid: proposal.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests;
