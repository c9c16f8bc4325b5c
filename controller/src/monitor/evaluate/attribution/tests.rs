//! Attribution, the end-to-end scenario (docs/development.md), and each of the reference's false
//! violations that semantic evaluation must not repeat (docs/design.md, "Violations").

use super::*;
use crate::cluster::workload::Workload;
use crate::monitor::evaluate::view::{ContainerPort, Labels, NamedPolicy, PodInfo};
use crate::monitor::violations::{self, SyncInput};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use std::collections::HashMap;

const NS: &str = "demo";
const CLIENT_SA: &str = "cluster.local/ns/demo/sa/http-client-sa";

pub(crate) fn time(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + seconds).unwrap())
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The end-to-end scenario: http-client and http-server (TCP 18080, TCP 18082, UDP 18081) in `demo`,
/// and the cluster DNS in kube-system.
pub(crate) fn cluster() -> ClusterView {
    let mut view = ClusterView::new();
    let deployment = |name: &str| {
        Some(Workload {
            kind: WorkloadKind::Deployment,
            name: name.into(),
        })
    };
    view.insert_pod(PodInfo {
        namespace: NS.into(),
        name: "http-client-7d9c-abcde".into(),
        labels: labels(&[("app", "http-client"), ("pod-template-hash", "7d9c")]),
        ips: vec!["10.1.0.2".parse().unwrap()],
        ports: vec![],
        workload: deployment("http-client"),
    });
    view.insert_pod(PodInfo {
        namespace: NS.into(),
        name: "http-server-5f6b-xyzab".into(),
        labels: labels(&[("app", "http-server"), ("pod-template-hash", "5f6b")]),
        ips: vec!["10.1.0.3".parse().unwrap()],
        ports: vec![
            ContainerPort {
                name: Some("tcp-echo".into()),
                port: 18080,
                protocol: Protocol::TCP,
            },
            ContainerPort {
                name: Some("tcp-alt".into()),
                port: 18082,
                protocol: Protocol::TCP,
            },
            ContainerPort {
                name: Some("udp-echo".into()),
                port: 18081,
                protocol: Protocol::UDP,
            },
        ],
        workload: deployment("http-server"),
    });
    view.insert_pod(PodInfo {
        namespace: "kube-system".into(),
        name: "coredns-66bc-12345".into(),
        labels: labels(&[("k8s-app", "kube-dns")]),
        ips: vec!["10.1.0.10".parse().unwrap()],
        ports: vec![ContainerPort {
            name: Some("dns".into()),
            port: 53,
            protocol: Protocol::UDP,
        }],
        workload: deployment("coredns"),
    });
    view
}

pub(crate) fn workload_ref(namespace: &str, name: &str, identity: &str) -> WorkloadRef {
    WorkloadRef {
        namespace: namespace.into(),
        owner_kind: "Deployment".into(),
        owner_name: name.into(),
        identity: identity.into(),
        ..WorkloadRef::default()
    }
}

pub(crate) fn client() -> FlowSide {
    FlowSide {
        endpoint: Endpoint::Pod(PodKey::new(NS, "http-client-7d9c-abcde")),
        workload: workload_ref(NS, "http-client", CLIENT_SA).into(),
    }
}

pub(crate) fn server() -> FlowSide {
    FlowSide {
        endpoint: Endpoint::Pod(PodKey::new(NS, "http-server-5f6b-xyzab")),
        workload: workload_ref(NS, "http-server", "cluster.local/ns/demo/sa/http-server-sa").into(),
    }
}

pub(crate) fn dns() -> FlowSide {
    FlowSide {
        endpoint: Endpoint::Pod(PodKey::new("kube-system", "coredns-66bc-12345")),
        workload: workload_ref("kube-system", "coredns", "").into(),
    }
}

pub(crate) fn external(ip: &str) -> FlowSide {
    FlowSide {
        endpoint: Endpoint::Ip(ip.parse().unwrap()),
        workload: WorkloadRef {
            address: ip.into(),
            ..WorkloadRef::default()
        }
        .into(),
    }
}

pub(crate) fn observed(
    source: FlowSide,
    destination: FlowSide,
    protocol: Protocol,
    port: u16,
) -> ObservedFlow {
    ObservedFlow {
        source,
        destination,
        protocol,
        port,
        seen_at: time(0),
        peer_name: None,
    }
}

/// A kubernetes-backend policy `name` in `demo` targeting Deployment `target`.
pub(crate) fn wnp(
    name: &str,
    target: &str,
    direction: &str,
    mode: &str,
    kubernetes: Value,
) -> WorkloadNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": name, "namespace": NS, "uid": name, "generation": 1,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"backend": "kubernetes", "direction": direction, "mode": mode,
                 "targetRef": {"kind": "Deployment", "name": target}, "kubernetes": kubernetes}
    }))
    .unwrap()
}

/// The scenario's step 2: the learned egress policy of http-client (TCP 18080 to the server, UDP 53 to
/// DNS).
pub(crate) fn client_egress(mode: &str) -> WorkloadNetworkPolicy {
    wnp(
        "deployment-http-client-egress",
        "http-client",
        "Egress",
        mode,
        json!({
            "podSelector": {"matchLabels": {"app": "http-client"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                         "podSelector": {"matchLabels": {"app": "http-server"}}}],
                 "ports": [{"protocol": "TCP", "port": 18080}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}]}
            ]
        }),
    )
}

