//! The cluster guardrails page (`#/cluster`): the ClusterNetworkPolicyProposals the leader learned
//! from the namespace graph (docs/behaviour.md §1.11), whether each is promoted, in monitor (with
//! what it would deny) or in force, what the API's limits widened, and the command of the next
//! step; then every ClusterNetworkPolicy in the order the tiers consult them, learned or written by
//! hand, and why one the controller and the agent cannot use is left out. Pure: a [`Snapshot`] in,
//! a [`ClusterPage`] out.

use crate::graph::selector_text;
use crate::policy::cluster_promote::{MONITORED, RENDERED, is_ours};
use crate::ui::objects::Snapshot;
use network_enforcer_api::WorkloadRef;
use network_enforcer_api::cluster_network_policy::{
    ClusterNetworkPolicy, ClusterNetworkPolicyRule, ClusterNetworkPolicySubject,
};
use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposal;
use network_enforcer_api::keys::{
    NAMESPACE_NAME_LABEL, PROMOTE_LABEL, PROMOTE_MONITOR, PROMOTE_PROTECT,
};
use serde::Serialize;

/// One proposal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProposalRow {
    pub name: String,
    /// `Admin` or `Baseline`.
    pub tier: String,
    pub priority: i32,
    /// The namespace its subject selects by name, when it selects one that way.
    pub namespace: Option<String>,
    pub ingress_rules: usize,
    pub egress_rules: usize,
    /// The `promote` label's value, if any.
    pub promote: Option<String>,
    /// `in force`, `in monitor`, `not in force` (with `reason`), or `not promoted`.
    pub state: String,
    /// In monitor: the active violations, and the newest few (`bank/client → shop/web TCP 8080,
    /// ingress`).
    pub active_violations: i64,
    pub violations: Vec<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub last_learned: Option<String>,
    pub notes: Vec<String>,
    /// What to run next: monitor it, put it in force, or take it out again.
    pub command: String,
}

/// One ClusterNetworkPolicy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRow {
    pub name: String,
    /// `Admin` or `Baseline`.
    pub tier: String,
    pub priority: i32,
    /// What its subject selects (`namespaces {kubernetes.io/metadata.name=shop}`).
    pub subject: String,
    /// Each rule's action (and name), in order.
    pub ingress: Vec<String>,
    pub egress: Vec<String>,
    /// The proposal it was promoted from; `None`: not ours (written by hand or by another tool).
    pub promoted_from: Option<String>,
    /// Why the controller and the agent leave it out (they judge and enforce without it).
    pub invalid: Option<String>,
}

/// The page.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPage {
    /// False until the proposals have listed (never where the CRD is not installed).
    pub listed: bool,
    pub proposals: Vec<ProposalRow>,
    /// False until the ClusterNetworkPolicies have listed (never where upstream's CRD is not
    /// installed).
    pub policies_listed: bool,
    /// In the order the tiers consult them: Admin, then Baseline, each by priority, then name.
    pub policies: Vec<PolicyRow>,
}

/// How many of a proposal's newest violations its row shows (the status has up to 100).
const VIOLATIONS_SHOWN: usize = 5;

/// The page for `snapshot`, proposals by tier (Admin first), then name.
pub fn build(snapshot: &Snapshot) -> ClusterPage {
    let mut proposals: Vec<ProposalRow> = snapshot.cluster_proposals.iter().map(row).collect();
    proposals.sort_by(|a, b| (&a.tier, &a.name).cmp(&(&b.tier, &b.name)));
    let mut policies: Vec<PolicyRow> = snapshot.cluster_policies.iter().map(policy_row).collect();
    let tier_order = |tier: &str| u8::from(tier != "Admin");
    policies.sort_by(|a, b| {
        (tier_order(&a.tier), a.priority, &a.name).cmp(&(tier_order(&b.tier), b.priority, &b.name))
    });
    ClusterPage {
        listed: snapshot.cluster_proposals_listed,
        proposals,
        policies_listed: snapshot.cluster_policies_listed,
        policies,
    }
}

