//! ClusterNetworkPolicyProposal (cluster-scoped): a ClusterNetworkPolicy the controller learned from
//! the observed namespace graph (docs/api.md, "ClusterNetworkPolicyProposal"), for a cluster admin to
//! review and promote with `kubectl label clusternetworkpolicyproposal <name>
//! networkenforcer.kubewarden.io/promote=protect`: the controller then creates the
//! ClusterNetworkPolicy of the same name, owned by the proposal. With `promote=monitor` nothing is
//! created: the flows the policy would deny are recorded in the proposal's status, with the
//! violation fields of a WorkloadNetworkPolicy's.

use crate::cluster_network_policy::ClusterNetworkPolicySpec;
use crate::crd::{
    AcknowledgedViolation, VIOLATION_HISTORY_HOURS, ViolationBucket, ViolationRecord,
    WorkloadNetworkPolicyStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the controller proposes: the ClusterNetworkPolicy's spec as promotion would create it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "networkenforcer.kubewarden.io",
    version = "v1alpha1",
    kind = "ClusterNetworkPolicyProposal",
    plural = "clusternetworkpolicyproposals",
    shortname = "cnpp",
    derive = "PartialEq",
    status = "ClusterNetworkPolicyProposalStatus",
    doc = "A ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2) learned from the observed namespace graph; label it networkenforcer.kubewarden.io/promote=protect to create it, or promote=monitor to record what it would deny.",
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".spec.policy.tier"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.policy.priority"}"#,
    printcolumn = r#"{"name":"Promote","type":"string","jsonPath":".metadata.labels.networkenforcer\\.kubewarden\\.io/promote"}"#,
    printcolumn = r#"{"name":"Rendered","type":"string","jsonPath":".status.conditions[?(@.type==\"Rendered\")].status"}"#,
    printcolumn = r#"{"name":"Violations","type":"integer","jsonPath":".status.activeViolationCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyProposalSpec {
    /// The ClusterNetworkPolicy's spec (tier, priority, subject, ingress and egress rules).
    pub policy: ClusterNetworkPolicySpec,
}

/// What learning and promotion report.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyProposalStatus {
    /// When learning last changed the proposal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_learned_time: Option<Time>,
    /// What the observed traffic needed that the API's limits (25 rules, 25 peers, 25 networks)
    /// could not say exactly, and how the proposal widened it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// `Rendered`: whether the promoted ClusterNetworkPolicy exists as proposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation the violation fields were last written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Monitor: every violation observation ever merged, as a WorkloadNetworkPolicy counts them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub violation_count: i64,
    /// Monitor: the number of active records (`len(violations)`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active_violation_count: i64,
    /// Monitor: the occurrences `violationCount` counted, per hour, over the last 48 hours.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = VIOLATION_HISTORY_HOURS))]
    pub violation_history: Vec<ViolationBucket>,
    /// Monitor: flows the policy would deny, newest first, at most 100; `denyingPolicyName` is the
    /// proposal, `denyingPolicyNamespace` empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<ViolationRecord>,
    /// Monitor: acknowledged records, newest first, at most 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledged_violations: Vec<AcknowledgedViolation>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl ClusterNetworkPolicyProposalStatus {
    /// The violation fields as a WorkloadNetworkPolicy's status holds them, so that one
    /// bookkeeping (merge, clear, acknowledge) serves both kinds.
    pub fn violation_status(&self) -> WorkloadNetworkPolicyStatus {
        WorkloadNetworkPolicyStatus {
            observed_generation: self.observed_generation,
            violation_count: self.violation_count,
            active_violation_count: self.active_violation_count,
            violation_history: self.violation_history.clone(),
            violations: self.violations.clone(),
            acknowledged_violations: self.acknowledged_violations.clone(),
            ..WorkloadNetworkPolicyStatus::default()
        }
    }
}
