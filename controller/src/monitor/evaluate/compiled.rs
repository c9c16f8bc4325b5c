//! NetworkPolicies compiled once, and indexed per pod, so that judging a flow does not go through
//! every policy of a namespace (docs/design.md, "Violations").
//!
//! - [`CompiledPolicy`]: a policy with its CIDRs and protocols parsed and its rules reduced to what
//!   matching needs. It borrows the policy's selectors, so compiling one is a handful of small
//!   allocations (a WorkloadNetworkPolicy's payload is compiled once per attribution pass).
//! - [`PolicyIndex`]: the view's NetworkPolicies compiled per namespace, and for every pod the ones
//!   that isolate it, per direction. The view builds it at the first evaluation after a change.
//! - [`verdict_as_if_rendered`]: what a policy evaluated "as if rendered" says about one side of a
//!   flow, through the index.
//!
//! The semantics are those of [`super::network_policy`], which stays the straightforward reference:
//! the tests check that both answer the same.

use super::EvalError;
use super::network_policy::has_policy_type;
use super::view::{ClusterView, Endpoint, Labels, PodInfo, PodRef, PolicyRef};
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::selector;
use network_enforcer_api::{Direction, Protocol};
use std::borrow::Cow;
use std::collections::HashMap;
use std::net::IpAddr;

/// A NetworkPolicy ready to match flows. Borrowed from its spec, or owned (`'static`) when the view
/// keeps it in its index.
#[derive(Clone, Debug)]
pub struct CompiledPolicy<'a> {
    pub namespace: Cow<'a, str>,
    pub name: Cow<'a, str>,
    /// `None` selects every pod of the namespace.
    pod_selector: Option<Cow<'a, LabelSelector>>,
    /// The ingress rules, or `None` when the policy does not have the `Ingress` type (after the API
    /// server's defaulting, see [`has_policy_type`]). `Some(vec![])` isolates and allows nothing.
    ingress: Option<Vec<Rule<'a>>>,
    /// The egress rules, likewise.
    egress: Option<Vec<Rule<'a>>>,
}

#[derive(Clone, Debug)]
struct Rule<'a> {
    /// `None`: every peer (the rule lists none).
    peers: Option<Vec<Peer<'a>>>,
    /// `None`: every port and protocol.
    ports: Option<Vec<Port<'a>>>,
}

#[derive(Clone, Debug)]
enum Peer<'a> {
    /// Content the API server would reject: matches nothing.
    Nothing,
    IpBlock {
        cidr: IpNet,
        except: Vec<IpNet>,
    },
    /// `namespace: None` means the policy's own namespace; `pod: None` every pod.
    Selectors {
        namespace: Option<Cow<'a, LabelSelector>>,
        pod: Option<Cow<'a, LabelSelector>>,
    },
}

#[derive(Clone, Debug)]
enum Port<'a> {
    /// Content the API server would reject: matches nothing.
    Nothing,
    /// Every port of a protocol.
    Any(Protocol),
    /// A port (`first == last`) or an `endPort` range.
    Range(Protocol, i32, i32),
    /// A named port, resolved on the destination pod.
    Named(Protocol, Cow<'a, str>),
}

impl<'a> CompiledPolicy<'a> {
    /// Compiles `policy`, borrowing its names and selectors.
    pub fn compile(policy: PolicyRef<'a>) -> Self {
        let spec = policy.spec;
        let ingress = has_policy_type(policy, Direction::Ingress).then(|| {
            spec.ingress
                .iter()
                .flatten()
                .map(|r| Rule::compile(r.from.as_deref(), r.ports.as_deref()))
                .collect()
        });
        let egress = has_policy_type(policy, Direction::Egress).then(|| {
            spec.egress
                .iter()
                .flatten()
                .map(|r| Rule::compile(r.to.as_deref(), r.ports.as_deref()))
                .collect()
        });
        CompiledPolicy {
            namespace: Cow::Borrowed(policy.namespace),
            name: Cow::Borrowed(policy.name),
            pod_selector: spec.pod_selector.as_ref().map(Cow::Borrowed),
            ingress,
            egress,
        }
    }

