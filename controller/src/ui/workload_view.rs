//! The workload page's data: a workload's proposals and policies side by side with their rules, each
//! rule's usage when the status has it, active and acknowledged violations, conditions, and the exact
//! `kubectl` commands that promote a proposal or acknowledge a violation (the page itself changes
//! nothing). Pure: a [`Snapshot`] in, a [`WorkloadView`] out.

use crate::graph::{port_labels, selector_text};
use crate::ui::objects::{PolicyObject, Snapshot};
use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use network_enforcer_api::keys::{
    ACKNOWLEDGE_ANNOTATION_PREFIX, PROMOTE_LABEL, PROMOTE_MONITOR, PROMOTE_PROTECT,
    PROMOTED_FROM_LABEL,
};
use network_enforcer_api::{
    Direction, IstioPolicy, NameRule, PolicyMode, ViolationBucket, ViolationRecord,
    WorkloadNetworkPolicyProposal, WorkloadRef,
};
use serde::Serialize;

/// At most this many violation records per policy and list (the status holds at most 100 each).
pub const MAX_VIOLATIONS: usize = 100;

/// One rule, as text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleView {
    /// Position in the direction's rule list (what `status.ruleUsage` refers to).
    pub index: usize,
    /// `pods {app=db}`, `namespace kube-system pods {k8s-app=kube-dns}`, `10.0.0.0/8`, an identity.
    pub peers: Vec<String>,
    /// `TCP 5432`, `any port`.
    pub ports: Vec<String>,
    /// This rule's entry of `status.ruleUsage`, as the status has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<serde_json::Value>,
}

/// One `spec.egressNames` entry, as text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NameRuleView {
    /// Position in `spec.egressNames`.
    pub index: usize,
    /// The entry's names and wildcards, as written.
    pub names: Vec<String>,
    /// `TCP 443`, `any port`.
    pub ports: Vec<String>,
    /// This entry's `status.ruleUsage` entry (`list: egressNames`), as the status has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<serde_json::Value>,
}

/// A condition, flattened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// One violation record with the command that acknowledges it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ViolationView {
    pub id: i64,
    pub timestamp: String,
    pub source: String,
    pub dest: String,
    pub port: String,
    /// `monitor` (went through) or `protect` (blocked).
    pub action: &'static str,
    /// Acknowledged records: the reason given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acknowledged_at: Option<String>,
    /// Active records: `kubectl annotate ...` that acknowledges it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acknowledge_command: Option<String>,
    /// The explain route's parameters for this flow, when it can be explained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explain: Option<super::explain_view::ExplainLink>,
}

/// A proposal of the workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProposalView {
    pub name: String,
    pub direction: &'static str,
    pub backend: &'static str,
    /// The promote label's value, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promote_label: Option<String>,
    /// The policy promoted from it, when one exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    pub peer_count: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_learned_time: Option<String>,
    pub rules: Vec<RuleView>,
    /// The outside services learned by name (`spec.egressNames`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress_names: Vec<NameRuleView>,
    pub conditions: Vec<ConditionView>,
    /// `kubectl label ... promote=monitor` and `...=protect`.
    pub promote_commands: Vec<String>,
}

/// A policy of the workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyView {
    pub name: String,
    pub direction: &'static str,
    pub backend: &'static str,
    pub mode: &'static str,
    /// The proposal it was promoted from (its label).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promoted_from: Option<String>,
    pub rules: Vec<RuleView>,
    /// The outside services it allows by name (`spec.egressNames`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress_names: Vec<NameRuleView>,
    /// `status.ruleUsage` as written, when present (also split onto the rules when it is a list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_usage: Option<serde_json::Value>,
    pub conditions: Vec<ConditionView>,
    pub violation_count: i64,
    pub active_violation_count: i64,
    /// `status.violationHistory`: occurrences counted per hour over the last 48 hours, oldest first,
    /// hours without any left out (the page plots them).
    pub violation_history: Vec<ViolationBucket>,
    pub violations: Vec<ViolationView>,
    pub acknowledged_violations: Vec<ViolationView>,
    /// For a monitor policy: the `kubectl patch` that switches it to protect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protect_command: Option<String>,
}

