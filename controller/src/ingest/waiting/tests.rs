use super::*;
use crate::ingest::evidence::EvidenceKind;
use crate::ingest::flow_record::{Decoded, PeerFrom};
use k8s_openapi::api::core::v1::Pod;
use network_enforcer_api::uplink::LocalPod;

fn pod(name: &str, ip: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                     "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    }))
    .unwrap()
}

/// The index with the `api` pod (10.0.0.2) on node-a.
fn index_with_api() -> Index {
    let mut index = Index::default();
    index.apply_pod(&pod("api", "10.0.0.2", Some("node-a")), 0);
    index
}

fn waiting(grace_ms: i64) -> Waiting {
    Waiting::new(grace_ms, Vec::new(), WaitMetrics::default())
}

const COUNTS: Counts<'static> = Counts {
    counts: true,
    gate: None,
};

/// A record of the local pod `name`.
fn record(name: &str) -> FlowRecord {
    FlowRecord {
        local: Some(LocalPod {
            namespace: "shop".into(),
            name: name.into(),
            uid: String::new(),
        }),
        peer_ip: vec![10, 0, 0, 9],
        port: 8080,
        ..FlowRecord::default()
    }
}

fn names(records: &[(Early, bool)]) -> Vec<(&str, bool)> {
    records
        .iter()
        .map(|(e, placed)| (e.record.local.as_ref().unwrap().name.as_str(), *placed))
        .collect()
}

/// A connection to the `api` pod of `index` from `peer`, seen at `at_ms`.
fn inbound_from(index: &Index, peer: &str, at_ms: i64) -> ReportedConnection {
    ReportedConnection {
        local: index.pod("shop", "api").expect("indexed").clone(),
        peer: peer.parse().unwrap(),
        port: 8080,
        protocol: Protocol::TCP,
        opened: Opened::Inbound,
        at_ms,
        reporter: Reporter::Node,
        peer_name: Default::default(),
    }
}

/// `obs` as violation evidence of `kind`, as ingest hands it on.
fn evidence_of(obs: &ReportedConnection, kind: EvidenceKind) -> Evidence {
    Evidence {
        kind,
        record: Decoded {
            local: obs.local.clone(),
            peer: obs.peer,
            peer_from: PeerFrom::Address,
            port: obs.port,
            protocol: obs.protocol,
            opened: obs.opened,
            at_ms: obs.at_ms,
            peer_name: Default::default(),
        },
        waited_for_peer: false,
        claim: None,
    }
}

fn peer_of(flows: &Result<Flows, NoFlow>) -> FlowEnd {
    flows.as_ref().unwrap()[0].source.flow_end()
}

#[test]
fn a_record_waits_until_its_pod_is_known_with_a_node_or_its_grace_is_over() {
    let waiting = waiting(30_000);
    for name in ["web-1", "web-2", "never"] {
        let until = waiting.record("node-a", Reporter::Node, &record(name), 1_000, COUNTS);
        assert_eq!(until, Ok(31_000));
    }
    let mut index = Index::default();
    // Known, but not bound to a node yet: still waits.
    index.apply_pod(&pod("web-1", "10.0.0.7", None), 2_000);
    assert_eq!(
        waiting.take_decided(&index, 2_000, Look::Flush),
        Decided::default()
    );
    assert_eq!(waiting.len(), 3);
    index.apply_pod(&pod("web-1", "10.0.0.7", Some("node-a")), 3_000);
    // On another node: no longer waits either (it is refused when taken in).
    index.apply_pod(&pod("web-2", "10.0.0.8", Some("node-b")), 3_000);
    let decided = waiting.take_decided(&index, 3_000, Look::Flush);
    assert_eq!(names(&decided.records), [("web-1", true), ("web-2", true)]);
    assert_eq!(
        decided.records[0].0.arrived_ms, 1_000,
        "taken in as of its arrival"
    );
    assert_eq!(
        &*decided.records[0].0.node, "node-a",
        "from the node that sent it"
    );
    assert_eq!(waiting.len(), 1);
    assert!(
        waiting
            .take_decided(&index, 30_999, Look::Flush)
            .records
            .is_empty()
    );
    let decided = waiting.take_decided(&index, 31_000, Look::Flush);
    assert_eq!(names(&decided.records), [("never", false)]);
    assert!(waiting.is_empty());
    let counted = |outcome| waiting.metrics.get(WaiterLabel::record, outcome);
    assert_eq!(
        [
            WaitOutcome::waits,
            WaitOutcome::placed,
            WaitOutcome::expired
        ]
        .map(counted),
        [3, 2, 1]
    );
    assert_eq!(waiting.metrics.waiting(WaiterLabel::record).get(), 0);
}

