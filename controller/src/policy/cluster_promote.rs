//! Promotion of ClusterNetworkPolicyProposals (docs/behaviour.md §4.9): what the cluster should hold
//! given the proposals and their `promote` labels. Pure; `reconcile::cluster_proposals` applies it.
//!
//! - `promote=protect`: the ClusterNetworkPolicy of the proposal's name, with its spec, labelled as
//!   ours and owned by the proposal (deleting the proposal deletes it). A policy of that name that is
//!   not ours is never taken over.
//! - `promote=monitor`: nothing is created (one we created under `protect` is deleted); the status
//!   sync records the flows the policy would deny in the proposal's status
//!   ([`crate::monitor::evaluate::cluster_monitor`]). Nothing is put in force, so no signature is
//!   needed: a proposal edited by hand may be monitored to see what the edit would deny.
//! - no label (or the label removed, or the proposal deleted): a ClusterNetworkPolicy we created for
//!   it is deleted.

use crate::learn::provenance::{Provenance, SigningKey};
use crate::policy::conditions::Desired;
use crate::policy::render::MANAGED_BY_LABEL;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposal;
use network_enforcer_api::keys::{
    PROMOTE_LABEL, PROMOTE_MONITOR, PROMOTE_PROTECT, PROMOTED_FROM_LABEL,
};
use std::collections::{BTreeMap, HashMap};

/// The proposal's condition: whether its promoted ClusterNetworkPolicy exists as proposed.
pub const RENDERED: &str = "Rendered";

/// The `Rendered` reason of a proposal in monitor: nothing rendered, by request (no warning).
pub const MONITORED: &str = "Monitored";

/// What to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// ClusterNetworkPolicies to create, or to bring back to their proposal (drift).
    pub apply: Vec<ClusterNetworkPolicy>,
    /// Ours whose proposal is gone or no longer promoted to protect.
    pub delete: Vec<String>,
    /// The `Rendered` condition of each labelled proposal, by name.
    pub conditions: Vec<(String, Desired)>,
}

/// The plan for `proposals` given the ClusterNetworkPolicies that `existing` lists (all of them, by
/// name); `served`: whether the API server serves the ClusterNetworkPolicy kind at all.
///
/// With `key`, only proposals whose spec the controller signed are put in force (see
/// [`crate::learn::provenance`]): promotion creates ClusterNetworkPolicies with the controller's
/// rights, so whoever may write a proposal must not choose its rules.
pub fn plan(
    proposals: &[ClusterNetworkPolicyProposal],
    existing: &[ClusterNetworkPolicy],
    served: bool,
    key: Option<&SigningKey>,
) -> Plan {
    let existing: HashMap<String, &ClusterNetworkPolicy> =
        existing.iter().map(|p| (p.name_any(), p)).collect();
    let mut plan = Plan::default();
    let mut protected: Vec<String> = Vec::new();
    for proposal in proposals {
        let name = proposal.name_any();
        let Some(label) = proposal.labels().get(PROMOTE_LABEL) else {
            continue;
        };
        let condition = |status, reason: &str, message: String| {
            (
                name.clone(),
                Desired::new(RENDERED, status, reason, message),
            )
        };
        match label.as_str() {
            PROMOTE_PROTECT if !served => plan.conditions.push(condition(
                false,
                "KindNotServed",
                "the cluster serves no ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2): \
                 install the network-policy-api v0.2.0 CRDs and an enforcer of them"
                    .into(),
            )),
            PROMOTE_PROTECT => {
                let provenance =
                    key.map_or(Provenance::Learned, |k| k.check_spec(&proposal.metadata, &proposal.spec));
                if provenance != Provenance::Learned {
                    // What it may have created before stays only while it is what was learned.
                    plan.conditions.push(condition(
                        false,
                        provenance.reason(),
                        format!(
                            "the proposal's spec is not what the controller learned ({}), so it is not \
                             put in force: write a ClusterNetworkPolicy of your own instead; learning \
                             writes the proposal again when the namespace graph changes",
                            match provenance {
                                Provenance::Unsigned => "no learned-digest annotation",
                                _ => "edited after learning",
                            }
                        ),
                    ));
                    continue;
                }
                protected.push(name.clone());
                let Some(desired) = desired(proposal) else {
                    plan.conditions.push(condition(
                        false,
                        "NotRendered",
                        "the proposal has no uid yet".into(),
                    ));
                    continue;
                };
                match existing.get(&name) {
                    Some(current) if !is_ours(current) => plan.conditions.push(condition(
                        false,
                        "NameTaken",
                        format!(
                            "a ClusterNetworkPolicy named {name} exists and was not created from \
                             this proposal: it is left alone; rename or delete it"
                        ),
                    )),
                    current => {
                        if current.is_none_or(|c| !same(c, &desired)) {
                            plan.apply.push(desired);
                        }
                        plan.conditions.push(condition(
                            true,
                            "Rendered",
                            format!("ClusterNetworkPolicy {name} is in force as proposed"),
                        ));
                    }
                }
            }
            PROMOTE_MONITOR if existing.get(&name).is_some_and(|p| !is_ours(p)) => {
                plan.conditions.push(condition(
                    false,
                    "NameTaken",
                    format!(
                        "a ClusterNetworkPolicy named {name} exists and was not created from \
                         this proposal: what the proposal would deny in its place is not recorded \
                         (it could never be put in force); rename or delete that one"
                    ),
                ))
            }
            PROMOTE_MONITOR => plan.conditions.push(condition(
                false,
                MONITORED,
                "in monitor: nothing is created; the flows the ClusterNetworkPolicy would deny are \
                 recorded in status.violations (promote=protect creates it)"
                    .into(),
            )),
            other => plan.conditions.push(condition(
                false,
                "InvalidPromotion",
                format!("{PROMOTE_LABEL}={other:?}: use {PROMOTE_MONITOR} or {PROMOTE_PROTECT}"),
            )),
        }
    }
    let mut ours: Vec<String> = existing
        .iter()
        .filter(|(name, policy)| is_ours(policy) && !protected.contains(name))
        .map(|(name, _)| name.clone())
        .collect();
    ours.sort();
    plan.delete = ours;
    plan
}

