//! Cilium Hubble as a flow source (docs/flow-sources.md): `observer.Observer/GetFlows` with
//! `follow: true`, on the node's Hubble socket or through Hubble Relay (TLS with a server name and an
//! optional client certificate).
//!
//! [`convert`] is the pure part: one Hubble `Flow` becomes at most one [`FlowRecord`] for the pod on
//! this node it belongs to (replies skipped; `FORWARDED` → established/datagram; `DROPPED` with drop
//! reason `POLICY_DENIED` (133) or `POLICY_DENY` (181) → denied, with the policy when Hubble names it;
//! the side that is local follows `traffic_direction`). [`run`] is the client: it reconnects with a
//! capped exponential backoff and resumes with `since` = the last flow's time, skipping the flows at
//! exactly that time it already took ([`Resume`]), so a reconnect neither loses nor repeats flows that
//! Hubble still has in its ring buffer; a restarted agent resumes the same way from the newest point
//! whose records the controller acknowledged ([`ResumeFile`]).

use super::{RecordSink, SourceHealth, now_ms};
use network_enforcer_api::backoff::{Backoff, jitter};
use network_enforcer_api::hubble::observer_client::ObserverClient;
use network_enforcer_api::hubble::{
    self as proto, Flow, GetFlowsRequest, TrafficDirection, Verdict, get_flows_response, layer4,
};
use network_enforcer_api::uplink::{self, FlowRecord, LocalPod, Peer};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

pub mod resume;
pub use resume::{Resume, ResumeFile};

/// Drop reason: no rule allowed the traffic (default deny).
pub const POLICY_DENIED: i32 = 133;
/// Drop reason: an explicit deny rule matched.
pub const POLICY_DENY: i32 = 181;

/// Why a Hubble flow produced no record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    /// A reply of a connection already reported in its forward direction.
    #[error("reply")]
    Reply,
    /// Seen on another node (Relay streams every node's flows).
    #[error("flow of node {0:?}")]
    OtherNode(String),
    /// A verdict that is neither forwarded nor a policy drop (errors, audit, traced, unknown values).
    #[error("verdict {0}")]
    Verdict(i32),
    /// Dropped for a reason that is not policy (e.g. a stale IP, an invalid packet).
    #[error("drop reason {0}")]
    DropReason(i32),
    /// No traffic direction: which side is local is unknown.
    #[error("no traffic direction")]
    NoDirection,
    /// The local side is not a pod (host, world, a remote node).
    #[error("local side is not a pod")]
    NotAPod,
    /// Not TCP or UDP (ICMP, SCTP, ...), or no L4 at all.
    #[error("not TCP or UDP")]
    Protocol,
    /// The addresses are missing or unparseable.
    #[error("bad or missing IP addresses")]
    Address,
}

/// Whether a Hubble flow is a reply: only a present `is_reply` counts; without it, the deprecated
/// `reply` flag.
fn is_reply(flow: &Flow) -> bool {
    match &flow.is_reply {
        Some(is_reply) => *is_reply,
        None => flow.reply,
    }
}

/// Whether `flow_node` (`<node>`, or `<cluster>/<node>` through Relay) is `node`.
fn same_node(flow_node: &str, node: &str) -> bool {
    flow_node == node
        || flow_node
            .rsplit_once('/')
            .is_some_and(|(_, name)| name == node)
}

fn pod_of(endpoint: Option<&proto::Endpoint>) -> Option<&proto::Endpoint> {
    endpoint.filter(|e| !e.pod_name.is_empty() && !e.namespace.is_empty())
}

/// A flow's time in ms since the epoch; `None` when absent or out of range (the caller uses now).
fn timestamp_ms(t: Option<&prost_types::Timestamp>) -> Option<i64> {
    let t = t?;
    t.seconds
        .checked_mul(1000)?
        .checked_add(i64::from(t.nanos / 1_000_000))
}

