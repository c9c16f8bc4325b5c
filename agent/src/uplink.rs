//! The uplink: ships the agent's flow records to the controller over one long-lived gRPC stream
//! (`FlowUplink.Stream`, `api/proto/networkenforcer/agent/v1/uplink.proto`; docs/behaviour.md §7.2, and
//! §1.10 for when the controller acknowledges).
//!
//! - The data path hands record batches to [`UplinkSender::send`], which never waits: when the queue to the
//!   uplink task is full the batch is dropped and counted. Capturing connections matters more than shipping
//!   every aggregate, and records are aggregates that recur, so a dropped batch costs counts, rarely edges.
//! - The uplink task ([`spawn`]) numbers each batch, keeps it in a [`ResendBuffer`] until the controller
//!   acknowledges that sequence number, and resends everything unacknowledged after each reconnect (the
//!   controller merges records idempotently, so a batch delivered twice does no harm). When the buffer is
//!   full (in batches, or in records: memory stays bounded whatever the batch sizes) the oldest batches are
//!   dropped and counted: recent flows are worth more than old ones.
//! - A flow source that must not lose what it read (the ztunnel log positions) hands [`Receipt`]s along
//!   with its records ([`UplinkSender::send_with_receipts`]); a receipt is settled once every batch made
//!   from that send is acknowledged, or dropped and counted (docs/flow-sources.md, "Read positions").
//! - Every (re)connect reads the token file again, because the kubelet rotates projected ServiceAccount
//!   tokens; the token goes in `authorization: Bearer <token>` metadata.
//! - The controller's limits are kept, since breaking one ends the stream and a resend would break it
//!   again: batches are split to at most [`UplinkConfig::max_records_per_batch`] records and written at
//!   most [`UplinkConfig::max_batches_per_second`] a second (also when resending after a reconnect).
//! - Any error or end of the stream leads to a reconnect after a capped exponential backoff with jitter
//!   ([`Backoff`]), so agents do not hammer a restarting controller in lockstep.
//!
//! [`UplinkCounters`] are Prometheus counters, registered by [`crate::metrics::AgentMetrics`].

use crate::aggregate::{Edge, WallClock};
use crate::kernel::events::{Direction, Outcome, Protocol};
use network_enforcer_api::backoff::{Backoff, jitter};
use network_enforcer_api::uplink::flow_uplink_client::FlowUplinkClient;
use network_enforcer_api::uplink::{self as proto, BatchAck, FlowBatch, FlowRecord, LocalPod};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Converts an aggregated edge of a pod on this node into the record the controller takes in.
/// Kernel times become milliseconds since the Unix epoch through `clock`.
pub fn flow_record(edge: &Edge, local: LocalPod, clock: &WallClock) -> FlowRecord {
    let key = &edge.key;
    FlowRecord {
        local: Some(local),
        peer_ip: network_enforcer_api::uplink::ip_bytes(key.peer_ip),
        port: u32::from(key.port),
        protocol: match key.protocol {
            Protocol::Tcp => proto::Protocol::Tcp,
            Protocol::Udp => proto::Protocol::Udp,
        } as i32,
        direction: match key.direction {
            Direction::Outbound => proto::Direction::Outbound,
            Direction::Inbound => proto::Direction::Inbound,
        } as i32,
        outcome: match key.outcome {
            Outcome::Established => proto::Outcome::Established,
            Outcome::Failed => proto::Outcome::Failed,
            Outcome::Datagram => proto::Outcome::Datagram,
        } as i32,
        first_seen_ms: epoch_ms(clock.at(edge.stats.first_seen)),
        last_seen_ms: epoch_ms(clock.at(edge.stats.last_seen)),
        count: edge.stats.count,
        source: proto::Source::Ebpf as i32,
        ..FlowRecord::default()
    }
}

/// Milliseconds since the Unix epoch (0 for times before it, which only a wrong clock produces).
fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Travels with records to the uplink and is settled once the controller acknowledged every batch made
/// of them, or once they were dropped and counted (queue or resend buffer full: gone either way). A
/// receipt dropped unsettled (the uplink stopped first) is never settled: its source then keeps what it
/// would otherwise have forgotten, and reads it again after a restart.
#[derive(Debug)]
pub struct Receipt(Arc<AtomicBool>);

/// The source's side of a [`Receipt`].
#[derive(Clone, Debug)]
pub struct ReceiptWatch(Arc<AtomicBool>);

/// A new unsettled receipt and its watch.
pub fn receipt() -> (Receipt, ReceiptWatch) {
    let flag = Arc::new(AtomicBool::new(false));
    (Receipt(flag.clone()), ReceiptWatch(flag))
}

impl Receipt {
    /// Marks the records it travelled with as acknowledged (or dropped and counted).
    pub fn settle(self) {
        self.0.store(true, Ordering::Release);
    }
}

