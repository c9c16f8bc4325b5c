//! The Hubble source against an in-process Hubble: a tonic server implementing `observer.Observer`
//! from our own proto, streaming scripted flows (replies, drops for other reasons, unknown enum values,
//! lost events, a disconnect mid-stream), over a unix socket in a temp dir as on a node, and over TCP
//! with TLS (with and without client certificates) as Hubble Relay. No real Hubble exists here.

use network_enforcer_agent::sources::hubble::{self, HubbleConfig, RelayTls, Target};
use network_enforcer_agent::sources::{RecordSink, SourceMetrics, SourceName, SourcesStop};
use network_enforcer_api::backoff::Backoff;
use network_enforcer_api::hubble::observer_server::{Observer, ObserverServer};
use network_enforcer_api::hubble::{
    Endpoint, Flow, GetFlowsRequest, GetFlowsResponse, Ip, Layer4, LostEvent, Policy, Tcp,
    TrafficDirection, Verdict, get_flows_response::ResponseTypes, layer4,
};
use network_enforcer_api::uplink::{FlowRecord, Outcome};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// How a scripted session ends after its responses.
#[derive(Clone, Copy)]
enum End {
    /// The stream breaks (Hubble restarted, connection lost).
    Fail,
    /// The stream stays open (follow).
    Hang,
}

#[derive(Default)]
struct Script {
    sessions: Mutex<VecDeque<(Vec<GetFlowsResponse>, End)>>,
    requests: Mutex<Vec<GetFlowsRequest>>,
}

#[derive(Clone)]
struct FakeHubble(Arc<Script>);

type FlowStream = Pin<Box<dyn Stream<Item = Result<GetFlowsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Observer for FakeHubble {
    type GetFlowsStream = FlowStream;

    async fn get_flows(
        &self,
        request: Request<GetFlowsRequest>,
    ) -> Result<Response<FlowStream>, Status> {
        self.0.requests.lock().unwrap().push(request.into_inner());
        let (responses, end) = self
            .0
            .sessions
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((vec![], End::Hang));
        let head = tokio_stream::iter(responses.into_iter().map(Ok));
        let stream: FlowStream = match end {
            End::Fail => Box::pin(head.chain(tokio_stream::once(Err(Status::unavailable(
                "hubble went away",
            ))))),
            End::Hang => Box::pin(head.chain(tokio_stream::pending())),
        };
        Ok(Response::new(stream))
    }
}

fn endpoint(ns: &str, pod: &str) -> Endpoint {
    Endpoint {
        namespace: ns.into(),
        pod_name: pod.into(),
        ..Endpoint::default()
    }
}

/// A TCP flow web-1 → catalog-1:port seen at `secs`.
fn flow(uuid: &str, secs: i64, port: u32, verdict: i32, node: &str) -> Flow {
    Flow {
        time: Some(prost_types::Timestamp {
            seconds: secs,
            nanos: 0,
        }),
        uuid: uuid.into(),
        verdict,
        ip: Some(Ip {
            source: "10.0.0.1".into(),
            destination: "10.0.0.2".into(),
            ..Ip::default()
        }),
        l4: Some(Layer4 {
            protocol: Some(layer4::Protocol::Tcp(Tcp {
                source_port: 40_000,
                destination_port: port,
                flags: None,
            })),
        }),
        source: Some(endpoint("shop", "web-1")),
        destination: Some(endpoint("shop", "catalog-1")),
        traffic_direction: TrafficDirection::Egress as i32,
        node_name: node.into(),
        ..Flow::default()
    }
}

fn respond(flow: Flow) -> GetFlowsResponse {
    GetFlowsResponse {
        response_types: Some(ResponseTypes::Flow(flow)),
        ..GetFlowsResponse::default()
    }
}

fn config(target: Target, node: Option<&str>) -> HubbleConfig {
    let mut c = HubbleConfig::new(target, node.map(str::to_string));
    c.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    c
}

/// The stop signal of a client that runs until the test aborts it (the sender is never dropped:
/// a dropped sender stops the client, as when the agent stops).
fn running() -> tokio::sync::oneshot::Receiver<()> {
    let (tell, told) = tokio::sync::oneshot::channel();
    std::mem::forget(tell);
    told
}

