//! The conditions the policy reconciler writes on a policy, computed at once from what it found out
//! about the policy ([`Standing`]) by [`desired`] (docs/behaviour.md §5.1): every path sets every
//! condition it owns, so none outlives the situation it described.

use super::conditions::{self, Desired};
use super::validity::INVALID_REASON;
use kube::ResourceExt;
use network_enforcer_api::WorkloadNetworkPolicy;

/// Every condition type the policy reconciler writes on policies.
pub const OWNED: [&str; 5] = [
    conditions::READY,
    conditions::DUPLICATE_TARGET,
    conditions::SELECTOR_OVERLAPS_WORKLOAD,
    conditions::UNUSED_RULES,
    conditions::WOULD_BLOCK,
];

/// What the policy reconciler found out about one policy (not being deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It breaks a rule of the CRDs.
    Invalid {
        /// Its `Ready=False, reason=Invalid`: the rules' messages and what stays in force.
        ready: Desired,
        /// The policy that governs its target and direction instead, if any.
        winner: Option<String>,
    },
    /// Valid, but `winner` governs its target and direction.
    Duplicate {
        winner: String,
        /// `SelectorOverlapsWorkload` of its selector.
        overlap: Desired,
    },
    /// Valid and in force.
    InForce {
        /// `Ready` from rendering (or the protect gate's hold).
        ready: Desired,
        /// The protect gate's `WouldBlock`.
        would_block: Desired,
        /// `UnusedRules` from the rule usage.
        unused_rules: Desired,
        /// `SelectorOverlapsWorkload` of its selector.
        overlap: Desired,
    },
}

/// The conditions to write on `policy` in `standing`: every type of [`OWNED`], exactly once, so that
/// none is left from an earlier standing (a duplicate that became invalid must not keep
/// `DuplicateTarget=True`, nor an invalid policy the `SelectorOverlapsWorkload` of a selector that is not
/// rendered). What a standing does not evaluate is False, with the reason saying why.
pub fn desired(policy: &WorkloadNetworkPolicy, standing: Standing) -> Vec<Desired> {
    match standing {
        Standing::Invalid { ready, winner } => {
            let not_evaluated = |type_, what: &str| {
                Desired::new(
                    type_,
                    false,
                    INVALID_REASON,
                    format!("the policy is invalid (see Ready): {what}"),
                )
            };
            vec![
                match winner {
                    Some(winner) => Desired::new(
                        conditions::DUPLICATE_TARGET,
                        true,
                        "DuplicateTarget",
                        format!("policy {winner} already governs {}", target(policy)),
                    ),
                    None => unique_target(),
                },
                ready,
                not_evaluated(conditions::UNUSED_RULES, "its rules are not evaluated"),
                not_evaluated(
                    conditions::WOULD_BLOCK,
                    "the observed traffic is not replayed against it",
                ),
                not_evaluated(
                    conditions::SELECTOR_OVERLAPS_WORKLOAD,
                    "its selector is not rendered",
                ),
            ]
        }
        Standing::Duplicate { winner, overlap } => {
            let message = format!(
                "policy {winner} already governs {}; this one renders nothing",
                target(policy)
            );
            vec![
                Desired::new(
                    conditions::DUPLICATE_TARGET,
                    true,
                    "DuplicateTarget",
                    message.clone(),
                ),
                Desired::new(conditions::READY, false, "DuplicateTarget", message),
                // It evaluates no traffic, so its rules cannot be used, and nothing of it is enforced.
                Desired::new(
                    conditions::UNUSED_RULES,
                    false,
                    NOT_IN_FORCE,
                    "the policy is not in force (DuplicateTarget); its rules are not evaluated",
                ),
                Desired::new(
                    conditions::WOULD_BLOCK,
                    false,
                    NOT_IN_FORCE,
                    "the policy is not in force (DuplicateTarget); the observed traffic is not \
                     replayed against it",
                ),
                overlap,
            ]
        }
        Standing::InForce {
            ready,
            would_block,
            unused_rules,
            overlap,
        } => vec![unique_target(), ready, would_block, unused_rules, overlap],
    }
}

/// The reason of conditions a duplicate does not evaluate.
const NOT_IN_FORCE: &str = "NotInForce";

fn unique_target() -> Desired {
    Desired::new(
        conditions::DUPLICATE_TARGET,
        false,
        "UniqueTarget",
        "no other policy governs this target and direction",
    )
}

