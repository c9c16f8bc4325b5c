//! The agent's loop: read the kernel's events (and DNS messages, and the start-up scan's) into the
//! [`Pipeline`], flush it on every tick (sooner for a new edge), report and send what it flushed,
//! until the stop signal, which gets one last flush.

use super::RunArgs;
use super::flush::{self, Report};
use crate::clock::WallClock;
use crate::debug::socket::DebugServer;
use crate::identity::pod_identity::Scanner;
use crate::identity::pod_watch::SharedAttributor;
use crate::kernel::dns_messages::DnsReader;
use crate::kernel::existing;
use crate::metrics::AgentMetrics;
use crate::pipeline::{EdgeCaps, Pipeline};
use crate::sources::RecordSink;
use crate::uplink::UplinkSender;
use crate::{ConnectionEvent, DataPlane, EventReader, LoadOptions};
use anyhow::{Context, Result};
use network_enforcer_agent_common::Switch;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The least time between a flush and an early one for new edges.
const EARLY_FLUSH_MIN_GAP: Duration = Duration::from_millis(500);

/// What the loop does after a tick or a stop signal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Flush the aggregated edges and keep running.
    Flush,
    /// Flush the aggregated edges, then stop.
    FlushAndStop,
}

/// The capture (the kernel programs and their readers) and what the loop feeds: see the module docs.
pub struct EventLoop {
    data_plane: DataPlane,
    reader: EventReader,
    dns: Option<DnsReader>,
    /// The start-up scan of the connections already open, until it answers.
    existing_scan: Option<tokio::sync::oneshot::Receiver<Vec<ConnectionEvent>>>,
    pipeline: Pipeline,
    caps: EdgeCaps,
    report: Report,
    metrics: AgentMetrics,
    clock: WallClock,
    flush_every: Duration,
    /// How soon after a new edge it is flushed (`None`: at the next tick).
    new_edge_delay: Option<Duration>,
    /// Edges sent within the refresh interval, and what was seen of them since.
    refresh: crate::refresh::Refresher,
}

impl EventLoop {
    /// Loads the kernel programs on this node's cgroup, takes their readers, binds the debug API
    /// and starts the scan of the connections already open.
    pub fn start(
        args: &RunArgs,
        attributor: SharedAttributor,
        peers: Option<crate::debug::peers::SharedPeers>,
        metrics: &AgentMetrics,
    ) -> Result<Self> {
        // The node's cgroup: where the UDP hooks attach and which pods the scans name.
        let node_cgroups = crate::kernel::host::NodeCgroups::detect()?;
        tracing::info!(
            pods_cgroup = node_cgroups.pods.as_deref().unwrap_or("(the whole tree)"),
            "this node's pods"
        );
        let load_options = LoadOptions {
            cgroup: Some(node_cgroups.attach_dir()),
            ..args.kernel.load_options()
        };
        let mut data_plane =
            DataPlane::load(&load_options).context("starting the eBPF data plane")?;
        // Loading parsed the kernel's BTF (megabytes, all freed now): give it back before the scan
        // parses it again.
        crate::memory::release_freed();
        metrics.ebpf_attached(data_plane.tcp_hook());
        let reader = data_plane.events()?;
        let dns = data_plane.dns_messages()?;
        let scanner = Scanner::new(node_cgroups, attributor.clone());
        let mut debug = DebugServer::bind(&args.debug_socket, args.recent_edges)?;
        if let Some(peers) = peers {
            debug = debug.with_peers(peers);
        }
        let switches = data_plane.switches();
        debug = debug.on_watchers(move |watched| {
            match switches.set(Switch::ConnectionPids, watched) {
                Ok(()) => tracing::debug!(watched, "naming the processes of TCP connections"),
                Err(err) => tracing::warn!(%err, watched, "could not turn the naming of TCP connections' processes on or off"),
            }
        });
        tracing::info!(socket = %args.debug_socket.display(), "debug API listening");
        let caps = EdgeCaps {
            per_pod: args.max_edges_per_pod.max(1),
            per_node: args.max_edges.max(1),
            interval: Duration::from_secs(args.flush_seconds.max(1)),
        };
        let debug = Arc::new(debug);
        let mut pipeline = Pipeline::new(attributor, caps)
            .with_scanner(scanner)
            .with_tap(debug.clone());
        if dns.is_some() {
            pipeline = pipeline.with_dns_names(crate::dns::tracker::Limits::default());
        }
        // Connections open before the agent started. The live programs are attached already, so
        // every connection is seen by them, by this scan or by both (the same edge); it runs in the
        // background.
        let existing_scan = (args.max_existing_sockets > 0)
            .then(|| existing::spawn(args.max_existing_sockets, metrics.existing()));
        Ok(Self {
            data_plane,
            reader,
            dns,
            existing_scan,
            pipeline,
            caps,
            report: Report::new(metrics.clone()).with_debug(debug),
            metrics: metrics.clone(),
            clock: WallClock::now(),
            flush_every: Duration::from_secs(args.flush_seconds.max(1)),
            new_edge_delay: (args.new_edge_flush_ms > 0)
                .then(|| Duration::from_millis(args.new_edge_flush_ms)),
            refresh: crate::refresh::Refresher::new(
                Duration::from_secs(args.refresh_seconds),
                Duration::from_secs(args.flush_seconds.max(1)),
            ),
        })
    }

