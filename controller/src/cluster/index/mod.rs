//! The controller's index of the cluster, and resolution of flow records against it.
//!
//! The index is a pure state machine fed by watch events (`apply_*` / `delete_*`), in the manner of
//! Linkerd's policy index: ingest and learning read it and never list the API per flow. It keeps only what
//! resolution needs: pods (IPs with a short history for IP reuse, labels, owner, node, service account,
//! named container ports), workloads (uid and selector), Jobs (for the Job → CronJob owner chain),
//! Services (ClusterIPs, selector, ports) and node IPs. The backends of a Service with a selector are the
//! pods it picks, as kube-proxy would. A Service without a selector (the `kubernetes` Service in front of
//! the API servers, a Service in front of an outside database) has its backends only in what its
//! endpoints objects publish: its `discovery.k8s.io/v1` EndpointSlices where the API server serves them
//! (v1.21 and later; the source kube-proxy reads, and the only one for slices a controller writes
//! directly), else its v1 Endpoints (the watches choose at start, see `watches::EndpointsSource`).
//! The index keeps, per Service, the ready addresses and ports each such object publishes (and the
//! serving, terminating ones kube-proxy falls back to), for every Service: a Service that loses its
//! selector is then resolved through them at once, without waiting for their next change.
//!
//! Resolution is on the ingest hot path (every record, every replica), so the index does its work when
//! the cluster changes, not when a record arrives:
//! - every pod carries its workload endpoint, computed on change and shared ([`Arc`], interned: the
//!   pods of one workload hold the same endpoint);
//! - every Service keeps its backend pods and, per service port, the backend workloads with their
//!   container ports (named target ports resolved per backend pod), updated on pod, Service and workload
//!   changes. A ClusterIP record is then two hash lookups instead of a scan of every pod;
//! - a Service without a selector keeps the same per-port backends, computed from its endpoints' ready
//!   addresses (a pod's IP is that pod's workload, a node's IP the node, anything else external) when its
//!   endpoints, itself, or a pod or node at one of those addresses changes (see
//!   `Index::recompute_backends_at`), so such a record is the same two lookups.

use crate::cluster::workload::{self, Workload};
use crate::{FastMap, FastSet};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use network_enforcer_api::{Protocol, WorkloadKind};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

/// A pod, by namespace and name.
pub type PodName = (String, String);

/// A workload, by namespace, kind and name.
pub type WorkloadKey = (String, WorkloadKind, String);

/// A Service, by namespace and name.
type ServiceKey = (String, String);

/// How long a released pod IP still resolves to its former pod, for records that arrive late.
pub const IP_HISTORY_MS: i64 = 5 * 60 * 1000;

/// Labels the Job controller adds to every pod of a Job (legacy and `batch.kubernetes.io/` forms). They
/// name one Job run, so no selector learned from a Job's pods contains them (see [`without_run_labels`]).
pub const JOB_POD_LABELS: [&str; 4] = [
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
];

/// What the index keeps of a pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `metadata.generateName` ("" when none): Calico Goldmane names pods by it.
    pub generate_name: String,
    pub labels: BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub node: Option<String>,
    pub service_account: String,
    /// The workload the pod belongs to (for a Job's pod: the Job's CronJob when it has one, else the
    /// Job); `None` for a bare pod.
    pub owner: Option<Workload>,
    /// The Job controlling the pod, if any, from its ownerReference.
    pub job: Option<OwnerRef>,
    /// The kind of the pod's controller when it is none the index resolves (a ReplicaSet without a
    /// Deployment, an operator's own kind): the pod is then no bare pod either.
    pub foreign_controller: Option<String>,
    /// Named container ports: (name, port, protocol).
    pub ports: Vec<(String, u16, Protocol)>,
    pub host_network: bool,
    /// Succeeded or Failed: holds no IP and backs no Service.
    pub terminated: bool,
    /// The pod as a flow endpoint (shared by the pods of one workload).
    pub endpoint: Arc<WorkloadEndpoint>,
}

