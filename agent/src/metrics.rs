//! Prometheus metrics of the agent, served on `/metrics`: what the kernel lost or deduped, what user space
//! read, decoded, aggregated and could not attribute. The same endpoint serves the probes:
//!
//! - `GET /healthz`: liveness, 200 while the process serves HTTP (a missing controller or flow source is
//!   not cured by a restart), with the component detail below as its body.
//! - `GET /readyz`: 200 when every *required* component is ready, 503 otherwise; the body is JSON with
//!   every enabled component: `{"ready":true,"components":{"ebpf":{"ready":true,"required":true,...},
//!   "pod_watch":{...},"uplink":{"ready":false,"required":false,"connected":false,...},
//!   "source/ztunnel":{"connected":true,"messages":12,"errors":0,"last_message_time":"..."}}}`.
//!   Required: the eBPF programs attached, (when on) the enforcement table installed, and (when on) the pod watch synced, because until then the
//!   agent captures nothing or cannot name pods. The uplink and the flow sources are reported but not
//!   required: the data path keeps capturing and buffering while the controller or a CNI is away, and
//!   an agent taken out of readiness for that would only stall rollouts.

use crate::enforce::metrics::EnforcementMetrics;
use crate::identity::pod_watch::PodWatchCounters;
#[cfg(test)]
use crate::kernel::loader::ProgramCost;
use crate::kernel::loader::{FlowMap, KernelCounters, MapFill, TcpHook};
use crate::pipeline::Dropped;
use crate::uplink::UplinkCounters;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// The agent's metrics. Cheap to clone (the counters are shared atomics).
#[derive(Clone)]
pub struct AgentMetrics {
    registry: Arc<Registry>,
    events: Counter,
    events_lost: Counter,
    dedupe_hits: Counter,
    program_runs: Family<ProgramLabel, Counter>,
    program_run_seconds: Family<ProgramLabel, Counter<f64, AtomicU64>>,
    decode_errors: Counter,
    edges: Counter,
    unattributed_edges: Counter,
    events_dropped: Family<DropLabel, Counter>,
    uplink: UplinkCounters,
    sources: crate::sources::SourceMetrics,
    pod_watch: PodWatchCounters,
    enforcement: EnforcementMetrics,
    existing: crate::kernel::existing::ScanMetrics,
    dns_messages: Family<DnsLabel, Counter>,
    dns_names: Gauge,
    /// The process's resident memory, read at each scrape.
    resident_memory: Gauge,
    /// 1 once the eBPF programs are loaded and attached.
    ebpf_attached: Gauge,
    /// 1 for the hook the TCP program runs on.
    tcp_hook: Family<HookLabel, Gauge>,
    map_entries: Family<MapLabel, Gauge>,
    map_capacity: Family<MapLabel, Gauge>,
    map_evictions: Family<MapLabel, Counter>,
    ring_buffer_capacity: Gauge,
    ring_buffer_peak_fill: Gauge<f64, AtomicU64>,
    /// The refresh ([`crate::refresh`]): records held, merged, sent at once past its bound.
    refresh_held: Gauge,
    refresh_merged: Counter,
    refresh_overflowed: Counter,
    /// Which optional parts run, for `/readyz`.
    enabled: Arc<Mutex<Enabled>>,
}

/// Why events were dropped before aggregation.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DropReason {
    /// The pod had started `--max-edges-per-pod` edges since the last flush.
    pod_edge_cap,
    /// The node held `--max-edges` edges.
    node_edge_cap,
}

/// The hook the TCP program runs on (`ebpf_tcp_hook{hook}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum HookName {
    /// The BTF-enabled tracepoint, plain loads.
    tp_btf,
    /// The raw tracepoint: the fallback where the kernel refuses `tp_btf`.
    raw_tracepoint,
}