impl ReceiptWatch {
    /// Whether the receipt has been settled.
    pub fn settled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the data path hands to the uplink task: records, and the receipts to settle once they are
/// acknowledged.
#[derive(Debug, Default)]
struct Outgoing {
    records: Vec<FlowRecord>,
    receipts: Vec<Receipt>,
}

/// The receipts of one send, waiting for the batches it was split into.
#[derive(Debug)]
struct Waiting {
    /// Sequence numbers neither acknowledged nor dropped yet.
    sequences: Vec<u64>,
    receipts: Vec<Receipt>,
}

/// Unacknowledged records an agent keeps by default. The controller holds the acknowledgement of a
/// record whose peer it cannot place yet (an external address) for its resolution grace (30 s), so
/// this must hold that long of new edges: one pod spraying new peers reaches its own edge cap (10 000)
/// and its server's (10 000) within one flush, and both wait. 50 000 leaves room for that and the
/// node's normal traffic (about 250 bytes each in memory).
pub const DEFAULT_MAX_PENDING_RECORDS: usize = 50_000;

/// What [`ResendBuffer::push`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The sequence number given to the new batch.
    pub sequence: u64,
    /// The sequence numbers of the oldest batches, dropped to make room (empty when there was room).
    pub dropped: Vec<u64>,
}

/// The batches sent (or still to send) that the controller has not acknowledged yet, oldest first, with
/// at most `capacity` of them and at most `max_records` records in all (except that the newest batch is
/// always kept). Pure: no I/O, no clock.
#[derive(Debug)]
pub struct ResendBuffer {
    capacity: usize,
    max_records: usize,
    /// Records in `pending`.
    records: usize,
    next_sequence: u64,
    /// Ordered by sequence number (pushes take increasing numbers; acks only remove).
    pending: VecDeque<FlowBatch>,
    dropped: u64,
}

impl ResendBuffer {
    /// An empty buffer holding at most `capacity` batches (at least one). Sequence numbers start at 1.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            max_records: usize::MAX,
            records: 0,
            next_sequence: 1,
            pending: VecDeque::with_capacity(capacity),
            dropped: 0,
        }
    }

    /// The same buffer, also limited to `max_records` records in all.
    pub fn with_max_records(mut self, max_records: usize) -> Self {
        self.max_records = max_records;
        self
    }

    /// Numbers `records` as the next batch of `node` and keeps it until acknowledged; first drops the
    /// oldest batches until it fits.
    pub fn push(&mut self, node: &str, records: Vec<FlowRecord>) -> Pushed {
        let mut dropped = Vec::new();
        while self.pending.len() >= self.capacity
            || self.records.saturating_add(records.len()) > self.max_records
        {
            let Some(oldest) = self.pending.pop_front() else {
                break;
            };
            self.records -= oldest.records.len();
            self.dropped += 1;
            dropped.push(oldest.sequence);
        }
        self.records += records.len();
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.pending.push_back(FlowBatch {
            sequence,
            node: node.to_string(),
            records,
        });
        Pushed { sequence, dropped }
    }

    /// Forgets the batch `sequence` once the controller took it in. Returns false when no such batch is
    /// pending (already acknowledged, dropped, or never sent: a duplicate ack after a resend is normal).
    pub fn ack(&mut self, sequence: u64) -> bool {
        match self.pending.binary_search_by_key(&sequence, |b| b.sequence) {
            Ok(i) => {
                let batch = self.pending.remove(i).expect("found");
                self.records -= batch.records.len();
                true
            }
            Err(_) => false,
        }
    }

    /// The oldest pending batch numbered `from` or later: what to send next on a stream that has sent
    /// everything below `from` (0 on a new stream: resend everything).
    pub fn next_from(&self, from: u64) -> Option<&FlowBatch> {
        let i = self.pending.partition_point(|b| b.sequence < from);
        self.pending.get(i)
    }

    /// Whether batch `sequence` is still waiting for its acknowledgement.
    pub fn contains(&self, sequence: u64) -> bool {
        self.next_from(sequence)
            .is_some_and(|b| b.sequence == sequence)
    }

    /// The unacknowledged batches, oldest first.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = &FlowBatch> {
        self.pending.iter()
    }

    /// Number of unacknowledged batches.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Number of records in the unacknowledged batches.
    pub fn records(&self) -> usize {
        self.records
    }

    /// Whether every batch has been acknowledged (or dropped).
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Batches dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The most batches kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// The uplink's counters, as Prometheus metrics (cheap to clone: shared atomics).
#[derive(Clone, Debug, Default)]
pub struct UplinkCounters {
    /// Batches written to a stream, resends included.
    pub batches_sent: Counter,
    /// Batches the controller acknowledged.
    pub batches_acked: Counter,
    /// Batches lost: the queue from the data path was full, or the resend buffer overflowed.
    pub batches_dropped: Counter,
    /// Reconnect attempts after an error or the end of a stream.
    pub reconnects: Counter,
    /// Records the controller took in.
    pub records_accepted: Counter,
    /// Records the controller refused (unknown pod, pod on another node, malformed).
    pub records_rejected: Counter,
    /// Batches waiting for an acknowledgement now.
    pub pending_batches: Gauge,
    /// 1 while a stream to the controller is open (for `/readyz`).
    pub connected: Gauge,
}

