//! The production path (policies parsed by [`netpol`], indexed per pod) answers exactly as the
//! straightforward reference evaluator ([`crate::monitor::evaluate::network_policy`]) does: over the
//! whole semantics table, over every flow of the fixture cluster, after every kind of change to the
//! view, and on random policies; the whole verdict, the verdict as if rendered, and the matching
//! rules.

use super::*;
use crate::monitor::evaluate::network_policy::tests::{
    cases, endpoint, fixture, flow, np, properties,
};
use crate::monitor::evaluate::network_policy::{self, evaluate_side};
use crate::monitor::evaluate::view::{Flow, Labels, NamedClusterPolicy, NamedPolicy, PodKey};
use proptest::prelude::*;
use serde_json::json;

/// The reference: the straightforward evaluator's verdict on `rendered`'s side of `flow`.
fn reference(
    view: &ClusterView,
    rendered: &NamedPolicy,
    direction: Direction,
    flow: &Flow,
) -> Result<Option<bool>, EvalError> {
    let side = evaluate_side(view, Some(rendered.into()), direction, flow)?;
    Ok(side
        .isolated_by(&rendered.namespace, &rendered.name)
        .then_some(side.allowed))
}

/// The same question through the compiled policy and the view's index.
fn indexed(
    view: &ClusterView,
    rendered: &NamedPolicy,
    direction: Direction,
    flow: &Flow,
) -> Result<Option<bool>, EvalError> {
    let ends = resolve(view, &flow.source, &flow.destination)?;
    let compiled = PolicyRef::from(rendered).parse();
    Ok(verdict_as_if_rendered(
        view,
        &compiled,
        direction,
        ends,
        flow.protocol,
        flow.port,
    ))
}

const DIRECTIONS: [Direction; 2] = [Direction::Egress, Direction::Ingress];

/// Every pod of the fixture, and two addresses that are no pod.
const ENDPOINTS: [&str; 8] = [
    "shop/web-1",
    "shop/api-1",
    "shop/db-1",
    "bank/web-1",
    "dev/web-1",
    "kube-system/dns-1",
    "203.0.113.5",
    "10.0.0.99",
];

/// Every policy of every case of the semantics table, evaluated as if rendered with the case's other
/// policies in force, and with itself in force too (as a protect policy's own rendered object is),
/// with ipBlocks matching pods or not.
#[test]
fn index_agrees_with_the_semantics_table() {
    let mut checked = 0;
    for case in cases() {
        let f = flow(case.flow);
        for (i, rendered) in case.policies.iter().enumerate() {
            for itself_in_force in [false, true] {
                for ip_blocks_match_pods in [true, false] {
                    let mut view = fixture();
                    view.set_ip_blocks_match_pods(ip_blocks_match_pods);
                    for (j, policy) in case.policies.iter().enumerate() {
                        if j != i || itself_in_force {
                            view.insert_policy(policy.clone());
                        }
                    }
                    for direction in DIRECTIONS {
                        assert_eq!(
                            indexed(&view, rendered, direction, &f),
                            reference(&view, rendered, direction, &f),
                            "case {:?}, rendered {}/{}, {direction:?}, itself in force: \
                             {itself_in_force}, ipBlocks match pods: {ip_blocks_match_pods}",
                            case.name,
                            rendered.namespace,
                            rendered.name,
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 500, "only {checked} verdicts compared");
}

/// Policies in force in the fixture for [`index_agrees_on_every_flow_of_the_fixture`].
fn in_force() -> Vec<NamedPolicy> {
    vec![
        np(
            "shop",
            "allow-api",
            json!({"podSelector": {"matchLabels": {"app": "api"}}, "ingress": [{}]}),
        ),
        np(
            "shop",
            "web-dns",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": {"matchLabels":
                       {"kubernetes.io/metadata.name": "kube-system"}}}]}]}),
        ),
        np("dev", "deny-ingress", json!({"podSelector": {}})),
        np(
            "bank",
            "from-shop",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector":
                {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}}]}]}),
        ),
    ]
}

