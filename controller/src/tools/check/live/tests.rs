use super::*;
use network_enforcer_api::WorkloadKind;
use serde_json::json;

fn pod(name: &str, app: &str, ip: &str, owner: Option<(&str, &str)>) -> Pod {
    // A Deployment's ReplicaSet is `<deployment>-<pod-template-hash>`, and its pods carry the hash.
    let hash = owner
        .filter(|(kind, _)| *kind == "ReplicaSet")
        .and_then(|(_, rs)| rs.rsplit('-').next());
    let mut labels = json!({"app": app});
    if let Some(hash) = hash {
        labels["pod-template-hash"] = json!(hash);
    }
    let owners = owner.map(|(kind, name)| {
        json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}])
    });
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "demo", "labels": labels,
                     "ownerReferences": owners},
        "spec": {"serviceAccountName": "sa", "containers": [{"name": "c", "image": "i",
                 "ports": [{"name": "http", "containerPort": 18080}, {"containerPort": 53, "protocol": "UDP"}]}]},
        "status": {"phase": "Running", "podIP": ip}
    }))
    .unwrap()
}

fn side(kind: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        namespace: "demo".into(),
        owner_kind: kind.into(),
        owner_name: name.into(),
        ..WorkloadRef::default()
    }
}

fn edge(source: WorkloadRef, destination: WorkloadRef, port: u16) -> HistoryEdge {
    HistoryEdge {
        count: 1,
        ..HistoryEdge::flow(source, destination, Protocol::TCP, port)
    }
}

#[test]
fn one_flow_is_explained_side_by_side_with_the_scenario_that_reproduces_it() {
    let web = pod(
        "web-5d8f7c9b6-abcde",
        "web",
        "10.1.0.2",
        Some(("ReplicaSet", "web-5d8f7c9b6")),
    );
    let db = pod("db-0", "db", "10.1.0.3", Some(("StatefulSet", "db")));
    // The database admits only the web pods on 5432.
    let isolate: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "db-ingress", "namespace": "demo"},
        "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                              "ports": [{"protocol": "TCP", "port": 5432}]}]}
    }))
    .unwrap();
    let input = |port: u16, pods: Vec<Pod>| LiveInput {
        pods,
        network_policies: vec![isolate.clone()],
        edges: vec![edge(
            side("Deployment", "web"),
            side("StatefulSet", "db"),
            port,
        )],
        ..LiveInput::default()
    };
    let other = pod(
        "cache-0",
        "cache",
        "10.1.0.5",
        Some(("StatefulSet", "cache")),
    );
    let allowed = explain_flow(&input(5432, vec![web.clone(), db.clone(), other.clone()])).unwrap();
    assert!(allowed.allowed);
    assert_eq!(allowed.egress, "not isolated");
    assert!(
        allowed.ingress.contains("np/demo/db-ingress"),
        "{}",
        allowed.ingress
    );
    let denied = explain_flow(&input(6379, vec![web.clone(), db.clone(), other])).unwrap();
    assert!(!denied.allowed);
    assert!(
        denied.ingress.contains("no rule matches"),
        "{}",
        denied.ingress
    );
    // The scenario holds the two pods and nothing of the others.
    let pods: Vec<&str> = denied
        .scenario
        .pods
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(pods, ["web-5d8f7c9b6-abcde", "db-0"]);
    // The scenario gives the same answer offline, through `check --scenario`'s parser.
    let text = serde_json::to_string(&denied.scenario).unwrap();
    let checker =
        crate::tools::check::Checker::new(crate::tools::check::parse_scenario(&text).unwrap())
            .unwrap();
    assert!(!checker.explain().results[0].allowed);
    // A workload with no pod now cannot be evaluated, and says which one.
    let missing = explain_flow(&input(5432, vec![web])).unwrap_err();
    assert!(
        missing.to_string().contains("StatefulSet demo/db"),
        "{missing}"
    );
}