/// A connection to the `api` pod from the `n`th address of 10.1.0.0/16 and beyond: distinct
/// observations, none of them a pod.
fn from_nowhere(index: &Index, n: usize) -> ReportedConnection {
    let peer = std::net::Ipv4Addr::from(0x0a01_0000 + n as u32).to_string();
    inbound_from(index, &peer, 0)
}

#[test]
fn nothing_waits_without_a_grace_too_large_or_past_a_bound() {
    let r = record("web-1");
    assert_eq!(
        waiting(0).record("a", Reporter::Node, &r, 0, COUNTS),
        Err(NoWait::Needless)
    );
    let waiting = waiting(1);
    let mut big = r.clone();
    big.local.as_mut().unwrap().name = "x".repeat(MAX_RECORD_BYTES);
    assert_eq!(
        waiting.record("a", Reporter::Node, &big, 0, COUNTS),
        Err(NoWait::TooLarge)
    );
    // Records fill their own bound (here all from one node, which fills its share too)...
    for _ in 0..MAX_WAITING_RECORDS {
        assert!(waiting.record("a", Reporter::Node, &r, 0, COUNTS).is_ok());
    }
    assert_eq!(
        waiting.record("b", Reporter::Node, &r, 0, COUNTS),
        Err(NoWait::Full)
    );
    // ... and past its share a node's observations are decided at once, another node's wait.
    let index = index_with_api();
    assert!(matches!(
        waiting.observation(&index, "a", &from_nowhere(&index, 0), 0),
        Admitted::Now(Ok(_))
    ));
    let mut n = 0;
    while waiting.len() < MAX_WAITING {
        n += 1;
        let node = format!("n{}", n / MAX_WAITING_PER_NODE);
        let obs = from_nowhere(&index, n);
        assert!(matches!(
            waiting.observation(&index, &node, &obs, 0),
            Admitted::Waits(_)
        ));
    }
    // The whole queue is full: observations and evidence are decided at once.
    let obs = from_nowhere(&index, n + 1);
    assert!(matches!(
        waiting.observation(&index, "z", &obs, 0),
        Admitted::Now(Ok(_))
    ));
    let blocked = evidence_of(&obs, EvidenceKind::Blocked);
    assert_eq!(
        waiting.evidence(&index, "z", Reporter::Node, blocked.clone(), 0),
        Ok(blocked),
        "handed on unchanged"
    );
    let full = |waiter| waiting.metrics.get(waiter, WaitOutcome::full);
    assert_eq!(
        [
            WaiterLabel::record,
            WaiterLabel::observation,
            WaiterLabel::evidence
        ]
        .map(full),
        [1, 2, 1]
    );
    // A batch's look decides only records; their room is given back.
    let decided = waiting.take_decided(&Index::default(), 1, Look::Batch);
    assert_eq!(decided.records.len(), MAX_WAITING_RECORDS);
    assert!(decided.observations.is_empty(), "they wait for the flush");
    assert_eq!(waiting.len(), MAX_WAITING - MAX_WAITING_RECORDS);
    assert!(waiting.record("a", Reporter::Node, &r, 1, COUNTS).is_ok());
    assert_eq!(
        waiting.metrics.waiting(WaiterLabel::record).get(),
        1,
        "the gauge follows"
    );
    // The flush decides the rest.
    let decided = waiting.take_decided(&index, 2, Look::Flush);
    assert_eq!(
        decided.observations.len(),
        MAX_WAITING - MAX_WAITING_RECORDS
    );
    assert!(waiting.is_empty());
}

#[test]
fn one_node_cannot_take_the_room_of_the_others_with_peers_that_never_come() {
    let index = index_with_api();
    let waiting = waiting(30_000);
    // A hostile or broken agent reports connections from addresses no pod will ever have.
    for i in 0..MAX_WAITING_PER_NODE {
        let peer = std::net::Ipv4Addr::from(0x0a01_0000 + i as u32).to_string();
        let obs = inbound_from(&index, &peer, 0);
        assert!(matches!(
            waiting.observation(&index, "hostile", &obs, 0),
            Admitted::Waits(_)
        ));
    }
    let next = inbound_from(&index, "10.2.0.1", 0);
    assert!(
        matches!(
            waiting.observation(&index, "hostile", &next, 0),
            Admitted::Now(_)
        ),
        "its share is full"
    );
    // Another node's new pod still waits for the index; so do a cluster source's records filed
    // under the hostile node: they have a share of their own.
    let honest = inbound_from(&index, "10.0.0.3", 0);
    assert_eq!(
        waiting.observation(&index, "node-a", &honest, 0),
        Admitted::Waits(30_000)
    );
    let from_goldmane = ReportedConnection {
        reporter: Reporter::Cluster,
        ..next
    };
    assert_eq!(
        waiting.observation(&index, "hostile", &from_goldmane, 0),
        Admitted::Waits(30_000)
    );
}

