//! `network-enforcer-agent run`: the agent as one value the binary starts. It loads the kernel
//! programs, starts the pod watch, the debug socket, the metrics endpoint, the flow sources, the
//! uplink and the enforcement, then runs the loop of [`run`]: read events → [`Pipeline`] → flush
//! into uplink records, until SIGINT/SIGTERM (one last flush, then the uplink gets 5 s to deliver).

mod flush;
mod start;
mod stop;

use crate::clock::WallClock;
use crate::debug::socket::{self, DebugServer};
use crate::enforce::nft;
use crate::identity::attribution::Attributor;
use crate::identity::pod_identity::Scanner;
use crate::identity::pod_watch::SharedAttributor;
use crate::kernel::dns_messages::DnsReader;
use crate::kernel::existing;
use crate::metrics::AgentMetrics;
use crate::pipeline::{EdgeCaps, Pipeline};
use crate::uplink::{self, UplinkConfig};
use crate::{DataPlane, LoadOptions};
use anyhow::{Context, Result};
use clap::ValueEnum;
use start::{
    bind_endpoints, clear_leftover_table, enforcement_config, start_enforcement, start_peer_names,
    start_pod_watch,
};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The nftables table of the agent's enforcement when no `--enforcement-table` is given.
pub const DEFAULT_TABLE: &str = "network_enforcer";

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EnforcementMode {
    /// The agent observes only; the CNI (if any) enforces NetworkPolicies.
    Off,
    /// The agent enforces every NetworkPolicy selecting a pod of this node.
    Networkpolicy,
}

/// NetworkPolicy enforcement settings.
#[derive(clap::Args)]
pub struct EnforcementArgs {
    /// Enforce NetworkPolicies on this node (for CNIs that do not; with one that does it is redundant
    /// but harmless). Needs --node-name and Kubernetes API access.
    #[arg(long, value_enum, default_value_t = EnforcementMode::Off, env = "NE_ENFORCEMENT")]
    enforcement: EnforcementMode,
    /// The nftables table (family inet) holding the enforcement rules.
    #[arg(long, default_value = DEFAULT_TABLE, env = "NE_ENFORCEMENT_TABLE", value_parser = nft::valid_table_name)]
    enforcement_table: String,
    /// When the rules cannot be kept current for a minute (API server unreachable, nft failing):
    /// remove them (pods are then not isolated) instead of keeping the last ones.
    #[arg(long, env = "NE_ENFORCEMENT_FAIL_OPEN")]
    enforcement_fail_open: bool,
    /// NFLOG group the enforcement table copies denied packets to; the agent reads them back and
    /// reports each denied connection attempt to the controller (0: no deny evidence). Groups are
    /// per network namespace: two agents on one node need two groups.
    #[arg(long, default_value_t = 8410, env = "NE_ENFORCEMENT_LOG_GROUP")]
    enforcement_log_group: u16,
    /// The agent's own DaemonSet as `namespace/name`: when it is gone or being deleted at SIGTERM
    /// (uninstall), the enforcement table is removed; otherwise it stays for the next agent.
    #[arg(long, env = "NE_DAEMONSET")]
    daemonset: Option<String>,
    /// NFQUEUE that holds a DNS answer to a pod whose policies allow names (`spec.egressNames`) until
    /// the addresses in it are allowed, so the first connection to a new address goes through (0: no
    /// hold; names are then enforced from the addresses the controller renders). Queues are per
    /// network namespace: two agents on one node need two queues.
    #[arg(long, default_value_t = crate::enforce::dns_hold::DEFAULT_QUEUE, env = "NE_ENFORCEMENT_DNS_HOLD_QUEUE")]
    enforcement_dns_hold_queue: u16,
    /// NFLOG group the DNS hold copies held pods' DNS queries to (they go on at once; the agent
    /// notes them so that it believes only answers to queries that were sent). Not the
    /// `--enforcement-log-group`: a group has one reader. Groups are per network namespace.
    #[arg(long, default_value_t = crate::enforce::dns_hold::DEFAULT_QUERY_GROUP, env = "NE_ENFORCEMENT_DNS_HOLD_QUERY_GROUP")]
    enforcement_dns_hold_query_group: u16,
}