/// Waits (bounded) until `sink` has produced `n` records in all; returns them.
async fn collect(sink: &RecordSink, n: usize) -> Vec<FlowRecord> {
    let mut all = Vec::new();
    for _ in 0..1000 {
        all.extend(sink.drain());
        if all.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    all
}

fn metric(metrics: &SourceMetrics, line_prefix: &str) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn socket_stream_skips_replies_and_other_drops_and_resumes_without_loss_or_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hubble.sock");
    let script = Arc::new(Script::default());
    let mut reply = flow("r", 11, 8080, Verdict::Forwarded as i32, "");
    reply.is_reply = Some(true);
    let mut stale_drop = flow("s", 12, 8080, Verdict::Dropped as i32, "");
    stale_drop.drop_reason_desc = 151;
    let mut unknown_reason = flow("u", 13, 8080, Verdict::Dropped as i32, "");
    unknown_reason.drop_reason_desc = 9_999;
    let unknown_verdict = flow("v", 14, 8080, 42, "");
    let mut denied = flow("d", 15, 9090, Verdict::Dropped as i32, "");
    denied.drop_reason_desc = 133;
    denied.egress_denied_by = vec![Policy {
        name: "web-egress".into(),
        namespace: "shop".into(),
        ..Policy::default()
    }];
    let lost = GetFlowsResponse {
        response_types: Some(ResponseTypes::LostEvents(LostEvent {
            source: 3,
            num_events_lost: 7,
            ..LostEvent::default()
        })),
        ..GetFlowsResponse::default()
    };
    let first = vec![
        respond(flow("a", 10, 8080, Verdict::Forwarded as i32, "")),
        respond(reply),
        respond(stale_drop),
        respond(unknown_reason),
        respond(unknown_verdict),
        lost,
        respond(denied.clone()),
    ];
    // After the reconnect Hubble sends again what it has since the `since` asked for (inclusive: the
    // denied flow at 15), then the new flow.
    let mut new_flow = flow("b", 16, 8443, Verdict::Forwarded as i32, "");
    new_flow.destination = Some(endpoint("shop", "payments-1"));
    let second = vec![respond(denied), respond(new_flow)];
    script
        .sessions
        .lock()
        .unwrap()
        .extend([(first, End::Fail), (second, End::Hang)]);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        Server::builder()
            .add_service(ObserverServer::new(FakeHubble(script.clone())))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let metrics = SourceMetrics::default();
    let sink = RecordSink::default();
    let client = tokio::spawn(hubble::run(
        config(Target::Socket(socket.clone()), None),
        sink.clone(),
        metrics.source(SourceName::hubble),
        running(),
    ));
    let mut records = collect(&sink, 3).await;
    // The repeat of the denied flow comes before the new flow in the second session, so it has been
    // handled by now: had it been taken, the denied record would count 2.
    records.sort_by_key(|r| r.port);
    let summary: Vec<(u32, i32, &str)> = records
        .iter()
        .map(|r| (r.port, r.outcome, r.policy.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (8080, Outcome::Established as i32, ""),
            (8443, Outcome::Established as i32, ""),
            (9090, Outcome::Denied as i32, "shop/web-egress"),
        ],
        "each flow once: no reply, no non-policy drop, no unknown verdict, the repeat after the reconnect dropped"
    );
    assert!(records.iter().all(|r| r.count == 1));
    let requests = script.requests.lock().unwrap().clone();
    assert!(requests.len() >= 2);
    assert!(requests[0].follow && requests[0].since.is_none());
    assert_eq!(
        requests[1].since.map(|t| t.seconds),
        Some(15),
        "resumed from the last flow"
    );
    assert_eq!(
        metric(&metrics, "source_lost_events_total"),
        "source_lost_events_total{source=\"hubble\"} 7"
    );
    assert_eq!(
        metric(&metrics, "source_connected"),
        "source_connected{source=\"hubble\"} 1"
    );
    assert!(
        !metric(&metrics, "source_errors_total").ends_with(" 0"),
        "the disconnect is counted"
    );
    client.abort();
    server.abort();
}

