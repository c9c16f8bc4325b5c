//! The Goldmane source against an in-process Goldmane (a tonic server implementing `goldmane.Flows`
//! from our own proto, requiring client certificates as the real one does) and the real API server,
//! which holds the client certificate Secret and the CA ConfigMap the source reads at every connect.
//! No real Goldmane exists here.
//!
//! Checked: the mutual-TLS connect with material read through the API; a wrong client certificate is
//! refused and the source recovers once the Secret is fixed (re-read on reconnect); a disconnect
//! mid-stream, after which the source resumes from the newest window it received (the window that
//! completed meanwhile is backfilled, not lost); 15-s re-sends counted once; `Allow` reported by the destination reaching learning
//! (pending proposal edges) and `Deny` reaching the violation evidence queue as blocked, with its
//! direction, under the reporting pod's node, the same path as agent batches.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use network_enforcer_api::Backend;
use network_enforcer_api::backoff::Backoff;
use network_enforcer_api::goldmane::flows_server::{Flows, FlowsServer};
use network_enforcer_api::goldmane::{
    Action, EndpointType, Flow, FlowKey, FlowResult, FlowStreamRequest, Reporter,
};
use network_enforcer_controller::app::App;
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::watches::SharedIndex;
use network_enforcer_controller::ingest::Learning;
use network_enforcer_controller::ingest::claims::Claims;
use network_enforcer_controller::ingest::evidence::EvidenceKind;
use network_enforcer_controller::ingest::source_cursors::PersistedCursor;
use network_enforcer_controller::monitor::status_sync::EvidenceQueue;
use network_enforcer_controller::sources::goldmane::{
    Goldmane, GoldmaneConfig, GoldmaneHealth, ObjectRef,
};
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::wait;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

const SERVER_NAME: &str = "goldmane.calico-system.svc";

/// One stream as Goldmane would serve it: the windows of its history (sent only to a request with
/// `start_time_gte > 0`, from the window holding it on, as upstream backfills), then live windows,
/// then an error (Goldmane restarting) or an open stream.
struct Session {
    history: Vec<FlowResult>,
    live: Vec<FlowResult>,
    fails: bool,
}

#[derive(Default)]
struct Script {
    sessions: Mutex<VecDeque<Session>>,
    requests: Mutex<Vec<FlowStreamRequest>>,
}

#[derive(Clone)]
struct FakeGoldmane(Arc<Script>);

type Results = Pin<Box<dyn Stream<Item = Result<FlowResult, Status>> + Send>>;

#[tonic::async_trait]
impl Flows for FakeGoldmane {
    type StreamStream = Results;

    async fn stream(
        &self,
        request: Request<FlowStreamRequest>,
    ) -> Result<Response<Results>, Status> {
        let request = request.into_inner();
        let from = request.start_time_gte;
        self.0.requests.lock().unwrap().push(request);
        let session = self.0.sessions.lock().unwrap().pop_front();
        let Session {
            history,
            live,
            fails,
        } = session.unwrap_or(Session {
            history: vec![],
            live: vec![],
            fails: false,
        });
        // Upstream starts the backfill at the window holding `start_time_gte`.
        let backfill = history
            .into_iter()
            .filter(move |r| from > 0 && r.flow.as_ref().is_some_and(|f| f.end_time > from));
        let head = tokio_stream::iter(backfill.chain(live).map(Ok));
        Ok(Response::new(if fails {
            Box::pin(head.chain(tokio_stream::once(Err(Status::unavailable("restarting")))))
        } else {
            Box::pin(head.chain(tokio_stream::pending()))
        }))
    }
}

