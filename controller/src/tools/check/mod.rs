//! Offline policy evaluation for `network-enforcer-controller check`: "what would protect block?"
//! reviews and CI pipelines, without a cluster.
//!
//! A [`Scenario`] (JSON or YAML) lists namespaces, pods, policies (NetworkPolicy and
//! WorkloadNetworkPolicy objects) and flows. [`Checker`] builds the same [`ClusterView`] the
//! controller evaluates against and runs the semantic evaluators on every flow:
//!
//! - a NetworkPolicy is in force as written;
//! - a WorkloadNetworkPolicy is evaluated as if rendered, whatever its mode (the question is what
//!   protect mode would block): the kubernetes backend as the NetworkPolicy of the same name it
//!   renders (replacing a listed NetworkPolicy of that name, which is the rendered one), the istio
//!   backend as the AuthorizationPolicy it renders, at the destination, for the source pod's
//!   `serviceAccount` identity.
//!
//! A flow to an outside address may carry the DNS name the source pod resolved it from (`to.name`);
//! a kubernetes WorkloadNetworkPolicy's `spec.egressNames` then allows it as the controller's monitor
//! does (docs/behaviour.md §3.4), on top of what its payload allows.
//!
//! [`Checker::explain`] also names, for each side, the rules that allowed the flow or the policies
//! that isolate it ([`explain`]); [`diff()`] compares the verdicts under the scenario's policies and
//! under another set ([`Checker::with_policies`]).
//!
//! [`Checker::rule_usage`] shows, per rule of each WorkloadNetworkPolicy whose status has `ruleUsage`,
//! when it last allowed an observed flow and how many peers ("last matched 2h ago, 3 peers").
//!
//! [`Checker::replay`] evaluates recorded agent records (the `flows -o json` lines) and reports the
//! difference: what went through and would now be denied, and what failed and would now pass.
//!
//! [`live`] makes the scenario from the cluster and the traffic the controller observed
//! (`check --from-cluster`); its `load` is the only I/O of `check`.
//!
//! Invalid input is refused with a [`CheckError`] naming the offending field
//! (`flows[2].from.pod: ...`). Policies are validated as the API server
//! validates them (module `validate`): one it would refuse is refused here too, not evaluated.

mod build;
mod diff;
pub mod explain;
pub mod live;
mod propose;
mod render;
mod replay;
mod scenario;
mod usage;
mod validate;
mod verdict;

pub use diff::{DiffChange, DiffReport, Verdict, diff, parse_policies};
use explain::{Decision, MatchedRule};
pub use propose::propose_cluster_policies;
use render::{peer_text, side_text, table};
pub use replay::{
    AgentRecord, RecordDirection, RecordOutcome, ReplayChange, ReplayReport, parse_records,
};
use scenario::from_value;
pub use scenario::{
    Scenario, ScenarioFlow, ScenarioNamespace, ScenarioPeer, ScenarioPod, ScenarioPort,
    parse_scenario,
};
pub use usage::{RuleUsageLine, RuleUsageReport};

use crate::monitor::evaluate::authorization_policy::{self, AuthzVerdict, Connection};
use crate::monitor::evaluate::view::{
    ClusterView, ContainerPort, Endpoint, Flow, NamedClusterPolicy, NamedPolicy, PodInfo, PolicyRef,
};
use crate::monitor::evaluate::{Labels, PodKey, SideVerdict, compiled, evaluate, names};
use crate::policy::rule_usage;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
use network_enforcer_api::{
    Backend, Direction, IstioPolicy, NameRule, PolicyMode, Protocol, RuleUsage,
    WorkloadNetworkPolicy,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

/// Invalid input: the field at fault (a path such as `flows[2].port`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CheckError {
    /// Where in the input the problem is; `.` for the document itself.
    pub field: String,
    pub message: String,
}

impl CheckError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        CheckError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Which kind of object decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum PolicyKind {
    NetworkPolicy,
    WorkloadNetworkPolicy,
}

/// A policy that decided one side of a flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecidingPolicy {
    pub kind: PolicyKind,
    pub namespace: String,
    pub name: String,
    /// The WorkloadNetworkPolicy's mode (`monitor` records what `protect` would block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<PolicyMode>,
}

/// The verdict of one side: allowed or not, and the policies that decided. When allowed, those are
/// the policies that allow the flow (empty: no policy isolates this side); when denied, every policy
/// isolating this side (none of them allows it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Side {
    pub allowed: bool,
    pub policies: Vec<DecidingPolicy>,
    /// Explained results only ([`Checker::explain`]): how this side was decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Explained results only, when policies allow: every rule of theirs that matches the flow,
    /// policy by policy.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<MatchedRule>,
    /// The ClusterNetworkPolicy rules that matched, in the order the tiers were consulted (Admin,
    /// then Baseline when it was reached). Empty on clusters without ClusterNetworkPolicies.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierStep>,
    /// `Admin` or `Baseline` when a ClusterNetworkPolicy rule decided this side (its `policies`
    /// are then empty: no NetworkPolicy had a say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

/// A ClusterNetworkPolicy rule that matched one side of a flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TierStep {
    /// `Admin` or `Baseline`.
    pub tier: String,
    pub policy: String,
    /// The rule's index in the policy's `ingress` or `egress`, and its name if it has one.
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Accept`, `Deny` or `Pass`.
    pub action: String,
}

/// The verdict for one flow of the scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    pub protocol: Protocol,
    pub port: u16,
    /// Both sides allow the flow.
    pub allowed: bool,
    pub egress: Side,
    pub ingress: Side,
}

/// The results of a scenario, in input order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub results: Vec<CheckResult>,
}

/// A WorkloadNetworkPolicy of the istio backend, evaluated at the destination.
struct IstioEntry {
    namespace: String,
    name: String,
    mode: PolicyMode,
    policy: IstioPolicy,
}

/// A validated scenario, ready to evaluate flows.
pub struct Checker {
    /// The scenario's namespaces and pods, to evaluate the same flows under other policies.
    namespaces: Vec<ScenarioNamespace>,
    pods: Vec<ScenarioPod>,
    view: ClusterView,
    /// Pods by IP, to map addresses (flows given by IP, replayed records) to pods.
    pods_by_ip: HashMap<IpAddr, PodKey>,
    /// Mesh identities by pod.
    identities: HashMap<PodKey, String>,
    /// The WorkloadNetworkPolicies among the NetworkPolicies in the view: (namespace, name) → mode.
    workload_policies: HashMap<(String, String), PolicyMode>,
    /// The `spec.egressNames` of those with names: (namespace, name) → the entries.
    egress_names: HashMap<(String, String), Vec<NameRule>>,
    istio: Vec<IstioEntry>,
    flows: Vec<ScenarioFlow>,
    /// The WorkloadNetworkPolicies whose status has `ruleUsage`, in input order.
    usage: Vec<PolicyUsage>,
    /// What "2h ago" is measured from.
    now: Time,
}

/// A WorkloadNetworkPolicy's rules and the usage its status recorded.
struct PolicyUsage {
    namespace: String,
    name: String,
    rules: Vec<rule_usage::RuleRef>,
    usage: Vec<RuleUsage>,
}

#[cfg(test)]
mod tests;
