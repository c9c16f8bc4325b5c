use super::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

const NODE: &str = "n1";

/// Namespaces x (`ns=x`) and y (`ns=y`); pods x/a, x/b on this node, y/a and y/b on another, a
/// host-network pod x/h here and a finished pod x/done here. Every pod serves `http` (TCP) and
/// `dns` (UDP), on numbers that differ per pod so named ports show where they were resolved.
fn cluster(policies: &[Value]) -> Cluster {
    let mut c = Cluster::default();
    for ns in ["x", "y"] {
        let n: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns, "labels": {"ns": ns}}}))
                .unwrap();
        c.apply_namespace(&n);
    }
    let pods = [
        ("x", "a", NODE, "10.0.0.1", 8001, false, "Running"),
        ("x", "b", NODE, "10.0.0.2", 8002, false, "Running"),
        ("y", "a", "n2", "10.0.1.1", 8011, false, "Running"),
        ("y", "b", "n2", "10.0.1.2", 8012, false, "Running"),
        ("x", "h", NODE, "192.168.0.1", 8021, true, "Running"),
        ("x", "done", NODE, "10.0.0.9", 8031, false, "Succeeded"),
    ];
    for (ns, name, node, ip, http, host, phase) in pods {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
            "spec": {"nodeName": node, "hostNetwork": host, "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": http},
                {"name": "dns", "containerPort": http + 100, "protocol": "UDP"}
            ]}]},
            "status": {"phase": phase, "podIPs": [{"ip": ip}]}
        }))
        .unwrap();
        c.apply_pod(&pod);
    }
    for (i, spec) in policies.iter().enumerate() {
        let p: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"namespace": spec.get("ns").and_then(Value::as_str).unwrap_or("x"),
                         "name": format!("p{i}"),
                         "annotations": spec.get("annotations")},
            "spec": spec["spec"]
        }))
        .unwrap();
        c.apply_policy(&p);
    }
    c
}

fn ips(list: &[&str]) -> Peers {
    Peers::Addresses(Arc::new(
        list.iter().map(|ip| ip.parse().unwrap()).collect(),
    ))
}

fn tcp(first: u16, last: u16) -> PortRange {
    PortRange {
        protocol: Protocol::TCP,
        first,
        last,
    }
}

fn pod<'a>(r: &'a Ruleset, name: &str) -> Option<&'a IsolatedPod> {
    r.pods
        .iter()
        .find(|p| format!("{}/{}", p.namespace, p.name) == name)
}

