//! Learning (docs/behaviour.md §1; why: docs/design.md, "Learning"): what an observed, allowed
//! connection adds to which proposal.
//!
//! `flows` turns an agent observation into workload-level flows using the [`Index`]; `edges` turns a
//! flow into proposal edges for the backend; `apply` merges an edge into a proposal spec. All pure.
//! Around them: the [`learner`] holds what was learned and not written yet, the [`flusher`] takes it
//! and has the [`proposal_writer`] write each proposal, signed ([`provenance`]: promotion takes only
//! what learning signed).

pub mod cluster_policies;
mod edges;
mod flows;
pub mod flush_report;
pub mod flusher;
pub mod learner;
mod merge;
mod proposal;
pub mod proposal_writer;
pub mod provenance;
mod wildcards;

/// What ingest hands learning: defined where records are read ([`crate::ingest::reported`]).
pub use crate::ingest::reported::{ReportedConnection, Reporter};
pub use edges::{edges, has_unselectable_side};
pub use flows::{flows, workload_flows};
pub use merge::{
    DEFAULT_MAX_PORTS_PER_RULE, DEFAULT_MAX_RULES, Limits, Merged, apply, merge, merge_within,
    peer_count,
};
pub use proposal::{new_proposal, peer_of};
pub use wildcards::DEFAULT_WILDCARD_MIN_NAMES;

use crate::cluster::index::{End, FlowEnd, Flows, Index, NoFlow, Opened, WorkloadEndpoint};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use network_enforcer_api::naming::proposal_name;
use network_enforcer_api::{
    Backend, Direction, IstioFrom, IstioOperation, IstioPolicy, IstioRule, IstioSource, IstioTo,
    NameRule, Protocol, TargetRef, WorkloadKind, WorkloadNetworkPolicyProposal,
    WorkloadNetworkPolicyProposalSpec,
};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// Whether `direction`'s proposal is the peer's (not the local pod's) for a connection `opened` so:
/// the source owns the egress proposal, the destination the ingress one.
pub fn is_peer_side(opened: Opened, direction: Direction) -> bool {
    matches!(
        (opened, direction),
        (Opened::Outbound, Direction::Ingress) | (Opened::Inbound, Direction::Egress)
    )
}

/// A connection between two endpoints on a destination (container) port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadFlow {
    pub source: FlowEnd,
    pub destination: FlowEnd,
    pub protocol: Protocol,
    pub port: u16,
    /// The name the source pod resolved an outside destination ([`FlowEnd::External`]) from; `None`
    /// for any other destination.
    pub peer_name: Option<Arc<str>>,
}

/// The proposal an edge goes to: one per (workload, direction).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub workload: Arc<WorkloadEndpoint>,
    /// The workload's kind ([`WorkloadKind::Pod`] for a bare pod).
    pub kind: WorkloadKind,
    pub direction: Direction,
}

impl Target {
    /// The proposal's name.
    pub fn name(&self) -> String {
        proposal_name(self.kind, &self.workload.name, self.direction)
    }
}

/// What one flow adds to one proposal: hashable and cheap to clone (the writer deduplicates the edges of
/// every record with it); the rule it stands for is built only when a proposal is written.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Edge {
    /// kubernetes backend: the peer, on the destination (container) port.
    Kubernetes {
        peer: FlowEnd,
        protocol: Protocol,
        port: u16,
    },
    /// istio backend: the source workload (its principal is the rule), on the destination port.
    Istio {
        source: Arc<WorkloadEndpoint>,
        port: u16,
    },
    /// kubernetes backend, egress: an outside service by the name the pod resolved it from
    /// (`spec.egressNames`), on the destination port.
    Name {
        name: Arc<str>,
        protocol: Protocol,
        port: u16,
    },
}

impl Edge {
    /// The external address (outside the cluster's pods and nodes) this edge adds, if any: the kind of
    /// peer whose fan-out is capped.
    pub fn external(&self) -> Option<IpAddr> {
        match self {
            Edge::Kubernetes {
                peer: FlowEnd::External(ip),
                ..
            } => Some(*ip),
            _ => None,
        }
    }

    /// (protocol, port) of the edge.
    pub fn port(&self) -> (Protocol, u16) {
        match self {
            Edge::Kubernetes { protocol, port, .. } | Edge::Name { protocol, port, .. } => {
                (*protocol, *port)
            }
            Edge::Istio { port, .. } => (Protocol::TCP, *port),
        }
    }
}

#[cfg(test)]
mod tests;
