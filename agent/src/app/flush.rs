//! After each flush of the agent's loop: its figures on `/metrics` and in the log, and its records
//! handed to the uplink.

use crate::clock::WallClock;
use crate::debug::socket::DebugServer;
use crate::kernel::dns_messages::DnsReader;
use crate::metrics::AgentMetrics;
use crate::pipeline::{EdgeCaps, Flushed, Pipeline};
use crate::sources::RecordSink;
use crate::uplink::UplinkSender;
use crate::{DataPlane, EventReader, KernelCounters};
use anyhow::Result;
use network_enforcer_api::uplink::AgentHealth;
use std::sync::Arc;

/// How often the fill of the programs' LRU maps is sampled: walking a full map costs a syscall per
/// entry (tens of milliseconds), and maps fill over minutes, not seconds.
const MAP_FILL_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The counters as the last flush read them: each flush reports what changed since.
pub struct Report {
    metrics: AgentMetrics,
    /// When the maps' fill was last sampled.
    maps_sampled: Option<std::time::Instant>,
    kernel_before: KernelCounters,
    decode_errors_before: u64,
    dns_decode_errors_before: u64,
    /// What the data path lost since the agent started, for the controller.
    health: AgentHealth,
    /// The debug API, for its buffer's figures.
    debug: Option<Arc<DebugServer>>,
}

impl Report {
    pub fn new(metrics: AgentMetrics) -> Self {
        Self {
            metrics,
            maps_sampled: None,
            kernel_before: KernelCounters::default(),
            decode_errors_before: 0,
            dns_decode_errors_before: 0,
            health: AgentHealth::default(),
            debug: None,
        }
    }

    /// Reports the debug API's buffer too.
    pub fn with_debug(mut self, debug: Arc<DebugServer>) -> Self {
        self.debug = Some(debug);
        self
    }

    /// What the data path lost since the agent started (the uplink adds its own dropped batches).
    pub fn health(&self) -> AgentHealth {
        self.health
    }

    /// Reports `flushed` with the kernel's and the readers' counters, taking in the DNS messages of
    /// quiet pods first.
    pub fn flushed(
        &mut self,
        flushed: &Flushed,
        data_plane: &DataPlane,
        dns: &mut Option<DnsReader>,
        reader: &EventReader,
        pipeline: &mut Pipeline,
        caps: EdgeCaps,
    ) -> Result<()> {
        let counters = data_plane.counters()?;
        self.metrics.kernel(&self.kernel_before, &counters);
        self.health.events_lost = counters.ring_buffer_full;
        self.health.dns_lost = counters.dns_ring_buffer_full;
        self.cost(&counters);
        self.fill(data_plane, &counters);
        self.health.events_dropped = self
            .health
            .events_dropped
            .saturating_add(flushed.dropped.total());
        if let Some(dns) = dns {
            // Quiet pods' messages (no connection event read since) still count and expire.
            dns.drain(|message| pipeline.take_dns(message));
            self.metrics
                .decode_errors(dns.decode_errors() - self.dns_decode_errors_before);
            self.dns_decode_errors_before = dns.decode_errors();
        }
        if let Some((tracker, stats)) = pipeline.dns_counters() {
            let dropped = pipeline.new_resolutions().1;
            self.metrics
                .dns(&tracker, pipeline.dns_names(), &stats, dropped, &counters);
        }
        self.metrics
            .decode_errors(reader.decode_errors() - self.decode_errors_before);
        self.decode_errors_before = reader.decode_errors();
        self.metrics
            .flushed(flushed.edges.len(), flushed.unattributed);
        self.metrics.events_dropped(&flushed.dropped);
        let (recent, evicted) = self
            .debug
            .as_deref()
            .map(DebugServer::recent_edges)
            .unwrap_or_default();
        tracing::info!(
            edges = flushed.edges.len(),
            unattributed = flushed.unattributed,
            dropped_pod_cap = flushed.dropped.pod_cap,
            dropped_node_cap = flushed.dropped.node_cap,
            lost = counters.ring_buffer_full,
            dedupe_hits = counters.dedupe_hits,
            decode_errors = reader.decode_errors(),
            recent_edges = recent,
            recent_edges_evicted = evicted,
            "flush"
        );
        self.kernel_before = counters;
        if flushed.dropped.total() > 0 {
            tracing::warn!(
                dropped_pod_cap = flushed.dropped.pod_cap,
                dropped_node_cap = flushed.dropped.node_cap,
                max_edges_per_pod = caps.per_pod,
                max_edges = caps.per_node,
                "events of new edges dropped: a pod reported more distinct edges than --max-edges-per-pod, or the node more than --max-edges, within --flush-seconds"
            );
        }
        Ok(())
    }
}

