//! What the NetworkPolicies in force say about a flow: per side, the policies that isolate the pod
//! and whether each allows the flow ([`super::compiled::evaluate`]).

use network_enforcer_api::Direction;

/// What one policy that isolates a pod says about a flow.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyDecision {
    pub namespace: String,
    pub name: String,
    /// Whether one of the policy's rules for this direction allows the flow.
    pub allows: bool,
}

/// The verdict of one side of a flow: egress at the source, or ingress at the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SideVerdict {
    /// Whether this side lets the flow through.
    pub allowed: bool,
    /// The policies that isolate the pod for this direction, sorted by name, each with whether it
    /// allows the flow. Empty when the side is not isolated (or is not a pod), so the flow is allowed.
    pub policies: Vec<PolicyDecision>,
}

impl SideVerdict {
    /// The verdict of a side no policy isolates.
    pub(crate) fn open() -> Self {
        SideVerdict {
            allowed: true,
            policies: Vec::new(),
        }
    }

    /// The verdict of a side the `policies` (sorted) isolate: allowed when one of them allows.
    pub(crate) fn of(policies: Vec<PolicyDecision>) -> Self {
        SideVerdict {
            allowed: policies.is_empty() || policies.iter().any(|p| p.allows),
            policies,
        }
    }

    /// The policies that allow the flow.
    pub fn allowing(&self) -> impl Iterator<Item = &PolicyDecision> {
        self.policies.iter().filter(|p| p.allows)
    }

    /// Whether policy `namespace/name` isolates this side.
    pub fn isolated_by(&self, namespace: &str, name: &str) -> bool {
        self.policies
            .iter()
            .any(|p| p.namespace == namespace && p.name == name)
    }
}

/// The verdict for a whole flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowVerdict {
    /// Egress at the source pod.
    pub egress: SideVerdict,
    /// Ingress at the destination pod.
    pub ingress: SideVerdict,
}

impl FlowVerdict {
    /// Whether the flow passes: both sides allow it.
    pub fn allowed(&self) -> bool {
        self.egress.allowed && self.ingress.allowed
    }

    /// The verdict of the side a policy of `direction` governs.
    pub fn side(&self, direction: Direction) -> &SideVerdict {
        match direction {
            Direction::Egress => &self.egress,
            Direction::Ingress => &self.ingress,
        }
    }
}
