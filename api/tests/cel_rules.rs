//! The admission rules of both CRDs, checked twice against one table of objects: by kube's
//! client-side CEL validator on the generated CRD schema (what an API server >= 1.25 does), and by
//! `validation::validate` (what the controller does, for clusters that do not run CEL). Every case
//! must break exactly the rules it names, on both sides and for both kinds.

use kube::CustomResourceExt;
use kube::core::cel::Validator;
use network_enforcer_api::validation::{self, Rule};
use network_enforcer_api::{
    WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal, WorkloadNetworkPolicyProposalSpec,
    WorkloadNetworkPolicySpec,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;

fn schema<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn kubernetes_egress() -> Value {
    json!({
        "backend": "kubernetes",
        "kubernetes": {
            "podSelector": {"matchLabels": {"app": "http-client"}},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}},
                    "podSelector": {"matchLabels": {"app": "http-server"}}
                }],
                "ports": [{"protocol": "TCP", "port": 18080}]
            }]
        },
        "targetRef": {"kind": "Deployment", "name": "http-client"},
        "direction": "Egress",
        "mode": "monitor"
    })
}

fn istio_ingress() -> Value {
    json!({
        "backend": "istio",
        "istio": {
            "selector": {"matchLabels": {"app": "http-server"}},
            "rules": [{
                "from": [{"source": {"principals": ["cluster.local/ns/shop/sa/http-client-sa"]}}],
                "to": [{"operation": {"ports": ["18080"]}}]
            }]
        },
        "targetRef": {"kind": "Deployment", "name": "http-server"},
        "direction": "Ingress",
        "mode": "protect"
    })
}

fn with(mut spec: Value, edit: impl FnOnce(&mut Value)) -> Value {
    edit(&mut spec);
    spec
}

fn without(spec: Value, pointer: &str, field: &str) -> Value {
    with(spec, |s| {
        s.pointer_mut(pointer)
            .and_then(Value::as_object_mut)
            .unwrap()
            .remove(field);
    })
}

/// One row of the table: a spec (and the previous spec, for an update) and the rules it breaks.
struct Case {
    what: String,
    spec: Value,
    old: Option<Value>,
    broken: Vec<Rule>,
}

fn case(what: impl Into<String>, spec: Value, broken: &[Rule]) -> Case {
    Case {
        what: what.into(),
        spec,
        old: None,
        broken: broken.to_vec(),
    }
}

