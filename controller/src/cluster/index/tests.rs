use super::*;
use serde_json::json;

const T: i64 = 1_000_000;

fn pod(name: &str, ip: &str, labels: serde_json::Value, owner: Option<(&str, &str)>) -> Pod {
    let mut meta =
        json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": labels});
    if let Some((kind, owner_name)) = owner {
        meta["ownerReferences"] = json!([{"apiVersion": if kind == "Job" { "batch/v1" } else { "apps/v1" },
            "kind": kind, "name": owner_name, "uid": format!("uid-{owner_name}"), "controller": true}]);
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"serviceAccountName": "sa", "containers": [{"name": "c", "ports": [
            {"name": "http", "containerPort": if name.starts_with("new") { 9090 } else { 8080 }}]}]},
        "status": {"phase": "Running", "podIP": ip}
    }))
    .unwrap()
}

fn deployment_pod(name: &str, ip: &str, app: &str) -> Pod {
    pod(
        name,
        ip,
        json!({"app": app, "pod-template-hash": "h"}),
        Some(("ReplicaSet", &format!("{app}-h"))),
    )
}

fn service(selector: serde_json::Value, target: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.1", "selector": selector,
                 "ports": [{"port": 80, "targetPort": target}]}
    }))
    .unwrap()
}

fn deployment(name: &str, selector: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-deploy-{name}")},
        "spec": {"selector": {"matchLabels": selector}, "template": {}}
    }))
    .unwrap()
}

fn backends(ix: &Index) -> Vec<(String, u16)> {
    match ix.resolve("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T) {
        Resolved::Backends(b) => b
            .into_iter()
            .map(|(e, p)| match e {
                FlowEnd::Workload(w) => (w.name.clone(), p),
                other => panic!("not a workload: {other:?}"),
            })
            .collect(),
        _ => vec![],
    }
}

/// Whether `w` has a pod on `node`, by scanning every pod (live or recently deleted): the
/// reference [`Index::has_pod_on`]'s per-node counts must agree with.
fn scanned_on_node(ix: &Index, w: &WorkloadEndpoint, node: &str) -> bool {
    ix.pods.values().any(|p| {
        p.namespace == w.namespace
            && p.node.as_deref() == Some(node)
            && match w.kind {
                None => p.name == w.name,
                Some(kind) => p
                    .owner
                    .as_ref()
                    .is_some_and(|o| o.kind == kind && o.name == w.name),
            }
    })
}

/// A lookup by address hands out the pod's record as the index holds it, after every kind of
/// change to the pod or its workload (the lease keeps its own reference to it).
#[test]
fn an_address_finds_the_pods_current_record() {
    let mut ix = Index::default();
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap());
    let same = |ix: &Index, ip: IpAddr, at: i64| {
        let by_name: *const PodRecord = &**ix.pod("ns", "web-1").expect("indexed");
        ix.pod_at(ip, at)
            .is_some_and(|p| std::ptr::eq(&**p, by_name))
    };
    ix.apply_pod(&deployment_pod("web-1", "10.0.0.5", "web"), T);
    assert!(same(&ix, a, T));
    // Its labels change.
    let mut relabelled = deployment_pod("web-1", "10.0.0.5", "web");
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "front".into());
    ix.apply_pod(&relabelled, T + 1);
    assert!(same(&ix, a, T + 1));
    assert_eq!(
        ix.pod_at(a, T + 1)
            .unwrap()
            .labels
            .get("tier")
            .map(String::as_str),
        Some("front")
    );
    // Its workload arrives: the pod's owner and endpoint are computed again.
    let before = ix.pod("ns", "web-1").unwrap().clone();
    ix.apply_deployment(&deployment("web", json!({"app": "web"})));
    assert!(
        !Arc::ptr_eq(&before, ix.pod("ns", "web-1").unwrap()),
        "a new record"
    );
    assert!(same(&ix, a, T + 2));
    // A new address: a late record for the old one still finds the pod as it is now.
    ix.apply_pod(&deployment_pod("web-1", "10.0.0.6", "web"), T + 3);
    assert!(same(&ix, b, T + 3) && same(&ix, a, T + 2));
    // Deleted, then made again under the same name (a StatefulSet's pod) with the same address.
    ix.delete_pod("ns", "web-1", T + 4);
    assert!(same(&ix, b, T + 3));
    ix.apply_pod(&deployment_pod("web-1", "10.0.0.6", "web"), T + 5);
    assert!(same(&ix, b, T + 5) && same(&ix, b, T + 3));
    // The address it gave up two changes ago keeps the record of then.
    assert_eq!(ix.pod_at(a, T + 2).map(|p| p.name.as_str()), Some("web-1"));
}

