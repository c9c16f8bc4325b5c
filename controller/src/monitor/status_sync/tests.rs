use super::*;
use crate::cluster::shared_watch::Feed;
use crate::runtime::metrics::{WaitOutcome, Waiter};

#[test]
fn durations_as_the_chart_writes_them() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
    for bad in ["", "30", "s", "30x", "1m30", "0s", "-1s", "1..5s"] {
        assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
    assert_eq!(parse_duration_or_zero("2m"), Ok(Duration::from_secs(120)));
    for bad in ["", "0x", "-1s", "0"] {
        assert!(parse_duration_or_zero(bad).is_err(), "{bad:?} accepted");
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
            opened: crate::cluster::index::Opened::Outbound,
            at_ms,
            peer_name: Default::default(),
        },
        waited_for_peer: false,
        claim: None,
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
/// (a local pod is shared with the index), so a full queue is about 22 MB (56 bytes each) whatever the records
/// carried.
#[test]
fn a_queued_record_is_small_and_holds_no_strings_of_its_own() {
    assert!(
        std::mem::size_of::<Evidence>() <= 56,
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
    offline_sync_over(SharedIndex::default())
}

/// A status sync over `index` whose API server is never reached.
fn offline_sync_over(index: SharedIndex) -> Arc<StatusSync> {
    let client = network_enforcer_tests::fixture::offline_client();
    StatusSync::new(
        client.clone(),
        Arc::new(index),
        Arc::new(PolicyObjects::new(&client, None)),
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
    let (sync, _writers) = listed_offline_sync().await;
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

/// The writers of every store the sync reads, the shared watches' included.
pub(super) struct TestWriters {
    pub(super) policies: Feed<WorkloadNetworkPolicy>,
    pub(super) network_policies: Feed<NetworkPolicy>,
    pub(super) cluster_policies: Writer<ClusterNetworkPolicy>,
    pub(super) cluster_proposals: Writer<ClusterNetworkPolicyProposal>,
    pub(super) namespaces: Writer<Namespace>,
}

/// The stores' writers, for a test that stands in for the watches (which then never start); the
/// cluster serves no ClusterNetworkPolicy kind (as most do) and no ClusterNetworkPolicyProposal kind
/// (its store is filled by hand all the same).
fn take_writers(sync: &StatusSync) -> TestWriters {
    sync.cluster_policies_served.set_absent();
    sync.cluster_proposals_served.set_absent();
    let own = sync.writers.lock().unwrap().take().unwrap();
    TestWriters {
        policies: sync.objects.policies.take_writer().unwrap(),
        network_policies: sync.objects.network_policies.take_writer().unwrap(),
        cluster_policies: own.cluster_policies,
        cluster_proposals: own.cluster_proposals,
        namespaces: own.namespaces,
    }
}

/// An offline sync whose watches have listed an empty cluster, as [`StatusSync::watches`] would;
/// returns the stores' writers to add objects by hand.
async fn listed_offline_sync() -> (Arc<StatusSync>, TestWriters) {
    let client = network_enforcer_tests::fixture::offline_client();
    let sync = StatusSync::new(
        client.clone(),
        Arc::new(SharedIndex::listed(crate::cluster::index::Index::default())),
        Arc::new(PolicyObjects::new(&client, None)),
        Settings::default(),
        Arc::new(crate::monitor::otlp::Disabled),
    );
    let mut writers = take_writers(&sync);
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
pub(super) fn shop_pod(
    name: &str,
    app: &str,
    ip: &str,
    deployment: bool,
) -> k8s_openapi::api::core::v1::Pod {
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

/// The controller in process, without a cluster, talking to the API server `client`: pod
/// `shop/web-…` of Deployment web (10.0.0.2) on node-a, ingest with the resolution grace
/// `grace_ms`, and a status sync whose watches have listed nothing yet; its writers fill them.
pub(super) fn shop_app(
    client: Client,
    grace_ms: i64,
) -> (
    crate::app::App,
    Arc<StatusSync>,
    TestWriters,
    ControllerMetrics,
) {
    shop_app_with(client, grace_ms, Settings::default())
}

/// [`shop_app`] with the status sync's `settings`.
fn shop_app_with(
    client: Client,
    grace_ms: i64,
    settings: Settings,
) -> (
    crate::app::App,
    Arc<StatusSync>,
    TestWriters,
    ControllerMetrics,
) {
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
    let app = crate::app::App::builder(client, Backend::Kubernetes)
        .index(Arc::new(SharedIndex::listed(index)))
        .resolution_grace(grace_ms)
        .status_sync(settings, Arc::new(crate::monitor::otlp::Disabled))
        .metrics(metrics.clone())
        .build();
    let sync = app.status_sync.clone().expect("a status sync");
    let writers = take_writers(&sync);
    (app, sync, writers, metrics)
}

/// Namespace `shop`, as its watch lists it.
pub(super) fn shop_namespace() -> Namespace {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shop", "labels": {"kubernetes.io/metadata.name": "shop"}}
    }))
    .unwrap()
}

/// A store's writer: the sync's own watches' and the shared watches' ([`Feed`]).
pub(super) trait Apply<K> {
    fn apply_watcher_event(&mut self, event: &watcher::Event<K>);
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Apply<K> for Writer<K> {
    fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        Writer::apply_watcher_event(self, event)
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Apply<K> for Feed<K> {
    fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        Feed::apply_watcher_event(self, event)
    }
}

/// A first list of `writer`'s kind that finds `objects`, as a watch delivers it.
pub(super) fn list<K>(writer: &mut impl Apply<K>, objects: impl IntoIterator<Item = K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// [`shop_app`] offline, with a grace of `grace_ms`, whose watches have listed `policy` and the
/// namespace.
async fn startup_drop_app(
    grace_ms: i64,
    policy: WorkloadNetworkPolicy,
) -> (crate::app::App, Arc<StatusSync>, ControllerMetrics) {
    let (app, sync, mut writers, metrics) =
        shop_app(network_enforcer_tests::fixture::offline_client(), grace_ms);
    list(&mut writers.policies, [policy]);
    list(&mut writers.network_policies, []);
    list(&mut writers.namespaces, [shop_namespace()]);
    sync.wait_ready().await;
    (app, sync, metrics)
}

/// The agent's enforcement refused a TCP attempt on web's port 8080 from `peer`, seen at `at_ms`:
/// one batch of node-a's agent, as its stream delivers it.
fn denied_from(peer: [u8; 4], at_ms: i64) -> network_enforcer_api::uplink::encoded::FlowBatch {
    inbound_from(peer, network_enforcer_api::uplink::Outcome::Denied, at_ms)
}

/// A TCP connection on web's port 8080 from `peer` that came to `outcome`, seen at `at_ms`.
pub(super) fn inbound_from(
    peer: [u8; 4],
    outcome: network_enforcer_api::uplink::Outcome,
    at_ms: i64,
) -> network_enforcer_api::uplink::encoded::FlowBatch {
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
        outcome: outcome as i32,
        first_seen_ms: at_ms,
        last_seen_ms: at_ms,
        ..uplink::FlowRecord::default()
    };
    uplink::encoded::FlowBatch {
        sequence: 1,
        node: "node-a".into(),
        instance: 0,
        health: None,
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
        app.learning.waiting.len(),
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
    assert_eq!(app.learning.waiting.len(), 0);
    assert_eq!(waited(&metrics, "startup_drop"), 1.0);
    assert_eq!(waited(&metrics, "violation"), 0.0);
    assert_eq!(waited(&metrics, "unknown_address"), 0.0);
    assert_eq!(
        app.metrics.waits.get(Waiter::evidence, WaitOutcome::placed),
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

/// A stand-in API server for the status sync: answers every PATCH of a status with `policy` and
/// keeps the patch; anything else (Events) is 404, which the sync only logs.
pub(super) struct FakeApi {
    pub(super) client: Client,
    pub(super) status_patches: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Every request as `METHOD path`, in order, and the body of each ConfigMap write.
    requests: Arc<Mutex<Vec<String>>>,
    configmap_writes: Arc<Mutex<Vec<serde_json::Value>>>,
}

pub(super) async fn fake_api(policy: &impl serde::Serialize) -> FakeApi {
    fake_api_patching(policy, true).await
}

/// [`fake_api`] whose status patches succeed only with `patches_succeed`; else they are refused
/// (422, as an admission webhook or a too large object is).
async fn fake_api_patching(policy: &impl serde::Serialize, patches_succeed: bool) -> FakeApi {
    fake_api_writing(policy, patches_succeed, true).await
}

/// [`fake_api_patching`] that also takes ConfigMap writes (`configmaps_succeed`; else a 500) and
/// has no ConfigMap to read (404).
async fn fake_api_writing(
    policy: &impl serde::Serialize,
    patches_succeed: bool,
    configmaps_succeed: bool,
) -> FakeApi {
    let status_patches: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let configmap_writes: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let answer = serde_json::to_vec(policy).unwrap();
    let kept = status_patches.clone();
    let (logged, maps) = (requests.clone(), configmap_writes.clone());
    let router = axum::Router::new().fallback(
        move |method: http::Method, uri: http::Uri, body: bytes::Bytes| {
            let (kept, answer) = (kept.clone(), answer.clone());
            let (logged, maps) = (logged.clone(), maps.clone());
            async move {
                let json = [(http::header::CONTENT_TYPE, "application/json")];
                logged.lock().unwrap().push(format!("{method} {}", uri.path()));
                if method == http::Method::PATCH && uri.path().contains("/configmaps/") {
                    if !configmaps_succeed {
                        let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","message":"etcd down","code":500}"#;
                        return (http::StatusCode::INTERNAL_SERVER_ERROR, json, status.to_vec());
                    }
                    maps.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
                    return (http::StatusCode::OK, json, body.to_vec());
                }
                if method == http::Method::PATCH
                    && uri.path().ends_with("/status")
                    && !patches_succeed
                {
                    let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","message":"refused","code":422}"#;
                    (http::StatusCode::UNPROCESSABLE_ENTITY, json, status.to_vec())
                } else if method == http::Method::PATCH && uri.path().ends_with("/status") {
                    kept.lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap());
                    (http::StatusCode::OK, json, answer)
                } else {
                    let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
                    (http::StatusCode::NOT_FOUND, json, status.to_vec())
                }
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let config = kube::Config::new(format!("http://{address}").parse().unwrap());
    FakeApi {
        client: Client::try_from(config).unwrap(),
        status_patches,
        requests,
        configmap_writes,
    }
}

impl FakeApi {
    /// The violations (source workload name → destination workload name) of every status patch so far.
    fn written(&self) -> Vec<(String, String)> {
        self.status_patches
            .lock()
            .unwrap()
            .iter()
            .flat_map(|p| {
                p["status"]["violations"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|v| {
                let name = |side: &str| {
                    v[side]["ownerName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                };
                (name("source"), name("dest"))
            })
            .collect()
    }
}

/// Issue 42, item 1: evidence that arrives before the policies are listed waits for the list, and
/// its batch is acknowledged only after the status write that records its violation. Against the
/// empty store of a watch that has not listed, the passes of the first seconds (the evidence pass,
/// the protect gate's replay, the status pass) would find "no policy" for the record and let its
/// batch be acknowledged without its violation.
#[tokio::test]
async fn evidence_from_before_the_policies_are_listed_waits_and_is_acknowledged_after_its_write() {
    let policy = web_allows("other");
    let api = fake_api(&policy).await;
    let (app, sync, mut writers, _) = shop_app(api.client.clone(), 0);
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&shop_pod("client", "client", "10.0.0.3", false), 0);
    list(&mut writers.network_policies, []);
    list(&mut writers.namespaces, [shop_namespace()]);
    let now = crate::cluster::watches::now_ms();
    let (ack, mut holds) = app
        .learning
        .take_in("node-a", &denied_from([10, 0, 0, 3], now - 1_000));
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    let evidence = sync.evidence();
    let mark = app.flusher.ledger().mark();
    let mut acknowledged = || holds.ready(mark, app.flusher.ledger(), Some(&*evidence));

    // The passes that run before the policy store has listed.
    let judged = sync.attribute_evidence();
    let replayed = sync.replay(&policy);
    let synced = sync.sync_all().await;
    assert!(!acknowledged(), "acknowledged before any policy was listed");
    assert_eq!(judged, 0);
    assert!(replayed.is_none(), "the gate has no history yet");
    assert_eq!(synced, PassReport::default());
    assert_eq!(sync.metrics().evidence_queued.get(), 1, "the record waits");

    list(&mut writers.policies, [policy.clone()]);
    sync.wait_ready().await;
    assert_eq!(sync.attribute_evidence(), 1);
    assert!(
        !acknowledged(),
        "acknowledged before its violation is written"
    );
    let report = sync.sync_all().await;
    assert_eq!((report.patched, report.failed), (1, 0), "{report:?}");
    assert_eq!(api.written(), [("client".to_string(), "web".to_string())]);
    assert!(acknowledged());
}

/// A watch whose task ended before its first list (its store's writer is gone) has not listed:
/// its empty store would make every record "no policy", acknowledged at once.
#[tokio::test]
async fn a_watch_that_ended_before_listing_is_not_taken_as_listed() {
    use futures::FutureExt;
    let sync = offline_sync_over(SharedIndex::listed(crate::cluster::index::Index::default()));
    drop(take_writers(&sync));
    let evidence = sync.evidence();
    evidence.accepted(self::evidence(0));
    let mark = evidence
        .hold()
        .expect("nothing listed: any record may be evidence");
    assert!(
        sync.wait_ready().now_or_never().is_none(),
        "a store that never listed taken as listed"
    );
    assert_eq!(sync.attribute_evidence(), 0);
    assert_eq!(sync.metrics().evidence_queued.get(), 1, "the record waits");
    assert!(!evidence.settled_after(mark), "acknowledged unjudged");
}

/// A record handed in once a policy is in the store is held for the pass that judges it against
/// that policy, even when the pass before found no policy.
#[tokio::test]
async fn a_record_handed_in_after_a_policy_appeared_is_held() {
    let (sync, mut writers) = listed_offline_sync().await;
    let evidence = sync.evidence();
    sync.attribute_evidence();
    evidence.accepted(self::evidence(0));
    assert_eq!(evidence.hold(), None, "no policy: nothing is evidence");
    writers
        .policies
        .apply_watcher_event(&watcher::Event::Apply(web_ingress("monitor")));
    evidence.accepted(self::evidence(1));
    assert!(
        evidence.hold().is_some(),
        "acknowledged at once though the next pass judges it against the policy"
    );
}

/// What evidence waits for is a metric, one gauge per watch: 1 until that watch has listed.
#[tokio::test]
async fn evidence_waiting_for_the_watches_is_a_metric() {
    let sync = offline_sync_over(SharedIndex::listed(crate::cluster::index::Index::default()));
    let registry = ControllerMetrics::new();
    sync.register_metrics(&registry);
    let mut writers = take_writers(&sync);
    let waiting = |watch: &str| {
        metric(
            &registry.encode(),
            &format!("network_enforcer_controller_evidence_waiting_for_watch{{watch=\"{watch}\"}}"),
        )
    };
    assert_eq!(sync.attribute_evidence(), 0);
    let all = ["policies", "network_policies", "namespaces", "index"];
    assert_eq!(
        all.map(waiting),
        [Some(1.0), Some(1.0), Some(1.0), Some(0.0)]
    );
    list(&mut writers.namespaces, [shop_namespace()]);
    list(&mut writers.network_policies, []);
    assert_eq!(sync.attribute_evidence(), 0);
    assert_eq!(
        all.map(waiting),
        [Some(1.0), Some(0.0), Some(0.0), Some(0.0)]
    );
    assert_eq!(sync.listed().waiting_for(), [Watch::policies]);
    list(&mut writers.policies, []);
    assert!(sync.listed().complete());
    assert_eq!(all.map(waiting), [Some(0.0); 4]);
    assert_eq!(
        waiting("cluster_policies"),
        Some(0.0),
        "no such kind: nothing to wait for"
    );
}

/// The protect gate's replay attributes on the reconciler's task while the sync's own passes run:
/// a pass that finds the queue empty must not settle the records another pass has taken and not
/// yet attributed (their violations are not pending yet, so "nothing pending" says nothing).
#[tokio::test]
async fn records_a_replay_is_attributing_are_not_settled_by_another_pass() {
    let policy = web_allows("other");
    let api = fake_api(&policy).await;
    let (app, sync, mut holds) = denied_from_a_client(&api, &policy).await;
    let evidence = sync.evidence();
    let mark = app.flusher.ledger().mark();
    let mut acknowledged = || holds.ready(mark, app.flusher.ledger(), Some(&*evidence));

    // A watch is applying a change: the replay's pass takes the record, then waits for the index.
    let drains = sync.queue.drains();
    let busy = app.index.index.write().unwrap();
    let replay = {
        let (sync, policy) = (sync.clone(), policy.clone());
        std::thread::spawn(move || sync.replay(&policy))
    };
    while sync.queue.drains() == drains {
        std::thread::yield_now();
    }
    // The sync's own pass of that second finds nothing queued.
    assert_eq!(sync.attribute_evidence(), 0);
    assert!(
        !acknowledged(),
        "acknowledged while its record was being attributed"
    );
    drop(busy);
    assert!(replay.join().unwrap().is_some());
    assert_eq!(web_observations(&sync).len(), 1);
    assert!(
        !acknowledged(),
        "acknowledged before its violation is written"
    );
    assert_eq!(sync.sync_all().await.patched, 1);
    assert_eq!(api.written(), [("client".to_string(), "web".to_string())]);
    assert!(acknowledged());
}

#[test]
fn settling_stops_before_the_oldest_drain_still_attributed() {
    // (drain asked for, oldest drain a pass is attributing, settleable)
    let cases = [
        (5, None, 5),
        (5, Some(6), 5),
        (5, Some(5), 4),
        (5, Some(3), 2),
        (1, Some(1), 0),
        (0, None, 0),
    ];
    for (drain, attributing, expected) in cases {
        assert_eq!(
            queue::settleable(drain, attributing),
            expected,
            "{drain} {attributing:?}"
        );
    }
}

/// The observed edges `check --from-cluster` reads (the web view's edges route) are not answered
/// before the watches have listed: the evidence that makes them is still queued, and an empty
/// answer would read as "no traffic, nothing would be blocked".
#[tokio::test]
async fn the_observed_edges_are_not_answered_before_the_watches_have_listed() {
    let sync = offline_sync();
    assert_eq!(sync.edges_in("shop", 10), None);
    let (sync, _writers) = listed_offline_sync().await;
    assert_eq!(sync.edges_in("shop", 10), Some((Vec::new(), false)));
}

/// A controller that has just become the leader starts its protect gate's history from the
/// violation records the policies' statuses hold (docs/behaviour.md §3.11): a rare flow the last
/// leader saw (an outside address calling web, allowed only from app=api) is still one the policy
/// would block, before any agent reports it again. Without the seed the replay finds no flow.
#[tokio::test]
async fn a_new_leaders_gate_history_starts_from_the_violation_records() {
    let mut policy = web_allows("api");
    policy.status = Some(
        serde_json::from_value(serde_json::json!({
            "violationCount": 1,
            "violations": [{
                "id": 0, "timestamp": "2026-01-01T03:00:00Z", "protocol": "TCP", "dstPort": 8080,
                "action": "monitor", "direction": "Ingress",
                "source": {"namespace": "", "ownerKind": "", "ownerName": "",
                           "address": "203.0.113.5"},
                "dest": {"namespace": "shop", "ownerKind": "Deployment", "ownerName": "web"}
            }]
        }))
        .unwrap(),
    );
    let (_app, sync, _metrics) = startup_drop_app(0, policy.clone()).await;
    let report = sync.replay(&policy).expect("listed");
    assert_eq!(
        (report.considered, report.would_block),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(report.examples[0].peer, "203.0.113.5");
    assert!(!report.warming_up, "no warm-up by default");
    assert_eq!(sync.history_len(), 1);
    // Seeded once: a second pass adds nothing.
    sync.attribute_evidence();
    assert_eq!(sync.history_len(), 1);
}

/// [`shop_app`] on `api` with a client pod (10.0.0.3), whose watches have listed `policy`, and one
/// batch taken in: the agent's enforcement refused that client's connection to web. Returns what
/// the batch's acknowledgement waits for.
async fn denied_from_a_client(
    api: &FakeApi,
    policy: &WorkloadNetworkPolicy,
) -> (crate::app::App, Arc<StatusSync>, crate::ingest::Holds) {
    let (app, sync, mut writers, _) = shop_app(api.client.clone(), 0);
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&shop_pod("client", "client", "10.0.0.3", false), 0);
    list(&mut writers.policies, [policy.clone()]);
    list(&mut writers.network_policies, []);
    list(&mut writers.namespaces, [shop_namespace()]);
    sync.wait_ready().await;
    let now = crate::cluster::watches::now_ms();
    let (_, holds) = app
        .learning
        .take_in("node-a", &denied_from([10, 0, 0, 3], now - 1_000));
    (app, sync, holds)
}

/// Issue 42, item 3: a policy whose status cannot be written (every patch refused) holds back the
/// agents' acknowledgements for 3 status passes, then no longer: its observations stay pending and
/// are retried, a gauge counts it, and agents' batches are acknowledged again. Before, one such
/// policy held back every batch with evidence of every agent until the agents reconnected.
#[tokio::test]
async fn a_policy_whose_status_cannot_be_written_stops_holding_back_acknowledgements() {
    let policy = web_allows("other");
    let api = fake_api_patching(&policy, false).await;
    let (app, sync, mut holds) = denied_from_a_client(&api, &policy).await;
    let evidence = sync.evidence();
    let mark = app.flusher.ledger().mark();
    let mut acknowledged = || holds.ready(mark, app.flusher.ledger(), Some(&*evidence));
    assert_eq!(sync.attribute_evidence(), 1);
    for pass in 1..FAILED_PASSES_BEFORE_PARKED {
        assert_eq!(sync.sync_all().await.failed, 1);
        assert!(!acknowledged(), "held after failed pass {pass}");
    }
    assert_eq!(sync.sync_all().await.failed, 1);
    assert!(
        acknowledged(),
        "still held after {FAILED_PASSES_BEFORE_PARKED} failed passes"
    );
    assert_eq!(sync.metrics().status_writes_failing.get(), 1);
    assert_eq!(
        sync.metrics().pending_observations.get(),
        1,
        "kept and retried"
    );
    assert!(api.written().is_empty());
}

/// A ClusterNetworkPolicy the API server would refuse (admitted where the CRD's CEL rules do not run)
/// applies to nothing, and the controller says so: the gauge counts it until it is fixed.
#[tokio::test]
async fn an_invalid_cluster_policy_is_counted_until_it_is_fixed() {
    let (sync, mut writers) = listed_offline_sync().await;
    let policy = |tier: &str| -> ClusterNetworkPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "tenants"},
            "spec": {"tier": tier, "priority": 10,
                     "subject": {"namespaces": {}}}
        }))
        .unwrap()
    };
    writers
        .cluster_policies
        .apply_watcher_event(&watcher::Event::Apply(policy("Middle")));
    sync.current_view();
    assert_eq!(sync.metrics.cluster_policies_invalid.get(), 1);
    writers
        .cluster_policies
        .apply_watcher_event(&watcher::Event::Apply(policy("Admin")));
    sync.current_view();
    assert_eq!(sync.metrics.cluster_policies_invalid.get(), 0);
}

/// Issue 42, item 2: with the evidence claims persisted, a status pass writes the statuses, then the
/// claims, and only then settles: the acknowledgement of a batch whose violation is in a status goes
/// only once a new leader would know the batch, and a new leader that reads them takes its resend as
/// counted. A failing ConfigMap write settles anyway (the 60-second rule is then the fallback), and
/// is counted.
#[tokio::test]
async fn claims_are_persisted_after_the_status_and_before_the_acknowledgement() {
    use crate::ingest::claims::{self, Attempt, BatchName, Claims};
    use crate::ingest::claims_store;
    for configmaps_succeed in [true, false] {
        let policy = web_allows("other");
        let api = fake_api_writing(&policy, true, configmaps_succeed).await;
        let (app, sync, mut holds, mark) = claimed_denial(&api).await;
        let name = BatchName {
            node: "node-a",
            instance: 7,
            sequence: 1,
        };
        let evidence = sync.evidence();
        // A cluster source's windows beside it: 1000 holds the same evidence, 1015 none, 1030 is the
        // newest.
        let source = "goldmane/g:7443";
        let cursors = &app.learning.claims.cursors;
        assert!(holds.evidence.is_some(), "the denial waits for its status");
        cursors.fed(source, 1_000, holds.evidence);
        cursors.fed(source, 1_015, None);
        cursors.fed(source, 1_030, None);
        assert!(
            cursors.advance(|_| false).is_empty(),
            "1000 not written yet"
        );
        let mut acknowledged = || holds.ready(mark, app.flusher.ledger(), Some(&*evidence));

        assert_eq!(sync.attribute_evidence(), 1);
        assert!(!acknowledged());
        api.requests.lock().unwrap().clear();
        let report = sync.sync_all().await;
        assert_eq!((report.patched, report.failed), (1, 0), "{report:?}");
        let writes: Vec<String> = api
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("PATCH"))
            .cloned()
            .collect();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!(
            writes[0].ends_with("/status"),
            "the status first: {writes:?}"
        );
        assert!(
            writes[1].ends_with("/configmaps/ne-claims"),
            "then the claims: {writes:?}"
        );
        assert!(
            acknowledged(),
            "settled after the claims (configmaps_succeed {configmaps_succeed})"
        );
        assert_eq!(
            sync.metrics().claims_store_failures.get(),
            u64::from(!configmaps_succeed)
        );
        if !configmaps_succeed {
            continue;
        }
        let written = api
            .configmap_writes
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap();
        let data = written["binaryData"][claims_store::DATA_KEY]
            .as_str()
            .unwrap();
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        let persisted = claims_store::decode("ne-claims", &bytes).unwrap();
        assert_eq!(
            persisted.claims,
            vec![claims::Persisted {
                node: "node-a".into(),
                instance: 7,
                ranges: claims::Ranges::from_pairs([(1, 1)]),
            }]
        );
        assert_eq!(
            persisted.cursors,
            vec![crate::ingest::source_cursors::PersistedCursor {
                source: source.into(),
                through: 1_015,
            }],
            "past the window whose evidence is written, not to the newest"
        );
        let next_leader = Claims::unread();
        next_leader.cursors.restore(persisted.cursors);
        next_leader.restore(persisted.claims);
        assert_eq!(next_leader.begin(name).0, Attempt::Counted);
        assert_eq!(next_leader.cursors.through(source), Some(1_015));
        // Nothing new: the next pass writes no ConfigMap.
        api.requests.lock().unwrap().clear();
        sync.sync_all().await;
        assert!(
            api.requests
                .lock()
                .unwrap()
                .iter()
                .all(|r| !r.contains("/configmaps/"))
        );
    }
}

/// `batch` as agent process `instance` sends it, numbered `sequence`.
fn encoded_batch_of(
    instance: u64,
    sequence: u64,
    batch: network_enforcer_api::uplink::encoded::FlowBatch,
) -> network_enforcer_api::uplink::encoded::FlowBatch {
    network_enforcer_api::uplink::encoded::FlowBatch {
        instance,
        sequence,
        ..batch
    }
}

/// The race the claims' gate closes: once a status pass has written a drain's observations but
/// before it has persisted the claims, another pass (here an evidence pass with nothing new) finds
/// nothing pending and settles the drain. The batch that counted must still not be acknowledged: a
/// new leader could not know it was counted. It is once the status pass has persisted the claims.
#[tokio::test]
async fn a_batch_that_counted_is_acknowledged_only_once_its_claim_is_persisted() {
    let policy = web_allows("other");
    let api = fake_api(&policy).await;
    let (app, sync, mut holds, mark) = claimed_denial(&api).await;
    let evidence = sync.evidence();
    let evidence_mark = holds.evidence.expect("evidence");
    let mut acknowledged = || holds.ready(mark, app.flusher.ledger(), Some(&*evidence));
    assert_eq!(sync.attribute_evidence(), 1);
    // As if the status pass had written the observation and not yet persisted the claims.
    sync.state.lock().unwrap().pending = Pending::default();
    assert_eq!(sync.attribute_evidence(), 0);
    assert!(
        evidence.settled_after(evidence_mark),
        "the evidence pass settles the drain"
    );
    assert!(
        !acknowledged(),
        "acknowledged before the claims were persisted"
    );
    sync.sync_all().await;
    assert!(acknowledged(), "acknowledged once the claims are persisted");
    assert!(
        api.requests
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.ends_with("/configmaps/ne-claims"))
    );
}

/// [`shop_app`] on `api` with the claims persisted in ConfigMap `ne-claims` (read: none yet), a client
/// pod (10.0.0.3), watches that have listed `web_allows("other")`, and one batch of agent process 7
/// (sequence 1) taken in and merged as the stream does: the client's connection to web refused.
/// Returns what its acknowledgement waits for and its flush mark.
async fn claimed_denial(
    api: &FakeApi,
) -> (crate::app::App, Arc<StatusSync>, crate::ingest::Holds, u64) {
    use crate::ingest::claims::BatchName;
    use crate::ingest::claims_store::ClaimsStore;
    let settings = Settings {
        claims_store: Some(ClaimsStore::new(api.client.clone(), "ne", "ne-claims")),
        ..Settings::default()
    };
    let (app, sync, mut writers, _) = shop_app_with(api.client.clone(), 0, settings);
    assert!(
        !app.learning.claims.ready(),
        "no batch before the claims are read"
    );
    sync.restore_claims().await;
    assert!(app.learning.claims.ready(), "nothing persisted yet: ready");
    app.index
        .index
        .write()
        .unwrap()
        .apply_pod(&shop_pod("client", "client", "10.0.0.3", false), 0);
    list(&mut writers.policies, [web_allows("other")]);
    list(&mut writers.network_policies, []);
    list(&mut writers.namespaces, [shop_namespace()]);
    sync.wait_ready().await;
    let batch = encoded_batch_of(
        7,
        1,
        denied_from([10, 0, 0, 3], crate::cluster::watches::now_ms() - 1_000),
    );
    let (_, mut holds) = app.learning.take_in("node-a", &batch);
    let mark = app.flusher.ledger().mark();
    let claim = holds.claim.take().expect("a named batch");
    let name = BatchName {
        node: "node-a",
        instance: 7,
        sequence: 1,
    };
    app.learning.claims.merged(
        name,
        claim.first.as_ref().expect("a first attempt"),
        mark,
        &holds,
    );
    (app, sync, holds, mark)
}
