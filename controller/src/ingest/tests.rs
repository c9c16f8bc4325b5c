use super::auth::reviewed_agent;
use super::*;
use network_enforcer_api::uplink::LocalPod;
use serde_json::json;
use std::collections::BTreeSet;

fn index_with_pod(node: &str) -> Index {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-web-1"},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running", "podIP": "10.0.0.7"}
    }))
    .unwrap();
    let mut index = Index::default();
    index.apply_pod(&pod, 1_000);
    index
}

/// The controller as tests of ingest need it: `index`, observations waiting up to `grace_ms`
/// for it, accepted records handed to `evidence`.
fn app_with(
    index: Index,
    grace_ms: i64,
    evidence: Arc<dyn crate::ingest::evidence::EvidenceSink>,
) -> crate::app::App {
    crate::app::App::builder(
        network_enforcer_tests::fixture::offline_client(),
        network_enforcer_api::Backend::Kubernetes,
    )
    .index(Arc::new(SharedIndex::listed(index)))
    .resolution_grace(grace_ms)
    .evidence_sink(evidence)
    .build()
}

fn record(namespace: &str, name: &str, uid: &str) -> FlowRecord {
    FlowRecord {
        local: Some(LocalPod {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }),
        peer_ip: vec![10, 0, 0, 9],
        port: 8080,
        protocol: uplink::Protocol::Tcp as i32,
        direction: uplink::Direction::Outbound as i32,
        outcome: uplink::Outcome::Established as i32,
        last_seen_ms: 2_000,
        ..FlowRecord::default()
    }
}

#[tokio::test]
async fn a_record_that_does_not_decode_is_refused_alone() {
    let app = crate::app::App::builder(
        network_enforcer_tests::fixture::offline_client(),
        network_enforcer_api::Backend::Kubernetes,
    )
    .index(Arc::new(SharedIndex::listed(index_with_pod("node-a"))))
    .build();
    let good = prost::bytes::Bytes::from(record("shop", "web-1", "").encode_to_vec());
    // Field 1 (the local pod) announces 100 bytes and ends after one.
    let truncated = prost::bytes::Bytes::from_static(&[0x0a, 100, 0]);
    let batch = encoded::FlowBatch {
        sequence: 7,
        node: "node-a".into(),
        instance: 1,
        health: None,
        records: vec![good.clone(), truncated, good],
    };
    let (ack, _) = app.learning.take_in("node-a", &batch);
    assert_eq!((ack.sequence, ack.accepted, ack.rejected), (7, 2, 1));
    assert!(
        ack.reason.starts_with("record is not a valid FlowRecord"),
        "{}",
        ack.reason
    );
    let text = app.learner.metrics().encode();
    assert!(
        text.contains("records_rejected_total{reason=\"malformed\"} 1"),
        "{text}"
    );
}

/// The evidence pass judges what ingest read from a record (its local pod, the address standing
/// for its peer), not a copy of the record: a record refused here, or one that says nothing about
/// its flow, is not queued.
#[tokio::test]
async fn accepted_records_reach_the_evidence_queue_as_ingest_read_them() {
    use crate::ingest::evidence::EvidenceKind;
    let queue = Arc::new(crate::monitor::status_sync::EvidenceQueue::default());
    let app = app_with(index_with_pod("node-a"), 0, queue.clone());
    let with = |uid: &str, outcome: uplink::Outcome| FlowRecord {
        outcome: outcome as i32,
        ..record("", "", uid)
    };
    let batch = FlowBatch {
        sequence: 3,
        node: "node-a".into(),
        instance: 1,
        health: None,
        records: vec![
            with("uid-web-1", uplink::Outcome::Established),
            with("uid-web-1", uplink::Outcome::Unspecified),
            with("uid-elsewhere", uplink::Outcome::Established),
            with("uid-web-1", uplink::Outcome::Failed),
        ],
    };
    let ack = app.learning.accept("node-a", &batch);
    assert_eq!((ack.accepted, ack.rejected), (3, 1), "{}", ack.reason);
    let queued: Vec<_> = queue
        .drain()
        .into_iter()
        .map(|e| {
            let r = e.record;
            (
                e.kind,
                r.local.name.clone(),
                r.peer,
                r.port,
                r.opened,
                r.at_ms,
            )
        })
        .collect();
    let peer = std::net::IpAddr::from([10, 0, 0, 9]);
    let web_1 = |kind| {
        let opened = crate::cluster::index::Opened::Outbound;
        (kind, "web-1".to_string(), peer, 8080, opened, 2_000)
    };
    assert_eq!(
        queued,
        vec![
            web_1(EvidenceKind::WentThrough),
            web_1(EvidenceKind::Blocked)
        ]
    );
}