#[test]
fn has_pod_on_follows_pods_moving_leaving_and_expiring() {
    let on = |name: &str, ip: &str, app: &str, node: &str| {
        let mut p = deployment_pod(name, ip, app);
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p
    };
    let mut bare = pod("bare", "10.0.0.9", json!({"app": "bare"}), None);
    bare.spec.as_mut().unwrap().node_name = Some("n1".into());
    let mut ix = Index::default();
    // Every workload and bare pod seen so far, asked about every node after every step.
    let mut endpoints: Vec<Arc<WorkloadEndpoint>> = Vec::new();
    let mut check = |ix: &Index, step: &str, expected_on: &[(&str, &str)]| {
        for p in ix.pods.values() {
            if !endpoints.iter().any(|e| **e == *p.endpoint) {
                endpoints.push(p.endpoint.clone());
            }
        }
        for w in &endpoints {
            for node in ["n1", "n2", "n3"] {
                let expected = scanned_on_node(ix, w, node);
                assert_eq!(
                    ix.has_pod_on(w, node),
                    expected,
                    "{step}: {}/{} on {node}",
                    w.namespace,
                    w.name
                );
                assert_eq!(
                    expected,
                    expected_on.contains(&(w.name.as_str(), node)),
                    "{step}: the reference disagrees with the test for {} on {node}",
                    w.name
                );
            }
        }
    };
    ix.apply_pod(&on("web-1", "10.0.0.1", "web", "n1"), T);
    ix.apply_pod(&on("web-2", "10.0.0.2", "web", "n2"), T);
    ix.apply_pod(&on("db-1", "10.0.0.3", "db", "n2"), T);
    ix.apply_pod(&bare, T);
    check(
        &ix,
        "placed",
        &[("web", "n1"), ("web", "n2"), ("db", "n2"), ("bare", "n1")],
    );
    // A Deployment seen later changes its pods' endpoint (its uid and selector): relinked.
    ix.apply_deployment(&deployment("web", json!({"app": "web"})));
    check(
        &ix,
        "deployment seen",
        &[("web", "n1"), ("web", "n2"), ("db", "n2"), ("bare", "n1")],
    );
    // A pod re-applied on another node moves; two pods on one node count once each.
    ix.apply_pod(&on("web-2", "10.0.0.2", "web", "n1"), T + 1);
    ix.apply_pod(&on("db-2", "10.0.0.4", "db", "n2"), T + 1);
    check(&ix, "moved", &[("web", "n1"), ("db", "n2"), ("bare", "n1")]);
    // A deleted pod still counts for its IP history, then no more.
    ix.delete_pod("ns", "db-1", T + 2);
    check(
        &ix,
        "db-1 deleted",
        &[("web", "n1"), ("db", "n2"), ("bare", "n1")],
    );
    ix.delete_pod("ns", "db-2", T + 2);
    ix.delete_pod("ns", "bare", T + 2);
    check(
        &ix,
        "db deleted",
        &[("web", "n1"), ("db", "n2"), ("bare", "n1")],
    );
    ix.forget_expired(T + 3 + IP_HISTORY_MS);
    check(&ix, "expired", &[("web", "n1")]);
    assert!(
        ix.nodes_of_workload
            .0
            .get("ns")
            .is_some_and(|names| names.len() == 1),
        "emptied entries are dropped: {:?}",
        ix.nodes_of_workload
    );
}

/// Resolution of a ClusterIP by scanning every pod, as the index did before keeping backends: the
/// reference the kept backends must agree with.
fn scanned(ix: &Index, port: u16) -> Vec<(String, u16)> {
    let svc = ix.services.values().next().unwrap();
    let sp = svc.ports.iter().find(|p| p.port == port).unwrap();
    let mut out: BTreeSet<(String, u16)> = BTreeSet::new();
    for pod in ix.pods.values() {
        let key = (pod.namespace.clone(), pod.name.clone());
        if backs(svc, pod, ix.deleted.contains_key(&key)) {
            if let Some(p) = container_port(&sp.target, pod, sp.protocol) {
                out.insert((pod.endpoint.name.clone(), p));
            }
        }
    }
    out.into_iter().collect()
}

#[test]
fn service_backends_follow_pods_in_any_order() {
    let mut ix = Index::default();
    ix.apply_service(&service(json!({"tier": "web"}), json!("http")));
    assert_eq!(backends(&ix), vec![], "no backend yet");
    assert!(matches!(
        ix.resolve("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T),
        Resolved::ServiceWithoutBackends { .. }
    ));
    let mut a = deployment_pod("a-h-1", "10.0.0.1", "a");
    a.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "web".into());
    ix.apply_pod(&a, T);
    assert_eq!(backends(&ix), [("a".to_string(), 8080)]);
    // A second workload whose pods name the port differently: each backend on its own port.
    let mut b = deployment_pod("new-b-h-1", "10.0.0.2", "b");
    b.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "web".into());
    ix.apply_pod(&b, T);
    assert_eq!(
        backends(&ix),
        [("a".to_string(), 8080), ("b".to_string(), 9090)]
    );
    assert_eq!(backends(&ix), scanned(&ix, 80));
    // A relabelled pod leaves; a deleted pod leaves.
    b.metadata.labels.as_mut().unwrap().remove("tier");
    ix.apply_pod(&b, T + 1);
    assert_eq!(backends(&ix), [("a".to_string(), 8080)]);
    ix.delete_pod("ns", "a-h-1", T + 2);
    assert_eq!(backends(&ix), vec![]);
    assert_eq!(backends(&ix), scanned(&ix, 80));
    // Re-applying the Service keeps what the pods say.
    b.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "web".into());
    ix.apply_pod(&b, T + 3);
    ix.apply_service(&service(json!({"tier": "web"}), json!(80)));
    assert_eq!(backends(&ix), [("b".to_string(), 80)]);
    ix.delete_service("ns", "web");
    assert!(matches!(
        ix.resolve("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T),
        Resolved::Address(FlowEnd::External(_), 80)
    ));
}