/// The workload page's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadView {
    pub namespace: String,
    pub name: String,
    /// The kinds found with this name (normally one).
    pub kinds: Vec<String>,
    pub proposals: Vec<ProposalView>,
    pub policies: Vec<PolicyView>,
}

/// The view of workload `name` (of `kind`, when given) in `namespace`; `None` when no proposal or
/// policy targets it.
pub fn build(
    snapshot: &Snapshot,
    namespace: &str,
    name: &str,
    kind: Option<&str>,
) -> Option<WorkloadView> {
    let targets = |ns: Option<&String>, k: &str, n: &str| {
        ns.map(String::as_str) == Some(namespace)
            && n == name
            && kind.is_none_or(|want| want.eq_ignore_ascii_case(k))
    };
    let mut kinds = Vec::new();
    let mut policies: Vec<&PolicyObject> = snapshot
        .policies
        .iter()
        .filter(|p| {
            let t = &p.policy.spec.target_ref;
            targets(
                p.policy.metadata.namespace.as_ref(),
                t.kind.as_str(),
                &t.name,
            )
        })
        .collect();
    policies.sort_by_key(|p| (p.policy.spec.direction, p.name().to_string()));
    let mut proposals: Vec<&WorkloadNetworkPolicyProposal> = snapshot
        .proposals
        .iter()
        .filter(|p| {
            let t = &p.spec.target_ref;
            targets(p.metadata.namespace.as_ref(), t.kind.as_str(), &t.name)
        })
        .collect();
    proposals.sort_by_key(|p| (p.spec.direction, p.metadata.name.clone()));
    if policies.is_empty() && proposals.is_empty() {
        return None;
    }
    for k in policies
        .iter()
        .map(|p| p.policy.spec.target_ref.kind.as_str())
        .chain(proposals.iter().map(|p| p.spec.target_ref.kind.as_str()))
    {
        if !kinds.iter().any(|have| have == k) {
            kinds.push(k.to_string());
        }
    }
    let proposals = proposals
        .into_iter()
        .map(|p| proposal_view(p, &snapshot.policies))
        .collect();
    let policies = policies.into_iter().map(policy_view).collect();
    Some(WorkloadView {
        namespace: namespace.to_string(),
        name: name.to_string(),
        kinds,
        proposals,
        policies,
    })
}

fn proposal_view(p: &WorkloadNetworkPolicyProposal, policies: &[PolicyObject]) -> ProposalView {
    let namespace = p.metadata.namespace.clone().unwrap_or_default();
    let name = p.metadata.name.clone().unwrap_or_default();
    let labels = p.metadata.labels.clone().unwrap_or_default();
    // The controller labels a policy with the proposal it came from (shortened for long names).
    let from_value = network_enforcer_api::naming::promoted_from_value(&name);
    let policy = policies
        .iter()
        .find(|policy| {
            policy.namespace() == namespace
                && policy
                    .policy
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(PROMOTED_FROM_LABEL))
                    == Some(&from_value)
        })
        .map(|policy| policy.name().to_string());
    let status = p.status.clone().unwrap_or_default();
    ProposalView {
        direction: p.spec.direction.as_str(),
        backend: backend_name(p.spec.backend),
        promote_label: labels.get(PROMOTE_LABEL).cloned(),
        policy,
        peer_count: status.peer_count,
        last_learned_time: status.last_learned_time.map(|t| t.0.to_string()),
        rules: rules(
            p.spec.direction,
            p.spec.kubernetes.as_ref(),
            p.spec.istio.as_ref(),
            None,
        ),
        egress_names: name_rules(&p.spec.egress_names, None),
        conditions: conditions(&status.conditions),
        promote_commands: [PROMOTE_MONITOR, PROMOTE_PROTECT]
            .iter()
            .map(|mode| promote_command(&namespace, &name, mode))
            .collect(),
        name,
    }
}