/// An agent that ships two flows (a at 10 s, b at 11 s), has them acknowledged by the controller
/// (`acknowledged`) or not, stops (SIGTERM) and starts again, while Hubble got c (12 s): returns the
/// ports the restarted agent takes and the `since` of every request.
async fn restart_after_shipping(acknowledged: bool) -> (Vec<u32>, Vec<Option<i64>>) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hubble.sock");
    let state = dir.path().join("state/hubble-resume.json");
    let script = Arc::new(Script::default());
    let (a, b, c) = (
        flow("a", 10, 8080, Verdict::Forwarded as i32, ""),
        flow("b", 11, 8081, Verdict::Forwarded as i32, ""),
        flow("c", 12, 8082, Verdict::Forwarded as i32, ""),
    );
    // After the restart Hubble sends what it has since the request's `since` (inclusive); without
    // one, only what comes next (c).
    let after_restart = if acknowledged {
        vec![respond(b.clone()), respond(c.clone())]
    } else {
        vec![respond(a.clone()), respond(b.clone()), respond(c.clone())]
    };
    script.sessions.lock().unwrap().extend([
        (vec![respond(a), respond(b)], End::Hang),
        (after_restart, End::Hang),
    ]);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        Server::builder()
            .add_service(ObserverServer::new(FakeHubble(script.clone())))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let start = |sink: &RecordSink| {
        let (tell, told) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(hubble::run(
            HubbleConfig {
                state_file: Some(state.clone()),
                ..config(Target::Socket(socket.clone()), None)
            },
            sink.clone(),
            SourceMetrics::default().source(SourceName::hubble),
            told,
        ));
        let mut stop = SourcesStop::default();
        stop.push("hubble", tell, task);
        stop
    };

    let sink = RecordSink::default();
    let agent = start(&sink);
    // The agent's flushes ship what the client handed over; the controller acknowledges it or not.
    let mut shipped = Vec::new();
    let mut receipts = Vec::new();
    for _ in 0..500 {
        let (records, mut flushed) = sink.drain_with_receipts();
        shipped.extend(records);
        receipts.append(&mut flushed);
        if shipped.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shipped.len(), 2, "{shipped:?}");
    if acknowledged {
        receipts.into_iter().for_each(|r| r.settle());
    }
    agent.stop().await;

    let sink = RecordSink::default();
    let agent = start(&sink);
    let expected = if acknowledged { 1 } else { 3 };
    let mut records = collect(&sink, expected).await;
    // Hubble's stream is in time order: anything taken twice would be here by now.
    tokio::time::sleep(Duration::from_millis(400)).await;
    records.extend(sink.drain());
    let mut ports: Vec<u32> = records.iter().map(|r| r.port).collect();
    ports.sort();
    let since = script
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.since.map(|t| t.seconds))
        .collect();
    agent.stop().await;
    server.abort();
    (ports, since)
}

/// An agent restart (a rolling update): the client saves the newest resume point whose records the
/// controller acknowledged, a last time when the agent stops, and the restarted client asks Hubble
/// for the flows since then: the flow of the gap is taken, the acknowledged ones not again. Before the
/// resume point was saved, a restarted agent started with live flows (`since` unset) and lost the gap.
#[tokio::test]
async fn a_restarted_agent_resumes_after_what_the_controller_acknowledged() {
    let (ports, since) = restart_after_shipping(true).await;
    assert_eq!(ports, vec![8082], "only the flow of the gap");
    assert_eq!(
        since,
        vec![None, Some(11)],
        "live at the first start, then since the acknowledged point"
    );
}

/// What the controller never acknowledged is not saved: the restarted agent takes it again.
#[tokio::test]
async fn flows_never_acknowledged_are_taken_again_after_a_restart() {
    let (ports, since) = restart_after_shipping(false).await;
    assert_eq!(ports, vec![8080, 8081, 8082]);
    assert_eq!(since, vec![None, None]);
}