/// An ownerReference, as far as the index needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OwnerRef {
    pub api_version: String,
    pub name: String,
    pub uid: String,
}

/// What the index keeps of a workload (Deployment, StatefulSet, DaemonSet, Job, CronJob).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadInfo {
    pub uid: String,
    pub selector: LabelSelector,
    /// The apiVersion of its kind, for ownerReferences (`batch/v1beta1` CronJobs on older clusters).
    pub api_version: String,
}

/// What the index keeps of a Job: the CronJob that created it, if any.
#[derive(Clone, Debug, PartialEq)]
struct JobInfo {
    cronjob: Option<OwnerRef>,
    /// Deleted while pods of it were still held: kept until they expire, so their late updates (the
    /// garbage collector deletes a CronJob's old Job before its pods) still resolve to the CronJob.
    deleted: bool,
}

/// What the index keeps of a Service.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    /// `None` for Services without a selector: their backends are the addresses of their Endpoints.
    pub selector: Option<BTreeMap<String, String>>,
    pub ports: Vec<ServicePort>,
    /// ClusterIPs.
    pub ips: Vec<IpAddr>,
}

/// A port of a Service.
#[derive(Clone, Debug, PartialEq)]
pub struct ServicePort {
    pub port: u16,
    pub protocol: Protocol,
    /// The backend port (a container port, or the name of one) for a Service with a selector.
    pub target: IntOrString,
    /// The port's name (empty for a Service's only port): what the ports of its Endpoints are matched by.
    pub name: String,
}

/// What one endpoints object (a subset of an Endpoints object, or one EndpointSlice) publishes for a
/// Service, as far as resolution needs it: the addresses kube-proxy sends to, and the ports each of
/// them serves (name, port, protocol).
#[derive(Clone, Debug, PartialEq)]
struct EndpointSubset {
    /// Ready addresses.
    addresses: Vec<IpAddr>,
    /// Addresses that are terminating but still serving: kube-proxy sends to them only when a service
    /// port has no ready address (EndpointSlices only; v1 Endpoints do not tell).
    terminating: Vec<IpAddr>,
    ports: Vec<(String, u16, Protocol)>,
}

/// A Service's endpoints by the object that publishes them: the Endpoints object (named as the
/// Service) or each of its EndpointSlices (a Service has one per address family, more past 100
/// endpoints).
type EndpointParts = BTreeMap<String, Vec<EndpointSubset>>;

/// A backend of a Service and the port it is reached on after kube-proxy's DNAT: a workload on its
/// container port, or (behind a Service without a selector) whatever its Endpoints' address is.
pub type Backend = (FlowEnd, u16);

/// The backends of one Service, kept up to date by the index.
#[derive(Clone, Debug, Default, PartialEq)]
struct Backends {
    /// The live pods its selector picks (none for a Service without a selector).
    pods: BTreeSet<String>,
    /// Per service port: the backend workloads and their container ports, sorted and deduplicated (one
    /// workload appears once per distinct container port, e.g. while a rollout changes a named port);
    /// for a Service without a selector, what its Endpoints' addresses are and their ports.
    /// Shared, so that a record placed on them holds them without a copy ([`PeerAt::Backends`]).
    by_port: FastMap<(u16, Protocol), Arc<Vec<Backend>>>,
}

/// Who held an IP, and when (ms since the epoch).
#[derive(Clone, Debug, PartialEq)]
struct IpLease {
    pod: PodName,
    /// The pod's record, kept here so a lookup by IP (every record's peer) is one map lookup rather
    /// than two more by namespace and name. [`Index::put_pod`] keeps it current while the pod holds
    /// the IP and at the change that releases it; after that it is the record of then.
    record: Arc<PodRecord>,
    since: i64,
    until: Option<i64>,
}

