//! Flow sources other than the agent's own eBPF programs (docs/behaviour.md §7.3, §7.4;
//! docs/flow-sources.md): what a CNI or mesh on
//! this node already knows about its flows, turned into the same [`FlowRecord`]s the eBPF edges become.
//!
//! - [`hubble`]: Cilium Hubble's `observer.Observer/GetFlows` (local socket or Relay with TLS);
//! - [`ztunnel`]: the JSON lines of Istio ambient's ztunnel logs, and the correlation of its
//!   authorization messages with its access logs;
//! - [`tail`]: the container-log tailer (CRI format, rotation, truncation, positions kept on disk) that
//!   feeds the ztunnel parser.
//!
//! Every source folds its records into one [`RecordSink`]; the agent's flush drains it next to the eBPF
//! edges and hands everything to the uplink, so there is one path to the controller. Every source
//! reports its health in [`SourceMetrics`], retries with [`network_enforcer_api::backoff::Backoff`] and never ends the
//! process.

pub mod hubble;
pub mod tail;
pub mod ztunnel;

use crate::uplink::Receipt;
use network_enforcer_api::uplink::{FlowRecord, LocalPod, Peer};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// The flow-source flags of `network-enforcer-agent run`. Every source is off unless configured.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SourceArgs {
    /// Read Cilium Hubble flows from this node's Hubble socket (e.g. `/var/run/cilium/hubble.sock`,
    /// mounted from the host).
    #[arg(long, env = "NE_HUBBLE_SOCKET")]
    pub hubble_socket: Option<std::path::PathBuf>,
    /// Read Cilium Hubble flows from Hubble Relay at `host:port` instead (only this node's flows are
    /// taken), e.g. `hubble-relay.kube-system.svc:443`.
    #[arg(
        long,
        env = "NE_HUBBLE_RELAY_ADDRESS",
        conflicts_with = "hubble_socket"
    )]
    pub hubble_relay_address: Option<String>,
    /// PEM CA bundle of the Relay's server certificate; turns TLS on.
    #[arg(long, env = "NE_HUBBLE_RELAY_CA_FILE")]
    pub hubble_relay_ca_file: Option<std::path::PathBuf>,
    /// The name the Relay's certificate must carry; turns TLS on.
    #[arg(long, env = "NE_HUBBLE_RELAY_SERVER_NAME")]
    pub hubble_relay_server_name: Option<String>,
    /// PEM client certificate for a Relay that requires mutual TLS (with --hubble-relay-client-key-file).
    #[arg(
        long,
        env = "NE_HUBBLE_RELAY_CLIENT_CERT_FILE",
        requires = "hubble_relay_client_key_file"
    )]
    pub hubble_relay_client_cert_file: Option<std::path::PathBuf>,
    /// PEM key of the client certificate.
    #[arg(
        long,
        env = "NE_HUBBLE_RELAY_CLIENT_KEY_FILE",
        requires = "hubble_relay_client_cert_file"
    )]
    pub hubble_relay_client_key_file: Option<std::path::PathBuf>,
    /// Where the Hubble resume point is kept across restarts (written atomically; needs a writable
    /// host path; empty: not kept, a restart starts with live flows).
    #[arg(long, env = "NE_HUBBLE_STATE_FILE")]
    pub hubble_state_file: Option<std::path::PathBuf>,
    /// Tail Istio ztunnel's JSON logs matching this glob (`*`/`?` in any path component), e.g.
    /// `/var/log/containers/*ztunnel*.log`.
    #[arg(long, env = "NE_ZTUNNEL_LOG_GLOB")]
    pub ztunnel_log_glob: Option<String>,
    /// Where the ztunnel log read positions are kept across agent restarts (a small JSON file on a
    /// writable host path; empty: not kept).
    #[arg(
        long,
        env = "NE_ZTUNNEL_STATE_FILE",
        default_value = "/var/lib/network-enforcer/ztunnel-positions.json"
    )]
    pub ztunnel_state_file: std::path::PathBuf,
    /// Milliseconds between polls of the ztunnel logs.
    #[arg(long, env = "NE_ZTUNNEL_POLL_MS", default_value_t = 1000)]
    pub ztunnel_poll_ms: u64,
}

