//! The edge history on the end-to-end scenario's cluster (http-client, http-server, CoreDNS).

use super::*;
use crate::monitor::evaluate::attribution::tests::{
    client, client_egress, cluster, dns, external, observed, server, server_ingress, time,
};
use crate::monitor::evaluate::view::PodKey;

fn at(mut flow: ObservedFlow, seconds: i64) -> ObservedFlow {
    flow.seen_at = time(seconds);
    flow
}

#[test]
fn repeats_compact_into_one_edge_with_first_last_and_count() {
    let mut history = EdgeHistory::default();
    let flow = observed(client(), server(), Protocol::TCP, 18080);
    history.record(&at(flow.clone(), 10), false);
    history.record(&at(flow.clone(), 5), false);
    history.record(&at(flow.clone(), 30), false);
    // Another pod of the same workload is the same edge.
    let mut other_pod = flow.clone();
    other_pod.source.endpoint = Endpoint::Pod(PodKey::new("demo", "http-client-7d9c-other"));
    history.record(&at(other_pod, 20), false);
    history.record(
        &at(observed(client(), server(), Protocol::TCP, 18082), 1),
        false,
    );
    assert_eq!(history.len(), 2);
    let stats = history
        .stats(&client().workload, &server().workload, Protocol::TCP, 18080)
        .unwrap();
    assert_eq!(
        (stats.first_seen_ms, stats.last_seen_ms, stats.count),
        (time(5).0.as_millisecond(), time(30).0.as_millisecond(), 4)
    );
    // A workload is named once.
    assert_eq!(history.names.len(), 2);
}

#[test]
fn the_bound_evicts_the_least_recently_seen_and_counts_them() {
    let mut history = EdgeHistory::new(Bounds {
        max_edges: 100,
        ..Bounds::default()
    });
    for port in 1..=250u16 {
        history.record(
            &at(
                observed(client(), external("192.0.2.1"), Protocol::TCP, port),
                i64::from(port),
            ),
            false,
        );
    }
    assert!(history.len() <= 100, "{}", history.len());
    assert_eq!(history.evicted() as usize + history.len(), 250);
    // The newest edge is kept, the oldest went first.
    let held = |port| {
        history
            .stats(
                &client().workload,
                &external("192.0.2.1").workload,
                Protocol::TCP,
                port,
            )
            .is_some()
    };
    assert!(held(250) && !held(1));
}

#[test]
fn edges_older_than_the_retention_are_forgotten_with_their_names() {
    let mut history = EdgeHistory::new(Bounds {
        retention: Duration::from_secs(60),
        ..Bounds::default()
    });
    history.record(&at(observed(client(), dns(), Protocol::UDP, 53), 0), false);
    history.record(
        &at(observed(client(), server(), Protocol::TCP, 18080), 100),
        false,
    );
    history.forget_expired(time(130).0.as_millisecond());
    assert_eq!((history.len(), history.expired()), (1, 1));
    // CoreDNS is named by no edge now.
    assert_eq!(history.names.len(), 2);
    // Seen again, it is named afresh, and its repeats still compact into one edge (edges compare
    // workloads by their interned name).
    for seconds in [140, 150] {
        history.record(
            &at(observed(client(), dns(), Protocol::UDP, 53), seconds),
            false,
        );
    }
    assert_eq!((history.len(), history.names.len()), (2, 3));
    let stats = history
        .stats(&client().workload, &dns().workload, Protocol::UDP, 53)
        .unwrap();
    assert_eq!(stats.count, 2);
}