#[test]
fn one_thread_settles_at_a_time_and_a_batch_does_not_wait_for_it() {
    let waiting = waiting(1);
    let held = waiting.settling(false).expect("nobody settles yet");
    assert!(waiting.settling(false).is_none(), "a batch's look skips");
    std::thread::scope(|s| {
        let flush = s.spawn(|| waiting.settling(true).is_some());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !flush.is_finished(),
            "a flush waits until what was taken out is decided"
        );
        drop(held);
        assert!(flush.join().unwrap());
    });
}

#[test]
fn batches_look_at_most_every_retry_interval_and_only_when_some_wait() {
    let waiting = waiting(30_000);
    assert!(!waiting.due(1_000), "nothing waits");
    let index = index_with_api();
    waiting.observation(&index, "a", &inbound_from(&index, "10.0.0.3", 0), 0);
    assert!(
        !waiting.due(1_000),
        "observations wait for the flush, not for a batch's look"
    );
    waiting
        .record("a", Reporter::Node, &record("web-1"), 1_000, COUNTS)
        .unwrap();
    assert!(waiting.due(1_000));
    assert!(!waiting.due(1_000 + RETRY_EVERY_MS - 1));
    assert!(waiting.due(1_000 + RETRY_EVERY_MS));
}

#[test]
fn a_pod_peer_the_index_learns_late_is_learned_as_that_pod_not_as_an_address() {
    let mut index = index_with_api();
    let waiting = waiting(30_000);
    let obs = inbound_from(&index, "10.0.0.3", 1_000);
    assert_eq!(
        waiting.observation(&index, "node-a", &obs, 1_000),
        Admitted::Waits(31_000),
        "an address that is no pod yet waits"
    );
    assert_eq!(waiting.len(), 1);
    // Nothing changed yet: it keeps waiting.
    assert!(
        waiting
            .take_decided(&index, 2_000, Look::Flush)
            .observations
            .is_empty()
    );
    assert_eq!(waiting.len(), 1);
    // The frontend's IP reaches the index.
    index.apply_pod(&pod("frontend", "10.0.0.3", Some("node-a")), 3_000);
    let d = waiting.take_decided(&index, 4_000, Look::Flush);
    assert_eq!(d.observations.len(), 1);
    match peer_of(&d.observations[0].1) {
        FlowEnd::Workload(w) => assert_eq!(w.name, "frontend"),
        other => panic!("expected the frontend pod, got {other:?}"),
    }
    assert!(waiting.is_empty());
    assert_eq!(
        waiting
            .metrics
            .get(WaiterLabel::observation, WaitOutcome::placed),
        1
    );
}

#[test]
fn blocked_evidence_waits_for_its_peer_in_the_same_queue_and_comes_back_marked() {
    let mut index = index_with_api();
    index.apply_pod(&pod("known", "10.0.0.4", Some("node-a")), 0);
    let waiting = waiting(30_000);
    let blocked = |peer| evidence_of(&inbound_from(&index, peer, 1_000), EvidenceKind::Blocked);
    // (evidence, waits)
    let cases = [
        (blocked("10.0.0.3"), true),
        (blocked("10.0.0.5"), true),
        // A known pod is judged at once; so is a connection that went through.
        (blocked("10.0.0.4"), false),
        (
            evidence_of(
                &inbound_from(&index, "10.0.0.3", 1_000),
                EvidenceKind::WentThrough,
            ),
            false,
        ),
    ];
    for (evidence, waits) in cases {
        let now = waiting.evidence(&index, "node-a", Reporter::Node, evidence.clone(), 1_000);
        assert_eq!(now.is_err(), waits, "{evidence:?}");
        if let Ok(now) = now {
            assert_eq!(now, evidence, "handed on unchanged");
        }
    }
    assert_eq!(waiting.len(), 2);
    // With no grace nothing waits.
    assert!(
        self::waiting(0)
            .evidence(&index, "node-a", Reporter::Node, blocked("10.0.0.3"), 1_000)
            .is_ok()
    );

    // 10.0.0.3 becomes a pod; 10.0.0.5 does not, within the grace.
    index.apply_pod(&pod("frontend", "10.0.0.3", Some("node-a")), 3_000);
    let d = waiting.take_decided(&index, 4_000, Look::Flush);
    assert!(d.observations.is_empty(), "evidence is not learned");
    assert_eq!(d.evidence.len(), 1);
    assert_eq!(d.evidence[0].record.peer.to_string(), "10.0.0.3");
    assert!(d.evidence[0].waited_for_peer);
    let d = waiting.take_decided(&index, 31_000, Look::Flush);
    assert_eq!(d.evidence[0].record.peer.to_string(), "10.0.0.5");
    assert!(waiting.is_empty());
    let counted = |outcome| waiting.metrics.get(WaiterLabel::evidence, outcome);
    assert_eq!(
        [
            WaitOutcome::waits,
            WaitOutcome::placed,
            WaitOutcome::expired
        ]
        .map(counted),
        [2, 1, 1]
    );
}

