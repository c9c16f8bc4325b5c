//! OpenTelemetry logs (docs/operations.md, "Telemetry"): the controller's OTLP sink against in-process
//! OTLP receivers — a tonic server implementing
//! `opentelemetry.proto.collector.logs.v1.LogsService/Export` (plaintext and mutual TLS with rcgen
//! certificates) and an http/protobuf receiver on loopback — asserting every attribute, severity, body,
//! event name, scope and `service.name`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use network_enforcer_api::{
    AcknowledgedViolation, Backend, Direction, PolicyMode, Protocol, ViolationRecord, WorkloadRef,
};
use network_enforcer_controller::monitor::otlp::{
    AttributeValue, EventSeverity, OBSERVED_EVENT, Otlp, OtlpConfig, OtlpProtocol, ViolationSink,
    acknowledged_event, observed_event,
};
use network_enforcer_controller::monitor::violations::Observation;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use prost::Message as _;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a receiver got: each request with the request headers of interest.
struct Received {
    request: ExportLogsServiceRequest,
    api_key: Option<String>,
    /// Whether the client presented a certificate (TLS receivers only).
    client_certificate: bool,
}

#[derive(Clone)]
struct Receiver {
    sender: mpsc::UnboundedSender<Received>,
}

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let api_key = request
            .metadata()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let client_certificate = request.peer_certs().is_some_and(|c| !c.is_empty());
        let _ = self.sender.send(Received {
            request: request.into_inner(),
            api_key,
            client_certificate,
        });
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

/// A gRPC receiver on loopback; with `tls` = (server cert, server key, client CA) it requires a
/// client certificate signed by that CA.
async fn grpc_receiver(
    tls: Option<(String, String, String)>,
) -> (SocketAddr, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sender, receiver) = mpsc::unbounded_channel();
    let mut server = tonic::transport::Server::builder();
    if let Some((cert, key, client_ca)) = tls {
        server = server
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(cert, key))
                    .client_ca_root(tonic::transport::Certificate::from_pem(client_ca)),
            )
            .unwrap();
    }
    let router = server.add_service(LogsServiceServer::new(Receiver { sender }));
    tokio::spawn(
        router.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, receiver)
}

/// An OTLP/HTTP receiver: POST /v1/logs with a protobuf body, answered with a protobuf response.
async fn http_receiver() -> (SocketAddr, mpsc::UnboundedReceiver<(String, Received)>) {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode, header};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sender, receiver) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/v1/logs",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let sender = sender.clone();
            async move {
                let content_type = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let Ok(request) = ExportLogsServiceRequest::decode(body) else {
                    return (StatusCode::BAD_REQUEST, Vec::new());
                };
                let api_key = headers
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                let _ = sender.send((
                    content_type,
                    Received {
                        request,
                        api_key,
                        client_certificate: false,
                    },
                ));
                (
                    StatusCode::OK,
                    ExportLogsServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, receiver)
}

fn time(s: &str) -> Time {
    serde_json::from_value(serde_json::json!(s)).unwrap()
}

fn observation() -> Observation {
    Observation {
        timestamp: time("2026-11-29T16:00:00Z"),
        source: WorkloadRef {
            namespace: "demo".into(),
            owner_kind: "Deployment".into(),
            owner_name: "http-client".into(),
            identity: "cluster.local/ns/demo/sa/http-client-sa".into(),
            selector: "app=http-client".into(),
            address: String::new(),
            dns_name: String::new(),
        },
        dest: WorkloadRef {
            namespace: "demo".into(),
            owner_kind: "Deployment".into(),
            owner_name: "http-server".into(),
            // No identity: the attribute is left out.
            ..WorkloadRef::default()
        },
        protocol: Protocol::UDP,
        dst_port: Some(18081),
        action: PolicyMode::Monitor,
        direction: Direction::Egress,
        denying_policy_namespace: "demo".into(),
        denying_policy_name: "deployment-http-client-egress".into(),
    }
}

fn acknowledged() -> AcknowledgedViolation {
    AcknowledgedViolation {
        violation: ViolationRecord {
            id: 3,
            timestamp: time("2026-11-29T16:05:07Z"),
            source: WorkloadRef {
                namespace: "demo".into(),
                owner_kind: "Deployment".into(),
                owner_name: "http-client".into(),
                identity: "cluster.local/ns/demo/sa/http-client-sa".into(),
                ..WorkloadRef::default()
            },
            dest: WorkloadRef {
                address: "203.0.113.7".into(),
                ..WorkloadRef::default()
            },
            protocol: Protocol::TCP,
            dst_port: Some(443),
            action: PolicyMode::Protect,
            direction: Some(Direction::Egress),
            denying_policy_namespace: "demo".into(),
            denying_policy_name: "deployment-http-client-egress".into(),
        },
        reason: "known CDN".into(),
        acknowledged_at: time("2026-11-29T17:00:00Z"),
    }
}