/// Converts one flow into a record for the pod on this node it belongs to. `node`: only flows seen on
/// this node are taken (needed with Relay; the local socket only has this node's). Pure.
pub fn convert(flow: &Flow, node: Option<&str>) -> Result<FlowRecord, Skip> {
    if is_reply(flow) {
        return Err(Skip::Reply);
    }
    if let Some(node) = node {
        if !flow.node_name.is_empty() && !same_node(&flow.node_name, node) {
            return Err(Skip::OtherNode(flow.node_name.clone()));
        }
    }
    let denied = match Verdict::try_from(flow.verdict) {
        Ok(Verdict::Forwarded) => false,
        Ok(Verdict::Dropped) => {
            // The deprecated numeric field carries the same code; older servers fill only that one.
            let reason = if flow.drop_reason_desc != 0 {
                flow.drop_reason_desc
            } else {
                i32::try_from(flow.drop_reason).unwrap_or(i32::MAX)
            };
            if reason != POLICY_DENIED && reason != POLICY_DENY {
                return Err(Skip::DropReason(reason));
            }
            true
        }
        _ => return Err(Skip::Verdict(flow.verdict)),
    };
    let ip = flow.ip.as_ref().ok_or(Skip::Address)?;
    let (local, peer, peer_ip, direction, denied_by) =
        match TrafficDirection::try_from(flow.traffic_direction) {
            Ok(TrafficDirection::Egress) => (
                flow.source.as_ref(),
                flow.destination.as_ref(),
                &ip.destination,
                uplink::Direction::Outbound,
                &flow.egress_denied_by,
            ),
            Ok(TrafficDirection::Ingress) => (
                flow.destination.as_ref(),
                flow.source.as_ref(),
                &ip.source,
                uplink::Direction::Inbound,
                &flow.ingress_denied_by,
            ),
            _ => return Err(Skip::NoDirection),
        };
    let local = pod_of(local).ok_or(Skip::NotAPod)?;
    // The name Cilium's DNS proxy saw the local pod resolve the peer from (egress only: the names of
    // an inbound flow's source are the peer's own lookups). A malformed one is left out.
    let peer_name = match direction {
        uplink::Direction::Outbound => flow
            .destination_names
            .iter()
            .find_map(|n| network_enforcer_api::dns_name::host_name(n).ok())
            .unwrap_or_default(),
        _ => String::new(),
    };
    let peer_ip: IpAddr = peer_ip.parse().map_err(|_| Skip::Address)?;
    let (protocol, port) = match flow.l4.as_ref().and_then(|l4| l4.protocol.as_ref()) {
        Some(layer4::Protocol::Tcp(tcp)) => (uplink::Protocol::Tcp, tcp.destination_port),
        Some(layer4::Protocol::Udp(udp)) => (uplink::Protocol::Udp, udp.destination_port),
        _ => return Err(Skip::Protocol),
    };
    let outcome = match (denied, protocol) {
        (true, _) => uplink::Outcome::Denied,
        (false, uplink::Protocol::Udp) => uplink::Outcome::Datagram,
        (false, _) => uplink::Outcome::Established,
    };
    let at = timestamp_ms(flow.time.as_ref()).unwrap_or_else(now_ms);
    Ok(FlowRecord {
        local: Some(LocalPod {
            namespace: local.namespace.clone(),
            name: local.pod_name.clone(),
            uid: String::new(),
        }),
        peer_ip: network_enforcer_api::uplink::ip_bytes(peer_ip),
        port,
        protocol: protocol as i32,
        direction: direction as i32,
        outcome: outcome as i32,
        first_seen_ms: at,
        last_seen_ms: at,
        count: 1,
        source: uplink::Source::Hubble as i32,
        peer: pod_of(peer).map(|p| Peer {
            namespace: p.namespace.clone(),
            pod: p.pod_name.clone(),
            principal: String::new(),
        }),
        policy: if denied {
            denied_by
                .first()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .unwrap_or_default()
        } else {
            String::new()
        },
        peer_name,
        dry_run: false,
    })
}