#[test]
fn a_real_external_address_is_learned_once_the_grace_is_over() {
    let index = index_with_api();
    let waiting = waiting(30_000);
    let obs = inbound_from(&index, "203.0.113.9", 0);
    assert_eq!(
        waiting.observation(&index, "node-a", &obs, 0),
        Admitted::Waits(30_000)
    );
    assert!(
        waiting
            .take_decided(&index, 29_999, Look::Flush)
            .observations
            .is_empty()
    );
    let d = waiting.take_decided(&index, 30_000, Look::Flush);
    assert_eq!(
        peer_of(&d.observations[0].1),
        FlowEnd::External("203.0.113.9".parse().unwrap())
    );
    assert_eq!(
        waiting
            .metrics
            .get(WaiterLabel::observation, WaitOutcome::expired),
        1
    );
}

#[test]
fn pods_known_at_once_never_wait_and_no_grace_means_no_waiting() {
    let mut index = index_with_api();
    index.apply_pod(&pod("frontend", "10.0.0.3", Some("node-a")), 0);
    let waits = waiting(30_000);
    let known = inbound_from(&index, "10.0.0.3", 0);
    assert!(matches!(
        waits.observation(&index, "node-a", &known, 0),
        Admitted::Now(Ok(_))
    ));
    let never = waiting(0);
    let outside = inbound_from(&index, "203.0.113.9", 0);
    assert!(matches!(
        never.observation(&index, "node-a", &outside, 0),
        Admitted::Now(Ok(_))
    ));
    assert!(waits.is_empty() && never.is_empty());
}

#[test]
fn with_cluster_cidrs_only_addresses_inside_them_wait() {
    let index = index_with_api();
    let waiting = Waiting::new(
        30_000,
        vec![
            "10.0.0.0/16".parse().unwrap(),
            "10.96.0.0/12".parse().unwrap(),
        ],
        WaitMetrics::default(),
    );
    // Outside the cluster's ranges: no pod or Service can have it, learned at once.
    let outside = inbound_from(&index, "203.0.113.9", 0);
    let Admitted::Now(flows) = waiting.observation(&index, "node-a", &outside, 0) else {
        panic!("learned at once");
    };
    assert_eq!(
        peer_of(&flows),
        FlowEnd::External("203.0.113.9".parse().unwrap())
    );
    // Inside a pod range or the Service range: a pod or Service not listed yet may have it.
    for peer in ["10.0.0.3", "10.96.7.7"] {
        let obs = inbound_from(&index, peer, 0);
        assert!(
            matches!(
                waiting.observation(&index, "node-a", &obs, 0),
                Admitted::Waits(_)
            ),
            "{peer} must wait"
        );
    }
    assert_eq!(waiting.len(), 2);
}

#[test]
fn a_repeat_of_a_waiting_observation_waits_in_its_place() {
    let index = index_with_api();
    let waiting = waiting(30_000);
    let obs = inbound_from(&index, "10.0.0.3", 0);
    assert_eq!(
        waiting.observation(&index, "node-a", &obs, 0),
        Admitted::Waits(30_000)
    );
    // Every flush of its agent sends it again while the connection lasts.
    for at in 1..1_000 {
        let again = ReportedConnection {
            at_ms: at,
            ..obs.clone()
        };
        assert_eq!(
            waiting.observation(&index, "node-a", &again, at),
            Admitted::Repeat(at + 30_000)
        );
    }
    assert_eq!(waiting.len(), 1, "one place for one observation");
    // Another port, another reporter: not repeats.
    let other_port = ReportedConnection {
        port: 9090,
        ..obs.clone()
    };
    let other_reporter = ReportedConnection {
        reporter: Reporter::Cluster,
        ..obs.clone()
    };
    for other in [other_port, other_reporter] {
        assert_eq!(
            waiting.observation(&index, "node-a", &other, 1_000),
            Admitted::Waits(31_000)
        );
    }
    assert_eq!(waiting.len(), 3);
    // Decided once; after that it waits anew.
    let d = waiting.take_decided(&index, 30_000, Look::Flush);
    assert_eq!(d.observations.len(), 1);
    assert_eq!(
        waiting.observation(&index, "node-a", &obs, 30_000),
        Admitted::Waits(60_000)
    );
    assert_eq!(
        waiting
            .metrics
            .get(WaiterLabel::observation, WaitOutcome::repeat),
        999
    );
}
