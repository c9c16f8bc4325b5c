//! Which WorkloadNetworkPolicy records a violation for an observed flow S→D:P/T:
//!
//! 1. if S's workload has an egress policy that denies the flow, it records a violation (action = its
//!    mode). If that mode is `protect` the packet never leaves S, so D's ingress policy records nothing;
//! 2. otherwise, if D's workload has an ingress policy that denies the flow, it records one too.
//!
//! Policies are found by `targetRef` + `direction` in the workload's namespace, never by comparing
//! selectors (the reference's way, which breaks when both directions of one workload are promoted).
//! When several policies claim the same target and direction, the one [`crate::policy::uniqueness`] elects
//! (valid before invalid, then the oldest) is the one in force; the others render nothing and record
//! nothing.
//!
//! "Denies" is semantic: the policy's payload is evaluated as if rendered (see [`policy_verdict`]),
//! together with the NetworkPolicies already in force, so a hand-written NetworkPolicy that allows the
//! flow means no violation — exactly what protect mode would do.

use super::EvalError;
use super::authorization_policy::{self, AuthzVerdict, Connection};
use super::compiled::{self, Resolved};
use super::names;
use super::view::{ClusterView, Endpoint, Flow, PodKey, PolicyRef};
use crate::FastMap;
use crate::monitor::violations::Observation;
use crate::policy::uniqueness;
use crate::policy::validity::Backends;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use network_enforcer_api::{
    Backend, Direction, PolicyMode, Protocol, ViolationRecord, WorkloadKind, WorkloadNetworkPolicy,
    WorkloadRef,
};
use std::net::IpAddr;
use std::sync::Arc;

/// One side of an observed flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowSide {
    /// Where the evaluators find this side: a pod of the view, or a bare address.
    pub endpoint: Endpoint,
    /// The side as violation records name it. `namespace`, `owner_kind` and `owner_name` find the
    /// policies targeting it; `identity` is the Istio principal; `address` names peers that are not
    /// workloads. Shared: the evidence pass names each workload once ([`WorkloadNames`]).
    ///
    /// [`WorkloadNames`]: crate::monitor::violations::evidence::WorkloadNames
    pub workload: Arc<WorkloadRef>,
}

/// A flow as observed by a flow source, resolved to pods and workloads.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedFlow {
    pub source: FlowSide,
    pub destination: FlowSide,
    pub protocol: Protocol,
    /// The destination container port.
    pub port: u16,
    /// When the flow was seen; the violation record's timestamp.
    pub seen_at: Time,
    /// The name the source pod resolved an outside destination address from, when the agent saw
    /// the DNS answer (`spec.egressNames` may allow it).
    pub peer_name: Option<Arc<str>>,
}

impl ObservedFlow {
    /// The flow the evaluators see.
    pub fn flow(&self) -> Flow {
        Flow {
            source: self.source.endpoint.clone(),
            destination: self.destination.endpoint.clone(),
            protocol: self.protocol,
            port: self.port,
        }
    }
}

/// What a policy says about a flow in its direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyVerdict {
    /// The policy does not govern this side of the flow (it does not select the pod, the side is no
    /// pod, or the backend does not see this protocol).
    NotApplicable,
    /// The flow passes the policy's side, possibly thanks to other NetworkPolicies in force.
    Allows,
    /// The policy isolates the pod and nothing in force allows the flow: a violation.
    Denies,
}

/// A policy's name and namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    pub namespace: String,
    pub name: String,
}

/// The object whose status records a violation: a WorkloadNetworkPolicy, or a cluster proposal in
/// monitor (no namespace, [`super::cluster_monitor`]), with what its records say of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorder<'a> {
    /// Empty for a cluster-scoped object.
    pub namespace: &'a str,
    pub name: &'a str,
    pub mode: PolicyMode,
    /// The side of the flow it denies.
    pub direction: Direction,
}

impl<'a> Recorder<'a> {
    /// A WorkloadNetworkPolicy as the recorder of its violations.
    pub fn policy(policy: &'a WorkloadNetworkPolicy) -> Self {
        let metadata = &policy.metadata;
        Recorder {
            namespace: metadata.namespace.as_deref().unwrap_or_default(),
            name: metadata.name.as_deref().unwrap_or_default(),
            mode: policy.spec.mode,
            direction: policy.spec.direction,
        }
    }
}

