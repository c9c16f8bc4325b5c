//! Semantic policy evaluation (docs/behaviour.md §3.3, §3.4): does a policy allow a flow, and which
//! policy records a violation for it. Monitor mode must report exactly what protect mode would block,
//! so the evaluators implement the data plane's semantics; they never compare rule structure.
//!
//! - [`view`]: the plain-data cluster (namespaces, pods, NetworkPolicies in force) and the [`Flow`];
//! - [`compiled`]: the `networking.k8s.io/v1` NetworkPolicy semantics ([`netpol`], written once for
//!   the controller and the agent) over the view, with the policies parsed once and indexed per pod:
//!   egress at the source and ingress at the destination, also "as if" a WorkloadNetworkPolicy were
//!   rendered;
//! - [`verdict`]: what the policies in force say about a flow, per side;
//! - [`authorization_policy`]: the Istio AuthorizationPolicy evaluator for the subset we render;
//! - [`names`]: a WorkloadNetworkPolicy's `egressNames`, for outside addresses a pod resolved;
//! - [`attribution`]: the two steps (egress first, then ingress) deciding which
//!   WorkloadNetworkPolicy records which violation;
//! - [`cluster_monitor`]: which cluster proposal in monitor would deny a flow.
//!
//! Everything here is pure: no I/O, no clock (timestamps come in with the observations).

pub mod attribution;
pub mod authorization_policy;
pub mod cluster_monitor;
pub mod compiled;
pub mod names;
/// The reference evaluator the production path is checked against.
#[cfg(test)]
pub mod network_policy;
pub mod verdict;
pub mod view;

pub use compiled::evaluate;
pub use verdict::{FlowVerdict, PolicyDecision, SideVerdict};
pub use view::{
    ClusterView, ContainerPort, Endpoint, Flow, Labels, NamedPolicy, PodInfo, PodKey, PolicyRef,
};

/// Why a flow cannot be evaluated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EvalError {
    /// The flow names a pod the view does not have (deleted, or not yet seen).
    #[error("pod {0} is not in the cluster view")]
    UnknownPod(PodKey),
    /// A WorkloadNetworkPolicy has no payload for its backend (admission normally prevents this).
    #[error("policy {namespace}/{name} has no spec.{payload} payload for its backend")]
    MissingPayload {
        namespace: String,
        name: String,
        payload: &'static str,
    },
}
