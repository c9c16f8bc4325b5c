//! Istio ambient's ztunnel logs as a flow source (docs/flow-sources.md, "Istio ambient ztunnel"): the
//! JSON lines ztunnel writes with `logAsJson=true` and `AUTHZ_POLICY_INFO_LOGGING=true`.
//!
//! [`parse_line`] reads one line into an [`Event`] (pure); [`Correlator`] turns events into records:
//! - inbound `connection complete` (scope `access`) without error and with both identities → a learning
//!   record of the destination pod (port from `dst.hbone_addr`, the peer's principal from `src.identity`);
//! - `dry-run: deny policy match` / `dry-run: no allow policies match` (scope `ztunnel::state`) →
//!   monitor evidence (`dry_run`), `deny policy match` / `no allow policies matched` → protect evidence;
//!   these carry no port, so they wait for the access line of the same connection (same destination
//!   workload and peer `ip:port`) to take its port and identities; a decision whose access line does not
//!   come within [`Correlator::PENDING_MS`] is reported without a port;
//! - an inbound access line rejected by policy with no decision line before it (decision logging off)
//!   is protect evidence on its own, with the policy from the error text;
//! - `connection failed` (scope `access`, WARN) is ztunnel's early deny, before it knows the workload:
//!   it names only addresses, so no record can name the local pod or a policy, and the reference does
//!   not count it as evidence. It is counted instead ([`Reader::connections_failed`] and the
//!   `source_ztunnel_connections_failed_total{direction,reason}` metric, reason `policy_rejection` when
//!   the error is a policy rejection), and logged at most once a minute;
//! - allowed outcomes, outbound halves and other scopes are ignored;
//! - ztunnel < 1.30 dry-run messages (`dry-run deny policy match`, no colon, DEBUG only) are reported as
//!   unsupported rather than misread.
//!
//! Read positions are saved only up to lines whose records the controller acknowledged
//! (docs/flow-sources.md, "Read positions"): [`Reader::poll`] keeps a checkpoint of the positions it
//! reached and hands the [`Receipt`] of its records to [`run`], which sends it along; the checkpoint is
//! saved once that receipt and every earlier one are settled. A decision still waiting for its access
//! line holds its file's position at its line, so a restart reads it again too. An agent killed before
//! the acknowledgement reads those lines again (the controller merges records: a repeat does no harm).

use super::rfc3339_ms;
use super::tail::Position;
use crate::uplink::{Receipt, ReceiptWatch};
use network_enforcer_api::uplink::{self, FlowRecord, LocalPod, Peer};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Where a line was read: its file and where a restart must resume to read it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineOrigin {
    /// The file (the path the tailer follows).
    pub path: PathBuf,
    /// The line's start in that file.
    pub position: Position,
}

/// An authorization decision of the destination ztunnel about one inbound connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The destination pod (`proxy.wl`, `<ns>/<pod>`).
    pub workload: (String, String),
    /// The connecting peer (`inbound.peer`).
    pub peer: SocketAddr,
    /// `<ns>/<name>` of the policy, when the message names one.
    pub policy: Option<String>,
    /// A dry-run policy (the connection goes on) rather than an enforced one.
    pub dry_run: bool,
    /// The line's time, ms since the epoch.
    pub at_ms: i64,
    /// Where the line was read (set by the [`Reader`]; `None` from [`parse_line`]).
    pub origin: Option<LineOrigin>,
}

/// An inbound `connection complete` access line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// `dst.namespace`/`dst.workload`.
    pub workload: (String, String),
    /// `src.addr`.
    pub peer: SocketAddr,
    /// The real destination port (`dst.hbone_addr`, else `dst.addr`).
    pub port: u16,
    /// `src.namespace`/`src.workload`, when known.
    pub peer_workload: Option<(String, String)>,
    /// `src.identity` without `spiffe://`.
    pub src_principal: Option<String>,
    /// Whether `dst.identity` was present (mTLS).
    pub dst_identity: bool,
    /// Rejected by policy: `Some(policy named in the error, if any)`.
    pub rejected_by: Option<Option<String>>,
    /// Failed for another reason (not a policy rejection).
    pub failed: bool,
    /// The line's time, ms since the epoch.
    pub at_ms: i64,
}

/// A `connection failed` access line: ztunnel refused a connection before it knew the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The line's `direction`.
    pub direction: FailureDirection,
    /// `src.addr`.
    pub src: SocketAddr,
    /// `dst.addr`.
    pub dst: SocketAddr,
    /// The error is a policy rejection (`connection closed due to policy rejection: ...`).
    pub policy_rejection: bool,
    /// The `error` text.
    pub error: String,
    /// The line's time, ms since the epoch.
    pub at_ms: i64,
}