/// Each case: the flows observed, the policy replayed, and what the gate reports.
#[test]
fn replay_finds_what_a_policy_would_block() {
    struct Case {
        name: &'static str,
        flows: Vec<ObservedFlow>,
        policy: WorkloadNetworkPolicy,
        considered: usize,
        would_block: usize,
        cuts_dns: bool,
    }
    let tcp = |port| observed(client(), server(), Protocol::TCP, port);
    let cases = [
        Case {
            name: "everything observed is allowed",
            flows: vec![tcp(18080), observed(client(), dns(), Protocol::UDP, 53)],
            policy: client_egress("protect"),
            considered: 2,
            would_block: 0,
            cuts_dns: false,
        },
        Case {
            name: "a port learned after the proposal",
            flows: vec![tcp(18080), tcp(18082)],
            policy: client_egress("protect"),
            considered: 2,
            would_block: 1,
            cuts_dns: false,
        },
        Case {
            name: "the workload's DNS over TCP",
            flows: vec![observed(client(), dns(), Protocol::TCP, 53)],
            policy: client_egress("protect"),
            considered: 1,
            would_block: 1,
            cuts_dns: true,
        },
        Case {
            name: "an outside peer",
            flows: vec![observed(
                client(),
                external("192.0.2.7"),
                Protocol::TCP,
                443,
            )],
            policy: client_egress("protect"),
            considered: 1,
            would_block: 1,
            cuts_dns: false,
        },
        Case {
            name: "other workloads' edges are not the policy's",
            flows: vec![observed(
                server(),
                external("192.0.2.7"),
                Protocol::TCP,
                443,
            )],
            policy: client_egress("protect"),
            considered: 0,
            would_block: 0,
            cuts_dns: false,
        },
        Case {
            name: "ingress: the server's side of the flows",
            flows: vec![
                tcp(18080),
                tcp(18082),
                observed(external("192.0.2.9"), server(), Protocol::TCP, 18080),
            ],
            policy: server_ingress("protect"),
            considered: 3,
            would_block: 2,
            cuts_dns: false,
        },
        Case {
            name: "the mode does not matter: monitor would block the same",
            flows: vec![tcp(18082)],
            policy: client_egress("monitor"),
            considered: 1,
            would_block: 1,
            cuts_dns: false,
        },
    ];
    let view = cluster();
    for case in cases {
        let mut history = EdgeHistory::default();
        for flow in &case.flows {
            history.record(flow, false);
        }
        let report = history.replay(&view, &case.policy);
        assert_eq!(
            (report.considered, report.would_block, report.cuts_dns),
            (case.considered, case.would_block, case.cuts_dns),
            "{}: {report:?}",
            case.name
        );
        assert_eq!(report.examples.len(), case.would_block, "{}", case.name);
        assert_eq!(report.not_evaluable, 0, "{}", case.name);
    }
}

#[test]
fn replay_names_at_most_ten_examples_newest_first_and_flags_the_api_server() {
    let mut history = EdgeHistory::default();
    for port in 1..=15u16 {
        history.record(
            &at(
                observed(client(), server(), Protocol::TCP, 20_000 + port),
                i64::from(port),
            ),
            false,
        );
    }
    history.record(
        &at(
            observed(client(), external("10.0.0.1"), Protocol::TCP, 6443),
            3,
        ),
        true,
    );
    let report = history.replay(&cluster(), &client_egress("protect"));
    assert_eq!(report.would_block, 16);
    assert!(report.cuts_api_server && !report.cuts_dns);
    assert_eq!(report.examples.len(), MAX_EXAMPLES);
    assert_eq!(
        report.examples[0],
        Example {
            peer: "demo/Deployment/http-server".into(),
            protocol: Protocol::TCP,
            port: 20_015,
            last_seen_ms: time(15).0.as_millisecond(),
        }
    );
    assert!(
        report
            .examples
            .windows(2)
            .all(|w| w[0].last_seen_ms >= w[1].last_seen_ms)
    );
}

#[test]
fn a_workload_without_pods_now_is_not_evaluable() {
    let mut history = EdgeHistory::default();
    let mut gone = server();
    Arc::make_mut(&mut gone.workload).owner_name = "retired".into();
    gone.endpoint = Endpoint::Pod(PodKey::new("demo", "retired-1"));
    history.record(&observed(client(), gone, Protocol::TCP, 18080), false);
    let report = history.replay(&cluster(), &client_egress("protect"));
    assert_eq!(
        (report.considered, report.would_block, report.not_evaluable),
        (1, 0, 1)
    );
}

#[test]
fn edges_of_a_namespace_newest_first_and_bounded() {
    let mut history = EdgeHistory::default();
    history.record(
        &at(observed(client(), server(), Protocol::TCP, 18080), 5),
        false,
    );
    history.record(&at(observed(client(), dns(), Protocol::UDP, 53), 9), false);
    history.record(
        &at(
            observed(external("192.0.2.1"), server(), Protocol::TCP, 18080),
            1,
        ),
        false,
    );
    let (edges, truncated) = history.edges_in("demo", 10);
    assert!(!truncated);
    let ports: Vec<u16> = edges.iter().map(|e| e.edge.port).collect();
    assert_eq!(ports, [53, 18080, 18080]);
    assert_eq!(edges[0].edge.destination.namespace, "kube-system");
    assert_eq!(edges[2].edge.source.address, "192.0.2.1");
    // kube-system sees only the DNS edge; a namespace without edges nothing.
    assert_eq!(history.edges_in("kube-system", 10).0.len(), 1);
    assert!(history.edges_in("other", 10).0.is_empty());
    let (edges, truncated) = history.edges_in("demo", 2);
    let ports: Vec<u16> = edges.iter().map(|e| e.edge.port).collect();
    assert!(truncated);
    assert_eq!(ports, [53, 18080], "the two newest");
}