impl SourceArgs {
    /// The Hubble client's settings, if Hubble is configured.
    pub fn hubble(&self, node: Option<String>) -> Option<hubble::HubbleConfig> {
        let target = if let Some(path) = &self.hubble_socket {
            hubble::Target::Socket(path.clone())
        } else {
            let address = self.hubble_relay_address.clone()?;
            let tls_on = self.hubble_relay_ca_file.is_some()
                || self.hubble_relay_server_name.is_some()
                || self.hubble_relay_client_cert_file.is_some();
            hubble::Target::Relay {
                address,
                tls: tls_on.then(|| hubble::RelayTls {
                    ca: self.hubble_relay_ca_file.clone(),
                    server_name: self.hubble_relay_server_name.clone(),
                    client_cert: self.hubble_relay_client_cert_file.clone(),
                    client_key: self.hubble_relay_client_key_file.clone(),
                }),
            }
        };
        Some(hubble::HubbleConfig {
            state_file: self
                .hubble_state_file
                .clone()
                .filter(|p| !p.as_os_str().is_empty()),
            ..hubble::HubbleConfig::new(target, node)
        })
    }

    /// The ztunnel reader's settings, if configured.
    pub fn ztunnel(&self) -> Option<ztunnel::ZtunnelConfig> {
        let glob = self.ztunnel_log_glob.clone()?;
        Some(ztunnel::ZtunnelConfig {
            glob,
            state_file: Some(self.ztunnel_state_file.clone()).filter(|p| !p.as_os_str().is_empty()),
            poll: std::time::Duration::from_millis(self.ztunnel_poll_ms),
        })
    }

    /// Starts the configured sources; returns the sink the flush drains (`None`: no source on) and
    /// what stops them. Must be called inside the Tokio runtime.
    pub fn start(
        &self,
        node: Option<String>,
        metrics: &SourceMetrics,
    ) -> (Option<RecordSink>, SourcesStop) {
        let hubble = self.hubble(node);
        let ztunnel = self.ztunnel();
        let mut stop = SourcesStop::default();
        if hubble.is_none() && ztunnel.is_none() {
            return (None, stop);
        }
        let sink = RecordSink::default();
        if let Some(config) = hubble {
            tracing::info!(target = ?config.target, node = ?config.node, state = ?config.state_file, "Hubble source on");
            let (tell, told) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(hubble::run(
                config,
                sink.clone(),
                metrics.source(SourceName::hubble),
                told,
            ));
            stop.push("hubble", tell, task);
        }
        if let Some(config) = ztunnel {
            tracing::info!(glob = %config.glob, state = ?config.state_file, "ztunnel source on");
            let (tell, told) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(ztunnel::run(
                config,
                sink.clone(),
                metrics.source(SourceName::ztunnel),
                told,
            ));
            stop.push("ztunnel", tell, task);
        }
        (Some(sink), stop)
    }
}

/// How the agent's stop ends the sources, which keep state across restarts: the ztunnel reader saves
/// the read positions, the Hubble client its resume point, of what the controller acknowledged
/// (docs/flow-sources.md).
#[derive(Debug, Default)]
pub struct SourcesStop {
    tasks: Vec<(
        &'static str,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl SourcesStop {
    /// Adds a source task started with `tell`'s receiver ([`ztunnel::run`], [`hubble::run`]).
    pub fn push(
        &mut self,
        name: &'static str,
        tell: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
    ) {
        self.tasks.push((name, tell, task));
    }

    /// Called once the uplink has delivered the last flush (or given up): each source saves what was
    /// acknowledged and ends, within 2 s (a save is one small file write).
    pub async fn stop(self) {
        for (name, tell, task) in self.tasks {
            let _ = tell.send(());
            let abort = task.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
                tracing::warn!(
                    source = name,
                    "the source did not stop in 2 s; its state not saved"
                );
            }
        }
    }
}

/// What makes two source records the same aggregate: everything but the times and the count.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RecordKey {
    local: (String, String, String),
    peer_ip: Vec<u8>,
    port: u32,
    protocol: i32,
    direction: i32,
    outcome: i32,
    source: i32,
    peer: Option<(String, String, String)>,
    policy: String,
    dry_run: bool,
}

impl RecordKey {
    fn of(r: &FlowRecord) -> Self {
        let pod = |p: &LocalPod| (p.namespace.clone(), p.name.clone(), p.uid.clone());
        let peer = |p: &Peer| (p.namespace.clone(), p.pod.clone(), p.principal.clone());
        Self {
            local: r.local.as_ref().map(pod).unwrap_or_default(),
            peer_ip: r.peer_ip.clone(),
            port: r.port,
            protocol: r.protocol,
            direction: r.direction,
            outcome: r.outcome,
            source: r.source,
            peer: r.peer.as_ref().map(peer),
            policy: r.policy.clone(),
            dry_run: r.dry_run,
        }
    }
}