struct Pki {
    ca: String,
    server: Identity,
    good: (String, String),
    foreign: (String, String),
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let authority = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), Issuer::new(params, key))
    };
    let (ca_pem, ca) = authority("tigera-operator-test-ca");
    let (_, other) = authority("someone-else");
    let leaf = |names: Vec<String>, issuer: &Issuer<'_, KeyPair>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec![SERVER_NAME.into()], &ca);
    Pki {
        ca: ca_pem,
        server: Identity::from_pem(server_cert, server_key),
        good: leaf(vec!["goldmane-key-pair".into()], &ca),
        foreign: leaf(vec!["intruder".into()], &other),
    }
}

fn key(action: Action, reporter: Reporter) -> FlowKey {
    FlowKey {
        source_name: "client-5f7d9c-*".into(),
        source_namespace: "shop".into(),
        source_type: EndpointType::WorkloadEndpoint as i32,
        dest_name: "server-77f9b-*".into(),
        dest_namespace: "shop".into(),
        dest_type: EndpointType::WorkloadEndpoint as i32,
        dest_port: 8080,
        proto: "tcp".into(),
        reporter: reporter as i32,
        action: action as i32,
        ..FlowKey::default()
    }
}

fn result(id: i64, key: FlowKey, start: i64) -> FlowResult {
    FlowResult {
        id,
        flow: Some(Flow {
            key: Some(key),
            start_time: start,
            end_time: start + 15,
            num_connections_started: 1,
            ..Flow::default()
        }),
    }
}

/// The index as the controller's watches would build it: two Deployments' pods on two nodes.
fn index() -> Index {
    let mut index = Index::default();
    for (deployment, hash, pod, node, ip) in [
        (
            "client",
            "5f7d9c",
            "client-5f7d9c-abcde",
            "node-a",
            "10.1.0.1",
        ),
        (
            "server",
            "77f9b",
            "server-77f9b-xyz12",
            "node-b",
            "10.1.0.2",
        ),
    ] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": pod, "namespace": "shop", "uid": format!("uid-{pod}"),
                "generateName": format!("{deployment}-{hash}-"),
                "labels": {"app": deployment, "pod-template-hash": hash},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": format!("{deployment}-{hash}"), "uid": "rs", "controller": true}]
            },
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap();
        index.apply_pod(&p, 1_000);
    }
    index
}

