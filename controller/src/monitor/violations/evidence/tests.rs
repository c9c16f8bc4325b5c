use super::*;
use crate::cluster::index::Opened;
use crate::ingest::evidence::{Evidence, EvidenceKind};
use crate::ingest::flow_record::{BadRecord, decode};
use k8s_openapi::jiff::Timestamp;
use network_enforcer_api::uplink::{self, FlowRecord};
use network_enforcer_api::{Direction, PolicyMode, Protocol};
use std::collections::BTreeMap;

/// The flows `record` stands for, as one evidence pass of its own sees them.
fn flows_of(
    index: &Index,
    view: &ClusterView,
    record: &FlowRecord,
    now: &Time,
) -> Result<Vec<ObservedFlow>, NoFlow> {
    let decoded = decode(record, index, None).unwrap();
    observed_flows(index, view, &mut WorkloadNames::default(), &decoded, now)
}

#[test]
fn a_huge_selector_is_cut_in_violation_records() {
    // A bare pod's selector is its labels: up to 256 KiB of them.
    let labels: BTreeMap<String, String> = (0..2_000)
        .map(|i| (format!("label-{i:04}"), "x".repeat(100)))
        .collect();
    let workload = WorkloadEndpoint {
        namespace: "n".into(),
        kind: None,
        name: "bare".into(),
        selector: labels,
        ..WorkloadEndpoint::default()
    };
    let named = workload_ref(&workload);
    assert_eq!(named.selector.chars().count(), MAX_SELECTOR_CHARS + 1);
    assert!(named.selector.starts_with("label-0000=xxx") && named.selector.ends_with('…'));
    assert_eq!(
        (named.owner_kind.as_str(), named.owner_name.as_str()),
        ("Pod", "bare")
    );
    let small = WorkloadEndpoint {
        selector: BTreeMap::from([("app".to_string(), "web".to_string())]),
        ..workload
    };
    assert_eq!(workload_ref(&small).selector, "app=web");
}

/// Deployment `n/name` as the index shares it among the workload's pods.
fn deployment(name: &str) -> Arc<WorkloadEndpoint> {
    Arc::new(WorkloadEndpoint {
        namespace: "n".into(),
        kind: Some(WorkloadKind::Deployment),
        name: name.into(),
        ..WorkloadEndpoint::default()
    })
}

#[test]
fn a_pass_names_each_workload_endpoint_once() {
    let (web, db) = (deployment("web"), deployment("db"));
    // An equal endpoint in another allocation (a pod of the workload indexed anew) is named by
    // value, never confused with a different one.
    let web_again = deployment("web");
    let mut names = WorkloadNames::default();
    let first = names.of(&web);
    assert!(Arc::ptr_eq(&first, &names.of(&web)), "built once");
    assert_eq!(*first, workload_ref(&web));
    assert_eq!(names.of(&db).owner_name, "db");
    assert_eq!(*names.of(&web_again), *first);
}

#[test]
fn names_outlive_a_pass_that_used_them_and_take_the_copy_the_history_holds() {
    let (web, db) = (deployment("web"), deployment("db"));
    let mut names = WorkloadNames::default();
    let (web_name, _) = (names.of(&web), names.of(&db));
    // The history holds an equal copy of web's name (from an earlier pass), none of db's.
    let held = Arc::new(workload_ref(&web));
    names.end_pass(|name| (*name == *held).then(|| Arc::clone(&held)));
    assert_eq!(names.len(), 2);
    assert!(Arc::ptr_eq(&names.of(&web), &held), "the history's copy");
    assert!(!Arc::ptr_eq(&names.of(&web), &web_name));
    // A pass that meets only web forgets db's name (and releases its endpoint).
    names.end_pass(|_| None);
    names.of(&web);
    names.end_pass(|_| None);
    assert_eq!(names.len(), 1);
    assert_eq!(Arc::strong_count(&db), 1);
    assert!(
        Arc::ptr_eq(&names.of(&web), &held),
        "kept from pass to pass"
    );
}