/// Folds source records with the same key into one (count added up, first/last seen widened) until the
/// agent's flush drains them. Bounded: past `capacity` distinct keys new records are dropped and counted,
/// so a flood from a source cannot grow the agent's memory. Also holds the [`Receipt`]s sources attach
/// to their records, so that a flush takes both together.
#[derive(Debug)]
pub struct RecordAggregator {
    records: HashMap<RecordKey, FlowRecord>,
    capacity: usize,
    dropped: u64,
    receipts: Vec<Receipt>,
}

impl Default for RecordAggregator {
    fn default() -> Self {
        Self::new(50_000)
    }
}

impl RecordAggregator {
    /// An empty aggregator holding at most `capacity` distinct records.
    pub fn new(capacity: usize) -> Self {
        Self {
            records: HashMap::new(),
            capacity,
            dropped: 0,
            receipts: Vec::new(),
        }
    }

    /// Adds a record; returns false when it was dropped for lack of room.
    pub fn add(&mut self, record: FlowRecord) -> bool {
        let key = RecordKey::of(&record);
        if let Some(held) = self.records.get_mut(&key) {
            held.count += record.count.max(1);
            held.first_seen_ms = held.first_seen_ms.min(record.first_seen_ms);
            held.last_seen_ms = held.last_seen_ms.max(record.last_seen_ms);
            return true;
        }
        if self.records.len() >= self.capacity {
            self.dropped += 1;
            return false;
        }
        let mut record = record;
        record.count = record.count.max(1);
        self.records.insert(key, record);
        true
    }

    /// Takes every record, oldest first.
    pub fn drain(&mut self) -> Vec<FlowRecord> {
        let mut out: Vec<FlowRecord> = self.records.drain().map(|(_, r)| r).collect();
        out.sort_by_key(|r| (r.first_seen_ms, r.port));
        out
    }

    /// Takes every record, oldest first, and the receipts added with them.
    pub fn drain_with_receipts(&mut self) -> (Vec<FlowRecord>, Vec<Receipt>) {
        (self.drain(), std::mem::take(&mut self.receipts))
    }

    /// Distinct records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records dropped because the aggregator was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// The sources' shared handle to the aggregator the flush drains. Cheap to clone; `add` holds the lock
/// only for a hash-map update, so it never blocks a source for long.
#[derive(Clone, Debug, Default)]
pub struct RecordSink {
    inner: Arc<Mutex<RecordAggregator>>,
}

impl RecordSink {
    /// A sink with room for `capacity` distinct records between flushes.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(RecordAggregator::new(capacity))),
        }
    }

    /// Adds a record; false when dropped for lack of room.
    pub fn add(&self, record: FlowRecord) -> bool {
        self.inner.lock().expect("record sink lock").add(record)
    }

    /// Adds `records` and then `receipt`, under one lock: a flush that takes the receipt takes every one
    /// of these records too (or they were dropped for lack of room, and counted), so settling the receipt
    /// once that flush is acknowledged covers them all.
    pub fn add_with_receipt(&self, records: Vec<FlowRecord>, receipt: Option<Receipt>) {
        let mut inner = self.inner.lock().expect("record sink lock");
        for record in records {
            inner.add(record);
        }
        inner.receipts.extend(receipt);
    }

    /// Takes every record held. Receipts held are dropped unsettled (see [`Receipt`]): a flush that
    /// ships records uses [`RecordSink::drain_with_receipts`].
    pub fn drain(&self) -> Vec<FlowRecord> {
        self.drain_with_receipts().0
    }

    /// Takes every record held and the receipts to settle once they are acknowledged.
    pub fn drain_with_receipts(&self) -> (Vec<FlowRecord>, Vec<Receipt>) {
        self.inner
            .lock()
            .expect("record sink lock")
            .drain_with_receipts()
    }
}

/// A flow source of the agent, as the `source` label and `/readyz` (`source/<name>`) name it (the
/// controller has `goldmane`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SourceName {
    hubble,
    ztunnel,
}

impl SourceName {
    /// The name, as the label writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceName::hubble => "hubble",
            SourceName::ztunnel => "ztunnel",
        }
    }
}

