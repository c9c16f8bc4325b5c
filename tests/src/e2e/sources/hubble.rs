//! A fake Cilium Hubble for the `cilium` provider: a tonic `observer.Observer` server built from our
//! proto, on a unix socket in a host directory that the chart mounts into the agent pod
//! (`agent.hubble.socketPath`), as Cilium's `/var/run/cilium/hubble.sock` is on a real node.
//!
//! It behaves like Hubble's local observer as far as our client can tell: `GetFlows` with `follow`
//! streams new flows; with `since` it first replays the flows it still has from that time on (its ring
//! buffer); without `since` and `number` only new ones. [`HubbleDataPlane`] turns the scenario's
//! events into the flows Cilium would emit for them, with the real pods' IPs, namespaces, names,
//! labels and workloads: each packet traced at the sender's endpoint (`EGRESS`) and the receiver's
//! (`INGRESS`), replies marked `is_reply`, and a policy denial as `DROPPED` with drop reason
//! `POLICY_DENIED` (event type 1, subtype 133) for each attempt. It can restart between two events
//! ([`HubbleDataPlane::restart_before`]): the flows of the second are published while the agent has no
//! stream and reach it only through its resume (`since`).

use anyhow::{Context, Result, ensure};
use network_enforcer_api::hubble::observer_server::{Observer, ObserverServer};
use network_enforcer_api::hubble::{
    CiliumEventType, Endpoint, Flow, FlowType, GetFlowsRequest, GetFlowsResponse, Ip, IpVersion,
    Layer4, Tcp, TcpFlags, TraceObservationPoint, TrafficDirection, Udp, Verdict, Workload,
    get_flows_response::ResponseTypes, layer4,
};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::{UnboundedReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use super::super::poll;
use super::PodInfo;
use super::kubernetes::{DataPlane, Event, Pods};

/// Drop reason `POLICY_DENIED`: no rule allowed the traffic.
const POLICY_DENIED: i32 = 133;
/// Cilium monitor message types (`event_type.type`).
const MSG_DROP: i32 = 1;
const MSG_TRACE: i32 = 4;

#[derive(Default)]
struct State {
    /// Every flow served so far (Hubble's ring buffer), oldest first.
    history: Vec<GetFlowsResponse>,
    /// Open `follow` streams.
    subscribers: Vec<mpsc::UnboundedSender<Result<GetFlowsResponse, Status>>>,
    /// Every request received.
    requests: Vec<GetFlowsRequest>,
}

#[derive(Clone, Default)]
struct Observe(Arc<Mutex<State>>);

type FlowStream = Pin<Box<dyn Stream<Item = Result<GetFlowsResponse, Status>> + Send>>;

fn time_key(r: &GetFlowsResponse) -> (i64, i32) {
    match &r.response_types {
        Some(ResponseTypes::Flow(f)) => f.time.map(|t| (t.seconds, t.nanos)).unwrap_or_default(),
        _ => r.time.map(|t| (t.seconds, t.nanos)).unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl Observer for Observe {
    type GetFlowsStream = FlowStream;

    async fn get_flows(
        &self,
        request: Request<GetFlowsRequest>,
    ) -> Result<Response<FlowStream>, Status> {
        let request = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.0.lock().expect("hubble state");
        // Under the lock: no flow published in between is lost or sent twice.
        if let Some(since) = request.since {
            let since = (since.seconds, since.nanos);
            for old in state.history.iter().filter(|r| time_key(r) >= since) {
                let _ = tx.send(Ok(old.clone()));
            }
        }
        if request.follow {
            state.subscribers.push(tx);
        }
        state.requests.push(request);
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

/// The fake Hubble: serves until dropped, then removes its socket.
pub struct FakeHubble {
    state: Observe,
    socket: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeHubble {
    /// Listens on `socket` (its directory created; a stale socket file replaced).
    pub fn start(socket: &Path) -> Result<Self> {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(socket);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let state = Observe::default();
        let listener = {
            let _guard = runtime.enter();
            tokio::net::UnixListener::bind(socket)
                .with_context(|| format!("binding {}", socket.display()))?
        };
        let service = ObserverServer::new(state.clone());
        runtime.spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
            if let Err(e) = result {
                eprintln!("fake Hubble server ended: {e}");
            }
        });
        Ok(Self {
            state,
            socket: socket.into(),
            runtime: Some(runtime),
        })
    }

    /// Publishes `flows` to every open stream and keeps them for later `since` requests.
    pub fn publish(&self, flows: Vec<Flow>) {
        let mut state = self.state.0.lock().expect("hubble state");
        for flow in flows {
            let response = GetFlowsResponse {
                node_name: flow.node_name.clone(),
                time: flow.time,
                response_types: Some(ResponseTypes::Flow(flow)),
            };
            state
                .subscribers
                .retain(|tx| tx.send(Ok(response.clone())).is_ok());
            state.history.push(response);
        }
    }

    /// Ends every open stream with `UNAVAILABLE`, as a restarting Cilium agent does; the flows
    /// published afterwards wait in the history for the client's next request.
    pub fn disconnect(&self) {
        let mut state = self.state.0.lock().expect("hubble state");
        for tx in state.subscribers.drain(..) {
            let _ = tx.send(Err(Status::unavailable("hubble is restarting")));
        }
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<GetFlowsRequest> {
        self.state.0.lock().expect("hubble state").requests.clone()
    }

    /// Streams currently open.
    pub fn open_streams(&self) -> usize {
        let mut state = self.state.0.lock().expect("hubble state");
        state.subscribers.retain(|tx| !tx.is_closed());
        state.subscribers.len()
    }
}

impl Drop for FakeHubble {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A Hubble endpoint for `pod`: labels prefixed `k8s:` as Cilium reports them, the owning workload.
fn endpoint(pod: &PodInfo) -> Endpoint {
    let mut labels: Vec<String> = pod.labels.iter().map(|l| format!("k8s:{l}")).collect();
    labels.push(format!("k8s:io.kubernetes.pod.namespace={}", pod.namespace));
    labels.push(format!(
        "k8s:io.cilium.k8s.policy.serviceaccount={}",
        pod.service_account
    ));
    labels.sort();
    Endpoint {
        id: 0,
        identity: 0,
        namespace: pod.namespace.clone(),
        labels,
        pod_name: pod.name.clone(),
        workloads: vec![Workload {
            name: pod.workload.1.clone(),
            kind: pod.workload.0.clone(),
        }],
        cluster_name: "default".into(),
    }
}

/// One packet's L4 header.
#[derive(Clone, Copy)]
enum L4 {
    Tcp { flags: &'static str },
    Udp,
}

/// Turns the scenario's events into Cilium's flows and publishes them on a [`FakeHubble`].
pub struct HubbleDataPlane {
    /// The server.
    pub hubble: FakeHubble,
    next: AtomicU64,
    /// Flows published per event, for failure messages.
    log: Vec<String>,
    /// Restart Hubble right before this event's flows: they are published while the agent has no
    /// stream, and reach it only if it resumes with `since`.
    pub restart_before: Option<Event>,
}

impl HubbleDataPlane {
    /// A data plane publishing on `hubble`.
    pub fn new(hubble: FakeHubble) -> Self {
        Self {
            hubble,
            next: AtomicU64::new(1),
            log: Vec::new(),
            restart_before: None,
        }
    }

    /// A flow of one packet `from` → `to` traced at `point`.
    #[allow(clippy::too_many_arguments)]
    fn flow(
        &self,
        node: &str,
        from: (&PodInfo, u32),
        to: (&PodInfo, u32),
        l4: L4,
        direction: TrafficDirection,
        reply: bool,
        verdict: Verdict,
    ) -> Flow {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (seconds, nanos) = super::now();
        let protocol = match l4 {
            L4::Tcp { flags } => layer4::Protocol::Tcp(Tcp {
                source_port: from.1,
                destination_port: to.1,
                flags: Some(TcpFlags {
                    syn: flags.contains("SYN"),
                    ack: flags.contains("ACK"),
                    fin: flags.contains("FIN"),
                    psh: flags.contains("PSH"),
                    ..TcpFlags::default()
                }),
            }),
            L4::Udp => layer4::Protocol::Udp(Udp {
                source_port: from.1,
                destination_port: to.1,
            }),
        };
        let dropped = verdict == Verdict::Dropped;
        let point = match (dropped, direction) {
            (true, _) => TraceObservationPoint::UnknownPoint,
            (false, TrafficDirection::Ingress) => TraceObservationPoint::ToEndpoint,
            (false, _) => TraceObservationPoint::FromEndpoint,
        };
        Flow {
            time: Some(prost_types::Timestamp { seconds, nanos }),
            uuid: format!("{:08x}-0000-4000-8000-{n:012x}", std::process::id()),
            verdict: verdict as i32,
            drop_reason: if dropped { POLICY_DENIED as u32 } else { 0 },
            drop_reason_desc: if dropped { POLICY_DENIED } else { 0 },
            ip: Some(Ip {
                source: from.0.ip.clone(),
                destination: to.0.ip.clone(),
                ip_version: IpVersion::IPv4 as i32,
                encrypted: false,
            }),
            l4: Some(Layer4 {
                protocol: Some(protocol),
            }),
            source: Some(endpoint(from.0)),
            destination: Some(endpoint(to.0)),
            r#type: FlowType::L3L4 as i32,
            node_name: node.into(),
            reply,
            event_type: Some(CiliumEventType {
                r#type: if dropped { MSG_DROP } else { MSG_TRACE },
                sub_type: if dropped { POLICY_DENIED } else { 0 },
            }),
            traffic_direction: direction as i32,
            trace_observation_point: point as i32,
            is_reply: Some(reply),
            ..Flow::default()
        }
    }

    /// A request `client → server` and its answer, each traced leaving the sender and entering the
    /// receiver (both pods are on this node): four flows, the answer's marked as replies.
    fn exchange(
        &self,
        node: &str,
        client: (&PodInfo, u32),
        server: (&PodInfo, u32),
        request: L4,
        answer: L4,
    ) -> Vec<Flow> {
        vec![
            self.flow(
                node,
                client,
                server,
                request,
                TrafficDirection::Egress,
                false,
                Verdict::Forwarded,
            ),
            self.flow(
                node,
                client,
                server,
                request,
                TrafficDirection::Ingress,
                false,
                Verdict::Forwarded,
            ),
            self.flow(
                node,
                server,
                client,
                answer,
                TrafficDirection::Egress,
                true,
                Verdict::Forwarded,
            ),
            self.flow(
                node,
                server,
                client,
                answer,
                TrafficDirection::Ingress,
                true,
                Verdict::Forwarded,
            ),
        ]
    }

    fn flows(&self, pods: &Pods, event: Event) -> Vec<Flow> {
        let node = pods.node.as_str();
        let port = 30_000 + (self.next.load(Ordering::Relaxed) % 30_000) as u32;
        let client = (&pods.client, port);
        match event {
            Event::Dns => self.exchange(node, client, (&pods.dns, 53), L4::Udp, L4::Udp),
            Event::Tcp18080 => {
                let server = (&pods.server, 18080);
                let mut flows = self.exchange(
                    node,
                    client,
                    server,
                    L4::Tcp { flags: "SYN" },
                    L4::Tcp { flags: "SYN,ACK" },
                );
                flows.extend(self.exchange(
                    node,
                    client,
                    server,
                    L4::Tcp { flags: "FIN,ACK" },
                    L4::Tcp { flags: "FIN,ACK" },
                ));
                flows
            }
            Event::Udp18083 => self.exchange(node, client, (&pods.server, 18081), L4::Udp, L4::Udp),
            Event::Udp18083Denied => (0..3)
                .map(|attempt| {
                    self.flow(
                        node,
                        (&pods.client, port + attempt),
                        (&pods.server, 18081),
                        L4::Udp,
                        TrafficDirection::Egress,
                        false,
                        Verdict::Dropped,
                    )
                })
                .collect(),
        }
    }
}

impl DataPlane for HubbleDataPlane {
    fn report(&mut self, pods: &Pods, event: Event, _egress_policy: (&str, &str)) -> Result<()> {
        let flows = self.flows(pods, event);
        self.log.push(format!("{event:?}: {} flows", flows.len()));
        if self.restart_before != Some(event) {
            self.hubble.publish(flows);
            return Ok(());
        }
        let asked = self.hubble.requests().len();
        self.hubble.disconnect();
        self.hubble.publish(flows);
        self.log.push("restarted before it".into());
        // The agent comes back (after its backoff) asking for what it missed.
        let request = poll(
            "the agent to reconnect to Hubble",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || Ok(self.hubble.requests().get(asked).cloned()),
            || self.describe(),
        )?;
        ensure!(
            request.follow && request.since.is_some(),
            "the agent reconnected without resuming (follow and since): {request:?}"
        );
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "published: {:?}\nopen GetFlows streams: {}\nrequests: {:#?}",
            self.log,
            self.hubble.open_streams(),
            self.hubble.requests()
        )
    }
}