/// A labelled pod `name` at `ip` on `node`.
fn pod_on(name: &str, ip: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                     "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running", "podIP": ip}
    }))
    .unwrap()
}

/// `batch` as it comes off an agent's stream.
fn encoded_batch(sequence: u64, node: &str, records: &[FlowRecord]) -> encoded::FlowBatch {
    encoded::FlowBatch {
        sequence,
        node: node.into(),
        instance: 1,
        health: None,
        records: records
            .iter()
            .map(|r| prost::bytes::Bytes::from(r.encode_to_vec()))
            .collect(),
    }
}

/// The controller's watch can deliver a pod after its agent reported its first connections:
/// those records wait for it (within the resolution grace) instead of being refused, so they
/// are learned and judged once it comes.
#[tokio::test]
async fn records_that_arrive_before_their_pod_wait_for_it() {
    use crate::ingest::evidence::EvidenceKind;
    let queue = Arc::new(crate::monitor::status_sync::EvidenceQueue::default());
    let mut index = index_with_pod("node-a");
    // The peer every record names (10.0.0.9).
    index.apply_pod(&pod_on("api", "10.0.0.9", "node-a"), 1_000);
    let app = app_with(index, 30_000, queue.clone());
    let failed = FlowRecord {
        outcome: uplink::Outcome::Failed as i32,
        ..record("shop", "web-2", "")
    };
    let records = [
        record("shop", "web-2", ""),
        failed,
        record("shop", "web-3", ""),
        record("shop", "never", ""),
    ];
    let (ack, holds) = app
        .learning
        .take_in("node-a", &encoded_batch(5, "node-a", &records));
    assert_eq!((ack.accepted, ack.rejected), (4, 0), "{}", ack.reason);
    assert!(
        holds.evidence_later && !holds.proposals.is_nothing(),
        "{holds:?}"
    );
    assert_eq!(app.learning.waiting.len(), 4);
    assert_eq!(app.learner.pending_proposals(), 0);
    assert!(queue.drain().is_empty());

    // web-2 reaches the index on the node that reported it, web-3 on another node.
    {
        let mut index = app.index.index.write().unwrap();
        index.apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 2_000);
        index.apply_pod(&pod_on("web-3", "10.0.0.10", "node-b"), 2_000);
    }
    let now = crate::cluster::watches::now_ms();
    app.learning.settle(
        &app.index.index.read().unwrap(),
        now,
        crate::ingest::waiting::Look::Flush,
    );
    assert_eq!(app.learning.waiting.len(), 1, "only `never` still waits");
    // web-2's egress and api's ingress.
    assert_eq!(app.learner.pending_proposals(), 2);
    let kinds: Vec<_> = queue
        .drain()
        .into_iter()
        .map(|e| (e.kind, e.record.local.name.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (EvidenceKind::WentThrough, "web-2".to_string()),
            (EvidenceKind::Blocked, "web-2".to_string())
        ]
    );
    // The grace runs out for the pod that never comes.
    app.learning.settle(
        &app.index.index.read().unwrap(),
        now + 30_001,
        crate::ingest::waiting::Look::Flush,
    );
    assert!(app.learning.waiting.is_empty());
    let text = app.learner.metrics().encode();
    for line in [
        "records_rejected_total{reason=\"not_on_node\"} 1",
        "records_rejected_total{reason=\"unknown_local_pod\"} 1",
        "waits_total{waiter=\"record\",outcome=\"waits\"} 4",
        // web-2's two records, and web-3's (placed on another node, then refused).
        "waits_total{waiter=\"record\",outcome=\"placed\"} 3",
        "waits_total{waiter=\"record\",outcome=\"expired\"} 1",
        "waiting{waiter=\"record\"} 0",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// Evidence whose marks can be settled by hand.
#[derive(Default)]
struct Marks {
    handed: std::sync::atomic::AtomicU64,
    taken: std::sync::atomic::AtomicU64,
    settled: std::sync::atomic::AtomicU64,
}

impl crate::ingest::evidence::EvidenceSink for Marks {
    fn accepted(&self, _: Evidence) {
        self.handed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn hold(&self) -> Option<u64> {
        Some(self.taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
    }
    fn settled_after(&self, mark: u64) -> bool {
        self.settled.load(std::sync::atomic::Ordering::SeqCst) > mark
    }
}

/// A batch whose records waited for their pod is acknowledged once its wait is over and a flush
/// wrote what they taught, and then only once the evidence they gave (handed in after the batch
/// was merged) is in statuses: an agent forgets what was acknowledged.
/// A record whose peer the index cannot place yet is learned once it can; its batch's
/// acknowledgement waits until then, and a repeat's too (it waits in the first one's place).
#[tokio::test]
async fn a_record_whose_peer_waits_holds_its_acknowledgement_and_a_repeat_s_too() {
    let queue = Arc::new(crate::monitor::status_sync::EvidenceQueue::default());
    let mut index = index_with_pod("node-a");
    index.apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 1_000);
    let app = app_with(index, 30_000, queue);
    // web-2's connection to 10.0.0.9, which is no pod yet.
    let web_2 = [record("shop", "web-2", "")];
    let (ack, holds) = app
        .learning
        .take_in("node-a", &encoded_batch(1, "node-a", &web_2));
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    assert!(!holds.proposals.is_nothing(), "{holds:?}");
    let (_, repeat) = app
        .learning
        .take_in("node-a", &encoded_batch(2, "node-a", &web_2));
    assert!(
        !repeat.proposals.is_nothing(),
        "a repeat waits as long: {repeat:?}"
    );
    assert_eq!(app.learning.waiting.len(), 1, "in the first one's place");
    assert_eq!(app.learner.pending_proposals(), 0, "nothing learned yet");
    // The api pod gets 10.0.0.9: learned as that pod, both sides.
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&pod_on("api", "10.0.0.9", "node-a"), 3_000);
    let now = crate::cluster::watches::now_ms();
    app.learning.settle(
        &app.index.index.read().unwrap(),
        now,
        crate::ingest::waiting::Look::Flush,
    );
    assert!(app.learning.waiting.is_empty());
    assert_eq!(
        app.learner.pending_proposals(),
        2,
        "web-2's egress, api's ingress"
    );
}

/// A record that waited for its pod, taken in once the grace of its peer's wait is over too, is
/// decided by the same settling: the flush that releases its batch has learned it.
#[tokio::test]
async fn a_record_that_waited_for_its_pod_then_for_its_peer_is_decided_by_one_settling() {
    use crate::runtime::metrics::{WaitOutcome, Waiter};
    let queue = Arc::new(crate::monitor::status_sync::EvidenceQueue::default());
    let app = app_with(index_with_pod("node-a"), 30_000, queue);
    let (ack, _) = app.learning.take_in(
        "node-a",
        &encoded_batch(1, "node-a", &[record("shop", "web-2", "")]),
    );
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 2_000);
    let past_grace = crate::cluster::watches::now_ms() + 30_001;
    app.learning.settle(
        &app.index.index.read().unwrap(),
        past_grace,
        crate::ingest::waiting::Look::Flush,
    );
    assert!(app.learning.waiting.is_empty(), "nothing left waiting");
    assert_eq!(
        app.learner.pending_proposals(),
        1,
        "web-2's egress to the address"
    );
    let waits = &app.metrics.waits;
    assert_eq!(
        [
            waits.get(Waiter::record, WaitOutcome::placed),
            waits.get(Waiter::observation, WaitOutcome::waits),
            waits.get(Waiter::observation, WaitOutcome::expired),
        ],
        [1, 1, 1]
    );
}