/// What one log line is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An early deny (`connection failed`): counted, no record (see the module docs).
    Failed(Failure),
    /// An authorization decision that reports a (would-be) denial.
    Decision(Decision),
    /// An inbound access line.
    Access(Access),
    /// Nothing to act on (allowed outcomes, outbound halves, other scopes, re-evaluations without a peer).
    Ignored(&'static str),
    /// A message of a ztunnel older than 1.30, whose format we do not read.
    Unsupported(&'static str),
}

/// Why a line could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not a JSON object (plain-text ztunnel logs: set `logAsJson=true`).
    #[error("not a JSON object (is ztunnel logging with logAsJson=true?)")]
    NotJson,
    /// A field the message kind needs is missing or malformed.
    #[error("{message:?}: field {field} missing or malformed")]
    Field {
        /// The message.
        message: String,
        /// The field.
        field: &'static str,
    },
}

fn text<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn span<'a>(obj: &'a Map<String, Value>, span: &str, key: &str) -> Option<&'a str> {
    obj.get(span)
        .and_then(Value::as_object)
        .and_then(|o| text(o, key))
}

/// `spiffe://td/ns/x/sa/y` → `td/ns/x/sa/y` (the principal form AuthorizationPolicies use).
pub fn principal(identity: &str) -> &str {
    identity.strip_prefix("spiffe://").unwrap_or(identity)
}

const REJECTION: &str = "connection closed due to policy rejection: ";
const DENIED_BY: &str = "explicitly denied by: ";

/// Reads one JSON log line (the container runtime's framing already removed). Pure.
pub fn parse_line(line: &str) -> Result<Event, LineError> {
    let value: Value = serde_json::from_str(line.trim()).map_err(|_| LineError::NotJson)?;
    let obj = value.as_object().ok_or(LineError::NotJson)?;
    let message = text(obj, "message").unwrap_or_default();
    let scope = text(obj, "scope").unwrap_or_default();
    let at_ms = text(obj, "time")
        .and_then(rfc3339_ms)
        .unwrap_or_else(super::now_ms);
    let missing = |field| LineError::Field {
        message: message.to_string(),
        field,
    };
    match (scope, message) {
        (_, "dry-run deny policy match" | "dry-run allow policy match") => Ok(Event::Unsupported(
            "ztunnel < 1.30 dry-run message (upgrade to 1.30+ for dry-run evidence)",
        )),
        (
            "ztunnel::state",
            "dry-run: deny policy match"
            | "dry-run: no allow policies match"
            | "deny policy match"
            | "no allow policies matched",
        ) => {
            let Some(peer) = span(obj, "inbound", "peer") else {
                // Re-evaluation after a policy change: no peer to attribute; the connection-manager line
                // that follows closes the connection, whose access line carries the rejection.
                return Ok(Event::Ignored("decision without an inbound peer"));
            };
            let peer: SocketAddr = peer.parse().map_err(|_| missing("inbound.peer"))?;
            let wl = span(obj, "proxy", "wl").ok_or_else(|| missing("proxy.wl"))?;
            let (ns, pod) = wl.split_once('/').ok_or_else(|| missing("proxy.wl"))?;
            let policy = text(obj, "policy").map(str::to_string);
            let named = message.ends_with("policy match");
            if named && policy.is_none() {
                return Err(missing("policy"));
            }
            Ok(Event::Decision(Decision {
                workload: (ns.to_string(), pod.to_string()),
                peer,
                policy,
                dry_run: message.starts_with("dry-run: "),
                at_ms,
                origin: None,
            }))
        }
        ("ztunnel::state", _) => Ok(Event::Ignored("allowed outcome")),
        ("access", "connection complete") => {
            if text(obj, "direction") != Some("inbound") {
                return Ok(Event::Ignored("outbound half"));
            }
            let peer: SocketAddr = text(obj, "src.addr")
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| missing("src.addr"))?;
            let port = text(obj, "dst.hbone_addr")
                .or_else(|| text(obj, "dst.addr"))
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .map(|a| a.port())
                .ok_or_else(|| missing("dst.hbone_addr"))?;
            let (Some(ns), Some(pod)) = (text(obj, "dst.namespace"), text(obj, "dst.workload"))
            else {
                return Ok(Event::Ignored("destination workload unknown"));
            };
            let error = text(obj, "error");
            let rejected_by = error
                .and_then(|e| e.strip_prefix(REJECTION))
                .map(|reason| reason.strip_prefix(DENIED_BY).map(|p| p.trim().to_string()));
            Ok(Event::Access(Access {
                workload: (ns.to_string(), pod.to_string()),
                peer,
                port,
                peer_workload: text(obj, "src.namespace")
                    .zip(text(obj, "src.workload"))
                    .map(|(n, w)| (n.to_string(), w.to_string())),
                src_principal: text(obj, "src.identity").map(|i| principal(i).to_string()),
                dst_identity: text(obj, "dst.identity").is_some(),
                failed: error.is_some() && rejected_by.is_none(),
                rejected_by,
                at_ms,
            }))
        }
        ("access", "connection failed") => {
            let addr = |key: &'static str| {
                text(obj, key)
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                    .ok_or_else(|| missing(key))
            };
            let error = text(obj, "error").unwrap_or_default();
            Ok(Event::Failed(Failure {
                direction: match text(obj, "direction") {
                    Some("inbound") => FailureDirection::inbound,
                    Some("outbound") => FailureDirection::outbound,
                    _ => FailureDirection::unknown,
                },
                src: addr("src.addr")?,
                dst: addr("dst.addr")?,
                policy_rejection: error.starts_with(REJECTION),
                error: error.to_string(),
                at_ms,
            }))
        }
        _ => Ok(Event::Ignored("other message")),
    }
}

