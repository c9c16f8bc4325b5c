use super::*;

#[test]
fn durations_as_the_chart_writes_them() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
    for bad in ["", "30", "s", "30x", "1m30", "0s", "-1s", "1..5s"] {
        assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
    }
}

/// Evidence of a connection from a pod the tests' index does not hold, told apart by `at_ms`.
fn evidence(at_ms: i64) -> Evidence {
    Evidence {
        kind: EvidenceKind::WentThrough,
        record: crate::ingest::flow_record::Decoded {
            local: Arc::default(),
            peer: std::net::IpAddr::from([192, 0, 2, 1]),
            peer_from: crate::ingest::flow_record::PeerFrom::Address,
            port: 443,
            protocol: network_enforcer_api::Protocol::TCP,
            opened: crate::learn::Opened::Outbound,
            at_ms,
        },
        waited_for_peer: false,
    }
}

#[test]
fn the_evidence_queue_never_blocks_and_drops_the_oldest() {
    let queue = EvidenceQueue::default();
    for at in 0..(MAX_QUEUED_RECORDS as i64 + 2) {
        queue.accepted(evidence(at));
    }
    assert_eq!(queue.dropped(), 2);
    let records = queue.drain();
    assert_eq!(records.len(), MAX_QUEUED_RECORDS);
    assert_eq!(records[0].record.at_ms, 2);
    assert!(queue.drain().is_empty());
}

/// The queue's bound in records is a bound in memory: an entry holds no string of the agent's
/// (a local pod is shared with the index), so a full queue is about 16 MB whatever the records
/// carried.
#[test]
fn a_queued_record_is_small_and_holds_no_strings_of_its_own() {
    assert!(
        std::mem::size_of::<Evidence>() <= 48,
        "{} bytes",
        std::mem::size_of::<Evidence>()
    );
    let pod = Arc::new(crate::cluster::index::PodRecord {
        namespace: "n".repeat(1024 * 1024),
        ..Default::default()
    });
    let queue = EvidenceQueue::default();
    for at in 0..1_000 {
        let mut e = evidence(at);
        e.record.local = pod.clone();
        queue.accepted(e);
    }
    assert_eq!(Arc::strong_count(&pod), 1_001, "one pod, shared");
    queue.drain();
    assert_eq!(Arc::strong_count(&pod), 1, "released by the drain");
}

fn observation(port: i32) -> crate::monitor::violations::Observation {
    crate::monitor::violations::Observation {
        timestamp: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        source: network_enforcer_api::WorkloadRef::default(),
        dest: network_enforcer_api::WorkloadRef::default(),
        protocol: network_enforcer_api::Protocol::TCP,
        dst_port: Some(port),
        action: network_enforcer_api::PolicyMode::Protect,
        direction: network_enforcer_api::Direction::Ingress,
        denying_policy_namespace: "shop".into(),
        denying_policy_name: "web".into(),
    }
}

/// The line of `name` (with labels) in the metrics text, as a number.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A status sync whose API server is never reached.
fn offline_sync() -> Arc<StatusSync> {
    StatusSync::new(
        network_enforcer_tests::fixture::offline_client(),
        Arc::new(SharedIndex::default()),
        Settings::default(),
        Arc::new(crate::monitor::otlp::Disabled),
    )
}

#[tokio::test]
async fn a_half_full_queue_calls_for_a_pass_once_per_fill() {
    use futures::FutureExt;
    let queue = EvidenceQueue::default();
    for fill in 0..2 {
        for at in 0..(MAX_QUEUED_RECORDS / 2 - 1) as i64 {
            queue.accepted(evidence(at));
        }
        assert!(queue.half_full().now_or_never().is_none(), "fill {fill}");
        queue.accepted(evidence(0));
        assert!(queue.half_full().now_or_never().is_some(), "fill {fill}");
        queue.accepted(evidence(0));
        assert!(
            queue.half_full().now_or_never().is_none(),
            "fill {fill}: once until the next drain"
        );
        queue.drain();
    }
}

