//! What the policies in force say about a flow ([`super::compiled::evaluate`]): per side, the
//! NetworkPolicies that isolate the pod and whether each allows the flow, the ClusterNetworkPolicy
//! rules that matched, and which tier decided.

use netpol::cluster::{Action, Decider, Match, Tier};
use network_enforcer_api::Direction;

/// A ClusterNetworkPolicy rule that matched one side of a flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStep {
    pub tier: Tier,
    pub policy: String,
    /// The rule's index in the policy's rules of the direction, and its name if it has one.
    pub rule: usize,
    pub rule_name: Option<String>,
    pub action: Action,
}

impl From<Match<'_, '_>> for ClusterStep {
    fn from(m: Match<'_, '_>) -> Self {
        ClusterStep {
            tier: m.policy.tier,
            policy: m.policy.name.to_string(),
            rule: m.rule,
            rule_name: m.rule_name.map(str::to_string),
            action: m.action,
        }
    }
}

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
    /// The NetworkPolicies that isolate the pod for this direction, sorted by name, each with
    /// whether it allows the flow. Empty when the side is not isolated (or is not a pod).
    pub policies: Vec<PolicyDecision>,
    /// The tier whose answer stood.
    pub decider: Decider,
    /// The ClusterNetworkPolicy rules that matched, in the order the tiers were consulted (the
    /// Admin tier's, then the Baseline tier's when it was reached).
    pub cluster: Vec<ClusterStep>,
}

impl SideVerdict {
    /// The verdict of a side no policy isolates.
    pub(crate) fn open() -> Self {
        SideVerdict {
            allowed: true,
            policies: Vec::new(),
            decider: Decider::Default,
            cluster: Vec::new(),
        }
    }

    /// The verdict of a side the `policies` (sorted) isolate, without cluster policies: allowed
    /// when one of them allows (the reference evaluator's answer).
    #[cfg(test)]
    pub(crate) fn of(policies: Vec<PolicyDecision>) -> Self {
        SideVerdict {
            allowed: policies.is_empty() || policies.iter().any(|p| p.allows),
            decider: if policies.is_empty() {
                Decider::Default
            } else {
                Decider::NetworkPolicy
            },
            policies,
            cluster: Vec::new(),
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

    /// The NetworkPolicies that decided this side: those that let it through, or, denied, every
    /// one that isolates the pod; none when a cluster tier decided.
    pub fn deciding_policies(&self) -> impl Iterator<Item = &PolicyDecision> {
        let by_network_policies = self.decider.tier().is_none();
        self.policies
            .iter()
            .filter(move |p| by_network_policies && (!self.allowed || p.allows))
    }

    /// Which tier decided this side and by which policies, as the web view shows it.
    pub fn decision(&self) -> SideDecision {
        let by = match self.decider.tier() {
            // The cluster policy whose rule's Accept or Deny stood (a Pass decides nothing).
            Some(tier) => self
                .cluster
                .iter()
                .filter(|step| step.tier == tier && step.action != Action::Pass)
                .map(|step| step.policy.clone())
                .take(1)
                .collect(),
            None => self
                .deciding_policies()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect(),
        };
        SideDecision {
            tier: self.decider,
            allowed: self.allowed,
            by,
        }
    }
}

/// Which tier decided one side of a flow, and by which policies: what the web view's graph and
/// edges show per observed edge (docs/ui.md, "Graph").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SideDecision {
    /// `admin`, `networkPolicy`, `baseline`, or `default` (no tier: allowed).
    #[serde(with = "DeciderName")]
    pub tier: Decider,
    pub allowed: bool,
    /// The ClusterNetworkPolicy whose rule decided (admin, baseline); the NetworkPolicies that
    /// allow the flow, or, when it is denied, those that isolate the pod (`namespace/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
}

/// A tier by its name on the wire (`admin`, ...), ordered as the tiers are consulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct TierName(#[serde(with = "DeciderName")] pub Decider);

/// [`Decider`]'s names on the wire (the pure crate has no serde).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(remote = "Decider", rename_all = "camelCase")]
enum DeciderName {
    Admin,
    NetworkPolicy,
    Baseline,
    Default,
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
