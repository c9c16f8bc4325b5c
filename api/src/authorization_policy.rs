//! Our own typed `security.istio.io/v1` AuthorizationPolicy, with just the fields we render
//! (ALLOW action, a workload selector, source principals and destination ports).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The spec of an Istio AuthorizationPolicy, restricted to what we render.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "security.istio.io",
    version = "v1",
    kind = "AuthorizationPolicy",
    plural = "authorizationpolicies",
    derive = "PartialEq",
    namespaced
)]
pub struct AuthorizationPolicySpec {
    /// The pods this policy applies to. Istio's workload selector has only `matchLabels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    /// Always `ALLOW` for what we render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Allow rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<crate::IstioRule>,
}

/// Istio's workload selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Pods whose labels include all of these are selected.
    pub match_labels: BTreeMap<String, String>,
}