#[tokio::test]
async fn a_batch_that_waited_for_its_pod_is_acknowledged_after_its_evidence() {
    use std::sync::atomic::Ordering;
    let marks = Arc::new(Marks::default());
    let app = app_with(index_with_pod("node-a"), 20, marks.clone());
    // A failed attempt: evidence, nothing to learn (and so nothing for the flush to write).
    let failed = FlowRecord {
        outcome: uplink::Outcome::Failed as i32,
        ..record("shop", "web-2", "")
    };
    let (ack, mut holds) = app
        .learning
        .take_in("node-a", &encoded_batch(1, "node-a", &[failed]));
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    let mark = app.flusher.ledger().mark();
    let ledger = app.flusher.ledger();
    assert!(!holds.ready(mark, ledger, Some(&*marks)), "no flush yet");

    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 2_000);
    tokio::time::sleep(Duration::from_millis(30)).await;
    // The flush settles the record first: judged now, after the batch was merged.
    app.flusher.flush().await;
    assert_eq!(marks.handed.load(Ordering::SeqCst), 1);
    assert!(
        !holds.ready(mark, ledger, Some(&*marks)),
        "its evidence is not in a status yet"
    );
    assert_eq!(holds.evidence, Some(1), "the mark taken after the wait");
    marks.settled.store(2, Ordering::SeqCst);
    assert!(holds.ready(mark, ledger, Some(&*marks)));
}