/// A compact description of what an address resolves to, for table tests.
fn described(resolved: Resolved) -> Vec<String> {
    let name = |e: &FlowEnd| match e {
        FlowEnd::Workload(w) => format!("workload {}", w.name),
        FlowEnd::HostNetwork { workload, ip, node } => {
            format!("host network {} on {node} {ip}", workload.name)
        }
        FlowEnd::Node { ip, name } => format!("node {name} {ip}"),
        FlowEnd::External(ip) => format!("external {ip}"),
    };
    match resolved {
        Resolved::Backends(b) => b.iter().map(|(e, p)| format!("{}:{p}", name(e))).collect(),
        Resolved::Address(e, p) => vec![format!("address {}:{p}", name(&e))],
        Resolved::ServiceWithoutBackends { name, .. } => vec![format!("no backend in {name}")],
    }
}

fn endpoints(namespace: &str, name: &str, subsets: serde_json::Value) -> Endpoints {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace},
                                  "subsets": subsets}))
    .unwrap()
}

#[test]
fn services_without_a_selector_resolve_through_their_endpoints() {
    let mut ix = Index::default();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.244.0.1"}]}}))
    .unwrap();
    ix.apply_node(&node);
    ix.apply_pod(&deployment_pod("db-h-1", "10.0.0.5", "db"), T);
    // The Endpoints may be listed before their Service.
    ix.apply_endpoints(&endpoints(
        "default",
        "kubernetes",
        json!([{"addresses": [{"ip": "10.244.0.1"}], "notReadyAddresses": [{"ip": "10.244.0.9"}],
                "ports": [{"name": "https", "port": 16443}]}]),
    ));
    let kubernetes: Service = serde_json::from_value(json!({
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "targetPort": 16443}]}
    }))
    .unwrap();
    ix.apply_service(&kubernetes);
    let multi: Service = serde_json::from_value(json!({
        "metadata": {"name": "multi", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.2", "ports": [
            {"name": "a", "port": 80}, {"name": "b", "port": 81, "protocol": "UDP"}]}
    }))
    .unwrap();
    ix.apply_service(&multi);
    ix.apply_endpoints(&endpoints(
        "ns",
        "multi",
        json!([{"addresses": [{"ip": "10.0.0.5"}, {"ip": "192.0.2.7"}],
                "ports": [{"name": "a", "port": 8080}, {"name": "b", "port": 8081, "protocol": "UDP"}]},
               {"addresses": [{"ip": "198.51.100.1"}], "ports": [{"name": "a", "port": 9090}]}]),
    ));
    let cases: [(&str, u16, Protocol, &[&str]); 6] = [
        // The API server behind the `kubernetes` Service: its node address, on the endpoint port
        // (the not-ready address receives nothing).
        (
            "10.96.0.1",
            443,
            Protocol::TCP,
            &["node n1 10.244.0.1:16443"],
        ),
        // A direct call to the same address learns the same.
        (
            "10.244.0.1",
            16443,
            Protocol::TCP,
            &["address node n1 10.244.0.1:16443"],
        ),
        (
            "10.96.0.1",
            80,
            Protocol::TCP,
            &["no backend in kubernetes"],
        ),
        // Ports pair by name and protocol; a pod address is its workload.
        (
            "10.96.0.2",
            80,
            Protocol::TCP,
            &[
                "workload db:8080",
                "external 192.0.2.7:8080",
                "external 198.51.100.1:9090",
            ],
        ),
        (
            "10.96.0.2",
            81,
            Protocol::UDP,
            &["workload db:8081", "external 192.0.2.7:8081"],
        ),
        ("10.96.0.2", 81, Protocol::TCP, &["no backend in multi"]),
    ];
    for (ip, port, proto, expected) in cases {
        assert_eq!(
            described(ix.resolve(ip.parse().unwrap(), port, proto, T)),
            expected,
            "{ip}:{port}/{proto:?}"
        );
    }

    // The protect gate's API-server test: the endpoint on its port, and the ClusterIP.
    let api = |ip: &str, port| ix.is_api_server(ip.parse().unwrap(), port);
    assert!(api("10.244.0.1", 16443) && api("10.96.0.1", 443));
    assert!(!api("10.244.0.1", 22) && !api("192.0.2.7", 8080) && !api("10.0.0.5", 16443));

    // A Service that gets a selector is resolved through its pods at once; its endpoints are kept
    // but route nothing (no address of theirs is followed).
    let routes_to = |ix: &Index, name: &str| {
        ix.endpoint_addresses
            .values()
            .any(|services| services.contains(&("ns".to_string(), name.to_string())))
    };
    assert!(routes_to(&ix, "multi"));
    let mut selected = multi.clone();
    selected.spec.as_mut().unwrap().selector = Some(BTreeMap::from([("app".into(), "db".into())]));
    ix.apply_service(&selected);
    ix.apply_endpoints(&endpoints(
        "ns",
        "multi",
        json!([{"addresses": [{"ip": "192.0.2.7"}], "ports": [{"name": "a", "port": 8080}]}]),
    ));
    assert!(!routes_to(&ix, "multi"));
    assert_eq!(
        described(ix.resolve("10.96.0.2".parse().unwrap(), 80, Protocol::TCP, T)),
        ["workload db:80"],
        "resolved through its pods"
    );
    // It loses its selector: resolved through the endpoints it already has, at once, without waiting
    // for their next change.
    ix.apply_service(&multi);
    assert!(routes_to(&ix, "multi"));
    assert_eq!(
        described(ix.resolve("10.96.0.2".parse().unwrap(), 80, Protocol::TCP, T)),
        ["external 192.0.2.7:8080"],
        "resolved through its endpoints"
    );
    ix.delete_endpoints("default", "kubernetes");
    assert_eq!(
        described(ix.resolve("10.96.0.1".parse().unwrap(), 443, Protocol::TCP, T)),
        ["no backend in kubernetes"]
    );
    assert!(!ix.holds_endpoints("default", "kubernetes"));
}