impl From<TcpHook> for HookName {
    fn from(hook: TcpHook) -> Self {
        match hook {
            TcpHook::Typed => Self::tp_btf,
            TcpHook::Raw => Self::raw_tracepoint,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabel {
    hook: HookName,
}

/// One of the agent's own eBPF programs (a fixed set of a few names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProgramLabel {
    program: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MapLabel {
    map: FlowMap,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabel {
    reason: DropReason,
}

/// What became of a pod's DNS message (`dns_messages_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DnsOutcome {
    /// A query tracked until its answer.
    query,
    /// An answer believed: it matched a query of the pod.
    answer,
    /// Not a DNS message, or outside the bounds (records, CNAME chain, name length).
    malformed,
    /// An answer no pending query of the pod matches (spoofed, late, or never asked).
    unsolicited,
    /// A query not tracked: the pod's or the node's pending queries were at their bound.
    pending_full,
    /// An answer's addresses not kept: the pod's or the node's names were at their bound.
    names_full,
    /// A message of a socket that is no known pod's.
    unattributed,
    /// A message longer than the kernel copies.
    truncated,
    /// A message the kernel could not copy: the DNS ring buffer was full.
    ring_buffer_full,
    /// A believed answer's address not told to the controller: more new ones than a flush carries.
    resolution_dropped,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DnsLabel {
    outcome: DnsOutcome,
}

/// The parts of the agent that are switched on (the eBPF data path always is).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Enabled {
    pod_watch: bool,
    enforcement: bool,
    uplink: bool,
    sources: Vec<crate::sources::SourceName>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    /// Registers every metric under the `network_enforcer_agent` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("network_enforcer_agent");
        let mut counter = |name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let events = counter("events", "Connection events read from the kernel");
        let events_lost = counter(
            "events_lost",
            "Events the kernel dropped because the ring buffer was full",
        );
        let dedupe_hits = counter(
            "dedupe_hits",
            "Occurrences the kernel folded into an earlier event of the same edge",
        );
        let decode_errors = counter("decode_errors", "Kernel records that could not be decoded");
        let edges = counter("edges", "Aggregated edges flushed");
        let unattributed_edges = counter(
            "unattributed_edges",
            "Flushed edges whose network namespace belongs to no known pod",
        );
        let program_runs = Family::<ProgramLabel, Counter>::default();
        registry.register(
            "ebpf_program_runs",
            "Runs of each of the agent's eBPF programs (counted only while sysctl kernel.bpf_stats_enabled is 1)",
            program_runs.clone(),
        );
        let program_run_seconds = Family::<ProgramLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "ebpf_program_run_seconds",
            "Time the kernel spent in each of the agent's eBPF programs (counted only while sysctl kernel.bpf_stats_enabled is 1)",
            program_run_seconds.clone(),
        );
        let events_dropped = Family::<DropLabel, Counter>::default();
        registry.register(
            "events_dropped",
            "Events of new edges dropped because a pod or the node held its cap of edges since the last flush",
            events_dropped.clone(),
        );
        let uplink = UplinkCounters::default();
        let mut register = |name: &str, help: &str, metric: Counter| {
            registry.register(name, help, metric);
        };
        register(
            "uplink_batches_sent",
            "Batches written to the controller stream, resends included",
            uplink.batches_sent.clone(),
        );
        register(
            "uplink_batches_acked",
            "Batches the controller acknowledged",
            uplink.batches_acked.clone(),
        );
        register(
            "uplink_batches_dropped",
            "Batches lost because the uplink queue or resend buffer was full",
            uplink.batches_dropped.clone(),
        );
        register(
            "uplink_reconnects",
            "Reconnects to the controller after an error or the end of a stream",
            uplink.reconnects.clone(),
        );
        register(
            "uplink_records_accepted",
            "Records the controller took in",
            uplink.records_accepted.clone(),
        );
        register(
            "uplink_records_rejected",
            "Records the controller refused",
            uplink.records_rejected.clone(),
        );
        registry.register(
            "uplink_pending_batches",
            "Batches waiting for the controller's acknowledgement",
            uplink.pending_batches.clone(),
        );
        let pod_watch = PodWatchCounters::default();
        registry.register(
            "pod_watch_errors",
            "Pod watch or list errors (each retried with backoff)",
            pod_watch.errors.clone(),
        );
        registry.register(
            "pod_watch_events",
            "Pod events applied from the watch",
            pod_watch.events.clone(),
        );
        registry.register(
            "pods",
            "Pods of this node known from the watch",
            pod_watch.pods.clone(),
        );
        registry.register(
            "pod_watch_synced",
            "1 once the first list of this node's pods is complete",
            pod_watch.synced.clone(),
        );
        registry.register(
            "uplink_connected",
            "1 while a stream to the controller is open",
            uplink.connected.clone(),
        );
        let dns_messages = Family::<DnsLabel, Counter>::default();
        registry.register(
            "dns_messages",
            "Pods' DNS messages by what became of them: query and answer were used to name outside \
             peers; malformed, unsolicited, pending_full, names_full, unattributed, truncated and \
             ring_buffer_full were not; resolution_dropped counts answers' addresses not told to the \
             controller (more new ones than one flush carries)",
            dns_messages.clone(),
        );
        let dns_names = Gauge::default();
        registry.register(
            "dns_names",
            "Addresses the node's pods resolved from a name, held until their TTL plus the grace",
            dns_names.clone(),
        );
        let resident_memory = Gauge::default();
        registry.register(
            "resident_memory_bytes",
            "The agent's resident memory (RSS), read at each scrape",
            resident_memory.clone(),
        );
        let ebpf_attached = Gauge::default();
        registry.register(
            "ebpf_attached",
            "1 once the eBPF programs are loaded and attached",
            ebpf_attached.clone(),
        );
        let tcp_hook = Family::<HookLabel, Gauge>::default();
        registry.register(
            "ebpf_tcp_hook",
            "1 for the hook the TCP program runs on: tp_btf (plain loads), or raw_tracepoint, the \
             fallback where the kernel refuses tp_btf (about 40 % more kernel time per connection)",
            tcp_hook.clone(),
        );
        let map_entries = Family::<MapLabel, Gauge>::default();
        registry.register(
            "ebpf_map_entries",
            "Entries in each of the kernel programs' LRU maps, sampled about once a minute",
            map_entries.clone(),
        );
        let map_capacity = Family::<MapLabel, Gauge>::default();
        registry.register(
            "ebpf_map_capacity",
            "Capacity of each of the kernel programs' LRU maps",
            map_capacity.clone(),
        );
        let map_evictions = Family::<MapLabel, Counter>::default();
        registry.register(
            "ebpf_map_evictions",
            "Entries the kernel evicted from each LRU map to make room (estimated: put in, neither \
             taken out nor still there). connecting: a connection lost its process; edges: an edge \
             past its dedupe window, or (when the map turns over faster) reported again early; \
             udp_peers: mostly closed sockets' entries, normal",
            map_evictions.clone(),
        );
        let ring_buffer_capacity = Gauge::default();
        registry.register(
            "ring_buffer_capacity_bytes",
            "Size of the kernel's events ring buffer",
            ring_buffer_capacity.clone(),
        );
        let ring_buffer_peak_fill = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "ring_buffer_peak_fill_ratio",
            "The fullest the events ring buffer was in the last minute (unread bytes, the event \
             being written included, over its size; at 1 events are lost)",
            ring_buffer_peak_fill.clone(),
        );
        let refresh_held = Gauge::default();
        registry.register(
            "uplink_records_held",
            "Records of edges sent within --refresh-seconds, held to go up with the edge's next \
             refresh",
            refresh_held.clone(),
        );
        let refresh_merged = Counter::default();
        registry.register(
            "uplink_records_merged",
            "Records of edges sent within --refresh-seconds merged into the edge's next refresh \
             instead of going up (a steady edge: one record per refresh, not per flush)",
            refresh_merged.clone(),
        );
        let refresh_overflowed = Counter::default();
        registry.register(
            "uplink_records_unrefreshed",
            "Records sent at once because the refresh remembered its bound of edges (100,000)",
            refresh_overflowed.clone(),
        );
        let sources = crate::sources::SourceMetrics::default();
        sources.register(&mut registry);
        let enforcement = EnforcementMetrics::default();
        enforcement.register(&mut registry);
        crate::sources::ztunnel::register_metrics(&mut registry);
        let existing = crate::kernel::existing::ScanMetrics::default();
        existing.register(&mut registry);
        Self {
            dns_messages,
            dns_names,
            resident_memory,
            ebpf_attached,
            tcp_hook,
            map_entries,
            map_capacity,
            map_evictions,
            ring_buffer_capacity,
            ring_buffer_peak_fill,
            refresh_held,
            refresh_merged,
            refresh_overflowed,
            enabled: Arc::default(),
            registry: Arc::new(registry),
            sources,
            pod_watch,
            enforcement,
            existing,
            events,
            events_lost,
            dedupe_hits,
            program_runs,
            program_run_seconds,
            decode_errors,
            edges,
            unattributed_edges,
            events_dropped,
            uplink,
        }
    }