/// The scenario's step 2: the learned ingress policy of http-server (TCP 18080 from the client).
pub(crate) fn server_ingress(mode: &str) -> WorkloadNetworkPolicy {
    server_ingress_with(
        mode,
        json!([{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                          "podSelector": {"matchLabels": {"app": "http-client"}}}],
                "ports": [{"protocol": "TCP", "port": 18080}]}]),
    )
}

fn server_ingress_with(mode: &str, rules: Value) -> WorkloadNetworkPolicy {
    wnp(
        "deployment-http-server-ingress",
        "http-server",
        "Ingress",
        mode,
        json!({"podSelector": {"matchLabels": {"app": "http-server"}}, "policyTypes": ["Ingress"], "ingress": rules}),
    )
}

fn client_egress_with(rules: Value) -> WorkloadNetworkPolicy {
    wnp(
        "deployment-http-client-egress",
        "http-client",
        "Egress",
        "monitor",
        json!({"podSelector": {"matchLabels": {"app": "http-client"}}, "policyTypes": ["Egress"], "egress": rules}),
    )
}

/// A protect-mode policy's rendered NetworkPolicy, as the policy reconciler creates it.
fn rendered(policy: &WorkloadNetworkPolicy) -> NamedPolicy {
    NamedPolicy {
        namespace: NS.into(),
        name: policy.name_any(),
        spec: policy.spec.kubernetes.clone().unwrap(),
    }
}

/// (policy name, direction, action) of each attribution, in order.
fn summary(attributed: &[Attributed]) -> Vec<(String, Direction, PolicyMode)> {
    attributed
        .iter()
        .map(|a| {
            (
                a.key().name,
                a.observation().direction,
                a.observation().action,
            )
        })
        .collect()
}

fn egress_name() -> String {
    "deployment-http-client-egress".into()
}

fn ingress_name() -> String {
    "deployment-http-server-ingress".into()
}

fn udp_echo() -> ObservedFlow {
    observed(client(), server(), Protocol::UDP, 18081)
}

#[test]
fn the_scenario_monitor_records_on_both_policies() {
    let view = cluster();
    let policies = [client_egress("monitor"), server_ingress("monitor")];
    let set = PolicySet::new(&policies);
    assert!(
        attribute(
            &view,
            &set,
            &observed(client(), server(), Protocol::TCP, 18080)
        )
        .unwrap()
        .is_empty()
    );
    assert!(
        attribute(&view, &set, &observed(client(), dns(), Protocol::UDP, 53))
            .unwrap()
            .is_empty()
    );
    let flow = udp_echo();
    let attributed = attribute(&view, &set, &flow).unwrap();
    assert_eq!(
        summary(&attributed),
        [
            (egress_name(), Direction::Egress, PolicyMode::Monitor),
            (ingress_name(), Direction::Ingress, PolicyMode::Monitor)
        ]
    );
    let o = attributed[0].observation();
    assert_eq!(o.source.owner_name, "http-client");
    assert_eq!(o.dest.owner_name, "http-server");
    assert_eq!((o.protocol, o.dst_port), (Protocol::UDP, Some(18081)));
    assert_eq!(
        (
            o.denying_policy_namespace.as_str(),
            o.denying_policy_name.as_str()
        ),
        (NS, "deployment-http-client-egress")
    );
    assert_eq!(
        attributed[1].observation().denying_policy_name,
        ingress_name()
    );
    // The repeat window sees the same key before the observation is built as after.
    for a in &attributed {
        assert_eq!(a.repeat_key(), RepeatKey::of(&a.observation()));
        assert_eq!(a.key().name, a.observation().denying_policy_name);
    }
}

#[test]
fn the_scenario_protect_records_on_the_egress_policy_only() {
    let mut view = cluster();
    let policies = [client_egress("protect"), server_ingress("protect")];
    for p in &policies {
        view.insert_policy(rendered(p));
    }
    let set = PolicySet::new(&policies);
    assert_eq!(
        summary(&attribute(&view, &set, &udp_echo()).unwrap()),
        [(egress_name(), Direction::Egress, PolicyMode::Protect)]
    );
    assert!(
        attribute(
            &view,
            &set,
            &observed(client(), server(), Protocol::TCP, 18080)
        )
        .unwrap()
        .is_empty(),
        "TCP 18080 keeps working"
    );
}

#[test]
fn mixed_modes_follow_the_egress_policy_mode() {
    let view = cluster();
    let policies = [client_egress("protect"), server_ingress("monitor")];
    assert_eq!(
        summary(&attribute(&view, &PolicySet::new(&policies), &udp_echo()).unwrap()),
        [(egress_name(), Direction::Egress, PolicyMode::Protect)]
    );
    let policies = [client_egress("monitor"), server_ingress("protect")];
    assert_eq!(
        summary(&attribute(&view, &PolicySet::new(&policies), &udp_echo()).unwrap()),
        [
            (egress_name(), Direction::Egress, PolicyMode::Monitor),
            (ingress_name(), Direction::Ingress, PolicyMode::Protect)
        ]
    );
    // Egress allows, ingress denies in protect: the ingress policy records.
    let policies = [server_ingress("protect")];
    assert_eq!(
        summary(&attribute(&view, &PolicySet::new(&policies), &udp_echo()).unwrap()),
        [(ingress_name(), Direction::Ingress, PolicyMode::Protect)]
    );
}

