//! The CRDs' CEL rules ([`crate::crd::rules`]) as Rust, for the controller.
//!
//! The API server refuses a bad policy or proposal with these rules' messages, but only where it runs
//! them: Kubernetes < 1.25 ignores CEL, CRDs can be applied without validation, and objects restored
//! from a backup skip admission. The controller therefore checks every rule itself before it promotes
//! or renders (docs/design.md, "Validate at admission, and again in the controller"), with the same messages,
//! so a user sees the same sentence whichever side refused. `api/tests/cel_rules.rs` runs one table of
//! objects through both the CEL rules and [`validate`] and requires them to agree on every case.

use crate::crd::{
    Backend, Direction, IstioPolicy, MAX_NAME_RULES, MAX_NAMES_PER_RULE, MAX_PORTS_PER_NAME_RULE,
    NameRule, Protocol, TargetRef, WorkloadNetworkPolicyProposalSpec, WorkloadNetworkPolicySpec,
    rules,
};
use crate::dns_name;
use k8s_openapi::api::networking::v1::{NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// One CEL rule of the CRDs (both kinds carry the same set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// `targetRef` and `direction` are set. Also `required` in the schema, which every Kubernetes
    /// version enforces, so a typed spec always satisfies it.
    Required,
    /// The istio backend governs Ingress only.
    IstioIngressOnly,
    /// `kubernetes.policyTypes` is exactly `[direction]`.
    PolicyTypes,
    /// Exactly one payload, the one `backend` names.
    OnePayload,
    /// `kubernetes.podSelector` selects by something.
    PodSelectorNotEmpty,
    /// `istio.selector` selects by something.
    IstioSelectorNotEmpty,
    /// `backend` never changes (a transition rule: needs the previous backend).
    BackendImmutable,
    /// `targetRef.kind` is a kind we resolve workloads to. Also an `enum` in the schema, which every
    /// Kubernetes version enforces, so a typed spec always satisfies it.
    TargetKind,
    /// `targetRef.name` is a DNS-1123 subdomain.
    TargetName,
    /// `egressNames` only with direction Egress and backend kubernetes.
    EgressNamesScope,
    /// At most [`MAX_NAME_RULES`] `egressNames` entries.
    EgressNamesCount,
    /// Each `egressNames` entry has 1 to [`MAX_NAMES_PER_RULE`] names and at most
    /// [`MAX_PORTS_PER_NAME_RULE`] ports.
    NameRuleSize,
    /// Each name of `egressNames` is one [`dns_name::name_pattern`] accepts.
    NameRuleNames,
    /// Each port of `egressNames` has protocol TCP, UDP or SCTP (or none) and a number 1-65535 (or
    /// none). A named port is also refused by the schema, which types the port as an integer.
    NameRulePorts,
}

impl Rule {
    /// Every rule, in the order violations are reported.
    pub const ALL: [Rule; 14] = [
        Rule::Required,
        Rule::IstioIngressOnly,
        Rule::PolicyTypes,
        Rule::OnePayload,
        Rule::PodSelectorNotEmpty,
        Rule::IstioSelectorNotEmpty,
        Rule::BackendImmutable,
        Rule::TargetKind,
        Rule::TargetName,
        Rule::EgressNamesScope,
        Rule::EgressNamesCount,
        Rule::NameRuleSize,
        Rule::NameRuleNames,
        Rule::NameRulePorts,
    ];

