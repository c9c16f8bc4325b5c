//! NetworkPolicy semantics, table-driven. The cases follow the Kubernetes NetworkPolicy documentation
//! (concepts page and API reference) and the upstream e2e matrix (`test/e2e/network/netpol`): default
//! deny, selector AND vs OR, expressions, named ports, endPort, ipBlock except, several policies,
//! egress-only, UDP/SCTP.

use super::*;
use crate::cluster::workload::Workload;
use crate::monitor::evaluate::compiled;
use crate::monitor::evaluate::view::{ContainerPort, NamedPolicy, PodKey};
use network_enforcer_api::WorkloadKind;
use serde_json::{Value, json};

/// The fixture cluster:
///
/// | namespace | labels | pods (labels; IP; ports) |
/// |---|---|---|
/// | shop | team=a, env=prod | web-1 (app=web, tier=front; 10.0.0.10; http 8080/TCP, metrics 9090/TCP, syslog 514/UDP, sig 3868/SCTP), api-1 (app=api, tier=back; 10.0.0.11; http 8443/TCP, grpc 9000/TCP), db-1 (app=db; 10.0.0.12; pg 5432/TCP) |
/// | bank | team=b, env=prod | web-1 (app=web; 10.0.1.10; http 8080/TCP) |
/// | dev | team=a, env=dev | web-1 (app=web; 10.0.2.10, fd00::10) |
/// | kube-system | (none) | dns-1 (k8s-app=kube-dns; 10.0.3.10; dns 53/UDP, dns-tcp 53/TCP) |
pub(crate) fn fixture() -> ClusterView {
    let mut view = ClusterView::new();
    let labels = |pairs: &[(&str, &str)]| -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    view.insert_namespace("shop", labels(&[("team", "a"), ("env", "prod")]));
    view.insert_namespace("bank", labels(&[("team", "b"), ("env", "prod")]));
    view.insert_namespace("dev", labels(&[("team", "a"), ("env", "dev")]));
    let port = |name: &str, port: u16, protocol: Protocol| ContainerPort {
        name: Some(name.to_string()),
        port,
        protocol,
    };
    let mut pod =
        |ns: &str, name: &str, l: &[(&str, &str)], ips: &[&str], ports: Vec<ContainerPort>| {
            view.insert_pod(PodInfo {
                namespace: ns.into(),
                name: name.into(),
                labels: labels(l),
                ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                ports,
                workload: Some(Workload {
                    kind: WorkloadKind::Deployment,
                    name: name.trim_end_matches("-1").into(),
                }),
            })
        };
    use Protocol::*;
    pod(
        "shop",
        "web-1",
        &[("app", "web"), ("tier", "front")],
        &["10.0.0.10"],
        vec![
            port("http", 8080, TCP),
            port("metrics", 9090, TCP),
            port("syslog", 514, UDP),
            port("sig", 3868, SCTP),
        ],
    );
    pod(
        "shop",
        "api-1",
        &[("app", "api"), ("tier", "back")],
        &["10.0.0.11"],
        vec![port("http", 8443, TCP), port("grpc", 9000, TCP)],
    );
    pod(
        "shop",
        "db-1",
        &[("app", "db")],
        &["10.0.0.12"],
        vec![port("pg", 5432, TCP)],
    );
    pod(
        "bank",
        "web-1",
        &[("app", "web")],
        &["10.0.1.10"],
        vec![port("http", 8080, TCP)],
    );
    pod(
        "dev",
        "web-1",
        &[("app", "web")],
        &["10.0.2.10", "fd00::10"],
        vec![],
    );
    pod(
        "kube-system",
        "dns-1",
        &[("k8s-app", "kube-dns")],
        &["10.0.3.10"],
        vec![port("dns", 53, UDP), port("dns-tcp", 53, TCP)],
    );
    view
}

/// A NetworkPolicy `name` in `namespace` with the spec written as JSON.
pub(crate) fn np(namespace: &str, name: &str, spec: Value) -> NamedPolicy {
    NamedPolicy {
        namespace: namespace.into(),
        name: name.into(),
        spec: serde_json::from_value(spec).expect("a valid NetworkPolicySpec"),
    }
}

/// `"shop/web-1"` is a pod, anything else an IP address.
pub(crate) fn endpoint(s: &str) -> Endpoint {
    match s.split_once('/') {
        Some((ns, name)) => Endpoint::Pod(PodKey::new(ns, name)),
        None => Endpoint::Ip(s.parse().expect("an IP address")),
    }
}

/// `"shop/web-1 -> shop/api-1 TCP/9000"`.
pub(crate) fn flow(s: &str) -> Flow {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [from, "->", to, port] = parts[..] else {
        panic!("bad flow {s}")
    };
    let (protocol, port) = port.split_once('/').unwrap();
    Flow {
        source: endpoint(from),
        destination: endpoint(to),
        protocol: match protocol {
            "TCP" => Protocol::TCP,
            "UDP" => Protocol::UDP,
            "SCTP" => Protocol::SCTP,
            other => panic!("bad protocol {other}"),
        },
        port: port.parse().unwrap(),
    }
}