/// One side of a flow, at workload level.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FlowEnd {
    /// Pods of a workload (or a bare pod, whose `kind` is `None`).
    Workload(Arc<WorkloadEndpoint>),
    /// A pod on its node's network (`hostNetwork: true`), known as a pod: the local pod of a record, or
    /// a Service backend. Its workload still gets proposals of its own, but as a peer of others it is
    /// its node's address `ip` ([`FlowEnd::as_peer`]): its traffic carries that address, and no
    /// NetworkPolicy pod selector matches host-network traffic.
    HostNetwork {
        workload: Arc<WorkloadEndpoint>,
        ip: IpAddr,
        node: String,
    },
    /// A node of the cluster (host network), by IP.
    Node { ip: IpAddr, name: String },
    /// Anything else: the internet, hosts outside the cluster.
    External(IpAddr),
}

impl FlowEnd {
    /// The workload this side of a flow is, whose proposals it gets: a pod's (host network or not).
    pub fn workload(&self) -> Option<&Arc<WorkloadEndpoint>> {
        match self {
            FlowEnd::Workload(w) | FlowEnd::HostNetwork { workload: w, .. } => Some(w),
            FlowEnd::Node { .. } | FlowEnd::External(_) => None,
        }
    }

    /// This endpoint as the peer in another workload's proposal: a host-network pod is its node's
    /// address, the same peer the other side's record names it by (one connection, one peer).
    pub fn as_peer(&self) -> FlowEnd {
        match self {
            FlowEnd::HostNetwork { ip, node, .. } => FlowEnd::Node {
                ip: *ip,
                name: node.clone(),
            },
            other => other.clone(),
        }
    }
}

/// A workload as a flow endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkloadEndpoint {
    pub namespace: String,
    /// `None` for a bare pod (no controller owner); its `name` is the pod's.
    pub kind: Option<WorkloadKind>,
    /// Workload name (the pod name for bare pods).
    pub name: String,
    /// The uid ownerReferences name: the workload's (`None` when the workload object is not in the
    /// index), or the pod's for a bare pod.
    pub uid: Option<String>,
    /// The apiVersion of the owner ownerReferences name (`apps/v1`, `batch/v1`, `v1` for a pod).
    pub api_version: String,
    /// The workload's `spec.selector` (the pod's labels for bare pods), as `key=value` pairs.
    pub selector: BTreeMap<String, String>,
    /// Full selector including matchExpressions, serialized, so equal workloads compare equal.
    pub selector_expressions: String,
    pub service_account: String,
    /// For a pod (`kind` `None`) whose controller is of a kind the index does not resolve: that kind.
    /// Such a pod is a peer (by its labels) but gets no proposal: each of its controller's replicas would
    /// get its own.
    pub foreign_controller: Option<String>,
}

/// Hashes the identity only (namespace, kind, name): consistent with `Eq` (equal endpoints have equal
/// identities) and cheap, since endpoints key the learning maps of every record.
impl Hash for WorkloadEndpoint {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.namespace.hash(state);
        self.kind.hash(state);
        self.name.hash(state);
    }
}

impl WorkloadEndpoint {
    /// Its Istio principal: `cluster.local/ns/<ns>/sa/<serviceaccount>`.
    pub fn principal(&self) -> String {
        format!(
            "cluster.local/ns/{}/sa/{}",
            self.namespace, self.service_account
        )
    }

    /// The selector as a LabelSelector.
    pub fn label_selector(&self) -> LabelSelector {
        if self.selector_expressions.is_empty() {
            LabelSelector {
                match_labels: Some(self.selector.clone()),
                match_expressions: None,
            }
        } else {
            serde_json::from_str(&self.selector_expressions).unwrap_or_default()
        }
    }

    /// Whether a NetworkPolicy can select exactly these pods: an empty selector would select every pod
    /// of the namespace (a bare pod without labels, a CronJob whose pod template has none), so such an
    /// endpoint gets no proposal and is not learned as a peer.
    pub fn selectable(&self) -> bool {
        !self.selector.is_empty() || !self.selector_expressions.is_empty()
    }
}