fn observation(second: i64, action: PolicyMode) -> Observation {
    Observation {
        timestamp: Time(Timestamp::from_second(1_800_000_000 + second).unwrap()),
        source: WorkloadRef {
            namespace: "n".into(),
            owner_kind: "Deployment".into(),
            owner_name: "client".into(),
            ..WorkloadRef::default()
        },
        dest: WorkloadRef {
            namespace: "n".into(),
            owner_kind: "Deployment".into(),
            owner_name: "server".into(),
            ..WorkloadRef::default()
        },
        protocol: Protocol::UDP,
        dst_port: Some(18081),
        action,
        direction: Direction::Egress,
        denying_policy_namespace: "n".into(),
        denying_policy_name: "p".into(),
    }
}

fn pod(
    name: &str,
    app: &str,
    sa: &str,
    ip: &str,
    host_network: bool,
) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "n", "uid": format!("uid-{name}"), "labels": {"app": app, "pod-template-hash": "5d8f7c9b6"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": format!("{app}-5d8f7c9b6"), "uid": "u", "controller": true}]},
            "spec": {"serviceAccountName": sa, "nodeName": "node-a", "hostNetwork": host_network,
                     "containers": [{"name": "main", "ports": [
                         {"name": "echo-udp", "containerPort": 18081, "protocol": "UDP"}]}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
}

fn cluster() -> (Index, ClusterView) {
    let mut index = Index::default();
    for p in [
        pod(
            "client-5d8f7c9b6-a",
            "client",
            "client-sa",
            "10.0.0.1",
            false,
        ),
        pod(
            "server-5d8f7c9b6-a",
            "server",
            "server-sa",
            "10.0.0.2",
            false,
        ),
        pod(
            "agent-5d8f7c9b6-a",
            "agent",
            "agent-sa",
            "192.168.1.1",
            true,
        ),
    ] {
        index.apply_pod(&p, 1_000);
    }
    for app in ["client", "server", "agent"] {
        let selector = serde_json::from_value(serde_json::json!({"matchLabels": {"app": app}}));
        index.apply_workload(
            "n",
            network_enforcer_api::WorkloadKind::Deployment,
            app,
            &format!("uid-{app}"),
            selector.unwrap(),
        );
    }
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "server", "namespace": "n"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "server"},
                 "ports": [{"port": 18083, "protocol": "UDP", "targetPort": "echo-udp"}]}
    }))
    .unwrap();
    index.apply_service(&svc);
    let view = ClusterView::from_index(&index, std::iter::empty(), std::iter::empty());
    (index, view)
}

fn sent(local: &str, peer: [u8; 4], port: u32, direction: uplink::Direction) -> FlowRecord {
    FlowRecord {
        local: Some(uplink::LocalPod {
            namespace: "n".into(),
            name: local.into(),
            uid: String::new(),
        }),
        peer_ip: peer.to_vec(),
        port,
        protocol: uplink::Protocol::Udp as i32,
        direction: direction as i32,
        outcome: uplink::Outcome::Datagram as i32,
        last_seen_ms: 1_800_000_000_000,
        ..FlowRecord::default()
    }
}

