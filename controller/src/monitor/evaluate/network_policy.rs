//! The reference evaluator, in tests only: whether the NetworkPolicies in force allow a flow, read
//! straight from the specs, one flow at a time. It is the oracle the production path (the policies
//! parsed by [`netpol`], indexed by [`super::compiled`]) is checked against: over the semantics
//! table, every flow of the fixture and random policies. The semantics it implements independently:
//!
//! - a pod is isolated for a direction only by the policies that select it (`podSelector`, in its own
//!   namespace) *and* have that policy type; `policyTypes` defaults to `Ingress`, plus `Egress` when the
//!   policy has egress rules;
//! - an isolated pod accepts a flow when any rule of any of those policies allows it (allows add up);
//!   a pod no policy isolates accepts everything;
//! - a rule allows a flow when one of its peers matches (an absent or empty list: every peer) and one
//!   of its ports matches (absent or empty: every port and protocol);
//! - a peer is `podSelector` (pods of the policy's namespace), `namespaceSelector` (every pod of those
//!   namespaces), both (ANDed), or an `ipBlock` with `except`;
//! - a port has a protocol (default TCP) and a number, a number range (`endPort`) or a name resolved on
//!   the destination pod's container ports (same name, protocol and number).
//!
//! Egress is decided at the source pod, ingress at the destination pod; a flow passes when both allow it.
//! Content the API server would reject (an empty peer, ipBlock mixed with selectors, `endPort` with a
//! named port or without a port, an unknown protocol, a malformed CIDR) matches nothing, so a malformed
//! rule can never widen what a policy allows.

use super::EvalError;
use super::verdict::{FlowVerdict, PolicyDecision, SideVerdict};
use super::view::{ClusterView, Endpoint, Flow, Labels, PodInfo, PolicyRef};
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use network_enforcer_api::selector;
use network_enforcer_api::{Direction, Protocol};
use std::borrow::Cow;
use std::net::IpAddr;

/// Evaluates `flow` against the NetworkPolicies in force in `view`.
pub fn evaluate(view: &ClusterView, flow: &Flow) -> Result<FlowVerdict, EvalError> {
    evaluate_with(view, None, flow)
}

/// Evaluates `flow` as if `rendered` were in force too: added to its namespace, replacing a policy of
/// the same name (a protect-mode WorkloadNetworkPolicy's own rendered NetworkPolicy). This is how a
/// WorkloadNetworkPolicy in monitor mode is evaluated: together with the NetworkPolicies already in
/// the namespace, which can allow what it does not.
pub fn evaluate_as_if_rendered(
    view: &ClusterView,
    rendered: PolicyRef<'_>,
    flow: &Flow,
) -> Result<FlowVerdict, EvalError> {
    evaluate_with(view, Some(rendered), flow)
}

fn evaluate_with(
    view: &ClusterView,
    overlay: Option<PolicyRef<'_>>,
    flow: &Flow,
) -> Result<FlowVerdict, EvalError> {
    Ok(FlowVerdict {
        egress: evaluate_side(view, overlay, Direction::Egress, flow)?,
        ingress: evaluate_side(view, overlay, Direction::Ingress, flow)?,
    })
}

/// The verdict of one side of `flow` only (egress at the source, or ingress at the destination),
/// with `overlay` evaluated as if rendered (see [`evaluate_as_if_rendered`]).
pub fn evaluate_side(
    view: &ClusterView,
    overlay: Option<PolicyRef<'_>>,
    direction: Direction,
    flow: &Flow,
) -> Result<SideVerdict, EvalError> {
    let source = resolve(view, &flow.source)?;
    let destination = resolve(view, &flow.destination)?;
    let port = PortQuery {
        protocol: flow.protocol,
        port: flow.port,
        destination: destination.pod(),
    };
    let (subject, peer) = match direction {
        Direction::Egress => (source, destination),
        Direction::Ingress => (destination, source),
    };
    Ok(match subject.pod() {
        Some(pod) => side(view, overlay, direction, pod, peer, &port),
        // A bare address is no pod: no NetworkPolicy isolates it.
        None => SideVerdict::open(),
    })
}

