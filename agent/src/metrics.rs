//! Prometheus metrics of the agent, served on `/metrics`: what the kernel lost or deduped, what user space
//! read, decoded, aggregated and could not attribute.

use crate::loader::KernelCounters;
use crate::pod_watch::PodWatchCounters;
use crate::uplink::UplinkCounters;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The agent's metrics. Cheap to clone (the counters are shared atomics).
#[derive(Clone)]
pub struct AgentMetrics {
    registry: Arc<Registry>,
    events: Counter,
    events_lost: Counter,
    dedupe_hits: Counter,
    decode_errors: Counter,
    edges: Counter,
    unattributed_edges: Counter,
    uplink: UplinkCounters,
    sources: crate::sources::SourceMetrics,
    pod_watch: PodWatchCounters,
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
        let sources = crate::sources::SourceMetrics::default();
        sources.register(&mut registry);
        Self {
            registry: Arc::new(registry),
            sources,
            pod_watch,
            events,
            events_lost,
            dedupe_hits,
            decode_errors,
            edges,
            unattributed_edges,
            uplink,
        }
    }

    /// The uplink's counters, registered here; hand them to [`crate::uplink::spawn`].
    pub fn uplink(&self) -> UplinkCounters {
        self.uplink.clone()
    }

    /// The pod watch's counters, registered here; hand them to [`crate::pod_watch::spawn`].
    pub fn pod_watch(&self) -> PodWatchCounters {
        self.pod_watch.clone()
    }

    /// The flow sources' metrics (Hubble, ztunnel), registered here.
    pub fn sources(&self) -> crate::sources::SourceMetrics {
        self.sources.clone()
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
    }

    /// Counts newly seen decode errors.
    pub fn decode_errors(&self, n: u64) {
        self.decode_errors.inc_by(n);
    }

    /// Counts a flush.
    pub fn flushed(&self, edges: usize, unattributed: usize) {
        self.edges.inc_by(edges as u64);
        self.unattributed_edges.inc_by(unattributed as u64);
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Serves `GET /metrics` on `listener` until the process ends.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = self.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                }
            }),
        );
        axum::serve(listener, app).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_counters_are_added_as_deltas() {
        let m = AgentMetrics::new();
        let zero = KernelCounters::default();
        let first = KernelCounters {
            ring_buffer_full: 5,
            dedupe_hits: 10,
            unknown_family: 0,
        };
        let second = KernelCounters {
            ring_buffer_full: 7,
            dedupe_hits: 30,
            unknown_family: 0,
        };
        m.kernel(&zero, &first);
        m.kernel(&first, &second);
        m.events_read(3);
        m.flushed(4, 1);
        // The uplink task gets clones of the registered counters.
        let uplink = m.uplink();
        uplink.batches_acked.inc_by(2);
        uplink.pending_batches.set(3);
        let text = m.encode();
        for line in [
            "network_enforcer_agent_events_lost_total 7",
            "network_enforcer_agent_dedupe_hits_total 30",
            "network_enforcer_agent_events_total 3",
            "network_enforcer_agent_edges_total 4",
            "network_enforcer_agent_unattributed_edges_total 1",
            "network_enforcer_agent_decode_errors_total 0",
            "network_enforcer_agent_uplink_batches_acked_total 2",
            "network_enforcer_agent_uplink_batches_dropped_total 0",
            "network_enforcer_agent_uplink_pending_batches 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }
}