/// A flow off the stream, converted; `None` when `resume` took it before. Another node's flow is
/// skipped without moving the resume point: Relay streams every node's flows, ordered across nodes
/// only within its buffer, so another node's newer flow would make this node's older one look taken
/// (and a reconnect's `since` skip it).
pub fn admit(
    resume: &mut Resume,
    flow: &Flow,
    node: Option<&str>,
) -> Option<Result<FlowRecord, Skip>> {
    let converted = convert(flow, node);
    if matches!(converted, Err(Skip::OtherNode(_))) {
        return Some(converted);
    }
    resume.take(flow).then_some(converted)
}

/// TLS towards Hubble Relay.
#[derive(Clone, Debug, Default)]
pub struct RelayTls {
    /// PEM CA bundle that signed the Relay's server certificate.
    pub ca: Option<PathBuf>,
    /// The name the server certificate must carry (Cilium's default: `ui.hubble-relay.cilium.io`).
    pub server_name: Option<String>,
    /// PEM client certificate and key, when the Relay requires mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's key.
    pub client_key: Option<PathBuf>,
}

/// Where Hubble is.
#[derive(Clone, Debug)]
pub enum Target {
    /// The node's Hubble server socket (`/var/run/cilium/hubble.sock`), no TLS.
    Socket(PathBuf),
    /// Hubble Relay at `host:port`; TLS when `tls` is set.
    Relay {
        /// `host:port`.
        address: String,
        /// TLS settings; plain HTTP/2 when `None`.
        tls: Option<RelayTls>,
    },
}

/// The Hubble client's settings.
#[derive(Clone, Debug)]
pub struct HubbleConfig {
    /// Where to connect.
    pub target: Target,
    /// Only flows of this node are taken (Relay streams all nodes').
    pub node: Option<String>,
    /// Waits between reconnects.
    pub backoff: Backoff,
    /// How long a connect may take.
    pub connect_timeout: Duration,
    /// Where the resume point is kept across restarts (`None`: not kept; a restart starts live).
    pub state_file: Option<PathBuf>,
}

impl HubbleConfig {
    /// Defaults: backoff 0.5 s up to 30 s, 5 s connect timeout.
    pub fn new(target: Target, node: Option<String>) -> Self {
        Self {
            target,
            node,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
            state_file: None,
        }
    }
}

/// Why a connection to Hubble failed or ended.
#[derive(Debug, thiserror::Error)]
pub enum HubbleError {
    /// A TLS file could not be read.
    #[error("reading {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The address is not usable.
    #[error("invalid Hubble address {0:?}: {1}")]
    Address(String, String),
    /// Connecting failed (no socket, refused, TLS handshake failed).
    #[error("connecting: {0:?}")]
    Connect(tonic::transport::Error),
    /// Hubble refused the call or the stream broke.
    #[error("{0}")]
    Status(#[from] tonic::Status),
    /// Hubble ended the stream.
    #[error("the stream ended")]
    Ended,
}

fn read(path: &PathBuf) -> Result<Vec<u8>, HubbleError> {
    std::fs::read(path).map_err(|source| HubbleError::File {
        path: path.clone(),
        source,
    })
}

/// Opens a channel to Hubble. TLS files are read at every connect, so rotated certificates are picked up.
pub async fn connect(config: &HubbleConfig) -> Result<Channel, HubbleError> {
    match &config.target {
        Target::Socket(path) => {
            let path = path.clone();
            // The URI is required by tonic but unused: the connector dials the socket.
            Endpoint::from_static("http://hubble.sock")
                .connect_timeout(config.connect_timeout)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(&path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .map_err(HubbleError::Connect)
        }
        Target::Relay { address, tls } => {
            let scheme = if tls.is_some() { "https" } else { "http" };
            let url = format!("{scheme}://{address}");
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| HubbleError::Address(address.clone(), e.to_string()))?
                .connect_timeout(config.connect_timeout)
                .http2_keep_alive_interval(Duration::from_secs(30))
                .keep_alive_timeout(Duration::from_secs(20));
            if let Some(tls) = tls {
                let mut client = ClientTlsConfig::new();
                if let Some(ca) = &tls.ca {
                    client = client.ca_certificate(Certificate::from_pem(read(ca)?));
                }
                if let Some(name) = &tls.server_name {
                    client = client.domain_name(name.clone());
                }
                if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
                    client = client.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                endpoint = endpoint
                    .tls_config(client)
                    .map_err(|e| HubbleError::Address(address.clone(), format!("{e:?}")))?;
            }
            endpoint.connect().await.map_err(HubbleError::Connect)
        }
    }
}

/// The request of a (re)connect: live flows, from `since` when resuming.
pub fn request(resume: &Resume) -> GetFlowsRequest {
    GetFlowsRequest {
        follow: true,
        since: resume.since(),
        ..GetFlowsRequest::default()
    }
}

/// How often the records taken off the stream are handed to the flush, with one receipt whose
/// acknowledgement lets their resume point be saved.
pub const HAND_OVER_EVERY: Duration = Duration::from_millis(250);

/// How a stream ended.
enum Ended {
    /// The stream failed or ended: reconnect.
    Failed(HubbleError),
    /// The agent stops.
    Stopped,
}

impl From<HubbleError> for Ended {
    fn from(error: HubbleError) -> Self {
        Ended::Failed(error)
    }
}

/// The records taken since the last hand-over, and where they were taken up to.
struct Taken<'a> {
    records: Vec<FlowRecord>,
    sink: &'a RecordSink,
    file: &'a mut ResumeFile,
}

