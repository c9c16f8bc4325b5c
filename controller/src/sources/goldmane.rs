//! Calico Goldmane as a flow source (docs/flow-sources.md, "Calico Goldmane"): the
//! cluster-wide, server-streaming `goldmane.Flows/Stream`, over mutual TLS.
//!
//! - **What is taken.** Live flows (`start_time_gte = 0`) with actions Allow and Deny, aggregation
//!   interval 15 s; after a reconnect, from the newest window received, and at a new leader's first
//!   connect after the window the last leader's evidence was written through ([`resume_from`]), so
//!   that the windows that completed meanwhile are backfilled, not lost, nor counted twice. Only workload endpoints on both sides. `Allow` reported by the destination
//!   (reporter `Dst`) is learned (the source's report of the same flow is skipped, so one flow is not
//!   counted twice); `Deny` is protect evidence, egress when reported by the source, ingress when
//!   reported by the destination, naming the denying policy from the enforced trace (the hit itself,
//!   or the policy an end-of-tier hit's `trigger` names: the implicit default deny of a NetworkPolicy).
//! - **Where it goes.** Each flow becomes the same [`FlowRecord`] an agent would send for the pod on
//!   its node ([`convert`]), and [`feed`] hands it to [`Learning::accept_from_cluster_source`] under
//!   that pod's node: the very path of agent batches, so learning and the violation evidence of the
//!   status sync see Goldmane flows exactly like eBPF ones, except that a cluster-wide source may teach
//!   both sides of a connection (docs/behaviour.md §1.5, §7.5).
//! - **Names.** Goldmane names a workload pod by its `generateName` followed by `*`
//!   (`http-client-5f7d9c-*`). The controller's one index keeps pods by `(namespace, generateName)`
//!   ([`Index::pods_generated_as`]); any live pod of that set stands for its workload (the replicas
//!   of a ReplicaSet share labels and owner). No pod is listed per flow, and no second watch runs.
//! - **Re-sends.** Goldmane pushes every flow of the last complete 15 s window at each rollover, so a
//!   long-lived or repeated connection comes back every 15 s under the same key. [`Dedupe`] lets one
//!   flow key through at most once per [`Dedupe::WINDOW`] (of the flows' own times), so
//!   `violationCount` counts observations, not re-sends.
//! - **TLS.** Goldmane requires client certificates. The client certificate and key come from a
//!   Secret (`tls.crt`/`tls.key`, default `calico-system/goldmane-key-pair`) and the CA from a ConfigMap
//!   (default `calico-system/goldmane-ca-bundle`, key `tigera-ca-bundle.crt`), read through the API at
//!   every (re)connect, so a rotated certificate is picked up by the next connection.
//! - **Failures.** Every failure is logged with a hint and counted; reconnects follow a capped
//!   exponential backoff with jitter; the task never ends.

use crate::cluster::index::{Index, PodRecord};
use crate::ingest::Learning;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::Api;
use network_enforcer_api::backoff::{Backoff, jitter};
use network_enforcer_api::goldmane::flows_client::FlowsClient;
use network_enforcer_api::goldmane::{
    Action, EndpointType, Filter, Flow, FlowStreamRequest, PolicyHit, PolicyKind, Reporter,
};
use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord, LocalPod, Peer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The address the Calico operator gives Goldmane.
pub const DEFAULT_ADDRESS: &str = "goldmane.calico-system.svc:7443";

/// The pod a Goldmane endpoint name stands for: `<generateName>*` → a pod of that set the index knows
/// with an address (the first by name, so the choice is stable); a plain name → that pod.
pub fn resolve_name<'a>(index: &'a Index, namespace: &str, name: &str) -> Option<&'a PodRecord> {
    let pod = match name.strip_suffix('*') {
        Some(generate_name) => index
            .pods_generated_as(namespace, generate_name)
            .find(|p| !p.ips.is_empty()),
        None => index.pod(namespace, name).filter(|p| !p.ips.is_empty()),
    };
    pod.map(Arc::as_ref)
}

/// Why a Goldmane flow produced no record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    /// One side is not a workload endpoint (host endpoint, network set, network).
    #[error("not workload endpoints on both sides")]
    NotWorkloads,
    /// An allowed flow reported by its source: its destination's report is the one learned.
    #[error("allowed flow reported by the source")]
    AllowFromSource,
    /// Neither Allow nor Deny (Pass, unknown values), or an unknown reporter.
    #[error("action {0}, reporter {1}")]
    Action(i32, i32),
    /// Not TCP or UDP.
    #[error("protocol {0:?}")]
    Protocol(String),
    /// A port outside 1..=65535.
    #[error("port {0}")]
    Port(i64),
    /// A side names no pod the index knows (yet).
    #[error("no known pod for {0}/{1}")]
    UnknownPod(String, String),
    /// The pod the record belongs to is not scheduled.
    #[error("pod {0}/{1} has no node")]
    NoNode(String, String),
    /// The flow has no key.
    #[error("flow without a key")]
    NoKey,
    /// A start or end time (seconds) too large to be a time in milliseconds.
    #[error("time {0} s out of range")]
    Time(i64),
}