/// Where a peer address (and port) leads.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    /// These endpoints, each on the port it is reached on: one workload for a pod IP; the backends of a
    /// Service ClusterIP (see [`Backend`]).
    Backends(Vec<Backend>),
    /// A Service with no ready backend: nothing to learn yet.
    ServiceWithoutBackends { namespace: String, name: String },
    /// Not a pod: a node or an external address, on the port as seen.
    Address(FlowEnd, u16),
}

/// [`Resolved`], borrowed from the index: what the learning hot path uses (no copies per record).
#[derive(Clone, Debug, PartialEq)]
pub enum ResolvedRef<'a> {
    /// The pod that held the address, on the port as seen.
    Pod(&'a Arc<PodRecord>, u16),
    /// A Service's backends and the ports they are reached on, as the index keeps them (from its pods
    /// for a Service with a selector, from its Endpoints for one without).
    Backends(&'a [Backend]),
    /// A Service with no ready backend on that port.
    ServiceWithoutBackends(&'a ServiceInfo),
    /// A node or an external address, on the port as seen.
    Address(FlowEnd, u16),
}

impl ResolvedRef<'_> {
    /// The owned form.
    pub fn to_owned(&self) -> Resolved {
        match self {
            ResolvedRef::Pod(pod, port) => {
                Resolved::Backends(vec![(FlowEnd::Workload(Arc::clone(&pod.endpoint)), *port)])
            }
            ResolvedRef::Backends(b) => Resolved::Backends(b.to_vec()),
            ResolvedRef::ServiceWithoutBackends(svc) => Resolved::ServiceWithoutBackends {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
            },
            ResolvedRef::Address(e, port) => Resolved::Address(e.clone(), *port),
        }
    }
}

/// Pods by namespace, then name: looked up by `&str` without building an owned key (every record looks
/// up its local pod by name). Each record is shared: a record read against the index keeps its local
/// pod ([`crate::ingest::flow_record::Decoded`]) without copying it; a changed pod is a new record.
#[derive(Debug, Default)]
struct PodMap {
    by_namespace: FastMap<String, FastMap<String, Arc<PodRecord>>>,
    len: usize,
}

impl PodMap {
    fn get_str(&self, namespace: &str, name: &str) -> Option<&Arc<PodRecord>> {
        self.by_namespace.get(namespace)?.get(name)
    }

    fn get(&self, key: &PodName) -> Option<&PodRecord> {
        self.get_str(&key.0, &key.1).map(|pod| &**pod)
    }

    fn insert(&mut self, key: PodName, pod: Arc<PodRecord>) {
        let names = self.by_namespace.entry(key.0).or_default();
        if names.insert(key.1, pod).is_none() {
            self.len += 1;
        }
    }

    fn remove(&mut self, key: &PodName) -> Option<Arc<PodRecord>> {
        let names = self.by_namespace.get_mut(&key.0)?;
        let pod = names.remove(&key.1)?;
        self.len -= 1;
        if names.is_empty() {
            self.by_namespace.remove(&key.0);
        }
        Some(pod)
    }

    fn values(&self) -> impl Iterator<Item = &PodRecord> {
        self.by_namespace
            .values()
            .flat_map(FastMap::values)
            .map(|pod| &**pod)
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// The index. See the module docs.
#[derive(Debug)]
pub struct Index {
    pods: PodMap,
    /// Pods by uid (agents that only know the uid from the pod's cgroup path report it).
    uids: FastMap<String, PodName>,
    /// Deleted pods, kept (for late records) until their IP history ends: when they were deleted.
    deleted: FastMap<PodName, i64>,
    leases: FastMap<IpAddr, Vec<IpLease>>,
    workloads: FastMap<WorkloadKey, WorkloadInfo>,
    /// Pod names per namespace (live and recently deleted), for Service selection.
    pods_in_namespace: FastMap<String, BTreeSet<String>>,
    /// Pod names per owner workload, to refresh their endpoints when the workload changes.
    pods_of_workload: FastMap<WorkloadKey, BTreeSet<String>>,
    /// The same pods counted per node, so that [`Index::has_pod_on`] (asked for every learned edge)
    /// is three lookups instead of one per pod of the workload.
    nodes_of_workload: WorkloadNodes,
    /// Pod names per Job (namespace, name), to re-resolve their owner when the Job is seen.
    pods_of_job: FastMap<(String, String), BTreeSet<String>>,
    /// Pod names per (namespace, generateName), for flow sources that name pods that way.
    pods_generated_as: FastMap<(String, String), BTreeSet<String>>,
    jobs: FastMap<(String, String), JobInfo>,
    services: FastMap<ServiceKey, ServiceInfo>,
    service_ips: FastMap<IpAddr, ServiceKey>,
    /// Service names per namespace.
    services_in_namespace: FastMap<String, BTreeSet<String>>,
    backends: FastMap<ServiceKey, Backends>,
    /// Every Service's endpoints as its endpoints objects publish them (see the module docs); used for
    /// the Services without a selector, or whose Service is not indexed yet.
    endpoints: FastMap<ServiceKey, EndpointParts>,
    /// The Service each held EndpointSlice belongs to, by (namespace, slice name): a slice is deleted
    /// by name, and its `kubernetes.io/service-name` label may change.
    slice_services: FastMap<(String, String), ServiceKey>,
    /// The addresses of the endpoints of the Services resolved through them (no selector, or not
    /// indexed yet), by address: whose backends to recompute when the pod or node at that address
    /// changes.
    endpoint_addresses: FastMap<IpAddr, BTreeSet<ServiceKey>>,
    nodes: FastMap<IpAddr, String>,
    /// Interned endpoints: the pods of one workload share one [`Arc`].
    interned: FastSet<Arc<WorkloadEndpoint>>,
    /// Interner size after its last sweep (see [`Index::sweep_interned`]).
    interned_swept: usize,
    /// The earliest time (ms) a released IP or a deleted pod expires; [`Index::forget_expired`] has
    /// nothing to do before.
    next_expiry: i64,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            pods: PodMap::default(),
            uids: FastMap::default(),
            deleted: FastMap::default(),
            leases: FastMap::default(),
            workloads: FastMap::default(),
            pods_in_namespace: FastMap::default(),
            pods_of_workload: FastMap::default(),
            nodes_of_workload: WorkloadNodes::default(),
            pods_of_job: FastMap::default(),
            pods_generated_as: FastMap::default(),
            jobs: FastMap::default(),
            services: FastMap::default(),
            service_ips: FastMap::default(),
            services_in_namespace: FastMap::default(),
            backends: FastMap::default(),
            endpoints: FastMap::default(),
            slice_services: FastMap::default(),
            endpoint_addresses: FastMap::default(),
            nodes: FastMap::default(),
            interned: FastSet::default(),
            interned_swept: 0,
            next_expiry: i64::MAX,
        }
    }
}

/// A port's protocol; one the API does not define is taken as TCP, its default.
fn protocol(p: Option<&str>) -> Protocol {
    Protocol::from_kubernetes(p).unwrap_or(Protocol::TCP)
}

/// The controller ownerReference of an object, as (kind, reference).
fn controller_ref(
    refs: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
) -> Option<(&str, OwnerRef)> {
    let o = refs?.iter().find(|o| o.controller == Some(true))?;
    Some((
        o.kind.as_str(),
        OwnerRef {
            api_version: o.api_version.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        },
    ))
}

/// The apiVersion of a kind when no object told us (ownerReferences need one).
fn default_api_version(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Deployment | WorkloadKind::StatefulSet | WorkloadKind::DaemonSet => "apps/v1",
        WorkloadKind::Job | WorkloadKind::CronJob => "batch/v1",
        WorkloadKind::Pod => "v1",
    }
}