/// A blocked connection whose peer the index cannot place yet is handed on as evidence only once
/// its wait is over (docs/behaviour.md §3.2); its batch is acknowledged only after that, and after
/// the evidence is in statuses, as for a record that waited for its pod.
#[tokio::test]
async fn a_batch_with_a_denial_whose_peer_waits_is_acknowledged_after_its_evidence() {
    use std::sync::atomic::Ordering;
    let marks = Arc::new(Marks::default());
    let app = app_with(index_with_pod("node-a"), 20, marks.clone());
    // The agent's enforcement refused 10.0.0.9, which is no pod yet.
    let denied = FlowRecord {
        outcome: uplink::Outcome::Denied as i32,
        direction: uplink::Direction::Inbound as i32,
        ..record("shop", "web-1", "")
    };
    let (ack, mut holds) = app
        .learning
        .take_in("node-a", &encoded_batch(1, "node-a", &[denied]));
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    assert_eq!(marks.handed.load(Ordering::SeqCst), 0, "it waits");
    assert!(
        holds.evidence_later && holds.evidence.is_none(),
        "{holds:?}"
    );
    let mark = app.flusher.ledger().mark();
    let ledger = app.flusher.ledger();
    assert!(!holds.ready(mark, ledger, Some(&*marks)), "no flush yet");
    // A flush within the grace decides nothing.
    app.flusher.flush().await;
    assert_eq!(marks.handed.load(Ordering::SeqCst), 0);
    assert!(
        !holds.ready(mark, ledger, Some(&*marks)),
        "the wait is not over"
    );

    tokio::time::sleep(Duration::from_millis(30)).await;
    // The grace is over: handed on (as the address) before the flush.
    app.flusher.flush().await;
    assert_eq!(marks.handed.load(Ordering::SeqCst), 1);
    assert!(
        !holds.ready(mark, ledger, Some(&*marks)),
        "its evidence is not in a status yet"
    );
    assert_eq!(holds.evidence, Some(1), "the mark taken after the wait");
    marks.settled.store(2, Ordering::SeqCst);
    assert!(holds.ready(mark, ledger, Some(&*marks)));
    let text = app.learner.metrics().encode();
    for line in [
        "waits_total{waiter=\"evidence\",outcome=\"waits\"} 1",
        "waits_total{waiter=\"evidence\",outcome=\"expired\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

#[test]
fn records_name_the_pod_by_name_or_by_uid() {
    let index = index_with_pod("node-a");
    let by_name = observation(&record("shop", "web-1", ""), &index, "node-a")
        .unwrap()
        .unwrap();
    let by_uid = observation(&record("", "", "uid-web-1"), &index, "node-a")
        .unwrap()
        .unwrap();
    assert_eq!(by_name, by_uid);
    assert_eq!(
        (by_uid.local.namespace.as_str(), by_uid.local.name.as_str()),
        ("shop", "web-1")
    );
}

#[test]
fn records_for_pods_elsewhere_or_unknown_are_refused() {
    let index = index_with_pod("node-a");
    for r in [record("shop", "web-1", ""), record("", "", "uid-web-1")] {
        assert!(matches!(
            observation(&r, &index, "node-b"),
            Err(BadRecord::NotOnNode(..))
        ));
    }
    assert!(matches!(
        observation(&record("", "", "uid-nope"), &index, "node-a"),
        Err(BadRecord::UnknownLocalPod(..))
    ));
    let mut failed = record("shop", "web-1", "");
    failed.outcome = uplink::Outcome::Failed as i32;
    assert_eq!(
        observation(&failed, &index, "node-a"),
        Ok(None),
        "failed attempts teach nothing"
    );
}

#[test]
fn an_unknown_peer_address_falls_back_to_the_pod_the_source_named() {
    let mut index = index_with_pod("node-a");
    let peer: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db-0", "namespace": "shop", "uid": "uid-db-0"},
        "spec": {"nodeName": "node-b", "serviceAccountName": "db", "containers": []},
        "status": {"phase": "Running", "podIP": "10.0.0.20"}
    }))
    .unwrap();
    index.apply_pod(&peer, 1_000);
    // The address (e.g. after SNAT) is no pod; Hubble named the peer pod.
    let mut r = record("shop", "web-1", "");
    r.peer_ip = vec![192, 0, 2, 1];
    let plain = observation(&r, &index, "node-a").unwrap().unwrap();
    assert_eq!(plain.peer, "192.0.2.1".parse::<std::net::IpAddr>().unwrap());
    r.peer = Some(uplink::Peer {
        namespace: "shop".into(),
        pod: "db-0".into(),
        principal: String::new(),
    });
    let named = observation(&r, &index, "node-a").unwrap().unwrap();
    assert_eq!(named.peer, "10.0.0.20".parse::<std::net::IpAddr>().unwrap());
    // ztunnel names it by principal only.
    r.peer = Some(uplink::Peer {
        principal: "cluster.local/ns/shop/sa/db".into(),
        ..uplink::Peer::default()
    });
    assert_eq!(observation(&r, &index, "node-a").unwrap().unwrap(), named);
}