/// A violation [`attribute`] found: the object that records it, and the flow. Borrowed: the
/// observation the status records is built only when asked for ([`Attributed::observation`]), so
/// that a repeat the status sync drops costs no copy.
#[derive(Clone, Copy, Debug)]
pub struct Attributed<'a> {
    pub by: Recorder<'a>,
    pub flow: &'a ObservedFlow,
}

impl<'a> Attributed<'a> {
    /// The recorder's name and namespace (empty for a cluster-scoped one).
    pub fn key(&self) -> PolicyKey {
        PolicyKey {
            namespace: self.by.namespace.to_string(),
            name: self.by.name.to_string(),
        }
    }

    /// What the violation records: the recorder's mode.
    pub fn action(&self) -> PolicyMode {
        self.by.mode
    }

    /// What the repeat window compares ([`RepeatKey`]), the same as the observation's.
    pub fn repeat_key(&self) -> RepeatKey<'a> {
        RepeatKey {
            source: &self.flow.source.workload,
            dest: &self.flow.destination.workload,
            protocol: self.flow.protocol,
            dst_port: Some(i32::from(self.flow.port)),
            action: self.by.mode,
            policy: (self.by.namespace, self.by.name),
            direction: self.by.direction,
        }
    }

    /// The observation the recorder's status records.
    pub fn observation(&self) -> Observation {
        let flow = self.flow;
        Observation {
            timestamp: flow.seen_at.clone(),
            source: WorkloadRef::clone(&flow.source.workload),
            dest: WorkloadRef::clone(&flow.destination.workload),
            protocol: flow.protocol,
            dst_port: Some(i32::from(flow.port)),
            action: self.by.mode,
            direction: self.by.direction,
            denying_policy_namespace: self.by.namespace.to_string(),
            denying_policy_name: self.by.name.to_string(),
        }
    }
}

/// The WorkloadNetworkPolicies in force, indexed by namespace and target name so that a lookup per
/// flow allocates nothing, each with its `spec.kubernetes` payload compiled once.
#[derive(Clone, Debug, Default)]
pub struct PolicySet<'a> {
    /// namespace → target workload name → the policies of that name's kinds and directions. The
    /// keys are the policies' own strings, which the evaluation reads next.
    by_target: FastMap<&'a str, FastMap<&'a str, Vec<Governing<'a>>>>,
    len: usize,
}

/// A policy in force, with its kubernetes payload compiled (`None` for istio, or without payload).
#[derive(Clone, Debug)]
struct Governing<'a> {
    policy: &'a WorkloadNetworkPolicy,
    /// The policy's target kind and direction, copied here so that finding it reads no more memory.
    kind: WorkloadKind,
    direction: Direction,
    rendered: Option<netpol::Policy<'a>>,
}

impl<'a> Governing<'a> {
    fn new(policy: &'a WorkloadNetworkPolicy) -> Self {
        let rendered = match policy.spec.backend {
            Backend::Kubernetes => policy.spec.kubernetes.as_ref().map(|spec| {
                PolicyRef {
                    namespace: policy.metadata.namespace.as_deref().unwrap_or_default(),
                    name: policy.metadata.name.as_deref().unwrap_or_default(),
                    spec,
                }
                .parse()
            }),
            Backend::Istio => None,
        };
        Governing {
            policy,
            kind: policy.spec.target_ref.kind,
            direction: policy.spec.direction,
            rendered,
        }
    }

    /// [`policy_verdict`] with the compiled payload; `ends` caches the flow's endpoints, which
    /// both sides of a flow look up.
    fn verdict<'v>(
        &self,
        view: &'v ClusterView,
        flow: FlowRef<'_>,
        source_principal: Option<&str>,
        ends: &mut Option<(Resolved<'v>, Resolved<'v>)>,
    ) -> Result<PolicyVerdict, EvalError> {
        match self.policy.spec.backend {
            Backend::Kubernetes => {
                let rendered = self
                    .rendered
                    .as_ref()
                    .ok_or_else(|| missing_payload(self.policy, "kubernetes"))?;
                let resolved = match *ends {
                    Some(resolved) => resolved,
                    None => *ends.insert(compiled::resolve(view, flow.source, flow.destination)?),
                };
                let verdict = kubernetes_verdict(
                    view,
                    rendered,
                    self.direction,
                    resolved,
                    flow.protocol,
                    flow.port,
                );
                // The names add to what the payload allows: an address (no pod's) the pod resolved
                // from a name a rule lists, on its ports.
                let by_name = verdict == PolicyVerdict::Denies
                    && self.direction == Direction::Egress
                    && matches!(flow.destination, Endpoint::Ip(_))
                    && flow.peer_name.is_some_and(|name| {
                        names::allows(
                            &self.policy.spec.egress_names,
                            name,
                            flow.protocol,
                            flow.port,
                        )
                    });
                Ok(if by_name {
                    PolicyVerdict::Allows
                } else {
                    verdict
                })
            }
            Backend::Istio => istio_verdict(
                view,
                self.policy,
                flow.destination,
                flow.protocol,
                flow.port,
                source_principal,
            ),
        }
    }
}

