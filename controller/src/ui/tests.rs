//! Table tests of the web view's pure views and of its HTTP answers, on plain objects.

use super::graph_view::{self, EdgeState, GraphQuery};
use super::objects::{PolicyObject, Snapshot};
use super::server::{self, UiMetrics, UiState};
use super::{proposal_diff, workload_view};
use crate::monitor::evaluate::verdict::SideDecision;
use network_enforcer_api::WorkloadRef;
use std::sync::Arc;

/// 2026-01-01T00:10:00Z.
const NOW_MS: i64 = 1_767_226_200_000;

/// The end-to-end scenario's proposals (docs/development.md): http-client calls http-server on TCP
/// 18080 and the cluster DNS; http-server also hears from two outside peers.
const PROPOSALS: &str = include_str!("../../tests/data/scenario-proposals.yaml");

/// http-client's egress policy, promoted from its proposal, in `mode`, with one violation (the
/// client calling the db) recorded with `action` at `timestamp`, and the rule usage other
/// controllers write.
fn policy(mode: &str, action: &str, timestamp: &str) -> PolicyObject {
    let yaml = format!(
        r#"
apiVersion: networkenforcer.kubewarden.io/v1alpha1
kind: WorkloadNetworkPolicy
metadata:
  name: deployment-http-client-egress
  namespace: demo
  labels: {{networkenforcer.kubewarden.io/promoted-from: deployment-http-client-egress}}
spec:
  backend: kubernetes
  direction: Egress
  mode: {mode}
  targetRef: {{kind: Deployment, name: http-client}}
  kubernetes:
    podSelector: {{matchLabels: {{app: http-client}}}}
    policyTypes: [Egress]
    egress:
      - to: [{{podSelector: {{matchLabels: {{app: http-server}}}}}}]
        ports: [{{protocol: TCP, port: 18080}}]
status:
  violationCount: 3
  activeViolationCount: 1
  violations:
    - id: 7
      timestamp: "{timestamp}"
      source: {{namespace: demo, ownerKind: Deployment, ownerName: http-client}}
      dest: {{namespace: demo, ownerKind: Deployment, ownerName: db}}
      protocol: TCP
      dstPort: 5432
      action: {action}
      direction: Egress
  acknowledgedViolations:
    - violation:
        id: 3
        timestamp: "2026-01-01T00:01:00Z"
        source: {{namespace: demo, ownerKind: Deployment, ownerName: http-client}}
        dest: {{address: 192.0.2.1}}
        protocol: UDP
        dstPort: 123
        action: monitor
      reason: ntp is fine
      acknowledgedAt: "2026-01-01T00:02:00Z"
  conditions:
    - {{type: Ready, status: "True", reason: Rendered, message: ok, lastTransitionTime: "2026-01-01T00:00:00Z"}}
  ruleUsage:
    - {{direction: Egress, rule: 0, fingerprint: ab12, lastMatched: "2026-01-01T00:09:00Z", peers: 1, since: "2026-01-01T00:00:00Z"}}
"#
    );
    let value: serde_json::Value = serde_yaml::from_str(&yaml).expect("fixture YAML");
    PolicyObject::from_json(value).expect("fixture policy")
}

fn proposals() -> Vec<network_enforcer_api::WorkloadNetworkPolicyProposal> {
    serde_yaml::from_str(PROPOSALS).expect("fixture proposals")
}

fn snapshot(policies: Vec<PolicyObject>) -> Snapshot {
    Snapshot {
        policies,
        proposals: proposals(),
        now_ms: NOW_MS,
        ..Snapshot::default()
    }
}

const CLIENT: &str = "w:demo/Deployment/http-client";
const SERVER: &str = "w:demo/Deployment/http-server";
const DB: &str = "w:demo/Deployment/db";

/// (from, to, state, ports) of every edge, sorted.
fn edges(view: &graph_view::GraphView) -> Vec<(String, String, EdgeState, String)> {
    let mut out: Vec<_> = view
        .edges
        .iter()
        .map(|e| (e.from.clone(), e.to.clone(), e.state, e.ports.join(",")))
        .collect();
    out.sort();
    out
}

fn edge(
    from: &str,
    to: &str,
    state: EdgeState,
    ports: &str,
) -> (String, String, EdgeState, String) {
    (from.into(), to.into(), state, ports.into())
}

#[test]
fn graph_edges_carry_their_state() {
    let dns = "s:kube-system/{k8s-app=kube-dns}";
    let learned_client_server = edge(CLIENT, SERVER, EdgeState::Learned, "TCP 18080");
    let external_in = edge(
        graph_view::EXTERNAL_GROUP,
        SERVER,
        EdgeState::Learned,
        "TCP 18080",
    );
    let dns_learned = edge(CLIENT, dns, EdgeState::Learned, "UDP 53");
    let query = |window: Option<i64>| GraphQuery {
        namespace: "demo".into(),
        window_seconds: window,
        ..GraphQuery::default()
    };
    // (case, policies, query, expected edges)
    let cases = vec![
        (
            "proposals only: everything is learned",
            vec![],
            query(None),
            vec![
                dns_learned.clone(),
                learned_client_server.clone(),
                external_in.clone(),
            ],
        ),
        (
            "a monitor policy allows its rule (the DNS rule is no longer learned: the policy governs \
             the client's egress) and its violation is red",
            vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")],
            query(None),
            vec![
                edge(CLIENT, DB, EdgeState::Violation, "TCP 5432"),
                edge(CLIENT, SERVER, EdgeState::Allowed, "TCP 18080"),
                external_in.clone(),
            ],
        ),
        (
            "protect: the record is a block",
            vec![policy("protect", "protect", "2026-01-01T00:09:00Z")],
            query(None),
            vec![
                edge(CLIENT, DB, EdgeState::Blocked, "TCP 5432"),
                edge(CLIENT, SERVER, EdgeState::Allowed, "TCP 18080"),
                external_in.clone(),
            ],
        ),
        (
            "a violation older than the window is left out",
            vec![policy("monitor", "monitor", "2026-01-01T00:01:00Z")],
            query(Some(300)),
            vec![
                edge(CLIENT, SERVER, EdgeState::Allowed, "TCP 18080"),
                external_in.clone(),
            ],
        ),
        (
            "a violation inside the window stays",
            vec![policy("monitor", "monitor", "2026-01-01T00:06:00Z")],
            query(Some(300)),
            vec![
                edge(CLIENT, DB, EdgeState::Violation, "TCP 5432"),
                edge(CLIENT, SERVER, EdgeState::Allowed, "TCP 18080"),
                external_in.clone(),
            ],
        ),
        (
            "the workload filter keeps the edges touching it",
            vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")],
            GraphQuery {
                workload: Some("Deployment/db".into()),
                ..query(None)
            },
            vec![edge(CLIENT, DB, EdgeState::Violation, "TCP 5432")],
        ),
        (
            "another namespace has nothing",
            vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")],
            GraphQuery {
                namespace: "other".into(),
                ..GraphQuery::default()
            },
            vec![],
        ),
    ];
    for (case, policies, query, expected) in cases {
        let view = graph_view::build(&snapshot(policies), &query, &[]);
        assert_eq!(edges(&view), expected, "{case}");
        // Every edge joins nodes of the answer.
        for e in &view.edges {
            for end in [&e.from, &e.to] {
                assert!(
                    view.nodes.iter().any(|n| &n.id == end),
                    "{case}: {end} has no node"
                );
            }
        }
    }
}

