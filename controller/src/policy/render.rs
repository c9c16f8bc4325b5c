//! What a WorkloadNetworkPolicy renders into, as plain data:
//! - kubernetes backend: a NetworkPolicy equal to `spec.kubernetes` in `protect`, nothing in `monitor`;
//!   `spec.egressNames` adds one egress rule per entry whose peers are the addresses the workload's
//!   pods resolved those names to ([`crate::cluster::names`]), on the entry's ports (an entry no pod
//!   resolved yet adds nothing: a rule without peers would allow every address);
//! - istio backend: an AuthorizationPolicy (`ALLOW`, selector, rules 1:1), dry-run in `monitor`.
//!
//! Rendered objects carry the policy's name and namespace and a controller ownerReference to it, so
//! deleting the policy garbage-collects them, and the policy generation they were rendered from (only
//! valid generations are rendered: that is what lets a rendering stay in force while its policy is
//! invalid, see [`crate::policy::validity`]).

use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyEgressRule, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;
use network_enforcer_api::authorization_policy::{
    AuthorizationPolicy, AuthorizationPolicySpec, WorkloadSelector,
};
use network_enforcer_api::keys::{
    EGRESS_NAME_RULES_ANNOTATION, EGRESS_NAMES_ANNOTATION, ISTIO_DRY_RUN_ANNOTATION,
    RENDERED_GENERATION_ANNOTATION,
};
use network_enforcer_api::{Backend, NameRule, PolicyMode, WorkloadNetworkPolicy};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Label on every object we render, so users (and our uninstall hook) can find them.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "network-enforcer");

/// The objects a policy should have in the cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Desired {
    /// A NetworkPolicy of the policy's name must exist with this content.
    NetworkPolicy(Box<NetworkPolicy>),
    /// No NetworkPolicy of ours may exist (kubernetes backend in monitor mode).
    NoNetworkPolicy,
    /// An AuthorizationPolicy of the policy's name must exist with this content.
    AuthorizationPolicy(Box<AuthorizationPolicy>),
}

/// Why a policy cannot be rendered. Reported as the `Ready=False` condition's reason and message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    #[error("spec.{0} is missing: the payload must match spec.backend")]
    MissingPayload(&'static str),
    #[error("the policy has no uid yet; it cannot own rendered objects")]
    NoUid,
    #[error(
        "spec.istio.selector matchExpression `{0}` cannot be expressed as an Istio workload selector \
         (only matchLabels, or `In` with exactly one value, translate); use matchLabels"
    )]
    UnsupportedIstioSelector(String),
    #[error("spec.istio.selector is empty and would select every pod in the namespace")]
    EmptyIstioSelector,
}

impl RenderError {
    /// The condition reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::MissingPayload(_) => "MissingPayload",
            RenderError::NoUid => "NotYetCreated",
            RenderError::UnsupportedIstioSelector(_) => "UnsupportedSelector",
            RenderError::EmptyIstioSelector => "EmptySelector",
        }
    }
}

/// The largest `egress-name-rules` annotation written (JSON bytes).
pub const MAX_NAME_RULES_ANNOTATION_BYTES: usize = 128 * 1024;

/// The desired rendered object of `policy`, whose `egressNames` entries have no address yet.
pub fn desired(policy: &WorkloadNetworkPolicy) -> Result<Desired, RenderError> {
    desired_with(policy, |_| BTreeSet::new())
}

