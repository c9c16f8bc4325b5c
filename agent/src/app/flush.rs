//! After each flush of the agent's loop: its figures on `/metrics` and in the log, and its records
//! handed to the uplink.

use crate::clock::WallClock;
use crate::debug::socket::DebugServer;
use crate::kernel::dns_messages::DnsReader;
use crate::kernel::loader::MapFill;
use crate::metrics::AgentMetrics;
use crate::pipeline::{EdgeCaps, Flushed, Pipeline};
use crate::refresh::Refresher;
use crate::sources::RecordSink;
use crate::uplink::UplinkSender;
use crate::{DataPlane, EventReader, KernelCounters};
use anyhow::Result;
use network_enforcer_api::uplink::AgentHealth;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the fill of the programs' LRU maps is sampled: walking a full map costs a system call
/// per entry (about 170 ms for two full maps), and maps fill over minutes, not seconds.
const MAP_FILL_EVERY: Duration = Duration::from_secs(60);

/// The ring buffer's fullest is reported over this long, so that a scrape every 30 s sees the peak
/// of every flush between.
const PEAK_WINDOW: Duration = Duration::from_secs(60);

/// A walk of the maps: its result once done, and when it was taken.
type Walked = Arc<Mutex<Option<(Instant, crate::Result<Vec<MapFill>>)>>>;

/// The counters as the last flush read them: each flush reports what changed since.
pub struct Report {
    metrics: AgentMetrics,
    /// Each flush's ring buffer peak over the last [`PEAK_WINDOW`].
    peaks: VecDeque<(Instant, u64)>,
    /// When the last walk of the maps started, its task, its result, and the sample before.
    walk_started: Option<Instant>,
    walking: Option<tokio::task::JoinHandle<()>>,
    walked: Walked,
    last_fill: Option<(Instant, Vec<MapFill>)>,
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
            peaks: VecDeque::new(),
            walk_started: None,
            walking: None,
            walked: Walked::default(),
            last_fill: None,
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
        self.fill(data_plane);
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
    /// How full the ring buffer came to be, and (once a minute, walked on a blocking thread so that
    /// the loop goes on reading events) the maps. Not reading them is reported, not fatal: the data
    /// path works on.
    fn fill(&mut self, data_plane: &DataPlane) {
        let now = Instant::now();
        match data_plane.take_ring_buffer_peak() {
            Ok(peak) => self.peaks.push_back((now, peak)),
            Err(error) => tracing::warn!(%error, "could not read the ring buffer's fill"),
        }
        while self
            .peaks
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > PEAK_WINDOW)
        {
            self.peaks.pop_front();
        }
        let peak = self.peaks.iter().map(|(_, p)| *p).max().unwrap_or(0);
        self.metrics
            .ring_buffer(peak, data_plane.ring_buffer_bytes());

        let walked = self.walked.lock().unwrap_or_else(|e| e.into_inner()).take();
        match walked {
            Some((at, Ok(fills))) => {
                if let Some((before, previous)) = &self.last_fill {
                    let elapsed = at.duration_since(*before);
                    for (fill, previous) in fills.iter().zip(previous) {
                        let pressure = fill.pressure(previous, elapsed, data_plane.dedupe_window());
                        if let Some(why) = pressure {
                            tracing::warn!(map = ?fill.map, capacity = fill.capacity, entries = fill.entries,
                                "an eBPF map evicts what the agent still needs: {why}; raise --flow-map-entries");
                        }
                    }
                }
                self.metrics.maps(&fills);
                self.last_fill = Some((at, fills));
            }
            Some((_, Err(error))) => tracing::warn!(%error, "could not read the eBPF maps' fill"),
            None => {}
        }
        let due = self
            .walk_started
            .is_none_or(|at| at.elapsed() >= MAP_FILL_EVERY)
            && self.walking.as_ref().is_none_or(|w| w.is_finished());
        if !due {
            return;
        }
        self.walk_started = Some(now);
        let maps = data_plane.maps();
        let slot = Arc::clone(&self.walked);
        let walk = move || {
            let fills = maps.fill();
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), fills));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => self.walking = Some(runtime.spawn_blocking(walk)),
            Err(_) => walk(),
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

/// Hands the flush's records (and the flow sources' with their receipts) to the uplink, its edges'
/// through `refresh` (all it holds with `last`); without an uplink, they were only logged and the
/// receipts are settled now.
pub fn send(
    flushed: &Flushed,
    clock: &WallClock,
    uplink: Option<(&UplinkSender, &mut Refresher, bool)>,
    source_records: Option<&RecordSink>,
    health: AgentHealth,
) {
    crate::debug::flows::log_edges(flushed, clock);
    let (uplink, mut records) = match uplink {
        Some((sender, refresh, last)) => {
            let mut records = refresh.take(flushed.edge_records(clock), Instant::now());
            if last {
                records.extend(refresh.release());
            }
            records.extend(flushed.resolution_records(clock));
            (Some(sender), records)
        }
        None => (None, Vec::new()),
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