/// The end-to-end scenario, Kubernetes backend, from promotion on: steps 4 and 5 as status bookkeeping.
#[test]
fn the_kubernetes_scenario_from_promotion_on() {
    let mut view = cluster();
    type Statuses = HashMap<String, network_enforcer_api::WorkloadNetworkPolicyStatus>;
    let mut statuses = Statuses::new();
    // One status sync of every policy after `flows` were observed.
    let run = |statuses: &mut Statuses,
               view: &ClusterView,
               policies: &[WorkloadNetworkPolicy],
               flows: &[ObservedFlow]| {
        let set = PolicySet::new(policies);
        let mut per_policy: HashMap<String, Vec<Observation>> = HashMap::new();
        for flow in flows {
            for a in attribute(view, &set, flow).unwrap() {
                per_policy
                    .entry(a.key().name)
                    .or_default()
                    .push(a.observation());
            }
        }
        for policy in policies {
            let name = policy.name_any();
            let observations = per_policy.remove(&name).unwrap_or_default();
            let outcome = violations::sync(
                SyncInput {
                    status: statuses.get(&name),
                    generation: policy.metadata.generation,
                    annotations: None,
                    observations: &observations,
                    now: &time(60),
                },
                |record| record_allowed_now(view, policy, record),
            );
            statuses.insert(name, outcome.status);
        }
    };
    // Step 4: both in monitor; TCP 18080, DNS and one UDP 18083→18081 exchange.
    let monitor = [client_egress("monitor"), server_ingress("monitor")];
    let traffic = [
        observed(client(), dns(), Protocol::UDP, 53),
        observed(client(), server(), Protocol::TCP, 18080),
        udp_echo(),
    ];
    run(&mut statuses, &view, &monitor, &traffic);
    for name in [egress_name(), ingress_name()] {
        let status = &statuses[&name];
        assert_eq!(
            (status.violation_count, status.active_violation_count),
            (1, 1),
            "{name}"
        );
        let record = &status.violations[0];
        assert_eq!(
            (record.protocol, record.dst_port, record.action),
            (Protocol::UDP, Some(18081), PolicyMode::Monitor)
        );
        assert_eq!(record.denying_policy_name, name);
    }
    // Step 5: both in protect, the NetworkPolicies rendered; UDP is now blocked at the source.
    let protect = [client_egress("protect"), server_ingress("protect")];
    for p in &protect {
        view.insert_policy(rendered(p));
    }
    run(&mut statuses, &view, &protect, &traffic);
    let egress = &statuses[&egress_name()];
    assert_eq!(
        (egress.violation_count, egress.active_violation_count),
        (2, 2)
    );
    assert_eq!(
        egress.violations[0].action,
        PolicyMode::Protect,
        "newest first"
    );
    let ingress = &statuses[&ingress_name()];
    assert_eq!(
        (ingress.violation_count, ingress.active_violation_count),
        (1, 1)
    );
}

#[test]
fn network_policies_in_force_can_allow_what_ours_does_not() {
    let mut view = cluster();
    view.insert_policy(NamedPolicy {
        namespace: NS.into(),
        name: "hand-written-allow-udp".into(),
        spec: serde_json::from_value(json!({
            "podSelector": {"matchLabels": {"app": "http-client"}},
            "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "UDP"}]}]
        }))
        .unwrap(),
    });
    let policies = [client_egress("monitor"), server_ingress("monitor")];
    assert_eq!(
        summary(&attribute(&view, &PolicySet::new(&policies), &udp_echo()).unwrap()),
        [(ingress_name(), Direction::Ingress, PolicyMode::Monitor)],
        "the egress side passes thanks to the hand-written policy"
    );
}

#[test]
fn both_directions_of_one_workload_are_attributed_by_target_and_direction() {
    let view = cluster();
    // http-server has both an ingress and an egress policy, with the same podSelector.
    let server_egress = wnp(
        "deployment-http-server-egress",
        "http-server",
        "Egress",
        "monitor",
        json!({"podSelector": {"matchLabels": {"app": "http-server"}}, "policyTypes": ["Egress"], "egress": []}),
    );
    let policies = [
        server_ingress("monitor"),
        server_egress,
        client_egress("monitor"),
    ];
    let set = PolicySet::new(&policies);
    assert_eq!(set.len(), 3);
    let flow = observed(client(), server(), Protocol::TCP, 18082);
    let inbound = attribute(&view, &set, &flow).unwrap();
    assert_eq!(
        summary(&inbound),
        [
            (egress_name(), Direction::Egress, PolicyMode::Monitor),
            (ingress_name(), Direction::Ingress, PolicyMode::Monitor)
        ]
    );
    let flow = observed(server(), dns(), Protocol::UDP, 53);
    let outbound = attribute(&view, &set, &flow).unwrap();
    assert_eq!(
        summary(&outbound),
        [(
            "deployment-http-server-egress".to_string(),
            Direction::Egress,
            PolicyMode::Monitor
        )]
    );
}

#[test]
fn duplicate_targets_record_on_the_oldest_live_policy_only() {
    let view = cluster();
    let mut old = client_egress_with(json!([]));
    old.metadata.name = Some("old".into());
    old.metadata.uid = Some("old".into());
    old.metadata.creation_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let young = client_egress("monitor");
    let policies = [young.clone(), old.clone()];
    let set = PolicySet::new(&policies);
    assert_eq!(set.len(), 1);
    let names: Vec<_> = attribute(
        &view,
        &set,
        &observed(client(), server(), Protocol::TCP, 18080),
    )
    .unwrap()
    .into_iter()
    .map(|a| a.key().name)
    .collect();
    assert_eq!(
        names,
        ["old"],
        "the oldest governs; the young one would allow this flow"
    );
    // Once the oldest is being deleted, the young one governs.
    old.metadata.deletion_timestamp = Some(time(0));
    let policies = [old, young];
    let set = PolicySet::new(&policies);
    assert!(
        attribute(
            &view,
            &set,
            &observed(client(), server(), Protocol::TCP, 18080)
        )
        .unwrap()
        .is_empty()
    );
}