/// The desired rendered object of `policy`; `addresses` gives the addresses an `egressNames` entry
/// stands for now.
pub fn desired_with(
    policy: &WorkloadNetworkPolicy,
    addresses: impl Fn(&NameRule) -> BTreeSet<IpAddr>,
) -> Result<Desired, RenderError> {
    match policy.spec.backend {
        Backend::Kubernetes => {
            let mut spec = policy
                .spec
                .kubernetes
                .clone()
                .ok_or(RenderError::MissingPayload("kubernetes"))?;
            match policy.spec.mode {
                PolicyMode::Monitor => Ok(Desired::NoNetworkPolicy),
                PolicyMode::Protect => {
                    let mut annotations = BTreeMap::new();
                    if !policy.spec.egress_names.is_empty() {
                        let names: BTreeSet<&str> = policy
                            .spec
                            .egress_names
                            .iter()
                            .flat_map(|r| r.names.iter().map(String::as_str))
                            .collect();
                        let names: Vec<&str> = names.into_iter().collect();
                        annotations.insert(EGRESS_NAMES_ANNOTATION.to_string(), names.join(","));
                        // The entries themselves, for the agent's DNS hold; an object's annotations
                        // hold 256 KiB in all, so a very large list is left out (the agent then says
                        // so, and enforces from the addresses below).
                        if let Ok(rules) = serde_json::to_string(&policy.spec.egress_names)
                            && rules.len() <= MAX_NAME_RULES_ANNOTATION_BYTES
                        {
                            annotations.insert(EGRESS_NAME_RULES_ANNOTATION.to_string(), rules);
                        }
                        let rules = spec.egress.get_or_insert_with(Vec::new);
                        rules.extend(
                            policy
                                .spec
                                .egress_names
                                .iter()
                                .filter_map(|rule| name_rule(rule, &addresses(rule))),
                        );
                    }
                    Ok(Desired::NetworkPolicy(Box::new(NetworkPolicy {
                        metadata: metadata(policy, annotations)?,
                        spec: Some(spec),
                    })))
                }
            }
        }
        Backend::Istio => {
            let istio = policy
                .spec
                .istio
                .as_ref()
                .ok_or(RenderError::MissingPayload("istio"))?;
            let mut annotations = BTreeMap::new();
            if policy.spec.mode == PolicyMode::Monitor {
                annotations.insert(ISTIO_DRY_RUN_ANNOTATION.to_string(), "true".to_string());
            }
            let spec = AuthorizationPolicySpec {
                selector: Some(istio_selector(&istio.selector)?),
                action: Some("ALLOW".to_string()),
                rules: istio.rules.clone(),
            };
            Ok(Desired::AuthorizationPolicy(Box::new(
                AuthorizationPolicy {
                    metadata: metadata(policy, annotations)?,
                    spec,
                },
            )))
        }
    }
}

/// The egress rule of one `egressNames` entry: its addresses as single-address `ipBlock`s, on its
/// ports; `None` without addresses (a rule without peers would allow every destination).
fn name_rule(rule: &NameRule, addresses: &BTreeSet<IpAddr>) -> Option<NetworkPolicyEgressRule> {
    if addresses.is_empty() {
        return None;
    }
    let to = addresses
        .iter()
        .map(|ip| NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: ipnet::IpNet::from(*ip).to_string(),
                except: None,
            }),
            ..NetworkPolicyPeer::default()
        })
        .collect();
    Some(NetworkPolicyEgressRule {
        to: Some(to),
        ports: (!rule.ports.is_empty()).then(|| rule.ports.clone()),
    })
}

/// The controller ownerReference rendered objects carry.
pub fn owner_reference(policy: &WorkloadNetworkPolicy) -> Result<OwnerReference, RenderError> {
    let mut owner = policy.controller_owner_ref(&()).ok_or(RenderError::NoUid)?;
    owner.block_owner_deletion = Some(true);
    Ok(owner)
}

/// True when `owners` contains a controller reference to `policy` (by uid).
pub fn is_owned_by(owners: Option<&Vec<OwnerReference>>, policy: &WorkloadNetworkPolicy) -> bool {
    let Some(uid) = policy.meta().uid.as_deref() else {
        return false;
    };
    owners
        .into_iter()
        .flatten()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

fn metadata(
    policy: &WorkloadNetworkPolicy,
    mut annotations: BTreeMap<String, String>,
) -> Result<ObjectMeta, RenderError> {
    if let Some(generation) = policy.meta().generation {
        annotations.insert(
            RENDERED_GENERATION_ANNOTATION.to_string(),
            generation.to_string(),
        );
    }
    Ok(ObjectMeta {
        name: policy.meta().name.clone(),
        namespace: policy.meta().namespace.clone(),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        )])),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: Some(vec![owner_reference(policy)?]),
        ..ObjectMeta::default()
    })
}