/// `labels` without the per-run Job labels ([`JOB_POD_LABELS`]): the selector of every workload learned
/// from a Job's pods, a CronJob's or a Job's of its own, and of such a pod as a peer of others. A
/// `controller-uid` or `job-name` selector names one run: a rule with it allows that run only, and a
/// proposal selecting by it would be another proposal for every run.
pub fn without_run_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| !JOB_POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The CronJob a Job was made from ([`workload::cronjob_reference`]).
fn cronjob_of(
    refs: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
) -> Option<OwnerRef> {
    let cronjob = workload::cronjob_reference(refs?)?;
    Some(OwnerRef {
        api_version: cronjob.api_version.clone(),
        name: cronjob.name.clone(),
        uid: cronjob.uid.clone(),
    })
}

/// Whether `pod` backs `svc`: a live, running pod with an IP in the Service's namespace that its selector
/// picks.
fn backs(svc: &ServiceInfo, pod: &PodRecord, deleted: bool) -> bool {
    let Some(selector) = &svc.selector else {
        return false;
    };
    !deleted
        && !pod.terminated
        && !pod.ips.is_empty()
        && pod.namespace == svc.namespace
        && selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
}

/// The container port `target` names on `pod` for `proto`.
fn container_port(target: &IntOrString, pod: &PodRecord, proto: Protocol) -> Option<u16> {
    match target {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => pod
            .ports
            .iter()
            .find(|(n, _, pr)| n == name && *pr == proto)
            .map(|(_, p, _)| *p),
    }
}