/// The `direction` of a `connection failed` line, as the `direction` label writes it.
// Variants in name order: `Reader::connections_failed` is sorted by them, as by the names.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FailureDirection {
    inbound,
    outbound,
    /// The line has no (known) `direction`.
    unknown,
}

impl FailureDirection {
    /// The name, as the label writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureDirection::inbound => "inbound",
            FailureDirection::outbound => "outbound",
            FailureDirection::unknown => "unknown",
        }
    }
}

/// Why ztunnel refused a connection early, as the `reason` label writes it.
// Variants in name order: `Reader::connections_failed` is sorted by them, as by the names.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FailureReason {
    other,
    policy_rejection,
}

/// The labels of `source_ztunnel_connections_failed_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct FailureLabels {
    pub direction: FailureDirection,
    pub reason: FailureReason,
}

impl FailureLabels {
    fn of(f: &Failure) -> Self {
        Self {
            direction: f.direction,
            reason: if f.policy_rejection {
                FailureReason::policy_rejection
            } else {
                FailureReason::other
            },
        }
    }
}

/// Early denies of every ztunnel reader in the process. A process-wide family because the readers are
/// started by the sources module with nothing but their [`super::SourceHealth`]; the agent's registry
/// takes it through [`register_metrics`].
static CONNECTIONS_FAILED: std::sync::LazyLock<
    prometheus_client::metrics::family::Family<
        FailureLabels,
        prometheus_client::metrics::counter::Counter,
    >,
> = std::sync::LazyLock::new(Default::default);

/// Registers the ztunnel-specific metrics (under the registry's prefix).
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    registry.register(
        "source_ztunnel_connections_failed",
        "Connections ztunnel refused before it knew the workload (`connection failed`, an early \
         deny): counted, not attributed to a pod or policy",
        CONNECTIONS_FAILED.clone(),
    );
}

/// The record of an inbound connection to `workload` from `peer`.
fn record(
    workload: &(String, String),
    peer: SocketAddr,
    port: u16,
    outcome: uplink::Outcome,
    at_ms: i64,
) -> FlowRecord {
    FlowRecord {
        local: Some(LocalPod {
            namespace: workload.0.clone(),
            name: workload.1.clone(),
            uid: String::new(),
        }),
        peer_ip: network_enforcer_api::uplink::ip_bytes(peer.ip()),
        port: u32::from(port),
        protocol: uplink::Protocol::Tcp as i32,
        direction: uplink::Direction::Inbound as i32,
        outcome: outcome as i32,
        first_seen_ms: at_ms,
        last_seen_ms: at_ms,
        count: 1,
        source: uplink::Source::Ztunnel as i32,
        ..FlowRecord::default()
    }
}

fn peer_of(access: &Access) -> Option<Peer> {
    if access.peer_workload.is_none() && access.src_principal.is_none() {
        return None;
    }
    let (namespace, pod) = access.peer_workload.clone().unwrap_or_default();
    Some(Peer {
        namespace,
        pod,
        principal: access.src_principal.clone().unwrap_or_default(),
    })
}

fn denial(decision: &Decision, port: u16, peer: Option<Peer>) -> FlowRecord {
    FlowRecord {
        policy: decision.policy.clone().unwrap_or_default(),
        dry_run: decision.dry_run,
        peer,
        ..record(
            &decision.workload,
            decision.peer,
            port,
            uplink::Outcome::Denied,
            decision.at_ms,
        )
    }
}

/// Joins decisions with the access line of the same connection. Pure (time comes from the lines).
#[derive(Debug, Default)]
pub struct Correlator {
    /// Decisions waiting for their access line, by (destination workload, peer address).
    pending: BTreeMap<((String, String), SocketAddr), Vec<Decision>>,
    /// The newest line time seen.
    now_ms: i64,
}

impl Correlator {
    /// How long a decision waits for its connection's access line (ms of log time).
    pub const PENDING_MS: i64 = 30_000;