/// Kernel-side settings shared by the subcommands.
#[derive(clap::Args)]
pub struct KernelArgs {
    /// Size of the kernel's events ring buffer in bytes (a power of two, a multiple of the page size).
    #[arg(long, env = "NE_RING_BUFFER_BYTES")]
    ring_buffer_bytes: Option<u32>,
    /// Capacity of each of the kernel programs' LRU maps (sockets inside connect(), the dedupe's
    /// edges, UDP peers; default 65,536). A full map evicts its oldest entry: raise it when
    /// `status` or `ebpf_map_entries` shows a map at its capacity.
    #[arg(long, env = "NE_FLOW_MAP_ENTRIES", value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    flow_map_entries: Option<u32>,
    /// The kernel reports the same edge at most once per this many seconds (0: report every event).
    #[arg(long, default_value_t = 5, env = "NE_DEDUPE_SECONDS")]
    dedupe_seconds: u64,
    /// Do not read the pods' DNS messages: outside peers are then reported by address only, never by
    /// the name a pod resolved them from.
    #[arg(long, env = "NE_NO_DNS_NAMES")]
    no_dns_names: bool,
}

impl KernelArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            ring_buffer_bytes: self.ring_buffer_bytes,
            dedupe_window: Duration::from_secs(self.dedupe_seconds),
            cgroup: None,
            dns: !self.no_dns_names,
            flow_map_entries: self.flow_map_entries,
        }
    }
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Seconds between flushes of the aggregated edges.
    #[arg(long, default_value_t = 10, env = "NE_FLUSH_SECONDS")]
    flush_seconds: u64,
    /// A connection never seen before is flushed this many milliseconds after it appears instead of
    /// at the next tick (and at least 500 ms after the previous flush), so that it is learned within a
    /// couple of seconds (0: wait for the tick).
    #[arg(long, default_value_t = 100, env = "NE_NEW_EDGE_FLUSH_MS")]
    new_edge_flush_ms: u64,
    /// Unix socket of the debug API that `flows` reads live events from.
    #[arg(long, default_value = socket::DEFAULT_SOCKET, env = "NE_DEBUG_SOCKET")]
    debug_socket: PathBuf,
    /// Edges the debug API keeps for `flows --since` (the longest ago seen are evicted first; about
    /// 200 bytes each).
    #[arg(long, default_value_t = socket::RECENT_EDGES, env = "NE_RECENT_EDGES")]
    recent_edges: usize,
    /// Records sent to the controller but not acknowledged yet that the agent keeps for resending;
    /// beyond it the oldest batches are dropped and counted
    /// (`network_enforcer_agent_uplink_batches_dropped_total`). About 250 bytes each.
    #[arg(long, default_value_t = uplink::DEFAULT_MAX_PENDING_RECORDS, env = "NE_MAX_PENDING_RECORDS")]
    max_pending_records: usize,
    /// Distinct edges one pod may report per --flush-seconds (early flushes for new edges do not renew
    /// it); events of further new edges are dropped and counted
    /// (`network_enforcer_agent_events_dropped_total{reason="pod_edge_cap"}`).
    #[arg(long, default_value_t = EdgeCaps::default().per_pod, env = "NE_MAX_EDGES_PER_POD")]
    max_edges_per_pod: usize,
    /// Distinct edges the whole node may report per --flush-seconds (`reason="node_edge_cap"` beyond).
    #[arg(long, default_value_t = EdgeCaps::default().per_node, env = "NE_MAX_EDGES")]
    max_edges: usize,
    /// Connections open before the agent started (install, upgrade, restart) are read once at start
    /// from the kernel's socket tables and reported like live ones; at most this many are kept, the
    /// rest counted (`network_enforcer_agent_existing_sockets_dropped_total`). 0: no scan.
    #[arg(long, default_value_t = existing::DEFAULT_MAX_SOCKETS, env = "NE_MAX_EXISTING_SOCKETS")]
    max_existing_sockets: usize,
    /// Addresses of this host the metrics and health endpoint (`/metrics`, `/healthz`, `/readyz`) binds,
    /// comma-separated. With the host network every interface of the node would be reachable, so the
    /// default is loopback only; the chart passes the node's IP (downward API `status.hostIP`, where the
    /// kubelet probes and Prometheus scrapes) and 127.0.0.1. `0.0.0.0` binds every interface.
    #[arg(
        long,
        env = "NE_LISTEN_ADDRESS",
        value_delimiter = ',',
        default_value = "127.0.0.1"
    )]
    listen_address: Vec<std::net::IpAddr>,
    /// Port of the metrics and health endpoint on each --listen-address.
    #[arg(long, default_value_t = 9464, env = "NE_METRICS_PORT")]
    metrics_port: u16,
    /// One full address (`ip:port`) for the metrics and health endpoint instead of --listen-address and
    /// --metrics-port.
    #[arg(long, env = "NE_METRICS_ADDRESS", conflicts_with_all = ["listen_address", "metrics_port"])]
    metrics_address: Option<std::net::SocketAddr>,
    /// The controller's ingest endpoint (`https://host:port`, or `http://` with --controller-insecure)
    /// to stream flow records to. Without it the uplink is off and flushed edges are only logged.
    #[arg(long, env = "NE_CONTROLLER_URL")]
    controller_url: Option<String>,
    /// The CA bundle (PEM) that signed the controller's ingest certificate; needed for `https://`.
    /// Read again at every connect.
    #[arg(long, env = "NE_CONTROLLER_CA_FILE")]
    controller_ca_file: Option<PathBuf>,
    /// The name the controller's certificate must carry, when it is not the URL's host.
    #[arg(long, env = "NE_CONTROLLER_SERVER_NAME")]
    controller_server_name: Option<String>,
    /// Allow a plaintext `http://` controller URL (tokens and flows travel unencrypted).
    #[arg(long, env = "NE_CONTROLLER_INSECURE")]
    controller_insecure: bool,
    /// The projected ServiceAccount token (audience `network-enforcer`) the uplink presents; read again
    /// at every connect, since the kubelet rotates it.
    #[arg(
        long,
        default_value = "/var/run/secrets/network-enforcer/token",
        env = "NE_TOKEN_FILE"
    )]
    token_file: PathBuf,
    /// This node's name (downward API `spec.nodeName`); needed with --controller-url, and turns on the
    /// pod watch (this node's pods, to name them) when a Kubernetes API configuration is found
    /// (in-cluster ServiceAccount, KUBECONFIG or ~/.kube/config). Without it pods are named by UID.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Flow sources besides eBPF (Hubble, ztunnel): their records join the eBPF ones at each flush.
    #[command(flatten)]
    sources: Box<crate::sources::SourceArgs>,
    #[command(flatten)]
    enforcement: EnforcementArgs,
}