    /// The same policy owning all it refers to.
    pub fn into_owned(self) -> CompiledPolicy<'static> {
        let rules = |rules: Option<Vec<Rule<'a>>>| {
            rules.map(|rules| rules.into_iter().map(Rule::into_owned).collect())
        };
        CompiledPolicy {
            namespace: Cow::Owned(self.namespace.into_owned()),
            name: Cow::Owned(self.name.into_owned()),
            pod_selector: self.pod_selector.map(owned),
            ingress: rules(self.ingress),
            egress: rules(self.egress),
        }
    }

    fn rules(&self, direction: Direction) -> Option<&[Rule<'a>]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// Whether the policy's `podSelector` selects a pod with `labels` (of its namespace).
    fn selects(&self, labels: &Labels) -> bool {
        self.pod_selector
            .as_deref()
            .is_none_or(|s| selector::matches(s, labels))
    }

    /// Whether the policy isolates `pod` for `direction`.
    fn isolates(&self, direction: Direction, pod: IndexedPod<'_>) -> bool {
        self.rules(direction).is_some()
            && pod.pod.namespace == self.namespace
            && self.selects(pod.labels())
    }

    /// Whether one of the policy's rules for `direction` allows the flow to or from `peer`.
    fn allows(&self, direction: Direction, peer: Resolved<'_>, port: &PortQuery<'_>) -> bool {
        self.rules(direction).is_some_and(|rules| {
            rules
                .iter()
                .any(|rule| rule.ports_match(port) && rule.peers_match(&self.namespace, peer, port))
        })
    }
}

fn owned<T: ToOwned + ?Sized>(value: Cow<'_, T>) -> Cow<'static, T> {
    Cow::Owned(value.into_owned())
}

impl<'a> Rule<'a> {
    fn compile(
        peers: Option<&'a [NetworkPolicyPeer]>,
        ports: Option<&'a [NetworkPolicyPort]>,
    ) -> Self {
        Rule {
            peers: match peers {
                None | Some([]) => None,
                Some(peers) => Some(peers.iter().map(Peer::compile).collect()),
            },
            ports: match ports {
                None | Some([]) => None,
                Some(ports) => Some(ports.iter().map(Port::compile).collect()),
            },
        }
    }

    fn into_owned(self) -> Rule<'static> {
        Rule {
            peers: self
                .peers
                .map(|peers| peers.into_iter().map(Peer::into_owned).collect()),
            ports: self
                .ports
                .map(|ports| ports.into_iter().map(Port::into_owned).collect()),
        }
    }

    fn ports_match(&self, query: &PortQuery<'_>) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|p| p.matches(query)))
    }

    fn peers_match(
        &self,
        policy_namespace: &str,
        peer: Resolved<'_>,
        query: &PortQuery<'_>,
    ) -> bool {
        self.peers.as_ref().is_none_or(|peers| {
            peers
                .iter()
                .any(|p| p.matches(policy_namespace, peer, query.ip_blocks_match_pods))
        })
    }
}

impl<'a> Peer<'a> {
    fn compile(peer: &'a NetworkPolicyPeer) -> Self {
        match (&peer.ip_block, &peer.namespace_selector, &peer.pod_selector) {
            (Some(block), None, None) => compile_block(block).unwrap_or(Peer::Nothing),
            // The API server rejects an ipBlock combined with selectors, and a peer with nothing in it.
            (Some(_), _, _) | (None, None, None) => Peer::Nothing,
            (None, namespace, pod) => Peer::Selectors {
                namespace: namespace.as_ref().map(Cow::Borrowed),
                pod: pod.as_ref().map(Cow::Borrowed),
            },
        }
    }