/// The label of every per-source metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: SourceName,
}

/// Per-source health, as Prometheus metrics labelled `source`.
#[derive(Clone, Debug, Default)]
pub struct SourceMetrics {
    connected: Family<SourceLabel, Gauge>,
    messages: Family<SourceLabel, Counter>,
    errors: Family<SourceLabel, Counter>,
    last_message: Family<SourceLabel, Gauge<f64, AtomicU64>>,
    records: Family<SourceLabel, Counter>,
    skipped: Family<SourceLabel, Counter>,
    lost_events: Family<SourceLabel, Counter>,
}

impl SourceMetrics {
    /// Registers the families in `registry` (under its prefix, e.g. `network_enforcer_agent_source_*`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "source_connected",
            "1 while the flow source is connected (Hubble) or its files are being read (ztunnel)",
            self.connected.clone(),
        );
        registry.register(
            "source_messages",
            "Messages (flows, log lines) read from the flow source",
            self.messages.clone(),
        );
        registry.register(
            "source_errors",
            "Connection failures, stream errors and malformed messages of the flow source",
            self.errors.clone(),
        );
        registry.register(
            "source_last_message_timestamp_seconds",
            "Unix time of the last message read from the flow source",
            self.last_message.clone(),
        );
        registry.register(
            "source_records",
            "Flow records the source produced for the uplink",
            self.records.clone(),
        );
        registry.register(
            "source_skipped",
            "Messages that produced no record (replies, other nodes, other drop reasons, allowed outcomes)",
            self.skipped.clone(),
        );
        registry.register(
            "source_lost_events",
            "Events the peer reported lost before they reached us (Hubble lost_events)",
            self.lost_events.clone(),
        );
    }

    /// The handle of one source.
    pub fn source(&self, source: SourceName) -> SourceHealth {
        let label = SourceLabel { source };
        SourceHealth {
            connected: self.connected.get_or_create(&label).clone(),
            messages: self.messages.get_or_create(&label).clone(),
            errors: self.errors.get_or_create(&label).clone(),
            last_message: self.last_message.get_or_create(&label).clone(),
            records: self.records.get_or_create(&label).clone(),
            skipped: self.skipped.get_or_create(&label).clone(),
            lost_events: self.lost_events.get_or_create(&label).clone(),
        }
    }
}

/// One source's metrics. Cheap to clone (shared atomics).
#[derive(Clone, Debug, Default)]
pub struct SourceHealth {
    /// 1 while connected.
    pub connected: Gauge,
    /// Messages read.
    pub messages: Counter,
    /// Errors of any kind.
    pub errors: Counter,
    /// Unix seconds of the last message.
    pub last_message: Gauge<f64, AtomicU64>,
    /// Records produced.
    pub records: Counter,
    /// Messages that produced no record.
    pub skipped: Counter,
    /// Events the peer lost.
    pub lost_events: Counter,
}

impl SourceHealth {
    /// Counts one message read now.
    pub fn message(&self) {
        self.messages.inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_message.set(now);
    }
}

