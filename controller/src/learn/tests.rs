use super::merge::collapse;
use super::*;
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::json;

const T: i64 = 1_000_000;

fn pod(ns: &str, name: &str, ip: &str, app: &str, owner_rs: Option<(&str, &str)>, sa: &str) -> Pod {
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

/// The end-to-end scenario's cluster (docs/development.md): client and server Deployments in
/// `shop`, a Service, and kube-dns.
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

/// A connection of pod `shop/local` of [`index`].
fn obs(
    local: &str,
    peer: &str,
    port: u16,
    protocol: Protocol,
    opened: Opened,
) -> ReportedConnection {
    obs_in(&index(), local, peer, port, protocol, opened)
}

/// A connection of pod `shop/local`, as ingest found it in `ix`.
fn obs_in(
    ix: &Index,
    local: &str,
    peer: &str,
    port: u16,
    protocol: Protocol,
    opened: Opened,
) -> ReportedConnection {
    ReportedConnection {
        local: ix.pod("shop", local).expect("indexed").clone(),
        peer: peer.parse().unwrap(),
        port,
        protocol,
        opened,
        at_ms: T + 1,
        reporter: Reporter::Node,
        peer_name: Default::default(),
    }
}

/// Learns `observations` into proposals, as the writer would, and returns them by name.
fn learn(
    observations: &[ReportedConnection],
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

fn scenario() -> Vec<ReportedConnection> {
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
fn the_scenario_teaches_the_kubernetes_proposals() {
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
    let ingress = serde_json::to_value(&learned["deployment-http-server-ingress"].spec).unwrap();
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
fn services_without_backends_are_reported() {
    let ix = index();
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
        Err(NoFlow::ServiceWithoutBackends(..))
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
    ix.apply_pod(&newcomer, T + 10 + crate::cluster::index::IP_HISTORY_MS + 1);
    assert_eq!(
        ix.pod_at("10.0.0.2".parse().unwrap(), T + 5).unwrap().name,
        "other-1"
    );
}
fn flow_to(ix: &Index, local: &str, peer: &str, port: u16) -> WorkloadFlow {
    flows(
        ix,
        &obs_in(ix, local, peer, port, Protocol::TCP, Opened::Outbound),
    )
    .unwrap()
    .remove(0)
}

#[test]
fn merging_many_edges_at_once_equals_merging_them_one_by_one() {
    let ix = index();
    let client = FlowEnd::Workload(
        ix.pod("shop", "http-client-aaa-1")
            .unwrap()
            .endpoint
            .clone(),
    );
    let target = Target {
        workload: match &client {
            FlowEnd::Workload(w) => w.clone(),
            _ => unreachable!(),
        },
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let server = flow_to(&ix, "http-client-aaa-1", "10.0.0.2", 18080).destination;
    let mut all = Vec::new();
    for i in 0..300u32 {
        let peer = match i % 3 {
            0 => server.clone(),
            1 => FlowEnd::External(IpAddr::from([198, 51, (i / 256) as u8, i as u8])),
            _ => FlowEnd::External(IpAddr::from([198, 51, 0, (i % 7) as u8])),
        };
        all.push(Edge::Kubernetes {
            peer,
            protocol: if i % 2 == 0 {
                Protocol::TCP
            } else {
                Protocol::UDP
            },
            port: 1000 + (i % 5) as u16,
        });
    }
    let mut one_by_one = new_proposal(&target, Backend::Kubernetes).spec;
    for e in &all {
        apply(&mut one_by_one, e);
    }
    let mut at_once = new_proposal(&target, Backend::Kubernetes).spec;
    let merged = merge(&mut at_once, &all, &Limits::NONE);
    assert!(merged.changed && merged.capped.is_empty());
    assert_eq!(at_once, one_by_one);
    // And again: nothing changes.
    assert!(!merge(&mut at_once, &all, &Limits::NONE).changed);
}

fn external_cap(n: usize) -> Limits {
    Limits {
        max_external_peers: n,
        ..Limits::NONE
    }
}

fn np_port(protocol: &str, port: IntOrString, end_port: Option<i32>) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(port),
        end_port,
    }
}

#[test]
fn collapse_merges_overlapping_and_adjacent_ports_per_protocol() {
    let int = IntOrString::Int;
    let mut ports = vec![
        np_port("TCP", int(90), None),
        np_port("TCP", int(81), None),
        np_port("UDP", int(80), None),
        np_port("TCP", int(80), None),
        np_port("TCP", IntOrString::String("http".into()), None),
        np_port("TCP", int(83), Some(85)),
        np_port("TCP", int(82), None),
        np_port("TCP", int(84), None),
    ];
    collapse(&mut ports);
    assert_eq!(
        ports,
        [
            np_port("TCP", IntOrString::String("http".into()), None),
            np_port("TCP", int(80), Some(85)),
            np_port("TCP", int(90), None),
            np_port("UDP", int(80), None),
        ]
    );
}

fn rule_ports(spec: &WorkloadNetworkPolicyProposalSpec) -> Vec<Vec<NetworkPolicyPort>> {
    spec.kubernetes
        .as_ref()
        .and_then(|np| np.egress.as_ref())
        .map(|rules| {
            rules
                .iter()
                .map(|r| r.ports.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_port_scan_collapses_into_ranges_and_what_still_does_not_fit_is_capped() {
    let ix = index();
    let target = Target {
        workload: ix
            .pod("shop", "http-client-aaa-1")
            .unwrap()
            .endpoint
            .clone(),
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let to = |port: u16| Edge::Kubernetes {
        peer: FlowEnd::External(IpAddr::from([203, 0, 113, 7])),
        protocol: Protocol::UDP,
        port,
    };
    let limits = Limits {
        max_ports_per_rule: 4,
        ..Limits::NONE
    };
    let mut spec = new_proposal(&target, Backend::Kubernetes).spec;
    // Every port from 1 to 1000, as a scanner sends them: one range.
    let scan: Vec<Edge> = (1..=1000).map(to).collect();
    let merged = merge(&mut spec, &scan, &limits);
    assert!(merged.changed);
    assert_eq!(merged.ports_capped, 0);
    let int = IntOrString::Int;
    assert_eq!(
        rule_ports(&spec),
        [vec![np_port("UDP", int(1), Some(1000))]]
    );
    // A port within the range is already allowed.
    assert!(!merge(&mut spec, &[to(500)], &limits).changed);
    // Scattered ports fill the rule up to its cap; the rest is refused and counted.
    let scattered: Vec<Edge> = [2000, 2002, 2004, 2006, 2008].map(to).to_vec();
    let merged = merge(&mut spec, &scattered, &limits);
    assert_eq!(merged.ports_capped, 2);
    assert_eq!(
        rule_ports(&spec),
        [vec![
            np_port("UDP", int(1), Some(1000)),
            np_port("UDP", int(2000), None),
            np_port("UDP", int(2002), None),
            np_port("UDP", int(2004), None),
        ]]
    );
    // A port joining a run still fits: 2001 joins 2000 and 2002 into one range.
    let merged = merge(&mut spec, &[to(2001)], &limits);
    assert!(merged.changed && merged.ports_capped == 0);
    assert_eq!(rule_ports(&spec)[0].len(), 3);
    // Below the cap ports stay single, as the reference writes them.
    let mut small = new_proposal(&target, Backend::Kubernetes).spec;
    merge(&mut small, &[to(1), to(2)], &Limits::default());
    assert_eq!(
        rule_ports(&small),
        [vec![
            np_port("UDP", int(1), None),
            np_port("UDP", int(2), None)
        ]]
    );
}

#[test]
fn a_write_keeps_the_proposal_within_its_byte_budget() {
    let ix = index();
    let target = Target {
        workload: ix
            .pod("shop", "http-client-aaa-1")
            .unwrap()
            .endpoint
            .clone(),
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let peers: Vec<Edge> = (0..200u16)
        .map(|i| Edge::Kubernetes {
            peer: FlowEnd::External(IpAddr::from([203, 0, (i / 250) as u8, (i % 250) as u8])),
            protocol: Protocol::TCP,
            port: 1000 + i,
        })
        .collect();
    let budget = 4096;
    let mut proposal = new_proposal(&target, Backend::Kubernetes);
    let (merged, left_out) = merge_within(&mut proposal, &peers, &Limits::NONE, budget);
    let size = serde_json::to_vec(&proposal).unwrap().len();
    assert!(merged.changed && left_out > 0);
    assert!(size <= budget, "{size} bytes");
    assert_eq!(peer_count(&proposal.spec) + left_out, peers.len());
    // The next edge would not have fitted: the longest prefix was kept.
    let kept = peers.len() - left_out;
    let mut one_more = new_proposal(&target, Backend::Kubernetes);
    merge(&mut one_more.spec, &peers[..=kept], &Limits::NONE);
    assert!(serde_json::to_vec(&one_more).unwrap().len() > budget);
    // Within the budget nothing is left out.
    let mut small = new_proposal(&target, Backend::Kubernetes);
    assert_eq!(
        merge_within(&mut small, &peers[..3], &Limits::NONE, budget).1,
        0
    );
    assert_eq!(peer_count(&small.spec), 3);
}

#[test]
fn a_proposal_stops_at_its_rule_cap() {
    let ix = index();
    let target = Target {
        workload: ix
            .pod("shop", "http-client-aaa-1")
            .unwrap()
            .endpoint
            .clone(),
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let limits = Limits {
        max_rules: 3,
        ..Limits::NONE
    };
    let peers: Vec<Edge> = (0..5)
        .map(|i| Edge::Kubernetes {
            peer: FlowEnd::External(IpAddr::from([203, 0, 113, i])),
            protocol: Protocol::TCP,
            port: 443,
        })
        .collect();
    let mut spec = new_proposal(&target, Backend::Kubernetes).spec;
    let merged = merge(&mut spec, &peers, &limits);
    assert_eq!((peer_count(&spec), merged.rules_capped), (3, 2));
    // Known peers still gain ports.
    let merged = merge(
        &mut spec,
        &[Edge::Kubernetes {
            peer: FlowEnd::External(IpAddr::from([203, 0, 113, 0])),
            protocol: Protocol::TCP,
            port: 8443,
        }],
        &limits,
    );
    assert!(merged.changed && merged.rules_capped == 0);
}

#[test]
fn external_fan_out_is_capped_per_port_and_counted() {
    let ix = index();
    let client = ix
        .pod("shop", "http-client-aaa-1")
        .unwrap()
        .endpoint
        .clone();
    let target = Target {
        workload: client,
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let external = |i: u8, port: u16| Edge::Kubernetes {
        peer: FlowEnd::External(IpAddr::from([203, 0, 113, i])),
        protocol: Protocol::TCP,
        port,
    };
    let mut spec = new_proposal(&target, Backend::Kubernetes).spec;
    let first: Vec<Edge> = (0..5).map(|i| external(i, 443)).collect();
    assert!(merge(&mut spec, &first, &external_cap(3)).changed);
    assert_eq!(peer_count(&spec), 3);
    // The cap counts what the spec already holds: later flushes add nothing more on 443...
    let later: Vec<Edge> = (10..12)
        .map(|i| external(i, 443))
        .chain([external(0, 80), external(50, 80)])
        .collect();
    let merged = merge(&mut spec, &later, &external_cap(3));
    assert_eq!(
        merged.capped,
        BTreeMap::from([((Protocol::TCP, 443), 2)]),
        "two more on 443 refused"
    );
    // ...while another port has its own budget (0 joins its existing rule, 50 gets a rule).
    assert!(merged.changed);
    assert_eq!(peer_count(&spec), 4);
    // In-cluster peers are never capped.
    let server = flow_to(&ix, "http-client-aaa-1", "10.0.0.2", 18080).destination;
    let merged = merge(
        &mut spec,
        &[Edge::Kubernetes {
            peer: server,
            protocol: Protocol::TCP,
            port: 443,
        }],
        &external_cap(3),
    );
    assert!(merged.changed && merged.capped.is_empty());
}

#[test]
fn bare_pods_and_jobs_get_proposals_of_their_kind() {
    let mut ix = index();
    let mut bare = pod("shop", "debug", "10.0.0.9", "debug", None, "default");
    bare.metadata.labels = Some(BTreeMap::from([("run".into(), "debug".into())]));
    ix.apply_pod(&bare, T);
    let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(json!({
        "metadata": {"name": "report-29000", "namespace": "shop", "uid": "uid-job",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "report",
                                          "uid": "uid-cron", "controller": true}]},
        "spec": {"template": {"metadata": {"labels": {"app": "report", "job-name": "report-29000"}},
                              "spec": {"containers": []}}}
    }))
    .unwrap();
    ix.apply_job(&job);
    let mut run = pod(
        "shop",
        "report-29000-q",
        "10.0.0.10",
        "report",
        None,
        "default",
    );
    run.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: "report-29000".into(),
        uid: "uid-job".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    ix.apply_pod(&run, T);
    let mut learned: BTreeMap<String, WorkloadNetworkPolicyProposal> = BTreeMap::new();
    for o in [
        obs_in(
            &ix,
            "debug",
            "10.96.0.20",
            18080,
            Protocol::TCP,
            Opened::Outbound,
        ),
        obs_in(
            &ix,
            "report-29000-q",
            "10.0.0.9",
            8080,
            Protocol::TCP,
            Opened::Outbound,
        ),
    ] {
        for flow in flows(&ix, &o).unwrap() {
            for (target, edge) in edges(&flow, Backend::Kubernetes) {
                let p = learned
                    .entry(target.name())
                    .or_insert_with(|| new_proposal(&target, Backend::Kubernetes));
                apply(&mut p.spec, &edge);
            }
        }
    }
    let names: Vec<&str> = learned.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "cronjob-report-egress",
            "deployment-http-server-ingress",
            "pod-debug-egress",
            "pod-debug-ingress"
        ]
    );
    let debug = &learned["pod-debug-egress"];
    assert_eq!(debug.spec.target_ref.kind, WorkloadKind::Pod);
    let owner = &debug.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Pod", "uid-debug")
    );
    assert_eq!(
        serde_json::to_value(&debug.spec.kubernetes.as_ref().unwrap().pod_selector).unwrap(),
        json!({"matchLabels": {"run": "debug"}})
    );
    let cron = &learned["cronjob-report-egress"];
    let owner = &cron.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        ("batch/v1", "CronJob", "report", "uid-cron")
    );
    assert_eq!(
        serde_json::to_value(&cron.spec.kubernetes.as_ref().unwrap().pod_selector).unwrap(),
        json!({"matchLabels": {"app": "report"}})
    );
    // The server's ingress names the bare pod by its labels.
    assert_eq!(
        serde_json::to_value(
            &learned["deployment-http-server-ingress"]
                .spec
                .kubernetes
                .as_ref()
                .unwrap()
                .ingress
        )
        .unwrap(),
        json!([{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}},
                          "podSelector": {"matchLabels": {"run": "debug"}}}],
                "ports": [{"protocol": "TCP", "port": 18080}]}])
    );
}

#[test]
fn unselectable_workloads_get_no_proposal_and_are_no_peer() {
    let mut ix = index();
    let mut naked = pod("shop", "naked", "10.0.0.9", "x", None, "default");
    naked.metadata.labels = Some(BTreeMap::new());
    ix.apply_pod(&naked, T);
    for o in [
        obs_in(
            &ix,
            "naked",
            "10.96.0.20",
            18080,
            Protocol::TCP,
            Opened::Outbound,
        ),
        obs_in(
            &ix,
            "http-client-aaa-1",
            "10.0.0.9",
            80,
            Protocol::TCP,
            Opened::Outbound,
        ),
    ] {
        let f = flows(&ix, &o).unwrap();
        assert!(has_unselectable_side(&f[0]));
        assert_eq!(edges(&f[0], Backend::Kubernetes), vec![], "{o:?}");
    }
}

/// [`index`] with a node `n1` (192.168.1.1), a host-network DaemonSet `probe` on it (port 9100,
/// behind Service `probe` 10.96.0.30), and a host-network pod whose IPs the kubelet has not
/// reported yet.
fn index_with_host_network() -> Index {
    let mut ix = index();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.1"}]}
    }))
    .unwrap();
    ix.apply_node(&node);
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "probe", "namespace": "shop", "uid": "uid-ds-probe"},
        "spec": {"selector": {"matchLabels": {"app": "probe"}}, "template": {}}
    }))
    .unwrap();
    ix.apply_daemonset(&ds);
    for (name, ip) in [("probe-x", Some("192.168.1.1")), ("probe-early", None)] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                         "labels": {"app": "probe"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                              "name": "probe", "uid": "uid-ds-probe", "controller": true}]},
            "spec": {"hostNetwork": true, "nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap();
        ix.apply_pod(&p, T);
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "probe", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.30", "selector": {"app": "probe"}, "ports": [{"port": 9100}]}
    }))
    .unwrap();
    ix.apply_service(&svc);
    ix
}

