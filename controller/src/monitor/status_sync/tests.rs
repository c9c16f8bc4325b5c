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

/// Pod `shop/<name>` labelled `app=<app>` at `ip` on node-a: a Deployment's (through its
/// ReplicaSet) when `deployment`, else a bare pod.
fn shop_pod(name: &str, app: &str, ip: &str, deployment: bool) -> k8s_openapi::api::core::v1::Pod {
    let mut meta = serde_json::json!({"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                                      "labels": {"app": app}});
    if deployment {
        meta["labels"]["pod-template-hash"] = "5d8f7c9b6".into();
        meta["ownerReferences"] = serde_json::json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": format!("{app}-5d8f7c9b6"), "uid": format!("uid-rs-{app}"), "controller": true}]);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": meta,
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip}
    }))
    .unwrap()
}

/// A protect ingress policy of Deployment `shop/web` that allows pods labelled `app=<allowed>`
/// on TCP 8080.
fn web_allows(allowed: &str) -> WorkloadNetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "deployment-web-ingress", "namespace": "shop", "uid": "u-web"},
        "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": "protect",
                 "targetRef": {"kind": "Deployment", "name": "web"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "web"}},
                                "policyTypes": ["Ingress"],
                                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": allowed}}}],
                                             "ports": [{"protocol": "TCP", "port": 8080}]}]}}
    }))
    .unwrap()
}

/// The controller in process, without a cluster: pod `shop/web-…` of Deployment web (10.0.0.2) on
/// node-a, ingest with the resolution grace `grace_ms`, and a status sync whose watches have listed
/// `policy` and the namespace.
async fn startup_drop_app(
    grace_ms: i64,
    policy: WorkloadNetworkPolicy,
) -> (crate::app::App, Arc<StatusSync>, ControllerMetrics) {
    let mut index = crate::cluster::index::Index::default();
    index.apply_pod(&shop_pod("web-5d8f7c9b6-a", "web", "10.0.0.2", true), 0);
    index.apply_workload(
        "shop",
        network_enforcer_api::WorkloadKind::Deployment,
        "web",
        "uid-web",
        serde_json::from_value(serde_json::json!({"matchLabels": {"app": "web"}})).unwrap(),
    );
    let metrics = ControllerMetrics::new();
    let app = crate::app::App::builder(
        network_enforcer_tests::fixture::offline_client(),
        Backend::Kubernetes,
    )
    .index(Arc::new(SharedIndex::listed(index)))
    .configure_learner(move |l| l.with_resolution_grace(grace_ms))
    .status_sync(
        Settings::default(),
        Arc::new(crate::monitor::otlp::Disabled),
    )
    .metrics(metrics.clone())
    .build();
    let sync = app.status_sync.clone().expect("a status sync");
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
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shop", "labels": {"kubernetes.io/metadata.name": "shop"}}
    }))
    .unwrap();
    writers
        .namespaces
        .apply_watcher_event(&watcher::Event::Apply(namespace));
    writers
        .policies
        .apply_watcher_event(&watcher::Event::Apply(policy));
    sync.wait_ready().await;
    (app, sync, metrics)
}

/// The agent's enforcement refused a TCP attempt on web's port 8080 from `peer`, seen at `at_ms`:
/// one batch of node-a's agent, as its stream delivers it.
fn denied_from(peer: [u8; 4], at_ms: i64) -> network_enforcer_api::uplink::encoded::FlowBatch {
    use network_enforcer_api::uplink;
    use prost::Message;
    let record = uplink::FlowRecord {
        local: Some(uplink::LocalPod {
            namespace: "shop".into(),
            name: "web-5d8f7c9b6-a".into(),
            uid: String::new(),
        }),
        peer_ip: peer.to_vec(),
        port: 8080,
        protocol: uplink::Protocol::Tcp as i32,
        direction: uplink::Direction::Inbound as i32,
        outcome: uplink::Outcome::Denied as i32,
        first_seen_ms: at_ms,
        last_seen_ms: at_ms,
        ..uplink::FlowRecord::default()
    };
    uplink::encoded::FlowBatch {
        sequence: 1,
        node: "node-a".into(),
        records: vec![prost::bytes::Bytes::from(record.encode_to_vec())],
    }
}