/// A flow's endpoints, protocol and port, borrowed from an [`ObservedFlow`] or a [`Flow`].
#[derive(Clone, Copy, Debug)]
struct FlowRef<'f> {
    source: &'f Endpoint,
    destination: &'f Endpoint,
    protocol: Protocol,
    port: u16,
    peer_name: Option<&'f str>,
}

impl<'f> From<&'f ObservedFlow> for FlowRef<'f> {
    fn from(flow: &'f ObservedFlow) -> Self {
        FlowRef {
            source: &flow.source.endpoint,
            destination: &flow.destination.endpoint,
            protocol: flow.protocol,
            port: flow.port,
            peer_name: flow.peer_name.as_deref(),
        }
    }
}

impl<'f> From<&'f Flow> for FlowRef<'f> {
    fn from(flow: &'f Flow) -> Self {
        FlowRef {
            source: &flow.source,
            destination: &flow.destination,
            protocol: flow.protocol,
            port: flow.port,
            peer_name: None,
        }
    }
}

impl Governing<'_> {
    /// The indexes of the policy's own rules that allow `flow` on its side (after
    /// [`Governing::verdict`] said `Allows`, so `ends` is resolved for the kubernetes backend).
    fn matching_rules(
        &self,
        view: &ClusterView,
        flow: &ObservedFlow,
        source_principal: Option<&str>,
        ends: &Option<(Resolved<'_>, Resolved<'_>)>,
    ) -> Vec<usize> {
        match (self.policy.spec.backend, &self.rendered, ends) {
            // The Admin tier decided this side: no rule of the policy did (nor a name it lists).
            (Backend::Kubernetes, Some(_), Some(ends))
                if compiled::admin_decides(
                    view,
                    self.direction,
                    *ends,
                    flow.protocol,
                    flow.port,
                ) =>
            {
                Vec::new()
            }
            (Backend::Kubernetes, Some(rendered), Some(ends)) => {
                let mut rules = compiled::matching_rules(
                    view,
                    rendered,
                    self.direction,
                    *ends,
                    flow.protocol,
                    flow.port,
                );
                // `egressNames` entries follow the direction's own rules ([`rule_usage::rules_of`]).
                if let (Direction::Egress, Endpoint::Ip(_), Some(name)) = (
                    self.direction,
                    &flow.destination.endpoint,
                    flow.peer_name.as_deref(),
                ) {
                    let own = self
                        .policy
                        .spec
                        .kubernetes
                        .as_ref()
                        .and_then(|k| k.egress.as_ref())
                        .map_or(0, Vec::len);
                    rules.extend(
                        names::matching(
                            &self.policy.spec.egress_names,
                            name,
                            flow.protocol,
                            flow.port,
                        )
                        .map(|i| own + i),
                    );
                }
                rules
            }
            (Backend::Kubernetes, _, _) => Vec::new(),
            (Backend::Istio, _, _) => {
                let (Some(istio), Endpoint::Pod(key)) =
                    (self.policy.spec.istio.as_ref(), &flow.destination.endpoint)
                else {
                    return Vec::new();
                };
                let Some(pod) = view.pod(key) else {
                    return Vec::new();
                };
                authorization_policy::matching_rules(
                    istio,
                    &Connection {
                        destination_labels: &pod.labels,
                        source_principal,
                        protocol: flow.protocol,
                        port: flow.port,
                    },
                )
            }
        }
    }
}

impl<'a> PolicySet<'a> {
    /// Indexes `policies`, keeping per target and direction the winner [`uniqueness::winner_over`]
    /// elects, validity judged by the CRDs' rules alone (nothing remembered of earlier backends).
    pub fn new(policies: impl IntoIterator<Item = &'a WorkloadNetworkPolicy>) -> Self {
        let nothing_remembered = Backends::default();
        Self::judged(policies, |p| nothing_remembered.is_valid(p))
    }