/// The flows the controller observed say which tier decides each edge now: on the pair's rule edge,
/// else its violation edge, else an `observed` edge of their own (with nodes for ends nothing else
/// draws); flows outside the time window are left out.
#[test]
fn graph_edges_say_which_tier_decides_their_observed_flows() {
    use crate::monitor::edge_history::HistoryEdge;
    use netpol::cluster::Decider;
    let workload = |name: &str| WorkloadRef {
        namespace: "demo".into(),
        owner_kind: "Deployment".into(),
        owner_name: name.into(),
        ..WorkloadRef::default()
    };
    let side = |tier, allowed, by: &str| {
        Some(SideDecision {
            tier,
            allowed,
            by: Some(by)
                .filter(|b| !b.is_empty())
                .map(String::from)
                .into_iter()
                .collect(),
        })
    };
    let flow =
        |from: WorkloadRef, to: WorkloadRef, port, seconds_ago: i64, egress, ingress| HistoryEdge {
            last_seen_ms: NOW_MS - seconds_ago * 1000,
            count: 1,
            egress,
            ingress,
            ..HistoryEdge::flow(from, to, network_enforcer_api::Protocol::TCP, port)
        };
    let outside = WorkloadRef {
        address: "203.0.113.9".into(),
        ..WorkloadRef::default()
    };
    let observed = [
        // On the rule edge: an Admin Accept let the client out.
        flow(
            workload("http-client"),
            workload("http-server"),
            18080,
            10,
            side(Decider::Admin, true, "allow-web"),
            side(Decider::NetworkPolicy, true, "demo/server-in"),
        ),
        // On the violation edge (no rule joins the pair).
        flow(
            workload("http-client"),
            workload("db"),
            5432,
            20,
            side(Decider::Default, true, ""),
            side(Decider::Default, true, ""),
        ),
        // No rule nor record: an edge of its own, to a node of its own; a Baseline Deny decides.
        flow(
            workload("http-server"),
            workload("cache"),
            6379,
            30,
            side(Decider::Default, true, ""),
            side(Decider::Baseline, false, "default-deny"),
        ),
        // An outside client no rule names, not judged (a follower's answer): drawn, nothing claimed.
        flow(outside, workload("http-server"), 18080, 40, None, None),
        // On the rule whose peer may stand for the end: the address block.
        flow(
            WorkloadRef {
                address: "198.51.100.5".into(),
                ..WorkloadRef::default()
            },
            workload("http-server"),
            18080,
            60,
            side(Decider::Default, true, ""),
            side(Decider::Baseline, true, "floor"),
        ),
        // Older than the window.
        flow(
            workload("http-client"),
            workload("old"),
            80,
            3_600,
            side(Decider::Default, true, ""),
            side(Decider::Default, true, ""),
        ),
    ];
    let snapshot = snapshot(vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")]);
    let query = GraphQuery {
        namespace: "demo".into(),
        window_seconds: Some(600),
        ..GraphQuery::default()
    };
    let view = graph_view::build(&snapshot, &query, &observed);
    let find = |from: &str, to: &str, state| {
        view.edges
            .iter()
            .find(|e| e.from == from && e.to == to && e.state == state)
            .unwrap_or_else(|| panic!("{from} > {to} {state:?}: {:#?}", view.edges))
    };
    let tiers =
        |e: &graph_view::GraphEdge| -> Vec<Decider> { e.tiers.iter().map(|t| t.0).collect() };
    let allowed = find(CLIENT, SERVER, EdgeState::Allowed);
    assert_eq!(tiers(allowed), [Decider::Admin]);
    assert_eq!(allowed.decisions.len(), 1);
    assert_eq!(allowed.decisions[0].port, "TCP 18080");
    assert_eq!(allowed.decisions[0].egress.by, ["allow-web"]);
    assert_eq!(
        tiers(find(CLIENT, DB, EdgeState::Violation)),
        [Decider::Default]
    );
    let cache = find(SERVER, "w:demo/Deployment/cache", EdgeState::Observed);
    assert_eq!(tiers(cache), [Decider::Baseline]);
    assert_eq!(cache.ports, ["TCP 6379"]);
    assert_eq!(cache.last_seen_ms, Some(NOW_MS - 30_000));
    let node = view
        .nodes
        .iter()
        .find(|n| n.id == "w:demo/Deployment/cache")
        .expect("node");
    assert_eq!((node.kind, node.name.as_str()), ("workload", "cache"));
    let outside = find(graph_view::EXTERNAL_GROUP, SERVER, EdgeState::Observed);
    assert!(outside.tiers.is_empty() && outside.decisions.is_empty());
    let block = find(graph_view::EXTERNAL_GROUP, SERVER, EdgeState::Learned);
    assert_eq!(
        tiers(block),
        [Decider::Baseline],
        "inside the learned address block"
    );
    let mut ids: Vec<&str> = view.edges.iter().map(|e| e.id.as_str()).collect();
    ids.sort();
    let all = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), all, "edge ids are unique: {:#?}", view.edges);
    let group = view
        .nodes
        .iter()
        .find(|n| n.id == graph_view::EXTERNAL_GROUP)
        .unwrap();
    assert!(
        group.members.contains(&"203.0.113.9".to_string()),
        "{group:?}"
    );
    assert!(
        !view.edges.iter().any(|e| e.to.contains("old")),
        "outside the window"
    );
    assert_eq!(view.counts["observed"], 2);
    // A flow to a pod of another namespace goes on the rule whose selector of that namespace picks
    // its workload's labels (the proposals' DNS rule), on its port only.
    let coredns = WorkloadRef {
        namespace: "kube-system".into(),
        owner_kind: "Deployment".into(),
        owner_name: "coredns".into(),
        selector: "k8s-app=kube-dns".into(),
        ..WorkloadRef::default()
    };
    let to_dns = |protocol, port| HistoryEdge {
        last_seen_ms: NOW_MS,
        egress: side(Decider::Default, true, ""),
        ingress: side(Decider::Default, true, ""),
        ..HistoryEdge::flow(workload("http-client"), coredns.clone(), protocol, port)
    };
    let learning = graph_view::build(
        &super::tests::snapshot(vec![]),
        &query,
        &[
            to_dns(network_enforcer_api::Protocol::UDP, 53),
            to_dns(network_enforcer_api::Protocol::TCP, 53),
        ],
    );
    let states: Vec<(&str, EdgeState, Vec<String>, usize)> = learning
        .edges
        .iter()
        .filter(|e| e.from == CLIENT && e.to.contains("kube"))
        .map(|e| (e.to.as_str(), e.state, e.ports.clone(), e.decisions.len()))
        .collect();
    assert_eq!(
        states,
        [
            (
                "s:kube-system/{k8s-app=kube-dns}",
                EdgeState::Learned,
                vec!["UDP 53".to_string()],
                1
            ),
            (
                "w:kube-system/Deployment/coredns",
                EdgeState::Observed,
                vec!["TCP 53".to_string()],
                1
            ),
        ]
    );
    // Past the bound of decisions an edge still names every tier, also once external peers are
    // grouped into one node.
    let many: Vec<HistoryEdge> = (0..40u16)
        .map(|i| HistoryEdge {
            last_seen_ms: NOW_MS,
            egress: side(Decider::Default, true, ""),
            ingress: side(
                // The last of its address's 20 flows: past that edge's own bound before grouping.
                if i == 39 {
                    Decider::Admin
                } else {
                    Decider::Default
                },
                true,
                "",
            ),
            ..HistoryEdge::flow(
                WorkloadRef {
                    address: format!("203.0.113.{}", 20 + i % 2),
                    ..WorkloadRef::default()
                },
                workload("http-server"),
                network_enforcer_api::Protocol::TCP,
                9000 + i,
            )
        })
        .collect();
    let bounded = graph_view::build(&super::tests::snapshot(vec![]), &query, &many);
    let scan = bounded
        .edges
        .iter()
        .find(|e| e.state == EdgeState::Observed)
        .expect("the scan's edge");
    assert_eq!(scan.from, graph_view::EXTERNAL_GROUP);
    assert_eq!(scan.ports.len(), 40);
    assert_eq!(scan.decisions.len(), graph_view::MAX_DECISIONS);
    assert_eq!(tiers(scan), [Decider::Admin, Decider::Default]);
    // The answer says it in the JSON the page reads.
    let json = serde_json::to_value(allowed).unwrap();
    assert_eq!(json["tiers"], serde_json::json!(["admin"]));
    assert_eq!(json["decisions"][0]["ingress"]["tier"], "networkPolicy");
}