    fn into_owned(self) -> Peer<'static> {
        match self {
            Peer::Nothing => Peer::Nothing,
            Peer::IpBlock { cidr, except } => Peer::IpBlock { cidr, except },
            Peer::Selectors { namespace, pod } => Peer::Selectors {
                namespace: namespace.map(owned),
                pod: pod.map(owned),
            },
        }
    }

    fn matches(
        &self,
        policy_namespace: &str,
        peer: Resolved<'_>,
        ip_blocks_match_pods: bool,
    ) -> bool {
        match self {
            Peer::Nothing => false,
            Peer::IpBlock { cidr, except } => {
                let contains =
                    |ip: &IpAddr| cidr.contains(ip) && !except.iter().any(|e| e.contains(ip));
                match peer {
                    Resolved::Ip(ip) => contains(&ip),
                    Resolved::Pod(pod) => {
                        ip_blocks_match_pods && pod.pod.info.ips.iter().any(contains)
                    }
                }
            }
            Peer::Selectors { namespace, pod } => {
                // Selectors select pods only, never bare addresses.
                let Resolved::Pod(peer) = peer else {
                    return false;
                };
                let namespace_ok = match namespace {
                    // A podSelector alone selects in the policy's own namespace.
                    None => peer.pod.namespace == policy_namespace,
                    Some(s) => selector::matches(s, peer.pod.namespace_labels),
                };
                namespace_ok
                    && pod
                        .as_deref()
                        .is_none_or(|s| selector::matches(s, peer.labels()))
            }
        }
    }
}

/// An ipBlock with its CIDRs parsed; `None` when one of them is malformed, which makes the block
/// match nothing (see [`super::network_policy::ip_block_matches`]).
fn compile_block(block: &IPBlock) -> Option<Peer<'static>> {
    let cidr = block.cidr.parse::<IpNet>().ok()?;
    let except = block
        .except
        .iter()
        .flatten()
        .map(|e| e.parse::<IpNet>().ok())
        .collect::<Option<Vec<_>>>()?;
    Some(Peer::IpBlock { cidr, except })
}

impl<'a> Port<'a> {
    fn compile(port: &'a NetworkPolicyPort) -> Self {
        let Some(protocol) = Protocol::from_kubernetes(port.protocol.as_deref()) else {
            return Port::Nothing;
        };
        match (&port.port, port.end_port) {
            (None, None) => Port::Any(protocol),
            (None, Some(_)) | (Some(IntOrString::String(_)), Some(_)) => Port::Nothing,
            (Some(IntOrString::Int(first)), None) => Port::Range(protocol, *first, *first),
            (Some(IntOrString::Int(first)), Some(last)) => Port::Range(protocol, *first, last),
            (Some(IntOrString::String(name)), None) => Port::Named(protocol, Cow::Borrowed(name)),
        }
    }

    fn into_owned(self) -> Port<'static> {
        match self {
            Port::Nothing => Port::Nothing,
            Port::Any(protocol) => Port::Any(protocol),
            Port::Range(protocol, first, last) => Port::Range(protocol, first, last),
            Port::Named(protocol, name) => Port::Named(protocol, owned(name)),
        }
    }

    fn matches(&self, query: &PortQuery<'_>) -> bool {
        match self {
            Port::Nothing => false,
            Port::Any(protocol) => *protocol == query.protocol,
            Port::Range(protocol, first, last) => {
                *protocol == query.protocol && (*first..=*last).contains(&i32::from(query.port))
            }
            // A named port is the destination pod's container port of that name and protocol; a
            // destination that is no pod has no named ports.
            Port::Named(protocol, name) => {
                *protocol == query.protocol
                    && query.destination.is_some_and(|pod| {
                        pod.ports.iter().any(|cp| {
                            cp.name.as_deref() == Some(name.as_ref())
                                && cp.protocol == *protocol
                                && cp.port == query.port
                        })
                    })
            }
        }
    }
}

