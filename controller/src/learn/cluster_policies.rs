//! ClusterNetworkPolicies learned from the namespace graph (docs/behaviour.md §1.11): the cluster
//! guardrails the observed traffic needs, for an admin to review (`check
//! --propose-cluster-policies`). Pure: namespace edges in, policies out.
//!
//! Two kinds, per namespace of the graph (system namespaces are never subjects, only peers):
//! - **`ne-isolate-<ns>`** (Admin tier): the namespace receives only from the namespaces it was seen
//!   receiving from (itself included; a namespace seen only sending receives from itself only): those `Pass` to its NetworkPolicies, every other namespace is
//!   denied. Outside addresses and nodes are not namespace peers: the Admin tier leaves them alone.
//! - **`ne-floor-<ns>`** (Baseline tier): what a pod of the namespace that no NetworkPolicy isolates
//!   for egress may still open: the cluster DNS, the namespaces and outside addresses it was seen
//!   reaching; everything else is denied. NetworkPolicies of the namespace (ours in protect among them)
//!   take precedence over the floor.
//!
//! Within the API's limits (25 rules, 25 peers, 25 networks per peer): outside addresses beyond 25
//! are widened to their /24 (IPv6: /64); if those are still more than 25, the floor lets every
//! outside address through and says so in the notes (it never denies what was observed).

use ipnet::IpNet;
use network_enforcer_api::Protocol;
use network_enforcer_api::cluster_network_policy::{
    ClusterNetworkPolicy, ClusterNetworkPolicyPeer, ClusterNetworkPolicyProtocol,
    ClusterNetworkPolicyRule, ClusterNetworkPolicySpec, ClusterNetworkPolicySubject,
    DestinationPort, NamespacedPod, ProtocolPort,
};
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The most networks (and peers, and rules) one rule may list.
pub const MAX_PER_RULE: usize = 25;

/// One observed connection, at the namespace level.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NamespaceEdge {
    /// The source pod's namespace.
    pub from: String,
    pub to: EdgeEnd,
}

/// Where a connection went.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EdgeEnd {
    /// A pod of this namespace.
    Namespace(String),
    /// An address that is no pod (outside the cluster, a node).
    Address(IpAddr),
}

/// What the proposals are built with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespaces never made subjects (the cluster's own).
    pub system: BTreeSet<String>,
    /// Priority of the Admin policies (0–1000, lower first): high, so an admin's own come first.
    pub admin_priority: i32,
    /// Priority of the Baseline policies.
    pub baseline_priority: i32,
    /// The cluster DNS: its namespace and pod labels.
    pub dns_namespace: String,
    pub dns_labels: BTreeMap<String, String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            system: ["kube-system", "kube-public", "kube-node-lease"]
                .map(String::from)
                .into(),
            admin_priority: 900,
            baseline_priority: 900,
            dns_namespace: "kube-system".into(),
            dns_labels: [("k8s-app".to_string(), "kube-dns".to_string())].into(),
        }
    }
}

/// The proposals, and what did not fit as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposed {
    pub policies: Vec<ClusterNetworkPolicy>,
    pub notes: Vec<String>,
}

/// Where the namespace graph comes from (the status sync's edge history in the controller, which
/// implements this in the monitor stage; a plain list in tests).
pub trait NamespaceGraph: Send + Sync {
    /// The graph's edges, sorted; `None` while the graph is incomplete (a partial graph would
    /// propose to deny what was seen).
    fn namespace_edges(&self) -> Option<Vec<NamespaceEdge>>;
    /// The cluster's namespaces now (complete once [`NamespaceGraph::namespace_edges`] is `Some`):
    /// a deleted namespace's edges stay in the graph for the history's retention, but it is no
    /// subject any more.
    fn namespaces(&self) -> BTreeSet<String>;
}

/// The namespace a learned proposal guards: its subject's `kubernetes.io/metadata.name`.
pub fn subject_namespace(spec: &ClusterNetworkPolicySpec) -> Option<&str> {
    spec.subject
        .namespaces
        .as_ref()?
        .match_labels
        .as_ref()?
        .get(NAMESPACE_NAME_LABEL)
        .map(String::as_str)
}