/// The indexes of the rules of `policy` for `direction` (`spec.egress` or `spec.ingress`) that allow
/// `flow`, in order; empty when none does. Whether the policy selects the side's pod is not checked:
/// callers ask about a policy a [`SideVerdict`] lists. This is for explanations (`check --explain`,
/// docs/operations.md); the verdict path ([`evaluate`]) stops at the first matching rule and collects
/// nothing, so it stays as fast as it was.
pub fn matching_rules(
    view: &ClusterView,
    policy: PolicyRef<'_>,
    direction: Direction,
    flow: &Flow,
) -> Result<Vec<usize>, EvalError> {
    let source = resolve(view, &flow.source)?;
    let destination = resolve(view, &flow.destination)?;
    let port = PortQuery {
        protocol: flow.protocol,
        port: flow.port,
        destination: destination.pod(),
    };
    let spec = policy.spec;
    let matching: Vec<usize> = match direction {
        Direction::Egress => spec
            .egress
            .iter()
            .flatten()
            .enumerate()
            .filter(|(_, rule)| {
                peers_match(view, policy, rule.to.as_deref(), destination)
                    && ports_match(rule.ports.as_deref(), &port)
            })
            .map(|(i, _)| i)
            .collect(),
        Direction::Ingress => spec
            .ingress
            .iter()
            .flatten()
            .enumerate()
            .filter(|(_, rule)| {
                peers_match(view, policy, rule.from.as_deref(), source)
                    && ports_match(rule.ports.as_deref(), &port)
            })
            .map(|(i, _)| i)
            .collect(),
    };
    Ok(matching)
}

/// A flow endpoint looked up in the view.
#[derive(Clone, Copy)]
enum Peer<'a> {
    Pod(&'a PodInfo),
    Ip(IpAddr),
}

impl<'a> Peer<'a> {
    fn pod(self) -> Option<&'a PodInfo> {
        match self {
            Peer::Pod(pod) => Some(pod),
            Peer::Ip(_) => None,
        }
    }
}

fn resolve<'a>(view: &'a ClusterView, endpoint: &Endpoint) -> Result<Peer<'a>, EvalError> {
    match endpoint {
        Endpoint::Pod(key) => view
            .pod(key)
            .map(Peer::Pod)
            .ok_or_else(|| EvalError::UnknownPod(key.clone())),
        Endpoint::Ip(ip) => Ok(Peer::Ip(*ip)),
    }
}

/// The port part of a flow, with the pod named ports resolve on.
struct PortQuery<'a> {
    protocol: Protocol,
    port: u16,
    destination: Option<&'a PodInfo>,
}

/// The verdict of `direction` at `subject` (the source for egress, the destination for ingress)
/// for a flow whose other end is `peer`.
fn side(
    view: &ClusterView,
    overlay: Option<PolicyRef<'_>>,
    direction: Direction,
    subject: &PodInfo,
    peer: Peer<'_>,
    port: &PortQuery<'_>,
) -> SideVerdict {
    let mut policies = Vec::new();
    for policy in policies_in(view, overlay, &subject.namespace) {
        let spec = policy.spec;
        let selects = spec
            .pod_selector
            .as_ref()
            .is_none_or(|s| selector::matches(s, &subject.labels));
        if !selects || !has_policy_type(policy, direction) {
            continue;
        }
        let allows = match direction {
            Direction::Egress => spec.egress.iter().flatten().any(|rule| {
                peers_match(view, policy, rule.to.as_deref(), peer)
                    && ports_match(rule.ports.as_deref(), port)
            }),
            Direction::Ingress => spec.ingress.iter().flatten().any(|rule| {
                peers_match(view, policy, rule.from.as_deref(), peer)
                    && ports_match(rule.ports.as_deref(), port)
            }),
        };
        policies.push(PolicyDecision {
            namespace: policy.namespace.to_string(),
            name: policy.name.to_string(),
            allows,
        });
    }
    policies.sort();
    SideVerdict::of(policies)
}

/// The policies in force in `namespace`, with `overlay` added (replacing the one of the same name).
fn policies_in<'a>(
    view: &'a ClusterView,
    overlay: Option<PolicyRef<'a>>,
    namespace: &'a str,
) -> impl Iterator<Item = PolicyRef<'a>> {
    let overlay = overlay.filter(|o| o.namespace == namespace);
    view.policies_in(namespace)
        .iter()
        .filter(move |p| overlay.is_none_or(|o| o.name != p.name))
        .map(PolicyRef::from)
        .chain(overlay)
}

