//! What enforcement knows about the cluster: every pod's labels, IPs, node and named ports, every
//! namespace's labels, every NetworkPolicy and every ClusterNetworkPolicy. Plain data, filled by [`crate::enforce::watch`] and read
//! by [`crate::enforce::compile`]; a pod keeps only what NetworkPolicy semantics look at, so 10,000 pods
//! stay a few MiB.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use network_enforcer_api::cluster_network_policy::{
    ClusterNetworkPolicy, ClusterNetworkPolicySpec,
};
use network_enforcer_api::keys::{
    EGRESS_NAME_RULES_ANNOTATION, EGRESS_NAMES_ANNOTATION, NAMESPACE_NAME_LABEL,
};
use network_enforcer_api::pod;
use network_enforcer_api::{NameRule, Protocol};
use std::collections::BTreeMap;
use std::net::IpAddr;

pub type Labels = BTreeMap<String, String>;

/// `(namespace, name)`.
pub type Key = (String, String);

/// A container port with a name: what a NetworkPolicy's named port resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

/// What enforcement needs of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodEntry {
    /// `metadata.uid`: how [`crate::enforce::sandbox`] finds the pod on the node.
    pub uid: String,
    pub labels: Labels,
    /// Empty until the CNI assigned one, and again once the pod has finished (its IP may be reused).
    pub ips: Vec<IpAddr>,
    /// Whether `ips` were read on the node ([`crate::enforce::sandbox`]) because the API server did not
    /// report them yet.
    pub ips_from_node: bool,
    /// The pod has finished: it gave its addresses back.
    pub finished: bool,
    pub node: Option<String>,
    /// Host-network pods share the node's address: they are never isolated, and selectors do not
    /// turn them into peers (their address is the node's).
    pub host_network: bool,
    pub named_ports: Vec<NamedPort>,
}

impl PodEntry {
    /// The pod's key and entry; `None` without a namespace or name (never sent by an API server).
    pub fn from_pod(pod: &Pod) -> Option<(Key, Self)> {
        let key = (pod.metadata.namespace.clone()?, pod.metadata.name.clone()?);
        let spec = pod.spec.as_ref();
        // A finished pod has given its address back.
        let finished = pod::finished(pod);
        let ips = if finished { Vec::new() } else { pod::ips(pod) };
        let named_ports = spec
            .into_iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(NamedPort {
                    name: p.name.clone()?,
                    port: u16::try_from(p.container_port).ok()?,
                    protocol: Protocol::from_kubernetes(p.protocol.as_deref())?,
                })
            })
            .collect();
        Some((
            key,
            PodEntry {
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                labels: pod.metadata.labels.clone().unwrap_or_default(),
                ips,
                ips_from_node: false,
                finished,
                node: spec.and_then(|s| s.node_name.clone()),
                host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
                named_ports,
            },
        ))
    }

    /// The number `name` stands for on this pod for `protocol`, if a container declares it.
    pub fn resolve(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.named_ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }
}

/// Everything enforcement decides from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub pods: BTreeMap<Key, PodEntry>,
    pub namespaces: BTreeMap<String, Labels>,
    pub policies: BTreeMap<Key, NetworkPolicySpec>,
    /// The `spec.egressNames` a policy carries ([`EGRESS_NAME_RULES_ANNOTATION`]; only rendered
    /// policies do), or why the annotation was not read.
    pub name_rules: BTreeMap<Key, Result<Vec<NameRule>, String>>,
    /// ClusterNetworkPolicies by name (empty where the cluster has no such kind).
    pub cluster_policies: BTreeMap<String, ClusterNetworkPolicySpec>,
}

impl Cluster {
    pub fn apply_pod(&mut self, pod: &Pod) {
        if let Some((key, mut entry)) = PodEntry::from_pod(pod) {
            // An update that still has no address (the API server has not heard of it yet) keeps
            // what was read on the node for the same pod.
            if let Some(old) = self.pods.get(&key)
                && entry.ips.is_empty()
                && !entry.finished
                && old.ips_from_node
                && old.uid == entry.uid
            {
                entry.ips = old.ips.clone();
                entry.ips_from_node = true;
            }
            self.pods.insert(key, entry);
        }
    }