#[test]
fn times_in_the_future_are_clamped_to_now() {
    let now = 1_000_000;
    // (first, last) → expected (first, last), borrowed?
    let cases = [
        ((900_000, 999_000), (900_000, 999_000), true),
        (
            (900_000, now + CLOCK_SKEW_MS),
            (900_000, now + CLOCK_SKEW_MS),
            true,
        ),
        ((900_000, i64::MAX), (900_000, now), false),
        ((i64::MAX, i64::MAX), (now, now), false),
        (
            (now + 2 * CLOCK_SKEW_MS, now + 3 * CLOCK_SKEW_MS),
            (now, now),
            false,
        ),
    ];
    for ((first, last), expected, borrowed) in cases {
        let r = FlowRecord {
            first_seen_ms: first,
            last_seen_ms: last,
            ..FlowRecord::default()
        };
        let c = clamp_times(&r, now);
        assert_eq!(matches!(c, Cow::Borrowed(_)), borrowed, "{first} {last}");
        assert_eq!(
            (c.first_seen_ms, c.last_seen_ms),
            expected,
            "{first} {last}"
        );
    }
}

#[test]
fn waits_for_names_each_proposal_once_up_to_its_bound() {
    let mut w = WaitsFor::default();
    assert!(w.is_nothing());
    w.add(3);
    w.add(3);
    assert_eq!(w, {
        let mut once = WaitsFor::default();
        once.add(3);
        once
    });
    assert!(!w.is_nothing());
    for k in 0..WaitsFor::MAX_PROPOSALS as u64 * 2 {
        w.add(k);
    }
    assert_eq!(w, WaitsFor::everything(), "past the bound it waits for all");
    assert!(w.written_despite(0, &BTreeSet::new()));
    assert!(!w.written_despite(0, &BTreeSet::from([1_000_000])));
}