#[test]
fn a_selector_less_services_backends_follow_its_endpoints_and_what_is_at_their_addresses() {
    let mut ix = Index::default();
    let ext: Service = serde_json::from_value(json!({
        "metadata": {"name": "ext", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.3", "ports": [{"port": 80}]}
    }))
    .unwrap();
    ix.apply_service(&ext);
    let at = |ip: &str| {
        endpoints(
            "ns",
            "ext",
            json!([{"addresses": [{"ip": ip}], "ports": [{"port": 8080}]}]),
        )
    };
    let resolved =
        |ix: &Index| described(ix.resolve("10.96.0.3".parse().unwrap(), 80, Protocol::TCP, T));
    assert!(ix.endpoints_change(&at("10.0.0.7")));
    ix.apply_endpoints(&at("10.0.0.7"));
    assert!(
        !ix.endpoints_change(&at("10.0.0.7")),
        "the same again changes nothing"
    );
    assert_eq!(resolved(&ix), ["external 10.0.0.7:8080"]);

    // A pod taking the address, its workload changing, the pod leaving it.
    ix.apply_pod(&deployment_pod("db-h-1", "10.0.0.7", "db"), T);
    assert_eq!(resolved(&ix), ["workload db:8080"]);
    ix.apply_deployment(&deployment("db", json!({"app": "db"})));
    let endpoint = ix.pod("ns", "db-h-1").unwrap().endpoint.clone();
    assert_eq!(endpoint.uid.as_deref(), Some("uid-deploy-db"));
    let first = match ix.resolve_ref("10.96.0.3".parse().unwrap(), 80, Protocol::TCP, T) {
        ResolvedRef::Backends(b) => {
            assert!(matches!(&b[0].0, FlowEnd::Workload(w) if Arc::ptr_eq(w, &endpoint)));
            b.as_ptr()
        }
        other => panic!("{other:?}"),
    };
    match ix.resolve_ref("10.96.0.3".parse().unwrap(), 80, Protocol::TCP, T + 1) {
        ResolvedRef::Backends(b) => assert_eq!(b.as_ptr(), first, "borrowed from the index"),
        other => panic!("{other:?}"),
    }
    ix.delete_pod("ns", "db-h-1", T + 2);
    assert_eq!(resolved(&ix), ["external 10.0.0.7:8080"]);
    ix.apply_pod(&deployment_pod("db-h-2", "10.0.0.7", "db"), T + 3);
    assert_eq!(resolved(&ix), ["workload db:8080"]);
    ix.delete_pod("ns", "db-h-2", T + 4);

    // A node gaining and losing the address.
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}}))
    .unwrap();
    ix.apply_node(&node);
    assert_eq!(resolved(&ix), ["node n1 10.0.0.7:8080"]);
    ix.delete_node("n1");
    assert_eq!(resolved(&ix), ["external 10.0.0.7:8080"]);

    // The Endpoints moving to another address: what is at the old one no longer matters.
    ix.apply_endpoints(&at("10.0.0.8"));
    assert_eq!(resolved(&ix), ["external 10.0.0.8:8080"]);
    assert_eq!(
        ix.endpoint_addresses.keys().collect::<Vec<_>>(),
        [&"10.0.0.8".parse::<IpAddr>().unwrap()]
    );
    ix.apply_node(&node);
    assert_eq!(resolved(&ix), ["external 10.0.0.8:8080"]);
    ix.apply_pod(&deployment_pod("db-h-3", "10.0.0.8", "db"), T + 5);
    assert_eq!(resolved(&ix), ["workload db:8080"]);

    // Removed Endpoints leave no backend and nothing to follow; removing them again changes nothing.
    assert!(ix.holds_endpoints("ns", "ext"));
    ix.delete_endpoints("ns", "ext");
    assert_eq!(resolved(&ix), ["no backend in ext"]);
    assert!(!ix.holds_endpoints("ns", "ext"));
    assert!(ix.endpoint_addresses.is_empty());

    // The Endpoints of a Service with a selector are kept but route nothing; ones without ready
    // addresses change nothing.
    ix.apply_service(&service(json!({"app": "db"}), json!(8080)));
    let selected = endpoints(
        "ns",
        "web",
        json!([{"addresses": [{"ip": "10.0.0.8"}], "ports": [{"port": 8080}]}]),
    );
    assert!(ix.endpoints_change(&selected));
    ix.apply_endpoints(&selected);
    assert!(!ix.endpoints_change(&selected));
    assert!(ix.endpoint_addresses.is_empty());
    let leader = endpoints("kube-system", "kube-scheduler", json!(null));
    assert!(!ix.endpoints_change(&leader));
}

#[test]
fn terminated_pods_back_no_service() {
    let mut ix = Index::default();
    ix.apply_service(&service(json!({"app": "a"}), json!(8080)));
    let mut a = deployment_pod("a-h-1", "10.0.0.1", "a");
    ix.apply_pod(&a, T);
    assert_eq!(backends(&ix).len(), 1);
    a.status.as_mut().unwrap().phase = Some("Succeeded".into());
    ix.apply_pod(&a, T + 1);
    assert_eq!(backends(&ix), vec![]);
}