#[tokio::test]
async fn goldmane_flows_reach_learning_and_evidence_over_mutual_tls_with_rotated_material() {
    let ns = TestNamespace::create("goldmane").await.unwrap();
    let pki = pki();
    // The client certificate Secret starts out wrong (another CA): Goldmane refuses it.
    let secret = |(cert, key): &(String, String)| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("goldmane-key-pair".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(cert.clone().into_bytes())),
            ("tls.key".to_string(), ByteString(key.clone().into_bytes())),
        ])),
        ..Default::default()
    };
    let secrets = ns.api::<Secret>();
    secrets
        .create(&PostParams::default(), &secret(&pki.foreign))
        .await
        .unwrap();
    ns.api::<ConfigMap>()
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some("goldmane-ca-bundle".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    "tigera-ca-bundle.crt".to_string(),
                    pki.ca.clone(),
                )])),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    let mut denied_trace = key(Action::Deny, Reporter::Src);
    denied_trace.policies = Some(
        network_enforcer_tests::e2e::sources::goldmane::end_of_tier_deny("shop", "client-egress"),
    );
    let mut host = key(Action::Allow, Reporter::Dst);
    host.source_type = EndpointType::HostEndpoint as i32;
    let script = Arc::new(Script::default());
    // Windows 10 minutes ago, on Goldmane's 15-s grid: within what it keeps (and backfills).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let base = now - now % 15 - 600;
    let at = |offset: i64| base + offset;
    let first_window = vec![
        result(1, key(Action::Allow, Reporter::Src), at(0)),
        result(2, key(Action::Allow, Reporter::Dst), at(0)),
        result(3, denied_trace.clone(), at(0)),
        result(4, host, at(0)),
    ];
    script.sessions.lock().unwrap().extend([
        // The first window, then the stream breaks (Goldmane's rollout, a network blip).
        Session {
            history: vec![],
            live: first_window.clone(),
            fails: true,
        },
        // While the source was away the next window completed, with a denial at ingress: only a
        // reconnect from the newest window received gets it (a live-only one lost it). The window
        // already taken comes again with it; then the next live window re-sends the same keys.
        Session {
            history: [
                vec![result(0, key(Action::Allow, Reporter::Dst), at(-15))],
                first_window.clone(),
                vec![result(5, key(Action::Deny, Reporter::Dst), at(15))],
            ]
            .concat(),
            live: vec![
                result(2, key(Action::Allow, Reporter::Dst), at(30)),
                result(3, denied_trace.clone(), at(30)),
            ],
            fails: false,
        },
    ]);
    let tls = ServerTlsConfig::new()
        .identity(pki.server.clone())
        .client_ca_root(Certificate::from_pem(&pki.ca));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn({
        let script = script.clone();
        async move {
            Server::builder()
                .tls_config(tls)
                .unwrap()
                .add_service(FlowsServer::new(FakeGoldmane(script)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        }
    });

    let evidence = Arc::new(EvidenceQueue::default());
    let app = App::builder(ns.client.clone(), Backend::Kubernetes)
        .index(Arc::new(SharedIndex::listed(index())))
        .evidence_sink(evidence.clone())
        .build();
    let (learner, learning) = (app.learner.clone(), app.learning.clone());
    let mut config = GoldmaneConfig::new(address);
    config.server_name = Some(SERVER_NAME.into());
    config.tls_secret = ObjectRef {
        namespace: ns.name.clone(),
        name: "goldmane-key-pair".into(),
    };
    config.ca_config_map = ObjectRef {
        namespace: ns.name.clone(),
        name: "goldmane-ca-bundle".into(),
    };
    config.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(300),
    };
    let health = GoldmaneHealth::default();
    let source = tokio::spawn(
        Goldmane {
            config: config.clone(),
            client: ns.client.clone(),
            learning: learning.clone(),
            health: health.clone(),
            readiness: None,
        }
        .run(),
    );

    // Refused while the Secret holds the foreign certificate.
    wait::until(
        "refused attempts to be counted",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || health.errors.get() >= 2,
        || format!("{} errors", health.errors.get()),
    )
    .await
    .unwrap();
    assert_eq!(
        health.messages.get(),
        0,
        "nothing read with a refused certificate"
    );
    assert!(script.requests.lock().unwrap().is_empty());
    // The certificate is rotated in the cluster; the next reconnect reads it.
    secrets
        .patch(
            "goldmane-key-pair",
            &PatchParams::default(),
            &Patch::Merge(secret(&pki.good)),
        )
        .await
        .unwrap();

    let mut records = Vec::new();
    wait::until(
        "both sessions read in full",
        Duration::from_secs(20),
        Duration::from_millis(10),
        || health.messages.get() >= 11,
        || format!("{} messages", health.messages.get()),
    )
    .await
    .unwrap();
    records.extend(evidence.drain());
    assert_eq!(
        health.messages.get(),
        11,
        "both sessions read in full: 4, then 5 backfilled and 2 live"
    );
    let requests = script.requests.lock().unwrap().clone();
    assert_eq!(
        requests.len(),
        2,
        "one stream, then one after the disconnect"
    );
    assert_eq!(
        requests
            .iter()
            .map(|r| r.start_time_gte)
            .collect::<Vec<_>>(),
        vec![0, at(0)],
        "live first, then from the newest window received"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.aggregation_interval == 15
                && r.filter.as_ref().unwrap().actions == vec![1, 2])
    );
    assert_eq!(
        health.resends.get(),
        6,
        "the first window backfilled again (4 keys) and the next live window's re-sends of two"
    );
    assert_eq!(
        health.skipped.get(),
        2,
        "the source's Allow and the host endpoint"
    );
    let mut summary: Vec<(String, String, String)> = records
        .iter()
        .map(|e| {
            (
                format!("{:?}", e.kind),
                format!("{:?}", e.record.opened),
                e.record.local.name.clone(),
            )
        })
        .collect();
    summary.sort();
    let entry = |kind: &str, opened: &str, pod: &str| (kind.into(), opened.into(), pod.into());
    assert_eq!(
        summary,
        vec![
            entry("Blocked", "Inbound", "server-77f9b-xyz12"),
            entry("Blocked", "Outbound", "client-5f7d9c-abcde"),
            entry("WentThrough", "Inbound", "server-77f9b-xyz12"),
        ]
    );
    let allowed = records
        .iter()
        .find(|e| e.kind == EvidenceKind::WentThrough)
        .unwrap();
    assert_eq!(
        allowed.record.peer,
        std::net::IpAddr::from([10, 1, 0, 1]),
        "the client pod's address"
    );
    assert_eq!(allowed.record.port, 8080);
    assert_eq!(
        learner.pending_proposals(),
        2,
        "learned: client egress and server ingress"
    );
    assert_eq!(health.connected.get(), 1);
    source.abort();

    // A new leader: it waits for the persisted evidence claims, then asks from 45 s before the cursor
    // the last leader's written evidence reached (the window at 15 s here). The windows up to the
    // cursor only teach its Dedupe what the last leader let through, so their keys' re-sends at 30 s
    // (within 60 s of 0 s) count no more than they did there; the window at 45 s, completed in
    // between with a new denial, counts; nothing is counted twice.
    let claims = Arc::new(Claims::unread());
    let next = Arc::new(Learning {
        index: learning.index.clone(),
        learner: learning.learner.clone(),
        leader: learning.leader.clone(),
        metrics: learning.metrics.clone(),
        evidence: learning.evidence.clone(),
        waiting: Default::default(),
        names: None,
        claims: claims.clone(),
    });
    let mut egress_deny = key(Action::Deny, Reporter::Src);
    egress_deny.dest_port = 9090;
    script.sessions.lock().unwrap().push_back(Session {
        history: [
            first_window,
            vec![
                result(5, key(Action::Deny, Reporter::Dst), at(15)),
                result(2, key(Action::Allow, Reporter::Dst), at(30)),
                result(3, denied_trace, at(30)),
                result(6, egress_deny, at(45)),
            ],
        ]
        .concat(),
        live: vec![],
        fails: false,
    });
    let next_health = GoldmaneHealth::default();
    let next_source = Goldmane {
        config,
        client: ns.client.clone(),
        learning: next,
        health: next_health.clone(),
        readiness: None,
    };
    let cursor = next_source.cursor_name();
    let next_source = tokio::spawn(next_source.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        script.requests.lock().unwrap().len(),
        2,
        "no stream before the claims are read"
    );
    claims.cursors.restore(vec![PersistedCursor {
        source: cursor,
        through: at(15),
    }]);
    claims.restore(vec![]);
    wait::until(
        "the backfill after the cursor",
        Duration::from_secs(20),
        Duration::from_millis(10),
        || next_health.messages.get() >= 8,
        || format!("{} messages", next_health.messages.get()),
    )
    .await
    .unwrap();
    let requests = script.requests.lock().unwrap().clone();
    assert_eq!(
        requests[2].start_time_gte,
        at(-30),
        "45 s before the cursor's window"
    );
    assert_eq!(next_health.messages.get(), 8, "{requests:?}");
    let mut after: Vec<(u16, String)> = evidence
        .drain()
        .iter()
        .map(|e| (e.record.port, format!("{:?}", e.record.opened)))
        .collect();
    after.sort();
    assert_eq!(
        after,
        vec![(9090, "Outbound".into())],
        "the new denial at 45 s only: 30 s re-sends what counted at 0 s"
    );
    next_source.abort();
    server.abort();
}
