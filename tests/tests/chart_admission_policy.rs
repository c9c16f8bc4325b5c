//! The chart's promote-label ValidatingAdmissionPolicy (docs/api.md, "Labels and annotations"),
//! rendered with `helm template` and its CEL evaluated with the `cel` crate (the v1.20 test API server
//! has no admission policies): `monitor`/`protect` admitted, anything else denied with the exact
//! message, absent label admitted.

use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// helm from PATH, else where `cargo xtask setup` puts it.
fn helm() -> PathBuf {
    let on_path = Command::new("helm")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if on_path {
        return PathBuf::from("helm");
    }
    let cached =
        PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/network-enforcer/bin/helm");
    assert!(cached.exists(), "helm not found: run `cargo xtask setup`");
    cached
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/network-enforcer")
}

/// Every document `helm template` renders for the chart with default values.
fn rendered() -> Vec<Value> {
    let out = Command::new(helm())
        .args(["template", "release"])
        .arg(chart())
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn eval(expression: &str, object: &Value) -> bool {
    let program = cel::Program::compile(expression).expect("the expression compiles");
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("object", cel::to_value(object).unwrap());
    match program.execute(&ctx).expect("the expression evaluates") {
        cel::Value::Bool(b) => b,
        other => panic!("{expression} returned {other:?}"),
    }
}

/// What the API server would answer for a proposal with these labels: `Ok` or the denial message.
fn admit(labels: Option<Value>) -> Result<(), String> {
    let docs = rendered();
    let policy = find(&docs, "ValidatingAdmissionPolicy");
    let metadata = json!({"name": "deployment-web-ingress", "namespace": "shop"});
    admit_labelled(policy, "WorkloadNetworkPolicyProposal", metadata, labels)
}

/// What `policy` answers for an object of `kind` with `metadata` and these labels: `Ok` when its
/// match conditions leave the object out or every validation holds, else the first failing one's
/// message.
fn admit_labelled(
    policy: &Value,
    kind: &str,
    mut metadata: Value,
    labels: Option<Value>,
) -> Result<(), String> {
    if let Some(l) = labels {
        metadata["labels"] = l;
    }
    let object = json!({"apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
                        "kind": kind, "metadata": metadata});
    let applies = policy["spec"]["matchConditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| eval(c["expression"].as_str().unwrap(), &object));
    if !applies {
        return Ok(());
    }
    for v in policy["spec"]["validations"].as_array().unwrap() {
        if !eval(v["expression"].as_str().unwrap(), &object) {
            return Err(v["message"].as_str().unwrap().to_string());
        }
    }
    Ok(())
}

const PROMOTE: &str = "networkenforcer.kubewarden.io/promote";

#[test]
fn valid_promote_values_are_admitted() {
    assert_eq!(admit(Some(json!({PROMOTE: "monitor"}))), Ok(()));
    assert_eq!(admit(Some(json!({PROMOTE: "protect"}))), Ok(()));
}

#[test]
fn other_values_are_denied_with_the_exact_message() {
    for bad in ["enforce", "Monitor", "", "monitor "] {
        assert_eq!(
            admit(Some(json!({PROMOTE: bad, "app": "web"}))),
            Err(network_enforcer_api::keys::PROMOTE_LABEL_MESSAGE.to_string()),
            "{bad:?}"
        );
    }
}

#[test]
fn absent_label_is_admitted() {
    assert_eq!(admit(None), Ok(()));
    assert_eq!(admit(Some(json!({}))), Ok(()));
    assert_eq!(admit(Some(json!({"app": "web"}))), Ok(()));
}

#[test]
fn policy_and_binding_match_the_spec() {
    let docs = rendered();
    let policy = find(&docs, "ValidatingAdmissionPolicy");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let rule = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["apiGroups"], json!(["networkenforcer.kubewarden.io"]));
    assert_eq!(rule["operations"], json!(["CREATE", "UPDATE"]));
    assert_eq!(
        rule["resources"],
        json!([
            "workloadnetworkpolicyproposals",
            "clusternetworkpolicyproposals"
        ])
    );
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
}

#[test]
fn chart_lints_cleanly() {
    let out = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(chart())
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The proposal-author policy, by name.
fn author_policy(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| {
            d["kind"] == "ValidatingAdmissionPolicy"
                && d["metadata"]["name"] == "release-network-enforcer-proposal-author"
        })
        .expect("the proposal-author policy is rendered")
}

/// Whether the API server would admit `operation` on a proposal by `user`, from `old` to `new` specs.
fn admit_write(user: &str, operation: &str, old: Option<Value>, new: Value) -> bool {
    let docs = rendered();
    let policy = author_policy(&docs);
    let proposal = |spec: Value| {
        json!({"apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
               "kind": "WorkloadNetworkPolicyProposal",
               "metadata": {"name": "deployment-web-ingress", "namespace": "shop"},
               "spec": spec})
    };
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("object", cel::to_value(proposal(new)).unwrap());
    let old = old.map(proposal).unwrap_or(Value::Null);
    ctx.add_variable_from_value("oldObject", cel::to_value(old).unwrap());
    ctx.add_variable_from_value(
        "request",
        cel::to_value(json!({"operation": operation, "userInfo": {"username": user}})).unwrap(),
    );
    policy["spec"]["validations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|v| {
            let program = cel::Program::compile(v["expression"].as_str().unwrap()).unwrap();
            matches!(program.execute(&ctx).unwrap(), cel::Value::Bool(true))
        })
}

