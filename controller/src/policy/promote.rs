//! Promotion (docs/design.md, "Promotion and rendering"): what the proposal reconciler does with one
//! proposal, decided from the proposal and the policies in its namespace.

use crate::learn::provenance::Provenance;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use network_enforcer_api::keys::{PROMOTE_LABEL, PROMOTED_FROM_LABEL, PROTECT_GATE_ANNOTATION};
use network_enforcer_api::naming::promoted_from_value;
use network_enforcer_api::validation::{self, Violation};
use network_enforcer_api::{
    PolicyMode, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal, WorkloadNetworkPolicySpec,
};
use std::collections::BTreeMap;

/// What to do with a proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not labelled for promotion and not a leftover: learning owns it.
    Keep,
    /// Create the policy in this mode, then delete the proposal.
    Promote(PolicyMode),
    /// A policy promoted from this proposal exists: the proposal is a leftover (re-created by learning,
    /// or the delete after a promotion did not happen). Delete it.
    DeleteLeftover,
    /// The promote label has a value other than `monitor`/`protect`: report it, do nothing else.
    InvalidLabel(String),
    /// A policy of the same name exists that was not promoted from this proposal: report it and keep both.
    PolicyExists,
    /// The proposal breaks rules of the CRDs (on a cluster that does not run their CEL rules): the
    /// policy would be invalid, so it is not created; report it.
    Invalid(Vec<Violation>),
    /// Labelled for promotion, but its spec is not what the controller learned ([`gate`]): report it.
    NotLearned(Provenance),
}

/// Decides what to do with `proposal`, given the policies of its namespace.
pub fn decide<'a>(
    proposal: &WorkloadNetworkPolicyProposal,
    policies_in_namespace: impl IntoIterator<Item = &'a WorkloadNetworkPolicy>,
) -> Decision {
    let name = proposal.name_any();
    let link = promoted_from_value(&name);
    let mut same_name = false;
    for policy in policies_in_namespace {
        if policy.labels().get(PROMOTED_FROM_LABEL) == Some(&link) {
            return Decision::DeleteLeftover;
        }
        same_name |= policy.name_any() == name;
    }
    let mode = match proposal.labels().get(PROMOTE_LABEL).map(String::as_str) {
        None => return Decision::Keep,
        Some(_) if same_name => return Decision::PolicyExists,
        Some("monitor") => PolicyMode::Monitor,
        Some("protect") => PolicyMode::Protect,
        Some(other) => return Decision::InvalidLabel(other.to_string()),
    };
    // A proposal's backend only matters from its promotion on, so there is no earlier one to compare.
    match validation::validate(&proposal.spec, None) {
        Ok(()) => Decision::Promote(mode),
        Err(violations) => Decision::Invalid(violations),
    }
}

/// Refuses to promote a proposal whose spec the controller did not write ([`crate::learn::provenance`]);
/// every other decision stands.
pub fn gate(decision: Decision, provenance: Provenance) -> Decision {
    match decision {
        Decision::Promote(_) if provenance != Provenance::Learned => {
            Decision::NotLearned(provenance)
        }
        other => other,
    }
}