    /// The uplink's counters, registered here; hand them to [`crate::uplink::spawn`].
    pub fn uplink(&self) -> UplinkCounters {
        self.uplink.clone()
    }

    /// The pod watch's counters, registered here; hand them to [`crate::identity::pod_watch::spawn`].
    pub fn pod_watch(&self) -> PodWatchCounters {
        self.pod_watch.clone()
    }

    /// The enforcement metrics, registered here; hand them to [`crate::enforce::watch::spawn`].
    pub fn enforcement(&self) -> EnforcementMetrics {
        self.enforcement.clone()
    }

    /// The start-up socket scan's counters, registered here; hand them to
    /// [`crate::kernel::existing::spawn`].
    pub fn existing(&self) -> crate::kernel::existing::ScanMetrics {
        self.existing.clone()
    }

    /// Records that enforcement runs: readiness then waits for its first installed table.
    pub fn enforcement_enabled(&self) {
        self.enabled.lock().expect("enabled lock").enforcement = true;
    }

    /// The flow sources' metrics (Hubble, ztunnel), registered here.
    pub fn sources(&self) -> crate::sources::SourceMetrics {
        self.sources.clone()
    }

    /// Records that the eBPF programs are attached (required for readiness), the TCP program on
    /// `tcp_hook`.
    pub fn ebpf_attached(&self, tcp_hook: TcpHook) {
        self.tcp_hook
            .get_or_create(&HookLabel {
                hook: tcp_hook.into(),
            })
            .set(1);
        self.ebpf_attached.set(1);
    }

