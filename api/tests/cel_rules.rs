//! The admission rules of both CRDs, checked twice against one table of objects: by kube's
//! client-side CEL validator on the generated CRD schema (what an API server >= 1.25 does), and by
//! `validation::validate` (what the controller does, for clusters that do not run CEL). Every case
//! must break exactly the rules it names, on both sides and for both kinds. (What the schema alone
//! enforces, such as a named port in `egressNames`, is tested apart.)

use kube::CustomResourceExt;
use kube::core::cel::{CompiledSchema, Validator, compile_schema};
use network_enforcer_api::validation::{self, Rule};
use network_enforcer_api::{
    WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal, WorkloadNetworkPolicyProposalSpec,
    WorkloadNetworkPolicySpec,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::OnceLock;

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

/// `kubernetes_egress()` with `egressNames`.
fn egress_names(names: Value) -> Value {
    with(kubernetes_egress(), |s| s["egressNames"] = names)
}

/// `kubernetes_egress()` with one `egressNames` entry of `names` on TCP 443.
fn egress_to(names: &[&str]) -> Value {
    egress_names(json!([{"names": names, "ports": [{"protocol": "TCP", "port": 443}]}]))
}

/// `kubernetes_egress()` with one `egressNames` entry for `api.partner.test` on `ports`.
fn egress_on(ports: Value) -> Value {
    egress_names(json!([{"names": ["api.partner.test"], "ports": ports}]))
}

/// A host name of `len` bytes, of labels of at most 62 bytes.
fn name_of(len: usize) -> String {
    let mut name = String::new();
    while len - name.len() > 63 {
        name.push_str(&"a".repeat(62));
        name.push('.');
    }
    name.push_str(&"a".repeat(len - name.len()));
    name
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
    cases.extend(egress_name_cases());
    cases
}

/// `spec.egressNames`: where it may appear, how many, which names and which ports.
fn egress_name_cases() -> Vec<Case> {
    let mut cases = vec![
        case(
            "egressNames: a name and a wildcard on TCP 443",
            egress_to(&["api.partner.test", "*.storage.partner.test"]),
            &[],
        ),
        case(
            "egressNames without ports (every port)",
            egress_names(json!([{"names": ["api.partner.test"]}])),
            &[],
        ),
        case(
            "egressNames empty on istio (the same as absent)",
            with(istio_ingress(), |s| s["egressNames"] = json!([])),
            &[],
        ),
        case(
            "egressNames on istio",
            with(istio_ingress(), |s| {
                s["egressNames"] = egress_to(&["api.partner.test"])["egressNames"].clone()
            }),
            &[Rule::EgressNamesScope],
        ),
        case(
            "egressNames on istio Egress",
            with(istio_ingress(), |s| {
                s["direction"] = json!("Egress");
                s["egressNames"] = egress_to(&["api.partner.test"])["egressNames"].clone();
            }),
            &[Rule::IstioIngressOnly, Rule::EgressNamesScope],
        ),
        case(
            "egressNames on a kubernetes Ingress policy",
            with(egress_to(&["api.partner.test"]), |s| {
                s["direction"] = json!("Ingress");
                s["kubernetes"]["policyTypes"] = json!(["Ingress"]);
            }),
            &[Rule::EgressNamesScope],
        ),
        case(
            "egressNames entry without names",
            egress_names(json!([{"names": [], "ports": [{"port": 443}]}])),
            &[Rule::NameRuleSize],
        ),
        case(
            "egressNames entry with a bad name among good ones",
            egress_to(&["api.partner.test", "*.com", "*.storage.partner.test"]),
            &[Rule::NameRuleNames],
        ),
        case(
            "egressNames: the second entry breaks a rule",
            egress_names(json!([
                {"names": ["api.partner.test"]},
                {"names": ["a.partner.test"], "ports": [{"protocol": "ICMP"}]}
            ])),
            &[Rule::NameRulePorts],
        ),
        case(
            "egressNames: every entry rule at once",
            egress_names(json!([
                {"names": ["API.partner.test"], "ports": [{"port": 0}]},
                {"names": []}
            ])),
            &[Rule::NameRuleSize, Rule::NameRuleNames, Rule::NameRulePorts],
        ),
    ];
    let entries = |n: usize| {
        let entry = json!({"names": ["api.partner.test"], "ports": [{"port": 443}]});
        egress_names(Value::Array(vec![entry; n]))
    };
    cases.push(case("egressNames: 1000 entries", entries(1000), &[]));
    cases.push(case(
        "egressNames: 1001 entries",
        entries(1001),
        &[Rule::EgressNamesCount],
    ));
    let names =
        |n: usize| -> Vec<String> { (0..n).map(|i| format!("n{i}.partner.test")).collect() };
    let names_20 = names(20);
    let names_21 = names(21);
    cases.push(case(
        "egressNames: 20 names",
        egress_to(&names_20.iter().map(String::as_str).collect::<Vec<_>>()),
        &[],
    ));
    cases.push(case(
        "egressNames: 21 names",
        egress_to(&names_21.iter().map(String::as_str).collect::<Vec<_>>()),
        &[Rule::NameRuleSize],
    ));
    cases.push(case(
        "egressNames: 100 ports",
        egress_on(json!(
            (1..=100).map(|p| json!({"port": p})).collect::<Vec<_>>()
        )),
        &[],
    ));
    cases.push(case(
        "egressNames: 101 ports",
        egress_on(json!(
            (1..=101).map(|p| json!({"port": p})).collect::<Vec<_>>()
        )),
        &[Rule::NameRuleSize],
    ));
    let longest = name_of(253);
    let longest_wildcard = format!("*.{}", name_of(251));
    let label_63 = format!("{}.partner.test", "a".repeat(63));
    for name in [
        "localhost",
        "_sip._tcp.example.com",
        "-a.b_",
        "xn--bcher-kva.example",
        "*.example.com",
        "*.a.b.c.example.com",
        &label_63,
        &longest,
        &longest_wildcard,
    ] {
        cases.push(case(
            format!("egressNames name {name:?}"),
            egress_to(&[name]),
            &[],
        ));
    }
    let too_long = name_of(254);
    let too_long_wildcard = format!("*.{}", name_of(252));
    let label_64 = format!("{}.partner.test", "a".repeat(64));
    for name in [
        "",
        ".",
        "API.partner.test",
        "*.Partner.test",
        "api.partner.test.",
        "*.example.com.",
        "*",
        "*.",
        "*.com",
        "a.*.com",
        "*example.com",
        "a*.example.com",
        "**.example.com",
        "*.*.example.com",
        "a..b",
        ".a",
        "bücher.example",
        "a b.example",
        "a/b.example",
        "a:443",
        &label_64,
        &too_long,
        &too_long_wildcard,
    ] {
        cases.push(case(
            format!("egressNames name {name:?}"),
            egress_to(&[name]),
            &[Rule::NameRuleNames],
        ));
    }
    for port in [
        json!({"protocol": "UDP", "port": 53}),
        json!({"protocol": "SCTP", "port": 1}),
        json!({"port": 65535}),
        json!({"protocol": "TCP"}),
        json!({"port": 443, "endPort": 450}),
        json!({}),
    ] {
        cases.push(case(
            format!("egressNames port {port}"),
            egress_on(json!([port])),
            &[],
        ));
    }
    for port in [
        json!({"protocol": "ICMP", "port": 443}),
        json!({"protocol": "tcp", "port": 443}),
        json!({"protocol": ""}),
        json!({"port": 0}),
        json!({"port": 65536}),
        json!({"port": -1}),
    ] {
        cases.push(case(
            format!("egressNames port {port}"),
            egress_on(json!([port])),
            &[Rule::NameRulePorts],
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

    /// [`Kind::schema`] compiled once for the CEL validator (compiling it per case took most of the
    /// test's time).
    fn compiled(self) -> &'static CompiledSchema {
        static POLICY: OnceLock<CompiledSchema> = OnceLock::new();
        static PROPOSAL: OnceLock<CompiledSchema> = OnceLock::new();
        let cell = match self {
            Kind::Policy => &POLICY,
            Kind::Proposal => &PROPOSAL,
        };
        cell.get_or_init(|| compile_schema(&self.schema()))
    }

    /// What the CEL rules refuse, as rule messages. A rule that reads a missing required field
    /// cannot evaluate ("rule evaluation error: No such key"); those are left out, as the object breaks
    /// `Rule::Required` (and the schema's `required`) anyway.
    fn cel(self, case: &Case) -> BTreeSet<String> {
        let old = case.old.as_ref().map(|o| self.object(o));
        match Validator::new().validate_compiled(
            self.compiled(),
            &self.object(&case.spec),
            old.as_ref(),
        ) {
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

/// A named port cannot be in the table: the schema types `egressNames[].ports[].port` as an integer
/// (every Kubernetes version refuses a string there), so the CEL rule never sees one, and the
/// client-side evaluator fails on it rather than refusing it. The controller refuses it by the rule.
#[test]
fn named_ports_are_refused_by_the_schema_and_by_validation() {
    for kind in [Kind::Policy, Kind::Proposal] {
        let schema = kind.schema();
        let port = &schema["properties"]["spec"]["properties"]["egressNames"]["items"]["properties"]
            ["ports"]["items"]["properties"]["port"];
        assert_eq!(port["type"], "integer", "{kind:?}");
        assert_eq!(port.get("x-kubernetes-int-or-string"), None, "{kind:?}");
        for port in [json!("https"), json!("443")] {
            let named = case("named port", egress_on(json!([{"port": port}])), &[]);
            assert_eq!(
                kind.rust(&named),
                Some(messages(&[Rule::NameRulePorts])),
                "{kind:?}: {port}"
            );
        }
    }
}

/// The API server refuses a CRD whose CEL rules' estimated cost (each rule's, times how many times it
/// can run) adds up to more than 100,000,000 (apiextensions-apiserver's StaticEstimatedCRDCostLimit).
/// The names rule dominates: this recomputes its estimate the way cel-go does, from the generated
/// schema's bounds, and keeps it within half the budget so that the other rules fit.
#[test]
fn the_names_rule_fits_the_api_servers_cel_cost_budget() {
    use network_enforcer_api::crd::{
        MAX_NAME_RULES, MAX_NAMES_PER_RULE, MAX_PORTS_PER_NAME_RULE, rules,
    };
    for kind in [Kind::Policy, Kind::Proposal] {
        let schema = kind.schema();
        let entries = &schema["properties"]["spec"]["properties"]["egressNames"];
        let names = &entries["items"]["properties"]["names"];
        let ports = &entries["items"]["properties"]["ports"];
        let bound = |v: &Value, key: &str| {
            v[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{kind:?}: no {key} in {v}"))
        };
        assert_eq!(bound(entries, "maxItems"), MAX_NAME_RULES as u64);
        assert_eq!(bound(names, "maxItems"), MAX_NAMES_PER_RULE as u64);
        assert_eq!(bound(ports, "maxItems"), MAX_PORTS_PER_NAME_RULE as u64);
        // The API server takes a string of maxLength n as 4n bytes (a code point is up to 4).
        let name_bytes = 4 * bound(&names["items"], "maxLength");
        let regex = rules::NAME_RULE_NAMES
            .split_once("matches('")
            .and_then(|(_, rest)| rest.split_once("')"))
            .unwrap()
            .0
            .replace("\\\\", "\\");
        // `matches`: ceil((size + 1) * 0.1) * ceil(len(regex) * 0.25); the rest of an iteration: 7.
        let per_name =
            (name_bytes + 1).div_ceil(10) * (regex.chars().count() as u64).div_ceil(4) + 7;
        let total = bound(entries, "maxItems") * (2 + bound(names, "maxItems") * per_name);
        assert!(
            total <= 50_000_000,
            "{kind:?}: the names rule's estimated cost is {total}"
        );
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