/// One case: policies in force, a flow, and the expected (egress, ingress) verdicts.
pub(crate) struct Case {
    pub name: &'static str,
    pub policies: Vec<NamedPolicy>,
    pub flow: &'static str,
    pub egress: bool,
    pub ingress: bool,
}

const ALLOW: bool = true;
const DENY: bool = false;

fn case(
    name: &'static str,
    policies: Vec<NamedPolicy>,
    flow: &'static str,
    egress: bool,
    ingress: bool,
) -> Case {
    Case {
        name,
        policies,
        flow,
        egress,
        ingress,
    }
}

fn deny_all_ingress(ns: &str) -> NamedPolicy {
    np(
        ns,
        "deny-ingress",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    )
}

fn deny_all_egress(ns: &str) -> NamedPolicy {
    np(
        ns,
        "deny-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    )
}

/// An ingress policy on shop's app=api pods with the given rules.
fn api_ingress(rules: Value) -> NamedPolicy {
    np(
        "shop",
        "api-ingress",
        json!({"podSelector": {"matchLabels": {"app": "api"}}, "policyTypes": ["Ingress"], "ingress": rules}),
    )
}

/// An ingress policy on shop's app=web pods with the given rules.
fn web_ingress(rules: Value) -> NamedPolicy {
    np(
        "shop",
        "web-ingress",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"], "ingress": rules}),
    )
}

/// An egress policy on shop's app=web pods with the given rules.
fn web_egress(rules: Value) -> NamedPolicy {
    np(
        "shop",
        "web-egress",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"], "egress": rules}),
    )
}

pub(crate) fn cases() -> Vec<Case> {
    vec![
        // --- isolation and policy types ---
        case(
            "no policy: everything allowed",
            vec![],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "default deny ingress isolates the destination",
            vec![deny_all_ingress("shop")],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "default deny ingress leaves egress alone",
            vec![deny_all_ingress("shop")],
            "shop/web-1 -> bank/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "default deny egress isolates the source",
            vec![deny_all_egress("shop")],
            "shop/web-1 -> bank/web-1 TCP/8080",
            DENY,
            ALLOW,
        ),
        case(
            "default deny egress leaves ingress alone",
            vec![deny_all_egress("shop")],
            "bank/web-1 -> shop/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "default deny both",
            vec![np(
                "shop",
                "deny",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            DENY,
            DENY,
        ),
        case(
            "allow all ingress over default deny",
            vec![
                deny_all_ingress("shop"),
                np("shop", "allow", json!({"podSelector": {}, "ingress": [{}]})),
            ],
            "dev/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "allow all egress over default deny",
            vec![
                deny_all_egress("shop"),
                np(
                    "shop",
                    "allow",
                    json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
                ),
            ],
            "shop/web-1 -> 8.8.8.8 UDP/53",
            ALLOW,
            ALLOW,
        ),
        case(
            "a policy isolates its own namespace only",
            vec![deny_all_ingress("bank"), deny_all_egress("bank")],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "a pod the podSelector misses is not isolated",
            vec![np(
                "shop",
                "db",
                json!({"podSelector": {"matchLabels": {"app": "db"}}}),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "absent podSelector selects the whole namespace",
            vec![np("shop", "all", json!({"policyTypes": ["Ingress"]}))],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "policyTypes default: ingress rules only means Ingress",
            vec![
                api_ingress(json!([{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]))
                    .with_types(None),
            ],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "policyTypes default: ingress only leaves egress open",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{}]}),
            )],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            ALLOW,
            ALLOW,
        ),
        case(
            "policyTypes default: egress rules add Egress",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]}),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            DENY,
            ALLOW,
        ),
        case(
            "policyTypes default: egress rules still imply Ingress",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{}]}),
            )],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "policyTypes default: empty egress list adds no Egress",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": []}),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "explicit Egress only: ingress rules are ignored",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {"matchLabels": {"app": "api"}}, "policyTypes": ["Egress"], "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]}),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        // --- pod and namespace selectors ---
        case(
            "podSelector peer in the same namespace",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "podSelector alone does not reach other namespaces",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]),
            )],
            "bank/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "empty podSelector: every pod of the namespace",
            vec![api_ingress(json!([{"from": [{"podSelector": {}}]}]))],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "empty podSelector: not other namespaces",
            vec![api_ingress(json!([{"from": [{"podSelector": {}}]}]))],
            "bank/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "expression In",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "edge"]}]}}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "expression NotIn excludes",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "expression NotIn matches pods without the key",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "expression Exists",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "expression DoesNotExist",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "namespaceSelector alone: every pod of those namespaces",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]),
            )],
            "bank/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "namespaceSelector alone: other namespaces denied",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]),
            )],
            "dev/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "namespaceSelector alone: not the policy's own namespace unless it matches",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "empty namespaceSelector: every pod of every namespace",
            vec![api_ingress(json!([{"from": [{"namespaceSelector": {}}]}]))],
            "kube-system/dns-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "empty namespaceSelector: no external address",
            vec![api_ingress(json!([{"from": [{"namespaceSelector": {}}]}]))],
            "203.0.113.5 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "namespaceSelector AND podSelector in one peer: both match",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"app": "web"}}}]}]),
            )],
            "dev/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "namespaceSelector AND podSelector: pod label misses",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"app": "web"}}}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "namespaceSelector AND podSelector: namespace misses",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"app": "web"}}}]}]),
            )],
            "bank/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "two peers are ORed: first",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}, {"podSelector": {"matchLabels": {"app": "db"}}}]}]),
            )],
            "bank/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "two peers are ORed: second",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}, {"podSelector": {"matchLabels": {"app": "db"}}}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "two peers are ORed: neither",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}, {"podSelector": {"matchLabels": {"app": "db"}}}]}]),
            )],
            "dev/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "namespace metadata.name label is implicit",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]}]),
            )],
            "kube-system/dns-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "namespace expression NotIn",
            vec![api_ingress(
                json!([{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}}]}]),
            )],
            "dev/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "selectors never match an external address",
            vec![api_ingress(json!([{"from": [{"podSelector": {}}]}]))],
            "10.9.9.9 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        // --- ports ---
        case(
            "numeric port",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "TCP", "port": 8080}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "numeric port: other port denied",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "TCP", "port": 8080}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/9090",
            ALLOW,
            DENY,
        ),
        case(
            "protocol defaults to TCP",
            vec![web_ingress(json!([{"ports": [{"port": 8080}]}]))],
            "shop/api-1 -> shop/web-1 UDP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "UDP port",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "UDP", "port": 514}]}]),
            )],
            "shop/api-1 -> shop/web-1 UDP/514",
            ALLOW,
            ALLOW,
        ),
        case(
            "UDP port does not allow TCP",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "UDP", "port": 514}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/514",
            ALLOW,
            DENY,
        ),
        case(
            "SCTP port",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "SCTP", "port": 3868}]}]),
            )],
            "shop/api-1 -> shop/web-1 SCTP/3868",
            ALLOW,
            ALLOW,
        ),
        case(
            "SCTP port does not allow TCP",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "SCTP", "port": 3868}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/3868",
            ALLOW,
            DENY,
        ),
        case(
            "protocol without port: every port of it",
            vec![web_ingress(json!([{"ports": [{"protocol": "UDP"}]}]))],
            "shop/api-1 -> shop/web-1 UDP/40000",
            ALLOW,
            ALLOW,
        ),
        case(
            "protocol without port: not other protocols",
            vec![web_ingress(json!([{"ports": [{"protocol": "UDP"}]}]))],
            "shop/api-1 -> shop/web-1 TCP/40000",
            ALLOW,
            DENY,
        ),
        case(
            "endPort: inside",
            vec![web_ingress(
                json!([{"ports": [{"port": 8000, "endPort": 8100}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "endPort: upper bound inclusive",
            vec![web_ingress(
                json!([{"ports": [{"port": 8000, "endPort": 8100}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8100",
            ALLOW,
            ALLOW,
        ),
        case(
            "endPort: lower bound inclusive",
            vec![web_ingress(
                json!([{"ports": [{"port": 8000, "endPort": 8100}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8000",
            ALLOW,
            ALLOW,
        ),
        case(
            "endPort: above",
            vec![web_ingress(
                json!([{"ports": [{"port": 8000, "endPort": 8100}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8101",
            ALLOW,
            DENY,
        ),
        case(
            "endPort below port: matches nothing",
            vec![web_ingress(
                json!([{"ports": [{"port": 8100, "endPort": 8000}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "endPort without port: matches nothing",
            vec![web_ingress(json!([{"ports": [{"endPort": 9000}]}]))],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "named port resolved on the destination",
            vec![web_ingress(json!([{"ports": [{"port": "http"}]}]))],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "named port: another number denied",
            vec![web_ingress(json!([{"ports": [{"port": "http"}]}]))],
            "shop/api-1 -> shop/web-1 TCP/9090",
            ALLOW,
            DENY,
        ),
        case(
            "named port: each destination pod resolves its own number",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": "http"}]}]}),
            )],
            "shop/web-1 -> shop/api-1 TCP/8443",
            ALLOW,
            ALLOW,
        ),
        case(
            "named port: the other pod's number is not this pod's",
            vec![np(
                "shop",
                "p",
                json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": "http"}]}]}),
            )],
            "shop/web-1 -> shop/api-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "named port with the wrong protocol",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "UDP", "port": "http"}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "named UDP port",
            vec![web_ingress(
                json!([{"ports": [{"protocol": "UDP", "port": "syslog"}]}]),
            )],
            "shop/api-1 -> shop/web-1 UDP/514",
            ALLOW,
            ALLOW,
        ),
        case(
            "named port with endPort: matches nothing",
            vec![web_ingress(
                json!([{"ports": [{"port": "http", "endPort": 9000}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "egress named port resolves on the destination pod",
            vec![web_egress(json!([{"ports": [{"port": "grpc"}]}]))],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "egress named port: destination without that port",
            vec![web_egress(json!([{"ports": [{"port": "grpc"}]}]))],
            "shop/web-1 -> shop/db-1 TCP/9000",
            DENY,
            ALLOW,
        ),
        case(
            "egress named port: an external address has none",
            vec![web_egress(json!([{"ports": [{"port": "grpc"}]}]))],
            "shop/web-1 -> 203.0.113.5 TCP/9000",
            DENY,
            ALLOW,
        ),
        case(
            "several ports in one rule are ORed",
            vec![web_ingress(
                json!([{"ports": [{"port": 80}, {"port": 443}]}]),
            )],
            "shop/api-1 -> shop/web-1 TCP/443",
            ALLOW,
            ALLOW,
        ),
        case(
            "unknown protocol matches nothing",
            vec![web_ingress(json!([{"ports": [{"protocol": "ICMP"}]}]))],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        case(
            "empty ports list: every port",
            vec![web_ingress(json!([{"ports": []}]))],
            "shop/api-1 -> shop/web-1 SCTP/1",
            ALLOW,
            ALLOW,
        ),
        // --- peers and ports together, several rules ---
        case(
            "peer and port must both match",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 9000}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "peer matches, port does not",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 9000}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/8443",
            ALLOW,
            DENY,
        ),
        case(
            "port matches, peer does not",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 9000}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "rules are ORed, no crossing between them",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 9000}]}, {"from": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"port": 8443}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "rules are ORed: second rule",
            vec![api_ingress(
                json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 9000}]}, {"from": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"port": 8443}]}]),
            )],
            "shop/db-1 -> shop/api-1 TCP/8443",
            ALLOW,
            ALLOW,
        ),
        case(
            "no peers but ports: any source, external too",
            vec![web_ingress(json!([{"ports": [{"port": 8080}]}]))],
            "203.0.113.5 -> shop/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "ingress with no rules denies everything",
            vec![web_ingress(json!([]))],
            "shop/api-1 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
        // --- ipBlock ---
        case(
            "ipBlock egress to an external address",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]),
            )],
            "shop/web-1 -> 203.0.113.5 TCP/443",
            ALLOW,
            ALLOW,
        ),
        case(
            "ipBlock egress: outside the CIDR",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]),
            )],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "ipBlock except: allowed part",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["192.168.0.0/16"]}}]}]),
            )],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            ALLOW,
            ALLOW,
        ),
        case(
            "ipBlock except: excepted part",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["192.168.0.0/16"]}}]}]),
            )],
            "shop/web-1 -> 192.168.1.1 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "ipBlock ingress from an external source",
            vec![web_ingress(
                json!([{"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]),
            )],
            "203.0.113.5 -> shop/web-1 TCP/8080",
            ALLOW,
            ALLOW,
        ),
        case(
            "ipBlock matches pod IPs (upstream e2e)",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]}]),
            )],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "ipBlock except can exclude a pod IP (upstream e2e)",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.12/32"]}}]}]),
            )],
            "shop/web-1 -> shop/db-1 TCP/5432",
            DENY,
            ALLOW,
        ),
        case(
            "ipBlock of the other family never matches",
            vec![web_egress(json!([{"to": [{"ipBlock": {"cidr": "::/0"}}]}]))],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "ipBlock IPv6",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "2001:db8::/32"}}]}]),
            )],
            "shop/web-1 -> 2001:db8::1 TCP/443",
            ALLOW,
            ALLOW,
        ),
        case(
            "ipBlock matches a dual-stack pod by its v6 address",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "fd00::/8"}}]}]),
            )],
            "shop/web-1 -> dev/web-1 TCP/80",
            ALLOW,
            ALLOW,
        ),
        case(
            "malformed CIDR matches nothing",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]),
            )],
            "shop/web-1 -> 10.0.0.1 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "malformed except makes the block match nothing",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["nope"]}}]}]),
            )],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "ipBlock mixed with a selector matches nothing",
            vec![web_egress(
                json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}, "podSelector": {}}]}]),
            )],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "an empty peer matches nothing",
            vec![web_egress(json!([{"to": [{}]}]))],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            DENY,
            ALLOW,
        ),
        case(
            "empty to with ports: any destination on them",
            vec![web_egress(
                json!([{"to": [], "ports": [{"protocol": "UDP", "port": 53}]}]),
            )],
            "shop/web-1 -> 8.8.8.8 UDP/53",
            ALLOW,
            ALLOW,
        ),
        // --- several policies, both sides ---
        case(
            "allows add up across policies",
            vec![
                api_ingress(json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}])),
                np(
                    "shop",
                    "db-too",
                    json!({"podSelector": {"matchLabels": {"app": "api"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]}),
                ),
            ],
            "shop/db-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "a policy selecting other pods allows nothing here",
            vec![
                api_ingress(json!([])),
                np(
                    "shop",
                    "db-open",
                    json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{}]}),
                ),
            ],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "egress of the source and ingress of the destination both apply",
            vec![
                web_egress(json!([{}])),
                api_ingress(json!([{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]}])),
            ],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            DENY,
        ),
        case(
            "default deny plus explicit allow on both sides",
            vec![
                np(
                    "shop",
                    "deny",
                    json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
                ),
                web_egress(
                    json!([{"to": [{"podSelector": {"matchLabels": {"app": "api"}}}], "ports": [{"port": 9000}]}]),
                ),
                api_ingress(
                    json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "grpc"}]}]),
                ),
            ],
            "shop/web-1 -> shop/api-1 TCP/9000",
            ALLOW,
            ALLOW,
        ),
        case(
            "default deny plus explicit allow: other destination",
            vec![
                np(
                    "shop",
                    "deny",
                    json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
                ),
                web_egress(
                    json!([{"to": [{"podSelector": {"matchLabels": {"app": "api"}}}], "ports": [{"port": 9000}]}]),
                ),
            ],
            "shop/web-1 -> shop/db-1 TCP/5432",
            DENY,
            DENY,
        ),
        case(
            "learned DNS rule",
            vec![web_egress(
                json!([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], "ports": [{"protocol": "UDP", "port": 53}]}]),
            )],
            "shop/web-1 -> kube-system/dns-1 UDP/53",
            ALLOW,
            ALLOW,
        ),
        case(
            "learned DNS rule: TCP 53 not learned",
            vec![web_egress(
                json!([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], "ports": [{"protocol": "UDP", "port": 53}]}]),
            )],
            "shop/web-1 -> kube-system/dns-1 TCP/53",
            DENY,
            ALLOW,
        ),
        case(
            "an external destination has no ingress side",
            vec![deny_all_ingress("shop")],
            "shop/web-1 -> 8.8.8.8 TCP/443",
            ALLOW,
            ALLOW,
        ),
        case(
            "an external source has no egress side",
            vec![deny_all_egress("shop"), deny_all_ingress("shop")],
            "8.8.8.8 -> shop/web-1 TCP/8080",
            ALLOW,
            DENY,
        ),
    ]
}