#[tokio::test]
async fn a_missing_socket_is_retried_until_hubble_appears() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hubble.sock");
    let metrics = SourceMetrics::default();
    let sink = RecordSink::default();
    let client = tokio::spawn(hubble::run(
        config(Target::Socket(socket.clone()), None),
        sink.clone(),
        metrics.source(SourceName::hubble),
        running(),
    ));
    // Several failed attempts, and the task is still there.
    for _ in 0..500 {
        if metric(&metrics, "source_errors_total") != "source_errors_total{source=\"hubble\"} 0"
            && !metric(&metrics, "source_errors_total").ends_with(" 1")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !client.is_finished(),
        "a missing peer never ends the source"
    );
    let script = Arc::new(Script::default());
    script.sessions.lock().unwrap().push_back((
        vec![respond(flow("a", 10, 8080, Verdict::Forwarded as i32, ""))],
        End::Hang,
    ));
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        Server::builder()
            .add_service(ObserverServer::new(FakeHubble(script)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let records = collect(&sink, 1).await;
    assert_eq!(records.len(), 1);
    client.abort();
    server.abort();
}

struct Pki {
    ca: String,
    server: Identity,
    dir: tempfile::TempDir,
}

const RELAY_NAME: &str = "ui.hubble-relay.cilium.io";

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hubble-test-ca");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec![RELAY_NAME.to_string()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "network-enforcer-agent");
    let client = client.signed_by(&client_key, &ca).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca_cert.pem()).unwrap();
    std::fs::write(dir.path().join("client.crt"), client.pem()).unwrap();
    std::fs::write(dir.path().join("client.key"), client_key.serialize_pem()).unwrap();
    Pki {
        ca: ca_cert.pem(),
        server: Identity::from_pem(server.pem(), server_key.serialize_pem()),
        dir,
    }
}