/// The observations waiting for web's ingress policy's status patch.
fn web_observations(sync: &StatusSync) -> Vec<crate::monitor::violations::Observation> {
    sync.state.lock().unwrap().pending.get(&PolicyKey {
        namespace: "shop".into(),
        name: "deployment-web-ingress".into(),
    })
}

/// How many blocked records that waited for their peer came to `outcome`.
fn waited(metrics: &ControllerMetrics, outcome: &str) -> f64 {
    metric(
        &metrics.encode(),
        &format!(
            "network_enforcer_controller_evidence_waited_for_peer_total{{outcome=\"{outcome}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

/// Issue 49: a new client's first SYN, dropped by the server's node because that node learned the
/// client's address only after it, is reported with the client as a bare address. It must not be a
/// violation "external → web" while the policy allows the client: the record waits for the index
/// (docs/behaviour.md §3.2), is judged with the client's pod, and is counted as a startup drop.
/// (Before the change the first evidence pass recorded the bare address.)
#[tokio::test]
async fn a_denied_record_from_a_pod_the_index_learns_late_and_the_policy_allows_is_no_violation() {
    let (app, sync, metrics) = startup_drop_app(30_000, web_allows("client")).await;
    let now = crate::cluster::watches::now_ms();
    let (ack, _) = app
        .learning
        .take_in("node-a", &denied_from([10, 0, 0, 3], now - 1_000));
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    // The evidence pass of that second, before the client's IP reaches the index.
    assert_eq!(sync.attribute_evidence(), 0);
    assert_eq!(web_observations(&sync), []);
    assert_eq!(
        app.learner.waiting(),
        1,
        "it waits with learning's observations"
    );
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&shop_pod("client", "client", "10.0.0.3", false), now);
    app.flush().await;
    assert_eq!(sync.attribute_evidence(), 0);
    assert_eq!(web_observations(&sync), [], "the policy allows the client");
    assert_eq!(app.learner.waiting(), 0);
    assert_eq!(waited(&metrics, "startup_drop"), 1.0);
    assert_eq!(waited(&metrics, "violation"), 0.0);
    assert_eq!(waited(&metrics, "unknown_address"), 0.0);
    assert_eq!(
        app.metrics
            .count("resolutions", "evidence_deferred_resolved"),
        1
    );
}

/// The same with a policy that does not allow the client: a violation, named by the client's
/// workload rather than by its address.
#[tokio::test]
async fn a_denied_record_from_a_pod_the_index_learns_late_and_the_policy_denies_names_the_pod() {
    let (app, sync, metrics) = startup_drop_app(30_000, web_allows("other")).await;
    let now = crate::cluster::watches::now_ms();
    app.learning
        .take_in("node-a", &denied_from([10, 0, 0, 3], now - 1_000));
    assert_eq!(sync.attribute_evidence(), 0);
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&shop_pod("client", "client", "10.0.0.3", false), now);
    app.flush().await;
    assert_eq!(sync.attribute_evidence(), 1);
    let observed = web_observations(&sync);
    assert_eq!(observed.len(), 1, "{observed:?}");
    let source = &observed[0].source;
    assert_eq!(
        (
            source.owner_kind.as_str(),
            source.owner_name.as_str(),
            source.address.as_str()
        ),
        ("Pod", "client", "")
    );
    assert_eq!(observed[0].dest.owner_name, "web");
    assert_eq!(waited(&metrics, "violation"), 1.0);
    assert_eq!(waited(&metrics, "startup_drop"), 0.0);
}

/// An address that is still no pod once the grace is over is judged as the address: one violation
/// "10.0.0.3 → web", as before the grace existed.
#[tokio::test]
async fn a_denied_record_whose_peer_stays_unknown_is_a_violation_of_the_address_after_the_grace() {
    let (app, sync, metrics) = startup_drop_app(50, web_allows("client")).await;
    let now = crate::cluster::watches::now_ms();
    app.learning
        .take_in("node-a", &denied_from([10, 0, 0, 3], now - 1_000));
    assert_eq!(sync.attribute_evidence(), 0, "within the grace");
    tokio::time::sleep(Duration::from_millis(80)).await;
    app.flush().await;
    assert_eq!(sync.attribute_evidence(), 1);
    let observed = web_observations(&sync);
    assert_eq!(observed.len(), 1, "{observed:?}");
    assert_eq!(observed[0].source.address, "10.0.0.3");
    assert_eq!(observed[0].source.owner_name, "");
    assert_eq!(waited(&metrics, "unknown_address"), 1.0);
}