#[test]
fn a_workload_change_reaches_its_pods_and_service_backends() {
    let mut ix = Index::default();
    ix.apply_service(&service(json!({"app": "a"}), json!(8080)));
    ix.apply_pod(&deployment_pod("a-h-1", "10.0.0.1", "a"), T);
    ix.apply_pod(&deployment_pod("a-h-2", "10.0.0.2", "a"), T);
    let before = ix.pod("ns", "a-h-1").unwrap().endpoint.clone();
    assert_eq!(before.uid, None, "the Deployment is not known yet");
    assert!(
        before.selector.contains_key("pod-template-hash"),
        "until then the pod's labels stand for the selector"
    );
    ix.apply_deployment(&deployment("a", json!({"app": "a"})));
    let after = ix.pod("ns", "a-h-1").unwrap().endpoint.clone();
    assert_eq!(after.uid.as_deref(), Some("uid-deploy-a"));
    assert_eq!(after.selector, BTreeMap::from([("app".into(), "a".into())]));
    assert!(
        Arc::ptr_eq(&after, &ix.pod("ns", "a-h-2").unwrap().endpoint),
        "the pods of one workload share one endpoint"
    );
    match ix.resolve_ref("10.96.0.1".parse().unwrap(), 80, Protocol::TCP, T) {
        ResolvedRef::Backends(b) => {
            assert!(matches!(&b[0].0, FlowEnd::Workload(w) if Arc::ptr_eq(w, &after)))
        }
        other => panic!("{other:?}"),
    }
    ix.delete_workload("ns", WorkloadKind::Deployment, "a");
    assert_eq!(ix.pod("ns", "a-h-1").unwrap().endpoint.uid, None);
}

fn job(name: &str, cronjob: Option<&str>, template_labels: serde_json::Value) -> Job {
    job_with_owner(
        name,
        cronjob.map(|c| ("CronJob", c, Some(true))),
        template_labels,
    )
}

/// A Job's ownerReference: `(kind, name, controller)`.
type JobOwner<'a> = (&'a str, &'a str, Option<bool>);

/// A Job with one ownerReference.
fn job_with_owner(name: &str, owner: Option<JobOwner>, template_labels: serde_json::Value) -> Job {
    let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}")});
    if let Some((kind, owner_name, controller)) = owner {
        meta["ownerReferences"] = json!([{"apiVersion": "batch/v1beta1", "kind": kind,
            "name": owner_name, "uid": format!("uid-{owner_name}"), "controller": controller}]);
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"selector": {"matchLabels": {"controller-uid": format!("uid-{name}")}},
                 "template": {"metadata": {"labels": template_labels}, "spec": {"containers": []}}}
    }))
    .unwrap()
}

fn job_pod(name: &str, job: &str, ip: &str) -> Pod {
    pod(
        name,
        ip,
        json!({"app": "backup", "controller-uid": format!("uid-{job}"), "job-name": job}),
        Some(("Job", job)),
    )
}

#[test]
fn jobs_of_a_cronjob_are_the_cronjob_whatever_the_order() {
    let mut ix = Index::default();
    // The pod of the first run arrives before its Job: a Job for now, selected by its labels
    // without the per-run ones.
    ix.apply_pod(&job_pod("backup-100-x", "backup-100", "10.0.0.5"), T);
    let e = ix.pod("ns", "backup-100-x").unwrap().endpoint.clone();
    assert_eq!(
        (
            e.kind,
            e.name.as_str(),
            e.uid.as_deref(),
            e.api_version.as_str()
        ),
        (
            Some(WorkloadKind::Job),
            "backup-100",
            Some("uid-backup-100"),
            "batch/v1"
        )
    );
    assert_eq!(
        e.selector,
        BTreeMap::from([("app".into(), "backup".into())])
    );
    let labels = json!({"app": "backup", "controller-uid": "x", "job-name": "x"});
    ix.apply_job(&job("backup-100", Some("backup"), labels.clone()));
    ix.apply_job(&job("backup-160", Some("backup"), labels));
    ix.apply_pod(&job_pod("backup-160-y", "backup-160", "10.0.0.6"), T);
    for pod in ["backup-100-x", "backup-160-y"] {
        let e = ix.pod("ns", pod).unwrap().endpoint.clone();
        assert_eq!(
            (
                e.kind,
                e.name.as_str(),
                e.uid.as_deref(),
                e.api_version.as_str()
            ),
            (
                Some(WorkloadKind::CronJob),
                "backup",
                Some("uid-backup"),
                "batch/v1beta1"
            ),
            "{pod}"
        );
        assert_eq!(
            e.selector,
            BTreeMap::from([("app".into(), "backup".into())]),
            "template labels without the per-run ones"
        );
    }
    assert_eq!(
        ix.pod("ns", "backup-100-x").unwrap().owner,
        Some(Workload {
            kind: WorkloadKind::CronJob,
            name: "backup".into()
        })
    );
    // The history limit deletes the Job first; its pod's last updates still belong to the CronJob.
    ix.delete_job("ns", "backup-100");
    let mut dying = job_pod("backup-100-x", "backup-100", "10.0.0.5");
    dying.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    ix.apply_pod(&dying, T + 1);
    assert_eq!(
        ix.pod("ns", "backup-100-x").unwrap().endpoint.kind,
        Some(WorkloadKind::CronJob)
    );
    ix.delete_pod("ns", "backup-100-x", T + 2);
    ix.forget_expired(T + 3 + IP_HISTORY_MS);
    assert!(ix.pod("ns", "backup-100-x").is_none());
    assert!(
        !ix.jobs
            .contains_key(&("ns".to_string(), "backup-100".to_string())),
        "forgotten with its last pod"
    );
}