#[derive(Debug, PartialEq)]
enum V {
    S(String),
    I(i64),
}

fn s(v: &str) -> V {
    V::S(v.to_string())
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, V> {
    let mut map = BTreeMap::new();
    for kv in kvs {
        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(v)) => V::S(v.clone()),
            Some(Value::IntValue(v)) => V::I(*v),
            other => panic!("attribute {} has an unexpected value {other:?}", kv.key),
        };
        assert!(
            map.insert(kv.key.clone(), value).is_none(),
            "attribute {} twice",
            kv.key
        );
    }
    map
}

fn body(record: &LogRecord) -> Option<&str> {
    match record.body.as_ref() {
        Some(AnyValue {
            value: Some(Value::StringValue(s)),
        }) => Some(s),
        _ => None,
    }
}

/// Collects records until `count` arrived (the exporter batches as it likes), checking the resource
/// and scope of every request.
async fn collect(
    receiver: &mut mpsc::UnboundedReceiver<Received>,
    count: usize,
    service_name: &str,
) -> (Vec<LogRecord>, Vec<Received>) {
    let mut records = Vec::new();
    let mut requests = Vec::new();
    while records.len() < count {
        let received = tokio::time::timeout(Duration::from_secs(60), receiver.recv())
            .await
            .expect("the receiver got the events within a minute")
            .expect("receiver open");
        for resource_logs in &received.request.resource_logs {
            let resource = attributes(
                &resource_logs
                    .resource
                    .as_ref()
                    .expect("a resource")
                    .attributes,
            );
            assert_eq!(resource.get("service.name"), Some(&s(service_name)));
            for scope_logs in &resource_logs.scope_logs {
                let scope = scope_logs.scope.as_ref().expect("a scope");
                assert_eq!(scope.name, "network-enforcer");
                records.extend(scope_logs.log_records.iter().cloned());
            }
        }
        requests.push(received);
    }
    assert_eq!(records.len(), count, "no more records than emitted");
    (records, requests)
}