    /// Indexes `policies`, keeping per target and direction the winner [`uniqueness::winner_over`]
    /// elects with `valid` (as the policy reconciler judges it), and skipping policies being deleted.
    pub fn judged(
        policies: impl IntoIterator<Item = &'a WorkloadNetworkPolicy>,
        valid: impl Fn(&WorkloadNetworkPolicy) -> bool,
    ) -> Self {
        let mut set = PolicySet::default();
        for policy in policies {
            if policy.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let same_target = set
                .by_target
                .entry(policy.metadata.namespace.as_deref().unwrap_or_default())
                .or_default()
                .entry(policy.spec.target_ref.name.as_str())
                .or_default();
            let rival = same_target.iter_mut().find(|g| {
                g.kind == policy.spec.target_ref.kind && g.direction == policy.spec.direction
            });
            match rival {
                Some(current) => {
                    if uniqueness::winner_over(current.policy, [policy], &valid).is_some() {
                        *current = Governing::new(policy);
                    }
                }
                None => {
                    same_target.push(Governing::new(policy));
                    set.len += 1;
                }
            }
        }
        set
    }

    /// The policy governing `direction` of `workload`, if any.
    pub fn governing(
        &self,
        workload: &WorkloadRef,
        direction: Direction,
    ) -> Option<&'a WorkloadNetworkPolicy> {
        self.governing_entry(workload, direction).map(|g| g.policy)
    }

    fn governing_entry(
        &self,
        workload: &WorkloadRef,
        direction: Direction,
    ) -> Option<&Governing<'a>> {
        let kind = workload_kind(&workload.owner_kind)?;
        self.by_target
            .get(workload.namespace.as_str())?
            .get(workload.owner_name.as_str())?
            .iter()
            .find(|g| g.kind == kind && g.direction == direction)
    }

    /// The number of policies in force.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no policy is in force.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn workload_kind(kind: &str) -> Option<WorkloadKind> {
    WorkloadKind::from_kind(kind)
}

/// The rules of a policy in force that allowed a flow on its side (rule usage, docs/api.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleMatch {
    pub policy: PolicyKey,
    pub direction: Direction,
    /// Indexes in the policy's rules of that direction; never empty.
    pub rules: Vec<usize>,
}

/// The violations of one flow: at most three (the source's egress policy, the destination's ingress
/// policy, a cluster proposal in monitor that the evidence pass adds), kept inline so that
/// evaluating a flow allocates nothing.
pub type Violations<'a> = smallvec::SmallVec<[Attributed<'a>; 3]>;

/// The violations `flow` causes, in attribution order: the source's egress policy first, then (unless
/// that one denies in protect mode, or an Admin ClusterNetworkPolicy denies the source's egress) the
/// destination's ingress policy.
pub fn attribute<'a>(
    view: &ClusterView,
    policies: &PolicySet<'a>,
    flow: &'a ObservedFlow,
) -> Result<Violations<'a>, EvalError> {
    attribute_with_usage(view, policies, flow, None)
}

/// [`attribute`], also adding to `usage` the rules of each policy in force that allowed the flow on
/// its side (the side a protect egress denial stops is not evaluated: the flow never got there).
pub fn attribute_with_usage<'a>(
    view: &ClusterView,
    policies: &PolicySet<'a>,
    flow: &'a ObservedFlow,
    mut usage: Option<&mut Vec<RuleMatch>>,
) -> Result<Violations<'a>, EvalError> {
    let principal = Some(flow.source.workload.identity.as_str()).filter(|p| !p.is_empty());
    let mut ends = None;
    let mut violations = Violations::new();
    let mut used = |governing: &Governing<'_>, ends: &Option<(Resolved<'_>, Resolved<'_>)>| {
        if let Some(usage) = usage.as_deref_mut() {
            let rules = governing.matching_rules(view, flow, principal, ends);
            if !rules.is_empty() {
                usage.push(RuleMatch {
                    policy: policy_key(governing.policy),
                    direction: governing.direction,
                    rules,
                });
            }
        }
    };
    if let Some(egress) = policies.governing_entry(&flow.source.workload, Direction::Egress) {
        match egress.verdict(view, flow.into(), principal, &mut ends)? {
            PolicyVerdict::Denies => {
                violations.push(Attributed {
                    by: Recorder::policy(egress.policy),
                    flow,
                });
                if egress.policy.spec.mode == PolicyMode::Protect {
                    return Ok(violations);
                }
            }
            PolicyVerdict::Allows => used(egress, &ends),
            PolicyVerdict::NotApplicable => {}
        }
    }
    let Some(ingress) = policies.governing_entry(&flow.destination.workload, Direction::Ingress)
    else {
        return Ok(violations);
    };
    // An Admin ClusterNetworkPolicy that denies the source's egress stops the flow there: the
    // destination's policy would never see it.
    if !view.cluster_policies().is_empty() {
        let f: FlowRef<'_> = flow.into();
        let resolved = match ends {
            Some(resolved) => resolved,
            None => *ends.insert(compiled::resolve(view, f.source, f.destination)?),
        };
        if compiled::admin_denies(view, Direction::Egress, resolved, flow.protocol, flow.port) {
            return Ok(violations);
        }
    }
    match ingress.verdict(view, flow.into(), principal, &mut ends)? {
        PolicyVerdict::Denies => violations.push(Attributed {
            by: Recorder::policy(ingress.policy),
            flow,
        }),
        PolicyVerdict::Allows => used(ingress, &ends),
        PolicyVerdict::NotApplicable => {}
    }
    Ok(violations)
}