/// What the run loop does after a tick or a stop signal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Flush the aggregated edges and keep running.
    Flush,
    /// Flush the aggregated edges, then stop.
    FlushAndStop,
}

/// The least time between a flush and an early one for new edges.
const EARLY_FLUSH_MIN_GAP: Duration = Duration::from_millis(500);

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
    scan: &mut Option<tokio::sync::oneshot::Receiver<Vec<crate::ConnectionEvent>>>,
) -> Vec<crate::ConnectionEvent> {
    let Some(receiver) = scan else {
        return std::future::pending().await;
    };
    let events = receiver.await.unwrap_or_default();
    *scan = None;
    events
}

/// Resolves on SIGINT or SIGTERM (what Kubernetes sends to stop a pod).
pub async fn shutdown_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// The uplink's settings when --controller-url is given, checked (a wrong URL, scheme or CA file
/// fails the start at once).
fn uplink_config(args: &RunArgs) -> Result<Option<UplinkConfig>> {
    Ok(match &args.controller_url {
        Some(url) => {
            let node = args
                .node_name
                .clone()
                .context("--controller-url needs the node name: --node-name or NODE_NAME")?;
            let mut config = UplinkConfig::new(url.clone(), args.token_file.clone(), node);
            config.max_pending_records = args.max_pending_records.max(1);
            if let Some(ca) = &args.controller_ca_file {
                config = config.tls(ca.clone(), args.controller_server_name.clone());
            }
            if args.controller_insecure {
                tracing::warn!(controller = %url,
                    "INSECURE: --controller-insecure allows a plaintext uplink; the token and flows travel unencrypted");
                config = config.insecure();
            }
            // A wrong URL, scheme or CA file is reported now, before anything is loaded.
            uplink::check(&config).context("checking the controller URL")?;
            Some(config)
        }
        None => None,
    })
}