/// Translates a LabelSelector into Istio's matchLabels-only workload selector. `In` with a single
/// value is an equality and translates; anything else would change which pods are selected, so it is
/// refused rather than dropped (dropping it is how the reference ends up selecting the whole namespace).
pub fn istio_selector(selector: &LabelSelector) -> Result<WorkloadSelector, RenderError> {
    let mut labels: BTreeMap<String, String> = selector.match_labels.clone().unwrap_or_default();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let describe = || format!("{} {} {:?}", e.key, e.operator, values);
        match (e.operator.as_str(), values) {
            ("In", [value]) => match labels.get(&e.key) {
                Some(existing) if existing != value => {
                    return Err(RenderError::UnsupportedIstioSelector(describe()));
                }
                _ => {
                    labels.insert(e.key.clone(), value.clone());
                }
            },
            _ => return Err(RenderError::UnsupportedIstioSelector(describe())),
        }
    }
    if labels.is_empty() {
        return Err(RenderError::EmptyIstioSelector);
    }
    Ok(WorkloadSelector {
        match_labels: labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(spec: serde_json::Value) -> WorkloadNetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": "deployment-web-ingress", "namespace": "shop", "uid": "uid-1", "generation": 4},
            "spec": spec
        }))
        .unwrap()
    }

    fn kubernetes(mode: &str) -> WorkloadNetworkPolicy {
        policy(json!({
            "backend": "kubernetes", "mode": mode, "direction": "Ingress",
            "targetRef": {"kind": "Deployment", "name": "web"},
            "kubernetes": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                             "ports": [{"protocol": "TCP", "port": 8080, "endPort": 8090}]}]
            }
        }))
    }

    fn istio(mode: &str, selector: serde_json::Value) -> WorkloadNetworkPolicy {
        policy(json!({
            "backend": "istio", "mode": mode, "direction": "Ingress",
            "targetRef": {"kind": "Deployment", "name": "web"},
            "istio": {
                "selector": selector,
                "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/client"]}}],
                           "to": [{"operation": {"ports": ["8080"]}}]}]
            }
        }))
    }

    #[test]
    fn kubernetes_protect_renders_the_spec_verbatim_with_a_controller_owner() {
        let p = kubernetes("protect");
        let Desired::NetworkPolicy(np) = desired(&p).unwrap() else {
            panic!("expected a NetworkPolicy")
        };
        assert_eq!(np.spec.as_ref(), p.spec.kubernetes.as_ref());
        assert_eq!(np.metadata.name.as_deref(), Some("deployment-web-ingress"));
        assert_eq!(np.metadata.namespace.as_deref(), Some("shop"));
        let owners = np.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, "uid-1");
        assert_eq!(owners[0].kind, "WorkloadNetworkPolicy");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(true));
        assert!(is_owned_by(np.metadata.owner_references.as_ref(), &p));
        assert_eq!(
            np.metadata.annotations.unwrap()[RENDERED_GENERATION_ANNOTATION],
            "4",
            "the generation it was rendered from"
        );
    }

    #[test]
    fn egress_names_render_the_addresses_resolved_now_on_their_ports() {
        let p = |mode: &str| {
            policy(json!({
                "backend": "kubernetes", "mode": mode, "direction": "Egress",
                "targetRef": {"kind": "Deployment", "name": "web"},
                "kubernetes": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                               "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]},
                "egressNames": [
                    {"names": ["api.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]},
                    {"names": ["*.storage.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]}
                ]
            }))
        };
        let resolved = |rule: &NameRule| -> BTreeSet<IpAddr> {
            match rule.names[0].as_str() {
                "api.partner.test" => ["203.0.113.11", "2001:db8::7", "203.0.113.10"]
                    .iter()
                    .map(|a| a.parse().unwrap())
                    .collect(),
                _ => BTreeSet::new(),
            }
        };
        let Desired::NetworkPolicy(np) = desired_with(&p("protect"), resolved).unwrap() else {
            panic!("expected a NetworkPolicy")
        };
        let egress = np.spec.as_ref().unwrap().egress.as_ref().unwrap();
        assert_eq!(
            serde_json::to_value(egress).unwrap(),
            json!([
                {"ports": [{"protocol": "UDP", "port": 53}]},
                // Sorted, single addresses; the wildcard nobody resolved yet adds no rule (a rule
                // without peers would allow every address).
                {"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}, {"ipBlock": {"cidr": "203.0.113.11/32"}},
                        {"ipBlock": {"cidr": "2001:db8::7/128"}}],
                 "ports": [{"protocol": "TCP", "port": 443}]}
            ])
        );
        let annotations = np.metadata.annotations.unwrap();
        assert_eq!(
            annotations[EGRESS_NAMES_ANNOTATION],
            "*.storage.partner.test,api.partner.test"
        );
        // The entries as written, for the agent's DNS hold.
        let rules: Vec<NameRule> =
            serde_json::from_str(&annotations[EGRESS_NAME_RULES_ANNOTATION]).unwrap();
        assert_eq!(rules, p("protect").spec.egress_names);
        assert_eq!(
            desired_with(&p("monitor"), resolved).unwrap(),
            Desired::NoNetworkPolicy
        );
    }

    #[test]
    fn kubernetes_monitor_renders_nothing() {
        assert_eq!(
            desired(&kubernetes("monitor")).unwrap(),
            Desired::NoNetworkPolicy
        );
    }

    #[test]
    fn istio_monitor_is_dry_run_and_protect_is_not() {
        let sel = json!({"matchLabels": {"app": "web"}});
        let Desired::AuthorizationPolicy(ap) = desired(&istio("monitor", sel.clone())).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            ap.metadata.annotations.as_ref().unwrap()[ISTIO_DRY_RUN_ANNOTATION],
            "true"
        );
        assert_eq!(ap.spec.action.as_deref(), Some("ALLOW"));
        assert_eq!(ap.spec.rules.len(), 1);
        assert_eq!(
            ap.spec.selector.as_ref().unwrap().match_labels["app"],
            "web"
        );
        let v = serde_json::to_value(&*ap).unwrap();
        assert_eq!(v["apiVersion"], "security.istio.io/v1");
        assert_eq!(
            v["spec"]["rules"][0]["from"][0]["source"]["principals"][0],
            "cluster.local/ns/shop/sa/client"
        );
        let Desired::AuthorizationPolicy(ap) = desired(&istio("protect", sel)).unwrap() else {
            panic!()
        };
        assert!(
            !ap.metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(ISTIO_DRY_RUN_ANNOTATION)
        );
    }

    #[test]
    fn istio_selector_translation() {
        let single_in =
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]});
        let Desired::AuthorizationPolicy(ap) = desired(&istio("protect", single_in)).unwrap()
        else {
            panic!()
        };
        assert_eq!(ap.spec.selector.unwrap().match_labels["app"], "web");
        for bad in [
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}),
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "app", "operator": "In", "values": ["api"]}]}),
        ] {
            let err = desired(&istio("protect", bad)).unwrap_err();
            assert_eq!(err.reason(), "UnsupportedSelector", "{err}");
        }
        assert_eq!(
            desired(&istio("protect", json!({}))).unwrap_err(),
            RenderError::EmptyIstioSelector
        );
    }

    #[test]
    fn missing_payload_is_an_error_not_an_empty_object() {
        let mut p = kubernetes("protect");
        p.spec.kubernetes = None;
        assert_eq!(
            desired(&p).unwrap_err(),
            RenderError::MissingPayload("kubernetes")
        );
    }
}