#[tokio::test]
async fn dropped_evidence_and_pending_observations_are_metrics() {
    let sync = offline_sync();
    let registry = ControllerMetrics::new();
    sync.register_metrics(&registry);
    let evidence = sync.evidence();
    for at in 0..(MAX_QUEUED_RECORDS as i64 + 3) {
        evidence.accepted(self::evidence(at));
    }
    let text = registry.encode();
    let p = "network_enforcer_controller_";
    assert_eq!(
        metric(&text, &format!("{p}evidence_records_dropped_total")),
        Some(3.0)
    );
    assert_eq!(
        metric(&text, &format!("{p}evidence_queue_records")),
        Some(MAX_QUEUED_RECORDS as f64)
    );
    assert_eq!(sync.queue.drain().len(), MAX_QUEUED_RECORDS);
    assert_eq!(
        metric(&registry.encode(), &format!("{p}evidence_queue_records")),
        Some(0.0)
    );

    // One policy's queue overflows by 2, then the policy is gone (no policy is in the store).
    {
        let mut state = sync.state.lock().unwrap();
        let key = PolicyKey {
            namespace: "shop".into(),
            name: "web".into(),
        };
        for port in 0..(crate::monitor::violations::evidence::MAX_PENDING_PER_POLICY as i32 + 2) {
            state.pending.push(key.clone(), observation(port));
        }
        sync.count_pending(&mut state);
    }
    let text = registry.encode();
    let max = crate::monitor::violations::evidence::MAX_PENDING_PER_POLICY as f64;
    assert_eq!(
        metric(&text, &format!("{p}pending_violation_observations")),
        Some(max)
    );
    let dropped = |text: &str, reason: &str| {
        metric(
            text,
            &format!("{p}violation_observations_dropped_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(dropped(&text, "policy_queue_full"), Some(2.0));
    let report = sync.sync_all().await;
    assert_eq!(report.policies, 0);
    let text = registry.encode();
    assert_eq!(dropped(&text, "policy_deleted"), Some(max));
    assert_eq!(
        dropped(&text, "policy_queue_full"),
        Some(2.0),
        "counted once"
    );
    assert_eq!(
        metric(&text, &format!("{p}pending_violation_observations")),
        Some(0.0)
    );
}

/// An offline sync whose watches have listed an empty cluster, as [`StatusSync::watches`] would;
/// returns the stores' writers to add objects by hand.
async fn listed_offline_sync() -> (Arc<StatusSync>, Writers) {
    let sync = StatusSync::new(
        network_enforcer_tests::fixture::offline_client(),
        Arc::new(SharedIndex::listed(crate::cluster::index::Index::default())),
        Settings::default(),
        Arc::new(crate::monitor::otlp::Disabled),
    );
    let mut writers = sync.writers.lock().unwrap().take().unwrap();
    writers
        .policies
        .apply_watcher_event(&watcher::Event::InitDone);
    writers
        .network_policies
        .apply_watcher_event(&watcher::Event::InitDone);
    writers
        .namespaces
        .apply_watcher_event(&watcher::Event::InitDone);
    sync.wait_ready().await;
    (sync, writers)
}

/// An ingress policy of Deployment `shop/web` that isolates every pod of `shop`, in `mode`.
fn web_ingress(mode: &str) -> WorkloadNetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
        "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": mode,
                 "targetRef": {"kind": "Deployment", "name": "web"},
                 "kubernetes": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    }))
    .unwrap()
}

/// Evidence handed in before the policies, NetworkPolicies and namespaces are listed is kept
/// (and held from acknowledgement) rather than judged against half-listed stores, by the passes
/// and by the protect gate's replay alike.
#[tokio::test]
async fn no_evidence_is_judged_before_the_watches_have_listed() {
    let sync = offline_sync();
    let evidence = sync.evidence();
    evidence.accepted(self::evidence(0));
    let mark = evidence
        .hold()
        .expect("before the policies are listed, any record may be evidence");
    let policy = web_ingress("protect");
    assert!(sync.replay(&policy).is_none(), "no history before listing");
    assert_eq!(sync.attribute_evidence(), 0);
    assert_eq!(sync.metrics().evidence_queued.get(), 1, "still queued");
    assert!(!evidence.settled_after(mark), "not acknowledged");
    assert_eq!(sync.queue.drain().len(), 1);
}

#[tokio::test]
async fn evidence_is_settled_only_once_its_violations_are_written() {
    let (sync, mut writers) = listed_offline_sync().await;
    let evidence = sync.evidence();
    let record = self::evidence(0);
    // No policy known: nothing is evidence, nothing to wait for.
    sync.attribute_evidence();
    evidence.accepted(record.clone());
    assert_eq!(evidence.hold(), None);
    sync.attribute_evidence();

    // A policy appears.
    let policy = web_ingress("monitor");
    writers
        .policies
        .apply_watcher_event(&watcher::Event::Apply(policy.clone()));
    sync.attribute_evidence();

    // Handed in: waits for the next drain to settle.
    evidence.accepted(record.clone());
    let mark = evidence.hold().expect("a policy exists: evidence waits");
    assert!(!evidence.settled_after(mark));
    // That drain finds a violation (here put in by hand: the record resolves to no pod), so it
    // is not settled while the violation waits for its status patch...
    {
        let mut state = sync.state.lock().unwrap();
        state.pending.push(policy_key(&policy), observation(18080));
    }
    sync.attribute_evidence();
    assert!(
        !evidence.settled_after(mark),
        "the violation is not written yet"
    );
    // ...and is once the patch has recorded it.
    {
        let mut state = sync.state.lock().unwrap();
        let key = policy_key(&policy);
        let read = state.pending.read(&key).1;
        state.pending.commit(&key, read);
    }
    sync.attribute_evidence();
    assert!(evidence.settled_after(mark));
    // Something handed in later waits for a later drain.
    evidence.accepted(record.clone());
    let later = evidence.hold().unwrap();
    assert!(!evidence.settled_after(later));
    sync.attribute_evidence();
    assert!(evidence.settled_after(later));
}