    /// Takes one event; returns the records it completes (including decisions that waited too long).
    pub fn push(&mut self, event: Event) -> Vec<FlowRecord> {
        let mut out = Vec::new();
        match event {
            Event::Decision(d) => {
                self.now_ms = self.now_ms.max(d.at_ms);
                self.pending
                    .entry((d.workload.clone(), d.peer))
                    .or_default()
                    .push(d);
            }
            Event::Access(a) => {
                self.now_ms = self.now_ms.max(a.at_ms);
                let waiting = self
                    .pending
                    .remove(&(a.workload.clone(), a.peer))
                    .unwrap_or_default();
                let peer = peer_of(&a);
                let enforced = waiting.iter().any(|d| !d.dry_run);
                for d in &waiting {
                    out.push(denial(d, a.port, peer.clone()));
                }
                match &a.rejected_by {
                    // Decision logging is off (or at DEBUG): the access line is the only evidence.
                    Some(policy) if !enforced => {
                        let decision = Decision {
                            workload: a.workload.clone(),
                            peer: a.peer,
                            policy: policy.clone(),
                            dry_run: false,
                            at_ms: a.at_ms,
                            origin: None,
                        };
                        out.push(denial(&decision, a.port, peer));
                    }
                    Some(_) => {}
                    None if !a.failed && a.src_principal.is_some() && a.dst_identity => {
                        out.push(FlowRecord {
                            peer,
                            ..record(
                                &a.workload,
                                a.peer,
                                a.port,
                                uplink::Outcome::Established,
                                a.at_ms,
                            )
                        });
                    }
                    None => {}
                }
            }
            Event::Failed(_) | Event::Ignored(_) | Event::Unsupported(_) => {}
        }
        out.extend(self.expire(self.now_ms - Self::PENDING_MS));
        out
    }

    /// Reports, without a port, every decision older than `before_ms` whose access line never came.
    pub fn expire(&mut self, before_ms: i64) -> Vec<FlowRecord> {
        let mut out = Vec::new();
        self.pending.retain(|_, decisions| {
            decisions.retain(|d| {
                if d.at_ms < before_ms {
                    out.push(denial(d, 0, None));
                    false
                } else {
                    true
                }
            });
            !decisions.is_empty()
        });
        out
    }

    /// Decisions waiting for their access line.
    pub fn pending(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }

    /// Where the lines of the decisions waiting for their access line were read.
    pub fn pending_origins(&self) -> impl Iterator<Item = &LineOrigin> {
        self.pending
            .values()
            .flatten()
            .filter_map(|d| d.origin.as_ref())
    }
}

/// Positions reached by a poll, saved once the records of that poll and of every earlier one are
/// settled.
#[derive(Debug)]
struct Checkpoint {
    positions: BTreeMap<PathBuf, Position>,
    /// Receipts not settled yet (settled ones are pruned).
    watches: Vec<ReceiptWatch>,
}

/// Checkpoints kept at most; past it a new one is merged into the newest, which then waits for both
/// (the positions saved lag more, nothing is lost). Bounds the memory while the controller is away.
const MAX_CHECKPOINTS: usize = 64;

/// The ztunnel log reader's settings.
#[derive(Clone, Debug)]
pub struct ZtunnelConfig {
    /// The log files to read (default `/var/log/containers/*ztunnel*.log`).
    pub glob: String,
    /// Where read positions are kept across agent restarts (`None`: not kept).
    pub state_file: Option<std::path::PathBuf>,
    /// How often the files are polled.
    pub poll: std::time::Duration,
}

/// The default log glob: the kubelet's symlinks to the ztunnel containers' logs.
pub const DEFAULT_GLOB: &str = "/var/log/containers/*ztunnel*.log";

/// The ztunnel log reader: the tailer, the parser and the correlator, polled by [`run`] (and by tests).
pub struct Reader {
    config: ZtunnelConfig,
    tailer: super::tail::Tailer,
    correlator: Correlator,
    health: super::SourceHealth,
    malformed_log: super::RateLimitedLog,
    unsupported_log: super::RateLimitedLog,
    missing_log: super::RateLimitedLog,
    failed_log: super::RateLimitedLog,
    /// Early denies read by this reader, by labels.
    failed: BTreeMap<FailureLabels, u64>,
    /// Positions waiting for acknowledgements, oldest first.
    checkpoints: VecDeque<Checkpoint>,
    /// The receipt of the records polled since the last [`Reader::take_receipt`].
    unclaimed: Option<Receipt>,
}

impl Reader {
    /// A reader of the files of `config`, counting into `health`.
    pub fn new(config: ZtunnelConfig, health: super::SourceHealth) -> Self {
        use super::RateLimitedLog;
        use std::time::Duration;
        let minute = Duration::from_secs(60);
        Self {
            tailer: super::tail::Tailer::new(config.glob.clone(), config.state_file.clone()),
            config,
            correlator: Correlator::default(),
            health,
            malformed_log: RateLimitedLog::new(minute),
            unsupported_log: RateLimitedLog::new(minute),
            missing_log: RateLimitedLog::new(Duration::from_secs(600)),
            failed_log: RateLimitedLog::new(minute),
            failed: BTreeMap::new(),
            checkpoints: VecDeque::new(),
            unclaimed: None,
        }
    }