/// The policy a promotion creates: same name and namespace, payload, `targetRef` and `direction`
/// copied, `mode` from the label, and the `promoted-from` link.
pub fn policy_from(
    proposal: &WorkloadNetworkPolicyProposal,
    mode: PolicyMode,
) -> WorkloadNetworkPolicy {
    let name = proposal.name_any();
    let spec = &proposal.spec;
    WorkloadNetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: proposal.namespace(),
            labels: Some(BTreeMap::from([(
                PROMOTED_FROM_LABEL.to_string(),
                promoted_from_value(&name),
            )])),
            // The protect gate is chosen on the proposal, before the promotion that it guards.
            annotations: proposal
                .annotations()
                .get_key_value(PROTECT_GATE_ANNOTATION)
                .map(|(k, v)| BTreeMap::from([(k.clone(), v.clone())])),
            ..ObjectMeta::default()
        },
        spec: WorkloadNetworkPolicySpec {
            backend: spec.backend,
            kubernetes: spec.kubernetes.clone(),
            istio: spec.istio.clone(),
            target_ref: spec.target_ref.clone(),
            direction: spec.direction,
            mode,
            egress_names: spec.egress_names.clone(),
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn proposal(name: &str, promote: Option<&str>) -> WorkloadNetworkPolicyProposal {
        let mut labels = serde_json::Map::new();
        if let Some(v) = promote {
            labels.insert(PROMOTE_LABEL.into(), json!(v));
        }
        serde_json::from_value(json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicyProposal",
            "metadata": {"name": name, "namespace": "shop", "labels": labels},
            "spec": {
                "backend": "kubernetes", "direction": "Egress",
                "targetRef": {"kind": "Deployment", "name": "http-client"},
                "kubernetes": {"podSelector": {"matchLabels": {"app": "http-client"}}, "policyTypes": ["Egress"]}
            }
        }))
        .unwrap()
    }

    fn policy(name: &str, promoted_from: Option<&str>) -> WorkloadNetworkPolicy {
        let mut p = policy_from(&proposal(name, None), PolicyMode::Monitor);
        match promoted_from {
            Some(v) => {
                p.labels_mut().insert(PROMOTED_FROM_LABEL.into(), v.into());
            }
            None => {
                p.labels_mut().clear();
            }
        }
        p
    }

    const NAME: &str = "deployment-http-client-egress";

    #[test]
    fn promote_with_a_valid_label() {
        assert_eq!(
            decide(&proposal(NAME, Some("monitor")), []),
            Decision::Promote(PolicyMode::Monitor)
        );
        assert_eq!(
            decide(&proposal(NAME, Some("protect")), [&policy("other", None)]),
            Decision::Promote(PolicyMode::Protect)
        );
    }

    #[test]
    fn invalid_label_is_reported_not_acted_on() {
        assert_eq!(
            decide(&proposal(NAME, Some("enforce")), []),
            Decision::InvalidLabel("enforce".into())
        );
    }

    #[test]
    fn leftovers_are_deleted_with_or_without_the_label() {
        let promoted = policy(NAME, Some(NAME));
        assert_eq!(
            decide(&proposal(NAME, None), [&promoted]),
            Decision::DeleteLeftover
        );
        assert_eq!(
            decide(&proposal(NAME, Some("monitor")), [&promoted]),
            Decision::DeleteLeftover
        );
    }

    #[test]
    fn hand_made_policy_of_the_same_name_keeps_the_proposal() {
        let hand_made = policy(NAME, None);
        assert_eq!(decide(&proposal(NAME, None), [&hand_made]), Decision::Keep);
        assert_eq!(
            decide(&proposal(NAME, Some("protect")), [&hand_made]),
            Decision::PolicyExists
        );
        let from_other = policy(NAME, Some("something-else"));
        assert_eq!(
            decide(&proposal(NAME, Some("protect")), [&from_other]),
            Decision::PolicyExists
        );
    }

    #[test]
    fn invalid_proposals_are_not_promoted() {
        use network_enforcer_api::validation::Rule;
        let mut p = proposal(NAME, Some("protect"));
        p.spec.kubernetes.as_mut().unwrap().pod_selector = Some(Default::default());
        p.spec.kubernetes.as_mut().unwrap().policy_types = Some(vec!["Ingress".into()]);
        assert_eq!(
            decide(&p, []),
            Decision::Invalid(vec![
                Violation {
                    rule: Rule::PolicyTypes
                },
                Violation {
                    rule: Rule::PodSelectorNotEmpty
                },
            ])
        );
        // Not labelled: learning still owns it; a leftover is still deleted.
        let mut unlabelled = p.clone();
        unlabelled.labels_mut().clear();
        assert_eq!(decide(&unlabelled, []), Decision::Keep);
        assert_eq!(
            decide(&p, [&policy(NAME, Some(NAME))]),
            Decision::DeleteLeftover
        );
    }

    #[test]
    fn long_names_link_through_the_shortened_label_value() {
        let long = format!("deployment-{}-egress", "a".repeat(100));
        let created = policy_from(&proposal(&long, Some("monitor")), PolicyMode::Monitor);
        let link = &created.labels()[PROMOTED_FROM_LABEL];
        assert!(link.len() <= 63);
        assert_eq!(
            decide(&proposal(&long, None), [&created]),
            Decision::DeleteLeftover
        );
    }

    #[test]
    fn promoted_policy_copies_the_proposal() {
        let p = proposal(NAME, Some("protect"));
        let created = policy_from(&p, PolicyMode::Protect);
        assert_eq!(created.name_any(), NAME);
        assert_eq!(created.namespace().as_deref(), Some("shop"));
        assert_eq!(created.spec.mode, PolicyMode::Protect);
        assert_eq!(created.spec.kubernetes, p.spec.kubernetes);
        assert_eq!(created.spec.target_ref, p.spec.target_ref);
        assert_eq!(created.spec.direction, p.spec.direction);
        assert_eq!(created.labels()[PROMOTED_FROM_LABEL], NAME);
        assert!(!created.labels().contains_key(PROMOTE_LABEL));
        assert!(created.metadata.annotations.is_none());
        let mut gated = proposal(NAME, Some("protect"));
        gated.metadata.annotations = Some(BTreeMap::from([
            (PROTECT_GATE_ANNOTATION.to_string(), "strict".to_string()),
            ("unrelated".to_string(), "x".to_string()),
        ]));
        let created = policy_from(&gated, PolicyMode::Protect);
        assert_eq!(
            created.metadata.annotations,
            Some(BTreeMap::from([(
                PROTECT_GATE_ANNOTATION.to_string(),
                "strict".to_string()
            )]))
        );
    }

    #[test]
    fn only_learned_proposals_are_promoted() {
        let promote = Decision::Promote(PolicyMode::Protect);
        // (decision, provenance, gated)
        let cases = [
            (promote.clone(), Provenance::Learned, promote.clone()),
            (
                promote.clone(),
                Provenance::Unsigned,
                Decision::NotLearned(Provenance::Unsigned),
            ),
            (
                promote.clone(),
                Provenance::Edited,
                Decision::NotLearned(Provenance::Edited),
            ),
            (Decision::Keep, Provenance::Edited, Decision::Keep),
            (
                Decision::DeleteLeftover,
                Provenance::Unsigned,
                Decision::DeleteLeftover,
            ),
        ];
        for (decision, provenance, expected) in cases {
            assert_eq!(
                gate(decision.clone(), provenance),
                expected,
                "{decision:?} {provenance:?}"
            );
        }
    }
}