/// Policies evaluated as if rendered: a namespace-only peer with a named port, ipBlock with except
/// and an endPort range, a replacement of a policy in force (same name), default deny both ways,
/// content the API server would reject, and a policy of another namespace.
fn rendered() -> Vec<NamedPolicy> {
    vec![
        np(
            "shop",
            "ours-web-ingress",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
                                "ports": [{"port": "http"}, {"protocol": "UDP", "port": "syslog"}]}]}),
        ),
        np(
            "shop",
            "ours-egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [
                {"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.12/32"]}}],
                 "ports": [{"port": 9000, "endPort": 9100}, {"protocol": "SCTP"}]},
                {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}]}]}),
        ),
        np(
            "shop",
            "allow-api",
            json!({"podSelector": {"matchLabels": {"app": "api"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                "ports": [{"port": 9000}]}]}),
        ),
        np(
            "shop",
            "ours-deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        ),
        np(
            "shop",
            "ours-malformed",
            json!({"podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                   "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{}]}, {"from": [{"ipBlock": {"cidr": "bad"}}]},
                               {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"},
                                          "podSelector": {}}]},
                               {"ports": [{"protocol": "ICMP"}]},
                               {"ports": [{"port": "http", "endPort": 9000}]},
                               {"ports": [{"endPort": 9000}]}],
                   "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["nope"]}}]}]}),
        ),
        np(
            "bank",
            "ours-bank",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"podSelector": {}}, {"ipBlock": {"cidr": "203.0.113.0/24"}}]}],
                   "egress": [{"ports": [{"port": 8080}]}]}),
        ),
    ]
}

/// Every flow between the fixture's pods and addresses, on ports that hit named, numbered and
/// ranged rules, in both directions, for every rendered policy.
#[test]
fn index_agrees_on_every_flow_of_the_fixture() {
    let mut view = fixture();
    for policy in in_force() {
        view.insert_policy(policy);
    }
    let mut applicable = 0;
    for rendered in rendered() {
        for from in ENDPOINTS {
            for to in ENDPOINTS {
                for protocol in [Protocol::TCP, Protocol::UDP, Protocol::SCTP] {
                    for port in [53, 514, 3868, 5432, 8080, 8443, 9000, 9050, 9090] {
                        let f = Flow {
                            source: endpoint(from),
                            destination: endpoint(to),
                            protocol,
                            port,
                        };
                        for direction in DIRECTIONS {
                            let expected = reference(&view, &rendered, direction, &f);
                            assert_eq!(
                                indexed(&view, &rendered, direction, &f),
                                expected,
                                "{} {direction:?}: {from} -> {to} {protocol:?}/{port}",
                                rendered.name
                            );
                            applicable += usize::from(matches!(expected, Ok(Some(_))));
                        }
                    }
                }
            }
        }
    }
    assert!(applicable > 1_000, "only {applicable} applicable verdicts");
}