impl Taken<'_> {
    /// Hands the records taken to the flush with one receipt, notes the resume point they reach,
    /// and saves the newest acknowledged one.
    fn hand_over(&mut self, resume: &Resume) {
        let watch = if self.records.is_empty() {
            None
        } else {
            let (receipt, watch) = crate::uplink::receipt();
            self.sink
                .add_with_receipt(std::mem::take(&mut self.records), Some(receipt));
            Some(watch)
        };
        self.file.reached(resume, watch);
        self.file.save_settled();
    }
}

/// Reads one stream until it fails, ends or the agent stops, feeding `sink`.
async fn stream_once(
    config: &HubbleConfig,
    resume: &mut Resume,
    taken: &mut Taken<'_>,
    health: &SourceHealth,
    connected_once: &mut bool,
    stop: &mut tokio::sync::oneshot::Receiver<()>,
) -> Ended {
    let connected = tokio::select! {
        connected = connect(config) => connected,
        _ = &mut *stop => return Ended::Stopped,
    };
    let channel = match connected {
        Ok(channel) => channel,
        Err(error) => return error.into(),
    };
    let mut client = ObserverClient::new(channel).max_decoding_message_size(16 * 1024 * 1024);
    // A server may hold its response back until its first flow: bounded, and the stop heard.
    let called = tokio::select! {
        called = tokio::time::timeout(config.connect_timeout, client.get_flows(request(resume))) => called,
        _ = &mut *stop => return Ended::Stopped,
    };
    let mut stream = match called {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return HubbleError::from(status).into(),
        Err(_) => return HubbleError::Ended.into(),
    };
    health.connected.set(1);
    if !*connected_once {
        tracing::info!(target = ?config.target, since = ?resume.since(), "Hubble connected");
    }
    *connected_once = true;
    let mut hand_over = tokio::time::interval(HAND_OVER_EVERY);
    hand_over.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended = loop {
        let message = tokio::select! {
            message = stream.message() => message,
            _ = hand_over.tick() => {
                taken.hand_over(resume);
                continue;
            }
            // The last flush has gone: records not handed over stay unsaved, read again after
            // the restart.
            _ = &mut *stop => return Ended::Stopped,
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => break HubbleError::Ended,
            Err(status) => break HubbleError::from(status),
        };
        health.message();
        match response.response_types {
            Some(get_flows_response::ResponseTypes::Flow(flow)) => {
                let Some(converted) = admit(resume, &flow, config.node.as_deref()) else {
                    continue;
                };
                match converted {
                    Ok(record) => {
                        health.records.inc();
                        taken.records.push(record);
                    }
                    Err(skip) => {
                        health.skipped.inc();
                        tracing::trace!(%skip, "Hubble flow skipped");
                    }
                }
            }
            Some(get_flows_response::ResponseTypes::LostEvents(lost)) => {
                health.lost_events.inc_by(lost.num_events_lost);
                tracing::warn!(
                    lost = lost.num_events_lost,
                    source = lost.source,
                    "Hubble reports lost events"
                );
            }
            Some(get_flows_response::ResponseTypes::NodeStatus(status)) => {
                tracing::debug!(state = status.state_change, nodes = ?status.node_names, message = %status.message, "Hubble Relay node status");
            }
            None => {
                health.skipped.inc();
            }
        }
    };
    // The resume point moved past these records: a reconnect will not bring them again.
    taken.hand_over(resume);
    ended.into()
}

