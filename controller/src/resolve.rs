//! The controller's index of the cluster, and resolution of flow records against it.
//!
//! The index is a pure state machine fed by watch events (`apply_*` / `delete_*`), in the manner of
//! Linkerd's policy index: ingest and learning read it and never list the API per flow. It keeps only what
//! resolution needs: pods (IPs with a short history for IP reuse, labels, owner, node, service account,
//! named container ports), workloads (uid and selector), Services (ClusterIPs, selector, ports) and node
//! IPs. EndpointSlices are not used (the test API server, v1.20, lacks v1); Service backends are the pods
//! its selector picks, as kube-proxy would.

use crate::workload::{self, Workload};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use network_enforcer_api::{Protocol, WorkloadKind};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// A pod, by namespace and name.
pub type PodKey = (String, String);

/// How long a released pod IP still resolves to its former pod, for records that arrive late.
pub const IP_HISTORY_MS: i64 = 5 * 60 * 1000;

/// What the index keeps of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub node: Option<String>,
    pub service_account: String,
    pub owner: Option<Workload>,
    /// Named container ports: (name, port, protocol).
    pub ports: Vec<(String, u16, Protocol)>,
    pub host_network: bool,
}

/// What the index keeps of a workload (Deployment, StatefulSet, DaemonSet).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadInfo {
    pub uid: String,
    pub selector: LabelSelector,
}

/// What the index keeps of a Service.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    /// `None` for Services without a selector (their endpoints are managed by hand: not resolved).
    pub selector: Option<BTreeMap<String, String>>,
    /// (service port, protocol, target port).
    pub ports: Vec<(u16, Protocol, IntOrString)>,
}

/// Who held an IP, and when (ms since the epoch).
#[derive(Clone, Debug, PartialEq)]
struct IpLease {
    pod: PodKey,
    since: i64,
    until: Option<i64>,
}

/// One side of a flow, at workload level.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    /// Pods of a workload (or a bare pod, whose `kind` is `None`).
    Workload(WorkloadEndpoint),
    /// A node of the cluster (host network), by IP.
    Node { ip: IpAddr, name: String },
    /// Anything else: the internet, hosts outside the cluster.
    External(IpAddr),
}

/// A workload as a flow endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadEndpoint {
    pub namespace: String,
    /// `None` for a pod without a supported controller (bare pod, Job).
    pub kind: Option<WorkloadKind>,
    /// Workload name (the pod name for bare pods).
    pub name: String,
    /// The workload's uid, for ownerReferences (`None` when the workload object is not in the index).
    pub uid: Option<String>,
    /// The workload's `spec.selector` (the pod's labels for bare pods), as `key=value` pairs.
    pub selector: BTreeMap<String, String>,
    /// Full selector including matchExpressions, serialized, so equal workloads compare equal.
    pub selector_expressions: String,
    pub service_account: String,
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
}

/// Where a peer address (and port) leads.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    /// Pods of these workloads, reached on this container port (one entry for a pod IP; one per backend
    /// workload for a Service ClusterIP).
    Workloads(Vec<(WorkloadEndpoint, u16)>),
    /// A Service with no ready backend: nothing to learn yet.
    ServiceWithoutBackends { namespace: String, name: String },
    /// Not a pod: a node or an external address, on the port as seen.
    Address(Endpoint, u16),
}

/// The index. See the module docs.
#[derive(Default, Debug)]
pub struct Index {
    pods: HashMap<PodKey, PodInfo>,
    /// Pods by uid (agents that only know the uid from the pod's cgroup path report it).
    uids: HashMap<String, PodKey>,
    /// Deleted pods, kept (for late records) until their IP history ends: when they were deleted.
    deleted: HashMap<PodKey, i64>,
    leases: HashMap<IpAddr, Vec<IpLease>>,
    workloads: HashMap<(String, WorkloadKind, String), WorkloadInfo>,
    services: HashMap<IpAddr, ServiceInfo>,
    nodes: HashMap<IpAddr, String>,
}

fn protocol(p: Option<&str>) -> Protocol {
    match p {
        Some("UDP") => Protocol::UDP,
        Some("SCTP") => Protocol::SCTP,
        _ => Protocol::TCP,
    }
}