#[test]
fn an_invalid_older_policy_does_not_take_the_evidence_of_a_valid_one() {
    let view = cluster();
    // Older and invalid: an empty podSelector (rule PodSelectorNotEmpty); it allows nothing.
    let mut old = client_egress_with(json!([]));
    old.metadata.name = Some("old".into());
    old.metadata.uid = Some("old".into());
    old.metadata.creation_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    old.spec.kubernetes.as_mut().unwrap().pod_selector = Some(Default::default());
    let young = client_egress("monitor");
    let policies = [old, young];
    let set = PolicySet::new(&policies);
    assert_eq!(set.len(), 1);
    assert!(
        attribute(
            &view,
            &set,
            &observed(client(), server(), Protocol::TCP, 18080)
        )
        .unwrap()
        .is_empty(),
        "the valid one governs, and allows this flow"
    );
    // Judged as the reconciler judges, the old one is valid too here: the oldest governs.
    let set = PolicySet::judged(&policies, |_| true);
    let names: Vec<_> = attribute(
        &view,
        &set,
        &observed(client(), server(), Protocol::TCP, 18080),
    )
    .unwrap()
    .into_iter()
    .map(|a| a.key().name)
    .collect();
    assert_eq!(names, ["old"]);
}

#[test]
fn a_policy_that_does_not_select_the_pod_records_nothing() {
    let view = cluster();
    let mut stray = client_egress_with(json!([]));
    stray.spec.kubernetes.as_mut().unwrap().pod_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"app": "someone-else"}})).unwrap());
    assert_eq!(
        policy_verdict(&view, &stray, &udp_echo().flow(), None, None).unwrap(),
        PolicyVerdict::NotApplicable
    );
    assert!(
        attribute(&view, &PolicySet::new([&stray]), &udp_echo())
            .unwrap()
            .is_empty()
    );
    // The same policy selecting the pod denies.
    let denying = client_egress_with(json!([]));
    assert_eq!(
        policy_verdict(&view, &denying, &udp_echo().flow(), None, None).unwrap(),
        PolicyVerdict::Denies
    );
}

#[test]
fn peers_outside_the_cluster_are_recorded_by_address() {
    let view = cluster();
    let policies = [client_egress("monitor"), server_ingress("monitor")];
    let set = PolicySet::new(&policies);
    let flow = observed(external("203.0.113.5"), server(), Protocol::TCP, 18080);
    let inbound = attribute(&view, &set, &flow).unwrap();
    assert_eq!(
        summary(&inbound),
        [(ingress_name(), Direction::Ingress, PolicyMode::Monitor)]
    );
    assert_eq!(inbound[0].observation().source.address, "203.0.113.5");
    let flow = observed(client(), external("8.8.8.8"), Protocol::TCP, 443);
    let outbound = attribute(&view, &set, &flow).unwrap();
    assert_eq!(
        summary(&outbound),
        [(egress_name(), Direction::Egress, PolicyMode::Monitor)]
    );
    assert_eq!(outbound[0].observation().dest.address, "8.8.8.8");
}

#[test]
fn istio_policies_are_evaluated_by_principal_and_port() {
    let view = cluster();
    let policy: WorkloadNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "deployment-http-server-ingress", "namespace": NS, "uid": "u"},
        "spec": {"backend": "istio", "direction": "Ingress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "http-server"},
                 "istio": {"selector": {"matchLabels": {"app": "http-server"}},
                           "rules": [{"from": [{"source": {"principals": [CLIENT_SA]}}],
                                      "to": [{"operation": {"ports": ["18080"]}}]}]}}
    }))
    .unwrap();
    let set = PolicySet::new([&policy]);
    let at = |flow: ObservedFlow| summary(&attribute(&view, &set, &flow).unwrap());
    assert!(at(observed(client(), server(), Protocol::TCP, 18080)).is_empty());
    assert_eq!(
        at(observed(client(), server(), Protocol::TCP, 18082)),
        [(ingress_name(), Direction::Ingress, PolicyMode::Monitor)],
        "istio scenario step 4"
    );
    assert!(at(udp_echo()).is_empty(), "ztunnel does not see UDP");
    let mut anonymous = client();
    Arc::make_mut(&mut anonymous.workload).identity.clear();
    assert_eq!(
        at(observed(anonymous, server(), Protocol::TCP, 18080)).len(),
        1
    );
}

#[test]
fn a_policy_without_its_payload_is_an_error() {
    let view = cluster();
    let mut broken = client_egress("monitor");
    broken.spec.kubernetes = None;
    assert_eq!(
        attribute(&view, &PolicySet::new([&broken]), &udp_echo()).unwrap_err(),
        EvalError::MissingPayload {
            namespace: NS.into(),
            name: egress_name(),
            payload: "kubernetes"
        }
    );
}

// --- The reference's false violations, each made impossible by semantic evaluation. ---