/// The view compiles its index at the first evaluation after a change: every change (namespace
/// labels, policies in force, pod labels, pods removed and added) is seen by the next evaluation.
#[test]
fn the_index_follows_changes_to_the_view() {
    let ours = np(
        "shop",
        "ours",
        json!({"podSelector": {"matchLabels": {"app": "api"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]}),
    );
    let to_api = flow("bank/web-1 -> shop/api-1 TCP/9000");
    let check = |view: &ClusterView, f: &Flow, expected: Result<Option<bool>, EvalError>| {
        assert_eq!(reference(view, &ours, Direction::Ingress, f), expected);
        assert_eq!(indexed(view, &ours, Direction::Ingress, f), expected);
    };
    let mut view = fixture();
    check(&view, &to_api, Ok(Some(true)));
    view.insert_namespace("bank", Labels::from([("team".into(), "c".into())]));
    check(&view, &to_api, Ok(Some(false)));
    view.insert_policy(np(
        "shop",
        "open",
        json!({"podSelector": {}, "ingress": [{}]}),
    ));
    check(&view, &to_api, Ok(Some(true)));
    assert!(view.remove_policy("shop", "open").is_some());
    check(&view, &to_api, Ok(Some(false)));

    // Relabelled, the pod is no longer ours to judge.
    let key = PodKey::new("shop", "api-1");
    let mut api = view.pod(&key).cloned().expect("in the fixture");
    api.labels.insert("app".into(), "other".into());
    view.insert_pod(api.clone());
    check(&view, &to_api, Ok(None));

    // Removed, it is unknown; a new pod takes its slot and is judged by its own labels.
    view.remove_pod(&key);
    check(&view, &to_api, Err(EvalError::UnknownPod(key)));
    api.name = "api-2".into();
    api.labels.insert("app".into(), "api".into());
    view.insert_pod(api);
    check(
        &view,
        &flow("bank/web-1 -> shop/api-2 TCP/9000"),
        Ok(Some(false)),
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random policies in force, a random policy evaluated as if rendered (sometimes replacing one
    /// in force by name), a random flow: the index and the reference agree on both sides.
    #[test]
    fn index_equals_reference(
        existing in properties::policy("existing"),
        other in properties::policy("other"),
        ours in prop_oneof![properties::policy("ours"), properties::policy("existing")],
        f in properties::a_flow(),
        ip_blocks_match_pods in any::<bool>(),
    ) {
        let mut view = fixture();
        view.set_ip_blocks_match_pods(ip_blocks_match_pods);
        view.insert_policy(existing);
        view.insert_policy(other);
        for direction in DIRECTIONS {
            prop_assert_eq!(
                indexed(&view, &ours, direction, &f),
                reference(&view, &ours, direction, &f)
            );
        }
        view.insert_policy(ours.clone());
        prop_assert_eq!(evaluate(&view, &f), network_policy::evaluate(&view, &f));
        if let Ok(ends) = resolve(&view, &f.source, &f.destination) {
            let parsed = PolicyRef::from(&ours).parse();
            for direction in DIRECTIONS {
                let verdict = evaluate(&view, &f).expect("resolved");
                if !verdict.side(direction).isolated_by(&ours.namespace, &ours.name) {
                    continue;
                }
                prop_assert_eq!(
                    matching_rules(&view, &parsed, direction, ends, f.protocol, f.port),
                    network_policy::matching_rules(&view, (&ours).into(), direction, &f).unwrap()
                );
            }
        }
    }
}

/// A ClusterNetworkPolicy `name` with the spec written as JSON.
pub(crate) fn cnp(name: &str, spec: serde_json::Value) -> NamedClusterPolicy {
    NamedClusterPolicy {
        name: name.into(),
        spec: serde_json::from_value(spec).expect("a ClusterNetworkPolicySpec"),
    }
}

/// The tiers over the fixture: Admin rules before NetworkPolicies, Baseline rules after them, and
/// the trail `check --explain` shows.
#[test]
fn cluster_tiers_decide_around_network_policies() {
    let mut view = fixture();
    // NetworkPolicy: shop/api-1 accepts from shop only.
    view.insert_policy(np(
        "shop",
        "api-from-shop",
        json!({"podSelector": {"matchLabels": {"app": "api"}},
               "ingress": [{"from": [{"podSelector": {}}]}]}),
    ));
    view.insert_cluster_policy(cnp(
        "tenants",
        json!({"tier": "Admin", "priority": 10, "subject": {"namespaces": {}},
               "ingress": [
                   {"name": "dns-open", "action": "Accept",
                    "from": [{"namespaces": {}}], "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                   {"name": "no-dev", "action": "Deny",
                    "from": [{"namespaces": {"matchLabels": {"env": "dev"}}}]},
                   {"action": "Pass", "from": [{"namespaces": {"matchLabels": {"env": "prod"}}}]}
               ]}),
    ));
    view.insert_cluster_policy(cnp(
        "floor",
        json!({"tier": "Baseline", "priority": 0, "subject": {"namespaces": {}},
               "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"env": "prod"}}}]}]}),
    ));
    let steps = |side: &SideVerdict| -> Vec<String> {
        side.cluster
            .iter()
            .map(|s| format!("{} {} {} {}", s.tier, s.policy, s.rule, s.action))
            .collect()
    };
    use netpol::cluster::Decider;
    // (flow, ingress allowed, decider, trail)
    let cases = [
        // Admin Deny overrides nothing-isolates and the NetworkPolicy alike.
        (
            "dev/web-1 -> shop/db-1 TCP/5432",
            false,
            Decider::Admin,
            vec!["Admin tenants 1 Deny"],
        ),
        (
            "dev/web-1 -> shop/api-1 TCP/9000",
            false,
            Decider::Admin,
            vec!["Admin tenants 1 Deny"],
        ),
        // Admin Accept overrides the Baseline and the default.
        (
            "dev/web-1 -> kube-system/dns-1 UDP/53",
            true,
            Decider::Admin,
            vec!["Admin tenants 0 Accept"],
        ),
        // Pass: the NetworkPolicy isolating api-1 decides (it allows shop, not bank).
        (
            "shop/web-1 -> shop/api-1 TCP/9000",
            true,
            Decider::NetworkPolicy,
            vec!["Admin tenants 2 Pass"],
        ),
        (
            "bank/web-1 -> shop/api-1 TCP/9000",
            false,
            Decider::NetworkPolicy,
            vec!["Admin tenants 2 Pass"],
        ),
        // Pass, no NetworkPolicy isolates db-1: the Baseline denies prod.
        (
            "bank/web-1 -> shop/db-1 TCP/5432",
            false,
            Decider::Baseline,
            vec!["Admin tenants 2 Pass", "Baseline floor 0 Deny"],
        ),
        // An address outside matches no namespace peer: nothing decides.
        (
            "203.0.113.5 -> shop/db-1 TCP/5432",
            true,
            Decider::Default,
            vec![],
        ),
    ];
    for (f, allowed, decider, trail) in cases {
        let verdict = evaluate(&view, &flow(f)).unwrap();
        assert_eq!(
            (
                verdict.ingress.allowed,
                verdict.ingress.decider,
                steps(&verdict.ingress)
            ),
            (
                allowed,
                decider,
                trail.iter().map(|s| s.to_string()).collect()
            ),
            "{f}"
        );
        assert!(verdict.egress.allowed, "{f}: no egress policy");
    }

    // As if rendered: a policy denying api-1's ingress is overridden by the Admin Accept (allowed),
    // and is not what blocks a flow the Admin tier denies (not applicable).
    let deny_all = np(
        "shop",
        "ours",
        json!({"podSelector": {"matchLabels": {"app": "api"}}, "policyTypes": ["Ingress"]}),
    );
    let dns_like = flow("dev/web-1 -> shop/api-1 UDP/53");
    assert_eq!(
        indexed(&view, &deny_all, Direction::Ingress, &dns_like),
        Ok(Some(true))
    );
    let from_dev = flow("dev/web-1 -> shop/api-1 TCP/9000");
    assert_eq!(
        indexed(&view, &deny_all, Direction::Ingress, &from_dev),
        Ok(None)
    );
    let from_bank = flow("bank/web-1 -> shop/api-1 TCP/9000");
    assert_eq!(
        indexed(&view, &deny_all, Direction::Ingress, &from_bank),
        Ok(Some(false))
    );

    // Removed, the cluster policies decide nothing.
    view.remove_cluster_policy("tenants");
    view.remove_cluster_policy("floor");
    let verdict = evaluate(&view, &flow("dev/web-1 -> shop/db-1 TCP/5432")).unwrap();
    assert_eq!(
        (verdict.ingress.allowed, verdict.ingress.decider),
        (true, Decider::Default)
    );
}
