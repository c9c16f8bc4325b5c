//! NetworkPolicies parsed once ([`netpol::Policy`], the one definition of their semantics) and
//! indexed per pod, so that judging a flow does not go through every policy of a namespace
//! (docs/design.md, "Violations").
//!
//! - [`PolicyIndex`]: the view's NetworkPolicies parsed per namespace, and for every pod the ones
//!   that isolate it, per direction. The view builds it at the first evaluation after a change.
//! - [`evaluate`]: the verdict of both sides of a flow with the policies in force (`check`);
//! - [`verdict_as_if_rendered`]: what a policy evaluated "as if rendered" says about one side of a
//!   flow, through the index (monitor and the protect gate);
//! - [`matching_rules`]: which rules of a policy allow a flow (rule usage, `check --explain`).
//!
//! The tests check every answer against the straightforward per-flow reference evaluator
//! (`network_policy`, in tests only) over the whole semantics table and random clusters.

use super::EvalError;
use super::verdict::{ClusterStep, FlowVerdict, PolicyDecision, SideVerdict};
use super::view::{ClusterView, Endpoint, Flow, Labels, PodRef, PolicyRef};
use netpol::cluster::{Action, ClusterPolicy, Tier, combine, first_match};
use netpol::{End, NamedPorts, PodEnd, Policy, PortQuery, Query};
use network_enforcer_api::{Direction, Protocol};
use std::collections::HashMap;
use std::net::IpAddr;

/// The view's NetworkPolicies compiled per namespace, and per pod the ones that isolate it.
///
/// Pods are grouped in classes: the pods of one namespace with the same labels (a workload's pods
/// typically differ only by name), which policies cannot tell apart. Isolation is computed once per
/// class, and selectors match a class's single copy of the labels, which stays in cache.
#[derive(Clone, Debug, Default)]
pub struct PolicyIndex {
    /// Per namespace slot: its NetworkPolicies, sorted by name.
    policies: Vec<Vec<Policy<'static>>>,
    /// The ClusterNetworkPolicies, by tier (Admin first) and precedence; those that apply to
    /// nothing (an unknown tier, a malformed subject) are left out.
    cluster: Vec<ClusterPolicy<'static>>,
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
    /// The positions (in `cluster`) of the ClusterNetworkPolicies whose subject selects these pods,
    /// in the index's order.
    cluster: Vec<u32>,
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
                    .map(|p| PolicyRef::from(p).parse().into_owned())
                    .collect();
            }
        }
        let mut cluster: Vec<ClusterPolicy<'static>> = view
            .cluster_policies()
            .iter()
            .filter_map(|p| match ClusterPolicy::parse(&p.name, &p.spec) {
                Ok(parsed) => Some(parsed.into_owned()),
                Err(why) => {
                    tracing::debug!(policy = %p.name, %why, "ClusterNetworkPolicy applies to nothing");
                    None
                }
            })
            .collect();
        cluster.sort_by(|a, b| (a.tier, a.precedence()).cmp(&(b.tier, b.precedence())));
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
                        cluster: (0u32..)
                            .zip(&cluster)
                            .filter(|(_, p)| p.selects(pod.namespace_labels, labels))
                            .map(|(position, _)| position)
                            .collect(),
                    };
                    for (position, policy) in (0u32..).zip(&policies[pod.namespace_slot]) {
                        if !policy.selects(labels) {
                            continue;
                        }
                        if policy.rules(Direction::Ingress).is_some() {
                            class.ingress.push(position);
                        }
                        if policy.rules(Direction::Egress).is_some() {
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
            cluster,
            pod_class,
            classes,
        }
    }

    /// The ClusterNetworkPolicies of `tier` whose subject selects `pod`, by precedence.
    fn cluster_tier<'s>(
        &'s self,
        pod: IndexedPod<'_>,
        tier: Tier,
    ) -> impl Iterator<Item = &'s ClusterPolicy<'static>> {
        pod.class
            .cluster
            .iter()
            .filter_map(|&position| self.cluster.get(position as usize))
            .filter(move |p| p.tier == tier)
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
    ) -> impl Iterator<Item = &'s Policy<'static>> {
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

    /// The endpoint as the other end of a connection.
    fn end(self) -> End<'a> {
        match self {
            Resolved::Pod(pod) => End::Pod(PodEnd {
                namespace: pod.pod.namespace,
                namespace_labels: pod.pod.namespace_labels,
                labels: &pod.class.labels,
                ips: &pod.pod.info.ips,
            }),
            Resolved::Ip(ip) => End::Address(ip),
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

/// The `direction` side of a flow between the resolved `ends` (source, destination): the pod whose
/// policies decide it, if that end is a pod (a bare address is no pod: no NetworkPolicy isolates
/// it), and the connection as that pod sees it.
fn side<'a>(
    view: &ClusterView,
    direction: Direction,
    ends: (Resolved<'a>, Resolved<'a>),
    protocol: Protocol,
    port: u16,
) -> Option<(IndexedPod<'a>, Query<'a>)> {
    let (source, destination) = ends;
    let (subject, peer) = match direction {
        Direction::Egress => (source, destination),
        Direction::Ingress => (destination, source),
    };
    let query = Query {
        peer: peer.end(),
        port: PortQuery {
            protocol,
            port,
            destination: destination.pod().map(|pod| pod.pod.info as &dyn NamedPorts),
        },
        ip_blocks_match_pods: view.ip_blocks_match_pods(),
    };
    Some((subject.pod()?, query))
}

/// [`side`], when `policy` isolates its pod.
fn isolated_side<'a>(
    view: &ClusterView,
    policy: &Policy<'_>,
    direction: Direction,
    ends: (Resolved<'a>, Resolved<'a>),
    (protocol, port): (Protocol, u16),
) -> Option<(IndexedPod<'a>, Query<'a>)> {
    let (subject, query) = side(view, direction, ends, protocol, port)?;
    policy
        .isolates(direction, subject.pod.namespace, subject.labels())
        .then_some((subject, query))
}