/// Asserts that `policy` (an egress policy of http-client or an ingress policy of http-server) allows
/// the UDP 18083→18081 flow and still denies TCP 18082, so the test fails if either way breaks.
fn assert_allows_udp_echo_only(policy: WorkloadNetworkPolicy) {
    let view = cluster();
    let set = PolicySet::new([&policy]);
    assert!(
        attribute(&view, &set, &udp_echo()).unwrap().is_empty(),
        "{}",
        policy.name_any()
    );
    assert_eq!(
        attribute(
            &view,
            &set,
            &observed(client(), server(), Protocol::TCP, 18082)
        )
        .unwrap()
        .len(),
        1,
        "{}: other traffic still violates",
        policy.name_any()
    );
}

#[test]
fn spec11_namespace_only_peers_give_no_false_violation() {
    assert_allows_udp_echo_only(client_egress_with(json!([{
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}}}],
        "ports": [{"protocol": "UDP", "port": 18081}]
    }])));
}

#[test]
fn spec11_ip_blocks_give_no_false_violation() {
    assert_allows_udp_echo_only(client_egress_with(json!([{
        "to": [{"ipBlock": {"cidr": "10.1.0.0/24", "except": ["10.1.0.128/25"]}}],
        "ports": [{"protocol": "UDP", "port": 18081}]
    }])));
}

#[test]
fn spec11_end_port_gives_no_false_violation() {
    assert_allows_udp_echo_only(server_ingress_with(
        "monitor",
        json!([{"ports": [{"protocol": "UDP", "port": 18000, "endPort": 18100}]}]),
    ));
}

#[test]
fn spec11_named_ports_give_no_false_violation() {
    assert_allows_udp_echo_only(server_ingress_with(
        "monitor",
        json!([{"from": [{"podSelector": {"matchLabels": {"app": "http-client"}}}],
                "ports": [{"protocol": "UDP", "port": "udp-echo"}]}]),
    ));
}

#[test]
fn spec11_multi_peer_rules_give_no_false_violation() {
    assert_allows_udp_echo_only(server_ingress_with(
        "monitor",
        json!([{"from": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}},
                     "podSelector": {"matchLabels": {"app": "x"}}},
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                     "podSelector": {"matchLabels": {"app": "http-client"}}}],
                "ports": [{"protocol": "TCP", "port": 18080}, {"protocol": "UDP", "port": 18081}]}]),
    ));
}

#[test]
fn spec11_hand_edited_policies_give_no_false_violation() {
    // Rules rewritten by hand: expressions instead of matchLabels, the UDP port in a second rule
    // with no peers, the learned rule moved last.
    assert_allows_udp_echo_only(server_ingress_with(
        "monitor",
        json!([
            {"ports": [{"protocol": "UDP", "port": 18081}]},
            {"from": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["http-client", "curl"]}]}}],
             "ports": [{"port": 18080}]}
        ]),
    ));
}

// --- clearing records the current spec allows ---

fn record(
    source: impl Into<Arc<WorkloadRef>>,
    dest: impl Into<Arc<WorkloadRef>>,
    protocol: Protocol,
    port: Option<i32>,
) -> ViolationRecord {
    ViolationRecord {
        id: 0,
        timestamp: time(0),
        source: WorkloadRef::clone(&source.into()),
        dest: WorkloadRef::clone(&dest.into()),
        protocol,
        dst_port: port,
        action: PolicyMode::Monitor,
        direction: Some(Direction::Ingress),
        denying_policy_namespace: NS.into(),
        denying_policy_name: ingress_name(),
    }
}