    /// The receipt to send with the records of the polls since the last call (`None` when they gave
    /// none). Until it is settled, the positions reached by those polls, and by every later one, are not
    /// saved: a restart reads those lines again.
    pub fn take_receipt(&mut self) -> Option<Receipt> {
        self.unclaimed.take()
    }

    /// Decisions waiting for their access line.
    pub fn pending_decisions(&self) -> usize {
        self.correlator.pending()
    }

    /// Records a checkpoint of the positions this poll reached, then saves the newest checkpoint whose
    /// records, and every earlier one's, are settled.
    fn checkpoint(&mut self, has_records: bool) {
        let mut positions = self.tailer.positions();
        // A decision waiting for its access line is in no record yet: keep its line for a restart.
        for origin in self.correlator.pending_origins() {
            if let Some(p) = positions.get_mut(&origin.path) {
                if (p.dev, p.ino) == (origin.position.dev, origin.position.ino) {
                    p.offset = p.offset.min(origin.position.offset);
                }
            }
        }
        let mut watches = Vec::new();
        let merge = self.unclaimed.is_some() || self.checkpoints.len() >= MAX_CHECKPOINTS;
        if has_records && self.unclaimed.is_none() {
            let (receipt, watch) = crate::uplink::receipt();
            self.unclaimed = Some(receipt);
            watches.push(watch);
        }
        match self.checkpoints.back_mut() {
            // Records not handed over yet travel with the same receipt as the earlier ones.
            Some(last) if merge => {
                last.positions = positions;
                last.watches.extend(watches);
            }
            _ => self
                .checkpoints
                .push_back(Checkpoint { positions, watches }),
        }
        self.save_settled();
    }

    /// Saves the newest checkpoint whose records, and every earlier one's, are settled: what a poll
    /// does after reading, and what the agent's stop does once its last batches are acknowledged (no
    /// poll comes after them: without it a rolling update would read the last flush's lines again).
    pub fn save_settled(&mut self) {
        let mut reached = None;
        for c in &mut self.checkpoints {
            c.watches.retain(|w| !w.settled());
        }
        while self
            .checkpoints
            .front()
            .is_some_and(|c| c.watches.is_empty())
        {
            reached = self.checkpoints.pop_front().map(|c| c.positions);
        }
        if let Some(positions) = reached {
            self.tailer.save(&positions);
        }
    }

    /// Early denies (`connection failed`) this reader has read, by direction and reason.
    pub fn connections_failed(&self) -> &BTreeMap<FailureLabels, u64> {
        &self.failed
    }

    /// Files being read.
    pub fn files(&self) -> usize {
        self.tailer.files()
    }

    /// Reads what was appended since the last poll; returns the records it completed, whose receipt
    /// [`Reader::take_receipt`] gives. Malformed lines are counted in `errors` and logged (at most once
    /// a minute), unsupported ones in `skipped`.
    pub fn poll(&mut self) -> Vec<FlowRecord> {
        let mut records = Vec::new();
        let (health, correlator) = (&self.health, &mut self.correlator);
        let (malformed_log, unsupported_log) = (&mut self.malformed_log, &mut self.unsupported_log);
        let (failed_log, failed) = (&mut self.failed_log, &mut self.failed);
        self.tailer.poll(&mut |file, at, framed| {
            health.message();
            let event = framed
                .map_err(|e| e.to_string())
                .and_then(|line| parse_line(&line).map_err(|e| e.to_string()))
                .map(|mut event| {
                    if let Event::Decision(d) = &mut event {
                        d.origin = Some(LineOrigin {
                            path: file.to_path_buf(),
                            position: at,
                        });
                    }
                    event
                });
            match event {
                Ok(Event::Unsupported(why)) => {
                    health.skipped.inc();
                    if let Some(suppressed) = unsupported_log.allow() {
                        tracing::warn!(file = %file.display(), why, suppressed, "unsupported ztunnel log line");
                    }
                }
                Ok(Event::Failed(failure)) => {
                    health.skipped.inc();
                    let labels = FailureLabels::of(&failure);
                    CONNECTIONS_FAILED.get_or_create(&labels).inc();
                    *failed.entry(labels).or_default() += 1;
                    if let Some(suppressed) = failed_log.allow() {
                        tracing::info!(file = %file.display(), direction = failure.direction.as_str(),
                            src = %failure.src, dst = %failure.dst, error = %failure.error, suppressed,
                            "ztunnel refused a connection before knowing its workload; counted, not attributed");
                    }
                }
                Ok(event) => {
                    let before = records.len();
                    records.extend(correlator.push(event));
                    if records.len() == before {
                        health.skipped.inc();
                    }
                }
                Err(error) => {
                    health.errors.inc();
                    if let Some(suppressed) = malformed_log.allow() {
                        tracing::warn!(file = %file.display(), %error, suppressed, "malformed ztunnel log line");
                    }
                }
            }
        });
        // Decisions whose access line never came, also when the logs went quiet.
        records.extend(correlator.expire(super::now_ms() - 2 * Correlator::PENDING_MS));
        self.checkpoint(!records.is_empty());
        self.health
            .connected
            .set(i64::from(self.tailer.files() > 0));
        if self.tailer.files() == 0 {
            if let Some(suppressed) = self.missing_log.allow() {
                tracing::warn!(glob = %self.config.glob, suppressed,
                    "no ztunnel log file matches; is Istio ambient running on this node and /var/log mounted?");
            }
        }
        self.health.records.inc_by(records.len() as u64);
        records
    }
}