#[test]
fn a_job_of_its_own_is_the_unit_and_a_cronjob_without_labels_is_unselectable() {
    let mut ix = Index::default();
    ix.apply_job(&job(
        "migrate",
        None,
        json!({"app": "backup", "controller-uid": "uid-migrate", "job-name": "migrate"}),
    ));
    ix.apply_pod(&job_pod("migrate-z", "migrate", "10.0.0.7"), T);
    let e = ix.pod("ns", "migrate-z").unwrap().endpoint.clone();
    assert_eq!(
        (e.kind, e.name.as_str(), e.uid.as_deref()),
        (Some(WorkloadKind::Job), "migrate", Some("uid-migrate"))
    );
    assert_eq!(
        e.selector,
        BTreeMap::from([("app".into(), "backup".into())]),
        "its template labels, not its controller-uid"
    );
    assert!(e.selectable());
    ix.delete_job("ns", "migrate");
    assert!(ix.workload("ns", WorkloadKind::Job, "migrate").is_none());

    // Only per-run labels: nothing selects every run, so no selector at all.
    ix.apply_job(&job("tick-1", Some("tick"), json!({"job-name": "tick-1"})));
    ix.apply_job(&job("once", None, json!({"controller-uid": "uid-once"})));
    for (pod, job, ip, kind) in [
        ("tick-1-a", "tick-1", "10.0.0.8", WorkloadKind::CronJob),
        ("once-a", "once", "10.0.0.9", WorkloadKind::Job),
    ] {
        let mut p = job_pod(pod, job, ip);
        p.metadata.labels.as_mut().unwrap().remove("app");
        ix.apply_pod(&p, T);
        let e = ix.pod("ns", pod).unwrap().endpoint.clone();
        assert_eq!(e.kind, Some(kind), "{pod}");
        assert!(
            !e.selectable(),
            "{pod}: no label shared by all runs: nothing selects exactly its pods"
        );
    }
}

/// Which workload a Job's pod belongs to, by the Job's ownerReference, and its selector: never a
/// per-run label, whoever made the Job.
#[test]
fn a_jobs_pods_belong_to_its_cronjob_however_the_reference_is_marked() {
    let labels = json!({"app": "report", "controller-uid": "uid-run", "job-name": "run",
                        "batch.kubernetes.io/controller-uid": "uid-run",
                        "batch.kubernetes.io/job-name": "run"});
    let cases: [(&str, Option<JobOwner>, WorkloadKind, &str); 5] = [
        // The CronJob controller's scheduled run.
        (
            "scheduled",
            Some(("CronJob", "report", Some(true))),
            WorkloadKind::CronJob,
            "report",
        ),
        // `kubectl create job --from=cronjob/report` (v1.20): no `controller` field...
        (
            "manual",
            Some(("CronJob", "report", None)),
            WorkloadKind::CronJob,
            "report",
        ),
        // ... or `controller: false`.
        (
            "manual-false",
            Some(("CronJob", "report", Some(false))),
            WorkloadKind::CronJob,
            "report",
        ),
        // Made by something else, or by nobody: a Job of its own.
        (
            "operator",
            Some(("Workflow", "wf", Some(true))),
            WorkloadKind::Job,
            "operator",
        ),
        ("plain", None, WorkloadKind::Job, "plain"),
    ];
    for (name, owner, kind, workload) in cases {
        let mut ix = Index::default();
        ix.apply_job(&job_with_owner(name, owner, labels.clone()));
        let mut pod = job_pod(&format!("{name}-x"), name, "10.0.0.5");
        pod.metadata.labels = serde_json::from_value(labels.clone()).unwrap();
        ix.apply_pod(&pod, T);
        let e = ix.pod("ns", &format!("{name}-x")).unwrap().endpoint.clone();
        assert_eq!((e.kind, e.name.as_str()), (Some(kind), workload), "{name}");
        assert_eq!(
            e.selector,
            BTreeMap::from([("app".into(), "report".into())]),
            "{name}: no per-run label"
        );
    }
}

#[test]
fn run_labels_are_left_out_and_cronjob_references_found() {
    let labels: BTreeMap<String, String> = serde_json::from_value(json!({
        "app": "a", "tier": "batch", "controller-uid": "u", "job-name": "j",
        "batch.kubernetes.io/controller-uid": "u", "batch.kubernetes.io/job-name": "j"
    }))
    .unwrap();
    assert_eq!(
        without_run_labels(&labels),
        BTreeMap::from([("app".into(), "a".into()), ("tier".into(), "batch".into())])
    );
    let reference = |kind: &str, name: &str, controller: Option<bool>| {
        serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>(
            json!({"apiVersion": "batch/v1beta1", "kind": kind, "name": name, "uid": format!("uid-{name}"),
                   "controller": controller}),
        )
        .unwrap()
    };
    let cases = [
        (vec![], None),
        (vec![reference("CronJob", "c", Some(true))], Some("c")),
        (vec![reference("CronJob", "c", None)], Some("c")),
        (vec![reference("CronJob", "c", Some(false))], Some("c")),
        (vec![reference("Workflow", "w", Some(true))], None),
        (
            vec![
                reference("CronJob", "other", None),
                reference("CronJob", "c", Some(true)),
            ],
            Some("c"),
        ),
    ];
    for (refs, expected) in cases {
        assert_eq!(
            cronjob_of(Some(&refs)).map(|r| r.name),
            expected.map(String::from),
            "{refs:?}"
        );
    }
    assert_eq!(cronjob_of(None), None);
}

