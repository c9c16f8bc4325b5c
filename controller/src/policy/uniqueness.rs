//! At most one policy per (namespace, targetRef, direction): the oldest wins, later ones are
//! duplicates that render nothing.

use kube::ResourceExt;
use network_enforcer_api::WorkloadNetworkPolicy;

/// The policy among `policies` (all of one namespace) that governs the same target and direction as
/// `policy`: the oldest by creation time, then by name. `None` when `policy` itself wins.
pub fn winner_over<'a>(
    policy: &WorkloadNetworkPolicy,
    policies: impl IntoIterator<Item = &'a WorkloadNetworkPolicy>,
) -> Option<&'a WorkloadNetworkPolicy> {
    let key = |p: &WorkloadNetworkPolicy| (p.creation_timestamp().map(|t| t.0), p.name_any());
    policies
        .into_iter()
        .filter(|p| {
            p.spec.target_ref == policy.spec.target_ref
                && p.spec.direction == policy.spec.direction
                && p.uid() != policy.uid()
                && p.metadata.deletion_timestamp.is_none()
        })
        .filter(|p| key(p) < key(policy))
        .min_by_key(|p| key(p))
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn oldest_wins_then_name() {
        let a = policy("a", "2026-01-02T00:00:00Z", "web", "Ingress");
        let b = policy("b", "2026-01-01T00:00:00Z", "web", "Ingress");
        let c = policy("c", "2026-01-01T00:00:00Z", "web", "Ingress");
        let all = [a.clone(), b.clone(), c.clone()];
        assert_eq!(
            winner_over(&a, &all).map(|p| p.name_any()),
            Some("b".into())
        );
        assert_eq!(
            winner_over(&c, &all).map(|p| p.name_any()),
            Some("b".into())
        );
        assert!(winner_over(&b, &all).is_none());
    }

    #[test]
    fn other_targets_and_directions_do_not_compete() {
        let a = policy("a", "2026-01-02T00:00:00Z", "web", "Ingress");
        let egress = policy("b", "2026-01-01T00:00:00Z", "web", "Egress");
        let other = policy("c", "2026-01-01T00:00:00Z", "api", "Ingress");
        assert!(winner_over(&a, &[egress, other]).is_none());
    }
}
