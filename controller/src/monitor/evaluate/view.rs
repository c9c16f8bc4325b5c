//! The cluster as the evaluators see it: namespaces with labels, pods with labels, IPs and named
//! container ports, and the NetworkPolicies in force per namespace. Plain data, filled by the caller
//! (the controller's index, the `check` command's scenario file, a test), and a flow to evaluate.

use super::compiled::PolicyIndex;
use crate::FastMap;
use crate::cluster::workload::{JobOwners, Workload};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use network_enforcer_api::cluster_network_policy::{
    ClusterNetworkPolicy, ClusterNetworkPolicySpec,
};
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use network_enforcer_api::{Protocol, WorkloadKind};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::OnceLock;

/// Kubernetes labels of a pod or a namespace.
pub type Labels = BTreeMap<String, String>;

/// A pod's identity in the cluster: namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    /// The key of pod `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        PodKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A container port of a pod; named ones are what NetworkPolicy named ports resolve to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPort {
    /// The port's name (an IANA service name such as `http`), if it has one.
    pub name: Option<String>,
    pub port: u16,
    pub protocol: Protocol,
}

/// What the evaluators need to know about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    /// The pod's IPs (one per family). An ipBlock peer matches the pod when it matches any of them
    /// (a flow does not say which family it used); see [`ClusterView::set_ip_blocks_match_pods`].
    pub ips: Vec<IpAddr>,
    /// The container ports the pod declares, used to resolve named ports.
    pub ports: Vec<ContainerPort>,
    /// The workload the pod belongs to ([`crate::cluster::workload::unit_of`]); `None` for a bare pod
    /// (its own unit) and a pod of a controller we do not resolve.
    pub workload: Option<Workload>,
}

impl PodInfo {
    /// The pod's key.
    pub fn key(&self) -> PodKey {
        PodKey::new(&self.namespace, &self.name)
    }

    /// What the evaluators need from a Pod object: its IPs (`status.podIPs`, else `status.podIP`),
    /// every container's declared ports (protocol TCP when unset; SCTP and UDP as declared; unknown
    /// protocols and out-of-range numbers skipped), and its workload (a Job's CronJob looked up in
    /// `jobs`), as the controller's index has them. `None` without a name or namespace.
    pub fn from_pod(pod: &Pod, jobs: &JobOwners) -> Option<Self> {
        let ips = network_enforcer_api::pod::ips(pod);
        let ports = pod
            .spec
            .iter()
            .flat_map(|spec| spec.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let protocol = Protocol::from_kubernetes(p.protocol.as_deref())?;
                Some(ContainerPort {
                    name: p.name.clone(),
                    port: u16::try_from(p.container_port).ok()?,
                    protocol,
                })
            })
            .collect();
        Some(PodInfo {
            namespace: pod.metadata.namespace.clone()?,
            name: pod.metadata.name.clone()?,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ips,
            ports,
            workload: jobs.unit(pod).filter(|w| w.kind != WorkloadKind::Pod),
        })
    }
}

impl netpol::NamedPorts for PodInfo {
    fn resolve(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name) && p.protocol == protocol)
            .map(|p| p.port)
    }
}

impl From<&crate::cluster::index::PodRecord> for PodInfo {
    /// The evaluator's view of a pod the controller's [`crate::cluster::index::Index`] holds: derived, never
    /// kept apart, so the index stays the one source of truth. The index keeps only named container
    /// ports, which are all that named-port resolution needs.
    fn from(pod: &crate::cluster::index::PodRecord) -> Self {
        PodInfo {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            labels: pod.labels.clone(),
            ips: pod.ips.clone(),
            ports: pod
                .ports
                .iter()
                .map(|(name, port, protocol)| ContainerPort {
                    name: Some(name.clone()),
                    port: *port,
                    protocol: *protocol,
                })
                .collect(),
            workload: pod.owner.clone(),
        }
    }
}

/// A NetworkPolicy in force: its namespace, name and spec.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedPolicy {
    pub namespace: String,
    pub name: String,
    pub spec: NetworkPolicySpec,
}

/// A ClusterNetworkPolicy in force (cluster-scoped): its name and spec.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedClusterPolicy {
    pub name: String,
    pub spec: ClusterNetworkPolicySpec,
}