/// Whether the cluster stops `flow` at its source: an Admin ClusterNetworkPolicy denies the source's
/// egress ([`compiled::admin_denies`]). The destination's ingress policy then never sees it: no
/// violation there ([`attribute`]), nothing the protect gate would block. Free without
/// ClusterNetworkPolicies.
pub fn stopped_at_source(view: &ClusterView, flow: &Flow) -> Result<bool, EvalError> {
    if view.cluster_policies().is_empty() {
        return Ok(false);
    }
    let ends = compiled::resolve(view, &flow.source, &flow.destination)?;
    Ok(compiled::admin_denies(
        view,
        Direction::Egress,
        ends,
        flow.protocol,
        flow.port,
    ))
}

fn policy_key(policy: &WorkloadNetworkPolicy) -> PolicyKey {
    PolicyKey {
        namespace: policy.namespace().unwrap_or_default(),
        name: policy.name_any(),
    }
}

/// What `policy` says about `flow` on its own side (egress at the source, ingress at the
/// destination), evaluated as if rendered, whatever its mode:
/// - kubernetes backend: `spec.kubernetes` as a NetworkPolicy of the policy's name, together with the
///   NetworkPolicies in force in the namespace (replacing our own rendered one, which is the same);
/// - istio backend: the AuthorizationPolicy rendered from `spec.istio`, for the source's principal.
///
/// `peer_name`: the name the source pod resolved an outside destination from (`spec.egressNames`).
pub fn policy_verdict(
    view: &ClusterView,
    policy: &WorkloadNetworkPolicy,
    flow: &Flow,
    source_principal: Option<&str>,
    peer_name: Option<&str>,
) -> Result<PolicyVerdict, EvalError> {
    let flow = FlowRef {
        peer_name,
        ..FlowRef::from(flow)
    };
    Governing::new(policy).verdict(view, flow, source_principal, &mut None)
}

fn missing_payload(policy: &WorkloadNetworkPolicy, payload: &'static str) -> EvalError {
    EvalError::MissingPayload {
        namespace: policy.metadata.namespace.clone().unwrap_or_default(),
        name: policy.metadata.name.clone().unwrap_or_default(),
        payload,
    }
}

/// The kubernetes backend: the rendered NetworkPolicy, through the view's policy index.
fn kubernetes_verdict(
    view: &ClusterView,
    rendered: &netpol::Policy<'_>,
    direction: Direction,
    ends: (Resolved<'_>, Resolved<'_>),
    protocol: Protocol,
    port: u16,
) -> PolicyVerdict {
    match compiled::verdict_as_if_rendered(view, rendered, direction, ends, protocol, port) {
        None => PolicyVerdict::NotApplicable,
        Some(true) => PolicyVerdict::Allows,
        Some(false) => PolicyVerdict::Denies,
    }
}

/// The istio backend: the AuthorizationPolicy rendered from `spec.istio`, for the source's principal.
fn istio_verdict(
    view: &ClusterView,
    policy: &WorkloadNetworkPolicy,
    destination: &Endpoint,
    protocol: Protocol,
    port: u16,
    source_principal: Option<&str>,
) -> Result<PolicyVerdict, EvalError> {
    let istio = policy
        .spec
        .istio
        .as_ref()
        .ok_or_else(|| missing_payload(policy, "istio"))?;
    // ztunnel enforces inbound only, on the destination pod of the policy's namespace.
    let Endpoint::Pod(key) = destination else {
        return Ok(PolicyVerdict::NotApplicable);
    };
    let pod = view
        .pod(key)
        .ok_or_else(|| EvalError::UnknownPod(key.clone()))?;
    let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
    if policy.spec.direction != Direction::Ingress || pod.namespace != namespace {
        return Ok(PolicyVerdict::NotApplicable);
    }
    let connection = Connection {
        destination_labels: &pod.labels,
        source_principal,
        protocol,
        port,
    };
    Ok(match authorization_policy::evaluate(istio, &connection) {
        AuthzVerdict::NotApplicable => PolicyVerdict::NotApplicable,
        AuthzVerdict::Allowed => PolicyVerdict::Allows,
        AuthzVerdict::Denied => PolicyVerdict::Denies,
    })
}