fn cases() -> Vec<Case> {
    let mut cases = vec![
        case("valid kubernetes Egress", kubernetes_egress(), &[]),
        case("valid istio Ingress", istio_ingress(), &[]),
        case(
            "kubernetes protect",
            with(kubernetes_egress(), |s| s["mode"] = json!("protect")),
            &[],
        ),
        case(
            "matchExpressions alone is a real selector",
            with(kubernetes_egress(), |s| {
                s["kubernetes"]["podSelector"] = json!({"matchExpressions":
                    [{"key": "app", "operator": "In", "values": ["http-client"]}]})
            }),
            &[],
        ),
        case(
            "both payloads",
            with(kubernetes_egress(), |s| {
                s["istio"] = istio_ingress()["istio"].clone()
            }),
            &[Rule::OnePayload],
        ),
        case(
            "payload missing",
            without(kubernetes_egress(), "", "kubernetes"),
            &[Rule::OnePayload],
        ),
        case(
            "kubernetes payload under the istio backend",
            with(kubernetes_egress(), |s| s["backend"] = json!("istio")),
            // Egress is also wrong for istio.
            &[Rule::IstioIngressOnly, Rule::OnePayload],
        ),
        case(
            "istio payload under the kubernetes backend",
            with(istio_ingress(), |s| s["backend"] = json!("kubernetes")),
            &[Rule::OnePayload],
        ),
        case(
            "podSelector absent",
            without(kubernetes_egress(), "/kubernetes", "podSelector"),
            &[Rule::PodSelectorNotEmpty],
        ),
        case(
            "istio Egress",
            with(istio_ingress(), |s| s["direction"] = json!("Egress")),
            &[Rule::IstioIngressOnly],
        ),
        case(
            "policyTypes absent",
            without(kubernetes_egress(), "/kubernetes", "policyTypes"),
            &[Rule::PolicyTypes],
        ),
        case(
            "targetRef absent",
            without(kubernetes_egress(), "", "targetRef"),
            &[Rule::Required],
        ),
        case(
            "direction absent",
            without(kubernetes_egress(), "", "direction"),
            &[Rule::Required],
        ),
        Case {
            what: "backend unchanged on update".into(),
            spec: with(kubernetes_egress(), |s| s["mode"] = json!("protect")),
            old: Some(kubernetes_egress()),
            broken: vec![],
        },
        Case {
            what: "backend changed on update".into(),
            spec: istio_ingress(),
            old: Some(kubernetes_egress()),
            broken: vec![Rule::BackendImmutable],
        },
    ];
    for selector in [
        json!({}),
        json!({"matchLabels": {}}),
        json!({"matchExpressions": []}),
    ] {
        cases.push(case(
            format!("podSelector {selector}"),
            with(kubernetes_egress(), |s| {
                s["kubernetes"]["podSelector"] = selector
            }),
            &[Rule::PodSelectorNotEmpty],
        ));
    }
    for selector in [json!({}), json!({"matchLabels": {}})] {
        cases.push(case(
            format!("istio selector {selector}"),
            with(istio_ingress(), |s| s["istio"]["selector"] = selector),
            &[Rule::IstioSelectorNotEmpty],
        ));
    }
    for types in [json!(["Ingress"]), json!(["Egress", "Ingress"]), json!([])] {
        cases.push(case(
            format!("policyTypes {types} on an Egress policy"),
            with(kubernetes_egress(), |s| {
                s["kubernetes"]["policyTypes"] = types
            }),
            &[Rule::PolicyTypes],
        ));
    }
    for kind in ["ReplicaSet", "Service", "deployment"] {
        cases.push(case(
            format!("targetRef.kind {kind}"),
            with(kubernetes_egress(), |s| {
                s["targetRef"]["kind"] = json!(kind)
            }),
            &[Rule::TargetKind],
        ));
    }
    let too_long = "a".repeat(254);
    for name in [
        "",
        "Http-Client",
        "-client",
        "client-",
        "a_b",
        too_long.as_str(),
    ] {
        cases.push(case(
            format!("targetRef.name {name:?}"),
            with(kubernetes_egress(), |s| {
                s["targetRef"]["name"] = json!(name)
            }),
            &[Rule::TargetName],
        ));
    }
    let longest = "a".repeat(253);
    for name in ["a", "http-client", "web.v2", longest.as_str()] {
        cases.push(case(
            format!("targetRef.name {name:?}"),
            with(kubernetes_egress(), |s| {
                s["targetRef"]["name"] = json!(name)
            }),
            &[],
        ));
    }
    cases
}

/// The two kinds: the spec as that kind carries it (proposals have no `mode`).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Policy,
    Proposal,
}

impl Kind {
    fn spec(self, spec: &Value) -> Value {
        match self {
            Kind::Policy => spec.clone(),
            Kind::Proposal => without(spec.clone(), "", "mode"),
        }
    }