#[test]
fn only_the_controller_writes_what_a_proposal_allows() {
    let controller = "system:serviceaccount:default:release-network-enforcer-controller";
    let user = "alice";
    let learned = json!({"kubernetes": {"ingress": [{"ports": [{"port": 8080}]}]}});
    let widened = json!({"kubernetes": {"ingress": [{}]}});
    // (who, operation, old spec, new spec, admitted)
    let cases = [
        (controller, "CREATE", None, learned.clone(), true),
        (
            controller,
            "UPDATE",
            Some(learned.clone()),
            widened.clone(),
            true,
        ),
        (user, "UPDATE", Some(learned.clone()), learned.clone(), true),
        (user, "CREATE", None, learned.clone(), false),
        (
            user,
            "UPDATE",
            Some(learned.clone()),
            widened.clone(),
            false,
        ),
        (
            "system:serviceaccount:other:release-network-enforcer-controller",
            "CREATE",
            None,
            learned.clone(),
            false,
        ),
    ];
    for (who, operation, old, new, admitted) in cases {
        assert_eq!(
            admit_write(who, operation, old.clone(), new.clone()),
            admitted,
            "{who} {operation} {old:?} -> {new}"
        );
    }
    let docs = rendered();
    let policy = author_policy(&docs);
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
        json!(["CREATE", "UPDATE"]),
        "delete stays open (garbage collection, promotion)"
    );
    assert!(
        docs.iter()
            .any(|d| d["kind"] == "ValidatingAdmissionPolicyBinding"
                && d["spec"]["policyName"] == policy["metadata"]["name"]
                && d["spec"]["validationActions"] == json!(["Deny"]))
    );
}

/// A policy rendered by the chart, by name.
fn policy_named<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ValidatingAdmissionPolicy {name} rendered"))
}

/// What the API server would answer for a ClusterNetworkPolicyProposal with these labels.
fn admit_cluster(labels: Option<Value>) -> Result<(), String> {
    let docs = rendered();
    let policy = policy_named(&docs, "release-network-enforcer-promote-label");
    let metadata = json!({"name": "ne-isolate-shop"});
    admit_labelled(policy, "ClusterNetworkPolicyProposal", metadata, labels)
}

/// A cluster proposal is promoted to monitor or protect, like a workload proposal, by the same
/// policy (there is no other promote-label policy to keep in step).
#[test]
fn a_cluster_proposal_is_promoted_to_monitor_or_protect() {
    let docs = rendered();
    let policy = policy_named(&docs, "release-network-enforcer-promote-label");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"],
        json!([
            "workloadnetworkpolicyproposals",
            "clusternetworkpolicyproposals"
        ])
    );
    let promote_policies = docs
        .iter()
        .filter(|d| {
            d["kind"] == "ValidatingAdmissionPolicy"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("promote-label"))
        })
        .count();
    assert_eq!(promote_policies, 1);
    for good in ["monitor", "protect"] {
        assert_eq!(
            admit_cluster(Some(json!({PROMOTE: good}))),
            Ok(()),
            "{good}"
        );
    }
    for bad in ["Protect", "", "enforce"] {
        assert_eq!(
            admit_cluster(Some(json!({PROMOTE: bad}))),
            Err(network_enforcer_api::keys::PROMOTE_LABEL_MESSAGE.to_string()),
            "{bad:?}"
        );
    }
    assert_eq!(admit_cluster(None), Ok(()));
    assert_eq!(admit_cluster(Some(json!({"team": "net"}))), Ok(()));
}

#[test]
fn only_the_controller_writes_what_a_cluster_proposal_allows_too() {
    let docs = rendered();
    let rule = &author_policy(&docs)["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(
        rule["resources"],
        json!([
            "workloadnetworkpolicyproposals",
            "clusternetworkpolicyproposals"
        ])
    );
}