/// Where and how to reach the controller.
#[derive(Clone, Debug)]
pub struct UplinkConfig {
    /// The controller's ingest endpoint: `https://host:port` (with [`UplinkConfig::ca_file`]), or
    /// `http://host:port` only with [`UplinkConfig::insecure`].
    pub endpoint: String,
    /// The CA bundle (PEM) the controller's certificate must chain to; read again at every connect, so a
    /// rotated CA is picked up. Required for `https://`.
    pub ca_file: Option<PathBuf>,
    /// The name to check the controller's certificate against, when it differs from the URL's host
    /// (e.g. the URL names a node IP).
    pub server_name: Option<String>,
    /// Allow plaintext `http://` (tokens and flows travel unencrypted).
    pub insecure: bool,
    /// The projected ServiceAccount token (audience `network-enforcer`), read at every connect.
    pub token_file: PathBuf,
    /// This node's name, sent in every batch (the controller checks it against the token's pod).
    pub node: String,
    /// Unacknowledged batches kept for resending.
    pub max_pending_batches: usize,
    /// Records in those batches at most (bounds the memory whatever the batch sizes).
    pub max_pending_records: usize,
    /// Batches the data path may hand over before the uplink task takes them.
    pub queue_batches: usize,
    /// Records per batch at most (the controller refuses a stream whose batch has more than its limit,
    /// 10 000 by default).
    pub max_records_per_batch: usize,
    /// Batches written per second at most (the controller refuses a stream sending more than its limit,
    /// 20 by default).
    pub max_batches_per_second: u32,
    /// Waits between reconnects.
    pub backoff: Backoff,
    /// How long a TCP connect to the controller may take.
    pub connect_timeout: Duration,
}