fn policy_view(p: &PolicyObject) -> PolicyView {
    let (namespace, name) = (p.namespace().to_string(), p.name().to_string());
    let spec = &p.policy.spec;
    let status = p.policy.status.clone().unwrap_or_default();
    let violation = |v: &ViolationRecord| ViolationView {
        id: v.id,
        timestamp: v.timestamp.0.to_string(),
        source: side(&v.source),
        dest: side(&v.dest),
        port: match v.dst_port {
            Some(port) => format!("{} {port}", v.protocol.as_str()),
            None => format!("{} any", v.protocol.as_str()),
        },
        action: v.action.as_str(),
        reason: None,
        acknowledged_at: None,
        acknowledge_command: None,
        explain: super::explain_view::link(&v.source, &v.dest, v.protocol, v.dst_port),
    };
    PolicyView {
        direction: spec.direction.as_str(),
        backend: backend_name(spec.backend),
        mode: spec.mode.as_str(),
        promoted_from: p
            .policy
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PROMOTED_FROM_LABEL))
            .cloned(),
        rules: rules(
            spec.direction,
            spec.kubernetes.as_ref(),
            spec.istio.as_ref(),
            p.rule_usage.as_ref(),
        ),
        egress_names: name_rules(&spec.egress_names, p.rule_usage.as_ref()),
        rule_usage: p.rule_usage.clone(),
        conditions: conditions(&status.conditions),
        violation_count: status.violation_count,
        active_violation_count: status.active_violation_count,
        violation_history: status.violation_history.clone(),
        violations: status
            .violations
            .iter()
            .take(MAX_VIOLATIONS)
            .map(|v| ViolationView {
                acknowledge_command: Some(acknowledge_command(&namespace, &name, v.id)),
                ..violation(v)
            })
            .collect(),
        acknowledged_violations: status
            .acknowledged_violations
            .iter()
            .take(MAX_VIOLATIONS)
            .map(|a| ViolationView {
                reason: Some(a.reason.clone()),
                acknowledged_at: Some(a.acknowledged_at.0.to_string()),
                ..violation(&a.violation)
            })
            .collect(),
        protect_command: (spec.mode == PolicyMode::Monitor)
            .then(|| protect_command(&namespace, &name)),
        name,
    }
}

fn backend_name(backend: network_enforcer_api::Backend) -> &'static str {
    match backend {
        network_enforcer_api::Backend::Kubernetes => "kubernetes",
        network_enforcer_api::Backend::Istio => "istio",
    }
}

/// The rules of one payload as text, with each one's usage entry when `usage` is a list of them.
pub fn rules(
    direction: Direction,
    kubernetes: Option<&NetworkPolicySpec>,
    istio: Option<&IstioPolicy>,
    usage: Option<&serde_json::Value>,
) -> Vec<RuleView> {
    let mut out = Vec::new();
    if let Some(spec) = kubernetes {
        let rules = crate::graph::rules_in(spec, direction);
        for (index, (peers, ports)) in rules.into_iter().enumerate() {
            let peers = match peers {
                Some(peers) if !peers.is_empty() => peers.iter().map(peer_text).collect(),
                _ => vec!["any peer".to_string()],
            };
            out.push(RuleView {
                index,
                peers,
                ports: port_labels(ports).into_iter().collect(),
                usage: None,
            });
        }
    }
    if let Some(istio) = istio {
        for (index, rule) in istio.rules.iter().enumerate() {
            let mut peers: Vec<String> = rule
                .from
                .iter()
                .flat_map(|f| f.source.principals.iter().cloned())
                .collect();
            if peers.is_empty() {
                peers.push("any peer".into());
            }
            let mut ports: Vec<String> = rule
                .to
                .iter()
                .flat_map(|t| &t.operation.ports)
                .map(|p| format!("TCP {p}"))
                .collect();
            if ports.is_empty() {
                ports.push("any port".into());
            }
            out.push(RuleView {
                index,
                peers,
                ports,
                usage: None,
            });
        }
    }
    if let Some(entries) = usage.and_then(|u| u.as_array()) {
        // Entries of another list (`list: egressNames`) belong to `name_rules`.
        let own = entries
            .iter()
            .filter(|e| e.get("list").is_none_or(|l| l.is_null()));
        for (position, entry) in own.enumerate() {
            // An entry names its rule by index when it has one, else it is the rule at its position.
            let index = ["rule", "ruleIndex", "index"]
                .iter()
                .find_map(|k| entry.get(*k).and_then(|v| v.as_u64()))
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(position);
            if let Some(rule) = out.iter_mut().find(|r| r.index == index) {
                rule.usage = Some(entry.clone());
            }
        }
    }
    out
}