/// Streams flows from Hubble into `sink` until `stop` fires (or its sender is dropped): every failure
/// is logged and counted, and retried after a capped exponential backoff with jitter. Starts from
/// the resume point saved in `config.state_file` (the newest one whose records the controller
/// acknowledged), and saves the acknowledged ones as it goes, a last time when it stops.
pub async fn run(
    config: HubbleConfig,
    sink: RecordSink,
    health: SourceHealth,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (mut file, mut resume) = ResumeFile::open(config.state_file.clone(), now_ms() / 1000);
    let mut attempt = 0u32;
    let mut connected_once = false;
    loop {
        let received = health.messages.get();
        let mut taken = Taken {
            records: Vec::new(),
            sink: &sink,
            file: &mut file,
        };
        let ended = stream_once(
            &config,
            &mut resume,
            &mut taken,
            &health,
            &mut connected_once,
            &mut stop,
        )
        .await;
        health.connected.set(0);
        let error = match ended {
            Ended::Stopped => break,
            Ended::Failed(error) => error,
        };
        health.errors.inc();
        // A stream that delivered something resets the backoff: the peer was healthy.
        if health.messages.get() > received {
            attempt = 0;
        }
        let delay = config.backoff.delay(attempt, jitter());
        attempt = attempt.saturating_add(1);
        let hint = match (&error, &config.target) {
            (HubbleError::Connect(_), Target::Socket(path)) => format!(
                "is Cilium running with Hubble enabled on this node and {} mounted?",
                path.display()
            ),
            (HubbleError::Connect(_), Target::Relay { tls: Some(_), .. }) => {
                "check the Relay address, its CA, the server name and the client certificate".into()
            }
            (HubbleError::Connect(_), Target::Relay { tls: None, .. }) => {
                "check the Relay address (does the Relay require TLS?)".into()
            }
            _ => String::new(),
        };
        tracing::warn!(target = ?config.target, %error, hint, retry_in = ?delay, "Hubble stream failed");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut stop => break,
        }
    }
    // What the controller acknowledged by now (the agent's last flush among it) is saved.
    file.save_settled();
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::hubble::{Ip, Layer4, Policy, Tcp, Udp};

    fn endpoint(ns: &str, pod: &str) -> proto::Endpoint {
        proto::Endpoint {
            namespace: ns.into(),
            pod_name: pod.into(),
            ..proto::Endpoint::default()
        }
    }

    fn tcp_flow(direction: TrafficDirection, verdict: Verdict) -> Flow {
        Flow {
            time: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5_000_000,
            }),
            verdict: verdict as i32,
            ip: Some(Ip {
                source: "10.0.0.1".into(),
                destination: "10.0.0.2".into(),
                ..Ip::default()
            }),
            l4: Some(Layer4 {
                protocol: Some(layer4::Protocol::Tcp(Tcp {
                    source_port: 40000,
                    destination_port: 8080,
                    flags: None,
                })),
            }),
            source: Some(endpoint("shop", "web-1")),
            destination: Some(endpoint("shop", "catalog-1")),
            traffic_direction: direction as i32,
            node_name: "kind/node-a".into(),
            ..Flow::default()
        }
    }

    #[test]
    fn times_out_of_range_are_none_not_a_panic() {
        let at = |seconds, nanos| timestamp_ms(Some(&prost_types::Timestamp { seconds, nanos }));
        assert_eq!(at(1_700_000_000, 5_000_000), Some(1_700_000_000_005));
        assert_eq!(at(i64::MAX, 0), None);
        assert_eq!(at(i64::MIN, 0), None);
        assert_eq!(timestamp_ms(None), None);
    }

    #[test]
    fn forwarded_egress_is_an_outbound_record_of_the_source_pod() {
        let r = convert(
            &tcp_flow(TrafficDirection::Egress, Verdict::Forwarded),
            Some("node-a"),
        )
        .unwrap();
        let local = r.local.unwrap();
        assert_eq!(
            (local.namespace.as_str(), local.name.as_str()),
            ("shop", "web-1")
        );
        assert_eq!(r.peer_ip, vec![10, 0, 0, 2]);
        assert_eq!(r.port, 8080);
        assert_eq!(r.direction, uplink::Direction::Outbound as i32);
        assert_eq!(r.outcome, uplink::Outcome::Established as i32);
        assert_eq!(r.source, uplink::Source::Hubble as i32);
        assert_eq!(r.first_seen_ms, 1_700_000_000_005);
        assert_eq!(r.peer.unwrap().pod, "catalog-1");
    }

    #[test]
    fn forwarded_ingress_is_an_inbound_record_of_the_destination_pod() {
        let r = convert(
            &tcp_flow(TrafficDirection::Ingress, Verdict::Forwarded),
            None,
        )
        .unwrap();
        assert_eq!(r.local.unwrap().name, "catalog-1");
        assert_eq!(r.peer_ip, vec![10, 0, 0, 1]);
        assert_eq!(r.port, 8080, "the local (destination) port");
        assert_eq!(r.direction, uplink::Direction::Inbound as i32);
    }

    #[test]
    fn udp_is_a_datagram() {
        let mut f = tcp_flow(TrafficDirection::Egress, Verdict::Forwarded);
        f.l4 = Some(Layer4 {
            protocol: Some(layer4::Protocol::Udp(Udp {
                source_port: 5353,
                destination_port: 53,
            })),
        });
        let r = convert(&f, None).unwrap();
        assert_eq!(
            (r.protocol, r.outcome, r.port),
            (
                uplink::Protocol::Udp as i32,
                uplink::Outcome::Datagram as i32,
                53
            )
        );
    }

    #[test]
    fn replies_are_skipped_only_when_marked() {
        let mut f = tcp_flow(TrafficDirection::Ingress, Verdict::Forwarded);
        f.is_reply = Some(true);
        assert_eq!(convert(&f, None), Err(Skip::Reply));
        f.is_reply = Some(false);
        f.reply = true;
        assert!(convert(&f, None).is_ok(), "a present is_reply wins");
        f.is_reply = None;
        assert_eq!(
            convert(&f, None),
            Err(Skip::Reply),
            "the deprecated flag without is_reply"
        );
    }

    #[test]
    fn policy_drops_are_denied_records_with_the_policy_other_drops_are_skipped() {
        for reason in [POLICY_DENIED, POLICY_DENY] {
            let mut f = tcp_flow(TrafficDirection::Ingress, Verdict::Dropped);
            f.drop_reason_desc = reason;
            f.ingress_denied_by = vec![Policy {
                name: "deny-web".into(),
                namespace: "shop".into(),
                ..Policy::default()
            }];
            let r = convert(&f, None).unwrap();
            assert_eq!(r.outcome, uplink::Outcome::Denied as i32);
            assert_eq!(r.policy, "shop/deny-web");
            assert_eq!(r.direction, uplink::Direction::Inbound as i32);
        }
        let mut old = tcp_flow(TrafficDirection::Egress, Verdict::Dropped);
        old.drop_reason = 133;
        let r = convert(&old, None).unwrap();
        assert_eq!(
            (r.outcome, r.policy.as_str()),
            (uplink::Outcome::Denied as i32, "")
        );
        let mut stale = tcp_flow(TrafficDirection::Egress, Verdict::Dropped);
        stale.drop_reason_desc = 151;
        assert_eq!(convert(&stale, None), Err(Skip::DropReason(151)));
        let mut future = tcp_flow(TrafficDirection::Egress, Verdict::Dropped);
        future.drop_reason_desc = 9_999;
        assert_eq!(convert(&future, None), Err(Skip::DropReason(9_999)));
    }

    #[test]
    fn unknown_verdicts_and_directions_and_foreign_nodes_are_skipped() {
        let mut f = tcp_flow(TrafficDirection::Egress, Verdict::Forwarded);
        f.verdict = 77;
        assert_eq!(convert(&f, None), Err(Skip::Verdict(77)));
        let mut f = tcp_flow(TrafficDirection::Egress, Verdict::Forwarded);
        f.traffic_direction = 9;
        assert_eq!(convert(&f, None), Err(Skip::NoDirection));
        let f = tcp_flow(TrafficDirection::Egress, Verdict::Forwarded);
        assert_eq!(
            convert(&f, Some("node-b")),
            Err(Skip::OtherNode("kind/node-a".into()))
        );
        let mut host = tcp_flow(TrafficDirection::Egress, Verdict::Forwarded);
        host.source = Some(proto::Endpoint {
            identity: 1,
            labels: vec!["reserved:host".into()],
            ..proto::Endpoint::default()
        });
        assert_eq!(convert(&host, None), Err(Skip::NotAPod));
        let mut icmp = tcp_flow(TrafficDirection::Egress, Verdict::Forwarded);
        icmp.l4 = None;
        assert_eq!(convert(&icmp, None), Err(Skip::Protocol));
    }

    /// Relay's merge across nodes: node-b's flow at 12 s comes before node-a's at 11 s. The agent of
    /// node-a takes its own flow, and its resume point is its own newest flow. Seen failing before
    /// `admit` (the resume point was taken before the node filter: node-a's flow was dropped).
    #[test]
    fn another_nodes_newer_flow_does_not_drop_this_nodes_older_one() {
        let flow = |node: &str, seconds: i64, uuid: &str| Flow {
            time: Some(prost_types::Timestamp { seconds, nanos: 0 }),
            uuid: uuid.into(),
            node_name: node.into(),
            ..tcp_flow(TrafficDirection::Egress, Verdict::Forwarded)
        };
        let mut r = Resume::default();
        let node = Some("node-a");
        assert!(matches!(
            admit(&mut r, &flow("kind/node-a", 10, "a"), node),
            Some(Ok(_))
        ));
        assert!(matches!(
            admit(&mut r, &flow("kind/node-b", 12, "b"), node),
            Some(Err(Skip::OtherNode(_)))
        ));
        assert!(
            matches!(
                admit(&mut r, &flow("kind/node-a", 11, "c"), node),
                Some(Ok(_))
            ),
            "node-a's flow after node-b's newer one"
        );
        assert_eq!(r.since().unwrap().seconds, 11);
        assert!(
            admit(&mut r, &flow("kind/node-a", 11, "c"), node).is_none(),
            "taken once"
        );
    }

    #[test]
    fn resume_takes_each_flow_once_across_reconnects() {
        let at = |s: i64, uuid: &str| Flow {
            time: Some(prost_types::Timestamp {
                seconds: s,
                nanos: 0,
            }),
            uuid: uuid.into(),
            ..Flow::default()
        };
        let mut r = Resume::default();
        assert_eq!(r.since(), None);
        assert!(r.take(&at(10, "a")));
        assert!(r.take(&at(11, "b")));
        assert!(r.take(&at(11, "c")));
        assert_eq!(r.since().unwrap().seconds, 11);
        // After a reconnect with since=11, Hubble repeats b and c (inclusive bound), then goes on.
        assert!(!r.take(&at(11, "b")));
        assert!(!r.take(&at(11, "c")));
        assert!(!r.take(&at(10, "a")));
        assert!(r.take(&at(11, "d")));
        assert!(r.take(&at(12, "e")));
        assert_eq!(request(&r).since.unwrap().seconds, 12);
        assert!(request(&r).follow);
    }
}
