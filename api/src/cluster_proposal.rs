//! ClusterNetworkPolicyProposal (cluster-scoped): a ClusterNetworkPolicy the controller learned from
//! the observed namespace graph (docs/api.md, "ClusterNetworkPolicyProposal"), for a cluster admin to
//! review and promote with `kubectl label clusternetworkpolicyproposal <name>
//! networkenforcer.kubewarden.io/promote=protect`: the controller then creates the
//! ClusterNetworkPolicy of the same name, owned by the proposal.

use crate::cluster_network_policy::ClusterNetworkPolicySpec;
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
    doc = "A ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2) learned from the observed namespace graph; label it networkenforcer.kubewarden.io/promote=protect to create it.",
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".spec.policy.tier"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.policy.priority"}"#,
    printcolumn = r#"{"name":"Promote","type":"string","jsonPath":".metadata.labels.networkenforcer\\.kubewarden\\.io/promote"}"#,
    printcolumn = r#"{"name":"Rendered","type":"string","jsonPath":".status.conditions[?(@.type==\"Rendered\")].status"}"#,
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
}
