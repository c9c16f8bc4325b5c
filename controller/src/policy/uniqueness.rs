//! At most one policy per (namespace, targetRef, direction) is in force: valid policies before invalid
//! ones, then the oldest, then the name (docs/behaviour.md §4.3). The others are duplicates that render
//! nothing.

use kube::ResourceExt;
use network_enforcer_api::WorkloadNetworkPolicy;

/// The policy among `policies` (all of one namespace) that governs the same target and direction as
/// `policy`, or `None` when `policy` itself does. Policies being deleted do not compete. `valid` tells
/// whether a policy passes the CRDs' rules ([`crate::policy::validity::Backends::is_valid`]).
pub fn winner_over<'a>(
    policy: &WorkloadNetworkPolicy,
    policies: impl IntoIterator<Item = &'a WorkloadNetworkPolicy>,
    valid: impl Fn(&WorkloadNetworkPolicy) -> bool,
) -> Option<&'a WorkloadNetworkPolicy> {
    // Invalid after valid: on clusters that do not run the CRDs' CEL rules an invalid policy gets in,
    // and the workload must not lose a valid policy's protection to it.
    let key =
        |p: &WorkloadNetworkPolicy| (!valid(p), p.creation_timestamp().map(|t| t.0), p.name_any());
    let own = key(policy);
    policies
        .into_iter()
        .filter(|p| {
            p.spec.target_ref == policy.spec.target_ref
                && p.spec.direction == policy.spec.direction
                && p.uid() != policy.uid()
                && p.metadata.deletion_timestamp.is_none()
        })
        .map(|p| (key(p), p))
        .filter(|(k, _)| *k < own)
        .min_by(|(a, _), (b, _)| a.cmp(b))
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::validity::Backends;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn policy(name: &str, created: &str, target: &str, direction: &str) -> WorkloadNetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": name, "namespace": "shop", "uid": name, "creationTimestamp": created},
            "spec": {
                "backend": "kubernetes", "direction": direction,
                "targetRef": {"kind": "Deployment", "name": target},
                "kubernetes": {"podSelector": {"matchLabels": {"app": target}}, "policyTypes": [direction]}
            }
        }))
        .unwrap()
    }

    /// What the reconciler and the monitor pass: the CRDs' rules, nothing remembered.
    fn valid(p: &WorkloadNetworkPolicy) -> bool {
        Backends::default().is_valid(p)
    }

    const DAY1: &str = "2026-01-01T00:00:00Z";
    const DAY2: &str = "2026-01-02T00:00:00Z";
    const DAY3: &str = "2026-01-03T00:00:00Z";

    #[test]
    fn valid_first_then_oldest_then_name_and_deletions_do_not_compete() {
        struct P {
            name: &'static str,
            created: &'static str,
            valid: bool,
            deleting: bool,
        }
        let p = |name, created, valid, deleting| P {
            name,
            created,
            valid,
            deleting,
        };
        // (case, the policies of one target and direction, the one in force)
        let cases = [
            (
                "an invalid older policy does not shadow a valid newer one",
                vec![p("old", DAY1, false, false), p("new", DAY2, true, false)],
                "new",
            ),
            (
                "among invalid ones the oldest",
                vec![p("a", DAY2, false, false), p("b", DAY1, false, false)],
                "b",
            ),
            (
                "among valid ones the oldest",
                vec![p("a", DAY2, true, false), p("b", DAY1, true, false)],
                "b",
            ),
            (
                "same creation time: the name",
                vec![p("b", DAY1, true, false), p("a", DAY1, true, false)],
                "a",
            ),
            (
                "the oldest valid one, whatever the invalid ones' age",
                vec![
                    p("a", DAY1, false, false),
                    p("c", DAY3, true, false),
                    p("b", DAY2, true, false),
                ],
                "b",
            ),
            (
                "a policy being deleted does not compete",
                vec![p("old", DAY1, true, true), p("new", DAY2, true, false)],
                "new",
            ),
            (
                "nor does a valid one being deleted shadow an invalid one",
                vec![p("old", DAY1, true, true), p("new", DAY2, false, false)],
                "new",
            ),
        ];
        for (case, specs, expected) in cases {
            let all: Vec<WorkloadNetworkPolicy> = specs
                .iter()
                .map(|s| {
                    let mut policy = policy(s.name, s.created, "web", "Ingress");
                    if !s.valid {
                        // Rendered, it would isolate the whole namespace (rule PodSelectorNotEmpty).
                        policy.spec.kubernetes.as_mut().unwrap().pod_selector =
                            Some(Default::default());
                    }
                    if s.deleting {
                        policy.metadata.deletion_timestamp =
                            Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
                    }
                    assert_eq!(valid(&policy), s.valid, "{case}: {}", s.name);
                    policy
                })
                .collect();
            // The reconciler never asks about a policy being deleted.
            for asked in all
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                let winner = winner_over(asked, &all, valid).map(|w| w.name_any());
                let want = (asked.name_any() != expected).then(|| expected.to_string());
                assert_eq!(winner, want, "{case}: asked about {}", asked.name_any());
            }
        }
    }

    #[test]
    fn other_targets_and_directions_do_not_compete() {
        let a = policy("a", DAY2, "web", "Ingress");
        let egress = policy("b", DAY1, "web", "Egress");
        let other = policy("c", DAY1, "api", "Ingress");
        assert!(winner_over(&a, &[egress, other], valid).is_none());
    }
}