fn policy_row(policy: &ClusterNetworkPolicy) -> PolicyRow {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let spec = &policy.spec;
    let rules = |rules: &[ClusterNetworkPolicyRule]| -> Vec<String> {
        rules
            .iter()
            .map(|r| match &r.name {
                Some(name) => format!("{} ({name})", r.action),
                None => r.action.clone(),
            })
            .collect()
    };
    PolicyRow {
        tier: spec.tier.clone(),
        priority: spec.priority,
        subject: subject_text(&spec.subject),
        ingress: rules(&spec.ingress),
        egress: rules(&spec.egress),
        promoted_from: is_ours(policy).then(|| {
            policy
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(network_enforcer_api::keys::PROMOTED_FROM_LABEL))
                .cloned()
                .unwrap_or_default()
        }),
        invalid: netpol::cluster::ClusterPolicy::parse(&name, spec)
            .err()
            .map(|why| why.to_string()),
        name,
    }
}

/// A subject in words: the namespaces it selects, or the pods in them.
fn subject_text(subject: &ClusterNetworkPolicySubject) -> String {
    match (&subject.namespaces, &subject.pods) {
        (Some(namespaces), _) => format!("namespaces {}", selector_text(namespaces)),
        (None, Some(pods)) => format!(
            "pods {} in namespaces {}",
            selector_text(&pods.pod_selector),
            selector_text(&pods.namespace_selector)
        ),
        (None, None) => "nothing".into(),
    }
}