#[test]
fn edges_become_flows_between_current_pods_of_their_workloads() {
    let mut host = pod("node-agent", "agent", "10.0.0.1", None);
    host.spec.as_mut().unwrap().host_network = Some(true);
    let mut done = pod(
        "old",
        "web",
        "10.1.0.9",
        Some(("ReplicaSet", "web-5d8f7c9b6")),
    );
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let input = LiveInput {
        pods: vec![
            done,
            pod(
                "web-5d8f7c9b6-abcde",
                "web",
                "10.1.0.2",
                Some(("ReplicaSet", "web-5d8f7c9b6")),
            ),
            pod("db-0", "db", "10.1.0.3", Some(("StatefulSet", "db"))),
            pod("debug", "debug", "10.1.0.4", None),
            host,
        ],
        edges: vec![
            edge(side("Deployment", "web"), side("StatefulSet", "db"), 5432),
            edge(side("Pod", "debug"), side("Deployment", "web"), 18080),
            edge(
                side("Deployment", "web"),
                WorkloadRef {
                    address: "192.0.2.7".into(),
                    ..WorkloadRef::default()
                },
                443,
            ),
            // Reached by the name its pod resolved: the flow's destination keeps the name.
            edge(
                side("Deployment", "web"),
                WorkloadRef {
                    address: "192.0.2.8".into(),
                    dns_name: "api.example.test".into(),
                    ..WorkloadRef::default()
                },
                443,
            ),
            // No pod of it now.
            edge(
                side("Deployment", "retired"),
                side("StatefulSet", "db"),
                5432,
            ),
        ],
        ..LiveInput::default()
    };
    let (scenario, skipped) = scenario(&input);
    assert_eq!(skipped, 1);
    let names: Vec<&str> = scenario.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["web-5d8f7c9b6-abcde", "db-0", "debug"],
        "evaluable pods only"
    );
    assert_eq!(scenario.pods[0].ports.len(), 2);
    assert_eq!(scenario.pods[0].service_account.as_deref(), Some("sa"));
    let flows: Vec<String> = scenario
        .flows
        .iter()
        .map(|f| {
            let end = |p: &ScenarioPeer| match (&p.pod, p.ip) {
                (Some(pod), _) => pod.clone(),
                (None, Some(ip)) => ip.to_string(),
                (None, None) => "?".into(),
            };
            format!("{} -> {}:{}", end(&f.from), end(&f.to), f.port)
        })
        .collect();
    assert_eq!(
        flows,
        [
            "demo/web-5d8f7c9b6-abcde -> demo/db-0:5432",
            "demo/debug -> demo/web-5d8f7c9b6-abcde:18080",
            "demo/web-5d8f7c9b6-abcde -> 192.0.2.7:443",
            "demo/web-5d8f7c9b6-abcde -> 192.0.2.8:443",
        ]
    );
    let names: Vec<Option<&str>> = scenario
        .flows
        .iter()
        .map(|f| f.to.name.as_deref())
        .collect();
    assert_eq!(names, [None, None, None, Some("api.example.test")]);
    // The checker takes it as it is.
    super::super::Checker::new(scenario).expect("a valid scenario");
}

#[test]
fn pod_addresses_are_read_as_everywhere_else() {
    // Dual stack: `podIPs` first, its first entry is the scenario pod's address.
    let mut dual = pod("dual", "web", "10.1.0.5", None);
    dual.status.as_mut().unwrap().pod_ips =
        Some(serde_json::from_value(json!([{"ip": "fd00::5"}, {"ip": "10.1.0.5"}])).unwrap());
    let input = LiveInput {
        pods: vec![dual, pod("no-address", "web", "not-an-ip", None)],
        ..LiveInput::default()
    };
    let (scenario, _) = scenario(&input);
    let pods: Vec<(&str, Option<std::net::IpAddr>)> = scenario
        .pods
        .iter()
        .map(|p| (p.name.as_str(), p.ip))
        .collect();
    assert_eq!(pods, [("dual", Some("fd00::5".parse().unwrap()))]);
}

/// A pod of `owner` (kind, name; controller or not), in namespace `demo`.
fn owned_pod(name: &str, ip: &str, owner: Option<(&str, &str, bool)>) -> Pod {
    let hash = owner
        .filter(|(kind, _, _)| *kind == "ReplicaSet")
        .and_then(|(_, rs, _)| rs.rsplit('-').next());
    let mut labels = json!({"app": name});
    if let Some(hash) = hash {
        labels["pod-template-hash"] = json!(hash);
    }
    let owners = owner.map(|(kind, owner, controller)| {
        json!([{"apiVersion": "v1", "kind": kind, "name": owner, "uid": format!("uid-{owner}"),
                "controller": controller}])
    });
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "demo", "uid": format!("uid-{name}"),
                     "labels": labels, "ownerReferences": owners},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip}
    }))
    .unwrap()
}