/// The Admin isolation and the Baseline floor of every non-system namespace of `edges`.
pub fn propose(edges: &[NamespaceEdge], settings: &Settings) -> Proposed {
    let mut inbound: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut outbound: BTreeMap<&str, (BTreeSet<&str>, BTreeSet<IpAddr>)> = BTreeMap::new();
    for edge in edges {
        // Every namespace of the graph is isolated, a source-only one too: none was seen receiving
        // from another namespace.
        inbound.entry(&edge.from).or_default();
        let out = outbound.entry(&edge.from).or_default();
        match &edge.to {
            EdgeEnd::Namespace(to) => {
                out.0.insert(to);
                inbound.entry(to).or_default().insert(&edge.from);
            }
            EdgeEnd::Address(ip) => {
                out.1.insert(*ip);
            }
        }
    }
    let mut proposed = Proposed::default();
    for (namespace, sources) in &inbound {
        if settings.system.contains(*namespace) {
            continue;
        }
        let mut allowed: BTreeSet<&str> = sources.clone();
        allowed.insert(namespace);
        proposed.policies.push(policy(
            &format!("ne-isolate-{namespace}"),
            "Admin",
            settings.admin_priority,
            namespace,
            vec![
                rule(
                    "observed",
                    "Pass",
                    vec![namespaces_peer(&allowed)],
                    None,
                    true,
                ),
                rule("isolate", "Deny", vec![everything_peer()], None, true),
            ],
            Vec::new(),
        ));
    }
    for (namespace, (namespaces, addresses)) in &outbound {
        if settings.system.contains(*namespace) {
            continue;
        }
        let mut rules = vec![rule(
            "dns",
            "Accept",
            vec![ClusterNetworkPolicyPeer {
                pods: Some(NamespacedPod {
                    namespace_selector: name_selector(&settings.dns_namespace),
                    pod_selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                        match_labels: Some(settings.dns_labels.clone()),
                        ..Default::default()
                    },
                }),
                ..Default::default()
            }],
            Some(vec![port(Protocol::UDP, 53), port(Protocol::TCP, 53)]),
            false,
        )];
        let mut reached: BTreeSet<&str> = namespaces.clone();
        reached.insert(namespace);
        rules.push(rule(
            "namespaces",
            "Accept",
            vec![namespaces_peer(&reached)],
            None,
            false,
        ));
        let mut deny = vec![everything_peer()];
        match networks(addresses) {
            Networks::None => deny.push(every_address()),
            Networks::Listed(list) => {
                rules.push(rule(
                    "outside",
                    "Accept",
                    vec![ClusterNetworkPolicyPeer {
                        networks: Some(list),
                        ..Default::default()
                    }],
                    None,
                    false,
                ));
                deny.push(every_address());
            }
            // Never deny what was observed: the floor then leaves outside addresses alone.
            Networks::TooMany => proposed.notes.push(format!(
                "ne-floor-{namespace}: {} outside addresses in more than {MAX_PER_RULE} networks: the \
                 floor lets every outside address through",
                addresses.len()
            )),
        }
        rules.push(rule("floor", "Deny", deny, None, false));
        proposed.policies.push(policy(
            &format!("ne-floor-{namespace}"),
            "Baseline",
            settings.baseline_priority,
            namespace,
            Vec::new(),
            rules,
        ));
    }
    proposed
}

/// Outside addresses as networks within [`MAX_PER_RULE`].
#[derive(Debug, PartialEq, Eq)]
enum Networks {
    None,
    Listed(Vec<String>),
    TooMany,
}

fn networks(addresses: &BTreeSet<IpAddr>) -> Networks {
    if addresses.is_empty() {
        return Networks::None;
    }
    let exact: BTreeSet<IpNet> = addresses.iter().map(|ip| IpNet::from(*ip)).collect();
    let list = if exact.len() <= MAX_PER_RULE {
        exact
    } else {
        let wide: BTreeSet<IpNet> = addresses
            .iter()
            .filter_map(|ip| {
                let prefix = if ip.is_ipv4() { 24 } else { 64 };
                IpNet::new(*ip, prefix).ok().map(|n| n.trunc())
            })
            .collect();
        if wide.len() > MAX_PER_RULE {
            return Networks::TooMany;
        }
        wide
    };
    Networks::Listed(list.iter().map(IpNet::to_string).collect())
}

fn name_selector(namespace: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some([(NAMESPACE_NAME_LABEL.to_string(), namespace.to_string())].into()),
        ..Default::default()
    }
}

/// Every pod of these namespaces, by name.
fn namespaces_peer(names: &BTreeSet<&str>) -> ClusterNetworkPolicyPeer {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    ClusterNetworkPolicyPeer {
        namespaces: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.to_string(),
                operator: "In".to_string(),
                values: Some(names.iter().map(|n| n.to_string()).collect()),
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every address (pods' included).
fn every_address() -> ClusterNetworkPolicyPeer {
    ClusterNetworkPolicyPeer {
        networks: Some(vec!["0.0.0.0/0".into(), "::/0".into()]),
        ..Default::default()
    }
}

/// Every pod of every namespace.
fn everything_peer() -> ClusterNetworkPolicyPeer {
    ClusterNetworkPolicyPeer {
        namespaces: Some(Default::default()),
        ..Default::default()
    }
}

fn port(protocol: Protocol, number: i32) -> ClusterNetworkPolicyProtocol {
    let port = Some(ProtocolPort {
        destination_port: Some(DestinationPort {
            number: Some(number),
            range: None,
        }),
    });
    match protocol {
        Protocol::UDP => ClusterNetworkPolicyProtocol {
            udp: port,
            ..Default::default()
        },
        Protocol::SCTP => ClusterNetworkPolicyProtocol {
            sctp: port,
            ..Default::default()
        },
        Protocol::TCP => ClusterNetworkPolicyProtocol {
            tcp: port,
            ..Default::default()
        },
    }
}

fn rule(
    name: &str,
    action: &str,
    peers: Vec<ClusterNetworkPolicyPeer>,
    protocols: Option<Vec<ClusterNetworkPolicyProtocol>>,
    ingress: bool,
) -> ClusterNetworkPolicyRule {
    let (from, to) = if ingress {
        (peers, Vec::new())
    } else {
        (Vec::new(), peers)
    };
    ClusterNetworkPolicyRule {
        name: Some(name.to_string()),
        action: action.to_string(),
        from,
        to,
        protocols,
    }
}

fn policy(
    name: &str,
    tier: &str,
    priority: i32,
    namespace: &str,
    ingress: Vec<ClusterNetworkPolicyRule>,
    egress: Vec<ClusterNetworkPolicyRule>,
) -> ClusterNetworkPolicy {
    ClusterNetworkPolicy::new(
        name,
        ClusterNetworkPolicySpec {
            tier: tier.to_string(),
            priority,
            subject: ClusterNetworkPolicySubject {
                namespaces: Some(name_selector(namespace)),
                pods: None,
            },
            ingress,
            egress,
        },
    )
}

#[cfg(test)]
mod tests;