impl NamedClusterPolicy {
    /// A ClusterNetworkPolicy object as the evaluators see it; `None` without a name.
    pub fn from_object(policy: &ClusterNetworkPolicy) -> Option<Self> {
        Some(NamedClusterPolicy {
            name: policy.metadata.name.clone()?,
            spec: policy.spec.clone(),
        })
    }
}

/// A borrowed [`NamedPolicy`], so that a policy can be evaluated "as if rendered" without copying it
/// into the view.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub spec: &'a NetworkPolicySpec,
}

impl NamedPolicy {
    /// A NetworkPolicy object as the evaluators see it; `None` without a name or namespace. A
    /// missing spec is the empty spec (which isolates every pod of the namespace for ingress).
    pub fn from_network_policy(policy: &NetworkPolicy) -> Option<Self> {
        Some(NamedPolicy {
            namespace: policy.metadata.namespace.clone()?,
            name: policy.metadata.name.clone()?,
            spec: policy.spec.clone().unwrap_or_default(),
        })
    }
}

impl<'a> PolicyRef<'a> {
    /// The policy parsed once for matching ([`netpol::Policy`], borrowing this one's spec).
    pub fn parse(self) -> netpol::Policy<'a> {
        netpol::Policy::parse(self.namespace, self.name, self.spec)
    }
}

impl<'a> From<&'a NamedPolicy> for PolicyRef<'a> {
    fn from(p: &'a NamedPolicy) -> Self {
        PolicyRef {
            namespace: &p.namespace,
            name: &p.name,
            spec: &p.spec,
        }
    }
}

/// One end of a flow.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    /// A pod of the view. Policies select it by its labels and its namespace's labels; ipBlocks see its IPs.
    /// Resolve pod IPs to this variant: as a bare [`Endpoint::Ip`] no selector would match it.
    Pod(PodKey),
    /// An address that is not a pod of the view: a node, the API server, the internet. Only ipBlocks
    /// (and rules without peers) match it, and no NetworkPolicy isolates it. hostNetwork pods belong
    /// here too: NetworkPolicies do not apply to them, and they share their node's address.
    Ip(IpAddr),
}

/// A connection attempt to evaluate: who talks to whom, on which destination (container) port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    pub source: Endpoint,
    pub destination: Endpoint,
    pub protocol: Protocol,
    /// The destination port after Service DNAT, i.e. the container port.
    pub port: u16,
}

/// The cluster state a flow is evaluated against.
///
/// Every pod's namespace carries the `kubernetes.io/metadata.name=<name>` label, as the API server
/// guarantees (and as learned peers rely on), whether or not the caller listed the namespace.
///
/// Pods and namespaces live in numbered slots so that the policy index can be plain vectors indexed
/// by slot: a flow then costs one hash lookup per pod, whatever the number of policies.
#[derive(Clone, Debug)]
pub struct ClusterView {
    /// Namespace name → its slot in `namespace_labels`. Namespaces are never removed.
    namespaces: FastMap<String, usize>,
    namespace_labels: Vec<Labels>,
    /// Namespace → pod name → the pod's slot in `pod_slots`; a removed pod's slot is reused by a
    /// later insert. Two levels rather than one map of [`PodKey`]s: the namespace level is small and
    /// stays in cache, so a lookup touches one key string in memory instead of two (measured: one
    /// level keyed by [`PodKey`] is no faster).
    pods: FastMap<String, FastMap<String, usize>>,
    pod_count: usize,
    pod_slots: Vec<Option<PodSlot>>,
    free_pod_slots: Vec<usize>,
    /// Pods per workload (namespace → workload name → kind), to find a workload's pods without a
    /// scan. Nested so that a lookup by `&str` allocates nothing.
    workloads: FastMap<String, FastMap<String, WorkloadPods>>,
    /// Policies per namespace, sorted by name.
    policies: HashMap<String, Vec<NamedPolicy>>,
    /// ClusterNetworkPolicies, sorted by name.
    cluster_policies: Vec<NamedClusterPolicy>,
    ip_blocks_match_pods: bool,
    /// The policies compiled into per-namespace and per-pod indexes. Built by the first evaluation
    /// after a change (every change empties it), so a flow never matches every policy's selectors.
    index: OnceLock<PolicyIndex>,
}