/// A proposal's rules as `<peer> <protocol>/<port>,...` (peer: a CIDR, or a pod selector's labels).
fn rules(p: &WorkloadNetworkPolicyProposal) -> Vec<String> {
    let np = serde_json::to_value(p.spec.kubernetes.as_ref().unwrap()).unwrap();
    let (rules, peers) = match p.spec.direction {
        Direction::Egress => (&np["egress"], "to"),
        Direction::Ingress => (&np["ingress"], "from"),
    };
    rules
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| {
            let peer = &rule[peers][0];
            let peer = match peer["ipBlock"]["cidr"].as_str() {
                Some(cidr) => cidr.to_string(),
                None => peer["podSelector"]["matchLabels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(","),
            };
            let ports: Vec<String> = rule["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["protocol"].as_str().unwrap_or("TCP"), p["port"]))
                .collect();
            format!("{peer} {}", ports.join(","))
        })
        .collect()
}

#[test]
fn a_host_network_pod_is_one_peer_its_node_address_from_either_side() {
    let ix = index_with_host_network();
    let tcp = |local: &str, peer: &str, port: u16, opened: Opened| {
        obs_in(&ix, local, peer, port, Protocol::TCP, opened)
    };
    let (probe_to_server, server_from_probe) = (
        tcp("probe-x", "10.0.0.2", 18080, Opened::Outbound),
        tcp("http-server-bbb-1", "192.168.1.1", 18080, Opened::Inbound),
    );
    let (server_to_probe, probe_from_server) = (
        tcp("http-server-bbb-1", "192.168.1.1", 9100, Opened::Outbound),
        tcp("probe-x", "10.0.0.2", 9100, Opened::Inbound),
    );
    let via_service = tcp("http-server-bbb-1", "10.96.0.30", 9100, Opened::Outbound);
    let early = tcp("probe-early", "10.0.0.2", 18080, Opened::Outbound);
    let node_peer = |port: u16| format!("192.168.1.1/32 TCP/{port}");
    let server_peer = |port: u16| format!("app=http-server TCP/{port}");
    // (what the agents reported, the proposal looked at, its rules)
    let cases: Vec<(&str, Vec<ReportedConnection>, &str, Vec<String>)> = vec![
        (
            "the client's record: the callee learns the node address",
            vec![probe_to_server.clone()],
            "deployment-http-server-ingress",
            vec![node_peer(18080)],
        ),
        (
            "both ends' records: one peer",
            vec![probe_to_server.clone(), server_from_probe.clone()],
            "deployment-http-server-ingress",
            vec![node_peer(18080)],
        ),
        (
            "the host-network pod keeps its own egress proposal",
            vec![probe_to_server.clone(), server_from_probe],
            "daemonset-probe-egress",
            vec![server_peer(18080)],
        ),
        (
            "called: both ends' records, one peer on the caller's egress",
            vec![server_to_probe.clone(), probe_from_server.clone()],
            "deployment-http-server-egress",
            vec![node_peer(9100)],
        ),
        (
            "called: its own ingress proposal names the caller",
            vec![server_to_probe, probe_from_server],
            "daemonset-probe-ingress",
            vec![server_peer(9100)],
        ),
        (
            "called through a Service: its backend is the node address",
            vec![via_service.clone()],
            "deployment-http-server-egress",
            vec![node_peer(9100)],
        ),
        (
            "called through a Service: its own ingress proposal names the caller",
            vec![via_service],
            "daemonset-probe-ingress",
            vec![server_peer(9100)],
        ),
        (
            "IPs not reported yet: its node's address stands in",
            vec![early],
            "deployment-http-server-ingress",
            vec![node_peer(18080)],
        ),
    ];
    for (what, observations, proposal, expected) in cases {
        let mut learned: BTreeMap<String, WorkloadNetworkPolicyProposal> = BTreeMap::new();
        for o in &observations {
            for flow in flows(&ix, o).unwrap() {
                for (target, edge) in edges(&flow, Backend::Kubernetes) {
                    let p = learned
                        .entry(target.name())
                        .or_insert_with(|| new_proposal(&target, Backend::Kubernetes));
                    apply(&mut p.spec, &edge);
                }
            }
        }
        let got = learned.get(proposal).map(rules);
        assert_eq!(got, Some(expected), "{what}: {learned:#?}");
    }

    // A host-network pod with no address of the peer's family anywhere: not learned yet (waits
    // for the index like an unknown pod), never as a pod selector.
    let v6 = ReportedConnection {
        peer: "fd00::2".parse().unwrap(),
        ..tcp("probe-x", "10.0.0.2", 18080, Opened::Outbound)
    };
    assert_eq!(
        flows(&ix, &v6),
        Err(NoFlow::HostAddressUnknown("shop".into(), "probe-x".into()))
    );
    assert!(crate::ingest::waiting::may_improve(
        &ix.flows(&v6.connection()),
        Opened::Outbound,
        &[]
    ));
}

/// An outbound connection of `http-client-aaa-1` to `peer` that its pod resolved from `name`.
fn named(peer: &str, port: u16, name: Option<&str>) -> ReportedConnection {
    ReportedConnection {
        peer_name: name.map(Arc::from),
        ..obs(
            "http-client-aaa-1",
            peer,
            port,
            Protocol::TCP,
            Opened::Outbound,
        )
    }
}

fn name_rules(p: &WorkloadNetworkPolicyProposal) -> Vec<(Vec<String>, Vec<String>)> {
    p.spec
        .egress_names
        .iter()
        .map(|r| {
            let ports = r
                .ports
                .iter()
                .map(|p| format!("{}/{:?}", p.protocol.as_deref().unwrap_or("TCP"), p.port))
                .collect();
            (r.names.clone(), ports)
        })
        .collect()
}

#[test]
fn an_outside_peer_resolved_from_a_name_is_learned_as_the_name() {
    let learned = learn(
        &[
            // Two rotated addresses of one name, on one port: one entry.
            named("203.0.113.7", 443, Some("api.partner.test")),
            named("203.0.113.8", 443, Some("api.partner.test")),
            // Another port of the same name joins its entry.
            named("203.0.113.8", 8443, Some("api.partner.test")),
            named("203.0.113.9", 443, Some("storage.partner.test")),
            // An address literal the pod never resolved stays an ipBlock.
            named("198.51.100.1", 443, None),
            // A pod's address is the pod, whatever name the agent gave: no name for cluster peers.
            named(
                "10.0.0.2",
                18080,
                Some("http-server.shop.svc.cluster.local"),
            ),
        ],
        Backend::Kubernetes,
    );
    let egress = &learned["deployment-http-client-egress"];
    assert_eq!(
        name_rules(egress),
        [
            (
                vec!["api.partner.test".to_string()],
                vec![
                    "TCP/Some(Int(443))".to_string(),
                    "TCP/Some(Int(8443))".into()
                ]
            ),
            (
                vec!["storage.partner.test".to_string()],
                vec!["TCP/Some(Int(443))".to_string()]
            ),
        ]
    );
    let blocks: Vec<String> = egress
        .spec
        .kubernetes
        .as_ref()
        .unwrap()
        .egress
        .iter()
        .flatten()
        .flat_map(|r| r.to.iter().flatten())
        .filter_map(|p| p.ip_block.as_ref().map(|b| b.cidr.clone()))
        .collect();
    assert_eq!(
        blocks,
        ["198.51.100.1/32"],
        "only the literal is an address"
    );
    assert_eq!(peer_count(&egress.spec), 2 + 2, "two rules, two names");
    // The server's ingress learns the client as a workload, as always.
    assert!(learned.contains_key("deployment-http-server-ingress"));
}

#[test]
fn names_share_the_fan_out_cap_per_port_and_the_rule_cap() {
    let ix = index();
    let target = Target {
        workload: ix
            .pod("shop", "http-client-aaa-1")
            .unwrap()
            .endpoint
            .clone(),
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let name = |i: usize, port: u16| Edge::Name {
        name: format!("n{i}.partner.test").into(),
        protocol: Protocol::TCP,
        port,
    };
    let mut spec = new_proposal(&target, Backend::Kubernetes).spec;
    let edges: Vec<Edge> = (0..5).map(|i| name(i, 443)).collect();
    let merged = merge(&mut spec, &edges, &external_cap(3));
    assert_eq!(spec.egress_names.len(), 3);
    assert_eq!(merged.capped, BTreeMap::from([((Protocol::TCP, 443), 2)]));
    // A known name on a new port is one more port of its entry, within that port's budget.
    let merged = merge(&mut spec, &[name(0, 80)], &external_cap(3));
    assert!(merged.changed);
    assert_eq!(spec.egress_names[0].ports.len(), 2);
    let rule_cap = Limits {
        max_rules: 3,
        ..Limits::NONE
    };
    let merged = merge(&mut spec, &[name(9, 9)], &rule_cap);
    assert_eq!((merged.changed, merged.rules_capped), (false, 1));
}

#[test]
fn sibling_names_are_learned_as_one_wildcard_that_then_covers_new_siblings() {
    let ix = index();
    let target = Target {
        workload: ix
            .pod("shop", "http-client-aaa-1")
            .unwrap()
            .endpoint
            .clone(),
        kind: WorkloadKind::Deployment,
        direction: Direction::Egress,
    };
    let name = |host: &str, port: u16| Edge::Name {
        name: host.into(),
        protocol: Protocol::TCP,
        port,
    };
    let limits = Limits {
        wildcard_min_names: 3,
        ..Limits::NONE
    };
    let mut spec = new_proposal(&target, Backend::Kubernetes).spec;
    let merged = merge(
        &mut spec,
        &[
            name("eu.shards.partner.test", 443),
            name("us.shards.partner.test", 443),
            name("login.partner.test", 443),
        ],
        &limits,
    );
    assert!(merged.wildcards.is_empty(), "two siblings are not enough");
    assert_eq!(spec.egress_names.len(), 3);
    let merged = merge(&mut spec, &[name("ap.shards.partner.test", 443)], &limits);
    assert_eq!(merged.wildcards, ["*.shards.partner.test"]);
    let names: Vec<&str> = spec
        .egress_names
        .iter()
        .flat_map(|r| r.names.iter().map(String::as_str))
        .collect();
    assert_eq!(names, ["login.partner.test", "*.shards.partner.test"]);
    // A new sibling on that port is already allowed; on another port it is learned exactly.
    let merged = merge(&mut spec, &[name("sa.shards.partner.test", 443)], &limits);
    assert!(!merged.changed);
    let merged = merge(&mut spec, &[name("sa.shards.partner.test", 80)], &limits);
    assert!(merged.changed);
    assert_eq!(spec.egress_names.len(), 3);
    // The defaults fold at five; `Limits::NONE` (the reference's behaviour) never.
    assert_eq!(Limits::default().wildcard_min_names, 5);
    assert_eq!(Limits::NONE.wildcard_min_names, 0);
}