/// A ClusterNetworkPolicy we created from a proposal.
pub fn is_ours(policy: &ClusterNetworkPolicy) -> bool {
    let labels = policy.labels();
    labels.get(MANAGED_BY_LABEL.0).map(String::as_str) == Some(MANAGED_BY_LABEL.1)
        && labels.contains_key(PROMOTED_FROM_LABEL)
}

/// Whether `current` is what `desired` says (spec, owner, our labels).
fn same(current: &ClusterNetworkPolicy, desired: &ClusterNetworkPolicy) -> bool {
    current.spec == desired.spec
        && current.owner_references() == desired.owner_references()
        && desired
            .labels()
            .iter()
            .all(|(k, v)| current.labels().get(k) == Some(v))
}

/// The ClusterNetworkPolicy `proposal` stands for; `None` without a uid (not created yet).
fn desired(proposal: &ClusterNetworkPolicyProposal) -> Option<ClusterNetworkPolicy> {
    let name = proposal.name_any();
    let owner = OwnerReference {
        api_version: ClusterNetworkPolicyProposal::api_version(&()).into_owned(),
        kind: ClusterNetworkPolicyProposal::kind(&()).into_owned(),
        name: name.clone(),
        uid: proposal.uid()?,
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut policy = ClusterNetworkPolicy::new(&name, proposal.spec.policy.clone());
    policy.metadata.labels = Some(BTreeMap::from([
        (
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        ),
        (PROMOTED_FROM_LABEL.to_string(), name),
    ]));
    policy.metadata.owner_references = Some(vec![owner]);
    Some(policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicySpec;
    use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposalSpec;

    fn proposal(name: &str, label: Option<&str>, priority: i32) -> ClusterNetworkPolicyProposal {
        let mut p = ClusterNetworkPolicyProposal::new(
            name,
            ClusterNetworkPolicyProposalSpec {
                policy: ClusterNetworkPolicySpec {
                    tier: "Admin".into(),
                    priority,
                    ..ClusterNetworkPolicySpec::default()
                },
            },
        );
        p.metadata.uid = Some(format!("uid-{name}"));
        if let Some(label) = label {
            p.metadata.labels = Some(BTreeMap::from([(PROMOTE_LABEL.into(), label.into())]));
        }
        p
    }

    fn reasons(plan: &Plan) -> Vec<(String, bool, String)> {
        plan.conditions
            .iter()
            .map(|(n, d)| (n.clone(), d.status, d.reason.clone()))
            .collect()
    }

    #[test]
    fn promotion_creates_repairs_and_removes_only_our_policies() {
        let isolate = proposal("ne-isolate-shop", Some("protect"), 900);
        let created = desired(&isolate).unwrap();
        let mut drifted = created.clone();
        drifted.spec.priority = 5;
        let foreign =
            ClusterNetworkPolicy::new("ne-floor-shop", ClusterNetworkPolicySpec::default());
        let mut stale = desired(&proposal("ne-isolate-gone", Some("protect"), 900)).unwrap();
        stale.metadata.name = Some("ne-isolate-gone".into());

        struct Case {
            name: &'static str,
            proposals: Vec<ClusterNetworkPolicyProposal>,
            existing: Vec<ClusterNetworkPolicy>,
            served: bool,
            apply: Vec<&'static str>,
            delete: Vec<&'static str>,
            conditions: Vec<(&'static str, bool, &'static str)>,
        }
        let cases = [
            Case {
                name: "promoted: created, owned by the proposal",
                proposals: vec![isolate.clone(), proposal("ne-floor-shop", None, 900)],
                existing: vec![],
                served: true,
                apply: vec!["ne-isolate-shop"],
                delete: vec![],
                conditions: vec![("ne-isolate-shop", true, "Rendered")],
            },
            Case {
                name: "in force as proposed: nothing to write",
                proposals: vec![isolate.clone()],
                existing: vec![created.clone()],
                served: true,
                apply: vec![],
                delete: vec![],
                conditions: vec![("ne-isolate-shop", true, "Rendered")],
            },
            Case {
                name: "edited by hand: brought back",
                proposals: vec![isolate.clone()],
                existing: vec![drifted],
                served: true,
                apply: vec!["ne-isolate-shop"],
                delete: vec![],
                conditions: vec![("ne-isolate-shop", true, "Rendered")],
            },
            Case {
                name: "label removed, proposal deleted: ours deleted, a foreign one kept",
                proposals: vec![proposal("ne-isolate-shop", None, 900)],
                existing: vec![created.clone(), stale, foreign.clone()],
                served: true,
                apply: vec![],
                delete: vec!["ne-isolate-gone", "ne-isolate-shop"],
                conditions: vec![],
            },
            Case {
                name: "a policy of the name that is not ours is never taken over",
                proposals: vec![proposal("ne-floor-shop", Some("protect"), 900)],
                existing: vec![foreign.clone()],
                served: true,
                apply: vec![],
                delete: vec![],
                conditions: vec![("ne-floor-shop", false, "NameTaken")],
            },
            Case {
                name: "nor monitored in its place",
                proposals: vec![proposal("ne-floor-shop", Some("monitor"), 900)],
                existing: vec![foreign],
                served: true,
                apply: vec![],
                delete: vec![],
                conditions: vec![("ne-floor-shop", false, "NameTaken")],
            },
            Case {
                name: "kind not served, monitor, a wrong value",
                proposals: vec![
                    isolate.clone(),
                    proposal("ne-floor-shop", Some("monitor"), 900),
                    proposal("ne-floor-db", Some("Protect"), 900),
                ],
                existing: vec![],
                served: false,
                apply: vec![],
                delete: vec![],
                conditions: vec![
                    ("ne-isolate-shop", false, "KindNotServed"),
                    ("ne-floor-shop", false, "Monitored"),
                    ("ne-floor-db", false, "InvalidPromotion"),
                ],
            },
        ];
        for case in cases {
            let plan = plan(&case.proposals, &case.existing, case.served, None);
            let applied: Vec<String> = plan.apply.iter().map(|p| p.name_any()).collect();
            assert_eq!(applied, case.apply, "{}", case.name);
            assert_eq!(plan.delete, case.delete, "{}", case.name);
            let expected: Vec<(String, bool, String)> = case
                .conditions
                .iter()
                .map(|(n, s, r)| (n.to_string(), *s, r.to_string()))
                .collect();
            assert_eq!(reasons(&plan), expected, "{}", case.name);
            for policy in &plan.apply {
                let owner = &policy.owner_references()[0];
                assert_eq!(
                    (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
                    (
                        "ClusterNetworkPolicyProposal",
                        "uid-ne-isolate-shop",
                        Some(true)
                    ),
                    "{}",
                    case.name
                );
                assert!(is_ours(policy), "{}", case.name);
                assert_eq!(policy.spec.priority, 900, "{}", case.name);
            }
        }
    }

    /// With a signing key, only what learning signed is put in force: a proposal written by hand or
    /// edited after learning is refused, and what was created from it before is deleted.
    #[test]
    fn only_what_learning_signed_is_put_in_force() {
        use network_enforcer_api::keys::LEARNED_DIGEST_ANNOTATION;
        let key = SigningKey::new(&[7u8; 32]).unwrap();
        let signed = |mut p: ClusterNetworkPolicyProposal| {
            p.metadata.annotations = Some(BTreeMap::from([(
                LEARNED_DIGEST_ANNOTATION.to_string(),
                key.sign_spec(&p.spec),
            )]));
            p
        };
        let learned = signed(proposal("ne-isolate-shop", Some("protect"), 900));
        let mut edited = signed(proposal("ne-isolate-db", Some("protect"), 900));
        edited.spec.policy.tier = "Baseline".into();
        let by_hand = proposal("ne-isolate-web", Some("protect"), 900);
        let before = desired(&edited).unwrap();
        let plan = plan(&[learned, edited, by_hand], &[before], true, Some(&key));
        let applied: Vec<String> = plan.apply.iter().map(|p| p.name_any()).collect();
        assert_eq!(applied, ["ne-isolate-shop"]);
        assert_eq!(plan.delete, ["ne-isolate-db"]);
        assert_eq!(
            reasons(&plan),
            [
                ("ne-isolate-shop".to_string(), true, "Rendered".to_string()),
                (
                    "ne-isolate-db".to_string(),
                    false,
                    "EditedAfterLearning".to_string()
                ),
                (
                    "ne-isolate-web".to_string(),
                    false,
                    "NotLearned".to_string()
                ),
            ]
        );
    }
}