/// The verdict of both sides of `flow` with the policies in force in `view`: egress at the source
/// pod, ingress at the destination pod, each through the tiers (Admin ClusterNetworkPolicies, then
/// NetworkPolicies, then Baseline ones; [`netpol::cluster`]).
pub fn evaluate(view: &ClusterView, flow: &Flow) -> Result<FlowVerdict, EvalError> {
    let ends = resolve(view, &flow.source, &flow.destination)?;
    let index = view.policy_index();
    let verdict = |direction| match side(view, direction, ends, flow.protocol, flow.port) {
        None => SideVerdict::open(),
        Some((subject, query)) => {
            let mut policies: Vec<PolicyDecision> = index
                .isolating(subject, direction)
                .map(|p| PolicyDecision {
                    namespace: p.namespace.to_string(),
                    name: p.name.to_string(),
                    allows: p.allows(direction, &query),
                })
                .collect();
            policies.sort();
            let network_policy = (!policies.is_empty()).then(|| policies.iter().any(|p| p.allows));
            let admin = first_match(index.cluster_tier(subject, Tier::Admin), direction, &query);
            // The Baseline tier is reached only when nothing before it decided.
            let reached = !matches!(admin.map(|m| m.action), Some(Action::Accept | Action::Deny))
                && network_policy.is_none();
            let baseline = reached
                .then(|| {
                    first_match(
                        index.cluster_tier(subject, Tier::Baseline),
                        direction,
                        &query,
                    )
                })
                .flatten();
            let (allowed, decider) = combine(
                admin.map(|m| m.action),
                network_policy,
                baseline.map(|m| m.action),
            );
            SideVerdict {
                allowed,
                policies,
                decider,
                cluster: admin
                    .into_iter()
                    .chain(baseline)
                    .map(ClusterStep::from)
                    .collect(),
            }
        }
    };
    Ok(FlowVerdict {
        egress: verdict(Direction::Egress),
        ingress: verdict(Direction::Ingress),
    })
}

/// What `rendered`, evaluated as if it were in force together with the view's NetworkPolicies
/// (replacing the one of the same name), says about the `direction` side of a flow between the
/// resolved `ends` (source, destination): `None` when it does not isolate that side, or when the
/// Admin tier denies the flow whatever the policy says (it is not the policy that blocks it), else
/// whether the side lets the flow through. The Admin tier's Accept lets it through; its Pass, or
/// no Admin rule matching, leaves the decision to the NetworkPolicies, which are final for an isolated
/// pod, so the Baseline tier never matters here.
pub fn verdict_as_if_rendered(
    view: &ClusterView,
    rendered: &Policy<'_>,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> Option<bool> {
    let (subject, query) = isolated_side(view, rendered, direction, ends, (protocol, port))?;
    let index = view.policy_index();
    match first_match(index.cluster_tier(subject, Tier::Admin), direction, &query) {
        Some(m) if m.action == Action::Accept => return Some(true),
        Some(m) if m.action == Action::Deny => return None,
        _ => {}
    }
    // Allows add up: the rendered policy or any other policy isolating the pod.
    let allowed = rendered.allows(direction, &query)
        || index
            .isolating(subject, direction)
            .filter(|p| p.name != rendered.name)
            .any(|p| p.allows(direction, &query));
    Some(allowed)
}

/// Whether the Admin tier denies the `direction` side of a flow between the resolved `ends`, whatever
/// any NetworkPolicy says: such a flow is stopped there by the cluster, so no policy further on
/// (the destination's ingress, after an egress denial) is what blocks it.
pub fn admin_denies(
    view: &ClusterView,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> bool {
    admin_action(view, direction, ends, protocol, port) == Some(Action::Deny)
}

/// Whether the Admin tier accepts or denies the `direction` side of a flow between the resolved
/// `ends`: the NetworkPolicy tier is then never reached, so no NetworkPolicy rule (nor a name a
/// policy allows) is what decided it.
pub fn admin_decides(
    view: &ClusterView,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> bool {
    matches!(
        admin_action(view, direction, ends, protocol, port),
        Some(Action::Accept | Action::Deny)
    )
}

/// The action of the first Admin rule matching the `direction` side of a flow between `ends`.
fn admin_action(
    view: &ClusterView,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> Option<Action> {
    // On the path of every allowed side: free without ClusterNetworkPolicies.
    if view.cluster_policies().is_empty() {
        return None;
    }
    let (subject, query) = side(view, direction, ends, protocol, port)?;
    first_match(
        view.policy_index().cluster_tier(subject, Tier::Admin),
        direction,
        &query,
    )
    .map(|m| m.action)
}

/// The indexes of `policy`'s rules for `direction` that allow the flow between the resolved `ends`,
/// in order; empty when `policy` does not isolate that side, when the Admin tier decides that side
/// (an Admin Accept or Deny: no NetworkPolicy rule is what let the flow through), or when no rule of
/// its own matches (other policies in force may still allow the flow). For rule usage (docs/api.md,
/// "Rule usage") and explanations: the verdict paths stop at the first match.
pub fn matching_rules(
    view: &ClusterView,
    policy: &Policy<'_>,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> Vec<usize> {
    if admin_decides(view, direction, ends, protocol, port) {
        return Vec::new();
    }
    match isolated_side(view, policy, direction, ends, (protocol, port)) {
        Some((_, query)) => policy.matching_rules(direction, &query).collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