#[test]
fn the_history_hands_out_its_own_copy_of_a_name_and_forgets_its_address_with_it() {
    let mut history = EdgeHistory::new(Bounds {
        retention: Duration::from_secs(60),
        ..Bounds::default()
    });
    let first = at(observed(client(), server(), Protocol::TCP, 18080), 0);
    history.record(&first, false);
    // A later pass built its own copy of the client's name: the same edge, and the history's copy
    // is the first one, which the next records then hand in (found by its address).
    let later = at(observed(client(), server(), Protocol::TCP, 18080), 10);
    assert!(!Arc::ptr_eq(&later.source.workload, &first.source.workload));
    let own = history.interned(&later.source.workload).expect("named");
    assert!(Arc::ptr_eq(&own, &first.source.workload));
    let mut handed_back = later.clone();
    handed_back.source.workload = own;
    history.record(&later, false);
    history.record(&handed_back, false);
    assert_eq!(history.len(), 1);
    let stats = history
        .stats(&client().workload, &server().workload, Protocol::TCP, 18080)
        .unwrap();
    assert_eq!(stats.count, 3);
    assert_eq!(history.held_at.len(), history.names.len());
    // Expired with nothing else holding them, the names and their addresses go together.
    drop((first, later, handed_back));
    history.forget_expired(time(200).0.as_millisecond());
    assert_eq!(
        (history.len(), history.names.len(), history.held_at.len()),
        (0, 0, 0)
    );
    assert!(history.interned(&client().workload).is_none());
}