/// Which rule edge may stand for an observed flow: its port labels and its peer node.
#[test]
fn an_observed_flow_goes_on_a_rule_only_where_the_rule_may_cover_it() {
    use crate::monitor::edge_history::HistoryEdge;
    use network_enforcer_api::Protocol;
    let flow = |protocol, port| {
        HistoryEdge::flow(
            WorkloadRef::default(),
            WorkloadRef::default(),
            protocol,
            port,
        )
    };
    for (label, protocol, port, covered) in [
        ("TCP 18080", Protocol::TCP, 18080, true),
        ("TCP 18080", Protocol::TCP, 18081, false),
        ("TCP 18080", Protocol::UDP, 18080, false),
        ("TCP 8000-8080", Protocol::TCP, 8080, true),
        ("TCP 8000-8080", Protocol::TCP, 8081, false),
        ("UDP any", Protocol::UDP, 53, true),
        ("UDP any", Protocol::TCP, 53, false),
        ("any port", Protocol::SCTP, 9, true),
        ("TCP http", Protocol::TCP, 80, false),
    ] {
        assert_eq!(
            graph_view::covers(label, &flow(protocol, port)),
            covered,
            "{label} {protocol:?} {port}"
        );
    }
    let pod = |namespace: &str, selector: &str| WorkloadRef {
        namespace: namespace.into(),
        owner_kind: "Deployment".into(),
        owner_name: "db".into(),
        selector: selector.into(),
        ..WorkloadRef::default()
    };
    let outside = |address: &str, name: &str| WorkloadRef {
        address: address.into(),
        dns_name: name.into(),
        ..WorkloadRef::default()
    };
    for (node, end, stands) in [
        ("s:shop/{app=db}", pod("shop", "app=db,tier=data"), true),
        (
            "s:shop/{app=db, tier=data}",
            pod("shop", "app=db,tier=data"),
            true,
        ),
        (
            "s:shop/{app=db, tier=cache}",
            pod("shop", "app=db,tier=data"),
            false,
        ),
        ("s:shop/{app=db}", pod("shop-eu", "app=db"), false),
        ("s:shop/{app=db}", pod("shop", ""), false),
        ("s:shop/all", pod("shop", ""), true),
        ("s:/namespaces all / {app=db}", pod("bank", "app=db"), true),
        (
            "s:/namespaces {team=a} / {app=db}",
            pod("bank", "app=db"),
            false,
        ),
        ("s:shop/{app=db}", outside("10.0.0.1", ""), false),
        ("x:any", pod("shop", ""), true),
        ("x:198.51.100.0/24", outside("198.51.100.5", ""), true),
        ("x:198.51.100.0/24", outside("198.51.101.5", ""), false),
        (
            "x:198.51.100.0/24 except 198.51.100.0/28",
            outside("198.51.100.5", ""),
            false,
        ),
        (
            "x:198.51.100.0/24 except 198.51.100.0/28",
            outside("198.51.100.50", ""),
            true,
        ),
        ("x:2001:db8::/32", outside("2001:db8::7", ""), true),
        ("x:203.0.113.7", outside("203.0.113.7", ""), true),
        (
            "n:*.example.test",
            outside("192.0.2.1", "api.example.test"),
            true,
        ),
        (
            "n:*.example.test",
            outside("192.0.2.1", "example.test"),
            false,
        ),
        (
            "n:api.example.test",
            outside("192.0.2.1", "api.example.test"),
            false,
        ),
        (
            "i:cluster.local/ns/shop/sa/db",
            pod("shop", "app=db"),
            false,
        ),
    ] {
        assert_eq!(
            graph_view::may_stand_for(node, &end),
            stands,
            "{node} for {end:?}"
        );
    }
}