    /// Records that the pod watch runs: readiness then waits for its first list.
    pub fn pod_watch_enabled(&self) {
        self.enabled.lock().expect("enabled lock").pod_watch = true;
    }

    /// Records that the uplink runs: `/readyz` reports its connection.
    pub fn uplink_enabled(&self) {
        self.enabled.lock().expect("enabled lock").uplink = true;
    }

    /// Records that flow source `source` runs: `/readyz` reports its health.
    pub fn source_enabled(&self, source: crate::sources::SourceName) {
        let mut enabled = self.enabled.lock().expect("enabled lock");
        if !enabled.sources.contains(&source) {
            enabled.sources.push(source);
        }
    }

    /// What `/readyz` says now.
    pub fn readiness(&self) -> Readiness {
        let enabled = self.enabled.lock().expect("enabled lock").clone();
        let mut components = BTreeMap::new();
        let attached = self.ebpf_attached.get() == 1;
        components.insert(
            "ebpf".to_string(),
            ComponentState {
                ready: attached,
                required: true,
                detail: if attached {
                    let fallback = self
                        .tcp_hook
                        .get(&HookLabel {
                            hook: HookName::raw_tracepoint,
                        })
                        .is_some_and(|g| g.get() == 1);
                    if fallback {
                        "programs attached; TCP on the raw tracepoint (the kernel refused the \
                         BTF-enabled one: see the log)"
                            .into()
                    } else {
                        "programs attached".into()
                    }
                } else {
                    "loading the eBPF programs".into()
                },
                ..ComponentState::default()
            },
        );
        if enabled.pod_watch {
            let synced = self.pod_watch.synced.get() == 1;
            components.insert(
                "pod_watch".to_string(),
                ComponentState {
                    ready: synced,
                    required: true,
                    detail: if synced {
                        format!("synced; {} pods on this node", self.pod_watch.pods.get())
                    } else {
                        format!(
                            "listing this node's pods ({} errors so far)",
                            self.pod_watch.errors.get()
                        )
                    },
                    errors: Some(self.pod_watch.errors.get()),
                    ..ComponentState::default()
                },
            );
        }
        if enabled.enforcement {
            let e = &self.enforcement;
            let in_sync = e.in_sync.get() == 1;
            components.insert(
                "enforcement".to_string(),
                ComponentState {
                    ready: in_sync,
                    required: true,
                    detail: format!(
                        "{}; {} policies, {} rulesets installed, {} install errors, {} watch errors",
                        if in_sync {
                            "the enforcement table is current"
                        } else {
                            "building or installing the enforcement table"
                        },
                        e.policies.get(),
                        e.syncs.get(),
                        e.sync_errors.get(),
                        e.watch_errors.get()
                    ),
                    errors: Some(e.sync_errors.get() + e.watch_errors.get()),
                    ..ComponentState::default()
                },
            );
        }
        if enabled.uplink {
            let u = &self.uplink;
            let connected = u.connected.get() == 1;
            components.insert(
                "uplink".to_string(),
                ComponentState {
                    ready: connected,
                    required: false,
                    detail: format!(
                        "{}; {} batches waiting for an acknowledgement, {} acknowledged, {} dropped, \
                         {} reconnects",
                        if connected {
                            "connected to the controller"
                        } else {
                            "not connected to the controller (retrying with backoff)"
                        },
                        u.pending_batches.get(),
                        u.batches_acked.get(),
                        u.batches_dropped.get(),
                        u.reconnects.get()
                    ),
                    connected: Some(connected),
                    ..ComponentState::default()
                },
            );
        }
        for &source in &enabled.sources {
            let name = source.as_str();
            let h = self.sources.source(source);
            let connected = h.connected.get() == 1;
            let last = h.last_message.get();
            components.insert(
                format!("source/{name}"),
                ComponentState {
                    ready: connected,
                    required: false,
                    detail: if connected {
                        "connected".into()
                    } else {
                        "not connected (retrying with backoff)".into()
                    },
                    connected: Some(connected),
                    messages: Some(h.messages.get()),
                    errors: Some(h.errors.get()),
                    last_message_time: (last > 0.0).then(|| rfc3339(last)),
                },
            );
        }
        Readiness {
            ready: components.values().all(|c| c.ready || !c.required),
            components,
        }
    }