/// Pods per node of each owner workload: namespace → workload name → per kind, node → pods. Nested
/// so that a lookup by `&str` allocates nothing.
#[derive(Debug, Default)]
struct WorkloadNodes(FastMap<String, FastMap<String, Vec<(WorkloadKind, PodsPerNode)>>>);

/// Node name → how many pods of one workload it runs.
type PodsPerNode = FastMap<String, u32>;

impl WorkloadNodes {
    fn contains(&self, namespace: &str, kind: WorkloadKind, name: &str, node: &str) -> bool {
        self.0
            .get(namespace)
            .and_then(|names| names.get(name))
            .and_then(|kinds| kinds.iter().find(|(k, _)| *k == kind))
            .is_some_and(|(_, nodes)| nodes.contains_key(node))
    }

    fn add(&mut self, namespace: &str, owner: &Workload, node: &str) {
        let kinds = self
            .0
            .entry(namespace.to_string())
            .or_default()
            .entry(owner.name.clone())
            .or_default();
        let nodes = match kinds.iter().position(|(k, _)| *k == owner.kind) {
            Some(i) => &mut kinds[i].1,
            None => {
                kinds.push((owner.kind, FastMap::default()));
                &mut kinds.last_mut().expect("just pushed").1
            }
        };
        *nodes.entry(node.to_string()).or_default() += 1;
    }

    /// Undoes one [`WorkloadNodes::add`], dropping what becomes empty.
    fn remove(&mut self, namespace: &str, owner: &Workload, node: &str) {
        let Some(names) = self.0.get_mut(namespace) else {
            return;
        };
        let Some(kinds) = names.get_mut(owner.name.as_str()) else {
            return;
        };
        let Some(i) = kinds.iter().position(|(k, _)| *k == owner.kind) else {
            return;
        };
        let nodes = &mut kinds[i].1;
        if let Some(count) = nodes.get_mut(node) {
            *count -= 1;
            if *count == 0 {
                nodes.remove(node);
            }
        }
        if nodes.is_empty() {
            kinds.swap_remove(i);
        }
        if kinds.is_empty() {
            names.remove(owner.name.as_str());
        }
        if names.is_empty() {
            self.0.remove(namespace);
        }
    }
}

fn remove_from<K: Eq + Hash>(map: &mut FastMap<K, BTreeSet<String>>, key: &K, name: &str) {
    if let Some(set) = map.get_mut(key) {
        set.remove(name);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

pub use flows::{Connection, End, Family, Flow, Flows, NoFlow, Opened, PeerAt};

mod endpoints;
mod flows;
mod nodes;
mod pods;
mod resolve;
mod services;
mod workloads;

#[cfg(test)]
mod tests;