/// The port part of a flow, with the pod named ports resolve on.
struct PortQuery<'a> {
    protocol: Protocol,
    port: u16,
    destination: Option<&'a PodInfo>,
    ip_blocks_match_pods: bool,
}

/// The view's NetworkPolicies compiled per namespace, and per pod the ones that isolate it.
///
/// Pods are grouped in classes: the pods of one namespace with the same labels (a workload's pods
/// typically differ only by name), which policies cannot tell apart. Isolation is computed once per
/// class, and selectors match a class's single copy of the labels, which stays in cache.
#[derive(Clone, Debug, Default)]
pub struct PolicyIndex {
    /// Per namespace slot: its NetworkPolicies, sorted by name.
    policies: Vec<Vec<CompiledPolicy<'static>>>,
    /// Per pod slot: its class (an empty slot has none).
    pod_class: Vec<Option<u32>>,
    classes: Vec<PodClass>,
}

/// Pods of one namespace with the same labels.
#[derive(Clone, Debug)]
pub struct PodClass {
    labels: Labels,
    /// The positions (in the namespace's `policies`) of the policies that isolate these pods.
    ingress: Vec<u32>,
    egress: Vec<u32>,
}

impl PodClass {
    fn isolation(&self, direction: Direction) -> &[u32] {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

impl PolicyIndex {
    /// Compiles the policies of `view` and matches every class of pods against those of its
    /// namespace.
    pub fn build(view: &ClusterView) -> Self {
        let mut policies = vec![Vec::new(); view.namespace_slot_count()];
        for (namespace, list) in view.policies_by_namespace() {
            // Policies of a namespace without pods isolate nothing.
            if let Some(slot) = view.namespace_slot(namespace) {
                policies[slot] = list
                    .iter()
                    .map(|p| CompiledPolicy::compile(p.into()).into_owned())
                    .collect();
            }
        }
        let mut pod_class = vec![None; view.pod_slot_count()];
        let mut classes = Vec::new();
        let mut class_of: HashMap<(usize, &Labels), u32> = HashMap::new();
        for pod in view.pod_refs() {
            let labels = &pod.info.labels;
            let class = *class_of
                .entry((pod.namespace_slot, labels))
                .or_insert_with(|| {
                    let mut class = PodClass {
                        labels: labels.clone(),
                        ingress: Vec::new(),
                        egress: Vec::new(),
                    };
                    for (position, policy) in (0u32..).zip(&policies[pod.namespace_slot]) {
                        if !policy.selects(labels) {
                            continue;
                        }
                        if policy.ingress.is_some() {
                            class.ingress.push(position);
                        }
                        if policy.egress.is_some() {
                            class.egress.push(position);
                        }
                    }
                    classes.push(class);
                    u32::try_from(classes.len() - 1).unwrap_or(u32::MAX)
                });
            pod_class[pod.slot] = Some(class);
        }
        PolicyIndex {
            policies,
            pod_class,
            classes,
        }
    }

    /// The class of the pod in `slot`.
    fn class(&self, slot: usize) -> Option<&PodClass> {
        let class = (*self.pod_class.get(slot)?)?;
        self.classes.get(class as usize)
    }

    /// The policies in force that isolate `pod` for `direction`.
    fn isolating<'s>(
        &'s self,
        pod: IndexedPod<'_>,
        direction: Direction,
    ) -> impl Iterator<Item = &'s CompiledPolicy<'static>> {
        let in_namespace = self.policies.get(pod.pod.namespace_slot);
        pod.class
            .isolation(direction)
            .iter()
            .filter_map(move |&position| in_namespace?.get(position as usize))
    }
}

/// A pod of the view with its class in the index.
#[derive(Clone, Copy, Debug)]
pub struct IndexedPod<'a> {
    pod: PodRef<'a>,
    class: &'a PodClass,
}