#[test]
fn the_gate_does_not_count_rotated_addresses_of_an_allowed_name_as_would_block() {
    let mut history = EdgeHistory::default();
    let named = |ip: &str, name: Option<&str>| ObservedFlow {
        peer_name: name.map(Arc::from),
        ..observed(client(), external(ip), Protocol::TCP, 443)
    };
    // Three addresses the name rotated through, and one literal nobody resolved.
    for (i, ip) in ["203.0.113.7", "203.0.113.8", "203.0.113.9"]
        .iter()
        .enumerate()
    {
        history.record(&at(named(ip, Some("api.partner.test")), i as i64), false);
    }
    history.record(&at(named("198.51.100.1", None), 5), false);
    // The same address as a literal and by name are two edges.
    history.record(&at(named("203.0.113.7", None), 6), false);
    assert_eq!(history.len(), 5);
    let mut policy = client_egress("monitor");
    policy.spec.egress_names = serde_json::from_value(serde_json::json!([
        {"names": ["api.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]}
    ]))
    .unwrap();
    let report = history.replay(&cluster(), &policy);
    assert_eq!(report.considered, 5);
    assert_eq!(report.would_block, 2, "the two literals: {report:?}");
    let peers: Vec<&str> = report.examples.iter().map(|e| e.peer.as_str()).collect();
    assert_eq!(peers, ["203.0.113.7", "198.51.100.1"]);
}

#[test]
fn the_gate_names_a_blocked_outside_peer_by_the_name_it_was_resolved_from() {
    let mut history = EdgeHistory::default();
    let to = |ip: &str, name: &str| {
        let mut destination = external(ip);
        destination.workload = WorkloadRef {
            dns_name: name.into(),
            ..WorkloadRef::clone(&destination.workload)
        }
        .into();
        ObservedFlow {
            peer_name: Some(name).filter(|n| !n.is_empty()).map(Arc::from),
            ..observed(client(), destination, Protocol::TCP, 443)
        }
    };
    history.record(&at(to("203.0.113.7", "api.partner.test"), 2), false);
    history.record(&at(to("203.0.113.8", ""), 1), false);
    let report = history.replay(&cluster(), &client_egress("monitor"));
    let peers: Vec<&str> = report.examples.iter().map(|e| e.peer.as_str()).collect();
    assert_eq!(peers, ["api.partner.test (203.0.113.7)", "203.0.113.8"]);
    // The web view's edges (and `check --from-cluster`) keep the name.
    let (edges, _) = history.edges_in("demo", 10);
    let names: Vec<&str> = edges
        .iter()
        .map(|e| e.edge.destination.dns_name.as_str())
        .collect();
    assert_eq!(names, ["api.partner.test", ""]);
}

/// What a leader exports, a new leader restores: the same edges with the same stats, so the gate's
/// replay gives the same report (docs/behaviour.md §3.11). An edge the new history holds already
/// keeps the widest first/last seen and the larger count.
#[test]
fn a_restored_history_replays_as_the_exported_one() {
    let mut before = EdgeHistory::default();
    before.record(
        &at(observed(client(), server(), Protocol::TCP, 18080), 10),
        false,
    );
    before.record(
        &at(observed(client(), server(), Protocol::TCP, 18082), 20),
        false,
    );
    before.record(&at(observed(client(), dns(), Protocol::UDP, 53), 30), false);
    before.record(
        &at(
            observed(client(), external("203.0.113.10"), Protocol::TCP, 443),
            40,
        ),
        false,
    );
    let exported = before.export();
    assert_eq!(exported.len(), 4);
    assert!(
        exported
            .windows(2)
            .all(|w| w[0].stats.last_seen_ms >= w[1].stats.last_seen_ms),
        "newest first"
    );

    let mut after = EdgeHistory::default();
    // The new leader has seen one edge again since it started: one more observation, later.
    after.record(
        &at(observed(client(), server(), Protocol::TCP, 18080), 50),
        false,
    );
    assert_eq!(after.restore(exported.clone()), 3);
    assert_eq!(after.len(), 4);
    let stats = after
        .stats(&client().workload, &server().workload, Protocol::TCP, 18080)
        .unwrap();
    assert_eq!(
        (stats.first_seen_ms, stats.last_seen_ms, stats.count),
        (time(10).0.as_millisecond(), time(50).0.as_millisecond(), 1)
    );
    // Restoring the same again adds nothing.
    assert_eq!(after.restore(exported), 0);

    let view = cluster();
    for policy in [client_egress("protect"), server_ingress("protect")] {
        assert_eq!(
            after.replay(&view, &policy),
            before.replay(&view, &policy),
            "{:?}",
            policy.spec.direction
        );
    }
    // Names are interned again: one per workload, whatever the number of edges.
    assert_eq!(after.names.len(), before.names.len());
}

/// The gate does not count against an ingress policy a flow the cluster stops at its source (an
/// Admin ClusterNetworkPolicy denies the source's egress): it would never reach the policy.
#[test]
fn the_gate_leaves_out_flows_an_admin_policy_stops_at_their_source() {
    use crate::monitor::evaluate::view::NamedClusterPolicy;
    let mut history = EdgeHistory::default();
    history.record(
        &at(observed(client(), server(), Protocol::UDP, 18081), 10),
        false,
    );
    let policy = server_ingress("protect");
    let mut view = cluster();
    assert_eq!(
        history.replay(&view, &policy).would_block,
        1,
        "without tiers"
    );
    view.insert_cluster_policy(NamedClusterPolicy {
        name: "no-udp-out".into(),
        spec: serde_json::from_value(serde_json::json!({
            "tier": "Admin", "priority": 5,
            "subject": {"namespaces": {}},
            "egress": [{"action": "Deny", "to": [{"namespaces": {}}],
                        "protocols": [{"udp": {"destinationPort": {"number": 18081}}}]}]
        }))
        .unwrap(),
    });
    let report = history.replay(&view, &policy);
    assert_eq!(
        (report.considered, report.would_block),
        (1, 0),
        "{report:?}"
    );
}

#[test]
fn the_namespace_graph_of_the_history_has_namespaces_and_addresses() {
    use network_enforcer_api::WorkloadRef;
    let workload = |ns: &str| WorkloadRef {
        namespace: ns.into(),
        owner_kind: "Deployment".into(),
        owner_name: "app".into(),
        ..WorkloadRef::default()
    };
    let outside = WorkloadRef {
        address: "203.0.113.10".into(),
        ..WorkloadRef::default()
    };
    let edge = |source: WorkloadRef,
                source_ip: Option<&str>,
                destination: WorkloadRef,
                ip: Option<&str>| StoredEdge {
        source: source.into(),
        source_ip: source_ip.map(|s| s.parse().unwrap()),
        destination: destination.into(),
        destination_ip: ip.map(|s| s.parse().unwrap()),
        protocol: Protocol::TCP,
        port: 80,
        peer_name: None,
        stats: EdgeStats {
            first_seen_ms: 1,
            last_seen_ms: 2,
            count: 1,
            to_api_server: false,
        },
    };
    let history = [
        edge(workload("shop"), None, workload("db"), None),
        // Two pods' edges of the same namespaces are one namespace edge.
        edge(workload("shop"), None, workload("db"), None),
        edge(
            workload("shop"),
            None,
            outside.clone(),
            Some("203.0.113.10"),
        ),
        // A hostNetwork pod as the destination is seen by its (node's) address.
        edge(
            workload("db"),
            None,
            workload("kube-system"),
            Some("192.0.2.1"),
        ),
        // A source by address (outside client, hostNetwork pod) has no namespace to isolate.
        edge(outside, Some("203.0.113.10"), workload("shop"), None),
        edge(
            workload("monitoring"),
            Some("192.0.2.1"),
            workload("shop"),
            None,
        ),
    ];
    let address = |ip: &str| EdgeEnd::Address(ip.parse().unwrap());
    assert_eq!(
        namespace_edges(&history),
        vec![
            NamespaceEdge {
                from: "db".into(),
                to: address("192.0.2.1")
            },
            NamespaceEdge {
                from: "shop".into(),
                to: EdgeEnd::Namespace("db".into())
            },
            NamespaceEdge {
                from: "shop".into(),
                to: address("203.0.113.10")
            },
        ]
    );
}

/// The web view's edges say, per observed edge, which tier decides each side with the policies in
/// force now: an Admin ClusterNetworkPolicy's Accept before any NetworkPolicy, the NetworkPolicies
/// that isolate the pod (those that allow, or all of them when denied), and the default.
#[test]
fn each_edge_of_a_namespace_says_which_tier_decides_each_side_now() {
    use crate::monitor::evaluate::view::{NamedClusterPolicy, NamedPolicy};
    use netpol::cluster::Decider;
    let mut history = EdgeHistory::default();
    history.record(
        &at(observed(client(), server(), Protocol::TCP, 18080), 5),
        false,
    );
    history.record(
        &at(observed(client(), server(), Protocol::UDP, 18081), 6),
        false,
    );
    history.record(
        &at(
            observed(external("192.0.2.1"), server(), Protocol::TCP, 18080),
            7,
        ),
        false,
    );
    let mut view = cluster();
    view.insert_policy(NamedPolicy {
        namespace: "demo".into(),
        name: "server-in".into(),
        spec: serde_json::from_value(serde_json::json!({
            "podSelector": {"matchLabels": {"app": "http-server"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": 18080}]}]
        }))
        .unwrap(),
    });
    view.insert_cluster_policy(NamedClusterPolicy {
        name: "udp-out".into(),
        spec: serde_json::from_value(serde_json::json!({
            "tier": "Admin", "priority": 5,
            "subject": {"namespaces": {}},
            "egress": [{"action": "Accept", "to": [{"namespaces": {}}],
                        "protocols": [{"udp": {"destinationPort": {"number": 18081}}}]}]
        }))
        .unwrap(),
    });
    let decision = |tier, allowed, by: &[&str]| {
        Some(SideDecision {
            tier,
            allowed,
            by: by.iter().map(|b| b.to_string()).collect(),
        })
    };
    let (edges, _) = history.edges_in("demo", 10);
    let sides: Vec<_> = edges
        .into_iter()
        .map(|e| e.judged(&view))
        .map(|e| (e.protocol, e.port, e.egress, e.ingress))
        .collect();
    assert_eq!(
        sides,
        [
            // An outside client: no pod whose egress a policy governs.
            (
                Protocol::TCP,
                18080,
                decision(Decider::Default, true, &[]),
                decision(Decider::NetworkPolicy, true, &["demo/server-in"]),
            ),
            (
                Protocol::UDP,
                18081,
                decision(Decider::Admin, true, &["udp-out"]),
                decision(Decider::NetworkPolicy, false, &["demo/server-in"]),
            ),
            (
                Protocol::TCP,
                18080,
                decision(Decider::Default, true, &[]),
                decision(Decider::NetworkPolicy, true, &["demo/server-in"]),
            ),
        ]
    );
    // Listed, not judged: nothing is claimed; an end without a pod now is not judged either.
    let (edges, _) = history.edges_in("demo", 10);
    assert!(
        edges
            .iter()
            .all(|e| e.edge.egress.is_none() && e.edge.ingress.is_none())
    );
    let mut gone = ClusterView::new();
    gone.insert_namespace("demo", Default::default());
    let judged = history.edges_in("demo", 10).0.remove(0).judged(&gone);
    assert_eq!(
        (judged.egress, judged.ingress),
        (None, None),
        "no pod of http-server now"
    );
}