/// The denying policy a trace names, `<namespace>/<name>` (name alone for global kinds).
pub fn denying_policy(hits: &[PolicyHit]) -> Option<String> {
    let hit = hits.iter().find(|h| h.action == Action::Deny as i32)?;
    let named = if hit.kind == PolicyKind::EndOfTier as i32 {
        hit.trigger.as_deref()?
    } else {
        hit
    };
    if named.name.is_empty() {
        return None;
    }
    Some(if named.namespace.is_empty() {
        named.name.clone()
    } else {
        format!("{}/{}", named.namespace, named.name)
    })
}

/// Converts one Goldmane flow into the record the agent on the reporting pod's node would send, and
/// that node. `pod` resolves a Goldmane endpoint name (see [`resolve_name`]). Pure.
pub fn convert<'a>(
    flow: &Flow,
    pod: impl Fn(&str, &str) -> Option<&'a PodRecord>,
) -> Result<(String, FlowRecord), Skip> {
    let key = flow.key.as_ref().ok_or(Skip::NoKey)?;
    let workload = EndpointType::WorkloadEndpoint as i32;
    if key.source_type != workload || key.dest_type != workload {
        return Err(Skip::NotWorkloads);
    }
    let action = Action::try_from(key.action).ok();
    let reporter = Reporter::try_from(key.reporter).ok();
    let (denied, outbound) = match (action, reporter) {
        (Some(Action::Allow), Some(Reporter::Dst)) => (false, false),
        (Some(Action::Allow), Some(Reporter::Src)) => return Err(Skip::AllowFromSource),
        (Some(Action::Deny), Some(Reporter::Src)) => (true, true),
        (Some(Action::Deny), Some(Reporter::Dst)) => (true, false),
        _ => return Err(Skip::Action(key.action, key.reporter)),
    };
    let protocol = match key.proto.as_str() {
        "tcp" | "TCP" | "6" => uplink::Protocol::Tcp,
        "udp" | "UDP" | "17" => uplink::Protocol::Udp,
        other => return Err(Skip::Protocol(other.to_string())),
    };
    let port = u16::try_from(key.dest_port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(Skip::Port(key.dest_port))?;
    let find = |ns: &str, name: &str| {
        pod(ns, name).ok_or_else(|| Skip::UnknownPod(ns.to_string(), name.to_string()))
    };
    let source = find(&key.source_namespace, &key.source_name)?;
    let destination = find(&key.dest_namespace, &key.dest_name)?;
    let (local, peer) = if outbound {
        (source, destination)
    } else {
        (destination, source)
    };
    let node = local
        .node
        .clone()
        .ok_or_else(|| Skip::NoNode(local.namespace.clone(), local.name.clone()))?;
    let outcome = match (denied, protocol) {
        (true, _) => uplink::Outcome::Denied,
        (false, uplink::Protocol::Udp) => uplink::Outcome::Datagram,
        (false, _) => uplink::Outcome::Established,
    };
    let ms = |seconds: i64| seconds.checked_mul(1000).ok_or(Skip::Time(seconds));
    let (first, last) = (ms(flow.start_time)?, ms(flow.end_time)?);
    let record = FlowRecord {
        local: Some(LocalPod {
            namespace: local.namespace.clone(),
            name: local.name.clone(),
            uid: local.uid.clone(),
        }),
        peer_ip: network_enforcer_api::uplink::ip_bytes(peer.ips[0]),
        port: u32::from(port),
        protocol: protocol as i32,
        direction: if outbound {
            uplink::Direction::Outbound
        } else {
            uplink::Direction::Inbound
        } as i32,
        outcome: outcome as i32,
        first_seen_ms: first,
        last_seen_ms: last.max(first),
        count: u64::try_from(flow.num_connections_started.max(1)).unwrap_or(1),
        source: uplink::Source::Goldmane as i32,
        peer: Some(Peer {
            namespace: peer.namespace.clone(),
            pod: peer.name.clone(),
            principal: String::new(),
        }),
        policy: if denied {
            key.policies
                .as_ref()
                .and_then(|t| denying_policy(&t.enforced_policies))
                .unwrap_or_default()
        } else {
            String::new()
        },
        dry_run: false,
        // Goldmane's flow logs carry no DNS names.
        peer_name: String::new(),
    };
    Ok((node, record))
}

/// Lets each flow key through at most once per [`Dedupe::WINDOW`] of flow time. Pure.
#[derive(Debug, Default)]
pub struct Dedupe {
    /// Flow key (encoded) → start time (unix seconds) of the flow last let through.
    seen: HashMap<Vec<u8>, i64>,
}

impl Dedupe {
    /// Re-sends of a key within this many seconds of the one let through are dropped.
    pub const WINDOW: i64 = 60;

    /// Whether `flow` is a new observation (and records it).
    pub fn admit(&mut self, flow: &Flow) -> bool {
        use prost::Message;
        let key = flow
            .key
            .as_ref()
            .map(|k| k.encode_to_vec())
            .unwrap_or_default();
        let at = flow.start_time;
        match self.seen.get(&key) {
            // Times come from Goldmane: `at - last` could overflow (saturated, it still compares right).
            Some(last) if at.saturating_sub(*last) < Self::WINDOW => false,
            _ => {
                self.seen.insert(key, at);
                if self.seen.len() > 100_000 {
                    self.forget_before(at.saturating_sub(Self::WINDOW));
                }
                true
            }
        }
    }

    /// Forgets keys last let through before `before` (unix seconds).
    pub fn forget_before(&mut self, before: i64) {
        self.seen.retain(|_, at| *at >= before);
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Hands converted records to the ingest path under the nodes of their pods: learning and violation
/// evidence take them like an agent's batch, except that they may teach both sides of a connection
/// (see [`Learning::accept_from_cluster_source`]). Returns (accepted, rejected).
pub fn feed(learning: &Learning, records: Vec<(String, FlowRecord)>) -> (u32, u32) {
    let mut by_node: BTreeMap<String, Vec<FlowRecord>> = BTreeMap::new();
    for (node, record) in records {
        by_node.entry(node).or_default().push(record);
    }
    let (mut accepted, mut rejected) = (0, 0);
    for (node, records) in by_node {
        let ack = learning.accept_from_cluster_source(
            &node,
            &FlowBatch {
                sequence: 0,
                node: node.clone(),
                records,
                // The controller's own source: nothing is resent.
                instance: 0,
                health: None,
            },
        );
        accepted += ack.accepted;
        rejected += ack.rejected;
        if ack.rejected > 0 {
            tracing::debug!(node, reason = %ack.reason, "Goldmane records refused");
        }
    }
    (accepted, rejected)
}

/// The Goldmane flags of `network-enforcer-controller run`. Goldmane is read only with an address.
#[derive(clap::Args, Clone, Debug)]
pub struct GoldmaneArgs {
    /// Read Calico Goldmane's flows at `host:port` (e.g. `goldmane.calico-system.svc:7443`).
    #[arg(long, env = "GOLDMANE_ADDRESS")]
    pub goldmane_address: Option<String>,
    /// The Secret with Goldmane's client certificate (`tls.crt`, `tls.key`), `namespace/name`.
    #[arg(
        long,
        env = "GOLDMANE_TLS_SECRET",
        default_value = "calico-system/goldmane-key-pair"
    )]
    pub goldmane_tls_secret: ObjectRef,
    /// The ConfigMap with the CA bundle Goldmane's certificate is checked against, `namespace/name`.
    #[arg(
        long,
        env = "GOLDMANE_CA_CONFIGMAP",
        default_value = "calico-system/goldmane-ca-bundle"
    )]
    pub goldmane_ca_configmap: ObjectRef,
    /// The CA bundle's key in that ConfigMap.
    #[arg(long, env = "GOLDMANE_CA_KEY", default_value = "tigera-ca-bundle.crt")]
    pub goldmane_ca_key: String,
    /// The name Goldmane's certificate must carry (default: the address's host).
    #[arg(long, env = "GOLDMANE_SERVER_NAME")]
    pub goldmane_server_name: Option<String>,
}

