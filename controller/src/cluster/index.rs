//! The controller's index of the cluster, and resolution of flow records against it.
//!
//! The index is a pure state machine fed by watch events (`apply_*` / `delete_*`), in the manner of
//! Linkerd's policy index: ingest and learning read it and never list the API per flow. It keeps only what
//! resolution needs: pods (IPs with a short history for IP reuse, labels, owner, node, service account,
//! named container ports), workloads (uid and selector), Jobs (for the Job → CronJob owner chain),
//! Services (ClusterIPs, selector, ports) and node IPs. The backends of a Service with a selector are the
//! pods it picks, as kube-proxy would. A Service without a selector (the `kubernetes` Service in front of
//! the API servers, a Service in front of an outside database) has its backends only in its Endpoints
//! object, so the index keeps those, and only those: the ready addresses and ports of the Endpoints of
//! Services that have no selector, or that the index has not seen yet. EndpointSlices are not used (v1.20
//! does not serve `discovery.k8s.io/v1`; Endpoints v1 is served everywhere).
//!
//! Resolution is on the ingest hot path (every record, every replica), so the index does its work when
//! the cluster changes, not when a record arrives:
//! - every pod carries its workload endpoint, computed on change and shared ([`Arc`], interned: the
//!   pods of one workload hold the same endpoint);
//! - every Service keeps its backend pods and, per service port, the backend workloads with their
//!   container ports (named target ports resolved per backend pod), updated on pod, Service and workload
//!   changes. A ClusterIP record is then two hash lookups instead of a scan of every pod;
//! - a Service without a selector keeps the same per-port backends, computed from its Endpoints' ready
//!   addresses (a pod's IP is that pod's workload, a node's IP the node, anything else external) when its
//!   Endpoints, itself, or a pod or node at one of those addresses changes (see
//!   `Index::recompute_backends_at`), so such a record is the same two lookups.

use crate::cluster::workload::{self, Workload};
use crate::{FastMap, FastSet};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
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