/// The policy types in force, with the API server's defaulting: `Ingress` always, `Egress` when the
/// policy has at least one egress rule (an empty `egress: []` does not count).
pub fn has_policy_type(policy: PolicyRef<'_>, direction: Direction) -> bool {
    match policy.spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => types.iter().any(|t| t == direction.as_str()),
        _ => match direction {
            Direction::Ingress => true,
            Direction::Egress => policy.spec.egress.as_ref().is_some_and(|e| !e.is_empty()),
        },
    }
}

/// Whether `peer` is one of `peers` of a rule of `policy`; no peers at all means every peer.
fn peers_match(
    view: &ClusterView,
    policy: PolicyRef<'_>,
    peers: Option<&[NetworkPolicyPeer]>,
    peer: Peer<'_>,
) -> bool {
    match peers {
        None | Some([]) => true,
        Some(peers) => peers.iter().any(|p| peer_matches(view, policy, p, peer)),
    }
}

fn peer_matches(
    view: &ClusterView,
    policy: PolicyRef<'_>,
    rule_peer: &NetworkPolicyPeer,
    peer: Peer<'_>,
) -> bool {
    match (
        &rule_peer.ip_block,
        &rule_peer.namespace_selector,
        &rule_peer.pod_selector,
    ) {
        (Some(block), None, None) => match peer {
            Peer::Ip(ip) => ip_block_matches(block, ip),
            Peer::Pod(pod) => {
                view.ip_blocks_match_pods() && pod.ips.iter().any(|ip| ip_block_matches(block, *ip))
            }
        },
        // The API server rejects an ipBlock combined with selectors, and a peer with nothing in it.
        (Some(_), _, _) | (None, None, None) => false,
        (None, namespace_selector, pod_selector) => {
            // Selectors select pods only, never bare addresses.
            let Peer::Pod(pod) = peer else {
                return false;
            };
            let namespace_ok = match namespace_selector {
                // A podSelector alone selects in the policy's own namespace.
                None => pod.namespace == policy.namespace,
                Some(s) => selector::matches(s, &namespace_labels(view, &pod.namespace)),
            };
            namespace_ok
                && pod_selector
                    .as_ref()
                    .is_none_or(|s| selector::matches(s, &pod.labels))
        }
    }
}

/// The labels of namespace `name`; an unknown namespace still has its metadata.name label.
fn namespace_labels<'a>(view: &'a ClusterView, name: &str) -> Cow<'a, Labels> {
    match view.namespace_labels(name) {
        Some(labels) => Cow::Borrowed(labels),
        None => Cow::Owned(Labels::from([(
            NAMESPACE_NAME_LABEL.to_string(),
            name.to_string(),
        )])),
    }
}

/// Whether `ip` is inside `block.cidr` and outside every `block.except`. A CIDR of the other address
/// family never contains the address. A malformed CIDR (or except) makes the block match nothing.
pub fn ip_block_matches(block: &IPBlock, ip: IpAddr) -> bool {
    let Ok(cidr) = block.cidr.parse::<IpNet>() else {
        return false;
    };
    if !cidr.contains(&ip) {
        return false;
    }
    block.except.iter().flatten().all(|except| {
        except
            .parse::<IpNet>()
            .is_ok_and(|except| !except.contains(&ip))
    })
}

/// Whether the flow's port is one of `ports`; no ports at all means every port and protocol.
fn ports_match(ports: Option<&[NetworkPolicyPort]>, query: &PortQuery<'_>) -> bool {
    match ports {
        None | Some([]) => true,
        Some(ports) => ports.iter().any(|p| port_matches(p, query)),
    }
}

fn port_matches(rule: &NetworkPolicyPort, query: &PortQuery<'_>) -> bool {
    let Some(protocol) = Protocol::from_kubernetes(rule.protocol.as_deref()) else {
        return false;
    };
    if protocol != query.protocol {
        return false;
    }
    match (&rule.port, rule.end_port) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some(IntOrString::Int(port)), None) => i32::from(query.port) == *port,
        (Some(IntOrString::Int(port)), Some(end)) => (*port..=end).contains(&i32::from(query.port)),
        // A named port is the destination pod's container port of that name and protocol; a
        // destination that is no pod has no named ports.
        (Some(IntOrString::String(name)), None) => query.destination.is_some_and(|pod| {
            pod.ports.iter().any(|cp| {
                cp.name.as_deref() == Some(name.as_str())
                    && cp.protocol == protocol
                    && cp.port == query.port
            })
        }),
        (Some(IntOrString::String(_)), Some(_)) => false,
    }
}

#[cfg(test)]
pub(crate) mod tests;