    fn object(self, spec: &Value) -> Value {
        let kind = match self {
            Kind::Policy => "WorkloadNetworkPolicy",
            Kind::Proposal => "WorkloadNetworkPolicyProposal",
        };
        json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "deployment-http-client-egress", "namespace": "shop"},
            "spec": self.spec(spec),
        })
    }

    fn schema(self) -> Value {
        match self {
            Kind::Policy => schema::<WorkloadNetworkPolicy>(),
            Kind::Proposal => schema::<WorkloadNetworkPolicyProposal>(),
        }
    }

    /// What the CEL rules refuse, as rule messages. A rule that reads a missing required field
    /// cannot evaluate ("rule evaluation error: No such key"); those are left out, as the object breaks
    /// `Rule::Required` (and the schema's `required`) anyway.
    fn cel(self, case: &Case) -> BTreeSet<String> {
        let old = case.old.as_ref().map(|o| self.object(o));
        match Validator::new().validate(&self.schema(), &self.object(&case.spec), old.as_ref()) {
            Ok(()) => BTreeSet::new(),
            Err(errors) => errors
                .into_vec()
                .into_iter()
                .map(|e| e.message)
                .filter(|m| !m.starts_with("rule evaluation error: No such key"))
                .collect(),
        }
    }

    /// What the controller's validation refuses, as rule messages; `None` when the typed spec cannot
    /// even hold the object (the schema's `required`/`enum`, which every Kubernetes version enforces).
    fn rust(self, case: &Case) -> Option<BTreeSet<String>> {
        let previous = case
            .old
            .as_ref()
            .map(|o| serde_json::from_value(o["backend"].clone()).unwrap());
        let spec = self.spec(&case.spec);
        let result = match self {
            Kind::Policy => {
                let spec: WorkloadNetworkPolicySpec = serde_json::from_value(spec).ok()?;
                validation::validate(&spec, previous)
            }
            Kind::Proposal => {
                let spec: WorkloadNetworkPolicyProposalSpec = serde_json::from_value(spec).ok()?;
                validation::validate(&spec, previous)
            }
        };
        Some(
            result
                .err()
                .unwrap_or_default()
                .iter()
                .map(|v| v.message().to_string())
                .collect(),
        )
    }
}

fn messages(rules: &[Rule]) -> BTreeSet<String> {
    rules.iter().map(|r| r.message().to_string()).collect()
}

#[test]
fn cel_rules_break_exactly_the_rules_of_each_case() {
    for kind in [Kind::Policy, Kind::Proposal] {
        for case in cases() {
            assert_eq!(
                kind.cel(&case),
                messages(&case.broken),
                "{kind:?}: {}",
                case.what
            );
        }
    }
}

#[test]
fn rust_validation_agrees_with_the_cel_rules_on_every_case() {
    for kind in [Kind::Policy, Kind::Proposal] {
        for case in cases() {
            match kind.rust(&case) {
                Some(found) => assert_eq!(found, messages(&case.broken), "{kind:?}: {}", case.what),
                // Unrepresentable: only rules the schema itself enforces may be broken.
                None => assert!(
                    !case.broken.is_empty()
                        && case
                            .broken
                            .iter()
                            .all(|r| matches!(r, Rule::Required | Rule::TargetKind)),
                    "{kind:?}: {} does not deserialize, yet breaks {:?}",
                    case.what,
                    case.broken
                ),
            }
        }
    }
}

#[test]
fn rules_the_types_cannot_break_are_enforced_by_the_schema_on_every_version() {
    for kind in [Kind::Policy, Kind::Proposal] {
        let spec = &kind.schema()["properties"]["spec"];
        let required = spec["required"].as_array().unwrap();
        for field in ["targetRef", "direction"] {
            assert!(required.contains(&json!(field)), "{kind:?} {field}");
        }
        let kinds = spec["properties"]["targetRef"]["properties"]["kind"]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{kind:?}: targetRef.kind has no enum"));
        assert_eq!(kinds.len(), network_enforcer_api::WorkloadKind::ALL.len());
    }
}

/// Every `x-kubernetes-validations` rule anywhere under `schema`, as (rule, message).
fn cel_rules_in(schema: &Value, out: &mut BTreeSet<(String, String)>) {
    match schema {
        Value::Object(map) => {
            for rule in map
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                out.insert((
                    rule["rule"].as_str().unwrap().to_string(),
                    rule["message"].as_str().unwrap().to_string(),
                ));
            }
            map.values().for_each(|v| cel_rules_in(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| cel_rules_in(v, out)),
        _ => {}
    }
}

#[test]
fn validation_covers_every_cel_rule_of_both_crds_and_the_table_every_rule() {
    let expected: BTreeSet<(String, String)> = Rule::ALL
        .iter()
        .map(|r| (r.cel().to_string(), r.message().to_string()))
        .collect();
    for kind in [Kind::Policy, Kind::Proposal] {
        let mut found = BTreeSet::new();
        cel_rules_in(&kind.schema(), &mut found);
        assert_eq!(found, expected, "{kind:?}");
    }
    let exercised: BTreeSet<Rule> = cases().into_iter().flat_map(|c| c.broken).collect();
    assert_eq!(exercised, Rule::ALL.into_iter().collect());
}