/// Test helper: replace a policy's `policyTypes`.
trait WithTypes {
    fn with_types(self, types: Option<Vec<String>>) -> Self;
}

impl WithTypes for NamedPolicy {
    fn with_types(mut self, types: Option<Vec<String>>) -> Self {
        self.spec.policy_types = types;
        self
    }
}

#[test]
fn network_policy_semantics_table() {
    let cases = cases();
    assert!(cases.len() >= 60, "the suite must keep at least 60 cases");
    let mut failures = Vec::new();
    for case in &cases {
        let mut view = fixture();
        for policy in &case.policies {
            view.insert_policy(policy.clone());
        }
        let verdict = evaluate(&view, &flow(case.flow)).expect(case.name);
        // The production path must give the very same verdict (the same deciding policies too).
        let production = compiled::evaluate(&view, &flow(case.flow)).expect(case.name);
        assert_eq!(
            production, verdict,
            "{}: production path and reference differ",
            case.name
        );
        if (verdict.egress.allowed, verdict.ingress.allowed) != (case.egress, case.ingress) {
            failures.push(format!(
                "{}: {} gave egress={} ingress={}, expected egress={} ingress={}",
                case.name,
                case.flow,
                verdict.egress.allowed,
                verdict.ingress.allowed,
                case.egress,
                case.ingress
            ));
        }
        // The verdict is always consistent with its own list of deciding policies.
        for side in [&verdict.egress, &verdict.ingress] {
            assert_eq!(
                side.allowed,
                side.policies.is_empty() || side.allowing().next().is_some(),
                "{}",
                case.name
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cidr_ip_blocks_can_be_limited_to_external_addresses() {
    let mut view = fixture();
    view.set_ip_blocks_match_pods(false);
    view.insert_policy(web_egress(
        json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]),
    ));
    let to_pod = evaluate(&view, &flow("shop/web-1 -> shop/api-1 TCP/9000")).unwrap();
    assert!(
        !to_pod.egress.allowed,
        "a pod IP is not matched when disabled"
    );
    let to_host = evaluate(&view, &flow("shop/web-1 -> 10.9.9.9 TCP/9000")).unwrap();
    assert!(to_host.egress.allowed, "external addresses still are");
}

#[test]
fn verdicts_name_the_policies_that_decided() {
    let mut view = fixture();
    view.insert_policy(deny_all_ingress("shop"));
    view.insert_policy(api_ingress(
        json!([{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]),
    ));
    view.insert_policy(web_ingress(json!([{}])));
    let verdict = evaluate(&view, &flow("shop/web-1 -> shop/api-1 TCP/9000")).unwrap();
    assert!(verdict.allowed());
    let decision = |name: &str, allows| PolicyDecision {
        namespace: "shop".into(),
        name: name.into(),
        allows,
    };
    assert_eq!(
        verdict.ingress.policies,
        vec![
            decision("api-ingress", true),
            decision("deny-ingress", false)
        ],
        "web-ingress does not select api-1 and is not listed"
    );
    assert!(verdict.ingress.isolated_by("shop", "deny-ingress"));
    assert!(!verdict.ingress.isolated_by("shop", "web-ingress"));
    assert_eq!(verdict.egress.policies, vec![]);
    assert_eq!(verdict.side(Direction::Ingress), &verdict.ingress);
}

/// `matching_rules` (for explanations) agrees with the verdicts of the whole semantics table: a
/// listed policy allows exactly when at least one of its rules matches.
#[test]
fn matching_rules_agree_with_every_verdict_of_the_table() {
    let mut explained = 0;
    for case in cases() {
        let mut view = fixture();
        for policy in &case.policies {
            view.insert_policy(policy.clone());
        }
        let flow = flow(case.flow);
        let verdict = evaluate(&view, &flow).expect(case.name);
        for direction in [Direction::Egress, Direction::Ingress] {
            for decision in &verdict.side(direction).policies {
                let policy = view
                    .policies_in(&decision.namespace)
                    .iter()
                    .find(|p| p.name == decision.name)
                    .expect("a listed policy is in the view");
                let rules = matching_rules(&view, policy.into(), direction, &flow).unwrap();
                let ends = compiled::resolve(&view, &flow.source, &flow.destination).unwrap();
                let parsed = PolicyRef::from(policy).parse();
                assert_eq!(
                    compiled::matching_rules(
                        &view,
                        &parsed,
                        direction,
                        ends,
                        flow.protocol,
                        flow.port
                    ),
                    rules,
                    "{}: production path and reference name different rules",
                    case.name
                );
                assert_eq!(
                    !rules.is_empty(),
                    decision.allows,
                    "{}: {direction:?} {} gave rules {rules:?}",
                    case.name,
                    decision.name
                );
                explained += rules.len();
            }
        }
    }
    assert!(explained > 20, "the table exercises allowing rules");
    // Every matching rule is named, in order, not only the first.
    let mut view = fixture();
    let policy = api_ingress(json!([
        {"ports": [{"port": 9000}]},
        {"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]},
        {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "grpc"}]}
    ]));
    view.insert_policy(policy.clone());
    let rules = matching_rules(
        &view,
        (&policy).into(),
        Direction::Ingress,
        &flow("shop/web-1 -> shop/api-1 TCP/9000"),
    );
    assert_eq!(rules, Ok(vec![0, 2]));
    let rules = matching_rules(
        &view,
        (&policy).into(),
        Direction::Ingress,
        &flow("shop/web-1 -> shop/gone-1 TCP/9000"),
    );
    assert!(rules.is_err(), "an unknown pod is an error, not a panic");
}

#[test]
fn unknown_pods_are_an_error() {
    let view = fixture();
    let err = evaluate(&view, &flow("shop/gone-1 -> shop/api-1 TCP/9000")).unwrap_err();
    assert_eq!(err, EvalError::UnknownPod(PodKey::new("shop", "gone-1")));
    assert_eq!(
        err.to_string(),
        "pod shop/gone-1 is not in the cluster view"
    );
}

#[test]
fn as_if_rendered_adds_or_replaces_by_name() {
    let mut view = fixture();
    // In force: a policy that denies all ingress to api.
    view.insert_policy(api_ingress(json!([])));
    let f = flow("shop/web-1 -> shop/api-1 TCP/9000");
    assert!(!evaluate(&view, &f).unwrap().ingress.allowed);
    // Rendered under the same name, an allow-all version replaces it...
    let allow = np(
        "shop",
        "api-ingress",
        json!({"podSelector": {"matchLabels": {"app": "api"}}, "ingress": [{}]}),
    );
    let verdict = evaluate_as_if_rendered(&view, (&allow).into(), &f).unwrap();
    assert!(verdict.ingress.allowed);
    assert_eq!(verdict.ingress.policies.len(), 1);
    // ...under another name it adds up with it (allows are additive)...
    let other = NamedPolicy {
        name: "other".into(),
        ..allow.clone()
    };
    let verdict = evaluate_as_if_rendered(&view, (&other).into(), &f).unwrap();
    assert!(verdict.ingress.allowed);
    assert_eq!(verdict.ingress.policies.len(), 2);
    // ...and in another namespace it changes nothing here.
    let elsewhere = NamedPolicy {
        namespace: "bank".into(),
        ..allow
    };
    assert!(
        !evaluate_as_if_rendered(&view, (&elsewhere).into(), &f)
            .unwrap()
            .ingress
            .allowed
    );
}

#[test]
fn ip_block_matches_agrees_with_mask_arithmetic() {
    // A hand-computed oracle for a few blocks, independent of ipnet.
    let block = |cidr: &str, except: &[&str]| IPBlock {
        cidr: cidr.into(),
        except: Some(except.iter().map(|s| s.to_string()).collect()),
    };
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert!(ip_block_matches(
        &block("10.1.0.0/16", &[]),
        ip("10.1.255.255")
    ));
    assert!(!ip_block_matches(
        &block("10.1.0.0/16", &[]),
        ip("10.2.0.0")
    ));
    assert!(
        ip_block_matches(&block("10.1.2.3/16", &[]), ip("10.1.9.9")),
        "host bits are ignored"
    );
    assert!(!ip_block_matches(
        &block("10.1.0.0/16", &["10.1.2.0/24"]),
        ip("10.1.2.200")
    ));
    assert!(ip_block_matches(
        &block("10.1.0.0/16", &["10.1.2.0/24"]),
        ip("10.1.3.0")
    ));
    assert!(ip_block_matches(
        &block("0.0.0.0/0", &[]),
        ip("255.255.255.255")
    ));
    assert!(
        !ip_block_matches(&block("10.0.0.1", &[]), ip("10.0.0.1")),
        "a bare address is not a CIDR"
    );
}

pub(crate) mod properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;

    fn pods() -> Vec<&'static str> {
        vec![
            "shop/web-1",
            "shop/api-1",
            "shop/db-1",
            "bank/web-1",
            "dev/web-1",
            "kube-system/dns-1",
            "203.0.113.5",
            "10.0.0.99",
        ]
    }

    fn peer() -> impl Strategy<Value = Value> {
        select(vec![
            json!({"podSelector": {"matchLabels": {"app": "web"}}}),
            json!({"podSelector": {}}),
            json!({"podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}}),
            json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
            json!({"namespaceSelector": {}}),
            json!({"namespaceSelector": {"matchLabels": {"team": "b"}}, "podSelector": {"matchLabels": {"app": "web"}}}),
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {}}),
            json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.12/32"]}}),
            json!({"ipBlock": {"cidr": "203.0.113.0/24"}}),
        ])
    }

    fn port() -> impl Strategy<Value = Value> {
        select(vec![
            json!({"port": 8080}),
            json!({"protocol": "UDP", "port": 53}),
            json!({"protocol": "UDP"}),
            json!({"port": "http"}),
            json!({"port": "grpc"}),
            json!({"port": 9000, "endPort": 9100}),
            json!({"protocol": "SCTP", "port": 3868}),
        ])
    }

    fn rule(peer_key: &'static str) -> impl Strategy<Value = Value> {
        (
            proptest::option::of(prop::collection::vec(peer(), 0..3)),
            proptest::option::of(prop::collection::vec(port(), 0..3)),
        )
            .prop_map(move |(peers, ports)| {
                let mut rule = serde_json::Map::new();
                if let Some(peers) = peers {
                    rule.insert(peer_key.into(), Value::Array(peers));
                }
                if let Some(ports) = ports {
                    rule.insert("ports".into(), Value::Array(ports));
                }
                Value::Object(rule)
            })
    }

    /// A random policy of a fixture namespace.
    pub(crate) fn policy(name: &'static str) -> impl Strategy<Value = NamedPolicy> {
        (
            select(vec!["shop", "bank", "dev"]),
            select(vec![
                json!({}),
                json!({"matchLabels": {"app": "web"}}),
                json!({"matchLabels": {"app": "api"}}),
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}),
            ]),
            select(vec![
                None,
                Some(vec!["Ingress"]),
                Some(vec!["Egress"]),
                Some(vec!["Ingress", "Egress"]),
            ]),
            proptest::option::of(prop::collection::vec(rule("from"), 0..3)),
            proptest::option::of(prop::collection::vec(rule("to"), 0..3)),
        )
            .prop_map(move |(ns, selector, types, ingress, egress)| {
                let mut spec = json!({"podSelector": selector});
                if let Some(types) = types {
                    spec["policyTypes"] = json!(types);
                }
                if let Some(ingress) = ingress {
                    spec["ingress"] = Value::Array(ingress);
                }
                if let Some(egress) = egress {
                    spec["egress"] = Value::Array(egress);
                }
                np(ns, name, spec)
            })
    }

    pub(crate) fn a_flow() -> impl Strategy<Value = Flow> {
        (
            select(pods()),
            select(pods()),
            select(vec![Protocol::TCP, Protocol::UDP, Protocol::SCTP]),
            select(vec![53u16, 514, 3868, 5432, 8080, 8443, 9000, 9050, 9090]),
        )
            .prop_map(|(from, to, protocol, port)| Flow {
                source: endpoint(from),
                destination: endpoint(to),
                protocol,
                port,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Monitor mode reports exactly what protect mode would block: evaluating a policy "as if
        /// rendered" gives the same verdict as having it in force.
        #[test]
        fn as_if_rendered_equals_in_force(
            existing in policy("existing"),
            ours in policy("ours"),
            f in a_flow(),
        ) {
            let mut monitor = fixture();
            monitor.insert_policy(existing.clone());
            let mut protect = monitor.clone();
            protect.insert_policy(ours.clone());
            prop_assert_eq!(
                evaluate_as_if_rendered(&monitor, (&ours).into(), &f).unwrap(),
                evaluate(&protect, &f).unwrap()
            );
        }

        /// Allows are additive: adding a policy never turns a denied side into an allowed one
        /// unless that policy allows the flow itself, and never denies a side that other policies
        /// already isolate and allow.
        #[test]
        fn adding_a_policy_is_monotone_on_isolated_sides(
            a in policy("a"),
            b in policy("b"),
            f in a_flow(),
        ) {
            let mut one = fixture();
            one.insert_policy(a);
            let before = evaluate(&one, &f).unwrap();
            let mut two = one.clone();
            two.insert_policy(b);
            let after = evaluate(&two, &f).unwrap();
            for (before, after) in [(&before.egress, &after.egress), (&before.ingress, &after.ingress)] {
                if !before.policies.is_empty() && before.allowed {
                    prop_assert!(after.allowed);
                }
                if !before.allowed && after.allowed {
                    prop_assert!(after.allowing().any(|p| p.name == "b"));
                }
            }
        }

        /// Policies' order, and the order of peers and ports within rules, do not matter.
        #[test]
        fn order_does_not_matter(a in policy("a"), b in policy("b"), f in a_flow()) {
            let mut view = fixture();
            view.insert_policy(a.clone());
            view.insert_policy(b.clone());
            let forward = evaluate(&view, &f).unwrap();
            let reverse_rules = |mut p: NamedPolicy| {
                for rule in p.spec.ingress.iter_mut().flatten() {
                    rule.from.iter_mut().for_each(|v| v.reverse());
                    rule.ports.iter_mut().for_each(|v| v.reverse());
                }
                p.spec.ingress.iter_mut().for_each(|v| v.reverse());
                for rule in p.spec.egress.iter_mut().flatten() {
                    rule.to.iter_mut().for_each(|v| v.reverse());
                    rule.ports.iter_mut().for_each(|v| v.reverse());
                }
                p.spec.egress.iter_mut().for_each(|v| v.reverse());
                p
            };
            let mut reversed = fixture();
            reversed.insert_policy(reverse_rules(b));
            reversed.insert_policy(reverse_rules(a));
            prop_assert_eq!(forward, evaluate(&reversed, &f).unwrap());
        }

        /// ipBlock membership agrees with IPv4 mask arithmetic.
        #[test]
        fn ipv4_blocks_match_mask_arithmetic(
            net in any::<u32>(),
            prefix in 0u8..=32,
            except_prefix in 0u8..=32,
            ip in any::<u32>(),
        ) {
            let mask = |p: u8| if p == 0 { 0 } else { u32::MAX << (32 - p) };
            let cidr = format!("{}/{}", std::net::Ipv4Addr::from(net & mask(prefix)), prefix);
            // The except block: the address's own network at except_prefix.
            let except = format!("{}/{}", std::net::Ipv4Addr::from(ip & mask(except_prefix)), except_prefix);
            let in_block = ip & mask(prefix) == net & mask(prefix);
            let block = IPBlock { cidr: cidr.clone(), except: None };
            prop_assert_eq!(ip_block_matches(&block, IpAddr::from(std::net::Ipv4Addr::from(ip))), in_block);
            let block = IPBlock { cidr, except: Some(vec![except]) };
            prop_assert!(!ip_block_matches(&block, IpAddr::from(std::net::Ipv4Addr::from(ip))), "the address's own network is excepted");
        }
    }
}