impl GoldmaneArgs {
    /// The client's settings, if an address is configured.
    pub fn config(&self) -> Option<GoldmaneConfig> {
        let mut config = GoldmaneConfig::new(self.goldmane_address.clone()?);
        config.tls_secret = self.goldmane_tls_secret.clone();
        config.ca_config_map = self.goldmane_ca_configmap.clone();
        config.ca_key = self.goldmane_ca_key.clone();
        config.server_name = self.goldmane_server_name.clone();
        Some(config)
    }

    /// Starts the Goldmane source (and its pod-name watch) if configured; never returns while it runs,
    /// and stays pending forever when Goldmane is not configured, so it can sit in a `select!`.
    pub async fn run(
        &self,
        client: Client,
        learning: Arc<Learning>,
        metrics: &crate::runtime::metrics::ControllerMetrics,
        readiness: impl FnOnce() -> crate::runtime::http::Component,
    ) {
        let Some(config) = self.config() else {
            return std::future::pending().await;
        };
        tracing::info!(address = %config.address, secret = %config.tls_secret,
            ca = %config.ca_config_map, "Goldmane source on");
        let health = GoldmaneHealth::default();
        health.register(metrics);
        let source = Goldmane {
            config,
            client,
            learning,
            health,
            readiness: Some(readiness()),
        };
        source.run().await;
    }
}

/// `namespace/name` of a Secret or ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::str::FromStr for ObjectRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => Ok(Self {
                namespace: ns.into(),
                name: name.into(),
            }),
            _ => Err(format!("{s:?}: expected `namespace/name`")),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Goldmane client's settings.