/// `Deployment shop/web Ingress`.
fn target(policy: &WorkloadNetworkPolicy) -> String {
    format!(
        "{} {}/{} {}",
        policy.spec.target_ref.kind.as_str(),
        policy.namespace().unwrap_or_default(),
        policy.spec.target_ref.name,
        policy.spec.direction.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use serde_json::json;

    fn policy() -> WorkloadNetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": "web-new", "namespace": "shop", "uid": "web-new"},
            "spec": {
                "backend": "kubernetes", "direction": "Ingress",
                "targetRef": {"kind": "Deployment", "name": "web"},
                "kubernetes": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}
            }
        }))
        .unwrap()
    }

    fn invalid(winner: Option<&str>) -> Standing {
        Standing::Invalid {
            ready: Desired::new(
                conditions::READY,
                false,
                "Invalid",
                "podSelector must not be empty",
            ),
            winner: winner.map(str::to_string),
        }
    }

    fn duplicate() -> Standing {
        Standing::Duplicate {
            winner: "web-old".into(),
            overlap: Desired::new(
                conditions::SELECTOR_OVERLAPS_WORKLOAD,
                true,
                "SelectsOtherWorkloads",
                "the selector also selects pods of Deployment api",
            ),
        }
    }

    /// In force, with every condition that can be True True.
    fn in_force() -> Standing {
        Standing::InForce {
            ready: Desired::new(conditions::READY, true, "Rendered", "in sync"),
            would_block: Desired::new(
                conditions::WOULD_BLOCK,
                true,
                "WouldBlockObservedFlows",
                "1 of 3 observed flows would be blocked",
            ),
            unused_rules: Desired::new(conditions::UNUSED_RULES, true, "RulesUnused", "rule 0"),
            overlap: Desired::new(
                conditions::SELECTOR_OVERLAPS_WORKLOAD,
                true,
                "SelectsOtherWorkloads",
                "the selector also selects pods of Deployment api",
            ),
        }
    }

    /// The conditions after a reconcile in `before`, then one in `now`, as (type, status, reason).
    fn after(before: Standing, now: Standing) -> Vec<(String, String, String)> {
        let policy = policy();
        let t = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let mut status: Vec<Condition> = Vec::new();
        for standing in [before, now] {
            for c in desired(&policy, standing) {
                conditions::set(&mut status, &c, Some(1), &t);
            }
        }
        let mut out: Vec<_> = status
            .into_iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn every_standing_sets_every_owned_condition_once() {
        let mut owned = OWNED.to_vec();
        owned.sort();
        for (case, standing) in [
            ("invalid", invalid(None)),
            ("invalid, another policy governs", invalid(Some("web-old"))),
            ("duplicate", duplicate()),
            ("in force", in_force()),
        ] {
            let mut types: Vec<&str> = desired(&policy(), standing)
                .iter()
                .map(|c| c.type_)
                .collect();
            types.sort();
            assert_eq!(types, owned, "{case}");
        }
    }

    #[test]
    fn no_condition_of_an_earlier_standing_is_left_behind() {
        let row = |t: &str, s: &str, r: &str| (t.to_string(), s.to_string(), r.to_string());
        // (case, standing before, standing now, the conditions after both)
        let cases = [
            (
                "a duplicate whose winner went away becomes invalid",
                duplicate(),
                invalid(None),
                vec![
                    row("DuplicateTarget", "False", "UniqueTarget"),
                    row("Ready", "False", "Invalid"),
                    row("SelectorOverlapsWorkload", "False", "Invalid"),
                    row("UnusedRules", "False", "Invalid"),
                    row("WouldBlock", "False", "Invalid"),
                ],
            ),
            (
                "a policy in force becomes invalid next to a valid one",
                in_force(),
                invalid(Some("web-old")),
                vec![
                    row("DuplicateTarget", "True", "DuplicateTarget"),
                    row("Ready", "False", "Invalid"),
                    row("SelectorOverlapsWorkload", "False", "Invalid"),
                    row("UnusedRules", "False", "Invalid"),
                    row("WouldBlock", "False", "Invalid"),
                ],
            ),
            (
                "a policy in force becomes a duplicate",
                in_force(),
                duplicate(),
                vec![
                    row("DuplicateTarget", "True", "DuplicateTarget"),
                    row("Ready", "False", "DuplicateTarget"),
                    row("SelectorOverlapsWorkload", "True", "SelectsOtherWorkloads"),
                    row("UnusedRules", "False", "NotInForce"),
                    row("WouldBlock", "False", "NotInForce"),
                ],
            ),
            (
                "an invalid duplicate is fixed and governs",
                invalid(Some("web-old")),
                in_force(),
                vec![
                    row("DuplicateTarget", "False", "UniqueTarget"),
                    row("Ready", "True", "Rendered"),
                    row("SelectorOverlapsWorkload", "True", "SelectsOtherWorkloads"),
                    row("UnusedRules", "True", "RulesUnused"),
                    row("WouldBlock", "True", "WouldBlockObservedFlows"),
                ],
            ),
        ];
        for (case, before, now, expected) in cases {
            assert_eq!(after(before, now), expected, "{case}");
        }
    }

    #[test]
    fn messages_name_the_winner_and_the_target() {
        let dup = desired(&policy(), duplicate());
        assert_eq!(
            dup[0].message,
            "policy web-old already governs Deployment shop/web Ingress; this one renders nothing"
        );
        let inv = desired(&policy(), invalid(Some("web-old")));
        let c = inv
            .iter()
            .find(|c| c.type_ == conditions::DUPLICATE_TARGET)
            .unwrap();
        assert!(
            c.message
                .starts_with("policy web-old already governs Deployment shop/web Ingress"),
            "{}",
            c.message
        );
    }
}