#[test]
fn records_are_cleared_only_when_the_current_spec_allows_them() {
    let view = cluster();
    let udp = record(
        client().workload,
        server().workload,
        Protocol::UDP,
        Some(18081),
    );
    assert!(!record_allowed_now(&view, &server_ingress("monitor"), &udp));
    let edited = server_ingress_with(
        "monitor",
        json!([{"from": [{"podSelector": {"matchLabels": {"app": "http-client"}}}],
                "ports": [{"port": 18080}, {"protocol": "UDP", "port": "udp-echo"}]}]),
    );
    assert!(record_allowed_now(&view, &edited, &udp));
    // Without a port, or with a workload that has no pod now, the flow cannot be rebuilt: kept.
    let no_port = record(client().workload, server().workload, Protocol::UDP, None);
    assert!(!record_allowed_now(&view, &edited, &no_port));
    let gone = record(
        workload_ref(NS, "deleted", ""),
        server().workload,
        Protocol::UDP,
        Some(18081),
    );
    assert!(!record_allowed_now(&view, &edited, &gone));
    // An external peer is rebuilt from its address.
    let from_outside = record(
        external("203.0.113.5").workload,
        server().workload,
        Protocol::TCP,
        Some(18080),
    );
    assert!(!record_allowed_now(
        &view,
        &server_ingress("monitor"),
        &from_outside
    ));
    let open_to_block = server_ingress_with(
        "monitor",
        json!([{"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 18080}]}]),
    );
    assert!(record_allowed_now(&view, &open_to_block, &from_outside));
}

#[test]
fn a_record_of_an_address_resolved_from_a_name_is_cleared_once_the_name_is_listed() {
    let view = cluster();
    let to = |name: &str, port: i32| ViolationRecord {
        direction: Some(Direction::Egress),
        denying_policy_name: egress_name(),
        ..record(
            client().workload,
            WorkloadRef {
                address: "203.0.113.7".into(),
                dns_name: name.into(),
                ..WorkloadRef::default()
            },
            Protocol::TCP,
            Some(port),
        )
    };
    let mut named = client_egress("monitor");
    named.spec.egress_names = serde_json::from_value(json!([
        {"names": ["*.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]}
    ]))
    .unwrap();
    // (record's name, port) → cleared by the policy that lists `*.partner.test` on 443
    let cases = [
        ("api.partner.test", 443, true),
        ("api.partner.test", 80, false),
        ("api.other.test", 443, false),
        // The address used as a literal: names never allow it.
        ("", 443, false),
    ];
    for (name, port, cleared) in cases {
        let record = to(name, port);
        assert!(
            !record_allowed_now(&view, &client_egress("monitor"), &record),
            "{name:?}/{port} before the name is listed"
        );
        assert_eq!(
            record_allowed_now(&view, &named, &record),
            cleared,
            "{name:?}/{port}"
        );
    }
}

/// A record is rebuilt from its workloads' pods, whatever their kind: a bare pod is its own workload
/// (found by its name, with no owner), every other kind by its owner. Each kind, as the source and as
/// the destination of a violation that an edit of the policy now allows, must be cleared.
#[test]
fn records_of_every_workload_kind_are_cleared_when_the_policy_allows_them_now() {
    for kind in WorkloadKind::ALL {
        let mut view = cluster();
        let bare = kind == WorkloadKind::Pod;
        view.insert_pod(PodInfo {
            namespace: NS.into(),
            name: if bare {
                "peer".into()
            } else {
                "peer-abcde".into()
            },
            labels: labels(&[("app", "peer")]),
            ips: vec!["10.1.0.20".parse().unwrap()],
            ports: vec![],
            workload: (!bare).then(|| Workload {
                kind,
                name: "peer".into(),
            }),
        });
        let peer = WorkloadRef {
            namespace: NS.into(),
            owner_kind: kind.as_str().into(),
            owner_name: "peer".into(),
            ..WorkloadRef::default()
        };

        // As the source: the server's ingress policy is edited to admit it.
        let from_peer = record(peer.clone(), server().workload, Protocol::TCP, Some(18080));
        assert!(
            !record_allowed_now(&view, &server_ingress("monitor"), &from_peer),
            "{kind:?} source: allowed before the edit"
        );
        let admits_peer = server_ingress_with(
            "monitor",
            json!([{"from": [{"podSelector": {"matchLabels": {"app": "peer"}}}],
                    "ports": [{"port": 18080}]}]),
        );
        assert!(
            record_allowed_now(&view, &admits_peer, &from_peer),
            "{kind:?} source: not cleared after the edit"
        );

        // As the destination: its own ingress policy is edited to admit the client.
        let to_peer = record(client().workload, peer, Protocol::TCP, Some(8080));
        let peer_ingress = |rules: Value| {
            wnp(
                "peer-ingress",
                "peer",
                "Ingress",
                "monitor",
                json!({"podSelector": {"matchLabels": {"app": "peer"}},
                       "policyTypes": ["Ingress"], "ingress": rules}),
            )
        };
        assert!(
            !record_allowed_now(&view, &peer_ingress(json!([])), &to_peer),
            "{kind:?} destination: allowed before the edit"
        );
        let admits_client = peer_ingress(
            json!([{"from": [{"podSelector": {"matchLabels": {"app": "http-client"}}}],
                    "ports": [{"port": 8080}]}]),
        );
        assert!(
            record_allowed_now(&view, &admits_client, &to_peer),
            "{kind:?} destination: not cleared after the edit"
        );
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;

    fn egress_rule() -> impl Strategy<Value = Value> {
        select(vec![
            json!({}),
            json!({"to": [{"podSelector": {"matchLabels": {"app": "http-server"}}}]}),
            json!({"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP"}]}),
            json!({"to": [{"ipBlock": {"cidr": "10.1.0.0/30"}}], "ports": [{"port": 18080, "endPort": 18082}]}),
            json!({"ports": [{"protocol": "UDP", "port": "udp-echo"}]}),
            json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}),
        ])
    }

    fn ingress_rule() -> impl Strategy<Value = Value> {
        select(vec![
            json!({}),
            json!({"from": [{"podSelector": {"matchLabels": {"app": "http-client"}}}], "ports": [{"port": "tcp-alt"}]}),
            json!({"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]}),
            json!({"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}),
            json!({"ports": [{"protocol": "UDP", "port": 18081}]}),
        ])
    }

    fn flow() -> impl Strategy<Value = ObservedFlow> {
        let sides = || select(vec!["client", "server", "dns", "internet"]);
        (
            sides(),
            sides(),
            select(vec![
                (Protocol::TCP, 18080u16),
                (Protocol::TCP, 18082),
                (Protocol::UDP, 18081),
                (Protocol::UDP, 53),
                (Protocol::TCP, 443),
            ]),
        )
            .prop_map(|(from, to, (protocol, port))| {
                let side = |s: &str| match s {
                    "client" => client(),
                    "server" => server(),
                    "dns" => dns(),
                    _ => external("203.0.113.5"),
                };
                observed(side(from), side(to), protocol, port)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Protect records exactly what monitor records, except that a protect-mode egress
        /// denial hides the flow from the destination's ingress policy. Each record names its policy
        /// and that policy's direction and mode.
        #[test]
        fn protect_records_what_monitor_records_up_to_the_egress_stop(
            egress in prop::collection::vec(egress_rule(), 0..3),
            ingress in prop::collection::vec(ingress_rule(), 0..3),
            flow in flow(),
        ) {
            let policies = |mode: &str| {
                let mut e = client_egress_with(Value::Array(egress.clone()));
                e.spec.mode = if mode == "protect" { PolicyMode::Protect } else { PolicyMode::Monitor };
                [e, server_ingress_with(mode, Value::Array(ingress.clone()))]
            };
            let monitor = policies("monitor");
            let in_monitor = attribute(&cluster(), &PolicySet::new(&monitor), &flow).unwrap();
            let protect = policies("protect");
            let mut view = cluster();
            for p in &protect {
                view.insert_policy(rendered(p));
            }
            let in_protect = attribute(&view, &PolicySet::new(&protect), &flow).unwrap();

            let names = |a: &[Attributed]| a.iter().map(|a| (a.key().name, a.observation().direction)).collect::<Vec<_>>();
            let mut expected = names(&in_monitor);
            if expected.first().is_some_and(|(_, d)| *d == Direction::Egress) {
                expected.truncate(1);
            }
            prop_assert_eq!(names(&in_protect), expected);
            for (a, mode) in in_monitor.iter().map(|a| (a, PolicyMode::Monitor))
                .chain(in_protect.iter().map(|a| (a, PolicyMode::Protect)))
            {
                prop_assert_eq!(a.observation().action, mode);
                prop_assert_eq!(a.observation().denying_policy_name, a.key().name);
                let expected_direction = if a.key().name == egress_name() { Direction::Egress } else { Direction::Ingress };
                prop_assert_eq!(a.observation().direction, expected_direction);
            }
        }
    }
}

/// Rule usage (docs/api.md, "Rule usage"): which rules of the policies in force allowed a flow, on
/// each side; nothing for a side that denies or that a protect egress denial kept the flow from.
#[test]
fn rule_usage_names_the_rules_that_allowed_each_side() {
    let mut view = cluster();
    let istio: WorkloadNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "server-istio", "namespace": NS, "uid": "i",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"backend": "istio", "direction": "Ingress",
                 "targetRef": {"kind": "Deployment", "name": "http-server"},
                 "istio": {"selector": {"matchLabels": {"app": "http-server"}},
                           "rules": [{"to": [{"operation": {"ports": ["18082"]}}]},
                                     {"from": [{"source": {"principals": [CLIENT_SA]}}],
                                      "to": [{"operation": {"ports": ["18080"]}}]}]}}
    }))
    .unwrap();
    // The egress policy lists the TCP rule twice: both are used.
    let doubled = client_egress_with(json!([
        {"ports": [{"protocol": "TCP", "port": 18080}]},
        {"ports": [{"protocol": "UDP", "port": 53}]},
        {"to": [{"podSelector": {"matchLabels": {"app": "http-server"}}}],
         "ports": [{"protocol": "TCP", "port": 18080}]}
    ]));
    let usage = |view: &ClusterView, policies: &[&WorkloadNetworkPolicy], flow: ObservedFlow| {
        let set = PolicySet::new(policies.iter().copied());
        let mut used = Vec::new();
        attribute_with_usage(view, &set, &flow, Some(&mut used)).unwrap();
        used.into_iter()
            .map(|m| (m.policy.name, m.direction, m.rules))
            .collect::<Vec<_>>()
    };
    let (egress, ingress) = (client_egress("monitor"), server_ingress("monitor"));
    let tcp = || observed(client(), server(), Protocol::TCP, 18080);
    type Used = Vec<(String, Direction, Vec<usize>)>;
    let cases: Vec<(&str, Vec<&WorkloadNetworkPolicy>, ObservedFlow, Used)> = vec![
        (
            "both sides allow: each policy's rule",
            vec![&egress, &ingress],
            tcp(),
            vec![
                (egress_name(), Direction::Egress, vec![0]),
                (ingress_name(), Direction::Ingress, vec![0]),
            ],
        ),
        (
            "the DNS rule",
            vec![&egress, &ingress],
            observed(client(), dns(), Protocol::UDP, 53),
            vec![(egress_name(), Direction::Egress, vec![1])],
        ),
        (
            "a violation on both sides uses no rule",
            vec![&egress, &ingress],
            udp_echo(),
            vec![],
        ),
        (
            "every matching rule, in order",
            vec![&doubled],
            tcp(),
            vec![(egress_name(), Direction::Egress, vec![0, 2])],
        ),
        (
            "istio rules by principal and port",
            vec![&istio],
            tcp(),
            vec![("server-istio".to_string(), Direction::Ingress, vec![1])],
        ),
        (
            "no identity: the istio rule with a principal does not match",
            vec![&istio],
            observed(external("192.0.2.1"), server(), Protocol::TCP, 18080),
            vec![],
        ),
    ];
    for (name, policies, flow, want) in cases {
        assert_eq!(usage(&view, &policies, flow), want, "{name}");
    }
    // `egressNames` entries count after the direction's own rules (two here): every entry that
    // allows the name and port; an address literal uses none.
    let mut named = client_egress("monitor");
    named.spec.egress_names = serde_json::from_value(json!([
        {"names": ["api.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]},
        {"names": ["*.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]},
        {"names": ["api.partner.test"], "ports": [{"protocol": "TCP", "port": 80}]}
    ]))
    .unwrap();
    let to = |name: Option<&str>| ObservedFlow {
        peer_name: name.map(Arc::from),
        ..observed(client(), external("203.0.113.7"), Protocol::TCP, 443)
    };
    assert_eq!(
        usage(&view, &[&named], to(Some("api.partner.test"))),
        vec![(egress_name(), Direction::Egress, vec![2, 3])]
    );
    assert_eq!(
        usage(&view, &[&named], to(Some("eu.partner.test"))),
        vec![(egress_name(), Direction::Egress, vec![3])]
    );
    assert_eq!(usage(&view, &[&named], to(None)), vec![]);
    // A protect egress denial: the flow never reaches the server, whose rule is not used.
    let mut protect = client_egress_with(json!([{"ports": [{"protocol": "UDP", "port": 53}]}]));
    protect.spec.mode = PolicyMode::Protect;
    assert_eq!(usage(&view, &[&protect, &ingress], tcp()), vec![]);
    // Allowed thanks to another NetworkPolicy in force, not by a rule of the policy: no usage.
    view.insert_policy(NamedPolicy {
        namespace: NS.into(),
        name: "hand-written".into(),
        spec: serde_json::from_value(json!({
            "podSelector": {"matchLabels": {"app": "http-server"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "UDP", "port": 18081}]}]
        }))
        .unwrap(),
    });
    assert_eq!(
        usage(&view, &[&ingress], udp_echo()),
        vec![],
        "the flow passes, but not by this policy's rule"
    );
    // An Admin ClusterNetworkPolicy that accepts the client's egress decides that side before any
    // NetworkPolicy (or name): the egress policy's rules are not what let the flow out. A Pass
    // leaves the decision, and the usage, to the NetworkPolicy tier; the server's side is unchanged.
    for (action, egress_used) in [("Accept", false), ("Pass", true)] {
        let mut view = view.clone();
        view.insert_cluster_policy(crate::monitor::evaluate::view::NamedClusterPolicy {
            name: "admin-egress".into(),
            spec: serde_json::from_value(json!({
                "tier": "Admin", "priority": 5,
                "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": NS}}},
                "egress": [{"action": action, "to": [{"namespaces": {}}, {"networks": ["0.0.0.0/0"]}],
                            "protocols": [{"tcp": {"destinationPort": {"number": 18080}}},
                                          {"tcp": {"destinationPort": {"number": 443}}}]}]
            }))
            .unwrap(),
        });
        let mut want = vec![(ingress_name(), Direction::Ingress, vec![0])];
        if egress_used {
            want.insert(0, (egress_name(), Direction::Egress, vec![0]));
        }
        assert_eq!(usage(&view, &[&egress, &ingress], tcp()), want, "{action}");
        let by_name = usage(&view, &[&named], to(Some("api.partner.test")));
        assert_eq!(by_name.is_empty(), !egress_used, "{action}: {by_name:?}");
    }
}

#[test]
fn an_outside_address_resolved_from_an_allowed_name_is_no_violation() {
    let view = cluster();
    let mut policy = client_egress("monitor");
    policy.spec.egress_names = serde_json::from_value(json!([
        {"names": ["api.partner.test", "*.storage.partner.test"],
         "ports": [{"protocol": "TCP", "port": 443}]}
    ]))
    .unwrap();
    let policies = [policy];
    let set = PolicySet::new(&policies);
    let to = |name: Option<&str>, port: u16| ObservedFlow {
        peer_name: name.map(Arc::from),
        ..observed(client(), external("203.0.113.7"), Protocol::TCP, port)
    };
    let cases = [
        (Some("api.partner.test"), 443, false),
        (Some("eu.storage.partner.test"), 443, false),
        // The address literal, never resolved: a violation, as without names.
        (None, 443, true),
        (Some("other.partner.test"), 443, true),
        (Some("api.partner.test"), 80, true),
    ];
    for (name, port, violation) in cases {
        let flow = to(name, port);
        let attributed = attribute(&view, &set, &flow).unwrap();
        assert_eq!(
            summary(&attributed),
            if violation {
                vec![(egress_name(), Direction::Egress, PolicyMode::Monitor)]
            } else {
                vec![]
            },
            "{name:?} port {port}"
        );
    }
    // The names allow outside addresses only: a pod the payload does not allow stays a violation
    // whatever name the agent reported.
    let named_pod = ObservedFlow {
        peer_name: Some("api.partner.test".into()),
        ..udp_echo()
    };
    assert_eq!(attribute(&view, &set, &named_pod).unwrap().len(), 1);
}

/// An Admin ClusterNetworkPolicy that denies the client's egress stops the flow at the client, whatever
/// the client's policy says (so it records nothing: it is not what blocks the flow, §3.4), and the
/// server's ingress policy never sees it, so it records nothing either. Without the Admin policy both
/// record it.
#[test]
fn an_admin_deny_at_the_source_keeps_the_flow_from_the_destinations_policy() {
    use crate::monitor::evaluate::view::NamedClusterPolicy;
    let policies = [client_egress("monitor"), server_ingress("monitor")];
    let set = PolicySet::new(&policies);
    let flow = udp_echo();
    let mut view = cluster();
    assert_eq!(
        attribute(&view, &set, &flow).unwrap().len(),
        2,
        "both, without tiers"
    );
    view.insert_cluster_policy(NamedClusterPolicy {
        name: "no-udp-out".into(),
        spec: serde_json::from_value(json!({
            "tier": "Admin", "priority": 5,
            "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": NS}}},
            "egress": [{"action": "Deny", "to": [{"namespaces": {}}],
                        "protocols": [{"udp": {"destinationPort": {"range": {"start": 18000, "end": 18999}}}}]}]
        }))
        .unwrap(),
    });
    let attributed = attribute(&view, &set, &flow).unwrap();
    assert_eq!(
        summary(&attributed),
        [],
        "the flow never reaches the server"
    );
    // A flow the Admin tier does not deny is unchanged.
    assert!(
        attribute(
            &view,
            &set,
            &observed(client(), server(), Protocol::TCP, 18080)
        )
        .unwrap()
        .is_empty()
    );
}