/// A TLS Relay on loopback streaming one flow of node-a and one of node-b; `require_client_cert`
/// makes it refuse clients without a certificate signed by the CA.
async fn relay(pki: &Pki, require_client_cert: bool) -> (String, tokio::task::JoinHandle<()>) {
    let script = Arc::new(Script::default());
    let mut other_node = flow("b", 11, 9999, Verdict::Forwarded as i32, "kind/node-b");
    other_node.uuid = "b".into();
    script.sessions.lock().unwrap().push_back((
        vec![
            respond(flow(
                "a",
                10,
                8080,
                Verdict::Forwarded as i32,
                "kind/node-a",
            )),
            respond(other_node),
        ],
        End::Hang,
    ));
    let mut tls = ServerTlsConfig::new().identity(pki.server.clone());
    if require_client_cert {
        tls = tls.client_ca_root(Certificate::from_pem(&pki.ca));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(ObserverServer::new(FakeHubble(script)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (address, server)
}

fn relay_tls(pki: &Pki, client_cert: bool) -> RelayTls {
    RelayTls {
        ca: Some(pki.dir.path().join("ca.crt")),
        server_name: Some(RELAY_NAME.into()),
        client_cert: client_cert.then(|| pki.dir.path().join("client.crt")),
        client_key: client_cert.then(|| pki.dir.path().join("client.key")),
    }
}

#[tokio::test]
async fn relay_with_mutual_tls_streams_only_this_nodes_flows() {
    let pki = pki();
    let (address, server) = relay(&pki, true).await;
    let sink = RecordSink::default();
    let metrics = SourceMetrics::default();
    let target = Target::Relay {
        address,
        tls: Some(relay_tls(&pki, true)),
    };
    let client = tokio::spawn(hubble::run(
        config(target, Some("node-a")),
        sink.clone(),
        metrics.source(SourceName::hubble),
        running(),
    ));
    let records = collect(&sink, 1).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].port, 8080, "node-b's flow is not this agent's");
    // Both flows were read; node-b's was skipped.
    for _ in 0..500 {
        if metric(&metrics, "source_skipped_total").ends_with(" 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        metric(&metrics, "source_skipped_total"),
        "source_skipped_total{source=\"hubble\"} 1"
    );
    client.abort();
    server.abort();
}

#[tokio::test]
async fn relay_requiring_client_certs_refuses_a_client_without_one() {
    let pki = pki();
    let (address, server) = relay(&pki, true).await;
    let sink = RecordSink::default();
    let metrics = SourceMetrics::default();
    let target = Target::Relay {
        address,
        tls: Some(relay_tls(&pki, false)),
    };
    let client = tokio::spawn(hubble::run(
        config(target, None),
        sink.clone(),
        metrics.source(SourceName::hubble),
        running(),
    ));
    // Wait for a few failed attempts.
    for _ in 0..1000 {
        let errors = metric(&metrics, "source_errors_total");
        let n: u64 = errors
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if n >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let errors = metric(&metrics, "source_errors_total");
    assert!(
        !errors.ends_with(" 0") && !errors.ends_with(" 1") && !errors.ends_with(" 2"),
        "{errors}"
    );
    assert!(sink.drain().is_empty(), "nothing from a refused connection");
    assert_eq!(
        metric(&metrics, "source_connected"),
        "source_connected{source=\"hubble\"} 0"
    );
    assert!(!client.is_finished());
    client.abort();
    server.abort();
}

#[tokio::test]
async fn relay_with_server_tls_only_accepts_a_client_without_a_certificate() {
    let pki = pki();
    let (address, server) = relay(&pki, false).await;
    let sink = RecordSink::default();
    let target = Target::Relay {
        address,
        tls: Some(relay_tls(&pki, false)),
    };
    let client = tokio::spawn(hubble::run(
        config(target, None),
        sink.clone(),
        SourceMetrics::default().source(SourceName::hubble),
        running(),
    ));
    let mut records = collect(&sink, 2).await;
    records.sort_by_key(|r| r.port);
    assert_eq!(
        records.iter().map(|r| r.port).collect::<Vec<_>>(),
        vec![8080, 9999],
        "without a node filter every node's flows are taken"
    );
    client.abort();
    server.abort();
}

/// Property test of the Hubble conversion: any flow (arbitrary enum values, addresses, names) converts
/// or is skipped without panicking, and a record is always well-formed.
mod properties {
    use super::*;
    use network_enforcer_agent::sources::hubble::convert;
    use network_enforcer_api::uplink::{Direction, Source};
    use proptest::prelude::*;

    fn side() -> impl Strategy<Value = Option<Endpoint>> {
        prop::option::of(("[a-z]{0,3}", "[a-z0-9-]{0,5}").prop_map(|(ns, pod)| endpoint(&ns, &pod)))
    }

    fn address() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("10.0.0.1".to_string()),
            Just("fd00::2".to_string()),
            ".{0,8}"
        ]
    }

    proptest! {
        #[test]
        fn any_flow_converts_or_is_skipped(
            verdict in -2i32..12,
            reason in prop_oneof![Just(133i32), Just(181), any::<i32>()],
            old_reason in prop_oneof![Just(0u32), Just(133), any::<u32>()],
            direction in -1i32..4,
            reply in prop::option::of(any::<bool>()),
            source in side(),
            destination in side(),
            src_ip in address(),
            dst_ip in address(),
            port in any::<u32>(),
            udp in any::<bool>(),
            node in "[a-z/-]{0,8}",
        ) {
            let mut f = flow("x", 10, 0, verdict, &node);
            f.drop_reason_desc = reason;
            f.drop_reason = old_reason;
            f.traffic_direction = direction;
            f.is_reply = reply;
            f.source = source;
            f.destination = destination;
            f.ip = Some(Ip { source: src_ip, destination: dst_ip, ..Ip::default() });
            f.l4 = Some(Layer4 {
                protocol: Some(if udp {
                    layer4::Protocol::Udp(network_enforcer_api::hubble::Udp { source_port: 1, destination_port: port })
                } else {
                    layer4::Protocol::Tcp(Tcp { source_port: 1, destination_port: port, flags: None })
                }),
            });
            if let Ok(r) = convert(&f, Some("node-a")) {
                prop_assert!(reply != Some(true));
                prop_assert!(r.peer_ip.len() == 4 || r.peer_ip.len() == 16);
                prop_assert_eq!(r.source, Source::Hubble as i32);
                prop_assert!(r.direction == Direction::Inbound as i32 || r.direction == Direction::Outbound as i32);
                let denied = r.outcome == Outcome::Denied as i32;
                prop_assert_eq!(denied, verdict == Verdict::Dropped as i32);
                prop_assert!(!r.local.as_ref().unwrap().name.is_empty());
            }
        }
    }
}