impl Report {
    /// How full the ring buffer came to be since the last flush, and (now and then) the maps. Not
    /// reading them is reported, not fatal: the data path works on.
    fn fill(&mut self, data_plane: &DataPlane, counters: &KernelCounters) {
        match data_plane.take_ring_buffer_peak() {
            Ok(peak) => self
                .metrics
                .ring_buffer(peak, data_plane.ring_buffer_bytes()),
            Err(error) => tracing::warn!(%error, "could not read the ring buffer's fill"),
        }
        if self
            .maps_sampled
            .is_some_and(|at| at.elapsed() < MAP_FILL_EVERY)
        {
            return;
        }
        self.maps_sampled = Some(std::time::Instant::now());
        // The walk blocks for a moment: on the agent's multi-threaded runtime, let it move other
        // tasks off this thread (a current-thread runtime, as in tests, cannot).
        let walk = || data_plane.map_fill(counters);
        let multi_threaded = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let fills = if multi_threaded {
            tokio::task::block_in_place(walk)
        } else {
            walk()
        };
        match fills {
            Ok(fills) => {
                for full in fills.iter().filter(|f| f.entries >= u64::from(f.capacity)) {
                    tracing::warn!(map = ?full.map, capacity = full.capacity, evicted = full.evicted(),
                        "an eBPF map is full and evicts its oldest entries: raise --flow-map-entries");
                }
                self.metrics.maps(&fills);
            }
            Err(error) => tracing::warn!(%error, "could not read the eBPF maps' fill"),
        }
    }

    /// What the agent costs its node now, for the controller's budget check (docs/behaviour.md §3.12).
    fn cost(&mut self, counters: &KernelCounters) {
        // Monotonic: only differences of this process's samples are used, and a wall clock stepped
        // back would make a short interval look like a burst of CPU.
        self.health.cost_sampled_ms =
            i64::try_from(crate::clock::monotonic_now().as_millis()).unwrap_or(i64::MAX);
        self.health.cpu_ms = crate::cost::cpu_time_ms().unwrap_or_default();
        self.health.kernel_ns = counters.programs.values().map(|p| p.run_ns).sum();
        self.health.rss_bytes = crate::cost::resident_memory_bytes()
            .and_then(|b| u64::try_from(b).ok())
            .unwrap_or_default();
    }
}

/// Hands the flush's records (and the flow sources' with their receipts) to the uplink; without
/// one, they were only logged and the receipts are settled now.
pub fn send(
    flushed: &Flushed,
    clock: &WallClock,
    uplink: Option<&UplinkSender>,
    source_records: Option<&RecordSink>,
    health: AgentHealth,
) {
    crate::debug::flows::log_edges(flushed, clock);
    let mut records = if uplink.is_some() {
        flushed.records(clock)
    } else {
        Vec::new()
    };
    let mut receipts = Vec::new();
    if let Some(sink) = source_records {
        // Hubble and ztunnel records are already named by pod: they go up as they are.
        let (from_sources, from_sources_receipts) = sink.drain_with_receipts();
        tracing::info!(records = from_sources.len(), "flow source records");
        receipts = from_sources_receipts;
        if uplink.is_some() {
            records.extend(from_sources);
        }
    }
    match uplink {
        // Never waits: a full queue drops the batch and counts it. The receipts are settled once the
        // controller acknowledged the records (then the ztunnel source saves its read positions).
        Some(sender) => {
            sender.send_with_health(records, receipts, Some(health));
        }
        // No controller to wait for: the records were only logged.
        None => receipts
            .into_iter()
            .for_each(crate::uplink::Receipt::settle),
    }
}