impl IndexedPod<'_> {
    /// The pod's labels: its class's copy.
    fn labels(&self) -> &Labels {
        &self.class.labels
    }
}

/// A flow endpoint looked up in the view.
#[derive(Clone, Copy, Debug)]
pub enum Resolved<'a> {
    Pod(IndexedPod<'a>),
    Ip(IpAddr),
}

impl<'a> Resolved<'a> {
    fn pod(self) -> Option<IndexedPod<'a>> {
        match self {
            Resolved::Pod(pod) => Some(pod),
            Resolved::Ip(_) => None,
        }
    }
}

/// Looks up both ends of a flow, the source first (an unknown pod is an error).
pub fn resolve<'v>(
    view: &'v ClusterView,
    source: &Endpoint,
    destination: &Endpoint,
) -> Result<(Resolved<'v>, Resolved<'v>), EvalError> {
    let index = view.policy_index();
    let one = |endpoint: &Endpoint| match endpoint {
        Endpoint::Pod(key) => view
            .pod_ref(key)
            .and_then(|pod| {
                let class = index.class(pod.slot)?;
                Some(Resolved::Pod(IndexedPod { pod, class }))
            })
            .ok_or_else(|| EvalError::UnknownPod(key.clone())),
        Endpoint::Ip(ip) => Ok(Resolved::Ip(*ip)),
    };
    Ok((one(source)?, one(destination)?))
}

/// What `rendered`, evaluated as if it were in force together with the view's NetworkPolicies
/// (replacing the one of the same name), says about the `direction` side of a flow between the
/// resolved `ends` (source, destination): `None` when it does not isolate that side, else whether
/// the side lets the flow through. The same answer as
/// [`super::network_policy::evaluate_as_if_rendered`], without going through every policy.
pub fn verdict_as_if_rendered(
    view: &ClusterView,
    rendered: &CompiledPolicy<'_>,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> Option<bool> {
    let (source, destination) = ends;
    let (subject, peer) = match direction {
        Direction::Egress => (source, destination),
        Direction::Ingress => (destination, source),
    };
    // A bare address is no pod: no NetworkPolicy isolates it.
    let subject = subject.pod()?;
    if !rendered.isolates(direction, subject) {
        return None;
    }
    let query = PortQuery {
        protocol,
        port,
        destination: destination.pod().map(|pod| pod.pod.info),
        ip_blocks_match_pods: view.ip_blocks_match_pods(),
    };
    // Allows add up: the rendered policy or any other policy isolating the pod.
    let allowed = rendered.allows(direction, peer, &query)
        || view
            .policy_index()
            .isolating(subject, direction)
            .filter(|p| p.name != rendered.name)
            .any(|p| p.allows(direction, peer, &query));
    Some(allowed)
}

/// The indexes of `rendered`'s rules for `direction` that allow the flow between the resolved `ends`,
/// in order; empty when `rendered` does not isolate that side or no rule of its own matches (other
/// policies in force may still allow the flow). For rule usage (docs/api.md, "Rule usage"): the
/// verdict path ([`verdict_as_if_rendered`]) stops at the first match.
pub fn matching_rules(
    view: &ClusterView,
    rendered: &CompiledPolicy<'_>,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> Vec<usize> {
    let (source, destination) = ends;
    let (subject, peer) = match direction {
        Direction::Egress => (source, destination),
        Direction::Ingress => (destination, source),
    };
    let Some(subject) = subject.pod() else {
        return Vec::new();
    };
    if !rendered.isolates(direction, subject) {
        return Vec::new();
    }
    let query = PortQuery {
        protocol,
        port,
        destination: destination.pod().map(|pod| pod.pod.info),
        ip_blocks_match_pods: view.ip_blocks_match_pods(),
    };
    rendered
        .rules(direction)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, rule)| {
            rule.ports_match(&query) && rule.peers_match(&rendered.namespace, peer, &query)
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests;
