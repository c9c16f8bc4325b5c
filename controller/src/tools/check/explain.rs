//! `check --explain` (docs/operations.md, "`check`"): which rule of which policy allowed each side of
//! a flow, or which policies isolate it and match nothing. The verdicts come from the evaluators; this
//! module turns them into a [`Decision`] and renders rules short enough for a table row, e.g.
//! `ingress[1] from app=web ns=shop TCP/8080`.

use super::{DecidingPolicy, PolicyKind, Side, TierStep};
use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use network_enforcer_api::{Direction, IstioRule, NameRule, Protocol};
use serde::Serialize;

/// How one side of a flow was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// No policy isolates this side (or it is no pod): everything passes.
    NotIsolated,
    /// Isolated, and at least one rule of the isolating policies matches (`rules` names them).
    Allowed,
    /// Isolated, and no rule of any isolating policy matches (`policies` names them).
    Isolated,
    /// A ClusterNetworkPolicy rule decided (`tiers` names it, `decided_by` its tier).
    ClusterPolicy,
}

impl Decision {
    /// The decision of a side: whether it allows the flow, and whether any policy decided it (a
    /// [`Side`] lists the allowing policies when allowed, every isolating one when denied).
    pub fn of(allowed: bool, decided_by_policies: bool) -> Self {
        match (allowed, decided_by_policies) {
            (true, false) => Decision::NotIsolated,
            (true, true) => Decision::Allowed,
            // A side can only be denied by policies isolating it; without any it would be open.
            (false, _) => Decision::Isolated,
        }
    }
}

/// A rule that allows a side of a flow: the policy, the rule's index in its list (`spec.ingress`,
/// `spec.egress`, or the istio payload's `rules`) and the rule rendered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MatchedRule {
    #[serde(flatten)]
    pub policy: DecidingPolicy,
    pub index: usize,
    /// E.g. `ingress[1] from app=web ns=shop TCP/8080`.
    pub rule: String,
}

/// `np/<namespace>/<name>` or `wnp/<namespace>/<name>`: a policy in one table cell.
pub(super) fn policy_text(policy: &DecidingPolicy) -> String {
    let kind = match policy.kind {
        PolicyKind::NetworkPolicy => "np",
        PolicyKind::WorkloadNetworkPolicy => "wnp",
    };
    format!("{kind}/{}/{}", policy.namespace, policy.name)
}

/// The explanation of an explained side in words: `not isolated`, `allowed by <policy> <rule>; ...`
/// or `isolated by <policy>, <policy>; no rule matches`.
pub fn explanation_text(side: &Side) -> String {
    if side.tiers.is_empty() {
        return network_policy_text(side);
    }
    // The trail through the tiers: `[Admin] cnp/tenants rule 2 Pass → [NetworkPolicy] allowed by
    // np/shop/api rule … → …`.
    let step = |s: &TierStep| {
        let name = s
            .name
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        format!(
            "[{}] cnp/{} rule {}{name} {}",
            s.tier, s.policy, s.index, s.action
        )
    };
    let mut trail: Vec<String> = side
        .tiers
        .iter()
        .filter(|s| s.tier == "Admin")
        .map(step)
        .collect();
    if side.decided_by.as_deref() != Some("Admin") {
        let reached_baseline = side.tiers.iter().any(|s| s.tier == "Baseline");
        if !reached_baseline || !side.policies.is_empty() {
            trail.push(format!("[NetworkPolicy] {}", network_policy_text(side)));
        }
        trail.extend(side.tiers.iter().filter(|s| s.tier == "Baseline").map(step));
    }
    trail.join(" → ")
}

/// The NetworkPolicy tier's part of an explanation.
fn network_policy_text(side: &Side) -> String {
    match Decision::of(side.allowed, !side.policies.is_empty()) {
        Decision::NotIsolated => "not isolated".to_string(),
        Decision::Allowed if !side.rules.is_empty() => {
            let rules: Vec<String> = side
                .rules
                .iter()
                .map(|r| format!("{} {}", policy_text(&r.policy), r.rule))
                .collect();
            format!("allowed by {}", rules.join("; "))
        }
        // Rules are only looked up with --explain; the policies still say who allowed.
        Decision::Allowed => format!("allowed by {}", policies_text(&side.policies)),
        Decision::Isolated => format!(
            "isolated by {}; no rule matches",
            policies_text(&side.policies)
        ),
        Decision::ClusterPolicy => "decided by a ClusterNetworkPolicy".to_string(),
    }
}

