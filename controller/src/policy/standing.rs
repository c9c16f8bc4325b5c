//! The conditions the policy reconciler writes on a policy, computed at once from what it found out
//! about the policy ([`Standing`]) by [`desired`] (docs/behaviour.md §5.1).

use super::conditions::{self, Desired};
use kube::ResourceExt;
use network_enforcer_api::WorkloadNetworkPolicy;

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

/// The conditions to write on `policy` in `standing`.
pub fn desired(policy: &WorkloadNetworkPolicy, standing: Standing) -> Vec<Desired> {
    match standing {
        Standing::Invalid { ready, winner: _ } => vec![ready],
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
                // It evaluates no traffic, so its rules cannot be used.
                Desired::new(
                    conditions::UNUSED_RULES,
                    false,
                    "NotInForce",
                    "the policy is not in force (DuplicateTarget); its rules are not evaluated",
                ),
                overlap,
            ]
        }
        Standing::InForce {
            ready,
            would_block,
            unused_rules,
            overlap,
        } => vec![
            Desired::new(
                conditions::DUPLICATE_TARGET,
                false,
                "UniqueTarget",
                "no other policy governs this target and direction",
            ),
            ready,
            would_block,
            unused_rules,
            overlap,
        ],
    }
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