    /// The CEL expression in the CRD.
    pub fn cel(self) -> &'static str {
        match self {
            Rule::Required => rules::REQUIRED,
            Rule::IstioIngressOnly => rules::ISTIO_INGRESS_ONLY,
            Rule::PolicyTypes => rules::POLICY_TYPES,
            Rule::OnePayload => rules::ONE_PAYLOAD,
            Rule::PodSelectorNotEmpty => rules::POD_SELECTOR_NOT_EMPTY,
            Rule::IstioSelectorNotEmpty => rules::ISTIO_SELECTOR_NOT_EMPTY,
            Rule::BackendImmutable => rules::BACKEND_IMMUTABLE,
            Rule::TargetKind => rules::TARGET_KIND,
            Rule::TargetName => rules::TARGET_NAME,
            Rule::EgressNamesScope => rules::EGRESS_NAMES_SCOPE,
            Rule::EgressNamesCount => rules::EGRESS_NAMES_COUNT,
            Rule::NameRuleSize => rules::NAME_RULE_SIZE,
            Rule::NameRuleNames => rules::NAME_RULE_NAMES,
            Rule::NameRulePorts => rules::NAME_RULE_PORTS,
        }
    }

    /// The message the API server returns when the rule fails.
    pub fn message(self) -> &'static str {
        match self {
            Rule::Required => rules::REQUIRED_MSG,
            Rule::IstioIngressOnly => rules::ISTIO_INGRESS_ONLY_MSG,
            Rule::PolicyTypes => rules::POLICY_TYPES_MSG,
            Rule::OnePayload => rules::ONE_PAYLOAD_MSG,
            Rule::PodSelectorNotEmpty => rules::POD_SELECTOR_NOT_EMPTY_MSG,
            Rule::IstioSelectorNotEmpty => rules::ISTIO_SELECTOR_NOT_EMPTY_MSG,
            Rule::BackendImmutable => rules::BACKEND_IMMUTABLE_MSG,
            Rule::TargetKind => rules::TARGET_KIND_MSG,
            Rule::TargetName => rules::TARGET_NAME_MSG,
            Rule::EgressNamesScope => rules::EGRESS_NAMES_SCOPE_MSG,
            Rule::EgressNamesCount => rules::EGRESS_NAMES_COUNT_MSG,
            Rule::NameRuleSize => rules::NAME_RULE_SIZE_MSG,
            Rule::NameRuleNames => rules::NAME_RULE_NAMES_MSG,
            Rule::NameRulePorts => rules::NAME_RULE_PORTS_MSG,
        }
    }
}

/// A rule the object breaks; displays as the rule's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, thiserror::Error)]
#[error("{}", rule.message())]
pub struct Violation {
    /// The broken rule.
    pub rule: Rule,
}

impl Violation {
    /// The rule's message, as the API server would have returned it.
    pub fn message(&self) -> &'static str {
        self.rule.message()
    }
}

/// The messages of `violations`, joined for one condition message or Event note.
pub fn describe(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(Violation::message)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The fields the rules look at, common to policies and proposals.
#[derive(Clone, Copy, Debug)]
pub struct Spec<'a> {
    pub backend: Backend,
    pub kubernetes: Option<&'a NetworkPolicySpec>,
    pub istio: Option<&'a IstioPolicy>,
    pub target_ref: &'a TargetRef,
    pub direction: Direction,
    pub egress_names: &'a [NameRule],
}

impl<'a> From<&'a WorkloadNetworkPolicySpec> for Spec<'a> {
    fn from(s: &'a WorkloadNetworkPolicySpec) -> Self {
        Spec {
            backend: s.backend,
            kubernetes: s.kubernetes.as_ref(),
            istio: s.istio.as_ref(),
            target_ref: &s.target_ref,
            direction: s.direction,
            egress_names: &s.egress_names,
        }
    }
}

impl<'a> From<&'a WorkloadNetworkPolicyProposalSpec> for Spec<'a> {
    fn from(s: &'a WorkloadNetworkPolicyProposalSpec) -> Self {
        Spec {
            backend: s.backend,
            kubernetes: s.kubernetes.as_ref(),
            istio: s.istio.as_ref(),
            target_ref: &s.target_ref,
            direction: s.direction,
            egress_names: &s.egress_names,
        }
    }
}

/// Checks every rule of the CRDs. `previous_backend` is the backend the object had before, when the
/// caller knows it (the CEL rule compares with `oldSelf`; without it [`Rule::BackendImmutable`] holds).
/// Returns the broken rules in [`Rule::ALL`] order.
pub fn validate<'a>(
    spec: impl Into<Spec<'a>>,
    previous_backend: Option<Backend>,
) -> Result<(), Vec<Violation>> {
    let spec = spec.into();
    let broken: Vec<Violation> = Rule::ALL
        .into_iter()
        .filter(|rule| !holds(*rule, &spec, previous_backend))
        .map(|rule| Violation { rule })
        .collect();
    if broken.is_empty() {
        Ok(())
    } else {
        Err(broken)
    }
}