impl Index {
    /// Adds or updates a pod, at time `now_ms`.
    pub fn apply_pod(&mut self, pod: &Pod, now_ms: i64) {
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let mut ips: Vec<IpAddr> = status
            .pod_ips
            .iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty() {
            ips.extend(
                status
                    .pod_ip
                    .as_deref()
                    .and_then(|ip| ip.parse::<IpAddr>().ok()),
            );
        }
        let host_network = spec.host_network.unwrap_or(false);
        let info = PodInfo {
            namespace: key.0.clone(),
            name: key.1.clone(),
            uid: pod.uid().unwrap_or_default(),
            labels: pod.labels().clone(),
            ips: ips.clone(),
            node: spec.node_name.clone(),
            service_account: spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
            owner: workload::owner_of(pod),
            ports: spec
                .containers
                .iter()
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
        };
        let terminated = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        // Host-network pods share the node's IP: the IP says nothing about which pod it is.
        if !host_network && !terminated {
            for ip in &ips {
                let leases = self.leases.entry(*ip).or_default();
                let current = leases.iter().any(|l| l.pod == key && l.until.is_none());
                if !current {
                    for l in leases.iter_mut().filter(|l| l.until.is_none()) {
                        l.until = Some(now_ms);
                    }
                    leases.push(IpLease {
                        pod: key.clone(),
                        since: now_ms,
                        until: None,
                    });
                }
            }
        }
        if let Some(old) = self.pods.get(&key) {
            let released: Vec<IpAddr> = old
                .ips
                .iter()
                .filter(|ip| terminated || !ips.contains(ip))
                .copied()
                .collect();
            self.release(&key, &released, now_ms);
        }
        self.deleted.remove(&key);
        if !info.uid.is_empty() {
            self.uids.insert(info.uid.clone(), key.clone());
        }
        self.pods.insert(key, info);
        self.forget_expired(now_ms);
    }

