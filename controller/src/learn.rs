//! Learning (SPEC section 4): what an observed, allowed connection adds to which proposal.
//!
//! `flows` turns an agent observation into workload-level flows using the [`Index`]; `edges` turns a
//! flow into proposal edges for the backend; `apply` merges an edge into a proposal spec. All pure: the
//! writer in [`crate::proposals`] only batches edges and writes the result.

use crate::resolve::{Endpoint, Index, PodKey, Resolved, WorkloadEndpoint};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use network_enforcer_api::naming::proposal_name;
use network_enforcer_api::{
    Backend, Direction, IstioFrom, IstioOperation, IstioPolicy, IstioRule, IstioSource, IstioTo,
    Protocol, TargetRef, WorkloadKind, WorkloadNetworkPolicyProposal,
    WorkloadNetworkPolicyProposalSpec,
};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Who opened the connection, seen from the local pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opened {
    /// The local pod connected to the peer.
    Outbound,
    /// The peer connected to the local pod.
    Inbound,
}

/// One allowed connection as an agent reports it, with the local side already known.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Observation {
    pub local: PodKey,
    pub peer: IpAddr,
    /// The service port: the peer's port when outbound, the local port when inbound.
    pub port: u16,
    pub protocol: Protocol,
    pub opened: Opened,
    /// When it was last seen, ms since the epoch (resolves IPs that were reused since).
    pub at_ms: i64,
}

/// A connection between two endpoints on a destination (container) port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    pub source: Endpoint,
    pub destination: Endpoint,
    pub protocol: Protocol,
    pub port: u16,
}

/// Why an observation produced no flow. Counted as a metric by the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    #[error("the local pod {0}/{1} is not in the index (deleted, or not yet seen)")]
    UnknownLocalPod(String, String),
    #[error("Service {0}/{1} has no backend for that port yet")]
    ServiceWithoutBackends(String, String),
}

/// The workload-level flows an observation stands for (a Service with several backend workloads gives one
/// flow per workload).
pub fn flows(index: &Index, obs: &Observation) -> Result<Vec<Flow>, Unresolved> {
    let local = index
        .pod(&obs.local.0, &obs.local.1)
        .ok_or_else(|| Unresolved::UnknownLocalPod(obs.local.0.clone(), obs.local.1.clone()))?;
    let local = Endpoint::Workload(index.endpoint_of(local));
    match obs.opened {
        Opened::Outbound => match index.resolve(obs.peer, obs.port, obs.protocol, obs.at_ms) {
            Resolved::Workloads(backends) => Ok(backends
                .into_iter()
                .map(|(w, port)| Flow {
                    source: local.clone(),
                    destination: Endpoint::Workload(w),
                    protocol: obs.protocol,
                    port,
                })
                .collect()),
            Resolved::Address(peer, port) => Ok(vec![Flow {
                source: local,
                destination: peer,
                protocol: obs.protocol,
                port,
            }]),
            Resolved::ServiceWithoutBackends { namespace, name } => {
                Err(Unresolved::ServiceWithoutBackends(namespace, name))
            }
        },
        Opened::Inbound => {
            // An inbound peer is never a ClusterIP (kube-proxy preserves the client IP).
            let source = match index.resolve(obs.peer, 0, obs.protocol, obs.at_ms) {
                Resolved::Workloads(mut w) if w.len() == 1 => Endpoint::Workload(w.remove(0).0),
                Resolved::Address(peer, _) => peer,
                _ => Endpoint::External(obs.peer),
            };
            Ok(vec![Flow {
                source,
                destination: local,
                protocol: obs.protocol,
                port: obs.port,
            }])
        }
    }
}

/// The proposal an edge goes to: one per (workload, direction).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub workload: WorkloadEndpoint,
    pub kind: WorkloadKind,
    pub direction: Direction,
}

impl Target {
    /// The proposal's name.
    pub fn name(&self) -> String {
        proposal_name(self.kind, &self.workload.name, self.direction)
    }
}

/// What one flow adds to one proposal.
#[derive(Clone, Debug, PartialEq)]
pub enum Edge {
    Kubernetes {
        peer: NetworkPolicyPeer,
        port: NetworkPolicyPort,
    },
    Istio {
        principal: String,
        port: String,
    },
}