    /// The pods of `node` that run in a network namespace of their own and have no address yet:
    /// (key, uid), for [`crate::enforce::sandbox`].
    pub fn waiting_for_address<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = (&'a Key, &'a str)> + 'a {
        self.pods
            .iter()
            .filter(move |(_, p)| {
                p.ips.is_empty()
                    && !p.finished
                    && !p.host_network
                    && !p.uid.is_empty()
                    && p.node.as_deref() == Some(node)
            })
            .map(|(key, p)| (key, p.uid.as_str()))
    }

    /// Sets the addresses read on the node for pod `key` of `uid`, unless the API server reported
    /// some meanwhile (or the pod changed); whether it changed the model.
    pub fn set_address_from_node(&mut self, key: &Key, uid: &str, ips: Vec<IpAddr>) -> bool {
        match self.pods.get_mut(key) {
            Some(p) if p.uid == uid && p.ips.is_empty() && !p.finished => {
                p.ips = ips;
                p.ips_from_node = true;
                true
            }
            _ => false,
        }
    }

    pub fn delete_pod(&mut self, pod: &Pod) {
        if let Some((key, _)) = PodEntry::from_pod(pod) {
            self.pods.remove(&key);
        }
    }

    /// Keeps the namespace's labels plus `kubernetes.io/metadata.name`, which API servers before 1.21
    /// do not set but policies (ours among them) select namespaces by.
    pub fn apply_namespace(&mut self, namespace: &Namespace) {
        if let Some(name) = &namespace.metadata.name {
            let mut labels = namespace.metadata.labels.clone().unwrap_or_default();
            labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.clone());
            self.namespaces.insert(name.clone(), labels);
        }
    }

    /// The pods of namespace `namespace` (keys sort by namespace first: one range, not a scan).
    pub fn pods_in(&self, namespace: &str) -> impl Iterator<Item = &PodEntry> {
        let namespace = namespace.to_string();
        self.pods
            .range((namespace.clone(), String::new())..)
            .take_while(move |((ns, _), _)| *ns == namespace)
            .map(|(_, pod)| pod)
    }

    /// The labels of namespace `name`; one not seen yet has its `kubernetes.io/metadata.name` only.
    pub fn namespace_labels(&self, name: &str) -> Labels {
        self.namespaces
            .get(name)
            .cloned()
            .unwrap_or_else(|| Labels::from([(NAMESPACE_NAME_LABEL.to_string(), name.to_string())]))
    }

    pub fn delete_namespace(&mut self, namespace: &Namespace) {
        if let Some(name) = &namespace.metadata.name {
            self.namespaces.remove(name);
        }
    }

    pub fn apply_policy(&mut self, policy: &NetworkPolicy) {
        if let Some(key) = policy_key(policy) {
            let annotations = policy.metadata.annotations.as_ref();
            let annotation = |name: &str| annotations.and_then(|a| a.get(name));
            match (
                annotation(EGRESS_NAME_RULES_ANNOTATION),
                annotation(EGRESS_NAMES_ANNOTATION),
            ) {
                (Some(text), _) => {
                    let parsed = serde_json::from_str::<Vec<NameRule>>(text)
                        .map_err(|e| format!("annotation {EGRESS_NAME_RULES_ANNOTATION}: {e}"));
                    self.name_rules.insert(key.clone(), parsed);
                }
                // The controller left the entries out (too large for an annotation).
                (None, Some(_)) => {
                    self.name_rules.insert(
                        key.clone(),
                        Err(format!(
                            "{EGRESS_NAMES_ANNOTATION} without {EGRESS_NAME_RULES_ANNOTATION} (too many \
                             egressNames for an annotation): names are enforced from the rendered \
                             addresses only"
                        )),
                    );
                }
                (None, None) => {
                    self.name_rules.remove(&key);
                }
            }
            self.policies
                .insert(key, policy.spec.clone().unwrap_or_default());
        }
    }

    pub fn apply_cluster_policy(&mut self, policy: &ClusterNetworkPolicy) {
        if let Some(name) = &policy.metadata.name {
            self.cluster_policies
                .insert(name.clone(), policy.spec.clone());
        }
    }

    pub fn delete_cluster_policy(&mut self, policy: &ClusterNetworkPolicy) {
        if let Some(name) = &policy.metadata.name {
            self.cluster_policies.remove(name);
        }
    }

    pub fn delete_policy(&mut self, policy: &NetworkPolicy) {
        if let Some(key) = policy_key(policy) {
            self.name_rules.remove(&key);
            self.policies.remove(&key);
        }
    }
}

fn policy_key(policy: &NetworkPolicy) -> Option<Key> {
    Some((
        policy.metadata.namespace.clone()?,
        policy.metadata.name.clone()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_keeps_its_ips_named_ports_and_node_and_gives_its_ip_back_when_finished() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "x", "name": "a", "labels": {"pod": "a"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                {"name": "serve-80-tcp", "containerPort": 80},
                {"name": "serve-80-udp", "containerPort": 80, "protocol": "UDP"},
                {"containerPort": 81}
            ]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}
        }))
        .unwrap();
        let (key, entry) = PodEntry::from_pod(&pod).unwrap();
        assert_eq!(key, ("x".to_string(), "a".to_string()));
        assert_eq!(entry.ips, vec!["10.0.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(entry.node.as_deref(), Some("n1"));
        assert_eq!(entry.resolve("serve-80-udp", Protocol::UDP), Some(80));
        assert_eq!(entry.resolve("serve-80-udp", Protocol::TCP), None);
        assert_eq!(entry.named_ports.len(), 2);
        pod.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(PodEntry::from_pod(&pod).unwrap().1.ips.is_empty());
    }
}