#[test]
fn a_review_must_authenticate_our_audience_our_account_and_a_pod() {
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
    let agent = "system:serviceaccount:ne:agent";
    let status = |authenticated: bool, audiences: Option<&[&str]>, user: &str, pod: bool| {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: audiences.map(|a| a.iter().map(|s| s.to_string()).collect()),
            user: Some(UserInfo {
                username: Some(user.to_string()),
                extra: pod.then(|| {
                    [
                        (
                            "authentication.kubernetes.io/pod-name".to_string(),
                            vec!["agent-x".to_string()],
                        ),
                        (
                            "authentication.kubernetes.io/pod-uid".to_string(),
                            vec!["u1".to_string()],
                        ),
                    ]
                    .into()
                }),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        }
    };
    let ours: &[&str] = &[AUDIENCE];
    // (status, expected: Ok(pod) or the refusal's code)
    let cases = [
        (status(true, Some(ours), agent, true), Ok("agent-x")),
        (
            status(true, Some(&["api", AUDIENCE]), agent, true),
            Ok("agent-x"),
        ),
        (
            status(false, Some(ours), agent, true),
            Err(tonic::Code::Unauthenticated),
        ),
        (
            status(true, None, agent, true),
            Err(tonic::Code::Unauthenticated),
        ),
        (
            status(true, Some(&[]), agent, true),
            Err(tonic::Code::Unauthenticated),
        ),
        (
            status(true, Some(&["https://kubernetes.default.svc"]), agent, true),
            Err(tonic::Code::Unauthenticated),
        ),
        (
            status(true, Some(ours), "system:serviceaccount:ne:other", true),
            Err(tonic::Code::PermissionDenied),
        ),
        (
            status(true, Some(ours), agent, false),
            Err(tonic::Code::PermissionDenied),
        ),
    ];
    for (i, (status, expected)) in cases.into_iter().enumerate() {
        let got = reviewed_agent(&status, agent);
        match expected {
            Ok(pod) => assert_eq!(
                got.ok(),
                Some((pod.to_string(), Some("u1".to_string()))),
                "case {i}"
            ),
            Err(code) => assert_eq!(got.map_err(|e| e.code()).err(), Some(code), "case {i}"),
        }
    }
}

#[test]
fn deleted_pods_resolve_for_the_history_window_then_are_forgotten() {
    let mut index = index_with_pod("node-a");
    assert!(index.pod_exists("shop", "web-1"));
    index.delete_pod("shop", "web-1", 5_000);
    assert!(
        index.pod_by_uid("uid-web-1").is_some(),
        "late records still resolve"
    );
    assert!(
        !index.pod_exists("shop", "web-1"),
        "but the pod is gone (an agent pod's stream closes)"
    );
    index.forget_expired(5_000 + crate::cluster::index::IP_HISTORY_MS + 1);
    assert!(index.pod_by_uid("uid-web-1").is_none());
    assert!(index.pod("shop", "web-1").is_none());
}

/// `batch`'s claim, reported merged at the ledger's mark as the stream does.
fn merged(app: &crate::app::App, holds: &mut Holds) -> u64 {
    let mark = app.flusher.ledger().mark();
    let claim = holds.claim.take().expect("a named batch");
    let first = claim.first.expect("a first attempt");
    let name = claims::BatchName {
        node: "node-a",
        instance: claim.instance,
        sequence: claim.sequence,
    };
    app.learning.claims.merged(name, &first, mark, holds);
    mark
}

/// A batch resent (its stream closed while its acknowledgement was held, or the acknowledgement was
/// lost) teaches again but hands its evidence on once (docs/behaviour.md §3.8): the repeat's
/// acknowledgement waits for the first attempt's evidence to be in a status, and once a batch was
/// acknowledged a resend of it waits for nothing. The same sequence from another agent process is
/// another batch.
#[tokio::test]
async fn a_resent_batch_is_learned_again_but_its_evidence_counts_once() {
    use std::sync::atomic::Ordering;
    let marks = Arc::new(Marks::default());
    let app = app_with(index_with_pod("node-a"), 0, marks.clone());
    let failed = FlowRecord {
        outcome: uplink::Outcome::Failed as i32,
        ..record("shop", "web-1", "")
    };
    let batch = encoded_batch(1, "node-a", &[failed]);
    let (_, mut first) = app.learning.take_in("node-a", &batch);
    assert_eq!(marks.handed.load(Ordering::SeqCst), 1);
    assert_eq!(first.evidence, Some(1));
    let mark = merged(&app, &mut first);

    let (ack, mut repeat) = app.learning.take_in("node-a", &batch);
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    assert_eq!(marks.handed.load(Ordering::SeqCst), 1, "counted once");
    assert!(
        !repeat.is_nothing(),
        "the repeat waits for its first attempt"
    );
    let ledger = app.flusher.ledger();
    assert!(!repeat.ready(mark, ledger, Some(&*marks)));
    marks.settled.store(2, Ordering::SeqCst);
    assert!(repeat.ready(mark, ledger, Some(&*marks)));

    app.learning.claims.acknowledged(claims::BatchName {
        node: "node-a",
        instance: 1,
        sequence: 1,
    });
    let (_, after_ack) = app.learning.take_in("node-a", &batch);
    assert_eq!(marks.handed.load(Ordering::SeqCst), 1, "counted once");
    assert!(after_ack.repeat_of.is_none() && after_ack.evidence.is_none());
    assert_eq!(app.learning.metrics.batch_repeats.get(), 2);

    let restarted = encoded::FlowBatch {
        instance: 2,
        ..batch
    };
    app.learning.take_in("node-a", &restarted);
    assert_eq!(
        marks.handed.load(Ordering::SeqCst),
        2,
        "another agent process"
    );
}

/// A resent batch whose record waits for its pod is learned from when the pod comes, but its
/// evidence is handed on once: the first attempt's waiting record hands it.
#[tokio::test]
async fn a_resent_record_that_waits_for_its_pod_counts_once() {
    use std::sync::atomic::Ordering;
    let marks = Arc::new(Marks::default());
    let app = app_with(index_with_pod("node-a"), 20, marks.clone());
    let failed = FlowRecord {
        outcome: uplink::Outcome::Failed as i32,
        ..record("shop", "web-2", "")
    };
    let batch = encoded_batch(4, "node-a", &[failed]);
    let (_, mut first) = app.learning.take_in("node-a", &batch);
    assert!(first.evidence_later, "{first:?}");
    merged(&app, &mut first);
    let (_, repeat) = app.learning.take_in("node-a", &batch);
    assert!(
        !repeat.evidence_later && repeat.repeat_of.is_some(),
        "{repeat:?}"
    );
    assert_eq!(
        app.learning.waiting.len(),
        2,
        "both wait, to be learned from"
    );

    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&pod_on("web-2", "10.0.0.8", "node-a"), 2_000);
    tokio::time::sleep(Duration::from_millis(30)).await;
    app.flusher.flush().await;
    assert_eq!(app.learning.waiting.len(), 0);
    assert_eq!(marks.handed.load(Ordering::SeqCst), 1, "counted once");
}