    /// Removes a pod; its IPs keep resolving to it for [`IP_HISTORY_MS`].
    pub fn delete_pod(&mut self, namespace: &str, name: &str, now_ms: i64) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(old) = self.pods.get(&key) {
            let ips = old.ips.clone();
            self.release(&key, &ips, now_ms);
        }
        // Keep the PodInfo for the IP history window, so late records still resolve.
        self.deleted.insert(key, now_ms);
        self.forget_expired(now_ms);
    }

    fn release(&mut self, key: &PodKey, ips: &[IpAddr], now_ms: i64) {
        for ip in ips {
            for l in self.leases.entry(*ip).or_default().iter_mut() {
                if &l.pod == key && l.until.is_none() {
                    l.until = Some(now_ms);
                }
            }
        }
    }

    /// Forgets IP history and deleted pods older than [`IP_HISTORY_MS`] (also done on every pod change).
    pub fn forget_expired(&mut self, now_ms: i64) {
        self.leases.retain(|_, leases| {
            leases.retain(|l| l.until.is_none_or(|u| u + IP_HISTORY_MS >= now_ms));
            !leases.is_empty()
        });
        let expired: Vec<PodKey> = self
            .deleted
            .iter()
            .filter(|(_, at)| **at + IP_HISTORY_MS < now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.deleted.remove(&key);
            if let Some(pod) = self.pods.remove(&key) {
                self.uids.remove(&pod.uid);
            }
        }
    }

    /// A pod by uid, as `(namespace, name)`.
    pub fn pod_by_uid(&self, uid: &str) -> Option<&PodInfo> {
        self.uids.get(uid).and_then(|key| self.pods.get(key))
    }

    /// Every pod held, live and recently deleted (see [`IP_HISTORY_MS`]): the violation evaluator's
    /// view is derived from these, so the index stays the one source of truth about pods.
    pub fn pods(&self) -> impl Iterator<Item = &PodInfo> {
        self.pods.values()
    }

    /// Number of pods held (live and recently deleted).
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Adds or updates a workload.
    pub fn apply_workload(
        &mut self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
        uid: &str,
        selector: LabelSelector,
    ) {
        self.workloads.insert(
            (namespace.to_string(), kind, name.to_string()),
            WorkloadInfo {
                uid: uid.to_string(),
                selector,
            },
        );
    }

    /// Removes a workload.
    pub fn delete_workload(&mut self, namespace: &str, kind: WorkloadKind, name: &str) {
        self.workloads
            .remove(&(namespace.to_string(), kind, name.to_string()));
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

    /// Adds or updates a Service (by its ClusterIPs; headless Services have none and resolve as pods).
    pub fn apply_service(&mut self, svc: &Service) {
        self.delete_service(&svc.namespace().unwrap_or_default(), &svc.name_any());
        let Some(spec) = svc.spec.as_ref() else {
            return;
        };
        let info = ServiceInfo {
            namespace: svc.namespace().unwrap_or_default(),
            name: svc.name_any(),
            selector: spec.selector.clone().filter(|s| !s.is_empty()),
            ports: spec
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let port = u16::try_from(p.port).ok()?;
                    let target = p.target_port.clone().unwrap_or(IntOrString::Int(p.port));
                    Some((port, protocol(p.protocol.as_deref()), target))
                })
                .collect(),
        };
        let ips = spec
            .cluster_ips
            .clone()
            .unwrap_or_default()
            .into_iter()
            .chain(spec.cluster_ip.clone());
        for ip in ips.filter_map(|ip| ip.parse::<IpAddr>().ok()) {
            self.services.insert(ip, info.clone());
        }
    }

    /// Removes a Service.
    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        self.services
            .retain(|_, s| !(s.namespace == namespace && s.name == name));
    }

    /// Adds or updates a node's addresses.
    pub fn apply_node(&mut self, node: &Node) {
        let name = node.name_any();
        self.nodes.retain(|_, n| *n != name);
        for a in node
            .status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
        {
            if let Ok(ip) = a.address.parse() {
                self.nodes.insert(ip, name.clone());
            }
        }
    }

    /// Removes a node.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.retain(|_, n| n != name);
    }

    /// The pod that held `ip` at `at_ms` (or holds it now, for records newer than the last change).
    pub fn pod_at(&self, ip: IpAddr, at_ms: i64) -> Option<&PodInfo> {
        let leases = self.leases.get(&ip)?;
        let lease = leases
            .iter()
            .rev()
            .find(|l| l.since <= at_ms && l.until.is_none_or(|u| at_ms < u))
            .or_else(|| leases.iter().rev().find(|l| l.until.is_none()))?;
        self.pods.get(&lease.pod)
    }

    /// A pod by namespace and name.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodInfo> {
        self.pods.get(&(namespace.to_string(), name.to_string()))
    }

    /// The workload endpoint of a pod.
    pub fn endpoint_of(&self, pod: &PodInfo) -> WorkloadEndpoint {
        let (kind, name, workload) = match &pod.owner {
            Some(w) => (
                Some(w.kind),
                w.name.clone(),
                self.workloads
                    .get(&(pod.namespace.clone(), w.kind, w.name.clone())),
            ),
            None => (None, pod.name.clone(), None),
        };
        let (selector, expressions) = match workload {
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
            None => (pod.labels.clone(), String::new()),
        };
        WorkloadEndpoint {
            namespace: pod.namespace.clone(),
            kind,
            name,
            uid: workload.map(|w| w.uid.clone()),
            selector,
            selector_expressions: expressions,
            service_account: pod.service_account.clone(),
        }
    }

    /// Resolves a peer address and port as seen by a socket at `at_ms`: a pod IP, a Service ClusterIP
    /// (to its backend workloads and target container port), a node IP, or external.
    pub fn resolve(&self, ip: IpAddr, port: u16, proto: Protocol, at_ms: i64) -> Resolved {
        if let Some(pod) = self.pod_at(ip, at_ms) {
            return Resolved::Workloads(vec![(self.endpoint_of(pod), port)]);
        }
        if let Some(svc) = self.services.get(&ip) {
            return self.resolve_service(svc, port, proto);
        }
        if let Some(node) = self.nodes.get(&ip) {
            return Resolved::Address(
                Endpoint::Node {
                    ip,
                    name: node.clone(),
                },
                port,
            );
        }
        Resolved::Address(Endpoint::External(ip), port)
    }

    fn resolve_service(&self, svc: &ServiceInfo, port: u16, proto: Protocol) -> Resolved {
        let none = || Resolved::ServiceWithoutBackends {
            namespace: svc.namespace.clone(),
            name: svc.name.clone(),
        };
        let Some(selector) = &svc.selector else {
            return none();
        };
        let Some((_, _, target)) = svc
            .ports
            .iter()
            .find(|(p, pr, _)| *p == port && *pr == proto)
        else {
            return none();
        };
        let mut backends: BTreeMap<WorkloadEndpoint, u16> = BTreeMap::new();
        for pod in self
            .pods
            .iter()
            .filter(|(key, _)| !self.deleted.contains_key(*key))
            .map(|(_, p)| p)
            .filter(|p| {
                p.namespace == svc.namespace
                    && !p.ips.is_empty()
                    && selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
            })
        {
            let container_port = match target {
                IntOrString::Int(n) => u16::try_from(*n).ok(),
                IntOrString::String(name) => pod
                    .ports
                    .iter()
                    .find(|(n, _, pr)| n == name && *pr == proto)
                    .map(|(_, p, _)| *p),
            };
            if let Some(p) = container_port {
                backends.entry(self.endpoint_of(pod)).or_insert(p);
            }
        }
        if backends.is_empty() {
            return none();
        }
        Resolved::Workloads(backends.into_iter().collect())
    }
}