pub async fn run(args: RunArgs) -> Result<()> {
    // Checked before loading anything: a wrong flag should not need root to be reported.
    let uplink_config = uplink_config(&args)?;
    let enforcement = enforcement_config(&args)?;
    // Bound before anything is loaded: an address this host does not have fails the start at once.
    let listeners = bind_endpoints(&args).await?;
    let metrics = AgentMetrics::new();
    let uplink = match uplink_config {
        Some(config) => {
            tracing::info!(controller = %config.endpoint, node = %config.node, "uplink on");
            metrics.uplink_enabled();
            Some(uplink::spawn(config, metrics.uplink()).context("starting the uplink")?)
        }
        None => {
            tracing::info!("no --controller-url: uplink off");
            None
        }
    };
    let (mut source_records, sources_stop) = args
        .sources
        .start(args.node_name.clone(), &metrics.sources());
    if enforcement.is_some() && source_records.is_none() {
        // Deny evidence joins each flush like a flow source's records.
        source_records = Some(Default::default());
    }
    if args.sources.hubble_socket.is_some() || args.sources.hubble_relay_address.is_some() {
        metrics.source_enabled(crate::sources::SourceName::hubble);
    }
    if args.sources.ztunnel_log_glob.is_some() {
        metrics.source_enabled(crate::sources::SourceName::ztunnel);
    }
    let attributor: SharedAttributor = Arc::new(Mutex::new(Attributor::default()));
    let pod_watch = start_pod_watch(args.node_name.as_deref(), &attributor, &metrics).await;
    let peers = start_peer_names(args.node_name.as_deref()).await;
    let enforcement_client = match enforcement {
        Some(config) => {
            let records = source_records.clone().unwrap_or_default();
            Some(start_enforcement(config, &metrics, records).await?)
        }
        None => {
            clear_leftover_table(&args.enforcement.enforcement_table);
            None
        }
    };
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
    let mut data_plane = DataPlane::load(&load_options).context("starting the eBPF data plane")?;
    // Loading parsed the kernel's BTF (megabytes, all freed now): give it back before the scan parses it again.
    crate::memory::release_freed();
    metrics.ebpf_attached();
    let mut reader = data_plane.events()?;
    let mut dns = data_plane.dns_messages()?;
    let scanner = Scanner::new(node_cgroups, attributor.clone());
    let mut debug = DebugServer::bind(&args.debug_socket, args.recent_edges)?;
    if let Some(peers) = peers {
        debug = debug.with_peers(peers);
    }
    tracing::info!(socket = %args.debug_socket.display(), "debug API listening");
    let caps = EdgeCaps {
        per_pod: args.max_edges_per_pod.max(1),
        per_node: args.max_edges.max(1),
        interval: Duration::from_secs(args.flush_seconds.max(1)),
    };
    let debug = Arc::new(debug);
    let mut pipeline = Pipeline::new(attributor.clone(), caps)
        .with_scanner(scanner)
        .with_tap(debug.clone());
    if dns.is_some() {
        pipeline = pipeline.with_dns_names(crate::dns::tracker::Limits::default());
    }
    // Connections open before the agent started. The live programs are attached already, so every
    // connection is seen by them, by this scan or by both (the same edge); it runs in the background.
    let mut existing_scan = (args.max_existing_sockets > 0)
        .then(|| existing::spawn(args.max_existing_sockets, metrics.existing()));
    for (address, listener) in listeners {
        tracing::info!(%address, "metrics on /metrics, probes on /healthz and /readyz");
        tokio::spawn(metrics.clone().serve(listener));
    }
    let mut report = flush::Report::new(metrics.clone()).with_debug(debug);
    let clock = WallClock::now();
    let mut flush = tokio::time::interval(Duration::from_secs(args.flush_seconds.max(1)));
    // When an edge never flushed before is held: flush it soon rather than at the next tick.
    let mut early: Option<tokio::time::Instant> = None;
    let mut last_flush = tokio::time::Instant::now();
    let new_edge_delay = Duration::from_millis(args.new_edge_flush_ms);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut batch = Vec::new();
    loop {
        // New edges, and new resolutions (a protect policy allowing the name waits for them).
        let news = pipeline.new_edges() > 0 || pipeline.new_resolutions().0 > 0;
        if early.is_none() && args.new_edge_flush_ms > 0 && news {
            // Not more often than every EARLY_FLUSH_MIN_GAP: each flush also rescans /proc, and a pod
            // reaching many new peers must not turn that into a busy loop.
            early = Some(
                (tokio::time::Instant::now() + new_edge_delay)
                    .max(last_flush + EARLY_FLUSH_MIN_GAP),
            );
        }
        let step = tokio::select! {
            read = reader.read_batch(&mut batch) => {
                read?;
                metrics.events_read(batch.len());
                // The DNS messages first: an answer was copied before its pod could read it, so
                // before any connection it led to.
                if let Some(dns) = &mut dns {
                    dns.drain(|message| pipeline.take_dns(message));
                }
                pipeline.take_in(&batch)?;
                batch.clear();
                continue;
            }
            read = dns_readable(&mut dns) => {
                read?;
                if let Some(dns) = &mut dns {
                    dns.drain(|message| pipeline.take_dns(message));
                }
                continue;
            }
            events = existing_connections(&mut existing_scan) => {
                pipeline.take_in(&events)?;
                continue;
            }
            _ = flush.tick() => Step::Flush,
            () = sleep_until_or_never(early) => Step::Flush,
            r = &mut shutdown => {
                r?;
                // The pipeline still holds every edge since the last tick (up to --flush-seconds of
                // them): flush it once more, the same way, so a rollout loses nothing. First the events
                // still in the ring buffer: the kernel wakes the reader per batch, and `select!` may
                // take the signal before a wakeup that is ready too.
                if reader.read_waiting(&mut batch) > 0 {
                    metrics.events_read(batch.len());
                    if let Some(dns) = &mut dns {
                        dns.drain(|message| pipeline.take_dns(message));
                    }
                    pipeline.take_in(&batch)?;
                    batch.clear();
                }
                Step::FlushAndStop
            }
        };
        early = None;
        last_flush = tokio::time::Instant::now();
        let flushed = pipeline.flush()?;
        report.flushed(
            &flushed,
            &data_plane,
            &mut dns,
            &reader,
            &mut pipeline,
            caps,
        )?;
        flush::send(
            &flushed,
            &clock,
            uplink.as_ref().map(|(sender, _)| sender),
            source_records.as_ref(),
            report.health(),
        );
        if step == Step::FlushAndStop {
            break;
        }
    }
    stop::stop(pod_watch, enforcement_client, uplink, sources_stop).await;
    tracing::info!(counters = ?data_plane.counters()?, "stopped");
    Ok(())
}