#[derive(Clone, Debug)]
pub struct GoldmaneConfig {
    /// `host:port` of Goldmane.
    pub address: String,
    /// The name Goldmane's certificate must carry (default: the address's host).
    pub server_name: Option<String>,
    /// Secret with the client certificate (`tls.crt`) and key (`tls.key`).
    pub tls_secret: ObjectRef,
    /// ConfigMap with the CA bundle.
    pub ca_config_map: ObjectRef,
    /// The CA bundle's key in the ConfigMap.
    pub ca_key: String,
    /// Waits between reconnects (500 ms doubling up to 60 s).
    pub backoff: Backoff,
}

impl GoldmaneConfig {
    /// `address` with the defaults for the rest: the Calico operator's objects in calico-system
    /// (docs/install.md, `calico`).
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            server_name: None,
            tls_secret: ObjectRef {
                namespace: "calico-system".into(),
                name: "goldmane-key-pair".into(),
            },
            ca_config_map: ObjectRef {
                namespace: "calico-system".into(),
                name: "goldmane-ca-bundle".into(),
            },
            ca_key: "tigera-ca-bundle.crt".into(),
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(60),
            },
        }
    }

    /// The TLS server name: the configured one, else the address's host.
    pub fn server_name(&self) -> String {
        self.server_name.clone().unwrap_or_else(|| {
            self.address
                .rsplit_once(':')
                .map_or(self.address.as_str(), |(host, _)| host)
                .trim_matches(['[', ']'])
                .to_string()
        })
    }
}

/// Why a connection to Goldmane failed or ended.
#[derive(Debug, thiserror::Error)]
pub enum GoldmaneError {
    /// The certificate material could not be read through the API.
    #[error("reading {what} {object}: {source}")]
    Api {
        /// Secret or ConfigMap.
        what: &'static str,
        /// Which one.
        object: ObjectRef,
        /// The API error.
        source: Box<kube::Error>,
    },
    /// A key is missing from the Secret or ConfigMap.
    #[error("{what} {object} has no key {key:?}")]
    MissingKey {
        /// Secret or ConfigMap.
        what: &'static str,
        /// Which one.
        object: ObjectRef,
        /// The key.
        key: String,
    },
    /// The address or TLS settings are unusable.
    #[error("invalid Goldmane address or TLS settings {0}: {1}")]
    Config(String, String),
    /// Connecting failed (no route, refused, TLS handshake failed).
    #[error("connecting: {0:?}")]
    Connect(tonic::transport::Error),
    /// Goldmane refused the call or the stream broke.
    #[error("{0}")]
    Status(#[from] tonic::Status),
    /// Goldmane ended the stream.
    #[error("the stream ended")]
    Ended,
}

/// The client's TLS material, as read from the cluster.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// PEM CA bundle.
    pub ca: Vec<u8>,
    /// PEM client certificate.
    pub cert: Vec<u8>,
    /// PEM client key.
    pub key: Vec<u8>,
}

/// Reads the client certificate Secret and the CA ConfigMap through the API.
pub async fn read_tls(
    client: &Client,
    config: &GoldmaneConfig,
) -> Result<TlsMaterial, GoldmaneError> {
    let s = &config.tls_secret;
    let secret = Api::<Secret>::namespaced(client.clone(), &s.namespace)
        .get(&s.name)
        .await
        .map_err(|source| GoldmaneError::Api {
            what: "Secret",
            object: s.clone(),
            source: Box::new(source),
        })?;
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|b| b.0.clone())
            .ok_or_else(|| GoldmaneError::MissingKey {
                what: "Secret",
                object: s.clone(),
                key: key.into(),
            })
    };
    let (cert, key) = (field("tls.crt")?, field("tls.key")?);
    let c = &config.ca_config_map;
    let map = Api::<ConfigMap>::namespaced(client.clone(), &c.namespace)
        .get(&c.name)
        .await
        .map_err(|source| GoldmaneError::Api {
            what: "ConfigMap",
            object: c.clone(),
            source: Box::new(source),
        })?;
    let ca = map
        .data
        .unwrap_or_default()
        .get(&config.ca_key)
        .map(|s| s.clone().into_bytes())
        .ok_or_else(|| GoldmaneError::MissingKey {
            what: "ConfigMap",
            object: c.clone(),
            key: config.ca_key.clone(),
        })?;
    Ok(TlsMaterial { ca, cert, key })
}

/// How far back a stream asks Goldmane at most: Goldmane keeps about an hour of windows and backfills
/// nothing from a start older than its oldest window, so an older start is asked as "this many
/// seconds before now" (its own clock), and the windows before it are lost.
pub const MAX_BACKFILL_SECONDS: i64 = 3_300;