#[test]
fn a_bare_pod_is_its_own_unit() {
    let mut ix = Index::default();
    ix.apply_pod(&pod("debug", "10.0.0.9", json!({"run": "debug"}), None), T);
    let e = ix.pod("ns", "debug").unwrap().endpoint.clone();
    assert_eq!(
        (
            e.kind,
            e.name.as_str(),
            e.uid.as_deref(),
            e.api_version.as_str()
        ),
        (None, "debug", Some("uid-debug"), "v1")
    );
    assert_eq!(e.selector, BTreeMap::from([("run".into(), "debug".into())]));
    ix.apply_pod(&pod("naked", "10.0.0.10", json!({}), None), T);
    assert!(!ix.pod("ns", "naked").unwrap().endpoint.selectable());
    // A pod of a controller the index does not resolve is no bare pod.
    ix.apply_pod(
        &pod(
            "rs-1",
            "10.0.0.11",
            json!({"app": "x"}),
            Some(("ReplicaSet", "rs")),
        ),
        T,
    );
    let e = ix.pod("ns", "rs-1").unwrap().endpoint.clone();
    assert_eq!(
        (e.kind, e.foreign_controller.as_deref(), e.uid.as_deref()),
        (None, Some("ReplicaSet"), None)
    );
}

#[test]
fn the_interner_forgets_endpoints_nobody_holds() {
    let mut ix = Index::default();
    for i in 0..1_000 {
        let name = format!("p{i}");
        ix.apply_pod(
            &pod(&name, "10.0.0.1", json!({"i": i.to_string()}), None),
            T,
        );
        ix.delete_pod("ns", &name, T);
    }
    ix.forget_expired(T + IP_HISTORY_MS + 1);
    assert_eq!(ix.pod_count(), 0);
    ix.apply_pod(
        &pod("last", "10.0.0.1", json!({}), None),
        T + IP_HISTORY_MS + 2,
    );
    assert!(ix.interned.len() < 300, "{} interned", ix.interned.len());
}

/// A `discovery.k8s.io/v1` EndpointSlice as the API server serves it.
fn slice(
    name: &str,
    service: Option<&str>,
    family: &str,
    body: serde_json::Value,
) -> EndpointSlice {
    let mut slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ns",
            "labels": {"endpointslice.kubernetes.io/managed-by": "external-controller"}},
        "addressType": family,
    });
    if let Some(service) = service {
        slice["metadata"]["labels"]["kubernetes.io/service-name"] = json!(service);
    }
    slice
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    serde_json::from_value(slice).unwrap()
}

#[test]
fn services_without_a_selector_resolve_through_their_endpoint_slices() {
    let mut ix = Index::default();
    ix.apply_pod(&deployment_pod("db-h-1", "10.0.0.5", "db"), T);
    // Dual-stack, split over three slices (two IPv4, one IPv6); listed before the Service.
    let v4a = slice(
        "ext-a",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [
            {"addresses": ["192.0.2.7"], "conditions": {"ready": true}},
            // Not ready and not terminating: no traffic.
            {"addresses": ["192.0.2.8"], "conditions": {"ready": false}},
            // No conditions at all: ready (nil is ready).
            {"addresses": ["10.0.0.5"]}],
          "ports": [{"name": "sql", "port": 5432, "protocol": "TCP"}]}),
    );
    let v4b = slice(
        "ext-b",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [{"addresses": ["192.0.2.9"], "conditions": {"ready": true}}],
          "ports": [{"name": "sql", "port": 5432}]}),
    );
    let v6 = slice(
        "ext-v6",
        Some("ext"),
        "IPv6",
        json!({"endpoints": [{"addresses": ["2001:db8::7"]}],
          "ports": [{"name": "sql", "port": 5432}]}),
    );
    for s in [&v4a, &v4b, &v6] {
        assert!(ix.endpoint_slice_change(s));
        ix.apply_endpoint_slice(s);
        assert!(
            !ix.endpoint_slice_change(s),
            "applied: nothing left to change"
        );
    }
    let ext: Service = serde_json::from_value(json!({
        "metadata": {"name": "ext", "namespace": "ns"},
        "spec": {"clusterIPs": ["10.96.0.9", "fd00::9"],
                 "ports": [{"name": "sql", "port": 5432}]}
    }))
    .unwrap();
    ix.apply_service(&ext);
    let resolved = |ix: &Index| {
        let mut all = described(ix.resolve("10.96.0.9".parse().unwrap(), 5432, Protocol::TCP, T));
        all.sort();
        all
    };
    assert_eq!(
        resolved(&ix),
        [
            "external 192.0.2.7:5432",
            "external 192.0.2.9:5432",
            "external 2001:db8::7:5432",
            "workload db:5432"
        ]
    );

    // A slice's endpoints change: only that slice's part is replaced.
    let v4b_moved = slice(
        "ext-b",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [{"addresses": ["192.0.2.10"]}], "ports": [{"name": "sql", "port": 5432}]}),
    );
    ix.apply_endpoint_slice(&v4b_moved);
    assert!(resolved(&ix).contains(&"external 192.0.2.10:5432".to_string()));
    assert!(!resolved(&ix).contains(&"external 192.0.2.9:5432".to_string()));

    // Deleted slices leave; the last one leaves no backend and nothing to follow.
    assert!(ix.holds_endpoint_slice("ns", "ext-v6"));
    ix.delete_endpoint_slice("ns", "ext-v6");
    assert!(!ix.holds_endpoint_slice("ns", "ext-v6"));
    assert!(!resolved(&ix).contains(&"external 2001:db8::7:5432".to_string()));
    ix.delete_endpoint_slice("ns", "ext-a");
    ix.delete_endpoint_slice("ns", "ext-b");
    assert_eq!(resolved(&ix), ["no backend in ext"]);
    assert!(ix.endpoint_addresses.is_empty());

    // A pod taking a slice's address is followed as for Endpoints.
    ix.apply_endpoint_slice(&slice(
        "ext-a",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [{"addresses": ["10.0.0.6"]}], "ports": [{"name": "sql", "port": 5432}]}),
    ));
    assert_eq!(resolved(&ix), ["external 10.0.0.6:5432"]);
    ix.apply_pod(&deployment_pod("db-h-2", "10.0.0.6", "db"), T);
    assert_eq!(resolved(&ix), ["workload db:5432"]);

    // A slice without the service-name label, or whose label moves to another Service, is no longer
    // this Service's.
    let orphan = slice(
        "ext-a",
        None,
        "IPv4",
        json!({"endpoints": [{"addresses": ["10.0.0.6"]}], "ports": [{"name": "sql", "port": 5432}]}),
    );
    assert!(ix.endpoint_slice_change(&orphan));
    ix.apply_endpoint_slice(&orphan);
    assert_eq!(resolved(&ix), ["no backend in ext"]);
    assert!(!ix.holds_endpoint_slice("ns", "ext-a"));

    // FQDN slices and slices without a numbered port publish nothing resolvable.
    let fqdn = slice(
        "ext-fqdn",
        Some("ext"),
        "FQDN",
        json!({"endpoints": [{"addresses": ["db.example.com"]}], "ports": [{"name": "sql", "port": 5432}]}),
    );
    let portless = slice(
        "ext-any",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [{"addresses": ["192.0.2.7"]}], "ports": [{"name": "sql"}]}),
    );
    for s in [&fqdn, &portless] {
        assert!(!ix.endpoint_slice_change(s));
        ix.apply_endpoint_slice(s);
    }
    assert_eq!(resolved(&ix), ["no backend in ext"]);
}