fn job(name: &str, cronjob: Option<(&str, bool)>) -> Job {
    let owners = cronjob.map(|(cronjob, controller)| {
        json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob,
                "uid": format!("uid-{cronjob}"), "controller": controller}])
    });
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "demo", "uid": format!("uid-{name}"),
                     "ownerReferences": owners},
        "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}}
    }))
    .unwrap()
}

/// The differential test of issue 40: the same pods (and Jobs) fed to the controller's index and
/// to `check`'s model, which must name the same workload for every pod: the index's endpoint (what
/// learning writes as `targetRef`, [`WorkloadKind::Pod`] for a bare pod), `check --from-cluster`'s
/// lookup of an edge's pod ([`JobOwners::unit`]) and the evaluator's `PodInfo::from_pod` (against
/// `PodInfo` from the index's record).
#[test]
fn check_and_the_controller_agree_on_every_pods_workload() {
    use crate::cluster::index::Index;
    use crate::monitor::evaluate::PodInfo;
    let jobs = vec![
        job("tick-28000", Some(("tick", true))),
        // `kubectl create job --from=cronjob/tick` (v1.20): a reference not marked controller.
        job("tick-manual", Some(("tick", false))),
        job("migrate", None),
    ];
    let pods = vec![
        owned_pod(
            "web-5d8f7c9b6-abcde",
            "10.1.0.1",
            Some(("ReplicaSet", "web-5d8f7c9b6", true)),
        ),
        owned_pod("db-0", "10.1.0.2", Some(("StatefulSet", "db", true))),
        owned_pod("agent-x1", "10.1.0.3", Some(("DaemonSet", "agent", true))),
        owned_pod(
            "tick-28000-q",
            "10.1.0.4",
            Some(("Job", "tick-28000", true)),
        ),
        owned_pod(
            "tick-manual-q",
            "10.1.0.5",
            Some(("Job", "tick-manual", true)),
        ),
        owned_pod("migrate-q", "10.1.0.6", Some(("Job", "migrate", true))),
        // A Job not listed (yet): its own unit, in both.
        owned_pod("other-q", "10.1.0.7", Some(("Job", "other", true))),
        owned_pod("debug", "10.1.0.8", None),
        // A ReplicaSet of its own (no hash) and another controller: no unit of ours.
        owned_pod("rs-x", "10.1.0.9", Some(("ReplicaSet", "rs", true))),
        owned_pod("custom-x", "10.1.0.10", Some(("Rollout", "custom", true))),
        // An ownerReference that is not the controller: a bare pod.
        owned_pod("adopted", "10.1.0.11", Some(("StatefulSet", "db", false))),
    ];
    let mut index = Index::default();
    jobs.iter().for_each(|j| index.apply_job(j));
    pods.iter().for_each(|p| index.apply_pod(p, 0));
    let owners = JobOwners::new(&jobs);
    let mut seen = Vec::new();
    for pod in &pods {
        let name = pod.name_any();
        let record = index.pod("demo", &name).expect("indexed");
        let endpoint = index.endpoint_of(record);
        // What learning targets: the endpoint's kind, a bare pod itself, none for another controller.
        let controller = match (endpoint.kind, &endpoint.foreign_controller) {
            (Some(kind), _) => Some((kind, endpoint.name.clone())),
            (None, None) => Some((WorkloadKind::Pod, endpoint.name.clone())),
            (None, Some(_)) => None,
        };
        let check = owners.unit(pod).map(|w| (w.kind, w.name));
        assert_eq!(check, controller, "pod {name}");
        assert_eq!(
            PodInfo::from_pod(pod, &owners).map(|p| p.workload),
            Some(PodInfo::from(&**record).workload),
            "pod {name}"
        );
        seen.push(check);
    }
    // The table covers every kind.
    for kind in [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::Job,
        WorkloadKind::CronJob,
        WorkloadKind::Pod,
    ] {
        assert!(seen.iter().flatten().any(|(k, _)| *k == kind), "{kind:?}");
    }

    // And an edge of the CronJob finds its run's pod in `check --from-cluster`.
    let input = LiveInput {
        pods: pods.clone(),
        jobs,
        edges: vec![edge(
            side("CronJob", "tick"),
            side("Deployment", "web"),
            18080,
        )],
        ..LiveInput::default()
    };
    let (scenario, skipped) = scenario(&input);
    assert_eq!(skipped, 0);
    assert_eq!(
        scenario.flows[0].from.pod.as_deref(),
        Some("demo/tick-28000-q")
    );
}