fn policies_text(policies: &[DecidingPolicy]) -> String {
    policies
        .iter()
        .map(policy_text)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A NetworkPolicy rule: `ingress[1] from app=web ns=shop TCP/8080`. `peers` is the rule's `from`
/// (ingress) or `to` (egress); a podSelector without namespaceSelector selects in
/// `policy_namespace`, which is therefore shown.
pub fn network_policy_rule(
    direction: Direction,
    index: usize,
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
    policy_namespace: &str,
) -> String {
    let (list, preposition) = match direction {
        Direction::Ingress => ("ingress", "from"),
        Direction::Egress => ("egress", "to"),
    };
    let peers = match peers {
        None | Some([]) => "anywhere".to_string(),
        Some(peers) => peers
            .iter()
            .map(|p| peer_text(p, policy_namespace))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let ports = match ports {
        None | Some([]) => "all ports".to_string(),
        Some(ports) => ports.iter().map(port_text).collect::<Vec<_>>().join(", "),
    };
    format!("{list}[{index}] {preposition} {peers} {ports}")
}

/// An istio payload's rule (ztunnel enforces TCP only): `rules[0] from cluster.local/ns/shop/sa/web
/// TCP/9000`.
pub fn istio_rule(index: usize, rule: &IstioRule) -> String {
    let from = if rule.from.is_empty() {
        "anywhere".to_string()
    } else {
        rule.from
            .iter()
            .map(|f| match f.source.principals.as_slice() {
                // An empty principal list is no constraint: plaintext peers too.
                [] => "anywhere".to_string(),
                principals => principals.join(", "),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let to = if rule.to.is_empty() {
        "all ports".to_string()
    } else {
        rule.to
            .iter()
            .flat_map(|t| match t.operation.ports.as_slice() {
                [] => vec!["TCP/*".to_string()],
                ports => ports.iter().map(|p| format!("TCP/{p}")).collect(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("rules[{index}] from {from} {to}")
}

fn peer_text(peer: &NetworkPolicyPeer, policy_namespace: &str) -> String {
    if let Some(block) = &peer.ip_block {
        return match block.except.as_deref() {
            None | Some([]) => block.cidr.clone(),
            Some(except) => format!("{} except {}", block.cidr, except.join(",")),
        };
    }
    let pods = peer
        .pod_selector
        .as_ref()
        .map_or_else(|| "*".to_string(), selector_text);
    let namespaces = match &peer.namespace_selector {
        None => format!("ns={policy_namespace}"),
        Some(selector) => namespace_selector_text(selector),
    };
    format!("{pods} {namespaces}")
}

/// `ns=<name>` for the usual selector on the namespace's name label, `ns=*` for every namespace,
/// `ns(<selector>)` otherwise.
fn namespace_selector_text(selector: &LabelSelector) -> String {
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    let labels = selector.match_labels.as_ref();
    if expressions.is_empty() {
        match labels.map(|l| l.iter().collect::<Vec<_>>()).as_deref() {
            None | Some([]) => return "ns=*".to_string(),
            Some([(key, name)]) if key.as_str() == NAMESPACE_NAME_LABEL => {
                return format!("ns={name}");
            }
            _ => {}
        }
    }
    format!("ns({})", selector_text(selector))
}

/// A label selector as `kubectl -l` writes one: `app=web,tier in (a,b),!legacy`; `*` when empty.
fn selector_text(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            // Validation refuses other operators; shown as written rather than hidden.
            other => format!("{} {other} ({values})", e.key),
        });
    }
    if parts.is_empty() {
        "*".to_string()
    } else {
        parts.join(",")
    }
}

/// `TCP/8080`, `TCP/5000-9000`, `TCP/http` (a named port), `UDP/*` (every port of the protocol).
/// A `spec.egressNames` entry that allowed a flow to an address resolved from `name`: `by name
/// api.example.test (spec.egressNames[0])`, and the entry's wildcard when that is what matched
/// (`by name eu.storage.example.test (spec.egressNames[1]: *.storage.example.test)`).
pub fn name_rule(index: usize, entry: &NameRule, name: &str) -> String {
    let listed = entry.names.iter().any(|n| n == name);
    let pattern = entry
        .names
        .iter()
        .find(|n| !listed && network_enforcer_api::dns_name::matches(n, name));
    match pattern {
        Some(pattern) => format!("by name {name} (spec.egressNames[{index}]: {pattern})"),
        None => format!("by name {name} (spec.egressNames[{index}])"),
    }
}

fn port_text(port: &NetworkPolicyPort) -> String {
    let protocol = port.protocol.as_deref().unwrap_or(Protocol::TCP.as_str());
    let number = match (&port.port, port.end_port) {
        (None, _) => "*".to_string(),
        (Some(IntOrString::Int(p)), Some(end)) => format!("{p}-{end}"),
        (Some(IntOrString::Int(p)), None) => p.to_string(),
        (Some(IntOrString::String(name)), _) => name.clone(),
    };
    format!("{protocol}/{number}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn np_rule(direction: Direction, index: usize, rule: serde_json::Value) -> String {
        let peers: Option<Vec<NetworkPolicyPeer>> =
            serde_json::from_value(rule["peers"].clone()).unwrap();
        let ports: Option<Vec<NetworkPolicyPort>> =
            serde_json::from_value(rule["ports"].clone()).unwrap();
        network_policy_rule(direction, index, peers.as_deref(), ports.as_deref(), "shop")
    }

    #[test]
    fn network_policy_rules_render_short() {
        let cases = [
            (
                Direction::Ingress,
                1,
                json!({"peers": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                       "ports": [{"protocol": "TCP", "port": 8080}]}),
                "ingress[1] from app=web ns=shop TCP/8080",
            ),
            (
                Direction::Egress,
                0,
                json!({"peers": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                  "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                       "ports": [{"protocol": "UDP", "port": 53}, {"port": "dns-tcp"}]}),
                "egress[0] to k8s-app=kube-dns ns=kube-system UDP/53, TCP/dns-tcp",
            ),
            (
                Direction::Ingress,
                2,
                json!({"peers": null, "ports": null}),
                "ingress[2] from anywhere all ports",
            ),
            (
                Direction::Egress,
                3,
                json!({"peers": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "10.2.0.0/16"]}},
                                 {"ipBlock": {"cidr": "192.0.2.0/24"}}],
                       "ports": [{"protocol": "TCP", "port": 5000, "endPort": 9000}, {"protocol": "SCTP"}]}),
                "egress[3] to 10.0.0.0/8 except 10.1.0.0/16,10.2.0.0/16, 192.0.2.0/24 TCP/5000-9000, SCTP/*",
            ),
            (
                Direction::Ingress,
                0,
                json!({"peers": [{"namespaceSelector": {"matchLabels": {"team": "b"}}},
                                 {"namespaceSelector": {}},
                                 {"podSelector": {}},
                                 {"podSelector": {"matchLabels": {"app": "web", "tier": "front"},
                                                  "matchExpressions": [
                                                      {"key": "env", "operator": "In", "values": ["a", "b"]},
                                                      {"key": "x", "operator": "NotIn", "values": ["c"]},
                                                      {"key": "y", "operator": "Exists"},
                                                      {"key": "z", "operator": "DoesNotExist"}]}}],
                       "ports": []}),
                "ingress[0] from * ns(team=b), * ns=*, * ns=shop, app=web,tier=front,env in (a,b),x notin (c),y,!z ns=shop all ports",
            ),
        ];
        for (direction, index, rule, expected) in cases {
            assert_eq!(np_rule(direction, index, rule), expected);
        }
    }

    #[test]
    fn istio_rules_render_short() {
        let cases = [
            (
                json!({"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/web"]}}],
                       "to": [{"operation": {"ports": ["9000"]}}]}),
                "rules[0] from cluster.local/ns/shop/sa/web TCP/9000",
            ),
            (json!({}), "rules[0] from anywhere all ports"),
            (
                json!({"from": [{"source": {"principals": []}}, {"source": {"principals": ["*", "a/*"]}}],
                       "to": [{"operation": {"ports": []}}, {"operation": {"ports": ["80-90"]}}]}),
                "rules[0] from anywhere, *, a/* TCP/*, TCP/80-90",
            ),
        ];
        for (rule, expected) in cases {
            let rule: IstioRule = serde_json::from_value(rule).unwrap();
            assert_eq!(istio_rule(0, &rule), expected);
        }
    }

    fn policy(kind: PolicyKind, name: &str) -> DecidingPolicy {
        DecidingPolicy {
            kind,
            namespace: "shop".into(),
            name: name.into(),
            mode: None,
        }
    }

    #[test]
    fn decisions_and_their_words() {
        let a = policy(PolicyKind::NetworkPolicy, "a");
        let b = policy(PolicyKind::WorkloadNetworkPolicy, "b");
        let rule = MatchedRule {
            policy: a.clone(),
            index: 1,
            rule: "ingress[1] from app=web ns=shop TCP/8080".into(),
        };
        let side = |allowed, policies: Vec<DecidingPolicy>, rules: Vec<MatchedRule>| Side {
            allowed,
            policies,
            decision: None,
            rules,
            tiers: vec![],
            decided_by: None,
        };
        let cases = [
            (
                side(true, vec![], vec![]),
                Decision::NotIsolated,
                "not isolated",
            ),
            (
                side(true, vec![a.clone()], vec![rule.clone()]),
                Decision::Allowed,
                "allowed by np/shop/a ingress[1] from app=web ns=shop TCP/8080",
            ),
            (
                side(
                    true,
                    vec![a.clone(), b.clone()],
                    vec![
                        rule.clone(),
                        MatchedRule {
                            policy: b.clone(),
                            index: 0,
                            rule: "rules[0] from anywhere all ports".into(),
                        },
                    ],
                ),
                Decision::Allowed,
                "allowed by np/shop/a ingress[1] from app=web ns=shop TCP/8080; wnp/shop/b rules[0] from anywhere all ports",
            ),
            (
                side(false, vec![a.clone(), b.clone()], vec![]),
                Decision::Isolated,
                "isolated by np/shop/a, wnp/shop/b; no rule matches",
            ),
        ];
        for (side, decision, text) in cases {
            assert_eq!(
                Decision::of(side.allowed, !side.policies.is_empty()),
                decision
            );
            assert_eq!(explanation_text(&side), text);
        }
    }
}