/// Where a stream starts (Goldmane's `start_time_gte`, which it resolves to the window holding it):
/// - after a reconnect, the newest window this process received, whole (its flows may have been cut
///   by the disconnect): the windows that completed while disconnected are backfilled from
///   Goldmane's history instead of lost, and what comes again of the windows already taken is a
///   re-send [`Dedupe`] drops;
/// - at a leader's first connect, 45 s before the persisted cursor (`through`, the newest window
///   whose evidence, and every earlier one's, the last leader wrote,
///   [`crate::ingest::source_cursors`]): the windows after it are read, what the last leader had not
///   written among them counts, and the windows up to the cursor only teach [`Dedupe`] what that
///   leader had let through (a key's re-send within 60 s of it counts no more than it did there);
/// - else live flows (`0`).
///
/// Never later than `now` (a start in the future would hold back every flow until then); a start
/// older than [`MAX_BACKFILL_SECONDS`] is asked relative to Goldmane's clock.
pub fn resume_from(newest_window: Option<i64>, through: Option<i64>, now: i64) -> i64 {
    let from = match (newest_window, through) {
        (Some(start), _) if start > 0 => start,
        (None, Some(through)) if through > 0 => through.saturating_sub(Dedupe::WINDOW - 15),
        _ => return 0,
    };
    let from = from.min(now);
    if from < now.saturating_sub(MAX_BACKFILL_SECONDS) {
        -MAX_BACKFILL_SECONDS
    } else {
        from
    }
}

/// The request: from `start_time_gte` (see [`resume_from`]), Allow and Deny, 15 s windows.
pub fn request(start_time_gte: i64) -> FlowStreamRequest {
    FlowStreamRequest {
        start_time_gte,
        filter: Some(Filter {
            actions: vec![Action::Allow as i32, Action::Deny as i32],
            ..Filter::default()
        }),
        aggregation_interval: 15,
    }
}

/// Opens a mutual-TLS stream to Goldmane with `tls`.
pub async fn open(
    config: &GoldmaneConfig,
    tls: TlsMaterial,
    start_time_gte: i64,
) -> Result<tonic::Streaming<network_enforcer_api::goldmane::FlowResult>, GoldmaneError> {
    let bad = |e: String| GoldmaneError::Config(config.address.clone(), e);
    let endpoint = Endpoint::from_shared(format!("https://{}", config.address))
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(tls.ca))
                .identity(Identity::from_pem(tls.cert, tls.key))
                .domain_name(config.server_name()),
        )
        .map_err(|e| bad(format!("{e:?}")))?;
    let channel = endpoint.connect().await.map_err(GoldmaneError::Connect)?;
    let mut client = FlowsClient::new(channel).max_decoding_message_size(16 * 1024 * 1024);
    Ok(client.stream(request(start_time_gte)).await?.into_inner())
}

/// The Goldmane source's metrics (registered by the caller).
#[derive(Clone, Debug, Default)]
pub struct GoldmaneHealth {
    /// 1 while a stream is open.
    pub connected: Gauge,
    /// Flows received.
    pub messages: Counter,
    /// Connection failures and stream errors.
    pub errors: Counter,
    /// Unix seconds of the last flow.
    pub last_message: Gauge<f64, AtomicU64>,
    /// Flows dropped as 15-s re-sends of a key already taken.
    pub resends: Counter,
    /// Flows that produced no record (see [`Skip`]).
    pub skipped: Counter,
    /// Records handed to learning and evidence.
    pub records: Counter,
}

impl GoldmaneHealth {
    /// Registers every metric as `source_*{source="goldmane"}`-like names with a `goldmane_` prefix.
    pub fn register(&self, metrics: &crate::runtime::metrics::ControllerMetrics) {
        metrics.register(
            "goldmane_connected",
            "1 while the Goldmane stream is open",
            self.connected.clone(),
        );
        metrics.register(
            "goldmane_messages",
            "Flows received from Goldmane",
            self.messages.clone(),
        );
        metrics.register(
            "goldmane_errors",
            "Goldmane connection failures and stream errors",
            self.errors.clone(),
        );
        metrics.register(
            "goldmane_last_message_timestamp_seconds",
            "Unix time of the last flow received from Goldmane",
            self.last_message.clone(),
        );
        metrics.register(
            "goldmane_resends",
            "Goldmane flows dropped as re-sends of a flow key already taken",
            self.resends.clone(),
        );
        metrics.register(
            "goldmane_skipped",
            "Goldmane flows that gave no record (not workloads, allowed at the source, unknown pod, ...)",
            self.skipped.clone(),
        );
        metrics.register(
            "goldmane_records",
            "Records from Goldmane handed to learning and violation evidence",
            self.records.clone(),
        );
    }
}

/// Where this process stands in Goldmane's windows.
struct Position {
    /// This source's cursor name ([`Goldmane::cursor_name`]).
    cursor: String,
    /// The newest window received by this process.
    newest_window: Option<i64>,
    /// The last leader's persisted cursor, read when this one started.
    written_through: Option<i64>,
}

/// Everything [`Goldmane::run`] needs.
pub struct Goldmane {
    /// Settings.
    pub config: GoldmaneConfig,
    /// For the TLS material.
    pub client: Client,
    /// Where records go.
    pub learning: Arc<Learning>,
    /// Metrics.
    pub health: GoldmaneHealth,
    /// `/readyz` detail (not required for readiness: Goldmane being down must not stop the controller).
    pub readiness: Option<crate::runtime::http::Component>,
}