    /// Counts events read from the ring buffer.
    pub fn events_read(&self, n: usize) {
        self.events.inc_by(n as u64);
    }

    /// Brings the kernel-side counters up to date: `now` and `before` are cumulative readings.
    pub fn kernel(&self, before: &KernelCounters, now: &KernelCounters) {
        self.events_lost
            .inc_by(now.ring_buffer_full.saturating_sub(before.ring_buffer_full));
        self.dedupe_hits
            .inc_by(now.dedupe_hits.saturating_sub(before.dedupe_hits));
        for (program, now) in &now.programs {
            let before = before.programs.get(program).copied().unwrap_or_default();
            let label = ProgramLabel {
                program: program.clone(),
            };
            self.program_runs
                .get_or_create(&label)
                .inc_by(now.runs.saturating_sub(before.runs));
            self.program_run_seconds
                .get_or_create(&label)
                .inc_by(now.run_ns.saturating_sub(before.run_ns) as f64 / 1e9);
        }
    }

    /// The fill of the programs' LRU maps, as sampled.
    pub fn maps(&self, fills: &[MapFill]) {
        for fill in fills {
            let label = MapLabel { map: fill.map };
            self.map_entries
                .get_or_create(&label)
                .set(i64::try_from(fill.entries).unwrap_or(i64::MAX));
            self.map_capacity
                .get_or_create(&label)
                .set(i64::from(fill.capacity));
            // The estimate may dip between samples (see `MapFill::evicted`): the counter only rises.
            let evictions = self.map_evictions.get_or_create(&label);
            evictions.inc_by(fill.evicted().saturating_sub(evictions.get()));
        }
    }