impl UplinkConfig {
    /// The defaults: 256 batches and [`DEFAULT_MAX_PENDING_RECORDS`] records kept (about 40 minutes of
    /// 10-second flushes, about 12 MB), a queue of 16, at most
    /// 5000 records a batch and 10 batches a second (half the controller's default limits), backoff
    /// from 0.5 s up to 30 s, 5 s connect timeout.
    pub fn new(
        endpoint: impl Into<String>,
        token_file: impl Into<PathBuf>,
        node: impl Into<String>,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            ca_file: None,
            server_name: None,
            insecure: false,
            token_file: token_file.into(),
            node: node.into(),
            max_pending_batches: 256,
            max_pending_records: DEFAULT_MAX_PENDING_RECORDS,
            queue_batches: 16,
            max_records_per_batch: 5000,
            max_batches_per_second: 10,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl UplinkConfig {
    /// Allows a plaintext `http://` endpoint.
    pub fn insecure(mut self) -> Self {
        self.insecure = true;
        self
    }

    /// TLS: trust the CA bundle in `ca_file`, check the certificate against `server_name` when given.
    pub fn tls(mut self, ca_file: impl Into<PathBuf>, server_name: Option<String>) -> Self {
        self.ca_file = Some(ca_file.into());
        self.server_name = server_name;
        self
    }
}

/// An error with its causes, `a: b: c` (tonic's transport errors say little on their own; the cause
/// names the certificate problem).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// Why the uplink could not start, or why a stream ended (then it reconnects).
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// The endpoint is not a URL tonic can connect to.
    #[error("invalid controller URL {url:?}: {source}")]
    Endpoint {
        /// The URL given.
        url: String,
        /// What tonic said.
        source: tonic::transport::Error,
    },
    /// Neither `https://` nor `http://`.
    #[error("controller URL {0:?}: use https:// (or http:// with --controller-insecure)")]
    Scheme(String),
    /// `http://` without the explicit insecure flag.
    #[error(
        "controller URL {0:?} is plaintext: use https:// with --controller-ca-file \
         (NE_CONTROLLER_CA_FILE), or allow plaintext with --controller-insecure (NE_CONTROLLER_INSECURE=true)"
    )]
    Plaintext(String),
    /// `https://` without a CA to check the controller against.
    #[error(
        "controller URL {0:?} needs the CA that signed the controller's certificate: \
         --controller-ca-file (NE_CONTROLLER_CA_FILE)"
    )]
    NoCa(String),
    /// The CA file could not be used.
    #[error("the controller CA file {path}: {detail}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The token file could not be read.
    #[error("reading the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The token file holds no token (yet).
    #[error("the token file {0} is empty")]
    EmptyToken(PathBuf),
    /// The token has characters a header cannot carry.
    #[error("the token in {0} is not printable ASCII, so it cannot be sent as a header")]
    TokenHeader(PathBuf),
    /// The TCP or HTTP/2 connection failed.
    #[error("connecting to the controller: {}", chain(.0))]
    Connect(#[source] tonic::transport::Error),
    /// The controller answered the stream with an error (e.g. unauthenticated, not ready yet).
    #[error("the controller refused the stream: {0}")]
    Refused(#[source] tonic::Status),
    /// The stream broke, or the controller ended it with an error (e.g. a limit).
    #[error("the stream failed: {0}")]
    Stream(#[source] tonic::Status),
    /// The controller closed the stream.
    #[error("the controller ended the stream")]
    Ended,
}

/// The data path's handle to the uplink task. Cheap to clone.
#[derive(Clone, Debug)]
pub struct UplinkSender {
    queue: mpsc::Sender<Outgoing>,
    counters: UplinkCounters,
}

impl UplinkSender {
    /// Hands a batch of records to the uplink task without ever waiting. Returns false, and counts the
    /// batch as dropped, when the queue is full or the task has ended. An empty batch is not sent.
    pub fn send(&self, records: Vec<FlowRecord>) -> bool {
        self.send_with_receipts(records, Vec::new())
    }

    /// [`UplinkSender::send`], settling `receipts` once every record is acknowledged. Without records
    /// the receipts are settled now; when the batch is dropped, too (its records are gone either way).
    pub fn send_with_receipts(&self, records: Vec<FlowRecord>, receipts: Vec<Receipt>) -> bool {
        if records.is_empty() {
            receipts.into_iter().for_each(Receipt::settle);
            return true;
        }
        match self.queue.try_send(Outgoing { records, receipts }) {
            Ok(()) => true,
            Err(error) => {
                self.counters.batches_dropped.inc();
                error
                    .into_inner()
                    .receipts
                    .into_iter()
                    .for_each(Receipt::settle);
                false
            }
        }
    }
}

/// Starts the uplink task. It runs until every [`UplinkSender`] is dropped and every batch has been
/// acknowledged; while the controller is unreachable it keeps retrying (abort the handle to stop it).
/// Fails only when the endpoint URL is unusable.
pub fn spawn(
    config: UplinkConfig,
    counters: UplinkCounters,
) -> Result<(UplinkSender, JoinHandle<()>), UplinkError> {
    // Checked now so a wrong flag fails the start; rebuilt at every connect (the CA file may rotate).
    endpoint(&config)?;
    let (queue, receiver) = mpsc::channel(config.queue_batches.max(1));
    let sender = UplinkSender {
        queue,
        counters: counters.clone(),
    };
    let task = Task {
        buffer: ResendBuffer::new(config.max_pending_batches)
            .with_max_records(config.max_pending_records),
        config,
        queue: receiver,
        queue_open: true,
        counters,
        waiting: VecDeque::new(),
    };
    Ok((sender, tokio::spawn(task.run())))
}

/// Checks that `config` describes a usable endpoint (URL, scheme, insecure flag, CA file) without
/// connecting.
pub fn check(config: &UplinkConfig) -> Result<(), UplinkError> {
    endpoint(config).map(drop)
}

/// Opens the connection (TCP, TLS handshake when `https://`, HTTP/2) the uplink streams over. The
/// uplink task calls it at every reconnect; on its own it checks that the controller is reachable and
/// trusted.
pub async fn connect(config: &UplinkConfig) -> Result<Channel, UplinkError> {
    endpoint(config)?
        .connect()
        .await
        .map_err(UplinkError::Connect)
}

fn endpoint(config: &UplinkConfig) -> Result<Endpoint, UplinkError> {
    let endpoint =
        Endpoint::from_shared(config.endpoint.clone()).map_err(|source| UplinkError::Endpoint {
            url: config.endpoint.clone(),
            source,
        })?;
    let endpoint = match endpoint.uri().scheme_str() {
        Some("http") if config.insecure => endpoint,
        Some("http") => return Err(UplinkError::Plaintext(config.endpoint.clone())),
        Some("https") => {
            let path = config
                .ca_file
                .as_ref()
                .ok_or_else(|| UplinkError::NoCa(config.endpoint.clone()))?;
            let ca_error = |detail: String| UplinkError::Ca {
                path: path.clone(),
                detail,
            };
            let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(ca_error("holds no PEM certificate".into()));
            }
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            if let Some(name) = &config.server_name {
                tls = tls.domain_name(name.clone());
            }
            endpoint.tls_config(tls).map_err(|e| ca_error(chain(&e)))?
        }
        _ => return Err(UplinkError::Scheme(config.endpoint.clone())),
    };
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        // A controller that vanished without closing the connection (node lost, network partition)
        // would otherwise leave the stream hanging, with acknowledgements never coming.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true))
}

/// Reads the projected token. A small file on a tmpfs volume: a blocking read is fine here.
fn read_token(path: &Path) -> Result<String, UplinkError> {
    let token = std::fs::read_to_string(path).map_err(|source| UplinkError::Token {
        path: path.to_path_buf(),
        source,
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(UplinkError::EmptyToken(path.to_path_buf()));
    }
    Ok(token.to_string())
}

/// Sets the `connected` gauge back to 0 when the session ends.
struct Connected(Gauge);

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

/// How many batches may be written ahead of the transport. Small: the resend buffer holds the rest.
const OUTBOUND_WINDOW: usize = 4;

struct Task {
    config: UplinkConfig,
    buffer: ResendBuffer,
    queue: mpsc::Receiver<Outgoing>,
    /// False once every sender is gone: finish when everything is acknowledged.
    queue_open: bool,
    counters: UplinkCounters,
    /// Receipts of sends whose batches are not all acknowledged (or dropped) yet, oldest first.
    waiting: VecDeque<Waiting>,
}

impl Task {
    async fn run(mut self) {
        let mut attempt = 0u32;
        loop {
            let started = Instant::now();
            let mut acknowledged = false;
            let error = match self.session(&mut acknowledged).await {
                Ok(()) => return,
                Err(error) => error,
            };
            if !self.queue_open && self.buffer.is_empty() {
                return;
            }
            // A stream that worked for a while was not part of the failures the backoff grows on.
            if acknowledged || started.elapsed() >= self.config.backoff.max {
                attempt = 0;
            }
            let delay = self.config.backoff.delay(attempt, jitter());
            attempt = attempt.saturating_add(1);
            tracing::warn!(
                %error,
                retry_in = ?delay,
                pending = self.buffer.len(),
                dropped = self.buffer.dropped(),
                "uplink to the controller interrupted"
            );
            // Keep taking batches while waiting, so the data path's queue does not fill up because the
            // controller is away: the resend buffer absorbs them, dropping its oldest when full.
            let wait = tokio::time::sleep(delay);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut wait => break,
                    outgoing = self.queue.recv(), if self.queue_open => self.take(outgoing),
                }
            }
            self.counters.reconnects.inc();
        }
    }

    /// Moves records from the queue into the resend buffer as batches of at most
    /// `max_records_per_batch` (`None`: every sender is gone); their receipts wait for those batches.
    fn take(&mut self, outgoing: Option<Outgoing>) {
        let Some(Outgoing {
            mut records,
            receipts,
        }) = outgoing
        else {
            self.queue_open = false;
            return;
        };
        let max = self.config.max_records_per_batch.max(1);
        let mut sequences = Vec::new();
        while !records.is_empty() {
            let rest = records.split_off(records.len().min(max));
            let pushed = self.buffer.push(&self.config.node, records);
            sequences.push(pushed.sequence);
            if !pushed.dropped.is_empty() {
                self.counters
                    .batches_dropped
                    .inc_by(pushed.dropped.len() as u64);
                tracing::debug!(
                    sequences = ?pushed.dropped,
                    "uplink buffer full: dropped the oldest batches"
                );
                pushed.dropped.iter().for_each(|s| self.settle(*s));
            }
            records = rest;
        }
        // A batch of this very send may have made room for its successor.
        sequences.retain(|s| self.buffer.contains(*s));
        if sequences.is_empty() {
            receipts.into_iter().for_each(Receipt::settle);
        } else if !receipts.is_empty() {
            self.waiting.push_back(Waiting {
                sequences,
                receipts,
            });
        }
        self.counters.pending_batches.set(self.buffer.len() as i64);
    }

    /// Batch `sequence` is acknowledged or dropped: settles the receipts that waited only for it.
    fn settle(&mut self, sequence: u64) {
        for waiting in &mut self.waiting {
            waiting.sequences.retain(|s| *s != sequence);
        }
        while let Some(i) = self.waiting.iter().position(|w| w.sequences.is_empty()) {
            if let Some(done) = self.waiting.remove(i) {
                done.receipts.into_iter().for_each(Receipt::settle);
            }
        }
    }

    fn acknowledge(&mut self, ack: &BatchAck) {
        if self.buffer.ack(ack.sequence) {
            self.counters.batches_acked.inc();
            self.settle(ack.sequence);
        }
        self.counters
            .records_accepted
            .inc_by(u64::from(ack.accepted));
        self.counters
            .records_rejected
            .inc_by(u64::from(ack.rejected));
        if ack.rejected > 0 {
            tracing::debug!(
                sequence = ack.sequence,
                rejected = ack.rejected,
                reason = %ack.reason,
                "the controller refused records"
            );
        }
        self.counters.pending_batches.set(self.buffer.len() as i64);
    }

    /// One stream: connect, resend what is unacknowledged, then send new batches and take acks until
    /// something fails. `Ok` only when every sender is gone and every batch acknowledged.
    async fn session(&mut self, acknowledged: &mut bool) -> Result<(), UplinkError> {
        let token = read_token(&self.config.token_file)?;
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| UplinkError::TokenHeader(self.config.token_file.clone()))?;
        let channel = connect(&self.config).await?;
        let mut client = FlowUplinkClient::new(channel);
        let (outbound, outbound_rx) = mpsc::channel::<FlowBatch>(OUTBOUND_WINDOW);
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound_rx));
        request.metadata_mut().insert("authorization", header);
        let mut acks = client
            .stream(request)
            .await
            .map_err(UplinkError::Refused)?
            .into_inner();
        tracing::info!(
            endpoint = %self.config.endpoint,
            pending = self.buffer.len(),
            "uplink connected"
        );
        self.counters.connected.set(1);
        // Back to 0 however the session ends.
        let _connected = Connected(self.counters.connected.clone());
        // Everything below `next` has been written to this stream. Starting at 0 resends every
        // unacknowledged batch: the previous stream may have died with them in flight.
        let mut next = 0u64;
        let pace = Duration::from_secs(1) / self.config.max_batches_per_second.max(1);
        let mut send_at = tokio::time::Instant::now();
        loop {
            if !self.queue_open && self.buffer.is_empty() {
                // Dropping `outbound` ends our half of the stream; the controller then ends its half.
                return Ok(());
            }
            let unsent = self.buffer.next_from(next).is_some();
            tokio::select! {
                // Reserve first, then pick the batch: whatever the buffer dropped meanwhile is skipped.
                permit = async {
                    tokio::time::sleep_until(send_at).await;
                    outbound.reserve().await
                }, if unsent => {
                    let permit = permit.map_err(|_| UplinkError::Ended)?;
                    if let Some(batch) = self.buffer.next_from(next) {
                        next = batch.sequence + 1;
                        permit.send(batch.clone());
                        self.counters.batches_sent.inc();
                        send_at = tokio::time::Instant::now() + pace;
                    }
                }
                outgoing = self.queue.recv(), if self.queue_open => self.take(outgoing),
                ack = acks.message() => match ack {
                    Ok(Some(ack)) => {
                        *acknowledged = true;
                        self.acknowledge(&ack);
                    }
                    Ok(None) => return Err(UplinkError::Ended),
                    Err(status) => return Err(UplinkError::Stream(status)),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{EdgeKey, EdgeStats};

    fn records(n: usize) -> Vec<FlowRecord> {
        (0..n)
            .map(|i| FlowRecord {
                port: i as u32,
                ..FlowRecord::default()
            })
            .collect()
    }

    fn sequences(buffer: &ResendBuffer) -> Vec<u64> {
        buffer.pending().map(|b| b.sequence).collect()
    }

    #[test]
    fn batches_are_numbered_from_one_and_carry_the_node() {
        let mut buffer = ResendBuffer::new(4);
        assert_eq!(
            buffer.push("node-a", records(2)),
            Pushed {
                sequence: 1,
                dropped: vec![]
            }
        );
        assert_eq!(buffer.push("node-a", records(1)).sequence, 2);
        let first = buffer.pending().next().unwrap();
        assert_eq!((first.node.as_str(), first.records.len()), ("node-a", 2));
        assert_eq!(buffer.len(), 2);
    }

    #[test]
    fn ack_removes_exactly_that_batch_and_ignores_unknown_sequences() {
        let mut buffer = ResendBuffer::new(8);
        for _ in 0..4 {
            buffer.push("n", records(1));
        }
        assert!(buffer.ack(2));
        assert_eq!(sequences(&buffer), [1, 3, 4]);
        assert!(
            !buffer.ack(2),
            "a duplicate ack (after a resend) is a no-op"
        );
        assert!(!buffer.ack(9), "never sent");
        assert!(buffer.ack(1) && buffer.ack(4) && buffer.ack(3));
        assert!(buffer.is_empty());
        assert_eq!(
            buffer.push("n", records(1)).sequence,
            5,
            "numbers are never reused"
        );
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_counts_it() {
        let mut buffer = ResendBuffer::new(3);
        for _ in 0..3 {
            assert_eq!(buffer.push("n", records(1)).dropped, [0u64; 0]);
        }
        assert_eq!(buffer.push("n", records(1)).dropped, [1]);
        assert_eq!(buffer.push("n", records(1)).dropped, [2]);
        assert_eq!(sequences(&buffer), [3, 4, 5]);
        assert_eq!(buffer.dropped(), 2);
        assert_eq!(buffer.len(), buffer.capacity());
    }

    #[test]
    fn zero_capacity_still_keeps_the_newest_batch() {
        let mut buffer = ResendBuffer::new(0);
        buffer.push("n", records(1));
        assert_eq!(buffer.push("n", records(1)).dropped, [1]);
        assert_eq!(sequences(&buffer), [2]);
    }

    #[test]
    fn the_record_limit_drops_as_many_old_batches_as_needed_and_acks_free_room() {
        let mut buffer = ResendBuffer::new(100).with_max_records(10);
        buffer.push("n", records(4));
        buffer.push("n", records(4));
        assert_eq!(buffer.records(), 8);
        assert_eq!(
            buffer.push("n", records(2)).dropped,
            [0u64; 0],
            "exactly full"
        );
        assert_eq!(buffer.push("n", records(7)).dropped, [1, 2]);
        assert_eq!(sequences(&buffer), [3, 4]);
        assert_eq!(buffer.records(), 9);
        assert!(buffer.ack(4));
        assert_eq!(buffer.records(), 2);
        assert_eq!(buffer.push("n", records(8)).dropped, [0u64; 0]);
        // A batch bigger than the limit replaces everything but is kept: the newest is never lost here.
        assert_eq!(buffer.push("n", records(30)).dropped, [3, 5]);
        assert_eq!((sequences(&buffer), buffer.records()), (vec![6], 30));
        assert_eq!(buffer.dropped(), 4);
    }

    #[test]
    fn next_from_walks_the_pending_batches_for_a_resend() {
        let mut buffer = ResendBuffer::new(8);
        for _ in 0..5 {
            buffer.push("n", records(1));
        }
        buffer.ack(1);
        buffer.ack(3);
        // A new stream starts at 0 and resends 2, 4, 5 in order.
        let mut next = 0;
        let mut resent = Vec::new();
        while let Some(batch) = buffer.next_from(next) {
            resent.push(batch.sequence);
            next = batch.sequence + 1;
        }
        assert_eq!(resent, [2, 4, 5]);
        assert!(buffer.next_from(6).is_none());
        assert_eq!(buffer.next_from(3).map(|b| b.sequence), Some(4));
    }

    fn task(capacity: usize, max_records_per_batch: usize) -> Task {
        let (_, queue) = mpsc::channel(1);
        Task {
            config: UplinkConfig {
                max_records_per_batch,
                ..UplinkConfig::new("http://127.0.0.1:9", "/nonexistent", "n")
            },
            buffer: ResendBuffer::new(capacity),
            queue,
            queue_open: true,
            counters: UplinkCounters::default(),
            waiting: VecDeque::new(),
        }
    }

    fn ack(sequence: u64) -> BatchAck {
        BatchAck {
            sequence,
            ..BatchAck::default()
        }
    }

    #[test]
    fn a_receipt_is_settled_once_every_batch_of_its_send_is_acknowledged() {
        let mut task = task(8, 2);
        let (first, first_watch) = receipt();
        let (second, second_watch) = receipt();
        // Split into batches 1 and 2.
        task.take(Some(Outgoing {
            records: records(3),
            receipts: vec![first],
        }));
        task.take(Some(Outgoing {
            records: records(1),
            receipts: vec![second],
        }));
        task.acknowledge(&ack(1));
        task.acknowledge(&ack(3));
        assert!(
            !first_watch.settled(),
            "batch 2 of the first send is not acknowledged"
        );
        assert!(second_watch.settled(), "sends are settled independently");
        task.acknowledge(&ack(1));
        assert!(!first_watch.settled(), "a duplicate ack settles nothing");
        task.acknowledge(&ack(2));
        assert!(first_watch.settled());
        assert!(task.waiting.is_empty());
    }

    #[test]
    fn a_receipt_is_settled_when_its_batches_are_dropped_or_there_were_none() {
        let mut task = task(1, 10);
        let (old, old_watch) = receipt();
        task.take(Some(Outgoing {
            records: records(1),
            receipts: vec![old],
        }));
        assert!(!old_watch.settled());
        // The buffer holds one batch: the next send drops the old one, whose records are gone.
        task.take(Some(Outgoing {
            records: records(1),
            receipts: vec![],
        }));
        assert!(old_watch.settled());
        assert_eq!(task.counters.batches_dropped.get(), 1);

        let (queue, _rx) = mpsc::channel(1);
        let sender = UplinkSender {
            queue,
            counters: UplinkCounters::default(),
        };
        let (empty, empty_watch) = receipt();
        assert!(sender.send_with_receipts(Vec::new(), vec![empty]));
        assert!(empty_watch.settled(), "nothing to acknowledge");
        let (queued, queued_watch) = receipt();
        assert!(sender.send_with_receipts(records(1), vec![queued]));
        assert!(!queued_watch.settled(), "waits in the queue");
        let (full, full_watch) = receipt();
        assert!(!sender.send_with_receipts(records(1), vec![full]));
        assert!(full_watch.settled(), "dropped and counted: gone either way");
        assert_eq!(sender.counters.batches_dropped.get(), 1);
    }

    #[test]
    fn an_edge_becomes_a_record_with_enums_bytes_and_epoch_milliseconds() {
        let clock = WallClock::now();
        let edge = Edge {
            key: EdgeKey {
                netns_ino: Some(1),
                cgroup_id: Some(2),
                local_ip: "10.0.0.1".parse().unwrap(),
                peer_ip: "10.0.0.2".parse().unwrap(),
                port: 8080,
                protocol: Protocol::Tcp,
                direction: Direction::Outbound,
                outcome: Outcome::Failed,
            },
            stats: EdgeStats {
                first_seen: Duration::from_secs(100),
                last_seen: Duration::from_millis(102_500),
                count: 7,
                last_error: Some(111),
            },
        };
        let pod = LocalPod {
            namespace: "shop".into(),
            name: "client-1".into(),
            uid: "0b0e2f6a-1111-2222-3333-444455556666".into(),
        };
        let record = flow_record(&edge, pod.clone(), &clock);
        assert_eq!(record.local, Some(pod));
        assert_eq!(record.peer_ip, [10, 0, 0, 2]);
        assert_eq!(record.port, 8080);
        assert_eq!(record.protocol, proto::Protocol::Tcp as i32);
        assert_eq!(record.direction, proto::Direction::Outbound as i32);
        assert_eq!(record.outcome, proto::Outcome::Failed as i32);
        assert_eq!(record.source, proto::Source::Ebpf as i32);
        assert_eq!(record.count, 7);
        assert_eq!(record.last_seen_ms - record.first_seen_ms, 2500);
        assert_eq!(
            record.first_seen_ms,
            epoch_ms(clock.at(Duration::from_secs(100)))
        );

        let mut v6 = edge;
        v6.key.peer_ip = "fd00::2".parse().unwrap();
        v6.key.protocol = Protocol::Udp;
        v6.key.direction = Direction::Inbound;
        v6.key.outcome = Outcome::Datagram;
        let record = flow_record(&v6, LocalPod::default(), &clock);
        assert_eq!(record.peer_ip.len(), 16);
        assert_eq!(record.peer_ip[0], 0xfd);
        assert_eq!(record.peer_ip[15], 2);
        assert_eq!(record.protocol, proto::Protocol::Udp as i32);
        assert_eq!(record.direction, proto::Direction::Inbound as i32);
        assert_eq!(record.outcome, proto::Outcome::Datagram as i32);
    }

    #[test]
    fn epoch_milliseconds_of_a_known_time() {
        assert_eq!(epoch_ms(UNIX_EPOCH + Duration::from_millis(1_700)), 1_700);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }

    #[test]
    fn plaintext_needs_the_insecure_flag_and_tls_needs_a_ca() {
        let config = |url: &str| UplinkConfig::new(url, "/nonexistent", "n");
        assert!(endpoint(&config("http://127.0.0.1:9443").insecure()).is_ok());
        let plaintext = endpoint(&config("http://127.0.0.1:9443")).unwrap_err();
        assert!(matches!(plaintext, UplinkError::Plaintext(_)));
        assert!(
            plaintext
                .to_string()
                .contains("NE_CONTROLLER_INSECURE=true")
        );
        assert!(matches!(
            endpoint(&config("https://controller:9443")),
            Err(UplinkError::NoCa(_))
        ));
        assert!(matches!(
            endpoint(&config("https://controller:9443").tls("/nonexistent/ca.crt", None)),
            Err(UplinkError::Ca { .. })
        ));
        assert!(matches!(
            endpoint(&config("ftp://controller:9443").insecure()),
            Err(UplinkError::Scheme(_))
        ));
        assert!(matches!(
            endpoint(&config("not a url")),
            Err(UplinkError::Endpoint { .. })
        ));
    }

    #[test]
    fn the_token_is_read_trimmed_and_an_empty_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("ne-uplink-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "abc.def\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "abc.def");
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(read_token(&path), Err(UplinkError::EmptyToken(_))));
        assert!(matches!(
            read_token(&dir.join("missing")),
            Err(UplinkError::Token { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
