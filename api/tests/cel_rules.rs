//! The admission rules of SPEC 1.1, evaluated with kube's client-side CEL validator against the
//! generated CRD schema: every invalid case is refused with its own message, the valid ones pass.

use kube::CustomResourceExt;
use kube::core::cel::Validator;
use network_enforcer_api::crd::rules;
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use serde_json::{Value, json};

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

fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": "deployment-http-client-egress", "namespace": "shop"},
        "spec": spec,
    })
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

/// Validates a policy; returns the messages of every failed rule.
fn policy_errors(spec: Value, old: Option<Value>) -> Vec<String> {
    let old = old.map(|o| object("WorkloadNetworkPolicy", o));
    match Validator::new().validate(
        &schema::<WorkloadNetworkPolicy>(),
        &object("WorkloadNetworkPolicy", spec),
        old.as_ref(),
    ) {
        Ok(()) => vec![],
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn assert_rejected(spec: Value, message: &str) {
    let errors = policy_errors(spec, None);
    assert!(
        errors.iter().any(|e| e.contains(message)),
        "expected {message:?}, got {errors:?}"
    );
}

fn with(mut spec: Value, edit: impl FnOnce(&mut Value)) -> Value {
    edit(&mut spec);
    spec
}

#[test]
fn valid_policies_are_admitted() {
    assert_eq!(
        policy_errors(kubernetes_egress(), None),
        Vec::<String>::new()
    );
    assert_eq!(policy_errors(istio_ingress(), None), Vec::<String>::new());
    // Updating without changing the backend is fine.
    assert_eq!(
        policy_errors(
            with(kubernetes_egress(), |s| s["mode"] = json!("protect")),
            Some(kubernetes_egress())
        ),
        Vec::<String>::new()
    );
}

#[test]
fn valid_proposal_is_admitted() {
    let mut spec = kubernetes_egress();
    spec.as_object_mut().unwrap().remove("mode");
    let result = Validator::new().validate(
        &schema::<WorkloadNetworkPolicyProposal>(),
        &object("WorkloadNetworkPolicyProposal", spec),
        None,
    );
    assert!(result.is_ok(), "{result:?}");
}

#[test]
fn both_payloads_set() {
    let spec = with(kubernetes_egress(), |s| {
        s["istio"] = istio_ingress()["istio"].clone()
    });
    assert_rejected(spec, rules::ONE_PAYLOAD_MSG);
}

#[test]
fn payload_missing() {
    let spec = with(kubernetes_egress(), |s| {
        s.as_object_mut().unwrap().remove("kubernetes");
    });
    assert_rejected(spec, rules::ONE_PAYLOAD_MSG);
}

#[test]
fn payload_not_matching_backend() {
    let spec = with(kubernetes_egress(), |s| s["backend"] = json!("istio"));
    assert_rejected(spec, rules::ONE_PAYLOAD_MSG);
    let spec = with(istio_ingress(), |s| s["backend"] = json!("kubernetes"));
    assert_rejected(spec, rules::ONE_PAYLOAD_MSG);
}

#[test]
fn empty_pod_selector() {
    for selector in [
        json!({}),
        json!({"matchLabels": {}}),
        json!({"matchExpressions": []}),
    ] {
        let spec = with(kubernetes_egress(), |s| {
            s["kubernetes"]["podSelector"] = selector
        });
        assert_rejected(spec, rules::POD_SELECTOR_NOT_EMPTY_MSG);
    }
    let spec = with(kubernetes_egress(), |s| {
        s["kubernetes"]
            .as_object_mut()
            .unwrap()
            .remove("podSelector");
    });
    assert_rejected(spec, rules::POD_SELECTOR_NOT_EMPTY_MSG);
    // matchExpressions alone is a real selector.
    let spec = with(
        kubernetes_egress(),
        |s| s["kubernetes"]["podSelector"] = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["http-client"]}]}),
    );
    assert_eq!(policy_errors(spec, None), Vec::<String>::new());
}

#[test]
fn empty_istio_selector() {
    for selector in [json!({}), json!({"matchLabels": {}})] {
        let spec = with(istio_ingress(), |s| s["istio"]["selector"] = selector);
        assert_rejected(spec, rules::ISTIO_SELECTOR_NOT_EMPTY_MSG);
    }
}

#[test]
fn policy_types_must_equal_direction() {
    for types in [json!(["Ingress"]), json!(["Egress", "Ingress"]), json!([])] {
        let spec = with(kubernetes_egress(), |s| {
            s["kubernetes"]["policyTypes"] = types
        });
        assert_rejected(spec, rules::POLICY_TYPES_MSG);
    }
    let spec = with(kubernetes_egress(), |s| {
        s["kubernetes"]
            .as_object_mut()
            .unwrap()
            .remove("policyTypes");
    });
    assert_rejected(spec, rules::POLICY_TYPES_MSG);
}

#[test]
fn istio_egress() {
    let spec = with(istio_ingress(), |s| s["direction"] = json!("Egress"));
    assert_rejected(spec, rules::ISTIO_INGRESS_ONLY_MSG);
}

#[test]
fn missing_target_ref_or_direction() {
    for field in ["targetRef", "direction"] {
        let spec = with(kubernetes_egress(), |s| {
            s.as_object_mut().unwrap().remove(field);
        });
        assert_rejected(spec, rules::REQUIRED_MSG);
    }
}

#[test]
fn target_kind_not_allowed() {
    for kind in ["ReplicaSet", "Service", "deployment"] {
        let spec = with(kubernetes_egress(), |s| {
            s["targetRef"]["kind"] = json!(kind)
        });
        assert_rejected(spec, rules::TARGET_KIND_MSG);
    }
}

#[test]
fn bad_target_name() {
    let too_long = "a".repeat(254);
    for name in [
        "",
        "Http-Client",
        "-client",
        "client-",
        "a_b",
        too_long.as_str(),
    ] {
        let spec = with(kubernetes_egress(), |s| {
            s["targetRef"]["name"] = json!(name)
        });
        assert_rejected(spec, rules::TARGET_NAME_MSG);
    }
    let longest = "a".repeat(253);
    for name in ["a", "http-client", "web.v2", longest.as_str()] {
        let spec = with(kubernetes_egress(), |s| {
            s["targetRef"]["name"] = json!(name)
        });
        assert_eq!(policy_errors(spec, None), Vec::<String>::new(), "{name}");
    }
}

#[test]
fn backend_changed_on_update() {
    let errors = policy_errors(istio_ingress(), Some(kubernetes_egress()));
    assert!(
        errors.iter().any(|e| e == rules::BACKEND_IMMUTABLE_MSG),
        "{errors:?}"
    );
}