fn row(p: &ClusterNetworkPolicyProposal) -> ProposalRow {
    let name = p.metadata.name.clone().unwrap_or_default();
    let policy = &p.spec.policy;
    let promote = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PROMOTE_LABEL))
        .cloned();
    let status = p.status.clone().unwrap_or_default();
    let rendered = status.conditions.iter().find(|c| c.type_ == RENDERED);
    let state = match (&promote, rendered) {
        (None, _) => "not promoted",
        (Some(_), Some(c)) if c.status == "True" => "in force",
        (Some(_), Some(c)) if c.reason == MONITORED => "in monitor",
        (Some(_), Some(_)) => "not in force",
        (Some(_), None) => "promoted, not checked yet",
    };
    let command = match promote.as_deref() {
        None => format!("kubectl label cnpp {name} {PROMOTE_LABEL}={PROMOTE_MONITOR}"),
        Some(PROMOTE_MONITOR) => {
            format!("kubectl label --overwrite cnpp {name} {PROMOTE_LABEL}={PROMOTE_PROTECT}")
        }
        Some(_) => format!("kubectl label cnpp {name} {PROMOTE_LABEL}-"),
    };
    let side = |w: &WorkloadRef| {
        if w.owner_name.is_empty() {
            w.address.clone()
        } else {
            format!("{}/{}", w.namespace, w.owner_name)
        }
    };
    let violations = status
        .violations
        .iter()
        .take(VIOLATIONS_SHOWN)
        .map(|v| {
            format!(
                "{} → {} {} {}, {}",
                side(&v.source),
                side(&v.dest),
                v.protocol.as_str(),
                v.dst_port.map_or_else(|| "?".into(), |p| p.to_string()),
                v.direction.map_or("?", |d| d.as_str()).to_lowercase()
            )
        })
        .collect();
    ProposalRow {
        tier: policy.tier.clone(),
        priority: policy.priority,
        namespace: policy
            .subject
            .namespaces
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .and_then(|l| l.get(NAMESPACE_NAME_LABEL))
            .cloned(),
        ingress_rules: policy.ingress.len(),
        egress_rules: policy.egress.len(),
        promote,
        state: state.to_string(),
        reason: rendered
            .filter(|c| c.status != "True")
            .map(|c| c.reason.clone()),
        message: rendered.map(|c| c.message.clone()),
        active_violations: status.active_violation_count,
        violations,
        last_learned: status.last_learned_time.map(|t| t.0.to_string()),
        notes: status.notes,
        command,
        name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
    use network_enforcer_api::cluster_network_policy::{
        ClusterNetworkPolicyRule, ClusterNetworkPolicySpec, ClusterNetworkPolicySubject,
    };
    use network_enforcer_api::cluster_proposal::{
        ClusterNetworkPolicyProposalSpec, ClusterNetworkPolicyProposalStatus,
    };
    use std::collections::BTreeMap;

    fn proposal(
        name: &str,
        tier: &str,
        promote: Option<&str>,
        rendered: Option<(&str, &str)>,
    ) -> ClusterNetworkPolicyProposal {
        let mut p = ClusterNetworkPolicyProposal::new(
            name,
            ClusterNetworkPolicyProposalSpec {
                policy: ClusterNetworkPolicySpec {
                    tier: tier.into(),
                    priority: 900,
                    subject: ClusterNetworkPolicySubject {
                        namespaces: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                NAMESPACE_NAME_LABEL.to_string(),
                                "shop".to_string(),
                            )])),
                            ..LabelSelector::default()
                        }),
                        pods: None,
                    },
                    ingress: vec![ClusterNetworkPolicyRule::default(); 2],
                    ..ClusterNetworkPolicySpec::default()
                },
            },
        );
        if let Some(value) = promote {
            p.metadata.labels = Some(BTreeMap::from([(PROMOTE_LABEL.into(), value.into())]));
        }
        p.status = Some(ClusterNetworkPolicyProposalStatus {
            last_learned_time: Some(Time("2026-12-06T03:00:00Z".parse().unwrap())),
            notes: vec![],
            conditions: rendered
                .map(|(status, reason)| Condition {
                    type_: RENDERED.into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: format!("{reason} message"),
                    last_transition_time: Time("2026-12-06T03:00:00Z".parse().unwrap()),
                    observed_generation: None,
                })
                .into_iter()
                .collect(),
            ..ClusterNetworkPolicyProposalStatus::default()
        });
        p
    }

    #[test]
    fn the_page_lists_each_proposal_with_its_state_and_command() {
        let mut monitored = proposal(
            "ne-floor-bank",
            "Baseline",
            Some("monitor"),
            Some(("False", "Monitored")),
        );
        let status = monitored.status.as_mut().unwrap();
        status.active_violation_count = 7;
        status.violations = (0..7)
            .map(|id| network_enforcer_api::ViolationRecord {
                id,
                timestamp: Time("2026-12-06T03:00:00Z".parse().unwrap()),
                source: WorkloadRef {
                    namespace: "bank".into(),
                    owner_kind: "Deployment".into(),
                    owner_name: "client".into(),
                    ..WorkloadRef::default()
                },
                dest: WorkloadRef {
                    address: "198.51.100.7".into(),
                    ..WorkloadRef::default()
                },
                protocol: network_enforcer_api::Protocol::TCP,
                dst_port: Some(443),
                action: network_enforcer_api::PolicyMode::Monitor,
                direction: Some(network_enforcer_api::Direction::Egress),
                denying_policy_namespace: String::new(),
                denying_policy_name: "ne-floor-bank".into(),
            })
            .collect();
        let snapshot = Snapshot {
            cluster_proposals: vec![
                proposal("ne-floor-shop", "Baseline", None, None),
                proposal(
                    "ne-isolate-shop",
                    "Admin",
                    Some("protect"),
                    Some(("True", "Rendered")),
                ),
                proposal(
                    "ne-isolate-db",
                    "Admin",
                    Some("protect"),
                    Some(("False", "NameTaken")),
                ),
                monitored,
            ],
            cluster_proposals_listed: true,
            ..Snapshot::default()
        };
        let page = build(&snapshot);
        assert!(page.listed);
        let rows: Vec<(&str, &str, Option<&str>)> = page
            .proposals
            .iter()
            .map(|r| (r.name.as_str(), r.state.as_str(), r.reason.as_deref()))
            .collect();
        assert_eq!(
            rows,
            [
                ("ne-isolate-db", "not in force", Some("NameTaken")),
                ("ne-isolate-shop", "in force", None),
                ("ne-floor-bank", "in monitor", Some("Monitored")),
                ("ne-floor-shop", "not promoted", None),
            ]
        );
        let monitor = &page.proposals[2];
        assert_eq!(monitor.active_violations, 7);
        assert_eq!(monitor.violations.len(), VIOLATIONS_SHOWN);
        assert_eq!(
            monitor.violations[0],
            "bank/client → 198.51.100.7 TCP 443, egress"
        );
        assert_eq!(
            monitor.command,
            "kubectl label --overwrite cnpp ne-floor-bank networkenforcer.kubewarden.io/promote=protect"
        );
        let floor = &page.proposals[3];
        assert_eq!(floor.namespace.as_deref(), Some("shop"));
        assert_eq!((floor.ingress_rules, floor.egress_rules), (2, 0));
        assert_eq!(
            floor.command,
            "kubectl label cnpp ne-floor-shop networkenforcer.kubewarden.io/promote=monitor"
        );
        assert_eq!(
            page.proposals[1].command,
            "kubectl label cnpp ne-isolate-shop networkenforcer.kubewarden.io/promote-"
        );
        assert_eq!(floor.last_learned.as_deref(), Some("2026-12-06T03:00:00Z"));
        assert!(!build(&Snapshot::default()).listed);
    }

    /// Every ClusterNetworkPolicy is listed in the order the tiers consult them, learned ones with
    /// their proposal, and one the controller and the agent cannot use with why.
    #[test]
    fn the_page_lists_every_cluster_policy_in_precedence_order() {
        use crate::policy::render::MANAGED_BY_LABEL;
        use network_enforcer_api::keys::PROMOTED_FROM_LABEL;
        let cnp = |name: &str, spec: serde_json::Value| {
            ClusterNetworkPolicy::new(name, serde_json::from_value(spec).unwrap())
        };
        let mut learned = cnp(
            "ne-isolate-shop",
            serde_json::json!({"tier": "Admin", "priority": 900,
                "subject": {"namespaces": {"matchLabels": {NAMESPACE_NAME_LABEL: "shop"}}},
                "ingress": [{"action": "Pass", "from": [{"namespaces": {}}]},
                            {"action": "Deny", "from": [{"namespaces": {}}]}]}),
        );
        learned.metadata.labels = Some(BTreeMap::from([
            (
                MANAGED_BY_LABEL.0.to_string(),
                MANAGED_BY_LABEL.1.to_string(),
            ),
            (
                PROMOTED_FROM_LABEL.to_string(),
                "ne-isolate-shop".to_string(),
            ),
        ]));
        let snapshot = Snapshot {
            cluster_policies: vec![
                cnp(
                    "floor",
                    serde_json::json!({"tier": "Baseline", "priority": 5,
                        "subject": {"pods": {"namespaceSelector": {},
                                             "podSelector": {"matchLabels": {"app": "db"}}}},
                        "egress": [{"action": "Deny", "to": [{"namespaces": {}}]}]}),
                ),
                learned,
                cnp(
                    "allow-probes",
                    serde_json::json!({"tier": "Admin", "priority": 10,
                        "subject": {"namespaces": {}},
                        "ingress": [{"name": "probes", "action": "Accept",
                                     "from": [{"namespaces": {}}]}]}),
                ),
                cnp(
                    "odd",
                    serde_json::json!({"tier": "Middle", "priority": 1,
                        "subject": {"namespaces": {}}}),
                ),
            ],
            cluster_policies_listed: true,
            ..Snapshot::default()
        };
        let page = build(&snapshot);
        assert!(page.policies_listed);
        type Row<'a> = (
            &'a str,
            &'a str,
            Vec<String>,
            Vec<String>,
            Option<&'a str>,
            bool,
        );
        let rows: Vec<Row> = page
            .policies
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.subject.as_str(),
                    r.ingress.clone(),
                    r.egress.clone(),
                    r.promoted_from.as_deref(),
                    r.invalid.is_some(),
                )
            })
            .collect();
        let texts = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rows,
            [
                (
                    "allow-probes",
                    "namespaces all",
                    texts(&["Accept (probes)"]),
                    vec![],
                    None,
                    false
                ),
                (
                    "ne-isolate-shop",
                    "namespaces {kubernetes.io/metadata.name=shop}",
                    texts(&["Pass", "Deny"]),
                    vec![],
                    Some("ne-isolate-shop"),
                    false
                ),
                ("odd", "namespaces all", vec![], vec![], None, true),
                (
                    "floor",
                    "pods {app=db} in namespaces all",
                    vec![],
                    texts(&["Deny"]),
                    None,
                    false
                ),
            ]
        );
        assert!(
            page.policies[2]
                .invalid
                .as_deref()
                .unwrap_or_default()
                .contains("Middle"),
            "{:?}",
            page.policies[2].invalid
        );
        assert!(!build(&Snapshot::default()).policies_listed);
    }
}