impl Goldmane {
    /// The name of this source's cursor: `goldmane/<address>`.
    pub fn cursor_name(&self) -> String {
        format!("goldmane/{}", self.config.address)
    }

    /// Takes one flow: dedupe, convert, feed; notes its window and the evidence mark it waits for
    /// in the source's cursor. A flow of a window the last leader's evidence was written through is
    /// only remembered by `dedupe` (see [`resume_from`]).
    fn take(&self, dedupe: &mut Dedupe, flow: &Flow, position: &Position) {
        if position
            .written_through
            .is_some_and(|t| flow.start_time <= t)
        {
            if !dedupe.admit(flow) {
                self.health.resends.inc();
            }
            return;
        }
        let taken = self.take_flow(dedupe, flow);
        let mark = if taken {
            self.learning.evidence.as_ref().and_then(|e| e.hold())
        } else {
            None
        };
        self.learning
            .claims
            .cursors
            .fed(&position.cursor, flow.start_time, mark);
    }

    fn take_flow(&self, dedupe: &mut Dedupe, flow: &Flow) -> bool {
        if !dedupe.admit(flow) {
            self.health.resends.inc();
            return false;
        }
        let converted = {
            let index = self.learning.index.index.read().expect("index lock");
            convert(flow, |ns, name| resolve_name(&index, ns, name))
        };
        match converted {
            Ok(record) => {
                self.health.records.inc();
                feed(&self.learning, vec![record]);
                true
            }
            Err(skip) => {
                self.health.skipped.inc();
                tracing::debug!(%skip, "Goldmane flow skipped");
                false
            }
        }
    }

    /// One stream, from where `position` says (see [`resume_from`]), which it moves forward.
    async fn stream_once(
        &self,
        dedupe: &mut Dedupe,
        position: &mut Position,
    ) -> Result<(), GoldmaneError> {
        let tls = read_tls(&self.client, &self.config).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let from = resume_from(position.newest_window, position.written_through, now);
        if from < 0 {
            tracing::warn!(address = %self.config.address, newest_window = ?position.newest_window,
                written_through = ?position.written_through, start_time_gte = from,
                "resuming Goldmane from further back than it keeps windows: the flows in between are lost");
        }
        let mut stream = open(&self.config, tls, from).await?;
        self.health.connected.set(1);
        if let Some(r) = &self.readiness {
            r.ready(format!("streaming from {}", self.config.address));
        }
        tracing::info!(address = %self.config.address, start_time_gte = from, "Goldmane connected");
        while let Some(result) = stream.message().await? {
            self.health.messages.inc();
            self.health.last_message.set(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
            );
            if let Some(flow) = result.flow {
                self.take(dedupe, &flow, position);
                position.newest_window = Some(
                    position
                        .newest_window
                        .map_or(flow.start_time, |n| n.max(flow.start_time)),
                );
            }
        }
        Err(GoldmaneError::Ended)
    }