/// The proposal edges a flow produces for `backend` (SPEC 4.1): kubernetes → the source's egress and
/// the destination's ingress; istio → the destination's ingress only, TCP only, from a workload with an
/// identity. Bare pods (no workload kind) are peers but get no proposal of their own.
pub fn edges(flow: &Flow, backend: Backend) -> Vec<(Target, Edge)> {
    let mut out = Vec::new();
    match backend {
        Backend::Kubernetes => {
            let port = NetworkPolicyPort {
                protocol: Some(protocol_name(flow.protocol).into()),
                port: Some(IntOrString::Int(i32::from(flow.port))),
                end_port: None,
            };
            if let Endpoint::Workload(src) = &flow.source {
                if let Some(kind) = src.kind {
                    out.push((
                        Target {
                            workload: src.clone(),
                            kind,
                            direction: Direction::Egress,
                        },
                        Edge::Kubernetes {
                            peer: peer_of(&flow.destination),
                            port: port.clone(),
                        },
                    ));
                }
            }
            if let Endpoint::Workload(dst) = &flow.destination {
                if let Some(kind) = dst.kind {
                    out.push((
                        Target {
                            workload: dst.clone(),
                            kind,
                            direction: Direction::Ingress,
                        },
                        Edge::Kubernetes {
                            peer: peer_of(&flow.source),
                            port,
                        },
                    ));
                }
            }
        }
        Backend::Istio => {
            if let (Endpoint::Workload(src), Endpoint::Workload(dst), Protocol::TCP) =
                (&flow.source, &flow.destination, flow.protocol)
            {
                if let Some(kind) = dst.kind {
                    out.push((
                        Target {
                            workload: dst.clone(),
                            kind,
                            direction: Direction::Ingress,
                        },
                        Edge::Istio {
                            principal: principal(src),
                            port: flow.port.to_string(),
                        },
                    ));
                }
            }
        }
    }
    out
}

/// The Istio principal of a workload: `cluster.local/ns/<ns>/sa/<serviceaccount>`.
pub fn principal(w: &WorkloadEndpoint) -> String {
    format!("cluster.local/ns/{}/sa/{}", w.namespace, w.service_account)
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::TCP => "TCP",
        Protocol::UDP => "UDP",
        Protocol::SCTP => "SCTP",
    }
}

/// The NetworkPolicy peer for an endpoint (SPEC 4.3): a workload by namespace name and its own selector;
/// anything outside the cluster's pods by its address as a /32 (/128) ipBlock.
pub fn peer_of(endpoint: &Endpoint) -> NetworkPolicyPeer {
    match endpoint {
        Endpoint::Workload(w) => NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    NAMESPACE_NAME_LABEL.to_string(),
                    w.namespace.clone(),
                )])),
                match_expressions: None,
            }),
            pod_selector: Some(w.label_selector()),
            ip_block: None,
        },
        Endpoint::Node { ip, .. } | Endpoint::External(ip) => NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: match ip {
                    IpAddr::V4(_) => format!("{ip}/32"),
                    IpAddr::V6(_) => format!("{ip}/128"),
                },
                except: None,
            }),
            ..NetworkPolicyPeer::default()
        },
    }
}