    /// Runs until `shutdown` resolves, then flushes once more (so a rollout loses nothing). The
    /// programs stay attached and the debug API open until the loop is dropped, after the stop.
    pub async fn run(
        &mut self,
        uplink: Option<&UplinkSender>,
        source_records: Option<&RecordSink>,
        shutdown: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let mut flush = tokio::time::interval(self.flush_every);
        // When an edge never flushed before is held: flush it soon rather than at the next tick.
        let mut early: Option<tokio::time::Instant> = None;
        let mut last_flush = tokio::time::Instant::now();
        tokio::pin!(shutdown);
        let mut batch = Vec::new();
        loop {
            // New edges, and new resolutions (a protect policy allowing the name waits for them).
            let news = self.pipeline.new_edges() > 0 || self.pipeline.new_resolutions().0 > 0;
            if let (None, Some(delay), true) = (early, self.new_edge_delay, news) {
                // Not more often than every EARLY_FLUSH_MIN_GAP: each flush also rescans /proc, and a
                // pod reaching many new peers must not turn that into a busy loop.
                early = Some(
                    (tokio::time::Instant::now() + delay).max(last_flush + EARLY_FLUSH_MIN_GAP),
                );
            }
            let step = tokio::select! {
                read = self.reader.read_batch(&mut batch) => {
                    read?;
                    self.take_in(&mut batch)?;
                    continue;
                }
                read = dns_readable(&mut self.dns) => {
                    read?;
                    self.take_dns();
                    continue;
                }
                events = existing_connections(&mut self.existing_scan) => {
                    self.pipeline.take_in(&events)?;
                    continue;
                }
                _ = flush.tick() => Step::Flush,
                () = sleep_until_or_never(early) => Step::Flush,
                r = &mut shutdown => {
                    r?;
                    // The pipeline still holds every edge since the last tick (up to --flush-seconds
                    // of them): flush it once more, the same way. First the events still in the ring
                    // buffer: the kernel wakes the reader per batch, and `select!` may take the
                    // signal before a wakeup that is ready too.
                    if self.reader.read_waiting(&mut batch) > 0 {
                        self.take_in(&mut batch)?;
                    }
                    Step::FlushAndStop
                }
            };
            early = None;
            last_flush = tokio::time::Instant::now();
            self.flush(uplink, source_records, step == Step::FlushAndStop)?;
            if step == Step::FlushAndStop {
                return Ok(());
            }
        }
    }

    /// The data plane (its counters, for the last log line).
    pub fn data_plane(&self) -> &DataPlane {
        &self.data_plane
    }

    /// Takes in a batch of events (the DNS messages first: an answer was copied before its pod
    /// could read it, so before any connection it led to), and empties it.
    fn take_in(&mut self, batch: &mut Vec<ConnectionEvent>) -> Result<()> {
        self.metrics.events_read(batch.len());
        self.take_dns();
        self.pipeline.take_in(batch)?;
        batch.clear();
        Ok(())
    }

    fn take_dns(&mut self) {
        if let Some(dns) = &mut self.dns {
            dns.drain(|message| self.pipeline.take_dns(message));
        }
    }

    /// Flushes the pipeline, reports it and sends its records (`last`: before the agent stops,
    /// with every record the refresh holds).
    fn flush(
        &mut self,
        uplink: Option<&UplinkSender>,
        source_records: Option<&RecordSink>,
        last: bool,
    ) -> Result<()> {
        let flushed = self.pipeline.flush()?;
        self.report.flushed(
            &flushed,
            &self.data_plane,
            &mut self.dns,
            &self.reader,
            &mut self.pipeline,
            self.caps,
        )?;
        flush::send(
            &flushed,
            &self.clock,
            uplink.map(|u| (u, &mut self.refresh, last)),
            source_records,
            self.report.health(),
        );
        self.metrics.refreshed(&self.refresh);
        Ok(())
    }
}

/// Waits for DNS messages, or forever when DNS capture is off.
async fn dns_readable(dns: &mut Option<DnsReader>) -> Result<()> {
    match dns {
        Some(dns) => Ok(dns.readable().await?),
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The start-up scan's events, once (nothing when it failed; it logged why); then never resolves.
async fn existing_connections(
    scan: &mut Option<tokio::sync::oneshot::Receiver<Vec<ConnectionEvent>>>,
) -> Vec<ConnectionEvent> {
    let Some(receiver) = scan else {
        return std::future::pending().await;
    };
    let events = receiver.await.unwrap_or_default();
    *scan = None;
    events
}