#[test]
fn graph_groups_external_peers_and_names_what_allows_an_edge() {
    let snapshot = snapshot(vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")]);
    let grouped = graph_view::build(
        &snapshot,
        &GraphQuery {
            namespace: "demo".into(),
            ..GraphQuery::default()
        },
        &[],
    );
    let group = grouped
        .nodes
        .iter()
        .find(|n| n.id == graph_view::EXTERNAL_GROUP)
        .expect("one group node");
    assert_eq!(group.members, ["198.51.100.0/24", "203.0.113.7/32"]);
    assert_eq!(group.name, "external (2)");
    assert!(!grouped.nodes.iter().any(|n| n.id.starts_with("x:2")));
    let allowed = grouped
        .edges
        .iter()
        .find(|e| e.state == EdgeState::Allowed)
        .unwrap();
    assert_eq!(
        allowed.allowed_by,
        ["deployment-http-client-egress (monitor)"]
    );
    let violation = grouped
        .edges
        .iter()
        .find(|e| e.state == EdgeState::Violation)
        .unwrap();
    assert_eq!(violation.violations.len(), 1);
    assert_eq!(violation.violations[0].id, 7);
    assert_eq!(grouped.counts["violation"], 1);
    let mut ids: Vec<&str> = grouped.edges.iter().map(|e| e.id.as_str()).collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(
        ids.len(),
        before,
        "edge ids are unique: {:#?}",
        grouped.edges
    );
    let ungrouped = graph_view::build(
        &snapshot,
        &GraphQuery {
            namespace: "demo".into(),
            ungroup_external: true,
            ..GraphQuery::default()
        },
        &[],
    );
    let external: Vec<&str> = ungrouped
        .nodes
        .iter()
        .filter(|n| n.kind == "external")
        .map(|n| n.id.as_str())
        .collect();
    assert_eq!(external, ["x:198.51.100.0/24", "x:203.0.113.7/32"]);
}

#[test]
fn workload_page_has_rules_usage_violations_and_commands() {
    let snapshot = snapshot(vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")]);
    let view = workload_view::build(&snapshot, "demo", "http-client", None).expect("the client");
    assert_eq!(view.kinds, ["Deployment"]);
    let proposal = &view.proposals[0];
    assert_eq!(proposal.name, "deployment-http-client-egress");
    assert_eq!(
        proposal.promote_commands,
        [
            "kubectl label wnpp -n demo deployment-http-client-egress networkenforcer.kubewarden.io/promote=monitor --overwrite",
            "kubectl label wnpp -n demo deployment-http-client-egress networkenforcer.kubewarden.io/promote=protect --overwrite",
        ]
    );
    assert_eq!(
        proposal.policy.as_deref(),
        Some("deployment-http-client-egress")
    );
    assert_eq!(proposal.rules[0].peers, ["pods {app=http-server}"]);
    assert_eq!(
        proposal.rules[1].peers,
        ["namespaces {kubernetes.io/metadata.name=kube-system} / pods {k8s-app=kube-dns}"]
    );
    assert_eq!(proposal.rules[1].ports, ["UDP 53"]);
    let policy = &view.policies[0];
    assert_eq!(policy.mode, "monitor");
    assert_eq!(
        policy.rules[0].usage.as_ref().and_then(|u| u.get("peers")),
        Some(&serde_json::json!(1)),
        "rule 0's usage entry"
    );
    assert_eq!(policy.violations[0].dest, "demo/Deployment db");
    assert_eq!(policy.violations[0].port, "TCP 5432");
    assert_eq!(
        policy.violations[0].acknowledge_command.as_deref(),
        Some(
            "kubectl annotate wnp -n demo deployment-http-client-egress networkenforcer.kubewarden.io/acknowledge-7='reason'"
        )
    );
    assert_eq!(
        policy.acknowledged_violations[0].reason.as_deref(),
        Some("ntp is fine")
    );
    assert_eq!(policy.conditions[0].type_, "Ready");
    assert_eq!(
        policy.protect_command.as_deref(),
        Some(
            r#"kubectl patch wnp -n demo deployment-http-client-egress --type merge -p '{"spec":{"mode":"protect"}}'"#
        )
    );
    // Kind filter, unknown workloads.
    assert!(workload_view::build(&snapshot, "demo", "http-client", Some("StatefulSet")).is_none());
    assert!(workload_view::build(&snapshot, "demo", "nobody", None).is_none());
    assert!(workload_view::build(&snapshot, "other", "http-client", None).is_none());
    // Without rule usage in the status, rules have none.
    let mut plain = policy_without_usage();
    plain.rule_usage = None;
    let view =
        workload_view::build(&self::snapshot(vec![plain]), "demo", "http-client", None).unwrap();
    assert!(view.policies[0].rules.iter().all(|r| r.usage.is_none()));
}

/// A `spec.egressNames` entry's usage (`list: egressNames`) goes to that entry, never to the
/// direction's rule of the same index.
#[test]
fn name_entries_carry_their_own_usage() {
    let mut value =
        serde_json::to_value(&policy("monitor", "monitor", "2026-01-01T00:09:00Z").policy).unwrap();
    value["spec"]["egressNames"] = serde_json::json!([
        {"names": ["api.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]},
        {"names": ["*.cdn.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]}
    ]);
    value["status"]["ruleUsage"] = serde_json::json!([
        {"direction": "Egress", "rule": 0, "fingerprint": "ab12", "peers": 1,
         "lastMatched": "2026-01-01T00:09:00Z", "since": "2026-01-01T00:00:00Z"},
        {"direction": "Egress", "list": "egressNames", "rule": 0, "fingerprint": "cd34", "peers": 7,
         "lastMatched": "2026-01-01T00:08:00Z", "since": "2026-01-01T00:00:00Z"}
    ]);
    let policy = PolicyObject::from_json(value).unwrap();
    let view = workload_view::build(&snapshot(vec![policy]), "demo", "http-client", None).unwrap();
    let policy = &view.policies[0];
    let peers = |u: &Option<serde_json::Value>| u.as_ref().and_then(|u| u.get("peers")).cloned();
    assert_eq!(peers(&policy.rules[0].usage), Some(serde_json::json!(1)));
    assert_eq!(
        peers(&policy.egress_names[0].usage),
        Some(serde_json::json!(7))
    );
    assert_eq!(policy.egress_names[1].usage, None, "no entry: no usage");
}

/// [`policy`] with `spec.egressNames` and violations to outside addresses the client resolved from a
/// name it does not list (twice, two addresses) and to a literal.
fn policy_with_names() -> PolicyObject {
    let mut value =
        serde_json::to_value(&policy("monitor", "monitor", "2026-01-01T00:09:00Z").policy).unwrap();
    value["spec"]["egressNames"] = serde_json::json!([
        {"names": ["api.example.test", "*.storage.example.test"], "ports": [{"protocol": "TCP", "port": 443}]}
    ]);
    let violation = |id: i64, address: &str, name: &str| {
        let mut dest = serde_json::json!({"address": address});
        if !name.is_empty() {
            dest["dnsName"] = name.into();
        }
        serde_json::json!({"id": id, "timestamp": "2026-01-01T00:08:00Z",
            "source": {"namespace": "demo", "ownerKind": "Deployment", "ownerName": "http-client"},
            "dest": dest, "protocol": "TCP", "dstPort": 443, "action": "monitor", "direction": "Egress"})
    };
    let violations = value["status"]["violations"].as_array_mut().unwrap();
    violations.push(violation(8, "203.0.113.20", "other.example.test"));
    violations.push(violation(9, "203.0.113.21", "other.example.test"));
    violations.push(violation(10, "192.0.2.50", ""));
    PolicyObject::from_json(value).expect("policy with names")
}

/// Outside services reached by name are drawn and listed by the name, their addresses on hover
/// (`members`) and in the violation's text; the policy's `egressNames` are on the workload page.
#[test]
fn outside_services_are_shown_by_name() {
    let snapshot = snapshot(vec![policy_with_names()]);
    let view = graph_view::build(
        &snapshot,
        &GraphQuery {
            namespace: "demo".into(),
            ..GraphQuery::default()
        },
        &[],
    );
    let all = edges(&view);
    for expected in [
        edge(CLIENT, "n:api.example.test", EdgeState::Allowed, "TCP 443"),
        edge(
            CLIENT,
            "n:*.storage.example.test",
            EdgeState::Allowed,
            "TCP 443",
        ),
        edge(
            CLIENT,
            "n:other.example.test",
            EdgeState::Violation,
            "TCP 443",
        ),
        // The literal joins the other outside addresses in the group.
        edge(
            CLIENT,
            graph_view::EXTERNAL_GROUP,
            EdgeState::Violation,
            "TCP 443",
        ),
    ] {
        assert!(all.contains(&expected), "{expected:?} in {all:#?}");
    }
    let named = view
        .nodes
        .iter()
        .find(|n| n.id == "n:other.example.test")
        .expect("a node for the name");
    assert_eq!(
        (named.kind, named.name.as_str(), named.members.as_slice()),
        (
            "name",
            "other.example.test",
            &["203.0.113.20".to_string(), "203.0.113.21".to_string()][..]
        )
    );
    let group = view
        .nodes
        .iter()
        .find(|n| n.id == graph_view::EXTERNAL_GROUP)
        .unwrap();
    assert!(
        group.members.contains(&"192.0.2.50".to_string())
            && !group.members.iter().any(|m| m.starts_with("203.0.113.2")),
        "{:?}",
        group.members
    );

    let page = workload_view::build(&snapshot, "demo", "http-client", None).unwrap();
    let policy = &page.policies[0];
    assert_eq!(policy.egress_names.len(), 1);
    assert_eq!(
        (&policy.egress_names[0].names, &policy.egress_names[0].ports),
        (
            &vec![
                "api.example.test".to_string(),
                "*.storage.example.test".to_string()
            ],
            &vec!["TCP 443".to_string()]
        )
    );
    let dests: Vec<&str> = policy.violations.iter().map(|v| v.dest.as_str()).collect();
    assert!(
        dests.contains(&"other.example.test (203.0.113.20)") && dests.contains(&"192.0.2.50"),
        "{dests:?}"
    );
    let json = serde_json::to_value(policy).unwrap();
    assert_eq!(json["egressNames"][0]["names"][0], "api.example.test");
    // A payload without names has no entry.
    let plain = workload_view::build(
        &self::snapshot(vec![policy_without_usage()]),
        "demo",
        "http-client",
        None,
    )
    .unwrap();
    assert!(
        serde_json::to_value(&plain.policies[0])
            .unwrap()
            .get("egressNames")
            .is_none()
    );
}

/// The diff page: a name the proposal learned allows the policy's violations to addresses resolved
/// from that name (the name, not the rotating addresses, is the peer).
#[test]
fn proposal_diff_counts_violations_by_the_name_the_proposal_learned() {
    let mut snapshot = snapshot(vec![policy_with_names()]);
    let proposal = snapshot
        .proposals
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("deployment-http-client-egress"))
        .unwrap();
    proposal.spec.egress_names = serde_json::from_value(serde_json::json!([
        {"names": ["other.example.test"], "ports": [{"protocol": "TCP", "port": 443}]}
    ]))
    .unwrap();
    let diff = proposal_diff::build(&snapshot, "demo", "deployment-http-client-egress").unwrap();
    let row = diff
        .rows
        .iter()
        .find(|r| r.peer == "n:other.example.test")
        .expect("a row for the name");
    assert_eq!(
        (
            row.port.as_str(),
            row.learned,
            row.allowed_now,
            row.allowed_after,
            row.violations
        ),
        ("TCP 443", true, false, true, 2)
    );
    assert_eq!(diff.violations_allowed_after, 2, "{:#?}", diff.rows);
}

fn policy_without_usage() -> PolicyObject {
    policy("protect", "protect", "2026-01-01T00:09:00Z")
}

#[test]
fn shell_words_are_quoted_when_not_plain() {
    for (input, expected) in [
        ("demo", "demo"),
        ("a.b-c", "a.b-c"),
        ("", "''"),
        ("a b", "'a b'"),
        ("x'; rm -rf /", r"'x'\''; rm -rf /'"),
        ("$(id)", "'$(id)'"),
    ] {
        assert_eq!(workload_view::shell_quote(input), expected, "{input:?}");
    }
}

#[test]
fn proposal_diff_compares_promotion_with_policy_and_observations() {
    // The client's proposal learned the DNS rule that its policy lacks; the policy's violation
    // (TCP 5432 to the db) is not in the proposal.
    let snapshot = snapshot(vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")]);
    let diff = proposal_diff::build(&snapshot, "demo", "deployment-http-client-egress").unwrap();
    assert_eq!(
        diff.policy.as_deref(),
        Some("deployment-http-client-egress")
    );
    assert_eq!(diff.workload, "Deployment/http-client");
    let rows: Vec<(&str, &str, bool, bool, bool, usize)> = diff
        .rows
        .iter()
        .map(|r| {
            (
                r.peer.as_str(),
                r.port.as_str(),
                r.learned,
                r.allowed_now,
                r.allowed_after,
                r.violations,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "s:kube-system/{k8s-app=kube-dns}",
                "UDP 53",
                true,
                false,
                true,
                0
            ),
            (DB, "TCP 5432", false, false, false, 1),
            (SERVER, "TCP 18080", true, true, true, 0),
        ]
    );
    assert_eq!(
        (diff.added, diff.removed, diff.violations_allowed_after),
        (1, 0, 0)
    );
    // Without a policy everything learned is new; the server's proposal has two external peers.
    let diff = proposal_diff::build(
        &self::snapshot(vec![]),
        "demo",
        "deployment-http-server-ingress",
    )
    .unwrap();
    assert_eq!(diff.policy, None);
    assert_eq!(diff.added, 3, "{diff:?}");
    assert!(
        diff.rows
            .iter()
            .all(|r| r.learned && r.allowed_after && !r.allowed_now)
    );
    assert!(proposal_diff::build(&snapshot, "demo", "nope").is_none());
}

#[test]
fn proposal_diff_compares_with_the_policy_in_force_not_an_invalid_older_one() {
    let at = |p: &mut PolicyObject, created: &str| {
        p.policy.metadata.creation_timestamp =
            Some(serde_json::from_value(created.into()).unwrap());
    };
    let mut valid = policy("monitor", "monitor", "2026-01-01T00:09:00Z");
    valid.policy.metadata.uid = Some("valid".into());
    at(&mut valid, "2026-01-01T00:05:00Z");
    // Older, same target and direction, and invalid (an empty podSelector): it governs nothing.
    let mut invalid = valid.clone();
    invalid.policy.metadata.name = Some("older-invalid".into());
    invalid.policy.metadata.uid = Some("older-invalid".into());
    at(&mut invalid, "2026-01-01T00:00:00Z");
    invalid
        .policy
        .spec
        .kubernetes
        .as_mut()
        .unwrap()
        .pod_selector = Some(Default::default());
    let snapshot = snapshot(vec![invalid, valid]);
    let diff = proposal_diff::build(&snapshot, "demo", "deployment-http-client-egress").unwrap();
    assert_eq!(
        diff.policy.as_deref(),
        Some("deployment-http-client-egress")
    );
}

#[test]
fn rule_ports_cover_observed_ports() {
    for (rule, observed, covers) in [
        ("any port", "UDP 53", true),
        ("TCP any", "TCP 1", true),
        ("TCP any", "UDP 1", false),
        ("TCP 80", "TCP 80", true),
        ("TCP 80", "TCP 81", false),
        ("TCP 80-90", "TCP 90", true),
        ("TCP 80-90", "TCP 91", false),
        ("TCP http", "TCP 80", false),
        ("garbage", "TCP 80", false),
        ("TCP 80", "TCP x", false),
    ] {
        assert_eq!(
            proposal_diff::port_covers(rule, observed),
            covers,
            "{rule} / {observed}"
        );
    }
}

#[test]
fn graph_query_parameters_are_checked() {
    let q = server::graph_query(
        "demo",
        Some("workload=Deployment%2Fapi&window=300&ungroup=1"),
    )
    .unwrap();
    assert_eq!(q.workload.as_deref(), Some("Deployment/api"));
    assert_eq!(q.window_seconds, Some(300));
    assert!(q.ungroup_external);
    assert_eq!(
        server::graph_query("demo", Some("window=all"))
            .unwrap()
            .window_seconds,
        None
    );
    for bad in [
        "window=-1",
        "window=0",
        "window=abc",
        "window=99999999999",
        "workload=Bad%20Name",
    ] {
        let e = server::graph_query("demo", Some(bad)).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// `GET path` on `addr`: (status code, content type, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    get_for(addr, "x", path).await
}

/// [`get`] with `Host: host`.
async fn get_for(addr: std::net::SocketAddr, host: &str, path: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or_default()
        .to_string();
    (code, content_type, body.to_string())
}

/// A source that is not ready until told (the watches have not listed).
struct Gate(Snapshot, std::sync::atomic::AtomicBool);

impl super::ObjectSource for Gate {
    fn snapshot(&self, namespace: Option<&str>) -> Snapshot {
        super::ObjectSource::snapshot(&self.0, namespace)
    }
    fn ready(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[tokio::test]
async fn api_answers_json_errors_and_counts_requests() {
    let source = Arc::new(Gate(
        snapshot(vec![policy("monitor", "monitor", "2026-01-01T00:09:00Z")]),
        false.into(),
    ));
    let metrics = UiMetrics::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(
        listener,
        UiState::new(source.clone(), metrics.clone()),
    ));

    let (code, _, body) = get(addr, "/api/v1/namespaces").await;
    assert_eq!(code, 503, "not listed yet: {body}");
    assert!(body.contains("have not listed"), "{body}");
    source.1.store(true, std::sync::atomic::Ordering::Relaxed);

    // (path, status, text in the body)
    let cases = [
        (
            "/api/v1/namespaces",
            200,
            r#""name":"demo","proposals":2,"policies":1,"activeViolations":1"#,
        ),
        (
            "/api/v1/namespaces/demo/graph",
            200,
            r#""state":"violation""#,
        ),
        (
            "/api/v1/namespaces/demo/graph?window=60",
            200,
            r#""state":"allowed""#,
        ),
        (
            "/api/v1/namespaces/demo/graph?window=x",
            400,
            r#"{"error":{"code":400,"message":"window must be"#,
        ),
        (
            "/api/v1/namespaces/Demo!/graph",
            400,
            r#""message":"namespace must be a Kubernetes name"#,
        ),
        (
            "/api/v1/namespaces/demo/workloads/http-client",
            200,
            "promote=monitor --overwrite",
        ),
        (
            "/api/v1/namespaces/demo/workloads/http-client?kind=Deployment",
            200,
            "acknowledge-7",
        ),
        (
            "/api/v1/namespaces/demo/workloads/nobody",
            404,
            "no proposal or policy targets workload nobody",
        ),
        (
            "/api/v1/namespaces/demo/proposals/deployment-http-client-egress/diff",
            200,
            r#""added":1"#,
        ),
        (
            "/api/v1/namespaces/demo/proposals/nope/diff",
            404,
            "no proposal nope",
        ),
        (
            "/api/v1/nothing",
            404,
            r#"{"error":{"code":404,"message":"no such route"#,
        ),
    ];
    for (path, status, text) in cases {
        let (code, content_type, body) = get(addr, path).await;
        assert_eq!(code, status, "{path}: {body}");
        assert_eq!(content_type, "application/json", "{path}");
        assert!(body.contains(text), "{path}: {body}");
    }
    let (code, content_type, body) = get(addr, "/").await;
    assert_eq!(
        (code, content_type.as_str()),
        (200, "text/html; charset=utf-8")
    );
    assert!(body.contains("assets/app.js"), "{body}");
    assert!(body.contains("assets/dagre.js"), "{body}");
    let (code, _, js) = get(addr, "/assets/app.js").await;
    assert_eq!(code, 200);
    assert!(js.contains("api/v1/"));
    // The layout library the build embedded: its code, its licence notices, no source map to ask for.
    let (code, content_type, dagre) = get(addr, "/assets/dagre.js").await;
    assert_eq!(
        (code, content_type.as_str()),
        (200, "text/javascript; charset=utf-8")
    );
    assert!(dagre.contains("var dagre="), "the browser bundle");
    assert_eq!(
        dagre.matches("Permission is hereby granted").count(),
        2,
        "dagre's and graphlib's notices"
    );
    assert!(!dagre.contains("sourceMappingURL"));
    assert_eq!(metrics.count("graph", 200), 2);
    assert_eq!(metrics.count("graph", 400), 2);
    assert_eq!(metrics.count("workload", 404), 1);
    assert_eq!(metrics.count("namespaces", 503), 1);
    assert_eq!(metrics.count("not_found", 404), 1);
}

/// Edges from a fixed list, bounded as asked; `None`: a history not complete yet.
struct Edges(Option<Vec<crate::monitor::edge_history::HistoryEdge>>);

impl super::EdgeSource for Edges {
    fn edges_in(
        &self,
        namespace: &str,
        limit: usize,
    ) -> Option<(Vec<crate::monitor::edge_history::HistoryEdge>, bool)> {
        let mut edges: Vec<_> = self
            .0
            .as_ref()?
            .iter()
            .filter(|e| e.source.namespace == namespace)
            .cloned()
            .collect();
        let truncated = edges.len() > limit;
        edges.truncate(limit);
        Some((edges, truncated))
    }
}

/// A source whose watches have listed, holding nothing.
fn ready_source() -> Arc<Gate> {
    Arc::new(Gate(snapshot(Vec::new()), true.into()))
}

/// Serves `state` on a free local port; its address.
async fn serve(state: UiState) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(listener, state));
    addr
}

/// Served on loopback (the default, reached through kubectl port-forward), the view answers requests
/// addressed to a loopback name only: a page from elsewhere in the operator's browser cannot read it
/// through a name of its own pointed at 127.0.0.1 (DNS rebinding). Refusals are counted.
#[tokio::test]
async fn on_loopback_only_requests_for_localhost_are_answered() {
    for (host, loopback) in [
        ("localhost", true),
        ("localhost:8090", true),
        ("LOCALHOST:8090", true),
        ("127.0.0.1:43125", true),
        ("127.1.2.3", true),
        ("[::1]:8090", true),
        ("[::1]", true),
        ("attacker.example:8090", false),
        ("localhost.attacker.example", false),
        ("10.0.0.1:8090", false),
        ("[fd00::1]:8090", false),
        ("", false),
    ] {
        assert_eq!(server::is_loopback_host(host), loopback, "{host}");
    }
    let metrics = UiMetrics::default();
    let addr = serve(UiState::new(ready_source(), metrics.clone()).loopback_hosts_only()).await;
    for path in [
        "/",
        "/assets/app.js",
        "/assets/dagre.js",
        "/api/v1/namespaces",
    ] {
        assert_eq!(get_for(addr, "localhost:8090", path).await.0, 200, "{path}");
        assert_eq!(get_for(addr, "127.0.0.1:8090", path).await.0, 200, "{path}");
        let (code, _, body) = get_for(addr, "rebound.attacker.example:8090", path).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("localhost only"), "{body}");
    }
    let registry = crate::runtime::metrics::ControllerMetrics::new();
    metrics.register(&registry);
    let text = registry.encode();
    assert!(
        text.contains(r#"ui_requests_total{route="refused_host",status="403"} 4"#),
        "{text}"
    );
    // Not on loopback (a Service in front): any name.
    let addr = serve(UiState::new(ready_source(), UiMetrics::default())).await;
    assert_eq!(
        get_for(addr, "ui.example:8090", "/api/v1/namespaces")
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn the_edges_route_answers_the_history_or_404_without_one_or_503_before_it_is_complete() {
    let ready = ready_source;
    let without = serve(UiState::new(ready(), UiMetrics::default())).await;
    let (code, _, body) = get(without, "/api/v1/namespaces/demo/edges").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("keeps no history"), "{body}");

    let edge = crate::monitor::edge_history::HistoryEdge {
        source: WorkloadRef {
            namespace: "demo".into(),
            owner_kind: "Deployment".into(),
            owner_name: "web".into(),
            ..WorkloadRef::default()
        },
        destination: WorkloadRef {
            address: "192.0.2.7".into(),
            ..WorkloadRef::default()
        },
        protocol: network_enforcer_api::Protocol::TCP,
        port: 443,
        first_seen_ms: 1,
        last_seen_ms: 2,
        count: 3,
        egress: Some(SideDecision {
            tier: netpol::cluster::Decider::Admin,
            allowed: true,
            by: vec!["allow-partner".into()],
        }),
        ingress: Some(SideDecision {
            tier: netpol::cluster::Decider::Default,
            allowed: true,
            by: Vec::new(),
        }),
    };
    let metrics = UiMetrics::default();
    let with = serve(
        UiState::new(ready(), metrics.clone())
            .with_edges(Arc::new(Edges(Some(vec![edge.clone()])))),
    )
    .await;
    let (code, content_type, body) = get(with, "/api/v1/namespaces/demo/edges").await;
    assert_eq!(
        (code, content_type.as_str()),
        (200, "application/json"),
        "{body}"
    );
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["namespace"], "demo");
    assert_eq!(answer["truncated"], false);
    assert_eq!(
        answer["edges"][0]["egress"],
        serde_json::json!({"tier": "admin", "allowed": true, "by": ["allow-partner"]})
    );
    let edges: Vec<crate::monitor::edge_history::HistoryEdge> =
        serde_json::from_value(answer["edges"].clone()).unwrap();
    assert_eq!(edges, [edge]);
    // The graph draws the observed edge with the tier that decides it.
    let (code, _, body) = get(with, "/api/v1/namespaces/demo/graph").await;
    assert_eq!(code, 200, "{body}");
    let graph: serde_json::Value = serde_json::from_str(&body).unwrap();
    let observed = graph["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["state"] == "observed")
        .unwrap_or_else(|| panic!("an observed edge: {body}"));
    assert_eq!(observed["tiers"], serde_json::json!(["admin"]), "{body}");
    assert_eq!(observed["ports"], serde_json::json!(["TCP 443"]), "{body}");
    let (code, _, body) = get(with, "/api/v1/namespaces/other/edges").await;
    assert_eq!(code, 200);
    assert!(body.contains(r#""edges":[]"#), "{body}");
    let (code, _, _) = get(with, "/api/v1/namespaces/Bad!/edges").await;
    assert_eq!(code, 400);
    assert_eq!(metrics.count("edges", 200), 2);
    assert_eq!(metrics.count("graph", 200), 1);
    assert_eq!(metrics.count("edges", 400), 1);

    // Not listed yet (or a follower): no answer rather than an empty one, which `check
    // --from-cluster` would read as "no traffic, nothing would be blocked".
    let unlisted =
        serve(UiState::new(ready(), UiMetrics::default()).with_edges(Arc::new(Edges(None)))).await;
    let (code, _, body) = get(unlisted, "/api/v1/namespaces/demo/edges").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not complete"), "{body}");
}

/// The cluster overview: each workload with the state of each direction, its active violations and
/// its warnings; namespaces summed; the workloads that need attention first.
#[test]
fn the_overview_lists_workloads_by_state_and_what_needs_attention() {
    use crate::ui::overview::{self, State};
    let mut protect = policy("protect", "protect", "2026-01-01T00:09:00Z");
    protect.policy.metadata.name = Some("deployment-web-egress".into());
    protect.policy.metadata.namespace = Some("shop".into());
    protect.policy.spec.target_ref.name = "web".into();
    let status = protect.policy.status.get_or_insert_with(Default::default);
    status.active_violation_count = 0;
    status.conditions = serde_json::from_value(serde_json::json!([
        {"type": "WouldBlock", "status": "True", "reason": "WouldBlockObservedFlows", "message": "1 flow",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "UnusedRules", "status": "True", "reason": "RulesUnused", "message": "egress[0]",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]))
    .unwrap();
    let monitor = policy("monitor", "monitor", "2026-01-01T00:09:00Z");
    let view = overview::build(&snapshot(vec![monitor, protect]));
    type Row<'a> = (&'a str, &'a str, State, State, State, i64, bool, bool);
    let rows: Vec<Row> = view
        .workloads
        .iter()
        .map(|w| {
            (
                w.namespace.as_str(),
                w.name.as_str(),
                w.egress,
                w.ingress,
                w.state,
                w.active_violations,
                w.would_block,
                w.unused_rules,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            // Active violations first, then warnings, then the least enforced.
            (
                "demo",
                "http-client",
                State::Monitor,
                State::None,
                State::Monitor,
                1,
                false,
                false
            ),
            (
                "shop",
                "web",
                State::Protect,
                State::None,
                State::Protect,
                0,
                true,
                true
            ),
            (
                "demo",
                "http-server",
                State::None,
                State::Learning,
                State::Learning,
                0,
                false,
                false
            ),
        ]
    );
    let demo = &view.namespaces[0];
    assert_eq!(
        (
            demo.namespace.as_str(),
            demo.workloads,
            demo.learning,
            demo.monitor,
            demo.protect
        ),
        ("demo", 2, 1, 1, 0)
    );
    assert_eq!(demo.active_violations, 1);
    let shop = &view.namespaces[1];
    assert_eq!(
        (shop.protect, shop.would_block, shop.unused_rules),
        (1, 1, 1)
    );
    assert!(!view.truncated);
    // The JSON the page reads.
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(json["workloads"][0]["activeViolations"], 1);
    assert_eq!(json["workloads"][2]["ingress"], "learning");
}

/// An explainer that answers from a fixed verdict, or refuses as the real one does for a workload
/// without pods.
struct FixedExplainer;

impl crate::ui::Explainer for FixedExplainer {
    fn explain<'a>(
        &'a self,
        request: &'a crate::ui::explain_view::ExplainRequest,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<crate::ui::explain_view::Explanation, server::ApiError>,
                > + Send
                + 'a,
        >,
    > {
        Box::pin(async move {
            if request.to.owner_name == "gone" {
                return Err(server::ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "Deployment demo/gone has no pod now",
                ));
            }
            Ok(crate::ui::explain_view::Explanation {
                allowed: request.port == 5432,
                egress: "not isolated".into(),
                ingress: format!("port {}", request.port),
                scenario: serde_json::json!({"flows": [{"port": request.port}]}),
            })
        })
    }
}

#[tokio::test]
async fn the_explain_route_answers_the_verdicts_or_the_scenario_and_refuses_clearly() {
    let ready = ready_source;
    let path = |to: &str, port: u16, extra: &str| {
        format!(
            "/api/v1/namespaces/demo/explain?from=w%3Ademo%2FDeployment%2Fweb&to={to}&port={port}{extra}"
        )
    };
    let without = serve(UiState::new(ready(), UiMetrics::default())).await;
    let (code, _, body) = get(without, &path("w:demo/StatefulSet/db", 5432, "")).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("does not explain flows"), "{body}");

    let metrics = UiMetrics::default();
    let with =
        serve(UiState::new(ready(), metrics.clone()).with_explainer(Arc::new(FixedExplainer)))
            .await;
    let (code, _, body) = get(with, &path("w%3Ademo%2FStatefulSet%2Fdb", 5432, "")).await;
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["allowed"], true);
    assert_eq!(answer["from"], "w:demo/Deployment/web");
    assert_eq!(answer["to"], "w:demo/StatefulSet/db");
    assert_eq!(answer["ingress"], "port 5432");
    assert!(
        answer["command"]
            .as_str()
            .unwrap()
            .contains("check --scenario scenario.json --explain"),
        "{answer}"
    );
    let (code, _, body) = get(
        with,
        &path("w%3Ademo%2FStatefulSet%2Fdb", 6379, "&format=scenario"),
    )
    .await;
    assert_eq!((code, body.as_str()), (200, r#"{"flows":[{"port":6379}]}"#));
    let (code, _, body) = get(with, &path("w%3Ademo%2FDeployment%2Fgone", 80, "")).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("has no pod now"), "{body}");
    let (code, _, body) = get(with, &path("s%3Ademo%2Fapp%3Ddb", 80, "")).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(metrics.count("explain", 200), 2);
    assert_eq!(metrics.count("explain", 404), 1);
    assert_eq!(metrics.count("explain", 400), 1);
}