    /// The events ring buffer's fullest of late (`peak_bytes` unread of `capacity`).
    pub fn ring_buffer(&self, peak_bytes: u64, capacity: u32) {
        self.ring_buffer_capacity.set(i64::from(capacity));
        self.ring_buffer_peak_fill
            .set((peak_bytes as f64 / f64::from(capacity.max(1))).min(1.0));
    }

    /// Brings the DNS counters up to the cumulative figures of the tracker, the pipeline and the
    /// kernel.
    pub fn dns(
        &self,
        tracker: &crate::dns::tracker::Counters,
        resolved: usize,
        pipeline: &crate::pipeline::DnsStats,
        resolutions_dropped: u64,
        kernel: &KernelCounters,
    ) {
        let figures = [
            (DnsOutcome::query, tracker.queries),
            (DnsOutcome::answer, tracker.answers),
            (DnsOutcome::malformed, tracker.malformed),
            (DnsOutcome::unsolicited, tracker.unsolicited),
            (DnsOutcome::pending_full, tracker.pending_full),
            (DnsOutcome::names_full, tracker.names_full),
            (DnsOutcome::unattributed, pipeline.unattributed),
            (DnsOutcome::truncated, pipeline.truncated),
            (DnsOutcome::ring_buffer_full, kernel.dns_ring_buffer_full),
            (DnsOutcome::resolution_dropped, resolutions_dropped),
        ];
        for (outcome, total) in figures {
            let counter = self.dns_messages.get_or_create(&DnsLabel { outcome });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.dns_names
            .set(i64::try_from(resolved).unwrap_or(i64::MAX));
    }

    /// Counts newly seen decode errors.
    pub fn decode_errors(&self, n: u64) {
        self.decode_errors.inc_by(n);
    }

    /// Brings the refresh's figures up to date.
    pub fn refreshed(&self, refresh: &crate::refresh::Refresher) {
        self.refresh_held.set(refresh.held() as i64);
        self.refresh_merged
            .inc_by(refresh.held_total.saturating_sub(self.refresh_merged.get()));
        self.refresh_overflowed.inc_by(
            refresh
                .overflowed
                .saturating_sub(self.refresh_overflowed.get()),
        );
    }

    /// Counts a flush.
    pub fn flushed(&self, edges: usize, unattributed: usize) {
        self.edges.inc_by(edges as u64);
        self.unattributed_edges.inc_by(unattributed as u64);
    }

    /// Counts events the pipeline's edge caps dropped in one flush interval.
    pub fn events_dropped(&self, dropped: &Dropped) {
        for (reason, n) in [
            (DropReason::pod_edge_cap, dropped.pod_cap),
            (DropReason::node_edge_cap, dropped.node_cap),
        ] {
            self.events_dropped
                .get_or_create(&DropLabel { reason })
                .inc_by(n);
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        if let Some(bytes) = crate::cost::resident_memory_bytes() {
            self.resident_memory.set(bytes);
        }
        network_enforcer_api::metrics::render(&self.registry)
    }

    /// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }

    /// The HTTP routes (see the module docs).
    pub fn router(self) -> axum::Router {
        use axum::http::{StatusCode, header};
        let json = |status: StatusCode, readiness: &Readiness| {
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string(readiness).unwrap_or_default(),
            )
        };
        let (metrics, health, ready) = (self.clone(), self.clone(), self);
        axum::Router::new()
            .route(
                "/metrics",
                network_enforcer_api::metrics::route(move || metrics.encode()),
            )
            .route(
                "/healthz",
                axum::routing::get(move || {
                    let readiness = health.readiness();
                    async move { json(StatusCode::OK, &readiness) }
                }),
            )
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let readiness = ready.readiness();
                    let status = if readiness.ready {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    async move { json(status, &readiness) }
                }),
            )
    }
}