/// Asserts both events exactly: severity, body, event name, every attribute and nothing more.
fn assert_events(records: &[LogRecord]) {
    let observed = records
        .iter()
        .find(|r| r.event_name == "policy_violation_observed")
        .expect("an observed event");
    assert_eq!(observed.severity_number, 13, "SEVERITY_NUMBER_WARN");
    assert_eq!(observed.severity_text, "WARN");
    assert_eq!(body(observed), Some("policy_violation_observed"));
    assert!(observed.time_unix_nano > 0);
    let expected: BTreeMap<String, V> = [
        ("enforcement.provider", s("kubernetes")),
        ("action", s("monitor")),
        ("source.workload.name", s("http-client")),
        ("source.workload.namespace", s("demo")),
        ("source.workload.kind", s("Deployment")),
        (
            "source.workload.identity",
            s("cluster.local/ns/demo/sa/http-client-sa"),
        ),
        ("destination.workload.name", s("http-server")),
        ("destination.workload.namespace", s("demo")),
        ("destination.workload.kind", s("Deployment")),
        ("network.transport", s("UDP")),
        ("destination.port", V::I(18081)),
        ("policy.ref.namespace", s("demo")),
        ("policy.ref.name", s("deployment-http-client-egress")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(attributes(&observed.attributes), expected);

    let ack = records
        .iter()
        .find(|r| r.event_name == "policy_violation_acknowledged")
        .expect("an acknowledged event");
    assert_eq!(ack.severity_number, 9, "SEVERITY_NUMBER_INFO");
    assert_eq!(ack.severity_text, "INFO");
    assert_eq!(body(ack), Some("policy_violation_acknowledged"));
    let expected: BTreeMap<String, V> = [
        ("id", V::I(3)),
        ("timestamp", s("2026-11-29T16:05:07Z")),
        ("reason", s("known CDN")),
        ("source.namespace", s("demo")),
        ("source.workload.kind", s("Deployment")),
        ("source.workload.name", s("http-client")),
        (
            "source.workload.identity",
            s("cluster.local/ns/demo/sa/http-client-sa"),
        ),
        // Present although empty: the destination is an address, not a workload.
        ("dest.namespace", s("")),
        ("dest.workload.kind", s("")),
        ("dest.workload.name", s("")),
        ("dest.workload.identity", s("")),
        ("protocol", s("TCP")),
        ("dstPort", V::I(443)),
        ("action", s("protect")),
        ("denyingPolicy.namespace", s("demo")),
        ("denyingPolicy.name", s("deployment-http-client-egress")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(attributes(&ack.attributes), expected);
}

/// The observed event leaves out empty strings (here the destination is an address: no workload
/// attributes, but `destination.address`) but always carries the port, 0 when the record has none;
/// its attributes come in a fixed order.
#[test]
fn observed_leaves_out_empty_strings_but_always_has_the_port() {
    let o = Observation {
        dst_port: None,
        dest: acknowledged().violation.dest,
        ..observation()
    };
    let event = observed_event(Backend::Kubernetes, &o);
    assert_eq!(
        (event.name, event.severity),
        (OBSERVED_EVENT, EventSeverity::Warn)
    );
    let keys: Vec<&str> = event.attributes.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "enforcement.provider",
            "action",
            "source.workload.name",
            "source.workload.namespace",
            "source.workload.kind",
            "source.workload.identity",
            "destination.address",
            "network.transport",
            "destination.port",
            "policy.ref.namespace",
            "policy.ref.name",
        ]
    );
    assert_eq!(
        event.attributes[6].1,
        AttributeValue::String("203.0.113.7".into())
    );
    assert_eq!(event.attributes[8].1, AttributeValue::Int(0));
    // Reached by name: the name is the destination's address.
    let mut named = o.clone();
    named.dest.dns_name = "api.partner.test".into();
    let event = observed_event(Backend::Kubernetes, &named);
    assert_eq!(
        event.attributes[6],
        (
            "destination.address",
            AttributeValue::String("api.partner.test".into())
        )
    );
}

/// The acknowledged event has all 16 attributes in a fixed order, also the empty ones.
#[test]
fn acknowledged_has_every_attribute_even_empty_ones() {
    let event = acknowledged_event(&AcknowledgedViolation {
        reason: String::new(),
        ..acknowledged()
    });
    assert_eq!(event.severity, EventSeverity::Info);
    let keys: Vec<&str> = event.attributes.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "id",
            "timestamp",
            "reason",
            "source.namespace",
            "source.workload.kind",
            "source.workload.name",
            "source.workload.identity",
            "dest.namespace",
            "dest.workload.kind",
            "dest.workload.name",
            "dest.workload.identity",
            "protocol",
            "dstPort",
            "action",
            "denyingPolicy.namespace",
            "denyingPolicy.name",
        ]
    );
    assert_eq!(event.attributes[2].1, AttributeValue::String(String::new()));
    assert_eq!(event.attributes[12].1, AttributeValue::Int(443));
}