/// The pods of the workloads of one name in a namespace, per kind: pod name → slot, sorted by name.
type WorkloadPods = Vec<(WorkloadKind, BTreeMap<String, usize>)>;

/// A pod and the slot of its namespace.
#[derive(Clone, Debug)]
struct PodSlot {
    info: PodInfo,
    namespace: usize,
}

/// A pod of the view as the policy index sees it: the pod, its namespace's labels and both slots.
#[derive(Clone, Copy, Debug)]
pub struct PodRef<'a> {
    pub info: &'a PodInfo,
    /// The pod's namespace (a string the lookup has just read, rather than the pod's own copy).
    pub namespace: &'a str,
    pub namespace_labels: &'a Labels,
    pub slot: usize,
    pub namespace_slot: usize,
}

impl Default for ClusterView {
    fn default() -> Self {
        ClusterView {
            namespaces: FastMap::default(),
            namespace_labels: Vec::new(),
            pods: FastMap::default(),
            pod_count: 0,
            pod_slots: Vec::new(),
            free_pod_slots: Vec::new(),
            workloads: FastMap::default(),
            policies: HashMap::new(),
            cluster_policies: Vec::new(),
            ip_blocks_match_pods: true,
            index: OnceLock::new(),
        }
    }
}

impl ClusterView {
    /// An empty view in which ipBlocks match pod IPs too (the upstream conformance behaviour).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether ipBlock peers match pods by their IPs. Default `true`: the Kubernetes API documents
    /// ipBlock as a CIDR of addresses, and the upstream e2e suite ("should allow egress access to server
    /// in CIDR block", "... except clause ...") expects pod IPs to match; Calico does this. Cilium by
    /// default gives in-cluster pods an identity that CIDR rules do not match: set `false` for it, so
    /// that monitor mode reports what Cilium would really block.
    pub fn set_ip_blocks_match_pods(&mut self, yes: bool) {
        self.ip_blocks_match_pods = yes;
    }

    /// See [`ClusterView::set_ip_blocks_match_pods`].
    pub fn ip_blocks_match_pods(&self) -> bool {
        self.ip_blocks_match_pods
    }