/// One subset of an Endpoints object, as far as resolution needs it: the ready addresses, and the
/// ports each of them serves (name, port, protocol).
#[derive(Clone, Debug, PartialEq)]
struct EndpointSubset {
    addresses: Vec<IpAddr>,
    ports: Vec<(String, u16, Protocol)>,
}

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
    by_port: FastMap<(u16, Protocol), Vec<Backend>>,
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
    /// A pod's workload, on the port as seen.
    Pod(&'a Arc<WorkloadEndpoint>, u16),
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
            ResolvedRef::Pod(w, port) => {
                Resolved::Backends(vec![(FlowEnd::Workload(Arc::clone(w)), *port)])
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
    /// The Endpoints of Services without a selector, or whose Service is not indexed yet (dropped when
    /// it arrives with a selector): see the module docs.
    endpoints: FastMap<ServiceKey, Vec<EndpointSubset>>,
    /// The Services whose kept Endpoints list an address, by address: whose backends to recompute when
    /// the pod or node at that address changes.
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

/// The CronJob a Job was made from: its CronJob ownerReference, the controller one first, else one not
/// marked `controller`. The CronJob controller marks its scheduled runs' reference as controller;
/// `kubectl create job --from=cronjob/<name>` of v1.20 sets the reference without it, and such a manual
/// run is still a run of the CronJob.
fn cronjob_of(
    refs: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
) -> Option<OwnerRef> {
    let refs = refs?;
    let cronjob = refs
        .iter()
        .filter(|o| o.kind == "CronJob")
        .max_by_key(|o| o.controller == Some(true))?;
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

/// The Service an Endpoints object belongs to (same namespace and name).
fn endpoints_key(endpoints: &Endpoints) -> ServiceKey {
    (
        endpoints.namespace().unwrap_or_default(),
        endpoints.name_any(),
    )
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

impl Index {
    /// Adds or updates a pod, at time `now_ms`.
    pub fn apply_pod(&mut self, pod: &Pod, now_ms: i64) {
        let spec = pod.spec.as_ref();
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let ips = network_enforcer_api::pod::ips(pod);
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let terminated = network_enforcer_api::pod::finished(pod);
        let controller = controller_ref(pod.metadata.owner_references.as_ref());
        let controller_kind = controller.as_ref().map(|(kind, _)| kind.to_string());
        let job = match controller {
            Some(("Job", r)) => Some(r),
            _ => None,
        };
        let owner = workload::owner_of(pod)
            .or_else(|| job.as_ref().map(|j| self.job_owner(&key.0, &j.name)));
        let foreign_controller = controller_kind.filter(|_| owner.is_none());
        let mut info = PodRecord {
            namespace: key.0.clone(),
            name: key.1.clone(),
            uid: pod.uid().unwrap_or_default(),
            generate_name: pod.metadata.generate_name.clone().unwrap_or_default(),
            labels: pod.labels().clone(),
            ips: ips.clone(),
            node: spec.and_then(|s| s.node_name.clone()),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            owner,
            job,
            foreign_controller,
            ports: spec
                .into_iter()
                .flat_map(|s| s.containers.iter())
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|p| {
                    Some((
                        p.name.clone()?,
                        u16::try_from(p.container_port).ok()?,
                        protocol(p.protocol.as_deref()),
                    ))
                })
                .collect(),
            host_network,
            terminated,
            endpoint: Arc::default(),
        };
        let endpoint = self.compute_endpoint(&info);
        info.endpoint = self.intern(endpoint);
        let info = Arc::new(info);
        // Host-network pods share the node's IP: the IP says nothing about which pod it is.
        if !host_network && !terminated {
            for ip in &ips {
                let leases = self.leases.entry(*ip).or_default();
                let current = leases.iter().any(|l| l.pod == key && l.until.is_none());
                if !current {
                    for l in leases.iter_mut().filter(|l| l.until.is_none()) {
                        l.until = Some(now_ms);
                        self.next_expiry = self.next_expiry.min(now_ms + IP_HISTORY_MS);
                    }
                    leases.push(IpLease {
                        pod: key.clone(),
                        record: info.clone(),
                        since: now_ms,
                        until: None,
                    });
                }
            }
        }
        let old = self.pods.remove(&key);
        if let Some(old) = &old {
            let released: Vec<IpAddr> = old
                .ips
                .iter()
                .filter(|ip| terminated || !ips.contains(ip))
                .copied()
                .collect();
            self.release(&key, &released, now_ms);
            self.unlink(old);
        }
        self.deleted.remove(&key);
        if !info.uid.is_empty() {
            self.uids.insert(info.uid.clone(), key.clone());
        }
        self.link(&info);
        let before_ips: &[IpAddr] = old.as_deref().map_or(&[], |o| &o.ips);
        self.put_pod(&key, info, before_ips);
        self.update_backends_of(&key, old.as_deref());
        self.forget_expired(now_ms);
    }

    /// Removes a pod; its IPs keep resolving to it for [`IP_HISTORY_MS`].
    pub fn delete_pod(&mut self, namespace: &str, name: &str, now_ms: i64) {
        let key = (namespace.to_string(), name.to_string());
        let old = self.pods.get(&key).cloned();
        if let Some(old) = &old {
            self.release(&key, &old.ips, now_ms);
        }
        // Keep the PodRecord for the IP history window, so late records still resolve.
        self.deleted.insert(key.clone(), now_ms);
        self.next_expiry = self.next_expiry.min(now_ms + IP_HISTORY_MS);
        self.update_backends_of(&key, old.as_ref());
        self.forget_expired(now_ms);
    }

    /// Stores `pod` as the newest record of `key`, also in the leases it holds on its addresses and
    /// on `before_ips` (those of its previous record: a late record for one still finds it).
    fn put_pod(&mut self, key: &PodName, pod: Arc<PodRecord>, before_ips: &[IpAddr]) {
        for ip in pod.ips.iter().chain(before_ips) {
            let Some(leases) = self.leases.get_mut(ip) else {
                continue;
            };
            for lease in leases.iter_mut().filter(|l| l.pod == *key) {
                lease.record = pod.clone();
            }
        }
        self.pods.insert(key.clone(), pod);
    }

    fn release(&mut self, key: &PodName, ips: &[IpAddr], now_ms: i64) {
        for ip in ips {
            for l in self.leases.entry(*ip).or_default().iter_mut() {
                if &l.pod == key && l.until.is_none() {
                    l.until = Some(now_ms);
                    self.next_expiry = self.next_expiry.min(now_ms + IP_HISTORY_MS);
                }
            }
        }
    }

    /// Records `pod` in the per-namespace, per-workload and per-Job sets.
    fn link(&mut self, pod: &PodRecord) {
        self.pods_in_namespace
            .entry(pod.namespace.clone())
            .or_default()
            .insert(pod.name.clone());
        if let Some(w) = &pod.owner {
            self.pods_of_workload
                .entry((pod.namespace.clone(), w.kind, w.name.clone()))
                .or_default()
                .insert(pod.name.clone());
            if let Some(node) = &pod.node {
                self.nodes_of_workload.add(&pod.namespace, w, node);
            }
        }
        if let Some(j) = &pod.job {
            self.pods_of_job
                .entry((pod.namespace.clone(), j.name.clone()))
                .or_default()
                .insert(pod.name.clone());
        }
        if !pod.generate_name.is_empty() {
            self.pods_generated_as
                .entry((pod.namespace.clone(), pod.generate_name.clone()))
                .or_default()
                .insert(pod.name.clone());
        }
    }

    /// Undoes [`Index::link`].
    fn unlink(&mut self, pod: &PodRecord) {
        remove_from(&mut self.pods_in_namespace, &pod.namespace, &pod.name);
        if let Some(w) = &pod.owner {
            let key = (pod.namespace.clone(), w.kind, w.name.clone());
            remove_from(&mut self.pods_of_workload, &key, &pod.name);
            if let Some(node) = &pod.node {
                self.nodes_of_workload.remove(&pod.namespace, w, node);
            }
        }
        if let Some(j) = &pod.job {
            let key = (pod.namespace.clone(), j.name.clone());
            remove_from(&mut self.pods_of_job, &key, &pod.name);
        }
        let key = (pod.namespace.clone(), pod.generate_name.clone());
        remove_from(&mut self.pods_generated_as, &key, &pod.name);
    }

    /// Forgets IP history and deleted pods older than [`IP_HISTORY_MS`] (also done on every pod change).
    /// Scans only when something has expired since the last scan, so a pod change costs no walk over
    /// every IP.
    pub fn forget_expired(&mut self, now_ms: i64) {
        if now_ms <= self.next_expiry {
            return;
        }
        let mut next = i64::MAX;
        self.leases.retain(|_, leases| {
            leases.retain(|l| l.until.is_none_or(|u| u + IP_HISTORY_MS >= now_ms));
            for u in leases.iter().filter_map(|l| l.until) {
                next = next.min(u + IP_HISTORY_MS);
            }
            !leases.is_empty()
        });
        for at in self.deleted.values() {
            if *at + IP_HISTORY_MS >= now_ms {
                next = next.min(*at + IP_HISTORY_MS);
            }
        }
        self.next_expiry = next;
        let expired: Vec<PodName> = self
            .deleted
            .iter()
            .filter(|(_, at)| **at + IP_HISTORY_MS < now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.deleted.remove(&key);
            if let Some(pod) = self.pods.remove(&key) {
                self.uids.remove(&pod.uid);
                self.unlink(&pod);
                if let Some(job) = &pod.job {
                    let job_key = (pod.namespace.clone(), job.name.clone());
                    if !self.pods_of_job.contains_key(&job_key)
                        && self.jobs.get(&job_key).is_some_and(|j| j.deleted)
                    {
                        self.jobs.remove(&job_key);
                    }
                }
            }
        }
        self.sweep_interned();
    }

    /// The shared, interned form of `endpoint`. The interner is swept of endpoints nobody else holds
    /// whenever it has doubled since the last sweep, so its size stays proportional to the live ones.
    fn intern(&mut self, endpoint: WorkloadEndpoint) -> Arc<WorkloadEndpoint> {
        if let Some(shared) = self.interned.get(&endpoint) {
            return shared.clone();
        }
        let shared = Arc::new(endpoint);
        self.interned.insert(shared.clone());
        self.sweep_interned();
        shared
    }

    /// Drops interned endpoints nobody else holds, once the interner has grown past twice the pods (each
    /// pod holds one) and twice its size after the last sweep (endpoints pending in the writer may keep
    /// it from shrinking): amortized constant per pod change.
    fn sweep_interned(&mut self) {
        if self.interned.len() > 2 * self.pods.len().max(self.interned_swept) + 64 {
            self.interned.retain(|e| Arc::strong_count(e) > 1);
            self.interned_swept = self.interned.len();
        }
    }

    /// The workload a Job's pod belongs to: the Job's CronJob when the index knows the Job has one, else
    /// the Job itself.
    fn job_owner(&self, namespace: &str, job: &str) -> Workload {
        match self
            .jobs
            .get(&(namespace.to_string(), job.to_string()))
            .and_then(|j| j.cronjob.as_ref())
        {
            Some(cronjob) => Workload {
                kind: WorkloadKind::CronJob,
                name: cronjob.name.clone(),
            },
            None => Workload {
                kind: WorkloadKind::Job,
                name: job.to_string(),
            },
        }
    }

    /// The workload endpoint of a pod, from its owner and what the index knows of that owner.
    fn compute_endpoint(&self, pod: &PodRecord) -> WorkloadEndpoint {
        let Some(owner) = &pod.owner else {
            // A bare pod is its own unit: named after itself, owned by itself, selected by its labels
            // (NetworkPolicies select by label only; all of its labels is the narrowest selector there is).
            return WorkloadEndpoint {
                namespace: pod.namespace.clone(),
                kind: None,
                name: pod.name.clone(),
                uid: Some(pod.uid.clone())
                    .filter(|u| !u.is_empty() && pod.foreign_controller.is_none()),
                api_version: "v1".into(),
                selector: pod.labels.clone(),
                selector_expressions: String::new(),
                service_account: pod.service_account.clone(),
                foreign_controller: pod.foreign_controller.clone(),
            };
        };
        let info = self
            .workloads
            .get(&(pod.namespace.clone(), owner.kind, owner.name.clone()));
        let (selector, expressions) = match info {
            Some(w) => {
                let has_expressions = w
                    .selector
                    .match_expressions
                    .as_ref()
                    .is_some_and(|e| !e.is_empty());
                (
                    w.selector.match_labels.clone().unwrap_or_default(),
                    if has_expressions {
                        serde_json::to_string(&w.selector).unwrap_or_default()
                    } else {
                        String::new()
                    },
                )
            }
            // Not (yet) in the index: the best selector the pod itself tells.
            None => (
                match owner.kind {
                    WorkloadKind::Job | WorkloadKind::CronJob => without_run_labels(&pod.labels),
                    _ => pod.labels.clone(),
                },
                String::new(),
            ),
        };
        let job_ref = pod.job.as_ref().filter(|_| owner.kind == WorkloadKind::Job);
        WorkloadEndpoint {
            namespace: pod.namespace.clone(),
            kind: Some(owner.kind),
            name: owner.name.clone(),
            uid: info
                .map(|w| w.uid.clone())
                .or_else(|| job_ref.map(|j| j.uid.clone()))
                .filter(|u| !u.is_empty()),
            api_version: info
                .map(|w| w.api_version.clone())
                .or_else(|| job_ref.map(|j| j.api_version.clone()))
                .unwrap_or_else(|| default_api_version(owner.kind).into()),
            selector,
            selector_expressions: expressions,
            service_account: pod.service_account.clone(),
            foreign_controller: None,
        }
    }

    /// Recomputes the owner and endpoint of the pods `names` in `namespace` (their workload or Job
    /// changed), and the backends of the Services they are in.
    fn refresh_pods(&mut self, namespace: &str, names: Vec<String>) {
        for name in names {
            let key = (namespace.to_string(), name);
            let Some(before) = self.pods.get(&key).cloned() else {
                continue;
            };
            let mut pod = before.clone();
            if let Some(job) = &pod.job {
                pod.owner = Some(self.job_owner(namespace, &job.name));
            }
            let endpoint = self.compute_endpoint(&pod);
            pod.endpoint = self.intern(endpoint);
            if pod == before {
                continue;
            }
            self.unlink(&before);
            self.link(&pod);
            // Same addresses as before: only owner and endpoint were computed again.
            self.put_pod(&key, Arc::new(pod), &[]);
            self.update_backends_of(&key, Some(&before));
        }
    }

    /// Updates the Services of the pod `key`'s namespace after it changed from `before`: membership, and
    /// the per-port backends of every Service it joined, left or changed in.
    /// Also recomputes the Services without a selector whose Endpoints list one of its IPs, before or
    /// after (a pod taking, leaving or changing behind such an address), whatever their namespace.
    fn update_backends_of(&mut self, key: &PodName, before: Option<&PodRecord>) {
        if !self.endpoint_addresses.is_empty() {
            let ips: Vec<IpAddr> = before
                .into_iter()
                .chain(self.pods.get(key))
                .flat_map(|p| p.ips.iter().copied())
                .collect();
            self.recompute_backends_at(ips);
        }
        let Some(names) = self.services_in_namespace.get(&key.0) else {
            return;
        };
        let pod = self.pods.get(key);
        let deleted = self.deleted.contains_key(key);
        // IPs too: a host-network backend is its address.
        let changed = before.map(|b| (&b.endpoint, &b.ports, &b.ips))
            != pod.map(|p| (&p.endpoint, &p.ports, &p.ips));
        let mut dirty = Vec::new();
        for name in names {
            let service_key = (key.0.clone(), name.clone());
            let Some(svc) = self.services.get(&service_key) else {
                continue;
            };
            let member = pod.is_some_and(|p| backs(svc, p, deleted));
            let backends = self.backends.entry(service_key.clone()).or_default();
            let was = backends.pods.contains(&key.1);
            if member && !was {
                backends.pods.insert(key.1.clone());
            } else if !member && was {
                backends.pods.remove(&key.1);
            }
            if member != was || (member && changed) {
                dirty.push(service_key);
            }
        }
        for service_key in dirty {
            self.recompute_backends(&service_key);
        }
    }

    /// Recomputes the per-port backends of a Service: from its backend pods, or for a Service without a
    /// selector from its Endpoints ([`Index::endpoints_by_port`]).
    fn recompute_backends(&mut self, key: &ServiceKey) {
        let Some(svc) = self.services.get(key) else {
            self.backends.remove(key);
            return;
        };
        let Some(pods) = self.backends.get(key).map(|b| &b.pods) else {
            return;
        };
        if svc.selector.is_none() {
            let by_port = self.endpoints_by_port(key, svc);
            if let Some(backends) = self.backends.get_mut(key) {
                backends.by_port = by_port;
            }
            return;
        }
        // A host-network backend is reached at its node's address of the ClusterIP's family.
        let family = svc
            .ips
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let mut by_port = FastMap::default();
        for sp in &svc.ports {
            let mut found: BTreeSet<Backend> = BTreeSet::new();
            for name in pods {
                let Some(pod) = self.pods.get_str(&key.0, name) else {
                    continue;
                };
                let port = container_port(&sp.target, pod, sp.protocol);
                if let (Some(port), Some(endpoint)) = (port, self.pod_endpoint(pod, family)) {
                    found.insert((endpoint, port));
                }
            }
            if !found.is_empty() {
                by_port.insert((sp.port, sp.protocol), found.into_iter().collect());
            }
        }
        if let Some(backends) = self.backends.get_mut(key) {
            backends.by_port = by_port;
        }
    }

    /// Recomputes the backends of every Service without a selector whose Endpoints list one of `ips`
    /// (the pod or node at one of them changed).
    ///
    /// The scheme: such Services are few (the `kubernetes` Service, Services in front of outside
    /// hosts) and so are their addresses, so [`Index::endpoint_addresses`] maps each address to its
    /// Services, and any change that can alter what an address is (a pod taking, leaving or changing
    /// behind it, a node gaining or losing it) recomputes those Services' backends in full; their
    /// Endpoints or the Service itself changing recomputes that one Service. Everything else costs one
    /// hash lookup per IP of the changed pod or node.
    fn recompute_backends_at(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        let services: BTreeSet<ServiceKey> = ips
            .into_iter()
            .filter_map(|ip| self.endpoint_addresses.get(&ip))
            .flatten()
            .cloned()
            .collect();
        for key in services {
            self.recompute_backends(&key);
        }
    }

    /// The backends of `svc`, a Service without a selector, per service port: every ready address of
    /// its Endpoints that serves the port of the same name and protocol (how kube-proxy pairs them), as
    /// the endpoint that address is now ([`Index::address_endpoint`]), on the Endpoints' port: what the
    /// connection reaches after DNAT.
    ///
    /// Computed on change, so an address resolves by who holds it now, not by a record's time as
    /// [`Index::pod_at`] would (a record arriving after the pod at an address was replaced resolves to
    /// the new one): the same as the backends of a Service with a selector, its current pods.
    fn endpoints_by_port(
        &self,
        key: &ServiceKey,
        svc: &ServiceInfo,
    ) -> FastMap<(u16, Protocol), Vec<Backend>> {
        let mut by_port = FastMap::default();
        let Some(subsets) = self.endpoints.get(key) else {
            return by_port;
        };
        for (i, sp) in svc.ports.iter().enumerate() {
            // The first port of that number and protocol is the one a record resolves by.
            let same = |p: &ServicePort| p.port == sp.port && p.protocol == sp.protocol;
            if svc.ports[..i].iter().any(same) {
                continue;
            }
            let mut found: BTreeSet<Backend> = BTreeSet::new();
            for subset in subsets {
                for (_, target, _) in subset
                    .ports
                    .iter()
                    .filter(|(name, _, pr)| *name == sp.name && *pr == sp.protocol)
                {
                    for ip in &subset.addresses {
                        // `i64::MAX`: whoever holds the address now.
                        found.insert((self.address_endpoint(*ip, i64::MAX), *target));
                    }
                }
            }
            if !found.is_empty() {
                by_port.insert((sp.port, sp.protocol), found.into_iter().collect());
            }
        }
        by_port
    }

    /// A pod by uid (also one deleted within [`IP_HISTORY_MS`]).
    pub fn pod_by_uid(&self, uid: &str) -> Option<&Arc<PodRecord>> {
        self.uids
            .get(uid)
            .and_then(|key| self.pods.get_str(&key.0, &key.1))
    }

    /// Every pod held, live and recently deleted (see [`IP_HISTORY_MS`]): the violation evaluator's
    /// view is derived from these, so the index stays the one source of truth about pods.
    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values()
    }

    /// Number of pods held (live and recently deleted).
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Adds or updates a workload (its apiVersion: `apps/v1` for the apps kinds, else `batch/v1`).
    pub fn apply_workload(
        &mut self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
        uid: &str,
        selector: LabelSelector,
    ) {
        self.set_workload(
            (namespace.to_string(), kind, name.to_string()),
            Some(WorkloadInfo {
                uid: uid.to_string(),
                selector,
                api_version: default_api_version(kind).into(),
            }),
        );
    }

    /// Removes a workload.
    pub fn delete_workload(&mut self, namespace: &str, kind: WorkloadKind, name: &str) {
        self.set_workload((namespace.to_string(), kind, name.to_string()), None);
    }

    /// What the index knows of a workload.
    pub fn workload(
        &self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
    ) -> Option<&WorkloadInfo> {
        self.workloads
            .get(&(namespace.to_string(), kind, name.to_string()))
    }

    fn set_workload(&mut self, key: WorkloadKey, info: Option<WorkloadInfo>) {
        let changed = match info {
            Some(info) => self.workloads.insert(key.clone(), info.clone()) != Some(info),
            None => self.workloads.remove(&key).is_some(),
        };
        if changed {
            let names: Vec<String> = self
                .pods_of_workload
                .get(&key)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            self.refresh_pods(&key.0, names);
        }
    }

    /// Adds or updates a Deployment, StatefulSet or DaemonSet.
    pub fn apply_deployment(&mut self, d: &Deployment) {
        let sel = d.spec.selector.clone();
        self.apply_workload(
            &d.namespace().unwrap_or_default(),
            WorkloadKind::Deployment,
            &d.name_any(),
            &d.uid().unwrap_or_default(),
            sel,
        );
    }
    /// See [`Index::apply_deployment`].
    pub fn apply_statefulset(&mut self, s: &StatefulSet) {
        let sel = s.spec.selector.clone();
        self.apply_workload(
            &s.namespace().unwrap_or_default(),
            WorkloadKind::StatefulSet,
            &s.name_any(),
            &s.uid().unwrap_or_default(),
            sel,
        );
    }
    /// See [`Index::apply_deployment`].
    pub fn apply_daemonset(&mut self, d: &DaemonSet) {
        let sel = d.spec.selector.clone();
        self.apply_workload(
            &d.namespace().unwrap_or_default(),
            WorkloadKind::DaemonSet,
            &d.name_any(),
            &d.uid().unwrap_or_default(),
            sel,
        );
    }

    /// Adds or updates a Job. A Job made from a CronJob (see `cronjob_of`) makes its pods part of the
    /// CronJob; a Job of its own is the unit. Either way the selector is the Job's pod template labels
    /// without the per-run Job labels ([`without_run_labels`]): the CronJob's own object is not needed
    /// (`batch/v1` CronJobs do not exist on older API servers), and the Job's `spec.selector` (its
    /// `controller-uid`) would name this one run only.
    pub fn apply_job(&mut self, job: &Job) {
        let namespace = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let cronjob = cronjob_of(job.metadata.owner_references.as_ref());
        let template_labels = job
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.as_ref())
            .map(without_run_labels)
            .unwrap_or_default();
        let selector = LabelSelector {
            match_labels: Some(template_labels),
            match_expressions: None,
        };
        let (key, info) = match &cronjob {
            Some(c) => (
                (namespace.clone(), WorkloadKind::CronJob, c.name.clone()),
                WorkloadInfo {
                    uid: c.uid.clone(),
                    selector,
                    api_version: c.api_version.clone(),
                },
            ),
            None => (
                (namespace.clone(), WorkloadKind::Job, name.clone()),
                WorkloadInfo {
                    uid: job.uid().unwrap_or_default(),
                    selector,
                    api_version: "batch/v1".into(),
                },
            ),
        };
        self.set_workload(key, Some(info));
        let info = JobInfo {
            cronjob,
            deleted: false,
        };
        let job_key = (namespace.clone(), name);
        if self.jobs.insert(job_key.clone(), info.clone()) != Some(info) {
            let names: Vec<String> = self
                .pods_of_job
                .get(&job_key)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            self.refresh_pods(&namespace, names);
        }
    }

    /// Removes a Job (its CronJob, if any, stays known: its other runs still refer to it).
    pub fn delete_job(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(job) = self.jobs.get_mut(&key) else {
            return;
        };
        let standalone = job.cronjob.is_none();
        if self.pods_of_job.contains_key(&key) {
            job.deleted = true;
        } else {
            self.jobs.remove(&key);
        }
        if standalone {
            self.delete_workload(namespace, WorkloadKind::Job, name);
        }
    }

    /// Adds or updates a Service (by its ClusterIPs; headless Services have none and resolve as pods).
    pub fn apply_service(&mut self, svc: &Service) {
        let namespace = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        self.delete_service(&namespace, &name);
        let Some(spec) = svc.spec.as_ref() else {
            return;
        };
        let ips: Vec<IpAddr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let info = ServiceInfo {
            namespace: namespace.clone(),
            name: name.clone(),
            selector: spec.selector.clone().filter(|s| !s.is_empty()),
            ports: spec
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    Some(ServicePort {
                        port: u16::try_from(p.port).ok()?,
                        protocol: protocol(p.protocol.as_deref()),
                        target: p.target_port.clone().unwrap_or(IntOrString::Int(p.port)),
                        name: p.name.clone().unwrap_or_default(),
                    })
                })
                .collect(),
            ips,
        };
        let key = (namespace.clone(), name.clone());
        let has_selector = info.selector.is_some();
        for ip in &info.ips {
            self.service_ips.insert(*ip, key.clone());
        }
        let members: BTreeSet<String> = self
            .pods_in_namespace
            .get(&namespace)
            .into_iter()
            .flatten()
            .filter(|pod| {
                let pod_key = (namespace.clone(), (*pod).clone());
                self.pods
                    .get(&pod_key)
                    .is_some_and(|p| backs(&info, p, self.deleted.contains_key(&pod_key)))
            })
            .cloned()
            .collect();
        self.services_in_namespace
            .entry(namespace)
            .or_default()
            .insert(name);
        self.services.insert(key.clone(), info);
        self.backends.insert(
            key.clone(),
            Backends {
                pods: members,
                by_port: FastMap::default(),
            },
        );
        if has_selector {
            // Resolved through its pods: its Endpoints are not needed.
            self.store_endpoints(key.clone(), None);
        }
        self.recompute_backends(&key);
    }

    /// Removes a Service.
    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(old) = self.services.remove(&key) {
            for ip in &old.ips {
                if self.service_ips.get(ip) == Some(&key) {
                    self.service_ips.remove(ip);
                }
            }
        }
        self.backends.remove(&key);
        remove_from(&mut self.services_in_namespace, &key.0, name);
    }

    /// Adds or updates an Endpoints object. Kept only when its Service has no selector or is not indexed
    /// yet (the watches list in any order); a Service with a selector is resolved through its pods.
    pub fn apply_endpoints(&mut self, endpoints: &Endpoints) {
        let key = endpoints_key(endpoints);
        let kept = self.endpoints_kept(&key, endpoints);
        self.set_endpoints(key, kept);
    }

    /// Whether [`Index::apply_endpoints`] would change the index: the watch checks this under the read
    /// lock and takes the write lock only when it would (most Endpoints are of Services with a selector,
    /// or are leader-election records without addresses, updated every few seconds). Skipping an event
    /// that changes nothing is the same as applying it then, so a Service arriving later still finds
    /// what it would have.
    pub fn endpoints_change(&self, endpoints: &Endpoints) -> bool {
        let key = endpoints_key(endpoints);
        self.endpoints.get(&key) != self.endpoints_kept(&key, endpoints).as_ref()
    }

    /// Whether the index keeps the Endpoints `namespace`/`name` ([`Index::delete_endpoints`] changes
    /// nothing otherwise).
    pub fn holds_endpoints(&self, namespace: &str, name: &str) -> bool {
        self.endpoints
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// Removes an Endpoints object.
    pub fn delete_endpoints(&mut self, namespace: &str, name: &str) {
        self.set_endpoints((namespace.to_string(), name.to_string()), None);
    }

    /// What the index keeps of `endpoints` (of the Service `key`): its ready addresses and their ports,
    /// `None` when there are none or the Service has a selector.
    fn endpoints_kept(
        &self,
        key: &ServiceKey,
        endpoints: &Endpoints,
    ) -> Option<Vec<EndpointSubset>> {
        if self
            .services
            .get(key)
            .is_some_and(|svc| svc.selector.is_some())
        {
            return None;
        }
        let subsets: Vec<EndpointSubset> = endpoints
            .subsets
            .iter()
            .flatten()
            .map(|subset| EndpointSubset {
                // Not-ready addresses receive no traffic from kube-proxy.
                addresses: subset
                    .addresses
                    .iter()
                    .flatten()
                    .filter_map(|a| a.ip.parse().ok())
                    .collect(),
                ports: subset
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| {
                        Some((
                            p.name.clone().unwrap_or_default(),
                            u16::try_from(p.port).ok()?,
                            protocol(p.protocol.as_deref()),
                        ))
                    })
                    .collect(),
            })
            .filter(|subset| !subset.addresses.is_empty() && !subset.ports.is_empty())
            .collect();
        Some(subsets).filter(|s| !s.is_empty())
    }

    /// Sets (or with `None` removes) the kept Endpoints of the Service `key` and recomputes the
    /// Service's backends if they changed.
    fn set_endpoints(&mut self, key: ServiceKey, subsets: Option<Vec<EndpointSubset>>) {
        if self.store_endpoints(key.clone(), subsets) {
            self.recompute_backends(&key);
        }
    }

    /// Sets (or with `None` removes) the kept Endpoints of the Service `key`, keeping
    /// [`Index::endpoint_addresses`] in step; whether they changed.
    fn store_endpoints(&mut self, key: ServiceKey, subsets: Option<Vec<EndpointSubset>>) -> bool {
        if self.endpoints.get(&key) == subsets.as_ref() {
            return false;
        }
        let old = match subsets {
            Some(subsets) => {
                for ip in subsets.iter().flat_map(|s| &s.addresses) {
                    self.endpoint_addresses
                        .entry(*ip)
                        .or_default()
                        .insert(key.clone());
                }
                self.endpoints.insert(key.clone(), subsets)
            }
            None => self.endpoints.remove(&key),
        };
        for ip in old.iter().flatten().flat_map(|s| &s.addresses) {
            let listed = self
                .endpoints
                .get(&key)
                .is_some_and(|now| now.iter().any(|s| s.addresses.contains(ip)));
            if !listed {
                if let Some(services) = self.endpoint_addresses.get_mut(ip) {
                    services.remove(&key);
                    if services.is_empty() {
                        self.endpoint_addresses.remove(ip);
                    }
                }
            }
        }
        true
    }

    /// Adds or updates a node's addresses.
    pub fn apply_node(&mut self, node: &Node) {
        let name = node.name_any();
        let mut changed = self.remove_node(&name);
        for a in node
            .status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
        {
            if let Ok(ip) = a.address.parse() {
                self.nodes.insert(ip, name.clone());
                changed.push(ip);
            }
        }
        self.recompute_backends_at(changed);
    }

    /// Removes a node.
    pub fn delete_node(&mut self, name: &str) {
        let changed = self.remove_node(name);
        self.recompute_backends_at(changed);
    }

    /// Forgets the addresses of the node `name`; returns them.
    fn remove_node(&mut self, name: &str) -> Vec<IpAddr> {
        let mut removed = Vec::new();
        self.nodes.retain(|ip, n| {
            let keep = n != name;
            if !keep {
                removed.push(*ip);
            }
            keep
        });
        removed
    }

    /// Whether `ip:port` is an API server: a backend of the `default/kubernetes` Service (its
    /// Endpoints name the API servers), or that Service's ClusterIP itself.
    pub fn is_api_server(&self, ip: IpAddr, port: u16) -> bool {
        // Called per evaluated flow: the key is built once.
        static KUBERNETES: std::sync::LazyLock<ServiceKey> =
            std::sync::LazyLock::new(|| ("default".to_string(), "kubernetes".to_string()));
        let key = &*KUBERNETES;
        if self.service_ips.get(&ip) == Some(key) {
            return true;
        }
        self.backends.get(key).is_some_and(|b| {
            b.by_port.values().flatten().any(|(endpoint, p)| {
                *p == port
                    && match endpoint {
                        FlowEnd::Node { ip: at, .. }
                        | FlowEnd::External(at)
                        | FlowEnd::HostNetwork { ip: at, .. } => *at == ip,
                        FlowEnd::Workload(_) => false,
                    }
            })
        })
    }

    /// The pod that held `ip` at `at_ms` (or holds it now, for records newer than the last change).
    pub fn pod_at(&self, ip: IpAddr, at_ms: i64) -> Option<&PodRecord> {
        let leases = self.leases.get(&ip)?;
        let lease = leases
            .iter()
            .rev()
            .find(|l| l.since <= at_ms && l.until.is_none_or(|u| at_ms < u))
            .or_else(|| leases.iter().rev().find(|l| l.until.is_none()))?;
        Some(&lease.record)
    }

    /// A pod by namespace and name (also one deleted within [`IP_HISTORY_MS`]).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodRecord>> {
        self.pods.get_str(namespace, name)
    }

    /// The live pods of `namespace` whose generateName is `generate_name`, in name order.
    pub fn pods_generated_as<'a>(
        &'a self,
        namespace: &str,
        generate_name: &str,
    ) -> impl Iterator<Item = &'a Arc<PodRecord>> + 'a {
        self.pods_generated_as
            .get_key_value(&(namespace.to_string(), generate_name.to_string()))
            .into_iter()
            .flat_map(|((namespace, _), names)| names.iter().map(move |name| (namespace, name)))
            .filter(|(namespace, name)| self.pod_exists(namespace, name))
            .filter_map(|(namespace, name)| self.pod(namespace, name))
    }

    /// Whether workload `w` has a pod (live or recently deleted) on `node`.
    pub fn has_pod_on(&self, w: &WorkloadEndpoint, node: &str) -> bool {
        let on_node = |name: &str| {
            self.pod(&w.namespace, name)
                .is_some_and(|p| p.node.as_deref() == Some(node))
        };
        match w.kind {
            None => on_node(&w.name),
            Some(kind) => self
                .nodes_of_workload
                .contains(&w.namespace, kind, &w.name, node),
        }
    }

    /// Whether pod `namespace/name` exists (held, and not deleted).
    pub fn pod_exists(&self, namespace: &str, name: &str) -> bool {
        self.pod(namespace, name).is_some()
            && !self
                .deleted
                .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// The workload endpoint of a pod (borrowed: the evidence pass names both ends of every record).
    pub fn endpoint_of<'a>(&self, pod: &'a PodRecord) -> &'a WorkloadEndpoint {
        &pod.endpoint
    }

    /// Resolves a peer address and port as seen by a socket at `at_ms`: a pod IP, a Service ClusterIP
    /// (to its backends and the port each is reached on after DNAT: a selector's workloads and their
    /// container port, or the addresses of its Endpoints), a node IP, or external.
    pub fn resolve(&self, ip: IpAddr, port: u16, proto: Protocol, at_ms: i64) -> Resolved {
        self.resolve_ref(ip, port, proto, at_ms).to_owned()
    }

    /// [`Index::resolve`], borrowing from the index (no copies: the learning hot path).
    pub fn resolve_ref(
        &self,
        ip: IpAddr,
        port: u16,
        proto: Protocol,
        at_ms: i64,
    ) -> ResolvedRef<'_> {
        if let Some(pod) = self.pod_at(ip, at_ms) {
            return ResolvedRef::Pod(&pod.endpoint, port);
        }
        if let Some((key, svc)) = self
            .service_ips
            .get(&ip)
            .and_then(|k| Some((k, self.services.get(k)?)))
        {
            let backends = self
                .backends
                .get(key)
                .and_then(|b| b.by_port.get(&(port, proto)));
            return match backends {
                Some(b) if !b.is_empty() => ResolvedRef::Backends(b.as_slice()),
                _ => ResolvedRef::ServiceWithoutBackends(svc),
            };
        }
        ResolvedRef::Address(self.address_endpoint(ip, at_ms), port)
    }

    /// `pod` as one end of a flow whose other end is `peer`: its workload, or for a host-network pod
    /// [`FlowEnd::HostNetwork`] at its address of `peer`'s family (a host-network pod's IPs are its
    /// node's; its node's addresses stand in until the kubelet has reported them). `None` for a
    /// host-network pod with no address of that family yet.
    pub fn pod_endpoint(&self, pod: &PodRecord, peer: IpAddr) -> Option<FlowEnd> {
        if !pod.host_network {
            return Some(FlowEnd::Workload(pod.endpoint.clone()));
        }
        let node = pod.node.clone().unwrap_or_default();
        let same_family = |ip: &&IpAddr| ip.is_ipv4() == peer.is_ipv4();
        let ip = pod.ips.iter().find(same_family).copied().or_else(|| {
            // Few nodes, and only until the pod's IPs are known: a scan is fine.
            self.nodes
                .iter()
                .filter(|(_, name)| **name == node)
                .map(|(ip, _)| ip)
                .filter(same_family)
                .min()
                .copied()
        })?;
        Some(FlowEnd::HostNetwork {
            workload: pod.endpoint.clone(),
            ip,
            node,
        })
    }

    /// What an address that is no Service ClusterIP is at `at_ms`: the workload of the pod that held it,
    /// a node, or an outside address.
    fn address_endpoint(&self, ip: IpAddr, at_ms: i64) -> FlowEnd {
        if let Some(pod) = self.pod_at(ip, at_ms) {
            return FlowEnd::Workload(pod.endpoint.clone());
        }
        match self.nodes.get(&ip) {
            Some(node) => FlowEnd::Node {
                ip,
                name: node.clone(),
            },
            None => FlowEnd::External(ip),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T: i64 = 1_000_000;

    fn pod(name: &str, ip: &str, labels: serde_json::Value, owner: Option<(&str, &str)>) -> Pod {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": labels});
        if let Some((kind, owner_name)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": if kind == "Job" { "batch/v1" } else { "apps/v1" },
                "kind": kind, "name": owner_name, "uid": format!("uid-{owner_name}"), "controller": true}]);
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"serviceAccountName": "sa", "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": if name.starts_with("new") { 9090 } else { 8080 }}]}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
    }

    fn deployment_pod(name: &str, ip: &str, app: &str) -> Pod {
        pod(
            name,
            ip,
            json!({"app": app, "pod-template-hash": "h"}),
            Some(("ReplicaSet", &format!("{app}-h"))),
        )
    }

    fn service(selector: serde_json::Value, target: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.1", "selector": selector,
                     "ports": [{"port": 80, "targetPort": target}]}
        }))
        .unwrap()
    }

    fn deployment(name: &str, selector: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-deploy-{name}")},
            "spec": {"selector": {"matchLabels": selector}, "template": {}}
        }))
        .unwrap()
    }

    fn backends(ix: &Index) -> Vec<(String, u16)> {
        match ix.resolve("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T) {
            Resolved::Backends(b) => b
                .into_iter()
                .map(|(e, p)| match e {
                    FlowEnd::Workload(w) => (w.name.clone(), p),
                    other => panic!("not a workload: {other:?}"),
                })
                .collect(),
            _ => vec![],
        }
    }

    /// Whether `w` has a pod on `node`, by scanning every pod (live or recently deleted): the
    /// reference [`Index::has_pod_on`]'s per-node counts must agree with.
    fn scanned_on_node(ix: &Index, w: &WorkloadEndpoint, node: &str) -> bool {
        ix.pods.values().any(|p| {
            p.namespace == w.namespace
                && p.node.as_deref() == Some(node)
                && match w.kind {
                    None => p.name == w.name,
                    Some(kind) => p
                        .owner
                        .as_ref()
                        .is_some_and(|o| o.kind == kind && o.name == w.name),
                }
        })
    }

    /// A lookup by address hands out the pod's record as the index holds it, after every kind of
    /// change to the pod or its workload (the lease keeps its own reference to it).
    #[test]
    fn an_address_finds_the_pods_current_record() {
        let mut ix = Index::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap());
        let same = |ix: &Index, ip: IpAddr, at: i64| {
            let by_name: *const PodRecord = &**ix.pod("ns", "web-1").expect("indexed");
            ix.pod_at(ip, at).is_some_and(|p| std::ptr::eq(p, by_name))
        };
        ix.apply_pod(&deployment_pod("web-1", "10.0.0.5", "web"), T);
        assert!(same(&ix, a, T));
        // Its labels change.
        let mut relabelled = deployment_pod("web-1", "10.0.0.5", "web");
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "front".into());
        ix.apply_pod(&relabelled, T + 1);
        assert!(same(&ix, a, T + 1));
        assert_eq!(
            ix.pod_at(a, T + 1)
                .unwrap()
                .labels
                .get("tier")
                .map(String::as_str),
            Some("front")
        );
        // Its workload arrives: the pod's owner and endpoint are computed again.
        let before = ix.pod("ns", "web-1").unwrap().clone();
        ix.apply_deployment(&deployment("web", json!({"app": "web"})));
        assert!(
            !Arc::ptr_eq(&before, ix.pod("ns", "web-1").unwrap()),
            "a new record"
        );
        assert!(same(&ix, a, T + 2));
        // A new address: a late record for the old one still finds the pod as it is now.
        ix.apply_pod(&deployment_pod("web-1", "10.0.0.6", "web"), T + 3);
        assert!(same(&ix, b, T + 3) && same(&ix, a, T + 2));
        // Deleted, then made again under the same name (a StatefulSet's pod) with the same address.
        ix.delete_pod("ns", "web-1", T + 4);
        assert!(same(&ix, b, T + 3));
        ix.apply_pod(&deployment_pod("web-1", "10.0.0.6", "web"), T + 5);
        assert!(same(&ix, b, T + 5) && same(&ix, b, T + 3));
        // The address it gave up two changes ago keeps the record of then.
        assert_eq!(ix.pod_at(a, T + 2).map(|p| p.name.as_str()), Some("web-1"));
    }

    #[test]
    fn has_pod_on_follows_pods_moving_leaving_and_expiring() {
        let on = |name: &str, ip: &str, app: &str, node: &str| {
            let mut p = deployment_pod(name, ip, app);
            p.spec.as_mut().unwrap().node_name = Some(node.into());
            p
        };
        let mut bare = pod("bare", "10.0.0.9", json!({"app": "bare"}), None);
        bare.spec.as_mut().unwrap().node_name = Some("n1".into());
        let mut ix = Index::default();
        // Every workload and bare pod seen so far, asked about every node after every step.
        let mut endpoints: Vec<Arc<WorkloadEndpoint>> = Vec::new();
        let mut check = |ix: &Index, step: &str, expected_on: &[(&str, &str)]| {
            for p in ix.pods.values() {
                if !endpoints.iter().any(|e| **e == *p.endpoint) {
                    endpoints.push(p.endpoint.clone());
                }
            }
            for w in &endpoints {
                for node in ["n1", "n2", "n3"] {
                    let expected = scanned_on_node(ix, w, node);
                    assert_eq!(
                        ix.has_pod_on(w, node),
                        expected,
                        "{step}: {}/{} on {node}",
                        w.namespace,
                        w.name
                    );
                    assert_eq!(
                        expected,
                        expected_on.contains(&(w.name.as_str(), node)),
                        "{step}: the reference disagrees with the test for {} on {node}",
                        w.name
                    );
                }
            }
        };
        ix.apply_pod(&on("web-1", "10.0.0.1", "web", "n1"), T);
        ix.apply_pod(&on("web-2", "10.0.0.2", "web", "n2"), T);
        ix.apply_pod(&on("db-1", "10.0.0.3", "db", "n2"), T);
        ix.apply_pod(&bare, T);
        check(
            &ix,
            "placed",
            &[("web", "n1"), ("web", "n2"), ("db", "n2"), ("bare", "n1")],
        );
        // A Deployment seen later changes its pods' endpoint (its uid and selector): relinked.
        ix.apply_deployment(&deployment("web", json!({"app": "web"})));
        check(
            &ix,
            "deployment seen",
            &[("web", "n1"), ("web", "n2"), ("db", "n2"), ("bare", "n1")],
        );
        // A pod re-applied on another node moves; two pods on one node count once each.
        ix.apply_pod(&on("web-2", "10.0.0.2", "web", "n1"), T + 1);
        ix.apply_pod(&on("db-2", "10.0.0.4", "db", "n2"), T + 1);
        check(&ix, "moved", &[("web", "n1"), ("db", "n2"), ("bare", "n1")]);
        // A deleted pod still counts for its IP history, then no more.
        ix.delete_pod("ns", "db-1", T + 2);
        check(
            &ix,
            "db-1 deleted",
            &[("web", "n1"), ("db", "n2"), ("bare", "n1")],
        );
        ix.delete_pod("ns", "db-2", T + 2);
        ix.delete_pod("ns", "bare", T + 2);
        check(
            &ix,
            "db deleted",
            &[("web", "n1"), ("db", "n2"), ("bare", "n1")],
        );
        ix.forget_expired(T + 3 + IP_HISTORY_MS);
        check(&ix, "expired", &[("web", "n1")]);
        assert!(
            ix.nodes_of_workload
                .0
                .get("ns")
                .is_some_and(|names| names.len() == 1),
            "emptied entries are dropped: {:?}",
            ix.nodes_of_workload
        );
    }

    /// Resolution of a ClusterIP by scanning every pod, as the index did before keeping backends: the
    /// reference the kept backends must agree with.
    fn scanned(ix: &Index, port: u16) -> Vec<(String, u16)> {
        let svc = ix.services.values().next().unwrap();
        let sp = svc.ports.iter().find(|p| p.port == port).unwrap();
        let mut out: BTreeSet<(String, u16)> = BTreeSet::new();
        for pod in ix.pods.values() {
            let key = (pod.namespace.clone(), pod.name.clone());
            if backs(svc, pod, ix.deleted.contains_key(&key)) {
                if let Some(p) = container_port(&sp.target, pod, sp.protocol) {
                    out.insert((pod.endpoint.name.clone(), p));
                }
            }
        }
        out.into_iter().collect()
    }

    #[test]
    fn service_backends_follow_pods_in_any_order() {
        let mut ix = Index::default();
        ix.apply_service(&service(json!({"tier": "web"}), json!("http")));
        assert_eq!(backends(&ix), vec![], "no backend yet");
        assert!(matches!(
            ix.resolve("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T),
            Resolved::ServiceWithoutBackends { .. }
        ));
        let mut a = deployment_pod("a-h-1", "10.0.0.1", "a");
        a.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "web".into());
        ix.apply_pod(&a, T);
        assert_eq!(backends(&ix), [("a".to_string(), 8080)]);
        // A second workload whose pods name the port differently: each backend on its own port.
        let mut b = deployment_pod("new-b-h-1", "10.0.0.2", "b");
        b.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "web".into());
        ix.apply_pod(&b, T);
        assert_eq!(
            backends(&ix),
            [("a".to_string(), 8080), ("b".to_string(), 9090)]
        );
        assert_eq!(backends(&ix), scanned(&ix, 80));
        // A relabelled pod leaves; a deleted pod leaves.
        b.metadata.labels.as_mut().unwrap().remove("tier");
        ix.apply_pod(&b, T + 1);
        assert_eq!(backends(&ix), [("a".to_string(), 8080)]);
        ix.delete_pod("ns", "a-h-1", T + 2);
        assert_eq!(backends(&ix), vec![]);
        assert_eq!(backends(&ix), scanned(&ix, 80));
        // Re-applying the Service keeps what the pods say.
        b.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "web".into());
        ix.apply_pod(&b, T + 3);
        ix.apply_service(&service(json!({"tier": "web"}), json!(80)));
        assert_eq!(backends(&ix), [("b".to_string(), 80)]);
        ix.delete_service("ns", "web");
        assert!(matches!(
            ix.resolve("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T),
            Resolved::Address(FlowEnd::External(_), 80)
        ));
    }

    /// A compact description of what an address resolves to, for table tests.
    fn described(resolved: Resolved) -> Vec<String> {
        let name = |e: &FlowEnd| match e {
            FlowEnd::Workload(w) => format!("workload {}", w.name),
            FlowEnd::HostNetwork { workload, ip, node } => {
                format!("host network {} on {node} {ip}", workload.name)
            }
            FlowEnd::Node { ip, name } => format!("node {name} {ip}"),
            FlowEnd::External(ip) => format!("external {ip}"),
        };
        match resolved {
            Resolved::Backends(b) => b.iter().map(|(e, p)| format!("{}:{p}", name(e))).collect(),
            Resolved::Address(e, p) => vec![format!("address {}:{p}", name(&e))],
            Resolved::ServiceWithoutBackends { name, .. } => vec![format!("no backend in {name}")],
        }
    }

    fn endpoints(namespace: &str, name: &str, subsets: serde_json::Value) -> Endpoints {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace},
                                      "subsets": subsets}))
        .unwrap()
    }

    #[test]
    fn services_without_a_selector_resolve_through_their_endpoints() {
        let mut ix = Index::default();
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.244.0.1"}]}}))
        .unwrap();
        ix.apply_node(&node);
        ix.apply_pod(&deployment_pod("db-h-1", "10.0.0.5", "db"), T);
        // The Endpoints may be listed before their Service.
        ix.apply_endpoints(&endpoints(
            "default",
            "kubernetes",
            json!([{"addresses": [{"ip": "10.244.0.1"}], "notReadyAddresses": [{"ip": "10.244.0.9"}],
                    "ports": [{"name": "https", "port": 16443}]}]),
        ));
        let kubernetes: Service = serde_json::from_value(json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "targetPort": 16443}]}
        }))
        .unwrap();
        ix.apply_service(&kubernetes);
        let multi: Service = serde_json::from_value(json!({
            "metadata": {"name": "multi", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.2", "ports": [
                {"name": "a", "port": 80}, {"name": "b", "port": 81, "protocol": "UDP"}]}
        }))
        .unwrap();
        ix.apply_service(&multi);
        ix.apply_endpoints(&endpoints(
            "ns",
            "multi",
            json!([{"addresses": [{"ip": "10.0.0.5"}, {"ip": "192.0.2.7"}],
                    "ports": [{"name": "a", "port": 8080}, {"name": "b", "port": 8081, "protocol": "UDP"}]},
                   {"addresses": [{"ip": "198.51.100.1"}], "ports": [{"name": "a", "port": 9090}]}]),
        ));
        let cases: [(&str, u16, Protocol, &[&str]); 6] = [
            // The API server behind the `kubernetes` Service: its node address, on the endpoint port
            // (the not-ready address receives nothing).
            (
                "10.96.0.1",
                443,
                Protocol::TCP,
                &["node n1 10.244.0.1:16443"],
            ),
            // A direct call to the same address learns the same.
            (
                "10.244.0.1",
                16443,
                Protocol::TCP,
                &["address node n1 10.244.0.1:16443"],
            ),
            (
                "10.96.0.1",
                80,
                Protocol::TCP,
                &["no backend in kubernetes"],
            ),
            // Ports pair by name and protocol; a pod address is its workload.
            (
                "10.96.0.2",
                80,
                Protocol::TCP,
                &[
                    "workload db:8080",
                    "external 192.0.2.7:8080",
                    "external 198.51.100.1:9090",
                ],
            ),
            (
                "10.96.0.2",
                81,
                Protocol::UDP,
                &["workload db:8081", "external 192.0.2.7:8081"],
            ),
            ("10.96.0.2", 81, Protocol::TCP, &["no backend in multi"]),
        ];
        for (ip, port, proto, expected) in cases {
            assert_eq!(
                described(ix.resolve(ip.parse().unwrap(), port, proto, T)),
                expected,
                "{ip}:{port}/{proto:?}"
            );
        }

        // The protect gate's API-server test: the endpoint on its port, and the ClusterIP.
        let api = |ip: &str, port| ix.is_api_server(ip.parse().unwrap(), port);
        assert!(api("10.244.0.1", 16443) && api("10.96.0.1", 443));
        assert!(!api("10.244.0.1", 22) && !api("192.0.2.7", 8080) && !api("10.0.0.5", 16443));

        // Only selector-less Services' Endpoints are kept: a Service that gets a selector drops them,
        // and the Endpoints of a Service with one are not stored at all.
        assert_eq!(ix.endpoints.len(), 2);
        let mut selected = multi.clone();
        selected.spec.as_mut().unwrap().selector =
            Some(BTreeMap::from([("app".into(), "db".into())]));
        ix.apply_service(&selected);
        ix.apply_endpoints(&endpoints(
            "ns",
            "multi",
            json!([{"addresses": [{"ip": "192.0.2.7"}], "ports": [{"name": "a", "port": 8080}]}]),
        ));
        assert_eq!(ix.endpoints.len(), 1);
        assert_eq!(
            described(ix.resolve("10.96.0.2".parse().unwrap(), 80, Protocol::TCP, T)),
            ["workload db:80"],
            "resolved through its pods"
        );
        ix.delete_endpoints("default", "kubernetes");
        assert_eq!(
            described(ix.resolve("10.96.0.1".parse().unwrap(), 443, Protocol::TCP, T)),
            ["no backend in kubernetes"]
        );
        assert!(ix.endpoints.is_empty());
    }

    #[test]
    fn a_selector_less_services_backends_follow_its_endpoints_and_what_is_at_their_addresses() {
        let mut ix = Index::default();
        let ext: Service = serde_json::from_value(json!({
            "metadata": {"name": "ext", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.3", "ports": [{"port": 80}]}
        }))
        .unwrap();
        ix.apply_service(&ext);
        let at = |ip: &str| {
            endpoints(
                "ns",
                "ext",
                json!([{"addresses": [{"ip": ip}], "ports": [{"port": 8080}]}]),
            )
        };
        let resolved =
            |ix: &Index| described(ix.resolve("10.96.0.3".parse().unwrap(), 80, Protocol::TCP, T));
        assert!(ix.endpoints_change(&at("10.0.0.7")));
        ix.apply_endpoints(&at("10.0.0.7"));
        assert!(
            !ix.endpoints_change(&at("10.0.0.7")),
            "the same again changes nothing"
        );
        assert_eq!(resolved(&ix), ["external 10.0.0.7:8080"]);

        // A pod taking the address, its workload changing, the pod leaving it.
        ix.apply_pod(&deployment_pod("db-h-1", "10.0.0.7", "db"), T);
        assert_eq!(resolved(&ix), ["workload db:8080"]);
        ix.apply_deployment(&deployment("db", json!({"app": "db"})));
        let endpoint = ix.pod("ns", "db-h-1").unwrap().endpoint.clone();
        assert_eq!(endpoint.uid.as_deref(), Some("uid-deploy-db"));
        let first = match ix.resolve_ref("10.96.0.3".parse().unwrap(), 80, Protocol::TCP, T) {
            ResolvedRef::Backends(b) => {
                assert!(matches!(&b[0].0, FlowEnd::Workload(w) if Arc::ptr_eq(w, &endpoint)));
                b.as_ptr()
            }
            other => panic!("{other:?}"),
        };
        match ix.resolve_ref("10.96.0.3".parse().unwrap(), 80, Protocol::TCP, T + 1) {
            ResolvedRef::Backends(b) => assert_eq!(b.as_ptr(), first, "borrowed from the index"),
            other => panic!("{other:?}"),
        }
        ix.delete_pod("ns", "db-h-1", T + 2);
        assert_eq!(resolved(&ix), ["external 10.0.0.7:8080"]);
        ix.apply_pod(&deployment_pod("db-h-2", "10.0.0.7", "db"), T + 3);
        assert_eq!(resolved(&ix), ["workload db:8080"]);
        ix.delete_pod("ns", "db-h-2", T + 4);

        // A node gaining and losing the address.
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}}))
        .unwrap();
        ix.apply_node(&node);
        assert_eq!(resolved(&ix), ["node n1 10.0.0.7:8080"]);
        ix.delete_node("n1");
        assert_eq!(resolved(&ix), ["external 10.0.0.7:8080"]);

        // The Endpoints moving to another address: what is at the old one no longer matters.
        ix.apply_endpoints(&at("10.0.0.8"));
        assert_eq!(resolved(&ix), ["external 10.0.0.8:8080"]);
        assert_eq!(
            ix.endpoint_addresses.keys().collect::<Vec<_>>(),
            [&"10.0.0.8".parse::<IpAddr>().unwrap()]
        );
        ix.apply_node(&node);
        assert_eq!(resolved(&ix), ["external 10.0.0.8:8080"]);
        ix.apply_pod(&deployment_pod("db-h-3", "10.0.0.8", "db"), T + 5);
        assert_eq!(resolved(&ix), ["workload db:8080"]);

        // Removed Endpoints leave no backend and nothing to follow; removing them again changes nothing.
        assert!(ix.holds_endpoints("ns", "ext"));
        ix.delete_endpoints("ns", "ext");
        assert_eq!(resolved(&ix), ["no backend in ext"]);
        assert!(!ix.holds_endpoints("ns", "ext"));
        assert!(ix.endpoint_addresses.is_empty());

        // The Endpoints of a Service with a selector, and ones without ready addresses, change nothing.
        ix.apply_service(&service(json!({"app": "db"}), json!(8080)));
        let selected = endpoints(
            "ns",
            "web",
            json!([{"addresses": [{"ip": "10.0.0.8"}], "ports": [{"port": 8080}]}]),
        );
        assert!(!ix.endpoints_change(&selected));
        let leader = endpoints("kube-system", "kube-scheduler", json!(null));
        assert!(!ix.endpoints_change(&leader));
    }

    #[test]
    fn terminated_pods_back_no_service() {
        let mut ix = Index::default();
        ix.apply_service(&service(json!({"app": "a"}), json!(8080)));
        let mut a = deployment_pod("a-h-1", "10.0.0.1", "a");
        ix.apply_pod(&a, T);
        assert_eq!(backends(&ix).len(), 1);
        a.status.as_mut().unwrap().phase = Some("Succeeded".into());
        ix.apply_pod(&a, T + 1);
        assert_eq!(backends(&ix), vec![]);
    }

    #[test]
    fn a_workload_change_reaches_its_pods_and_service_backends() {
        let mut ix = Index::default();
        ix.apply_service(&service(json!({"app": "a"}), json!(8080)));
        ix.apply_pod(&deployment_pod("a-h-1", "10.0.0.1", "a"), T);
        ix.apply_pod(&deployment_pod("a-h-2", "10.0.0.2", "a"), T);
        let before = ix.pod("ns", "a-h-1").unwrap().endpoint.clone();
        assert_eq!(before.uid, None, "the Deployment is not known yet");
        assert!(
            before.selector.contains_key("pod-template-hash"),
            "until then the pod's labels stand for the selector"
        );
        ix.apply_deployment(&deployment("a", json!({"app": "a"})));
        let after = ix.pod("ns", "a-h-1").unwrap().endpoint.clone();
        assert_eq!(after.uid.as_deref(), Some("uid-deploy-a"));
        assert_eq!(after.selector, BTreeMap::from([("app".into(), "a".into())]));
        assert!(
            Arc::ptr_eq(&after, &ix.pod("ns", "a-h-2").unwrap().endpoint),
            "the pods of one workload share one endpoint"
        );
        match ix.resolve_ref("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T) {
            ResolvedRef::Backends(b) => {
                assert!(matches!(&b[0].0, FlowEnd::Workload(w) if Arc::ptr_eq(w, &after)))
            }
            other => panic!("{other:?}"),
        }
        ix.delete_workload("ns", WorkloadKind::Deployment, "a");
        assert_eq!(ix.pod("ns", "a-h-1").unwrap().endpoint.uid, None);
    }

    fn job(name: &str, cronjob: Option<&str>, template_labels: serde_json::Value) -> Job {
        job_with_owner(
            name,
            cronjob.map(|c| ("CronJob", c, Some(true))),
            template_labels,
        )
    }

    /// A Job's ownerReference: `(kind, name, controller)`.
    type JobOwner<'a> = (&'a str, &'a str, Option<bool>);

    /// A Job with one ownerReference.
    fn job_with_owner(
        name: &str,
        owner: Option<JobOwner>,
        template_labels: serde_json::Value,
    ) -> Job {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}")});
        if let Some((kind, owner_name, controller)) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "batch/v1beta1", "kind": kind,
                "name": owner_name, "uid": format!("uid-{owner_name}"), "controller": controller}]);
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"selector": {"matchLabels": {"controller-uid": format!("uid-{name}")}},
                     "template": {"metadata": {"labels": template_labels}, "spec": {"containers": []}}}
        }))
        .unwrap()
    }

    fn job_pod(name: &str, job: &str, ip: &str) -> Pod {
        pod(
            name,
            ip,
            json!({"app": "backup", "controller-uid": format!("uid-{job}"), "job-name": job}),
            Some(("Job", job)),
        )
    }

    #[test]
    fn jobs_of_a_cronjob_are_the_cronjob_whatever_the_order() {
        let mut ix = Index::default();
        // The pod of the first run arrives before its Job: a Job for now, selected by its labels
        // without the per-run ones.
        ix.apply_pod(&job_pod("backup-100-x", "backup-100", "10.0.0.5"), T);
        let e = ix.pod("ns", "backup-100-x").unwrap().endpoint.clone();
        assert_eq!(
            (
                e.kind,
                e.name.as_str(),
                e.uid.as_deref(),
                e.api_version.as_str()
            ),
            (
                Some(WorkloadKind::Job),
                "backup-100",
                Some("uid-backup-100"),
                "batch/v1"
            )
        );
        assert_eq!(
            e.selector,
            BTreeMap::from([("app".into(), "backup".into())])
        );
        let labels = json!({"app": "backup", "controller-uid": "x", "job-name": "x"});
        ix.apply_job(&job("backup-100", Some("backup"), labels.clone()));
        ix.apply_job(&job("backup-160", Some("backup"), labels));
        ix.apply_pod(&job_pod("backup-160-y", "backup-160", "10.0.0.6"), T);
        for pod in ["backup-100-x", "backup-160-y"] {
            let e = ix.pod("ns", pod).unwrap().endpoint.clone();
            assert_eq!(
                (
                    e.kind,
                    e.name.as_str(),
                    e.uid.as_deref(),
                    e.api_version.as_str()
                ),
                (
                    Some(WorkloadKind::CronJob),
                    "backup",
                    Some("uid-backup"),
                    "batch/v1beta1"
                ),
                "{pod}"
            );
            assert_eq!(
                e.selector,
                BTreeMap::from([("app".into(), "backup".into())]),
                "template labels without the per-run ones"
            );
        }
        assert_eq!(
            ix.pod("ns", "backup-100-x").unwrap().owner,
            Some(Workload {
                kind: WorkloadKind::CronJob,
                name: "backup".into()
            })
        );
        // The history limit deletes the Job first; its pod's last updates still belong to the CronJob.
        ix.delete_job("ns", "backup-100");
        let mut dying = job_pod("backup-100-x", "backup-100", "10.0.0.5");
        dying.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        ix.apply_pod(&dying, T + 1);
        assert_eq!(
            ix.pod("ns", "backup-100-x").unwrap().endpoint.kind,
            Some(WorkloadKind::CronJob)
        );
        ix.delete_pod("ns", "backup-100-x", T + 2);
        ix.forget_expired(T + 3 + IP_HISTORY_MS);
        assert!(ix.pod("ns", "backup-100-x").is_none());
        assert!(
            !ix.jobs
                .contains_key(&("ns".to_string(), "backup-100".to_string())),
            "forgotten with its last pod"
        );
    }

    #[test]
    fn a_job_of_its_own_is_the_unit_and_a_cronjob_without_labels_is_unselectable() {
        let mut ix = Index::default();
        ix.apply_job(&job(
            "migrate",
            None,
            json!({"app": "backup", "controller-uid": "uid-migrate", "job-name": "migrate"}),
        ));
        ix.apply_pod(&job_pod("migrate-z", "migrate", "10.0.0.7"), T);
        let e = ix.pod("ns", "migrate-z").unwrap().endpoint.clone();
        assert_eq!(
            (e.kind, e.name.as_str(), e.uid.as_deref()),
            (Some(WorkloadKind::Job), "migrate", Some("uid-migrate"))
        );
        assert_eq!(
            e.selector,
            BTreeMap::from([("app".into(), "backup".into())]),
            "its template labels, not its controller-uid"
        );
        assert!(e.selectable());
        ix.delete_job("ns", "migrate");
        assert!(ix.workload("ns", WorkloadKind::Job, "migrate").is_none());

        // Only per-run labels: nothing selects every run, so no selector at all.
        ix.apply_job(&job("tick-1", Some("tick"), json!({"job-name": "tick-1"})));
        ix.apply_job(&job("once", None, json!({"controller-uid": "uid-once"})));
        for (pod, job, ip, kind) in [
            ("tick-1-a", "tick-1", "10.0.0.8", WorkloadKind::CronJob),
            ("once-a", "once", "10.0.0.9", WorkloadKind::Job),
        ] {
            let mut p = job_pod(pod, job, ip);
            p.metadata.labels.as_mut().unwrap().remove("app");
            ix.apply_pod(&p, T);
            let e = ix.pod("ns", pod).unwrap().endpoint.clone();
            assert_eq!(e.kind, Some(kind), "{pod}");
            assert!(
                !e.selectable(),
                "{pod}: no label shared by all runs: nothing selects exactly its pods"
            );
        }
    }

    /// Which workload a Job's pod belongs to, by the Job's ownerReference, and its selector: never a
    /// per-run label, whoever made the Job.
    #[test]
    fn a_jobs_pods_belong_to_its_cronjob_however_the_reference_is_marked() {
        let labels = json!({"app": "report", "controller-uid": "uid-run", "job-name": "run",
                            "batch.kubernetes.io/controller-uid": "uid-run",
                            "batch.kubernetes.io/job-name": "run"});
        let cases: [(&str, Option<JobOwner>, WorkloadKind, &str); 5] = [
            // The CronJob controller's scheduled run.
            (
                "scheduled",
                Some(("CronJob", "report", Some(true))),
                WorkloadKind::CronJob,
                "report",
            ),
            // `kubectl create job --from=cronjob/report` (v1.20): no `controller` field...
            (
                "manual",
                Some(("CronJob", "report", None)),
                WorkloadKind::CronJob,
                "report",
            ),
            // ... or `controller: false`.
            (
                "manual-false",
                Some(("CronJob", "report", Some(false))),
                WorkloadKind::CronJob,
                "report",
            ),
            // Made by something else, or by nobody: a Job of its own.
            (
                "operator",
                Some(("Workflow", "wf", Some(true))),
                WorkloadKind::Job,
                "operator",
            ),
            ("plain", None, WorkloadKind::Job, "plain"),
        ];
        for (name, owner, kind, workload) in cases {
            let mut ix = Index::default();
            ix.apply_job(&job_with_owner(name, owner, labels.clone()));
            let mut pod = job_pod(&format!("{name}-x"), name, "10.0.0.5");
            pod.metadata.labels = serde_json::from_value(labels.clone()).unwrap();
            ix.apply_pod(&pod, T);
            let e = ix.pod("ns", &format!("{name}-x")).unwrap().endpoint.clone();
            assert_eq!((e.kind, e.name.as_str()), (Some(kind), workload), "{name}");
            assert_eq!(
                e.selector,
                BTreeMap::from([("app".into(), "report".into())]),
                "{name}: no per-run label"
            );
        }
    }

    #[test]
    fn run_labels_are_left_out_and_cronjob_references_found() {
        let labels: BTreeMap<String, String> = serde_json::from_value(json!({
            "app": "a", "tier": "batch", "controller-uid": "u", "job-name": "j",
            "batch.kubernetes.io/controller-uid": "u", "batch.kubernetes.io/job-name": "j"
        }))
        .unwrap();
        assert_eq!(
            without_run_labels(&labels),
            BTreeMap::from([("app".into(), "a".into()), ("tier".into(), "batch".into())])
        );
        let reference = |kind: &str, name: &str, controller: Option<bool>| {
            serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>(
                json!({"apiVersion": "batch/v1beta1", "kind": kind, "name": name, "uid": format!("uid-{name}"),
                       "controller": controller}),
            )
            .unwrap()
        };
        let cases = [
            (vec![], None),
            (vec![reference("CronJob", "c", Some(true))], Some("c")),
            (vec![reference("CronJob", "c", None)], Some("c")),
            (vec![reference("CronJob", "c", Some(false))], Some("c")),
            (vec![reference("Workflow", "w", Some(true))], None),
            (
                vec![
                    reference("CronJob", "other", None),
                    reference("CronJob", "c", Some(true)),
                ],
                Some("c"),
            ),
        ];
        for (refs, expected) in cases {
            assert_eq!(
                cronjob_of(Some(&refs)).map(|r| r.name),
                expected.map(String::from),
                "{refs:?}"
            );
        }
        assert_eq!(cronjob_of(None), None);
    }

    #[test]
    fn a_bare_pod_is_its_own_unit() {
        let mut ix = Index::default();
        ix.apply_pod(&pod("debug", "10.0.0.9", json!({"run": "debug"}), None), T);
        let e = ix.pod("ns", "debug").unwrap().endpoint.clone();
        assert_eq!(
            (
                e.kind,
                e.name.as_str(),
                e.uid.as_deref(),
                e.api_version.as_str()
            ),
            (None, "debug", Some("uid-debug"), "v1")
        );
        assert_eq!(e.selector, BTreeMap::from([("run".into(), "debug".into())]));
        ix.apply_pod(&pod("naked", "10.0.0.10", json!({}), None), T);
        assert!(!ix.pod("ns", "naked").unwrap().endpoint.selectable());
        // A pod of a controller the index does not resolve is no bare pod.
        ix.apply_pod(
            &pod(
                "rs-1",
                "10.0.0.11",
                json!({"app": "x"}),
                Some(("ReplicaSet", "rs")),
            ),
            T,
        );
        let e = ix.pod("ns", "rs-1").unwrap().endpoint.clone();
        assert_eq!(
            (e.kind, e.foreign_controller.as_deref(), e.uid.as_deref()),
            (None, Some("ReplicaSet"), None)
        );
    }

    #[test]
    fn the_interner_forgets_endpoints_nobody_holds() {
        let mut ix = Index::default();
        for i in 0..1_000 {
            let name = format!("p{i}");
            ix.apply_pod(
                &pod(&name, "10.0.0.1", json!({"i": i.to_string()}), None),
                T,
            );
            ix.delete_pod("ns", &name, T);
        }
        ix.forget_expired(T + IP_HISTORY_MS + 1);
        assert_eq!(ix.pod_count(), 0);
        ix.apply_pod(
            &pod("last", "10.0.0.1", json!({}), None),
            T + IP_HISTORY_MS + 2,
        );
        assert!(ix.interned.len() < 300, "{} interned", ix.interned.len());
    }
}