#[test]
fn records_become_flows_between_pods_on_container_ports() {
    let (index, view) = cluster();
    assert_eq!(view.pod_count(), 2, "hostNetwork pods are addresses");
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    let endpoints = |flows: Vec<ObservedFlow>| {
        flows
            .into_iter()
            .map(|f| (f.source.endpoint, f.destination.endpoint, f.port, f.seen_at))
            .collect::<Vec<_>>()
    };
    let client = Endpoint::Pod(PodKey::new("n", "client-5d8f7c9b6-a"));
    let server = Endpoint::Pod(PodKey::new("n", "server-5d8f7c9b6-a"));
    let seen = Time(Timestamp::from_millisecond(1_800_000_000_000).unwrap());
    // Through the Service: its backend pod, on the named target (container) port.
    let via_service = sent(
        "client-5d8f7c9b6-a",
        [10, 96, 0, 10],
        18083,
        uplink::Direction::Outbound,
    );
    let flows = flows_of(&index, &view, &via_service, &now).unwrap();
    assert_eq!(flows[0].source.workload.owner_name, "client");
    assert_eq!(flows[0].source.workload.owner_kind, "Deployment");
    assert_eq!(
        flows[0].source.workload.identity,
        "cluster.local/ns/n/sa/client-sa"
    );
    assert_eq!(flows[0].destination.workload.selector, "app=server");
    assert_eq!(
        endpoints(flows),
        [(client.clone(), server.clone(), 18081, seen.clone())]
    );
    // The server's agent saw the same datagram arrive: the same flow.
    let received = sent(
        "server-5d8f7c9b6-a",
        [10, 0, 0, 1],
        18081,
        uplink::Direction::Inbound,
    );
    assert_eq!(
        endpoints(flows_of(&index, &view, &received, &now).unwrap()),
        [(client.clone(), server.clone(), 18081, seen.clone())]
    );
    // Outside addresses and hostNetwork pods are bare IPs; a record without a time is "now".
    let mut outside = sent(
        "client-5d8f7c9b6-a",
        [1, 1, 1, 1],
        53,
        uplink::Direction::Outbound,
    );
    outside.last_seen_ms = 0;
    let flows = flows_of(&index, &view, &outside, &now).unwrap();
    assert_eq!(flows[0].destination.workload.address, "1.1.1.1");
    assert_eq!(
        endpoints(flows),
        [(
            client.clone(),
            Endpoint::Ip("1.1.1.1".parse().unwrap()),
            53,
            now.clone()
        )]
    );
    let host = sent(
        "client-5d8f7c9b6-a",
        [192, 168, 1, 1],
        9000,
        uplink::Direction::Outbound,
    );
    let flows = flows_of(&index, &view, &host, &now).unwrap();
    // hostNetwork pods share their node's address and never claim it in the index.
    assert_eq!(flows[0].destination.workload.address, "192.168.1.1");
    assert_eq!(
        flows[0].destination.endpoint,
        Endpoint::Ip("192.168.1.1".parse().unwrap())
    );
    // What cannot be resolved says why.
    let unknown = sent("gone", [10, 0, 0, 2], 1, uplink::Direction::Outbound);
    assert!(matches!(
        decode(&unknown, &index, None),
        Err(BadRecord::UnknownLocalPod(_))
    ));
    let mut bad = via_service.clone();
    bad.peer_ip = vec![1, 2, 3];
    assert_eq!(
        decode(&bad, &index, None).err(),
        Some(BadRecord::BadAddress(3))
    );
    let no_port = sent(
        "client-5d8f7c9b6-a",
        [10, 96, 0, 10],
        9999,
        uplink::Direction::Outbound,
    );
    assert!(matches!(
        flows_of(&index, &view, &no_port, &now),
        Err(NoFlow::ServiceWithoutBackends(..))
    ));
}

#[test]
fn an_outside_address_names_the_name_the_pod_resolved_it_from() {
    let (index, view) = cluster();
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    // (peer, the record's peer_name, direction) → the peer's side as a violation records it
    let cases = [
        (
            [203, 0, 113, 10],
            "api.example.test",
            uplink::Direction::Outbound,
            serde_json::json!({"address": "203.0.113.10", "dnsName": "api.example.test"}),
        ),
        // A literal nobody resolved: the address alone, as before names.
        (
            [203, 0, 113, 10],
            "",
            uplink::Direction::Outbound,
            serde_json::json!({"address": "203.0.113.10"}),
        ),
        // A name given for a pod is ignored: the pod is what the index says.
        (
            [10, 0, 0, 2],
            "server.example.test",
            uplink::Direction::Outbound,
            serde_json::json!({"namespace": "n", "ownerKind": "Deployment",
                    "ownerName": "server", "identity": "cluster.local/ns/n/sa/server-sa",
                    "selector": "app=server"}),
        ),
    ];
    let mut index = index;
    index.apply_node(
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-b"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.2"}]}
        }))
        .unwrap(),
    );
    // A node's address keeps the name: the agent's enforcement allows a name at any address of
    // an answer the pod asked for, so monitor judges it so (learning proposes the node as its
    // address, docs/behaviour.md §3.4).
    let node = (
        [192, 168, 1, 2],
        "node.example.test",
        uplink::Direction::Outbound,
        serde_json::json!({"address": "192.168.1.2", "dnsName": "node.example.test"}),
    );
    for (peer, name, direction, want) in cases.into_iter().chain([node]) {
        let mut record = sent("client-5d8f7c9b6-a", peer, 443, direction);
        record.peer_name = name.into();
        let flows = flows_of(&index, &view, &record, &now).unwrap();
        assert_eq!(
            serde_json::to_value(&*flows[0].destination.workload).unwrap(),
            want,
            "{peer:?} {name:?}"
        );
    }
    // An inbound record's name is none of the peer's (the agent names outbound peers only).
    let mut inbound = sent(
        "server-5d8f7c9b6-a",
        [203, 0, 113, 10],
        18081,
        uplink::Direction::Inbound,
    );
    inbound.peer_name = "api.example.test".into();
    let flows = flows_of(&index, &view, &inbound, &now).unwrap();
    assert_eq!(
        serde_json::to_value(&*flows[0].source.workload).unwrap(),
        serde_json::json!({"address": "203.0.113.10"})
    );
}