    /// Adds or replaces namespace `name` with `labels`; the metadata.name label is added.
    pub fn insert_namespace(&mut self, name: impl Into<String>, mut labels: Labels) {
        self.index.take();
        let name = name.into();
        labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.clone());
        match self.namespaces.get(&name) {
            Some(&slot) => self.namespace_labels[slot] = labels,
            None => {
                self.namespaces.insert(name, self.namespace_labels.len());
                self.namespace_labels.push(labels);
            }
        }
    }

    /// Adds or replaces a pod (by namespace and name). Its namespace is created with only the
    /// metadata.name label if unknown.
    pub fn insert_pod(&mut self, pod: PodInfo) {
        self.index.take();
        let namespace = match self.namespace_slot(&pod.namespace) {
            Some(slot) => slot,
            None => {
                self.insert_namespace(pod.namespace.clone(), Labels::new());
                self.namespace_labels.len() - 1
            }
        };
        let key = pod.key();
        self.remove_pod(&key);
        let index = self.free_pod_slots.pop().unwrap_or(self.pod_slots.len());
        if let Some(w) = &pod.workload {
            let kinds = self
                .workloads
                .entry(pod.namespace.clone())
                .or_default()
                .entry(w.name.clone())
                .or_default();
            let pods = match kinds.iter().position(|(kind, _)| *kind == w.kind) {
                Some(i) => &mut kinds[i].1,
                None => {
                    kinds.push((w.kind, BTreeMap::new()));
                    &mut kinds.last_mut().expect("just pushed").1
                }
            };
            pods.insert(pod.name.clone(), index);
        }
        let slot = Some(PodSlot {
            info: pod,
            namespace,
        });
        if index == self.pod_slots.len() {
            self.pod_slots.push(slot);
        } else {
            self.pod_slots[index] = slot;
        }
        self.pods
            .entry(key.namespace)
            .or_default()
            .insert(key.name, index);
        self.pod_count += 1;
    }

    /// Removes a pod; returns it if it was there.
    pub fn remove_pod(&mut self, key: &PodKey) -> Option<PodInfo> {
        self.index.take();
        let names = self.pods.get_mut(&key.namespace)?;
        let slot = names.remove(&key.name)?;
        if names.is_empty() {
            self.pods.remove(&key.namespace);
        }
        self.pod_count -= 1;
        let pod = self.pod_slots[slot].take()?.info;
        self.free_pod_slots.push(slot);
        if let Some(w) = &pod.workload {
            self.forget_workload_pod(&pod.namespace, w, &pod.name);
        }
        Some(pod)
    }

    /// Removes `pod` from the pods of workload `w`, and the entries left empty.
    fn forget_workload_pod(&mut self, namespace: &str, w: &Workload, pod: &str) {
        let Some(workloads) = self.workloads.get_mut(namespace) else {
            return;
        };
        if let Some(kinds) = workloads.get_mut(w.name.as_str()) {
            if let Some(i) = kinds.iter().position(|(kind, _)| *kind == w.kind) {
                kinds[i].1.remove(pod);
                if kinds[i].1.is_empty() {
                    kinds.swap_remove(i);
                }
            }
            if kinds.is_empty() {
                workloads.remove(w.name.as_str());
            }
        }
        if workloads.is_empty() {
            self.workloads.remove(namespace);
        }
    }

    /// Adds or replaces the NetworkPolicy `namespace/name`.
    pub fn insert_policy(&mut self, policy: NamedPolicy) {
        self.index.take();
        let list = self.policies.entry(policy.namespace.clone()).or_default();
        match list.binary_search_by(|p| p.name.as_str().cmp(&policy.name)) {
            Ok(i) => list[i] = policy,
            Err(i) => list.insert(i, policy),
        }
    }

    /// Removes the NetworkPolicy `namespace/name`; returns it if it was there.
    pub fn remove_policy(&mut self, namespace: &str, name: &str) -> Option<NamedPolicy> {
        self.index.take();
        let list = self.policies.get_mut(namespace)?;
        let i = list.binary_search_by(|p| p.name.as_str().cmp(name)).ok()?;
        Some(list.remove(i))
    }

    /// Adds or replaces the ClusterNetworkPolicy `name`.
    pub fn insert_cluster_policy(&mut self, policy: NamedClusterPolicy) {
        self.index.take();
        let list = &mut self.cluster_policies;
        match list.binary_search_by(|p| p.name.as_str().cmp(&policy.name)) {
            Ok(i) => list[i] = policy,
            Err(i) => list.insert(i, policy),
        }
    }

    /// Removes the ClusterNetworkPolicy `name`; returns it if it was there.
    pub fn remove_cluster_policy(&mut self, name: &str) -> Option<NamedClusterPolicy> {
        self.index.take();
        let list = &mut self.cluster_policies;
        let i = list.binary_search_by(|p| p.name.as_str().cmp(name)).ok()?;
        Some(list.remove(i))
    }

    /// The ClusterNetworkPolicies in force, sorted by name.
    pub fn cluster_policies(&self) -> &[NamedClusterPolicy] {
        &self.cluster_policies
    }

    /// The pod `key`, if the view has it.
    pub fn pod(&self, key: &PodKey) -> Option<&PodInfo> {
        self.pod_ref(key).map(|pod| pod.info)
    }

    /// The pod `key` with what the policy index needs, if the view has it.
    pub(crate) fn pod_ref(&self, key: &PodKey) -> Option<PodRef<'_>> {
        self.pod_ref_by_name(&key.namespace, &key.name)
    }

    fn pod_ref_by_name(&self, namespace: &str, name: &str) -> Option<PodRef<'_>> {
        // The map's own namespace string: the lookup has just read it.
        let (namespace, names) = self.pods.get_key_value(namespace)?;
        let slot = *names.get(name)?;
        self.slot_ref(slot, namespace)
    }

    fn slot_ref<'a>(&'a self, slot: usize, namespace: &'a str) -> Option<PodRef<'a>> {
        let pod = self.pod_slots.get(slot)?.as_ref()?;
        Some(PodRef {
            info: &pod.info,
            namespace,
            namespace_labels: &self.namespace_labels[pod.namespace],
            slot,
            namespace_slot: pod.namespace,
        })
    }

    /// Every pod with its slots, for building the policy index.
    pub(crate) fn pod_refs(&self) -> impl Iterator<Item = PodRef<'_>> {
        (0..self.pod_slots.len()).filter_map(|slot| {
            let pod = self.pod_slots[slot].as_ref()?;
            self.slot_ref(slot, &pod.info.namespace)
        })
    }

    /// The number of pod slots (the highest slot plus one).
    pub(crate) fn pod_slot_count(&self) -> usize {
        self.pod_slots.len()
    }

    /// The number of namespace slots.
    pub(crate) fn namespace_slot_count(&self) -> usize {
        self.namespace_labels.len()
    }

    /// The slot of namespace `name`, if the view knows it.
    pub(crate) fn namespace_slot(&self, name: &str) -> Option<usize> {
        self.namespaces.get(name).copied()
    }

    /// Every namespace's NetworkPolicies, for building the policy index.
    pub(crate) fn policies_by_namespace(&self) -> impl Iterator<Item = (&str, &[NamedPolicy])> {
        self.policies
            .iter()
            .map(|(namespace, list)| (namespace.as_str(), list.as_slice()))
    }

    /// The policy index, compiled now if the view changed since it was last used.
    pub(crate) fn policy_index(&self) -> &PolicyIndex {
        self.index.get_or_init(|| PolicyIndex::build(self))
    }

    /// Compiles the policy index now rather than at the first evaluation (see [`ClusterView`]), for
    /// callers that want its cost up front.
    pub fn compile(&self) {
        self.policy_index();
    }

    /// The labels of namespace `name`, if the view knows it.
    pub fn namespace_labels(&self, name: &str) -> Option<&Labels> {
        self.namespaces
            .get(name)
            .map(|&slot| &self.namespace_labels[slot])
    }

    /// The NetworkPolicies in force in `namespace`, sorted by name.
    pub fn policies_in(&self, namespace: &str) -> &[NamedPolicy] {
        self.policies.get(namespace).map_or(&[], Vec::as_slice)
    }

    /// The pods of workload `kind/name` in `namespace`, sorted by pod name. A bare pod (kind `Pod`)
    /// is its own workload: it has no owner to be listed under, so it is found by its name.
    pub fn pods_of(
        &self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
    ) -> impl Iterator<Item = &PodInfo> {
        let bare = (kind == WorkloadKind::Pod)
            .then(|| self.pod_ref_by_name(namespace, name).map(|pod| pod.info))
            .flatten()
            .filter(|pod| pod.workload.is_none());
        self.workloads
            .get(namespace)
            .and_then(|workloads| workloads.get(name))
            .and_then(|kinds| kinds.iter().find(|(k, _)| *k == kind))
            .into_iter()
            .flat_map(|(_, pods)| pods.values())
            .filter_map(|&slot| self.pod_slots.get(slot)?.as_ref().map(|pod| &pod.info))
            .chain(bare)
    }

    /// The view of the controller's index: every pod it holds except hostNetwork ones (NetworkPolicies
    /// do not apply to them; flows name them by address), the `namespaces` with their labels, and the
    /// NetworkPolicies in force.
    pub fn from_index(
        index: &crate::cluster::index::Index,
        namespaces: impl IntoIterator<Item = (String, Labels)>,
        policies: impl IntoIterator<Item = NamedPolicy>,
    ) -> Self {
        let mut view = ClusterView::new();
        for (name, labels) in namespaces {
            view.insert_namespace(name, labels);
        }
        for pod in index.pods().filter(|p| !p.host_network) {
            view.insert_pod(PodInfo::from(pod));
        }
        for policy in policies {
            view.insert_policy(policy);
        }
        view
    }

    /// The number of pods in the view.
    pub fn pod_count(&self) -> usize {
        self.pod_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, workload: Option<&str>) -> PodInfo {
        PodInfo {
            namespace: "shop".into(),
            name: name.into(),
            labels: Labels::new(),
            ips: vec![],
            ports: vec![],
            workload: workload.map(|w| Workload {
                kind: WorkloadKind::Deployment,
                name: w.into(),
            }),
        }
    }

    #[test]
    fn namespaces_always_carry_their_name_label() {
        let mut view = ClusterView::new();
        view.insert_namespace("shop", Labels::from([("team".into(), "a".into())]));
        view.insert_pod(PodInfo {
            namespace: "other".into(),
            ..pod("p", None)
        });
        assert_eq!(
            view.namespace_labels("shop")
                .unwrap()
                .get(NAMESPACE_NAME_LABEL),
            Some(&"shop".to_string())
        );
        assert_eq!(
            view.namespace_labels("other"),
            Some(&Labels::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                "other".to_string()
            )]))
        );
    }

    #[test]
    fn workload_index_follows_inserts_replacements_and_removals() {
        let mut view = ClusterView::new();
        view.insert_pod(pod("web-2", Some("web")));
        view.insert_pod(pod("web-1", Some("web")));
        view.insert_pod(pod("db-1", Some("db")));
        let names = |view: &ClusterView| {
            view.pods_of("shop", WorkloadKind::Deployment, "web")
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&view), ["web-1", "web-2"]);
        // A pod re-inserted under another owner leaves the old workload's index.
        view.insert_pod(pod("web-2", Some("db")));
        assert_eq!(names(&view), ["web-1"]);
        view.remove_pod(&PodKey::new("shop", "web-1"));
        assert_eq!(names(&view), Vec::<String>::new());
        assert_eq!(view.pod_count(), 2);
    }

    #[test]
    fn pods_and_network_policies_from_their_objects() {
        let object: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-5d8f7c9b6-abcde", "namespace": "shop",
                         "labels": {"app": "web", "pod-template-hash": "5d8f7c9b6"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": "web-5d8f7c9b6", "uid": "u", "controller": true}]},
            "spec": {"containers": [
                {"name": "a", "ports": [{"name": "http", "containerPort": 8080},
                                        {"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                {"name": "b", "ports": [{"containerPort": 3868, "protocol": "SCTP"},
                                        {"containerPort": 70000}]}
            ]},
            "status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}
        }))
        .unwrap();
        let pod = PodInfo::from_pod(&object, &JobOwners::default()).unwrap();
        assert_eq!(pod.key(), PodKey::new("shop", "web-5d8f7c9b6-abcde"));
        assert_eq!(pod.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(
            pod.ips,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        let port = |name: Option<&str>, port, protocol| ContainerPort {
            name: name.map(String::from),
            port,
            protocol,
        };
        assert_eq!(
            pod.ports,
            [
                port(Some("http"), 8080, Protocol::TCP),
                port(Some("dns"), 53, Protocol::UDP),
                port(None, 3868, Protocol::SCTP)
            ],
            "the out-of-range port is skipped"
        );
        assert_eq!(
            pod.workload,
            Some(Workload {
                kind: WorkloadKind::Deployment,
                name: "web".into()
            })
        );
        // Only podIP (older clusters), no spec: still a pod.
        let mut bare = object.clone();
        bare.spec = None;
        bare.status.as_mut().unwrap().pod_ips = None;
        let bare = PodInfo::from_pod(&bare, &JobOwners::default()).unwrap();
        assert_eq!(bare.ips, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert!(bare.ports.is_empty());
        assert!(PodInfo::from_pod(&Pod::default(), &JobOwners::default()).is_none());

        let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "deny", "namespace": "shop"}
        }))
        .unwrap();
        let np = NamedPolicy::from_network_policy(&np).unwrap();
        assert_eq!((np.namespace.as_str(), np.name.as_str()), ("shop", "deny"));
        assert_eq!(np.spec, NetworkPolicySpec::default());
        assert!(NamedPolicy::from_network_policy(&NetworkPolicy::default()).is_none());
    }

    #[test]
    fn policies_are_replaced_by_name_and_kept_sorted() {
        let mut view = ClusterView::new();
        for name in ["b", "a", "b"] {
            view.insert_policy(NamedPolicy {
                namespace: "shop".into(),
                name: name.into(),
                spec: NetworkPolicySpec::default(),
            });
        }
        let names: Vec<_> = view.policies_in("shop").iter().map(|p| &p.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(view.remove_policy("shop", "a").is_some());
        assert!(view.remove_policy("shop", "a").is_none());
        assert!(view.policies_in("nowhere").is_empty());
    }
}