/// One component in the `/readyz` body.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ComponentState {
    pub ready: bool,
    /// Required components decide readiness; the others are only reported.
    pub required: bool,
    /// Why it is (not) ready, for people.
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
    /// Messages read (flow sources).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<u64>,
    /// RFC 3339 UTC time of the last message (flow sources that have read one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_message_time: Option<String>,
}

/// The `/readyz` (and `/healthz`) body.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub components: BTreeMap<String, ComponentState>,
}

/// Unix seconds as an RFC 3339 UTC time with milliseconds (`2026-08-21T10:15:30.123Z`).
fn rfc3339(unix_seconds: f64) -> String {
    // Rounded to the millisecond: 1_787_307_330.123 is 1_787_307_330.12299… as a float.
    let ms = (unix_seconds * 1000.0).round().max(0.0) as u64;
    crate::debug::flows::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn get(m: &AgentMetrics, path: &str) -> (u16, serde_json::Value) {
        let response = m
            .clone()
            .router()
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn readyz_waits_for_the_required_parts_and_reports_the_others() {
        let m = AgentMetrics::new();
        m.pod_watch_enabled();
        m.uplink_enabled();
        m.source_enabled(crate::sources::SourceName::ztunnel);
        m.source_enabled(crate::sources::SourceName::ztunnel);
        let (status, body) = get(&m, "/readyz").await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["ready"], false);
        assert_eq!(body["components"]["ebpf"]["ready"], false);
        assert_eq!(body["components"]["pod_watch"]["required"], true);
        assert_eq!(
            body["components"].as_object().unwrap().len(),
            4,
            "ebpf, pod_watch, uplink, one ztunnel: {body}"
        );
        // Liveness does not depend on it.
        assert_eq!(get(&m, "/healthz").await.0, 200);

        m.ebpf_attached(TcpHook::Typed);
        assert_eq!(
            get(&m, "/readyz").await.0,
            503,
            "the pod watch has not listed yet"
        );
        m.pod_watch().synced.set(1);
        m.pod_watch().pods.set(3);
        let (status, body) = get(&m, "/readyz").await;
        assert_eq!(status, 200, "uplink and sources are not required: {body}");
        assert_eq!(
            body["components"]["pod_watch"]["detail"],
            "synced; 3 pods on this node"
        );
        assert_eq!(body["components"]["uplink"]["connected"], false);

        m.uplink().connected.set(1);
        m.uplink().pending_batches.set(2);
        let source = m.sources().source(crate::sources::SourceName::ztunnel);
        source.connected.set(1);
        source.messages.inc_by(12);
        source.errors.inc();
        source.last_message.set(1_787_307_330.123);
        let (_, body) = get(&m, "/readyz").await;
        let uplink = &body["components"]["uplink"];
        assert_eq!(
            (&uplink["ready"], &uplink["connected"]),
            (&true.into(), &true.into())
        );
        assert!(
            uplink["detail"]
                .as_str()
                .unwrap()
                .contains("2 batches waiting"),
            "{uplink}"
        );
        let z = &body["components"]["source/ztunnel"];
        assert_eq!(
            (
                &z["connected"],
                &z["messages"],
                &z["errors"],
                &z["last_message_time"]
            ),
            (
                &true.into(),
                &12.into(),
                &1.into(),
                &"2026-08-21T10:15:30.123Z".into()
            ),
            "{z}"
        );
        assert_eq!(body["components"].get("source/hubble"), None, "not enabled");
    }

    /// A fallback to the raw tracepoint shows in the readiness detail and in a metric (it costs
    /// about 40 % more kernel time per connection, and nothing else would tell).
    #[test]
    fn the_tcp_hook_shows_and_a_fallback_is_named() {
        for (hook, label, fallback) in [
            (TcpHook::Typed, "tp_btf", false),
            (TcpHook::Raw, "raw_tracepoint", true),
        ] {
            let m = AgentMetrics::new();
            m.ebpf_attached(hook);
            let text = m.encode();
            assert!(
                text.contains(&format!(
                    "network_enforcer_agent_ebpf_tcp_hook{{hook=\"{label}\"}} 1"
                )),
                "{text}"
            );
            let ebpf = &m.readiness().components["ebpf"];
            assert!(ebpf.ready);
            assert_eq!(
                ebpf.detail.contains("raw tracepoint"),
                fallback,
                "{hook:?}: {}",
                ebpf.detail
            );
        }
    }

    #[test]
    fn unix_seconds_print_as_rfc3339() {
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400.5), "2000-02-29T00:00:00.500Z");
        assert_eq!(rfc3339(1_787_307_330.123), "2026-08-21T10:15:30.123Z");
        // Round trip through the sources' parser.
        assert_eq!(
            crate::sources::rfc3339_ms(&rfc3339(1_700_000_000.25)),
            Some(1_700_000_000_250)
        );
    }

    #[test]
    fn kernel_counters_are_added_as_deltas() {
        let m = AgentMetrics::new();
        let zero = KernelCounters::default();
        let cost = |runs, run_ns| ProgramCost { runs, run_ns };
        let first = KernelCounters {
            ring_buffer_full: 5,
            dedupe_hits: 10,
            programs: [
                ("inet_sock_set_state".to_string(), cost(100, 500_000_000)),
                ("udp_sendmsg4".to_string(), cost(10, 1_000_000)),
            ]
            .into(),
            ..KernelCounters::default()
        };
        let second = KernelCounters {
            ring_buffer_full: 7,
            dedupe_hits: 30,
            programs: [
                ("inet_sock_set_state".to_string(), cost(400, 2_000_000_000)),
                ("udp_sendmsg4".to_string(), cost(10, 1_000_000)),
            ]
            .into(),
            ..KernelCounters::default()
        };
        m.kernel(&zero, &first);
        m.kernel(&first, &second);
        m.events_read(3);
        m.flushed(4, 1);
        let fill = |map, entries, inserted, removed| MapFill {
            map,
            entries,
            capacity: 100,
            inserted,
            removed,
        };
        m.maps(&[
            fill(FlowMap::connecting, 10, 50, 30),
            fill(FlowMap::edges, 100, 150, 0),
        ]);
        // A later sample whose estimate dips (a walk that ended early) leaves the counter as it was.
        m.maps(&[fill(FlowMap::edges, 100, 140, 0)]);
        m.ring_buffer(1024, 4096);
        // The uplink task gets clones of the registered counters.
        let uplink = m.uplink();
        uplink.batches_acked.inc_by(2);
        uplink.pending_batches.set(3);
        let text = m.encode();
        for line in [
            "network_enforcer_agent_events_lost_total 7",
            "network_enforcer_agent_dedupe_hits_total 30",
            "network_enforcer_agent_ebpf_program_runs_total{program=\"inet_sock_set_state\"} 400",
            "network_enforcer_agent_ebpf_program_run_seconds_total{program=\"inet_sock_set_state\"} 2.0",
            "network_enforcer_agent_ebpf_program_runs_total{program=\"udp_sendmsg4\"} 10",
            "network_enforcer_agent_ebpf_program_run_seconds_total{program=\"udp_sendmsg4\"} 0.001",
            "network_enforcer_agent_events_total 3",
            "network_enforcer_agent_edges_total 4",
            "network_enforcer_agent_unattributed_edges_total 1",
            "network_enforcer_agent_decode_errors_total 0",
            "network_enforcer_agent_uplink_batches_acked_total 2",
            "network_enforcer_agent_uplink_batches_dropped_total 0",
            "network_enforcer_agent_uplink_pending_batches 3",
            "network_enforcer_agent_ebpf_map_entries{map=\"connecting\"} 10",
            "network_enforcer_agent_ebpf_map_capacity{map=\"edges\"} 100",
            "network_enforcer_agent_ebpf_map_evictions_total{map=\"connecting\"} 10",
            "network_enforcer_agent_ebpf_map_evictions_total{map=\"edges\"} 50",
            "network_enforcer_agent_ring_buffer_capacity_bytes 4096",
            "network_enforcer_agent_ring_buffer_peak_fill_ratio 0.25",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }
}