/// `spec.egressNames` as text, each entry with its usage when `usage` (a `status.ruleUsage` list)
/// has an entry of list `egressNames` for it.
pub fn name_rules(entries: &[NameRule], usage: Option<&serde_json::Value>) -> Vec<NameRuleView> {
    let usage_of = |index: usize| {
        usage
            .and_then(|u| u.as_array())?
            .iter()
            .find(|e| {
                e.get("list").and_then(|l| l.as_str()) == Some("egressNames")
                    && e.get("rule").and_then(|r| r.as_u64()) == u64::try_from(index).ok()
            })
            .cloned()
    };
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| NameRuleView {
            index,
            names: entry.names.clone(),
            ports: port_labels(Some(&entry.ports)).into_iter().collect(),
            usage: usage_of(index),
        })
        .collect()
}

/// One peer of a NetworkPolicy rule, as text.
pub fn peer_text(peer: &NetworkPolicyPeer) -> String {
    if let Some(block) = &peer.ip_block {
        let except = block.except.clone().unwrap_or_default();
        return if except.is_empty() {
            block.cidr.clone()
        } else {
            format!("{} except {}", block.cidr, except.join(", "))
        };
    }
    let pods = peer
        .pod_selector
        .as_ref()
        .map(selector_text)
        .unwrap_or_else(|| "all".into());
    match &peer.namespace_selector {
        None => format!("pods {pods}"),
        Some(ns) => format!("namespaces {} / pods {pods}", selector_text(ns)),
    }
}

/// One side of a violation record, as text.
pub fn side(w: &WorkloadRef) -> String {
    if !w.owner_name.is_empty() {
        format!("{}/{} {}", w.namespace, w.owner_kind, w.owner_name)
    } else if !w.dns_name.is_empty() {
        // The name the pod resolved the address from: what `egressNames` would list.
        format!("{} ({})", w.dns_name, w.address)
    } else if !w.address.is_empty() {
        w.address.clone()
    } else if !w.identity.is_empty() {
        w.identity.clone()
    } else {
        "unknown".into()
    }
}

fn conditions(conditions: &[Condition]) -> Vec<ConditionView> {
    conditions
        .iter()
        .map(|c| ConditionView {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect()
}

/// `kubectl label wnpp -n <ns> <name> networkenforcer.kubewarden.io/promote=<mode> --overwrite`
/// (docs/api.md, "Labels and annotations").
pub fn promote_command(namespace: &str, proposal: &str, mode: &str) -> String {
    format!(
        "kubectl label wnpp -n {} {} {PROMOTE_LABEL}={mode} --overwrite",
        shell_quote(namespace),
        shell_quote(proposal)
    )
}

/// `kubectl annotate wnp -n <ns> <policy> networkenforcer.kubewarden.io/acknowledge-<id>='<reason>'`.
pub fn acknowledge_command(namespace: &str, policy: &str, id: i64) -> String {
    format!(
        "kubectl annotate wnp -n {} {} {ACKNOWLEDGE_ANNOTATION_PREFIX}{id}='reason'",
        shell_quote(namespace),
        shell_quote(policy)
    )
}

/// The merge patch that switches a monitor policy to protect (docs/operations.md).
pub fn protect_command(namespace: &str, policy: &str) -> String {
    format!(
        "kubectl patch wnp -n {} {} --type merge -p '{{\"spec\":{{\"mode\":\"protect\"}}}}'",
        shell_quote(namespace),
        shell_quote(policy)
    )
}

/// `s` as one shell word: unchanged when it is plain (Kubernetes names are), else single-quoted.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '/'))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
