//! Our own typed `policy.networking.k8s.io/v1alpha2` ClusterNetworkPolicy (network-policy-api
//! v0.2.0, the kind that merged AdminNetworkPolicy and BaselineAdminNetworkPolicy): what the
//! controller reads to judge flows as the cluster does. We do not install or own this CRD; clusters
//! get it from their network-policy-api release.
//!
//! Fields keep the upstream names. Every field is read leniently (strings for the enums, options for
//! what must be set), so that a policy the API server would refuse, or a newer API version with a
//! field we do not know, still parses; what it means is then decided by the fail-closed reading of
//! the `netpol` crate, never by a parse error here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The spec of a ClusterNetworkPolicy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "policy.networking.k8s.io",
    version = "v1alpha2",
    kind = "ClusterNetworkPolicy",
    plural = "clusternetworkpolicies",
    shortname = "cnp",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".spec.tier"}"#,
    printcolumn = r#"{"name":"Priority","type":"string","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySpec {
    /// `Admin` (before NetworkPolicies) or `Baseline` (after them).
    #[serde(default)]
    pub tier: String,
    /// 0 to 1000; lower values are checked first within a tier.
    #[serde(default)]
    pub priority: i32,
    /// The pods the policy applies to; exactly one field set.
    #[serde(default)]
    pub subject: ClusterNetworkPolicySubject,
    /// Rules for connections the subject's pods receive, in order of precedence (at most 25).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<ClusterNetworkPolicyRule>,
    /// Rules for connections the subject's pods open, in order of precedence (at most 25).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<ClusterNetworkPolicyRule>,
}

/// The pods a policy applies to (host-network pods never).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicySubject {
    /// Every pod of the namespaces this selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    /// The pods `podSelector` selects in the namespaces `namespaceSelector` selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
}

/// Pods by namespace and pod selectors (both ANDed; empty selects all).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    #[serde(default)]
    pub pod_selector: LabelSelector,
}

/// One ingress or egress rule: an action on the connections to (from) its peers on its protocols.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyRule {
    /// An identifier for people and logs (at most 100 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Accept`, `Deny` or `Pass`.
    #[serde(default)]
    pub action: String,
    /// Ingress: the sources (at least one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<ClusterNetworkPolicyPeer>,
    /// Egress: the destinations (at least one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<ClusterNetworkPolicyPeer>,
    /// Absent: every protocol and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocols: Option<Vec<ClusterNetworkPolicyProtocol>>,
}

/// One peer; exactly one field set. Ingress peers are `namespaces` or `pods`; egress peers may also
/// be `networks`, and (experimental upstream) `nodes` or `domainNames`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<NamespacedPod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<LabelSelector>,
    /// CIDRs; they match pod addresses too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_names: Option<Vec<String>>,
}

/// Protocol-specific matching; exactly one field set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetworkPolicyProtocol {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<ProtocolPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sctp: Option<ProtocolPort>,
    /// A container port's name on the destination pod (any protocol it is declared with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_named_port: Option<String>,
}

/// The destination port of one protocol.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port: Option<DestinationPort>,
}

/// A port number or a range; exactly one set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DestinationPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<PortRange>,
}

/// Ports `start..=end` (`start < end`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PortRange {
    pub start: i32,
    pub end: i32,
}