#[test]
fn egress_names_of_a_rendered_policy_become_the_pods_name_allowances() {
    let rules = json!([
        {"names": ["api.partner.test", "*.cdn.partner.test"], "ports": [{"port": 443}]},
        {"names": ["range.partner.test"], "ports": [{"protocol": "UDP", "port": 9000, "endPort": 9010}]},
        {"names": ["any.partner.test"]},
    ]);
    let policy = |annotation: Value, types: Value| {
        json!({"annotations": {EGRESS_NAME_RULES: annotation},
                   "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": types,
                            "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]}})
    };
    let ruleset = compile(
        &cluster(&[policy(Value::String(rules.to_string()), json!(["Egress"]))]),
        NODE,
    );
    let egress = pod(&ruleset, "x/a").unwrap().egress.as_ref().unwrap();
    let names: Vec<(Vec<&str>, Vec<PortRange>)> = egress
        .names
        .iter()
        .map(|a| {
            (
                a.names.iter().map(String::as_str).collect(),
                a.ports.clone(),
            )
        })
        .collect();
    let udp = |first, last| PortRange {
        protocol: Protocol::UDP,
        first,
        last,
    };
    assert_eq!(
        names,
        [
            (
                vec!["api.partner.test", "*.cdn.partner.test"],
                vec![tcp(443, 443)]
            ),
            (vec!["range.partner.test"], vec![udp(9000, 9010)]),
            (
                vec!["any.partner.test"],
                vec![tcp(0, u16::MAX), udp(0, u16::MAX)]
            ),
        ]
    );
    assert!(egress.names[0].allows("eu.cdn.partner.test"));
    assert!(!egress.names[0].allows("cdn.partner.test"));
    assert!(ruleset.has_names() && ruleset.warnings.is_empty());

    // Only a policy isolating egress lends its names; a broken annotation or port is reported and
    // allows nothing by name.
    let ingress_only = compile(
        &cluster(&[policy(Value::String(rules.to_string()), json!(["Ingress"]))]),
        NODE,
    );
    assert!(!ingress_only.has_names());
    let broken = compile(
        &cluster(&[policy(Value::String("[{".into()), json!(["Egress"]))]),
        NODE,
    );
    assert!(!broken.has_names());
    assert!(
        broken.warnings[0].contains("NetworkPolicy x/p0: annotation"),
        "{:?}",
        broken.warnings
    );
    let sctp = json!([{"names": ["a.partner.test"], "ports": [{"protocol": "SCTP", "port": 1}]}]);
    let refused = compile(
        &cluster(&[policy(Value::String(sctp.to_string()), json!(["Egress"]))]),
        NODE,
    );
    assert!(!refused.has_names());
    assert!(
        refused.warnings[0].contains("cannot be enforced"),
        "{:?}",
        refused.warnings
    );
}

const EGRESS_NAME_RULES: &str = network_enforcer_api::keys::EGRESS_NAME_RULES_ANNOTATION;

#[test]
fn without_policies_nothing_is_isolated() {
    assert_eq!(compile(&cluster(&[]), NODE), Ruleset::default());
}

#[test]
fn isolation_follows_the_pod_selector_the_node_and_policy_types_defaulting() {
    // (policy spec, expected isolated pods of this node as (name, ingress, egress))
    type Isolated = Vec<(&'static str, bool, bool)>;
    let cases: Vec<(Value, Isolated)> = vec![
        // Deny-all ingress: every pod of x on this node, but not the host-network or finished one.
        (
            json!({"spec": {"podSelector": {}}}),
            vec![("x/a", true, false), ("x/b", true, false)],
        ),
        // An egress rule without policyTypes isolates egress too; an empty egress section
        // does not (the API server's defaulting).
        (
            json!({"spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{}]}}),
            vec![("x/a", true, true)],
        ),
        (
            json!({"spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "egress": []}}),
            vec![("x/a", true, false)],
        ),
        // Explicit Egress only.
        (
            json!({"spec": {"podSelector": {}, "policyTypes": ["Egress"]}}),
            vec![("x/a", false, true), ("x/b", false, true)],
        ),
        // A policy of y selects only y's pods, which run on another node.
        (json!({"ns": "y", "spec": {"podSelector": {}}}), vec![]),
        // An absent podSelector is the empty one.
        (
            json!({"spec": {}}),
            vec![("x/a", true, false), ("x/b", true, false)],
        ),
    ];
    for (spec, expected) in cases {
        let r = compile(&cluster(std::slice::from_ref(&spec)), NODE);
        let got: Vec<(String, bool, bool)> = r
            .pods
            .iter()
            .map(|p| {
                (
                    format!("{}/{}", p.namespace, p.name),
                    p.ingress.is_some(),
                    p.egress.is_some(),
                )
            })
            .collect();
        let expected: Vec<(String, bool, bool)> = expected
            .into_iter()
            .map(|(n, i, e)| (n.to_string(), i, e))
            .collect();
        assert_eq!(got, expected, "{spec}");
    }
}

#[test]
fn peers_ports_and_named_ports_become_allowances() {
    // (ingress rule of a policy selecting x/a, expected allowances of x/a's ingress)
    let cases: Vec<(Value, Vec<Allow>)> = vec![
        // An empty rule allows everything.
        (
            json!({}),
            vec![Allow {
                peers: Peers::Any,
                ports: None,
            }],
        ),
        // Pods of the policy's namespace (running ones with an address, host network excluded).
        (
            json!({"from": [{"podSelector": {}}], "ports": [{"port": 80}]}),
            vec![Allow {
                peers: ips(&["10.0.0.1", "10.0.0.2"]),
                ports: Some(vec![tcp(80, 80)]),
            }],
        ),
        // Namespace selector alone: every pod of y, on any node.
        (
            json!({"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}),
            vec![Allow {
                peers: ips(&["10.0.1.1", "10.0.1.2"]),
                ports: None,
            }],
        ),
        // Namespaces are selectable by name even where the API server does not label them so.
        (
            json!({"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}),
            vec![Allow {
                peers: ips(&["10.0.1.1", "10.0.1.2"]),
                ports: None,
            }],
        ),
        // Both in one peer: pods matching both.
        (
            json!({"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                 "podSelector": {"matchLabels": {"pod": "b"}}}]}),
            vec![Allow {
                peers: ips(&["10.0.1.2"]),
                ports: None,
            }],
        ),
        // The same selectors as two peers: either.
        (
            json!({"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                                {"podSelector": {"matchLabels": {"pod": "b"}}}]}),
            vec![
                Allow {
                    peers: ips(&["10.0.1.1", "10.0.1.2"]),
                    ports: None,
                },
                Allow {
                    peers: ips(&["10.0.0.2"]),
                    ports: None,
                },
            ],
        ),
        // A selector matching no running pod allows nothing.
        (
            json!({"from": [{"podSelector": {"matchLabels": {"pod": "done"}}}]}),
            vec![],
        ),
        // ipBlock with except; protocol only; endPort.
        (
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}],
                       "ports": [{"protocol": "UDP"}, {"port": 9000, "endPort": 9010}]}),
            vec![Allow {
                peers: Peers::Block {
                    cidr: "10.0.0.0/16".parse().unwrap(),
                    except: vec!["10.0.1.0/24".parse().unwrap()],
                },
                ports: Some(vec![
                    PortRange {
                        protocol: Protocol::UDP,
                        first: 0,
                        last: u16::MAX,
                    },
                    tcp(9000, 9010),
                ]),
            }],
        ),
        // A named port on ingress is the isolated pod's own (x/a serves http on 8001).
        (
            json!({"ports": [{"port": "http"}]}),
            vec![Allow {
                peers: Peers::Any,
                ports: Some(vec![tcp(8001, 8001)]),
            }],
        ),
        // A named port with the wrong protocol resolves to nothing.
        (
            json!({"ports": [{"port": "http", "protocol": "UDP"}]}),
            vec![],
        ),
        // SCTP is not enforced: it allows nothing (and warns).
        (json!({"ports": [{"port": 80, "protocol": "SCTP"}]}), vec![]),
        // An invalid except refuses the whole peer rather than widen it.
        (
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["nonsense"]}}]}),
            vec![],
        ),
    ];
    for (rule, expected) in cases {
        let spec =
            json!({"spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [rule]}});
        let r = compile(&cluster(std::slice::from_ref(&spec)), NODE);
        let side = pod(&r, "x/a").unwrap().ingress.as_ref().unwrap();
        assert_eq!(side.allows, expected, "{rule}");
        assert_eq!(side.policies, vec!["x/p0".to_string()]);
    }
}

#[test]
fn a_named_port_on_egress_resolves_on_each_destination() {
    let spec = json!({"spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}});
    let r = compile(&cluster(&[spec]), NODE);
    let side = pod(&r, "x/a").unwrap().egress.as_ref().unwrap();
    let got: Vec<(Peers, u16)> = side
        .allows
        .iter()
        .map(|a| (a.peers.clone(), a.ports.as_ref().unwrap()[0].first))
        .collect();
    assert_eq!(
        got,
        vec![
            (ips(&["10.0.0.1"]), 8001),
            (ips(&["10.0.0.2"]), 8002),
            (ips(&["10.0.1.1"]), 8011),
            (ips(&["10.0.1.2"]), 8012),
        ]
    );
}

#[test]
fn policies_selecting_one_pod_add_up_and_unenforceable_parts_are_reported() {
    let specs = [
        json!({"spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}}),
        json!({"spec": {"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"port": 81, "protocol": "SCTP"}]},
                            {"from": [{"ipBlock": {"cidr": "300.0.0.0/8"}}]},
                            // What the API server rejects allows nothing (an empty peer is not
                            // "every pod", a block with a selector is not the block).
                            {"from": [{}]},
                            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}}),
    ];
    let r = compile(&cluster(&specs), NODE);
    let side = pod(&r, "x/a").unwrap().ingress.as_ref().unwrap();
    assert_eq!(side.policies, vec!["x/p0".to_string(), "x/p1".to_string()]);
    assert_eq!(
        side.allows,
        vec![Allow {
            peers: Peers::Any,
            ports: Some(vec![tcp(80, 80)]),
        }]
    );
    assert_eq!(r.warnings.len(), 4, "{:?}", r.warnings);
    assert!(
        r.warnings
            .iter()
            .all(|w| w.starts_with("NetworkPolicy x/p1: "))
    );
}

#[test]
fn cluster_policies_become_tier_rules_around_the_network_policies() {
    use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
    let mut c = cluster(&[
        json!({"spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": 80}]}]}}),
    ]);
    for cnp in [
        json!({"metadata": {"name": "tenants"}, "spec": {"tier": "Admin", "priority": 5,
        "subject": {"namespaces": {}},
        "ingress": [
            {"action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}]},
            {"action": "Pass", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}}],
             "protocols": [{"destinationNamedPort": "http"}]},
            {"action": "Accept", "from": [{}]}
        ]}}),
        json!({"metadata": {"name": "floor"}, "spec": {"tier": "Baseline", "priority": 0,
                "subject": {"pods": {"namespaceSelector": {"matchLabels": {"ns": "x"}}, "podSelector": {"matchLabels": {"pod": "b"}}}},
                "egress": [{"action": "Deny", "to": [{"networks": ["10.0.1.0/24"]}]},
                           {"action": "Pass", "to": [{"nodes": {}}]}]}}),
        json!({"metadata": {"name": "nowhere"}, "spec": {"tier": "Platform", "subject": {"namespaces": {}}}}),
    ] {
        let p: ClusterNetworkPolicy = serde_json::from_value(cnp).unwrap();
        c.apply_cluster_policy(&p);
    }
    let r = compile(&c, NODE);
    let names = |rules: &[TierRule]| -> Vec<(String, Action)> {
        rules.iter().map(|r| (r.name.clone(), r.action)).collect()
    };
    // x/a: its NetworkPolicy isolates ingress; the Admin tier is in front of it.
    let a = pod(&r, "x/a").unwrap().ingress.as_ref().unwrap();
    assert!(a.isolated);
    assert_eq!(
        a.policies,
        vec!["x/p0".to_string(), "cnp/tenants".to_string()]
    );
    assert_eq!(
        names(&a.admin),
        vec![
            ("tenants ingress[0]".to_string(), Action::Deny),
            ("tenants ingress[1]".to_string(), Action::Pass)
        ],
        "the unreadable Accept matches nothing: left out"
    );
    assert_eq!(
        a.admin[0].matches,
        vec![Allow {
            peers: ips(&["10.0.1.1", "10.0.1.2"]),
            ports: None,
        }]
    );
    // Pods `b` of every namespace; the named port is x/a's own (ingress), on the protocol it
    // is declared with.
    assert_eq!(
        a.admin[1].matches,
        vec![Allow {
            peers: ips(&["10.0.0.2", "10.0.1.2"]),
            ports: Some(vec![tcp(8001, 8001)]),
        }]
    );
    // x/b: no NetworkPolicy; Admin rules on ingress, Baseline rules on egress, where the
    // unsupported nodes peer fails closed (a Pass denies everything).
    let b = pod(&r, "x/b").unwrap();
    let ingress = b.ingress.as_ref().unwrap();
    assert!(!ingress.isolated && ingress.baseline.is_empty());
    assert_eq!(
        ingress.admin[1].matches[0].ports,
        Some(vec![tcp(8002, 8002)])
    );
    let egress = b.egress.as_ref().unwrap();
    assert!(!egress.isolated && egress.admin.is_empty());
    assert_eq!(
        names(&egress.baseline),
        vec![
            ("floor egress[0]".to_string(), Action::Deny),
            ("floor egress[1]".to_string(), Action::Deny)
        ]
    );
    assert_eq!(
        egress.baseline[0].matches,
        vec![Allow {
            peers: Peers::Block {
                cidr: "10.0.1.0/24".parse().unwrap(),
                except: vec![],
            },
            ports: None,
        }]
    );
    assert_eq!(egress.baseline[1].matches[0].peers, Peers::Any);
    // Pods the cluster policies govern count as governed, not as isolated.
    assert_eq!(r.isolated(), (1, 0));
    for expected in [
        "ClusterNetworkPolicy nowhere: unknown tier",
        "ClusterNetworkPolicy tenants: tenants ingress[2]: a peer must set exactly one field",
        "ClusterNetworkPolicy floor: floor egress[1]: nodes peers are not supported yet",
    ] {
        assert!(
            r.warnings.iter().any(|w| w.starts_with(expected)),
            "{expected}: {:?}",
            r.warnings
        );
    }
    assert!(
        !r.warnings.iter().any(|w| w.contains("SCTP")),
        "{:?}",
        r.warnings
    );
}
