//! The semantics of Kubernetes NetworkPolicy (`networking.k8s.io/v1`), written once for every part
//! of network-enforcer that needs them: the controller's evaluator (monitor, the protect gate, rule
//! usage, `check`) and the agent's enforcement compiler (nftables). Pure: no client, no clock.
//!
//! The rules, as the API defines them:
//! - a pod is isolated for a direction only by the policies of its namespace that select it
//!   (`podSelector`; empty selects every pod) *and* have that policy type; without `policyTypes`,
//!   `Ingress` always, `Egress` when the policy has at least one egress rule ([`policy_types`]);
//! - an isolated pod accepts what any rule of any policy isolating it allows (allows add up); a pod
//!   no policy isolates accepts everything;
//! - a rule allows a connection when one of its peers matches (no peers: every peer) and one of its
//!   ports matches (no ports: every port and protocol);
//! - a peer is `podSelector` (pods of the policy's namespace), `namespaceSelector` (every pod of
//!   those namespaces), both (ANDed), or an `ipBlock` minus its `except`s; selectors choose pods,
//!   never bare addresses;
//! - a port has a protocol (default TCP) and a number, a range up to `endPort`, or a name resolved
//!   on the destination pod's container ports (same name and protocol);
//! - egress is decided at the source pod, ingress at the destination pod.
//!
//! Host-network pods are no pods here: they share the node's address, so callers give them to the
//! semantics as addresses (never isolated, never chosen by a selector).
//!
//! Content the API server would reject (an empty peer, an ipBlock mixed with selectors, `endPort`
//! with a named port or without a port, an unknown protocol, a malformed CIDR, a port out of range)
//! parses to [`Invalid`] and matches nothing, so a malformed rule never widens what a policy allows.
//!
//! - [`Policy`]: a policy parsed once, with its [`Rule`]s; whom it isolates, what it allows;
//! - [`Peer`]: who a rule lets through, and whether a connection's other [`End`] is one of them;
//! - [`Port`]: which ports, and whether a connection's [`PortQuery`] is one of them;
//! - [`cluster`]: ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`), the Admin and
//!   Baseline tiers around NetworkPolicy, and how the tiers combine.

pub mod cluster;
mod peer;
mod policy;
mod port;

pub use peer::{Block, End, Peer, PodEnd};
pub use policy::{Policy, Query, Rule, policy_types};
pub use port::{NamedPorts, Port, PortQuery};

use std::collections::BTreeMap;

pub use network_enforcer_api::{Direction, Protocol};

/// Kubernetes labels of a pod or a namespace.
pub type Labels = BTreeMap<String, String>;

/// A part of a policy that allows nothing because the API server would reject it, or because it
/// cannot be read. Enforcers report these (the agent's warnings); evaluators treat them as matching
/// nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("a peer names no ipBlock, namespaceSelector or podSelector")]
    EmptyPeer,
    #[error("an ipBlock peer also has a selector")]
    BlockWithSelector,
    #[error("ipBlock.cidr {0:?} is not a CIDR")]
    Cidr(String),
    #[error("ipBlock.except {0:?} is not a CIDR")]
    Except(String),
    #[error("unknown protocol {0:?}")]
    Protocol(String),
    #[error("endPort {0} has no port number to start from")]
    EndPortWithoutPort(i32),
    #[error("endPort with the named port {0:?}")]
    EndPortWithName(String),
    #[error("port {first} to {last} is not a valid range")]
    Range { first: i32, last: i32 },
    #[error("unknown tier {0:?} (Admin or Baseline)")]
    Tier(String),
    #[error("the subject must set exactly one of namespaces and pods")]
    Subject,
    #[error("unknown action {0:?} (Accept, Deny or Pass)")]
    Action(String),
    #[error("a peer must set exactly one field this direction allows")]
    PeerFields,
    #[error("{0} peers are not supported yet")]
    Unsupported(&'static str),
    #[error(
        "a protocols entry must set exactly one of tcp, udp, sctp and destinationNamedPort, with a port"
    )]
    ProtocolFields,
}