/// Whether `policy`'s current spec allows a recorded violation now, for the "clear" step of the
/// status bookkeeping. The record's workloads are looked up in the view and represented by their
/// first pod (by name): pods of one workload share their template's labels and ports. Records whose
/// flow cannot be rebuilt (the workload has no pod now, no port was recorded, the policy has no
/// payload) are kept: only a record proven allowed is cleared. [`AllowedNow`] judges many records
/// of one policy.
pub fn record_allowed_now(
    view: &ClusterView,
    policy: &WorkloadNetworkPolicy,
    record: &ViolationRecord,
) -> bool {
    AllowedNow::new(view, policy).record(record)
}

/// [`record_allowed_now`] for the records of one policy, its payload compiled once.
pub struct AllowedNow<'a> {
    view: &'a ClusterView,
    governing: Governing<'a>,
}

impl<'a> AllowedNow<'a> {
    /// Compiles `policy` for judging its records against `view`.
    pub fn new(view: &'a ClusterView, policy: &'a WorkloadNetworkPolicy) -> Self {
        AllowedNow {
            view,
            governing: Governing::new(policy),
        }
    }

    /// Whether the policy allows `record` now (see [`record_allowed_now`]).
    pub fn record(&self, record: &ViolationRecord) -> bool {
        let Some(flow) = flow_of_record(self.view, record) else {
            return false;
        };
        let principal = Some(record.source.identity.as_str()).filter(|p| !p.is_empty());
        // A record of an address the pod resolved from a name is cleared once the name is listed
        // (`spec.egressNames`), as the flow would be judged now (docs/behaviour.md §3.7).
        let flow = FlowRef {
            peer_name: Some(record.dest.dns_name.as_str()).filter(|n| !n.is_empty()),
            ..FlowRef::from(&flow)
        };
        matches!(
            self.governing
                .verdict(self.view, flow, principal, &mut None),
            Ok(PolicyVerdict::Allows | PolicyVerdict::NotApplicable)
        )
    }
}

/// The flow a violation record stands for now: its workloads' first pods (or addresses), its port;
/// `None` when it cannot be rebuilt (a workload without pods, no port).
pub(super) fn flow_of_record(view: &ClusterView, record: &ViolationRecord) -> Option<Flow> {
    Some(Flow {
        source: endpoint_of(view, &record.source)?,
        destination: endpoint_of(view, &record.dest)?,
        protocol: record.protocol,
        port: record.dst_port.and_then(|p| u16::try_from(p).ok())?,
    })
}

/// The endpoint a recorded workload stands for now: its first pod, or its address.
fn endpoint_of(view: &ClusterView, workload: &WorkloadRef) -> Option<Endpoint> {
    let pod = workload_kind(&workload.owner_kind).and_then(|kind| {
        view.pods_of(&workload.namespace, kind, &workload.owner_name)
            .next()
    });
    match pod {
        Some(pod) => Some(Endpoint::Pod(PodKey::new(&pod.namespace, &pod.name))),
        None => workload.address.parse::<IpAddr>().ok().map(Endpoint::Ip),
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// The dedupe key of an observation: what it says, without its time. Borrowed, so that a repeat
/// (most of a storm of denied flows) costs no copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RepeatKey<'a> {
    pub source: &'a WorkloadRef,
    pub dest: &'a WorkloadRef,
    pub protocol: Protocol,
    pub dst_port: Option<i32>,
    pub action: PolicyMode,
    /// The denying policy's namespace and name.
    pub policy: (&'a str, &'a str),
    pub direction: Direction,
}

impl<'a> RepeatKey<'a> {
    /// The key of `o`.
    pub fn of(o: &'a Observation) -> Self {
        RepeatKey {
            source: &o.source,
            dest: &o.dest,
            protocol: o.protocol,
            dst_port: o.dst_port,
            action: o.action,
            policy: (&o.denying_policy_namespace, &o.denying_policy_name),
            direction: o.direction,
        }
    }
}