#[test]
fn a_call_through_a_service_without_a_selector_is_a_flow_to_its_endpoint() {
    let (mut index, view) = cluster();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.1"}]}
    }))
    .unwrap();
    index.apply_node(&node);
    let kubernetes: k8s_openapi::api::core::v1::Service =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]}
        }))
        .unwrap();
    index.apply_service(&kubernetes);
    let endpoints: k8s_openapi::api::core::v1::Endpoints =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "192.168.1.1"}],
                         "ports": [{"name": "https", "port": 6443}]}]
        }))
        .unwrap();
    index.apply_endpoints(&endpoints);
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    let mut call = sent(
        "client-5d8f7c9b6-a",
        [10, 96, 0, 1],
        443,
        uplink::Direction::Outbound,
    );
    call.protocol = uplink::Protocol::Tcp as i32;
    call.outcome = uplink::Outcome::Established as i32;
    let flows = flows_of(&index, &view, &call, &now).unwrap();
    assert_eq!(
        flows
            .iter()
            .map(|f| (f.destination.endpoint.clone(), f.port))
            .collect::<Vec<_>>(),
        [(Endpoint::Ip("192.168.1.1".parse().unwrap()), 6443)],
        "the API server's address and port, as after DNAT"
    );
    assert_eq!(flows[0].destination.workload.address, "192.168.1.1");
}

#[test]
fn a_host_network_service_backend_is_its_address() {
    let (mut index, view) = cluster();
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "agent", "namespace": "n"},
        "spec": {"clusterIP": "10.96.0.11", "selector": {"app": "agent"},
                 "ports": [{"port": 9000, "protocol": "UDP"}]}
    }))
    .unwrap();
    index.apply_service(&svc);
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    let call = sent(
        "client-5d8f7c9b6-a",
        [10, 96, 0, 11],
        9000,
        uplink::Direction::Outbound,
    );
    let flows = flows_of(&index, &view, &call, &now).unwrap();
    assert_eq!(
        flows
            .iter()
            .map(|f| (
                f.destination.endpoint.clone(),
                f.port,
                f.destination.workload.owner_name.as_str()
            ))
            .collect::<Vec<_>>(),
        [(Endpoint::Ip("192.168.1.1".parse().unwrap()), 9000, "agent")],
        "evaluated as its address (no NetworkPolicy applies to it), named by its workload"
    );
}

#[test]
fn only_blocked_evidence_waits_for_its_peer_and_what_it_came_to() {
    let (index, _) = cluster();
    let local = index.pod("n", "server-5d8f7c9b6-a").unwrap().clone();
    let evidence = |kind| Evidence {
        kind,
        record: Decoded {
            local: local.clone(),
            peer: "10.0.0.3".parse().unwrap(),
            peer_from: crate::ingest::flow_record::PeerFrom::Address,
            port: 8080,
            protocol: Protocol::TCP,
            opened: Opened::Inbound,
            at_ms: 1_000,
            peer_name: Default::default(),
        },
        waited_for_peer: false,
        claim: None,
    };
    // A connection that went through (or a datagram) is judged at once, as before.
    for (kind, waits) in [
        (EvidenceKind::Blocked, true),
        (EvidenceKind::WentThrough, false),
        (EvidenceKind::Sent, false),
    ] {
        assert_eq!(evidence(kind).may_wait_for_peer(), waits, "{kind:?}");
    }

    use WaitedOutcome::{startup_drop, unknown_address, violation};
    // (each flow: its peer is a workload, a policy records a violation) → the record's outcome
    type Flows = &'static [(bool, bool)];
    let cases: [(Flows, Option<WaitedOutcome>); 7] = [
        (&[], None),
        (&[(true, false)], Some(startup_drop)),
        (&[(true, true)], Some(violation)),
        (&[(false, true)], Some(unknown_address)),
        (&[(false, false)], Some(unknown_address)),
        // A Service's backends: one denied backend is a violation...
        (&[(true, false), (true, true)], Some(violation)),
        // ...and one still an address is the address.
        (&[(true, true), (false, false)], Some(unknown_address)),
    ];
    for (flows, expected) in cases {
        assert_eq!(
            WaitedOutcome::of(flows.iter().copied()),
            expected,
            "{flows:?}"
        );
    }
}