/// Parses an RFC 3339 time (`2026-08-21T10:15:30.123456Z`, or with an offset such as `+02:00`) into
/// milliseconds since the Unix epoch. `None` for anything else, whatever bytes it holds.
pub fn rfc3339_ms(s: &str) -> Option<i64> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// Milliseconds since the Unix epoch now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Logs at most once per `every` (per limiter), counting what it held back in between, so a source that
/// sends garbage in a loop cannot flood the agent's log.
#[derive(Debug)]
pub struct RateLimitedLog {
    every: std::time::Duration,
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    /// At most one line per `every`.
    pub fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// Returns `Some(suppressed since the last line)` when a line may be written now.
    pub fn allow(&mut self) -> Option<u64> {
        let now = std::time::Instant::now();
        match self.last {
            Some(last) if now.duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::uplink::{Outcome, Source};

    fn record(port: u32, first: i64, last: i64, count: u64) -> FlowRecord {
        FlowRecord {
            local: Some(LocalPod {
                namespace: "shop".into(),
                name: "web-1".into(),
                uid: String::new(),
            }),
            peer_ip: vec![10, 0, 0, 2],
            port,
            outcome: Outcome::Established as i32,
            source: Source::Hubble as i32,
            first_seen_ms: first,
            last_seen_ms: last,
            count,
            ..FlowRecord::default()
        }
    }

    #[test]
    fn same_records_fold_and_different_ones_stay_apart() {
        let mut agg = RecordAggregator::new(10);
        agg.add(record(80, 5, 6, 1));
        agg.add(record(80, 2, 3, 0));
        agg.add(record(443, 9, 9, 2));
        let mut denied = record(80, 1, 1, 1);
        denied.outcome = Outcome::Denied as i32;
        denied.policy = "shop/deny".into();
        agg.add(denied);
        let out = agg.drain();
        assert_eq!(out.len(), 3);
        let folded = out
            .iter()
            .find(|r| r.port == 80 && r.policy.is_empty())
            .unwrap();
        assert_eq!(
            (folded.first_seen_ms, folded.last_seen_ms, folded.count),
            (2, 6, 2)
        );
        assert!(agg.is_empty());
    }

    #[test]
    fn a_full_aggregator_drops_new_keys_but_still_folds_known_ones() {
        let mut agg = RecordAggregator::new(1);
        assert!(agg.add(record(80, 1, 1, 1)));
        assert!(!agg.add(record(81, 1, 1, 1)));
        assert!(agg.add(record(80, 2, 2, 1)));
        assert_eq!(agg.dropped(), 1);
        assert_eq!(agg.drain()[0].count, 2);
    }

    #[test]
    fn receipts_are_drained_with_the_records_added_before_them() {
        let sink = RecordSink::new(10);
        let (receipt, watch) = crate::uplink::receipt();
        sink.add_with_receipt(
            vec![record(80, 1, 1, 1), record(81, 1, 1, 1)],
            Some(receipt),
        );
        let (records, receipts) = sink.drain_with_receipts();
        assert_eq!((records.len(), receipts.len()), (2, 1));
        assert!(
            !watch.settled(),
            "settled only by whoever ships the records"
        );
        receipts.into_iter().for_each(Receipt::settle);
        assert!(watch.settled());

        // Records dropped for lack of room still let their receipt through: they are counted as lost.
        let sink = RecordSink::new(1);
        let (receipt, _watch) = crate::uplink::receipt();
        sink.add_with_receipt(
            vec![record(80, 1, 1, 1), record(81, 1, 1, 1)],
            Some(receipt),
        );
        let (records, receipts) = sink.drain_with_receipts();
        assert_eq!((records.len(), receipts.len()), (1, 1));
        assert!(sink.drain_with_receipts().1.is_empty());
    }

    #[test]
    fn rfc3339_times_parse_to_epoch_milliseconds() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_ms("2026-08-21T10:15:30.123456Z"),
            Some(1_787_307_330_123)
        );
        assert_eq!(
            rfc3339_ms("2026-08-21T12:15:30.5+02:00"),
            Some(1_787_307_330_500)
        );
        assert_eq!(rfc3339_ms("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-08-21T10:15:30",
            // Non-ASCII bytes where the parser expects digits or an offset: refused, never a panic
            // (slicing such a line by byte offsets killed the ztunnel source, again at each restart).
            "2026-08-21T10:15:3é",
            "2026-08-21T10:15:30.1éZ",
            "2026-08-21T10:15:30+0é:00",
            "2026-08-21T10:15:30\u{1F600}Z",
            "2026-08-21T10:15:30.123456+99:99",
            "2026-08-21T10:15:30é:000",
        ] {
            assert_eq!(rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn metrics_are_labelled_by_source() {
        let metrics = SourceMetrics::default();
        let mut registry = Registry::with_prefix("t");
        metrics.register(&mut registry);
        let h = metrics.source(SourceName::hubble);
        h.message();
        h.connected.set(1);
        h.lost_events.inc_by(7);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "t_source_messages_total{source=\"hubble\"} 1",
            "t_source_connected{source=\"hubble\"} 1",
            "t_source_lost_events_total{source=\"hubble\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }

    #[test]
    fn source_labels_are_written_as_before() {
        let metrics = SourceMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.source(SourceName::hubble).records.inc_by(2);
        metrics.source(SourceName::ztunnel).errors.inc();
        let text = network_enforcer_api::metrics::render(&registry);
        for line in [
            "source_records_total{source=\"hubble\"} 2",
            "source_errors_total{source=\"ztunnel\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        // `/readyz` names a source as its label does.
        for source in [SourceName::hubble, SourceName::ztunnel] {
            assert!(
                text.contains(&format!("{{source=\"{}\"}}", source.as_str())),
                "{source:?} in {text}"
            );
        }
    }
}