fn emit_both(sink: &dyn ViolationSink) {
    sink.observed(Backend::Kubernetes, &observation());
    sink.acknowledged(&acknowledged());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_export_carries_every_attribute_scope_and_service_name() {
    let (addr, mut receiver) = grpc_receiver(None).await;
    let mut config = OtlpConfig::new(format!("http://{addr}"), OtlpProtocol::Grpc);
    config.headers = vec![("x-api-key".into(), "s3cret".into())];
    config.service_name = "ne-test".into();
    let sink = Otlp::start(config).unwrap();
    emit_both(&sink);
    let (records, requests) = collect(&mut receiver, 2, "ne-test").await;
    assert_events(&records);
    assert!(
        requests
            .iter()
            .all(|r| r.api_key.as_deref() == Some("s3cret"))
    );
    sink.shutdown(Duration::from_secs(10)).await;
    assert_eq!(sink.stats().exported.get(), 2);
    assert_eq!(sink.stats().dropped.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_export_carries_every_attribute_and_the_default_service_name() {
    let (addr, mut receiver) = http_receiver().await;
    // Configured the way a deployment does it: the standard variables.
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-api-key=a%20key".to_string(),
        ),
    ];
    let config = OtlpConfig::from_env(|k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
    .expect("an endpoint is configured");
    let sink = Otlp::start(config).unwrap();
    emit_both(&sink);
    let (forward, mut forwarded) = mpsc::unbounded_channel();
    let mut total = 0;
    while total < 2 {
        let (content_type, received) =
            tokio::time::timeout(Duration::from_secs(60), receiver.recv())
                .await
                .expect("the receiver got the events within a minute")
                .unwrap();
        assert_eq!(content_type, "application/x-protobuf");
        assert_eq!(received.api_key.as_deref(), Some("a key"));
        total += received
            .request
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len())
            .sum::<usize>();
        forward.send(received).unwrap();
    }
    let (records, _) = collect(&mut forwarded, 2, "network-enforcer-controller").await;
    assert_events(&records);
    sink.shutdown(Duration::from_secs(10)).await;
}

/// A CA, a server certificate for localhost signed by it, and a client certificate signed by it,
/// as PEM files in a fresh directory.
struct Pki {
    dir: PathBuf,
    ca: String,
    server_cert: String,
    server_key: String,
}

fn pki() -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "otlp-test-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &ca).unwrap();

    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "network-enforcer-controller");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &ca).unwrap();

    let dir = std::env::temp_dir().join(format!("ne-otlp-pki-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("client.crt"), client_cert.pem()).unwrap();
    std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();
    Pki {
        dir,
        ca: ca_cert.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_mutual_tls_with_ca_and_client_certificate() {
    let pki = pki();
    let (addr, mut receiver) = grpc_receiver(Some((
        pki.server_cert.clone(),
        pki.server_key.clone(),
        pki.ca.clone(),
    )))
    .await;
    let endpoint = format!("https://localhost:{}", addr.port());

    // Without a client certificate the collector refuses the handshake: nothing arrives, the
    // failure is counted, the sink does not block.
    let mut anonymous = OtlpConfig::new(&endpoint, OtlpProtocol::Grpc);
    anonymous.ca_certificate = Some(pki.dir.join("ca.crt"));
    anonymous.timeout = Duration::from_secs(5);
    let refused = Otlp::start(anonymous).unwrap();
    emit_both(&refused);
    refused.shutdown(Duration::from_secs(30)).await;
    assert_eq!(refused.stats().exported.get(), 0);
    assert_eq!(refused.stats().failed.get(), 2);
    assert!(
        receiver.try_recv().is_err(),
        "nothing reached the collector"
    );

    let mut config = OtlpConfig::new(&endpoint, OtlpProtocol::Grpc);
    config.ca_certificate = Some(pki.dir.join("ca.crt"));
    config.client_certificate = Some(pki.dir.join("client.crt"));
    config.client_key = Some(pki.dir.join("client.key"));
    let sink = Otlp::start(config).unwrap();
    emit_both(&sink);
    let (records, requests) = collect(&mut receiver, 2, "network-enforcer-controller").await;
    assert_events(&records);
    assert!(requests.iter().all(|r| r.client_certificate));
    sink.shutdown(Duration::from_secs(10)).await;
    assert_eq!(sink.stats().exported.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_drops_and_counts_instead_of_blocking() {
    // Accepts connections and never reads: every export hangs until its timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
        }
    });
    let mut config = OtlpConfig::new(format!("http://{addr}"), OtlpProtocol::Grpc);
    config.queue_size = 4;
    config.batch_size = 4;
    config.timeout = Duration::from_secs(2);
    let sink = Otlp::start(config).unwrap();
    for _ in 0..100 {
        sink.observed(Backend::Istio, &observation());
    }
    let stats = sink.stats();
    // At most one batch in flight and one full queue were accepted; the rest was dropped.
    assert_eq!(stats.queued.get() + stats.dropped.get(), 100);
    assert!(stats.queued.get() <= 8, "queued {}", stats.queued.get());
    assert!(stats.dropped.get() >= 92, "dropped {}", stats.dropped.get());
    sink.shutdown(Duration::from_secs(30)).await;
    assert_eq!(stats.exported.get(), 0);
    assert_eq!(stats.failed.get(), stats.queued.get());
    held.abort();
}

#[test]
fn a_missing_certificate_file_fails_at_start() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let mut config = OtlpConfig::new("https://localhost:4317", OtlpProtocol::Grpc);
    config.ca_certificate = Some(PathBuf::from("/nonexistent/ca.crt"));
    let err = Otlp::start(config).err().expect("refused");
    assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");
}

/// The controller holds the sink as `Arc<dyn ViolationSink>` and shuts it down on its way out: through
/// the trait object, shutdown waits until the queued events have been exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_through_the_sink_trait_exports_the_queued_events_first() {
    let (addr, mut receiver) = grpc_receiver(None).await;
    let config = OtlpConfig::new(format!("http://{addr}"), OtlpProtocol::Grpc);
    let service_name = config.service_name.clone();
    let otlp = Otlp::start(config).unwrap();
    let stats = otlp.stats().clone();
    let sink: std::sync::Arc<dyn ViolationSink> = std::sync::Arc::new(otlp);
    emit_both(sink.as_ref());
    sink.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        (stats.exported.get(), stats.dropped.get()),
        (2, 0),
        "exported before shutdown returned"
    );
    let (records, _) = collect(&mut receiver, 2, &service_name).await;
    assert_events(&records);
    // After shutdown an event neither blocks nor fails; it is not exported.
    sink.observed(Backend::Kubernetes, &observation());
    assert_eq!(stats.exported.get(), 2);
}