    /// Streams Goldmane's flows into learning and evidence forever. Never returns. Starts once the
    /// evidence claims a previous leader persisted are read (they hold where it stopped).
    pub async fn run(self) {
        if !self.learning.claims.ready() {
            if let Some(r) = &self.readiness {
                r.not_ready("waiting for the persisted evidence claims".to_string());
            }
            while !self.learning.claims.ready() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let cursor = self.cursor_name();
        let mut position = Position {
            written_through: self.learning.claims.cursors.through(&cursor),
            cursor,
            newest_window: None,
        };
        let mut dedupe = Dedupe::default();
        let mut attempt = 0u32;
        loop {
            let received = self.health.messages.get();
            let error = self
                .stream_once(&mut dedupe, &mut position)
                .await
                .err()
                .unwrap_or(GoldmaneError::Ended);
            self.health.connected.set(0);
            self.health.errors.inc();
            if self.health.messages.get() > received {
                attempt = 0;
            }
            let delay = self.config.backoff.delay(attempt, jitter());
            attempt = attempt.saturating_add(1);
            let hint = match &error {
                GoldmaneError::Api { .. } | GoldmaneError::MissingKey { .. } => {
                    "is Calico's Goldmane installed, and may the controller read that object?"
                }
                GoldmaneError::Connect(_) => {
                    "is Goldmane running at that address, and do its CA and server name match?"
                }
                GoldmaneError::Status(s) if s.code() == tonic::Code::Unavailable => {
                    "Goldmane is unreachable or refused the client certificate"
                }
                _ => "",
            };
            if let Some(r) = &self.readiness {
                r.not_ready(format!("{error}; {hint}"));
            }
            tracing::warn!(address = %self.config.address, %error, hint, retry_in = ?delay,
                "Goldmane stream failed");
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use network_enforcer_api::goldmane::FlowKey;
    use serde_json::json;

    /// Two pods made from a template (by generateName) and one without.
    fn index() -> Index {
        let mut index = Index::default();
        for (name, generate_name, node, ip) in [
            (
                "client-5f7d9c-abcde",
                "client-5f7d9c-",
                "node-a",
                "10.0.0.1",
            ),
            ("server-77f-xyz12", "server-77f-", "node-b", "10.0.0.2"),
            ("lonely", "", "node-b", "10.0.0.3"),
        ] {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                             "generateName": generate_name},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": "Running", "podIP": ip}
            }))
            .unwrap();
            index.apply_pod(&pod, 1_000);
        }
        index
    }

    fn flow(action: Action, reporter: Reporter) -> Flow {
        Flow {
            key: Some(FlowKey {
                source_name: "client-5f7d9c-*".into(),
                source_namespace: "shop".into(),
                source_type: EndpointType::WorkloadEndpoint as i32,
                dest_name: "server-77f-*".into(),
                dest_namespace: "shop".into(),
                dest_type: EndpointType::WorkloadEndpoint as i32,
                dest_port: 8080,
                proto: "tcp".into(),
                reporter: reporter as i32,
                action: action as i32,
                ..FlowKey::default()
            }),
            start_time: 1_700_000_000,
            end_time: 1_700_000_015,
            num_connections_started: 3,
            ..Flow::default()
        }
    }

    fn run(f: &Flow) -> Result<(String, FlowRecord), Skip> {
        let index = index();
        convert(f, |ns, n| resolve_name(&index, ns, n))
    }

    #[test]
    fn allow_reported_by_the_destination_is_an_inbound_record_of_a_destination_pod() {
        let (node, r) = run(&flow(Action::Allow, Reporter::Dst)).unwrap();
        assert_eq!(node, "node-b");
        assert_eq!(r.local.as_ref().unwrap().name, "server-77f-xyz12");
        assert_eq!(r.peer_ip, vec![10, 0, 0, 1]);
        assert_eq!(r.port, 8080);
        assert_eq!(r.direction, uplink::Direction::Inbound as i32);
        assert_eq!(r.outcome, uplink::Outcome::Established as i32);
        assert_eq!(r.source, uplink::Source::Goldmane as i32);
        assert_eq!(
            (r.first_seen_ms, r.last_seen_ms, r.count),
            (1_700_000_000_000, 1_700_000_015_000, 3)
        );
        assert_eq!(
            run(&flow(Action::Allow, Reporter::Src)),
            Err(Skip::AllowFromSource),
            "the same flow is not learned twice"
        );
    }

    #[test]
    fn deny_by_the_source_is_egress_by_the_destination_ingress_with_the_policy() {
        let mut f = flow(Action::Deny, Reporter::Src);
        f.key.as_mut().unwrap().policies = Some(
            network_enforcer_tests::e2e::sources::goldmane::end_of_tier_deny(
                "shop",
                "client-egress",
            ),
        );
        let (node, r) = run(&f).unwrap();
        assert_eq!(node, "node-a");
        assert_eq!(r.local.as_ref().unwrap().name, "client-5f7d9c-abcde");
        assert_eq!(r.direction, uplink::Direction::Outbound as i32);
        assert_eq!(r.outcome, uplink::Outcome::Denied as i32);
        assert_eq!(r.policy, "shop/client-egress", "the end-of-tier trigger");
        let (node, r) = run(&flow(Action::Deny, Reporter::Dst)).unwrap();
        assert_eq!(
            (node.as_str(), r.direction),
            ("node-b", uplink::Direction::Inbound as i32)
        );
        assert_eq!(r.policy, "", "no trace, no policy");
    }

    #[test]
    fn policy_names_come_from_direct_hits_and_unknown_kinds_still_work() {
        let hit = PolicyHit {
            kind: 7, // AdminNetworkPolicy up to v3.31, reserved since
            name: "global-deny".into(),
            action: Action::Deny as i32,
            ..PolicyHit::default()
        };
        assert_eq!(denying_policy(&[hit]).as_deref(), Some("global-deny"));
        let allow = PolicyHit {
            action: Action::Allow as i32,
            name: "x".into(),
            ..PolicyHit::default()
        };
        assert_eq!(denying_policy(&[allow]), None);
    }

    #[test]
    fn non_workloads_other_actions_protocols_and_unknown_pods_are_skipped() {
        let mut f = flow(Action::Allow, Reporter::Dst);
        f.key.as_mut().unwrap().source_type = EndpointType::Network as i32;
        assert_eq!(run(&f), Err(Skip::NotWorkloads));
        let pass = flow(Action::Pass, Reporter::Dst);
        assert!(matches!(run(&pass), Err(Skip::Action(3, 2))));
        let mut f = flow(Action::Allow, Reporter::Dst);
        f.key.as_mut().unwrap().action = 42;
        assert!(matches!(run(&f), Err(Skip::Action(42, _))));
        let mut f = flow(Action::Allow, Reporter::Dst);
        f.key.as_mut().unwrap().proto = "icmp".into();
        assert_eq!(run(&f), Err(Skip::Protocol("icmp".into())));
        let mut f = flow(Action::Allow, Reporter::Dst);
        f.end_time = i64::MAX;
        assert_eq!(run(&f), Err(Skip::Time(i64::MAX)));
        let mut f = flow(Action::Allow, Reporter::Dst);
        f.key.as_mut().unwrap().dest_name = "gone-123-*".into();
        assert!(matches!(run(&f), Err(Skip::UnknownPod(..))));
        let mut f = flow(Action::Allow, Reporter::Dst);
        f.key.as_mut().unwrap().dest_name = "lonely".into();
        assert_eq!(
            run(&f).unwrap().1.local.unwrap().name,
            "lonely",
            "full names without generateName"
        );
    }

    #[test]
    fn generate_names_follow_the_pods_of_the_index() {
        let mut index = index();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "client-5f7d9c-zzzzz", "namespace": "shop", "uid": "uid-z",
                         "generateName": "client-5f7d9c-"},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.9"}
        }))
        .unwrap();
        index.apply_pod(&pod, 2_000);
        let name =
            |index: &Index| resolve_name(index, "shop", "client-5f7d9c-*").map(|p| p.name.clone());
        assert_eq!(index.pods_generated_as("shop", "client-5f7d9c-").count(), 2);
        assert_eq!(
            name(&index).as_deref(),
            Some("client-5f7d9c-abcde"),
            "the first by name"
        );
        index.delete_pod("shop", "client-5f7d9c-abcde", 3_000);
        assert_eq!(
            name(&index).as_deref(),
            Some("client-5f7d9c-zzzzz"),
            "a deleted pod stands for nothing"
        );
        index.delete_pod("shop", "client-5f7d9c-zzzzz", 3_000);
        assert_eq!(name(&index), None);
        assert_eq!(index.pods_generated_as("shop", "server-77f-").count(), 1);
        assert_eq!(
            resolve_name(&index, "shop", "lonely*").map(|p| p.name.as_str()),
            None
        );
    }

    #[test]
    fn resends_of_a_key_count_once_per_window() {
        let mut d = Dedupe::default();
        let mut f = flow(Action::Deny, Reporter::Src);
        assert!(d.admit(&f));
        assert!(!d.admit(&f), "the same window again");
        f.start_time += 15;
        assert!(!d.admit(&f), "the next window of the same key");
        f.start_time += 45;
        assert!(d.admit(&f), "a window later");
        let other = flow(Action::Deny, Reporter::Dst);
        assert!(d.admit(&other), "another key");
        d.forget_before(i64::MAX);
        assert!(d.is_empty());
    }

    /// Found by the fuzz tests (controller/tests/fuzz.rs): a start time near i64::MAX overflowed.
    #[test]
    fn resends_at_the_edges_of_time_count_once() {
        for (first, second, admitted) in [
            (i64::MAX, i64::MAX, false),
            (i64::MAX - 10, i64::MAX, false),
            (i64::MIN, i64::MIN, false),
            (i64::MIN, i64::MIN + 60, true),
            (i64::MIN, i64::MAX, true),
            (i64::MAX, i64::MIN, false),
        ] {
            let mut d = Dedupe::default();
            let mut f = flow(Action::Deny, Reporter::Src);
            f.start_time = first;
            assert!(d.admit(&f), "{first}: the first is new");
            f.start_time = second;
            assert_eq!(d.admit(&f), admitted, "{first} then {second}");
        }
    }

    #[test]
    fn server_name_defaults_to_the_host() {
        assert_eq!(
            GoldmaneConfig::new(DEFAULT_ADDRESS).server_name(),
            "goldmane.calico-system.svc"
        );
        assert_eq!(
            "calico-system/goldmane-key-pair"
                .parse::<ObjectRef>()
                .unwrap()
                .name,
            "goldmane-key-pair"
        );
        assert!("nope".parse::<ObjectRef>().is_err());
        let r = request(0);
        assert_eq!((r.start_time_gte, r.aggregation_interval), (0, 15));
        assert_eq!(r.filter.unwrap().actions, vec![1, 2]);
    }

    #[test]
    fn a_stream_resumes_from_the_newest_window_received_or_before_the_cursor() {
        let now = 1_800_000_000;
        let old = -MAX_BACKFILL_SECONDS;
        // (newest window received, persisted cursor, start_time_gte)
        for (newest, through, want) in [
            (None, None, 0),                  // a first connect, nothing persisted: live
            (Some(now - 45), None, now - 45), // a reconnect: that window in full, and since
            (Some(now - 45), Some(now - 90), now - 45), // a reconnect goes by what it received
            (None, Some(now - 90), now - 135), // a new leader: 45 s before the cursor, to seed Dedupe
            (Some(now + 3_600), None, now),    // Goldmane's clock ahead: not in the future
            (None, Some(now + 3_600), now),
            (Some(now - 7_200), None, old), // older than Goldmane keeps: relative to its clock
            (None, Some(now - 7_200), old),
            (Some(0), None, 0), // no usable time: live
            (Some(-5), Some(-5), 0),
        ] {
            assert_eq!(
                resume_from(newest, through, now),
                want,
                "{newest:?} {through:?}"
            );
        }
    }
}