/// Tails the ztunnel logs into `sink` (see [`Reader`]), each poll's records with their receipt, until
/// `stop` fires or its sender is dropped; then saves the acknowledged read positions and returns.
pub async fn run(
    config: ZtunnelConfig,
    sink: super::RecordSink,
    health: super::SourceHealth,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let poll = config.poll.max(std::time::Duration::from_millis(50));
    let mut reader = Reader::new(config, health);
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // File I/O is blocking but short (only what was appended since the last poll).
                let records = reader.poll();
                sink.add_with_receipt(records, reader.take_receipt());
            }
            // The agent stops (or dropped its handle): what the controller acknowledged by now is
            // saved; lines read since its last flush stay unsaved, to be read again after a restart.
            _ = &mut stop => {
                reader.save_settled();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Example lines as ztunnel 1.30 writes them with `logAsJson=true`.
    const LEARN: &str = r#"{"level":"info","time":"2026-08-21T10:15:30.123456Z","scope":"access","message":"connection complete","src.addr":"10.244.1.7:51234","src.workload":"web-client-6f9c7d8b5-x2k9p","src.namespace":"shop","src.identity":"spiffe://cluster.local/ns/shop/sa/web-client","dst.addr":"10.244.2.9:15008","dst.hbone_addr":"10.244.2.9:8080","dst.service":"catalog.shop.svc.cluster.local","dst.workload":"catalog-5d4b8c7f9-q7r2m","dst.namespace":"shop","dst.identity":"spiffe://cluster.local/ns/shop/sa/catalog","direction":"inbound","bytes_sent":512,"bytes_recv":128,"duration":"42ms"}"#;
    const DRY_DENY: &str = r#"{"level":"info","time":"2026-08-21T10:16:01.000210Z","scope":"ztunnel::state","message":"dry-run: deny policy match","policy":"shop/deny-legacy-dryrun","proxy":{"wl":"shop/catalog-5d4b8c7f9-q7r2m"},"inbound":{"id":"4bf92f3577b34da6a3ce929d0e0e4736","peer":"10.244.1.7:51240"}}"#;
    const DENY: &str = r#"{"level":"info","time":"2026-08-21T10:17:12.300400Z","scope":"ztunnel::state","message":"deny policy match","policy":"shop/deny-legacy","proxy":{"wl":"shop/catalog-5d4b8c7f9-q7r2m"},"inbound":{"id":"0f1e2d3c4b5a69788796a5b4c3d2e1f0","peer":"10.244.1.7:51300"}}"#;
    const DENY_ACCESS: &str = r#"{"level":"error","time":"2026-08-21T10:17:12.300900Z","scope":"access","message":"connection complete","src.addr":"10.244.1.7:51300","src.workload":"web-client-6f9c7d8b5-x2k9p","src.namespace":"shop","src.identity":"spiffe://cluster.local/ns/shop/sa/web-client","dst.addr":"10.244.2.9:15008","dst.hbone_addr":"10.244.2.9:8080","dst.service":"catalog.shop.svc.cluster.local","dst.workload":"catalog-5d4b8c7f9-q7r2m","dst.namespace":"shop","dst.identity":"spiffe://cluster.local/ns/shop/sa/catalog","direction":"inbound","bytes_sent":0,"bytes_recv":0,"duration":"0ms","error":"connection closed due to policy rejection: explicitly denied by: shop/deny-legacy"}"#;
    const OUTBOUND_401: &str = r#"{"level":"error","time":"2026-08-21T10:18:40.011000Z","scope":"access","message":"connection complete","src.addr":"10.244.4.2:39001","src.workload":"batch-7c8d9e-abcde","src.namespace":"jobs","src.identity":"spiffe://cluster.local/ns/jobs/sa/batch","dst.addr":"10.244.2.9:15008","dst.hbone_addr":"10.96.40.12:8080","dst.service":"catalog.shop.svc.cluster.local","dst.namespace":"shop","direction":"outbound","bytes_sent":0,"bytes_recv":0,"duration":"2ms","error":"http status: 401 Unauthorized"}"#;

    #[test]
    fn inbound_connection_complete_with_identities_learns() {
        let mut c = Correlator::default();
        let out = c.push(parse_line(LEARN).unwrap());
        assert_eq!(out.len(), 1);
        let r = &out[0];
        assert_eq!(r.local.as_ref().unwrap().name, "catalog-5d4b8c7f9-q7r2m");
        assert_eq!(r.peer_ip, vec![10, 244, 1, 7]);
        assert_eq!(r.port, 8080, "the real port from dst.hbone_addr, not 15008");
        assert_eq!(r.outcome, uplink::Outcome::Established as i32);
        assert_eq!(r.direction, uplink::Direction::Inbound as i32);
        assert_eq!(
            r.peer.as_ref().unwrap().principal,
            "cluster.local/ns/shop/sa/web-client"
        );
        assert_eq!(r.first_seen_ms, 1_787_307_330_123);
    }

    #[test]
    fn without_both_identities_nothing_is_learned() {
        let plaintext = LEARN.replace(
            r#""src.identity":"spiffe://cluster.local/ns/shop/sa/web-client","#,
            "",
        );
        assert!(
            Correlator::default()
                .push(parse_line(&plaintext).unwrap())
                .is_empty()
        );
        let no_dst = LEARN.replace(
            r#","dst.identity":"spiffe://cluster.local/ns/shop/sa/catalog""#,
            "",
        );
        assert!(
            Correlator::default()
                .push(parse_line(&no_dst).unwrap())
                .is_empty()
        );
    }

    #[test]
    fn enforced_deny_joins_its_access_line_once() {
        let mut c = Correlator::default();
        assert!(
            c.push(parse_line(DENY).unwrap()).is_empty(),
            "waits for the port"
        );
        let out = c.push(parse_line(DENY_ACCESS).unwrap());
        assert_eq!(out.len(), 1, "{out:?}");
        let r = &out[0];
        assert_eq!(r.outcome, uplink::Outcome::Denied as i32);
        assert_eq!(
            (r.policy.as_str(), r.dry_run, r.port),
            ("shop/deny-legacy", false, 8080)
        );
        assert_eq!(r.peer_ip, vec![10, 244, 1, 7]);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn a_rejection_without_decision_lines_is_evidence_on_its_own() {
        let mut c = Correlator::default();
        let out = c.push(parse_line(DENY_ACCESS).unwrap());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].policy, "shop/deny-legacy");
        let none_allowed = DENY_ACCESS.replace(
            "explicitly denied by: shop/deny-legacy",
            "allow policies exist, but none allowed",
        );
        let out = c.push(parse_line(&none_allowed).unwrap());
        assert_eq!((out.len(), out[0].policy.as_str()), (1, ""));
    }

    #[test]
    fn dry_run_deny_takes_the_port_of_the_allowed_connection_which_is_also_learned() {
        let mut c = Correlator::default();
        assert!(c.push(parse_line(DRY_DENY).unwrap()).is_empty());
        let access = LEARN
            .replace("10.244.1.7:51234", "10.244.1.7:51240")
            .replace("10:15:30.123456", "10:16:01.100000");
        let out = c.push(parse_line(&access).unwrap());
        assert_eq!(out.len(), 2, "{out:?}");
        let denied = out
            .iter()
            .find(|r| r.outcome == uplink::Outcome::Denied as i32)
            .unwrap();
        assert_eq!(
            (denied.policy.as_str(), denied.dry_run, denied.port),
            ("shop/deny-legacy-dryrun", true, 8080)
        );
        assert!(
            out.iter()
                .any(|r| r.outcome == uplink::Outcome::Established as i32)
        );
    }

    #[test]
    fn a_decision_whose_access_line_never_comes_is_reported_without_a_port() {
        let mut c = Correlator::default();
        let no_allow = r#"{"level":"info","time":"2026-08-21T10:16:05.480011Z","scope":"ztunnel::state","message":"dry-run: no allow policies match","proxy":{"wl":"shop/catalog-5d4b8c7f9-q7r2m"},"inbound":{"id":"9a","peer":"10.244.3.4:40112"}}"#;
        assert!(c.push(parse_line(no_allow).unwrap()).is_empty());
        // A later, unrelated line moves log time past the wait.
        let later = LEARN.replace("10:15:30", "10:17:30");
        let out = c.push(parse_line(&later).unwrap());
        let expired = out
            .iter()
            .find(|r| r.outcome == uplink::Outcome::Denied as i32)
            .unwrap();
        assert_eq!(
            (expired.port, expired.dry_run, expired.policy.as_str()),
            (0, true, "")
        );
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn allowed_outcomes_outbound_halves_and_other_scopes_are_ignored() {
        let allowed = r#"{"level":"info","time":"2026-08-21T10:16:05.480030Z","scope":"ztunnel::state","message":"no allow policies, allow","proxy":{"wl":"shop/c"},"inbound":{"id":"9a","peer":"10.244.3.4:40112"}}"#;
        assert_eq!(parse_line(allowed), Ok(Event::Ignored("allowed outcome")));
        assert_eq!(
            parse_line(OUTBOUND_401),
            Ok(Event::Ignored("outbound half"))
        );
        let other = r#"{"level":"info","time":"2026-08-21T10:16:05Z","scope":"ztunnel::proxy","message":"listener established"}"#;
        assert_eq!(parse_line(other), Ok(Event::Ignored("other message")));
        let reeval = r#"{"level":"info","time":"2026-08-21T10:16:05Z","scope":"ztunnel::state","message":"deny policy match","policy":"a/b","proxy":{"wl":"shop/c"}}"#;
        assert!(matches!(parse_line(reeval), Ok(Event::Ignored(_))));
    }

    #[test]
    fn connection_failed_is_an_early_deny_without_a_record() {
        let line = r#"{"level":"warn","time":"2026-08-21T10:19:00.000001Z","scope":"access","message":"connection failed","src.addr":"10.244.4.2:39010","dst.addr":"10.244.2.9:15008","direction":"inbound","error":"connection closed due to policy rejection: allow policies exist, but none allowed"}"#;
        let event = parse_line(line).unwrap();
        assert_eq!(
            event,
            Event::Failed(Failure {
                direction: FailureDirection::inbound,
                src: "10.244.4.2:39010".parse().unwrap(),
                dst: "10.244.2.9:15008".parse().unwrap(),
                policy_rejection: true,
                error: "connection closed due to policy rejection: allow policies exist, but none allowed"
                    .into(),
                at_ms: 1_787_307_540_000,
            })
        );
        assert!(Correlator::default().push(event).is_empty());
        let other = line
            .replace(
                "connection closed due to policy rejection: allow policies exist, but none allowed",
                "connection refused",
            )
            .replace(r#""direction":"inbound","#, "");
        match parse_line(&other).unwrap() {
            Event::Failed(f) => assert_eq!(
                (f.direction, f.policy_rejection),
                (FailureDirection::unknown, false)
            ),
            e => panic!("{e:?}"),
        }
        let no_src = line.replace(r#""src.addr":"10.244.4.2:39010","#, "");
        assert!(matches!(
            parse_line(&no_src),
            Err(LineError::Field {
                field: "src.addr",
                ..
            })
        ));
    }

    #[test]
    fn early_deny_labels_are_written_as_before() {
        use prometheus_client::metrics::{counter::Counter, family::Family};
        // A family of its own: the process-wide one counts every test's readers.
        let family = Family::<FailureLabels, Counter>::default();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("failed", "t", family.clone());
        for direction in [
            FailureDirection::inbound,
            FailureDirection::outbound,
            FailureDirection::unknown,
        ] {
            for (reason, policy_rejection) in [
                (FailureReason::policy_rejection, true),
                (FailureReason::other, false),
            ] {
                let failure = Failure {
                    direction,
                    src: "10.0.0.1:1".parse().unwrap(),
                    dst: "10.0.0.2:2".parse().unwrap(),
                    policy_rejection,
                    error: String::new(),
                    at_ms: 0,
                };
                let labels = FailureLabels::of(&failure);
                assert_eq!(labels, FailureLabels { direction, reason });
                family.get_or_create(&labels).inc();
            }
        }
        let text = network_enforcer_api::metrics::render(&registry);
        let mut lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                "failed_total{direction=\"inbound\",reason=\"other\"} 1",
                "failed_total{direction=\"inbound\",reason=\"policy_rejection\"} 1",
                "failed_total{direction=\"outbound\",reason=\"other\"} 1",
                "failed_total{direction=\"outbound\",reason=\"policy_rejection\"} 1",
                "failed_total{direction=\"unknown\",reason=\"other\"} 1",
                "failed_total{direction=\"unknown\",reason=\"policy_rejection\"} 1",
            ]
        );
        // The log field spells the direction as the label does.
        for d in [
            FailureDirection::inbound,
            FailureDirection::outbound,
            FailureDirection::unknown,
        ] {
            assert!(text.contains(&format!("direction=\"{}\"", d.as_str())));
        }
    }

    #[test]
    fn old_formats_are_unsupported_and_garbage_is_an_error() {
        let old = r#"{"level":"debug","time":"2025-01-01T00:00:00Z","scope":"ztunnel::state","message":"dry-run deny policy match","policy":"a/b"}"#;
        assert!(matches!(parse_line(old), Ok(Event::Unsupported(_))));
        assert_eq!(
            parse_line("2025-01-01T00:00:00Z  INFO access connection complete"),
            Err(LineError::NotJson)
        );
        assert_eq!(parse_line("[1,2]"), Err(LineError::NotJson));
        let no_policy = DENY.replace(r#""policy":"shop/deny-legacy","#, "");
        assert!(matches!(
            parse_line(&no_policy),
            Err(LineError::Field {
                field: "policy",
                ..
            })
        ));
        let bad_peer = DENY.replace("10.244.1.7:51300", "nowhere");
        assert!(matches!(
            parse_line(&bad_peer),
            Err(LineError::Field {
                field: "inbound.peer",
                ..
            })
        ));
    }
}