/// A new, empty proposal for `target`, owned by its workload when the workload's uid is known.
pub fn new_proposal(target: &Target, backend: Backend) -> WorkloadNetworkPolicyProposal {
    let selector = target.workload.label_selector();
    let owner_references = target.workload.uid.as_ref().map(|uid| {
        vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: target.kind.as_str().into(),
            name: target.workload.name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    let (kubernetes, istio) = match backend {
        Backend::Kubernetes => (
            Some(NetworkPolicySpec {
                pod_selector: Some(selector),
                policy_types: Some(vec![target.direction.as_str().into()]),
                ..NetworkPolicySpec::default()
            }),
            None,
        ),
        Backend::Istio => (
            None,
            Some(IstioPolicy {
                selector,
                rules: vec![],
            }),
        ),
    };
    WorkloadNetworkPolicyProposal {
        metadata: ObjectMeta {
            name: Some(target.name()),
            namespace: Some(target.workload.namespace.clone()),
            owner_references,
            ..ObjectMeta::default()
        },
        spec: WorkloadNetworkPolicyProposalSpec {
            backend,
            kubernetes,
            istio,
            target_ref: TargetRef {
                kind: target.kind,
                name: target.workload.name.clone(),
            },
            direction: target.direction,
        },
        status: None,
    }
}

/// Merges `edge` into `spec` (SPEC 4.3): the rule whose single peer equals the edge's peer gets the port
/// if missing; otherwise a rule is appended. Never removes anything. Returns whether `spec` changed.
pub fn apply(spec: &mut WorkloadNetworkPolicyProposalSpec, edge: &Edge) -> bool {
    match edge {
        Edge::Kubernetes { peer, port } => {
            let Some(np) = spec.kubernetes.as_mut() else {
                return false;
            };
            let peers = vec![peer.clone()];
            // Egress and ingress rules are different types with the same shape: (peers, ports).
            match spec.direction {
                Direction::Egress => upsert_rule(
                    np.egress.get_or_insert_with(Vec::new),
                    |r| (r.to.as_ref(), &mut r.ports),
                    peers,
                    port,
                    |to, ports| NetworkPolicyEgressRule {
                        to: Some(to),
                        ports: Some(ports),
                    },
                ),
                Direction::Ingress => upsert_rule(
                    np.ingress.get_or_insert_with(Vec::new),
                    |r| (r.from.as_ref(), &mut r.ports),
                    peers,
                    port,
                    |from, ports| NetworkPolicyIngressRule {
                        from: Some(from),
                        ports: Some(ports),
                    },
                ),
            }
        }
        Edge::Istio { principal, port } => {
            let Some(istio) = spec.istio.as_mut() else {
                return false;
            };
            let from = vec![IstioFrom {
                source: IstioSource {
                    principals: vec![principal.clone()],
                },
            }];
            match istio.rules.iter_mut().find(|r| r.from == from) {
                Some(rule) => {
                    if rule.to.is_empty() {
                        rule.to.push(IstioTo::default());
                    }
                    let ports = &mut rule.to[0].operation.ports;
                    if ports.contains(port) {
                        false
                    } else {
                        ports.push(port.clone());
                        true
                    }
                }
                None => {
                    istio.rules.push(IstioRule {
                        from,
                        to: vec![IstioTo {
                            operation: IstioOperation {
                                ports: vec![port.clone()],
                            },
                        }],
                    });
                    true
                }
            }
        }
    }
}

/// Adds `port` to the rule whose peers are exactly `peers`, or appends a new rule; returns whether
/// `rules` changed.
fn upsert_rule<R>(
    rules: &mut Vec<R>,
    parts: impl Fn(
        &mut R,
    ) -> (
        Option<&Vec<NetworkPolicyPeer>>,
        &mut Option<Vec<NetworkPolicyPort>>,
    ),
    peers: Vec<NetworkPolicyPeer>,
    port: &NetworkPolicyPort,
    new_rule: impl FnOnce(Vec<NetworkPolicyPeer>, Vec<NetworkPolicyPort>) -> R,
) -> bool {
    for rule in rules.iter_mut() {
        let (rule_peers, ports) = parts(rule);
        if rule_peers == Some(&peers) {
            return add_port(ports.get_or_insert_with(Vec::new), port);
        }
    }
    rules.push(new_rule(peers, vec![port.clone()]));
    true
}

fn add_port(ports: &mut Vec<NetworkPolicyPort>, port: &NetworkPolicyPort) -> bool {
    if ports.contains(port) {
        return false;
    }
    ports.push(port.clone());
    true
}

/// Number of peers (rules) in a proposal spec.
pub fn peer_count(spec: &WorkloadNetworkPolicyProposalSpec) -> usize {
    match (&spec.kubernetes, &spec.istio) {
        (Some(np), _) => {
            np.ingress.as_ref().map_or(0, Vec::len) + np.egress.as_ref().map_or(0, Vec::len)
        }
        (None, Some(istio)) => istio.rules.len(),
        (None, None) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Pod, Service};
    use serde_json::json;

    const T: i64 = 1_000_000;

    fn pod(
        ns: &str,
        name: &str,
        ip: &str,
        app: &str,
        owner_rs: Option<(&str, &str)>,
        sa: &str,
    ) -> Pod {
        let mut meta = json!({"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": {"app": app}});
        if let Some((rs, hash)) = owner_rs {
            meta["labels"]["pod-template-hash"] = json!(hash);
            meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": "rs", "controller": true}]);
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 18080},
                {"name": "echo-udp", "containerPort": 18081, "protocol": "UDP"}
            ]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        }))
        .unwrap()
    }

    /// The SPEC section 10 cluster: client and server Deployments in `shop`, a Service, and kube-dns.
    fn index() -> Index {
        let mut ix = Index::default();
        for (ns, name, app) in [
            ("shop", "http-client", "http-client"),
            ("shop", "http-server", "http-server"),
        ] {
            let d: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "uid": format!("uid-deploy-{name}")},
                "spec": {"selector": {"matchLabels": {"app": app}}, "template": {}}
            }))
            .unwrap();
            ix.apply_deployment(&d);
        }
        let dns: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "uid": "uid-dns"},
            "spec": {"selector": {"matchLabels": {"k8s-app": "kube-dns"}}, "template": {}}
        }))
        .unwrap();
        ix.apply_deployment(&dns);
        ix.apply_pod(
            &pod(
                "shop",
                "http-client-aaa-1",
                "10.0.0.1",
                "http-client",
                Some(("http-client-aaa", "aaa")),
                "http-client-sa",
            ),
            T,
        );
        ix.apply_pod(
            &pod(
                "shop",
                "http-client-aaa-2",
                "10.0.0.4",
                "http-client",
                Some(("http-client-aaa", "aaa")),
                "http-client-sa",
            ),
            T,
        );
        ix.apply_pod(
            &pod(
                "shop",
                "http-server-bbb-1",
                "10.0.0.2",
                "http-server",
                Some(("http-server-bbb", "bbb")),
                "http-server-sa",
            ),
            T,
        );
        let mut dns_pod = pod(
            "kube-system",
            "kube-dns-ccc-1",
            "10.0.0.3",
            "x",
            Some(("kube-dns-ccc", "ccc")),
            "default",
        );
        dns_pod.metadata.labels = Some(BTreeMap::from([
            ("k8s-app".into(), "kube-dns".into()),
            ("pod-template-hash".into(), "ccc".into()),
        ]));
        ix.apply_pod(&dns_pod, T);
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "http-service", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.20", "selector": {"app": "http-server"}, "ports": [
                {"port": 18080, "targetPort": 18080},
                {"port": 18082, "targetPort": 18082},
                {"port": 18083, "targetPort": "echo-udp", "protocol": "UDP"}
            ]}
        }))
        .unwrap();
        ix.apply_service(&svc);
        let dns_svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"k8s-app": "kube-dns"}, "ports": [{"port": 53, "protocol": "UDP"}]}
        }))
        .unwrap();
        ix.apply_service(&dns_svc);
        ix
    }

    fn obs(local: &str, peer: &str, port: u16, protocol: Protocol, opened: Opened) -> Observation {
        Observation {
            local: ("shop".into(), local.into()),
            peer: peer.parse().unwrap(),
            port,
            protocol,
            opened,
            at_ms: T + 1,
        }
    }

    /// Learns `observations` into proposals, as the writer would, and returns them by name.
    fn learn(
        observations: &[Observation],
        backend: Backend,
    ) -> BTreeMap<String, WorkloadNetworkPolicyProposal> {
        let ix = index();
        let mut out: BTreeMap<String, WorkloadNetworkPolicyProposal> = BTreeMap::new();
        for o in observations {
            for flow in flows(&ix, o).unwrap() {
                for (target, edge) in edges(&flow, backend) {
                    let p = out
                        .entry(target.name())
                        .or_insert_with(|| new_proposal(&target, backend));
                    apply(&mut p.spec, &edge);
                }
            }
        }
        out
    }

    fn scenario() -> Vec<Observation> {
        vec![
            obs(
                "http-client-aaa-1",
                "10.96.0.20",
                18080,
                Protocol::TCP,
                Opened::Outbound,
            ),
            obs(
                "http-client-aaa-1",
                "10.96.0.10",
                53,
                Protocol::UDP,
                Opened::Outbound,
            ),
            obs(
                "http-server-bbb-1",
                "10.0.0.1",
                18080,
                Protocol::TCP,
                Opened::Inbound,
            ),
        ]
    }

    #[test]
    fn spec_section_10_kubernetes_proposals() {
        let learned = learn(&scenario(), Backend::Kubernetes);
        // DNS also teaches kube-dns an ingress rule; in namespace `shop` there are exactly two.
        let in_shop: Vec<&String> = learned
            .iter()
            .filter(|(_, p)| p.metadata.namespace.as_deref() == Some("shop"))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            in_shop,
            [
                "deployment-http-client-egress",
                "deployment-http-server-ingress"
            ]
        );
        let egress = serde_json::to_value(&learned["deployment-http-client-egress"].spec).unwrap();
        assert_eq!(
            egress,
            json!({
                "backend": "kubernetes", "direction": "Egress",
                "targetRef": {"kind": "Deployment", "name": "http-client"},
                "kubernetes": {
                    "podSelector": {"matchLabels": {"app": "http-client"}},
                    "policyTypes": ["Egress"],
                    "egress": [
                        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}},
                                 "podSelector": {"matchLabels": {"app": "http-server"}}}],
                         "ports": [{"protocol": "TCP", "port": 18080}]},
                        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                 "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                         "ports": [{"protocol": "UDP", "port": 53}]}
                    ]
                }
            })
        );
        let ingress =
            serde_json::to_value(&learned["deployment-http-server-ingress"].spec).unwrap();
        assert_eq!(
            ingress["kubernetes"]["ingress"],
            json!([{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}},
                              "podSelector": {"matchLabels": {"app": "http-client"}}}],
                    "ports": [{"protocol": "TCP", "port": 18080}]}])
        );
        let owner = &learned["deployment-http-server-ingress"]
            .metadata
            .owner_references
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Deployment", "uid-deploy-http-server", Some(true))
        );
    }

    #[test]
    fn repeated_flows_from_several_replicas_change_nothing() {
        let once = learn(&scenario(), Backend::Kubernetes);
        let mut many = Vec::new();
        for _ in 0..100 {
            many.extend(scenario());
            many.push(obs(
                "http-client-aaa-2",
                "10.96.0.20",
                18080,
                Protocol::TCP,
                Opened::Outbound,
            ));
            many.push(obs(
                "http-server-bbb-1",
                "10.0.0.4",
                18080,
                Protocol::TCP,
                Opened::Inbound,
            ));
        }
        assert_eq!(learn(&many, Backend::Kubernetes), once);
    }

    #[test]
    fn a_new_port_joins_the_peer_rule_and_a_new_peer_gets_a_rule() {
        let mut o = scenario();
        o.push(obs(
            "http-client-aaa-1",
            "10.96.0.20",
            18082,
            Protocol::TCP,
            Opened::Outbound,
        ));
        o.push(obs(
            "http-client-aaa-1",
            "93.184.216.34",
            443,
            Protocol::TCP,
            Opened::Outbound,
        ));
        let learned = learn(&o, Backend::Kubernetes);
        let egress = learned["deployment-http-client-egress"]
            .spec
            .kubernetes
            .clone()
            .unwrap()
            .egress
            .unwrap();
        assert_eq!(egress.len(), 3);
        assert_eq!(
            egress[0].ports.as_ref().unwrap().len(),
            2,
            "18080 and 18082 on the server rule"
        );
        assert_eq!(
            egress[2].to.as_ref().unwrap()[0]
                .ip_block
                .as_ref()
                .unwrap()
                .cidr,
            "93.184.216.34/32"
        );
        assert_eq!(
            peer_count(&learned["deployment-http-client-egress"].spec),
            3
        );
    }

    #[test]
    fn service_named_target_port_resolves_to_the_container_port() {
        let ix = index();
        let f = flows(
            &ix,
            &obs(
                "http-client-aaa-1",
                "10.96.0.20",
                18083,
                Protocol::UDP,
                Opened::Outbound,
            ),
        )
        .unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].port, 18081,
            "the container port, never the Service port"
        );
    }

    #[test]
    fn istio_learns_only_the_destination_ingress_principal() {
        let learned = learn(&scenario(), Backend::Istio);
        assert_eq!(
            learned.keys().collect::<Vec<_>>(),
            ["deployment-http-server-ingress"]
        );
        let spec = serde_json::to_value(&learned["deployment-http-server-ingress"].spec).unwrap();
        assert_eq!(
            spec["istio"],
            json!({"selector": {"matchLabels": {"app": "http-server"}},
                   "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/http-client-sa"]}}],
                              "to": [{"operation": {"ports": ["18080"]}}]}]})
        );
    }

    #[test]
    fn unknown_local_pods_and_empty_services_are_reported() {
        let ix = index();
        assert!(matches!(
            flows(
                &ix,
                &obs("gone", "10.0.0.2", 1, Protocol::TCP, Opened::Outbound)
            ),
            Err(Unresolved::UnknownLocalPod(..))
        ));
        assert!(matches!(
            flows(
                &ix,
                &obs(
                    "http-client-aaa-1",
                    "10.96.0.20",
                    9999,
                    Protocol::TCP,
                    Opened::Outbound
                )
            ),
            Err(Unresolved::ServiceWithoutBackends(..))
        ));
    }

    #[test]
    fn reused_ip_resolves_to_the_pod_that_held_it_at_the_time() {
        let mut ix = index();
        ix.delete_pod("shop", "http-server-bbb-1", T + 10);
        let newcomer = pod("shop", "other-1", "10.0.0.2", "other", None, "default");
        ix.apply_pod(&newcomer, T + 20);
        assert_eq!(
            ix.pod_at("10.0.0.2".parse().unwrap(), T + 5).unwrap().name,
            "http-server-bbb-1"
        );
        assert_eq!(
            ix.pod_at("10.0.0.2".parse().unwrap(), T + 25).unwrap().name,
            "other-1"
        );
        // After the history window the old holder is forgotten.
        ix.apply_pod(&newcomer, T + 10 + crate::resolve::IP_HISTORY_MS + 1);
        assert_eq!(
            ix.pod_at("10.0.0.2".parse().unwrap(), T + 5).unwrap().name,
            "other-1"
        );
    }
}