/// Whether `rule` holds for `spec`: each arm is its CEL expression read in Rust.
fn holds(rule: Rule, spec: &Spec<'_>, previous_backend: Option<Backend>) -> bool {
    let kubernetes = spec.backend == Backend::Kubernetes;
    let istio = spec.backend == Backend::Istio;
    match rule {
        // The types cannot represent a missing targetRef or direction, nor a kind outside the enum.
        Rule::Required | Rule::TargetKind => true,
        Rule::IstioIngressOnly => !istio || spec.direction == Direction::Ingress,
        Rule::PolicyTypes => match spec.kubernetes {
            Some(np) if kubernetes => {
                np.policy_types.as_deref() == Some(&[spec.direction.as_str().to_string()][..])
            }
            _ => true,
        },
        Rule::OnePayload => {
            kubernetes == spec.kubernetes.is_some() && istio == spec.istio.is_some()
        }
        Rule::PodSelectorNotEmpty => spec
            .kubernetes
            .is_none_or(|np| np.pod_selector.as_ref().is_some_and(selects_something)),
        Rule::IstioSelectorNotEmpty => spec.istio.is_none_or(|i| selects_something(&i.selector)),
        Rule::BackendImmutable => previous_backend.is_none_or(|b| b == spec.backend),
        Rule::TargetName => is_dns1123_subdomain(&spec.target_ref.name),
        Rule::EgressNamesScope => {
            spec.egress_names.is_empty() || (spec.direction == Direction::Egress && kubernetes)
        }
        Rule::EgressNamesCount => spec.egress_names.len() <= MAX_NAME_RULES,
        Rule::NameRuleSize => spec.egress_names.iter().all(|r| {
            (1..=MAX_NAMES_PER_RULE).contains(&r.names.len())
                && r.ports.len() <= MAX_PORTS_PER_NAME_RULE
        }),
        Rule::NameRuleNames => spec
            .egress_names
            .iter()
            .flat_map(|r| &r.names)
            .all(|n| dns_name::name_pattern(n).is_ok()),
        Rule::NameRulePorts => spec
            .egress_names
            .iter()
            .flat_map(|r| &r.ports)
            .all(numbered_port),
    }
}

/// A port of an `egressNames` entry: protocol TCP, UDP or SCTP (or none: TCP), and a port number
/// 1-65535 (or none: every port), not a name.
fn numbered_port(port: &NetworkPolicyPort) -> bool {
    Protocol::from_kubernetes(port.protocol.as_deref()).is_some()
        && match &port.port {
            None => true,
            Some(IntOrString::Int(n)) => (1..=65535).contains(n),
            Some(IntOrString::String(_)) => false,
        }
}

/// A selector with at least one matchLabels entry or matchExpression: an empty one selects every pod
/// in the namespace.
pub fn selects_something(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_some_and(|m| !m.is_empty())
        || selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`, 1 to 253 characters.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                alphanumeric(first)
                    && alphanumeric(last)
                    && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
            }
            _ => false,
        }
    };
    (1..=253).contains(&name.len()) && name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_subdomains() {
        for good in [
            "a",
            "0",
            "web",
            "web-2",
            "web.v2",
            "a-b.c-d.e",
            "a".repeat(253).as_str(),
        ] {
            assert!(is_dns1123_subdomain(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a..b",
            ".a",
            "a.",
            "a.-b",
            "é",
            "a".repeat(254).as_str(),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn a_selector_selects_something_when_it_has_any_requirement() {
        let sel = |v: serde_json::Value| serde_json::from_value::<LabelSelector>(v).unwrap();
        assert!(!selects_something(&sel(serde_json::json!({}))));
        assert!(!selects_something(&sel(
            serde_json::json!({"matchLabels": {}})
        )));
        assert!(!selects_something(&sel(
            serde_json::json!({"matchExpressions": []})
        )));
        assert!(selects_something(&sel(
            serde_json::json!({"matchLabels": {"a": "1"}})
        )));
        // An unknown operator still counts: the API server refuses it, evaluation selects nothing.
        assert!(selects_something(&sel(
            serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Like"}]})
        )));
    }

    #[test]
    fn describe_joins_messages_in_rule_order() {
        let v = [
            Violation {
                rule: Rule::OnePayload,
            },
            Violation {
                rule: Rule::TargetName,
            },
        ];
        assert_eq!(
            describe(&v),
            format!("{}; {}", rules::ONE_PAYLOAD_MSG, rules::TARGET_NAME_MSG)
        );
        assert_eq!(v[0].to_string(), rules::ONE_PAYLOAD_MSG);
    }
}