#[test]
fn terminating_endpoints_serve_a_port_only_when_it_has_no_ready_one() {
    let mut ix = Index::default();
    let ext: Service = serde_json::from_value(json!({
        "metadata": {"name": "ext", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.9", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}
    }))
    .unwrap();
    ix.apply_service(&ext);
    let terminating = json!({"ready": false, "serving": true, "terminating": true});
    let gone = json!({"ready": false, "serving": false, "terminating": true});
    ix.apply_endpoint_slice(&slice(
        "ext-1",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [
            {"addresses": ["192.0.2.1"], "conditions": {"ready": true}},
            {"addresses": ["192.0.2.2"], "conditions": terminating},
            {"addresses": ["192.0.2.3"], "conditions": gone}],
          "ports": [{"name": "a", "port": 8080}]}),
    ));
    ix.apply_endpoint_slice(&slice(
        "ext-2",
        Some("ext"),
        "IPv4",
        json!({"endpoints": [
            {"addresses": ["192.0.2.4"], "conditions": terminating},
            {"addresses": ["192.0.2.5"], "conditions": gone}],
          "ports": [{"name": "b", "port": 8081}]}),
    ));
    let at = |port| described(ix.resolve("10.96.0.9".parse().unwrap(), port, Protocol::TCP, T));
    // Port a has a ready endpoint: only it. Port b has none: its serving terminating endpoint.
    assert_eq!(at(80), ["external 192.0.2.1:8080"]);
    assert_eq!(at(81), ["external 192.0.2.4:8081"]);
}

#[test]
fn a_service_losing_or_gaining_its_selector_is_resolved_again_at_once() {
    let mut ix = Index::default();
    ix.apply_pod(&deployment_pod("db-h-1", "10.0.0.5", "db"), T);
    let with_selector: Service = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.9", "selector": {"app": "db"},
                 "ports": [{"name": "sql", "port": 5432}]}
    }))
    .unwrap();
    ix.apply_service(&with_selector);
    // The slices the EndpointSlice controller wrote for it, and one another controller adds.
    ix.apply_endpoint_slice(&slice(
        "db-x",
        Some("db"),
        "IPv4",
        json!({"endpoints": [{"addresses": ["10.0.0.5"]}, {"addresses": ["192.0.2.7"]}],
          "ports": [{"name": "sql", "port": 5432}]}),
    ));
    let resolved = |ix: &Index| {
        let mut all = described(ix.resolve("10.96.0.9".parse().unwrap(), 5432, Protocol::TCP, T));
        all.sort();
        all
    };
    assert_eq!(resolved(&ix), ["workload db:5432"], "through its pods");
    assert!(ix.endpoint_addresses.is_empty());
    // The selector is removed: what its slices publish, now, with no slice event.
    let mut without = with_selector.clone();
    without.spec.as_mut().unwrap().selector = None;
    ix.apply_service(&without);
    assert_eq!(
        resolved(&ix),
        ["external 192.0.2.7:5432", "workload db:5432"],
        "through its slices"
    );
    assert_eq!(ix.endpoint_addresses.len(), 2);
    // And back.
    ix.apply_service(&with_selector);
    assert_eq!(resolved(&ix), ["workload db:5432"]);
    assert!(ix.endpoint_addresses.is_empty());
    // Deleted, its slices stay (as for a Service not seen yet) until they go.
    ix.delete_service("ns", "db");
    assert_eq!(ix.endpoint_addresses.len(), 2);
    ix.delete_endpoint_slice("ns", "db-x");
    assert!(ix.endpoint_addresses.is_empty());
}