#[test]
fn repeats_count_once_per_window() {
    let mut filter = RepeatFilter::new(Duration::from_secs(60));
    assert!(filter.admit(&observation(0, PolicyMode::Monitor)));
    // The other endpoint's agent, a later window, a late record: the same occurrence.
    assert!(!filter.admit(&observation(0, PolicyMode::Monitor)));
    assert!(!filter.admit(&observation(59, PolicyMode::Monitor)));
    assert!(!filter.admit(&observation(-30, PolicyMode::Monitor)));
    // Another action is another violation.
    assert!(filter.admit(&observation(10, PolicyMode::Protect)));
    // A window after the counted one: counts again, and anchors the next window.
    assert!(filter.admit(&observation(60, PolicyMode::Monitor)));
    assert!(!filter.admit(&observation(100, PolicyMode::Monitor)));
    assert_eq!(filter.len(), 2);
    filter.forget_before((1_800_000_000 + 10 + 60) * 1000);
    assert_eq!(filter.len(), 1, "the protect key is a window old");
    filter.forget_before((1_800_000_000 + 200) * 1000);
    assert!(filter.is_empty());
}

#[test]
fn pending_observations_leave_only_when_committed() {
    let key = PolicyKey {
        namespace: "n".into(),
        name: "p".into(),
    };
    let mut pending = Pending::default();
    pending.push(key.clone(), observation(1, PolicyMode::Monitor));
    pending.push(key.clone(), observation(2, PolicyMode::Monitor));
    let (read, first) = pending.read(&key);
    assert_eq!(read.len(), 2);
    // A patch with `read` is in flight; another observation arrives; the patch fails.
    pending.push(key.clone(), observation(3, PolicyMode::Monitor));
    assert_eq!(pending.len_of(&key), 3, "a failed patch loses nothing");
    // Retried with all three; a fourth arrives meanwhile; the patch succeeds: only what it
    // contained is forgotten.
    let (read, second) = pending.read(&key);
    assert_eq!(read.len(), 3);
    pending.push(key.clone(), observation(4, PolicyMode::Monitor));
    pending.commit(&key, second);
    assert_eq!(pending.get(&key), vec![observation(4, PolicyMode::Monitor)]);
    // A stale read forgets nothing newer.
    pending.commit(&key, first);
    assert_eq!(pending.len_of(&key), 1);
    pending.commit(&key, pending.read(&key).1);
    assert_eq!(pending.len_of(&key), 0);
    assert_eq!(pending.policies().count(), 0);

    for i in 0..MAX_PENDING_PER_POLICY as i64 + 3 {
        pending.push(key.clone(), observation(i, PolicyMode::Monitor));
    }
    assert_eq!(pending.len_of(&key), MAX_PENDING_PER_POLICY);
    assert_eq!(pending.dropped(), 3);
    assert_eq!(
        pending.get(&key)[0].timestamp,
        observation(3, PolicyMode::Monitor).timestamp
    );
    assert_eq!(pending.retain_policies(|_| false), MAX_PENDING_PER_POLICY);
}

#[test]
fn an_overflow_during_a_patch_forgets_only_what_the_patch_held() {
    let key = PolicyKey {
        namespace: "n".into(),
        name: "p".into(),
    };
    let mut pending = Pending::default();
    for i in 0..MAX_PENDING_PER_POLICY as i64 {
        pending.push(key.clone(), observation(i, PolicyMode::Monitor));
    }
    let (read, mark) = pending.read(&key);
    // While the patch is in flight, 5 newer observations push the 5 oldest out.
    let newer: Vec<_> = (0..5)
        .map(|i| observation(1_000_000 + i, PolicyMode::Monitor))
        .collect();
    for o in &newer {
        pending.push(key.clone(), o.clone());
    }
    pending.commit(&key, mark);
    assert_eq!(read.len(), MAX_PENDING_PER_POLICY);
    assert_eq!(
        pending.get(&key),
        newer,
        "the observations that arrived during the patch wait for the next one"
    );
}

/// Learning and evidence share one resolution ([`Index::flows`]): for every kind of peer, the
/// flows evidence judges are the flows learning learns, end for end.
#[test]
fn learning_and_evidence_place_a_record_alike() {
    let (index, view) = cluster();
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    // The workload (or address) each end is, as both name it.
    let of_learning = |end: &index::FlowEnd| match end {
        index::FlowEnd::Workload(w) | index::FlowEnd::HostNetwork { workload: w, .. } => {
            w.name.clone()
        }
        index::FlowEnd::Node { ip, .. } | index::FlowEnd::External(ip) => ip.to_string(),
    };
    let of_evidence = |side: &FlowSide| match side.workload.owner_name.as_str() {
        "" => side.workload.address.clone(),
        name => name.to_string(),
    };
    use uplink::Direction::{Inbound, Outbound};
    let (client, server, agent) = (
        "client-5d8f7c9b6-a",
        "server-5d8f7c9b6-a",
        "agent-5d8f7c9b6-a",
    );
    // (local pod, peer, port, direction): via a Service, to a pod, from a pod, to an outside
    // address, to a host-network address, from a host-network pod, from a host-network address.
    let records = [
        (client, [10, 96, 0, 10], 18083, Outbound),
        (client, [10, 0, 0, 2], 18081, Outbound),
        (server, [10, 0, 0, 1], 18081, Inbound),
        (client, [203, 0, 113, 1], 443, Outbound),
        (client, [192, 168, 1, 1], 9000, Outbound),
        (agent, [10, 0, 0, 2], 18081, Outbound),
        (server, [192, 168, 1, 1], 18081, Inbound),
    ];
    for (local, peer, port, direction) in records {
        let mut record = sent(local, peer, port, direction);
        record.peer_name = "api.example.test".into();
        let decoded = decode(&record, &index, None).unwrap();
        let obs = crate::learn::ReportedConnection::of(&decoded, crate::learn::Reporter::Node);
        let learned: Vec<_> = crate::learn::flows(&index, &obs)
            .unwrap()
            .iter()
            .map(|f| {
                let name = f.peer_name.as_deref().map(str::to_string);
                (
                    of_learning(&f.source),
                    of_learning(&f.destination),
                    f.port,
                    name,
                )
            })
            .collect();
        let judged: Vec<_> =
            observed_flows(&index, &view, &mut WorkloadNames::default(), &decoded, &now)
                .unwrap()
                .iter()
                .map(|f| {
                    let name = f.peer_name.as_deref().map(str::to_string);
                    (
                        of_evidence(&f.source),
                        of_evidence(&f.destination),
                        f.port,
                        name,
                    )
                })
                .collect();
        assert!(!learned.is_empty(), "{local} {peer:?}");
        assert_eq!(learned, judged, "{local} {peer:?} {direction:?}");
    }
}

/// A pod recreated on the host network under its old name keeps, for records within the IP history,
/// its former address's lease (the index moves the name's newest record there): such a peer is judged
/// as host-network pods are, by its address.
#[test]
fn a_pod_now_on_the_host_network_is_judged_by_its_address() {
    let (mut index, view) = cluster();
    index.apply_pod(
        &pod("web-5d8f7c9b6-a", "web", "web-sa", "10.0.0.9", false),
        1_000,
    );
    index.apply_pod(
        &pod("web-5d8f7c9b6-a", "web", "web-sa", "192.168.1.7", true),
        2_000,
    );
    let mut record = sent(
        "client-5d8f7c9b6-a",
        [10, 0, 0, 9],
        18081,
        uplink::Direction::Outbound,
    );
    record.last_seen_ms = 1_500;
    let now = Time(Timestamp::from_second(1_900_000_000).unwrap());
    let flows = flows_of(&index, &view, &record, &now).unwrap();
    assert_eq!(
        flows[0].destination.endpoint,
        Endpoint::Ip("192.168.1.7".parse().unwrap())
    );
    assert_eq!(flows[0].destination.workload.owner_name, "web");
}
