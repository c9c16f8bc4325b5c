//! `network-enforcer-agent run`: the agent as one value the binary starts. It loads the kernel
//! programs, starts the pod watch, the debug socket, the metrics endpoint, the flow sources, the
//! uplink and the enforcement, then runs the loop of [`run`]: read events → [`Pipeline`](crate::pipeline::Pipeline) → flush
//! into uplink records, until SIGINT/SIGTERM (one last flush, then the uplink gets 5 s to deliver).

mod event_loop;
mod flush;
mod start;
mod stop;

use crate::debug::socket;
use crate::enforce::nft;
use crate::identity::attribution::Attributor;
use crate::identity::pod_watch::SharedAttributor;
use crate::kernel::existing;
use crate::metrics::AgentMetrics;
use crate::pipeline::EdgeCaps;
use crate::sources::{RecordSink, SourcesStop};
use crate::uplink::{self, UplinkConfig, UplinkSender};
use crate::{LoadOptions, TcpHook};
use anyhow::{Context, Result};
use clap::ValueEnum;
use event_loop::EventLoop;
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
    /// The TCP program's hook: `typed` (the BTF-enabled tracepoint, about 40 % less kernel time; falls
    /// back to `raw` where the kernel refuses it) or `raw` (the raw tracepoint).
    #[arg(long, value_enum, default_value_t = TcpHook::Typed, env = "NE_TCP_HOOK")]
    tcp_hook: TcpHook,
}

impl KernelArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            ring_buffer_bytes: self.ring_buffer_bytes,
            dedupe_window: Duration::from_secs(self.dedupe_seconds),
            cgroup: None,
            dns: !self.no_dns_names,
            flow_map_entries: self.flow_map_entries,
            // Nothing the agent prints shows them; `run` turns them on while a debug client asks.
            connection_pids: false,
            tcp_hook: self.tcp_hook,
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
    /// An eBPF edge sent before goes up again about once per this many seconds, with what was seen
    /// of it since, and at once when the controller would count a violation occurrence (0: every
    /// flush; at most 30: what the controller knows of a steady edge is at most that old).
    #[arg(long, default_value_t = 30, env = "NE_REFRESH_SECONDS",
          value_parser = clap::value_parser!(u64).range(0..=30))]
    refresh_seconds: u64,
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
    let outputs = Outputs::start(&args, uplink_config, enforcement.is_some(), &metrics)?;
    let attributor: SharedAttributor = Arc::new(Mutex::new(Attributor::default()));
    let pod_watch = start_pod_watch(args.node_name.as_deref(), &attributor, &metrics).await;
    let peers = start_peer_names(args.node_name.as_deref()).await;
    let enforcement_client = match enforcement {
        Some(config) => {
            let records = outputs.source_records.clone().unwrap_or_default();
            Some(start_enforcement(config, &metrics, records).await?)
        }
        None => {
            clear_leftover_table(&args.enforcement.enforcement_table);
            None
        }
    };
    let mut event_loop = EventLoop::start(&args, attributor, peers, &metrics)?;
    for (address, listener) in listeners {
        tracing::info!(%address, "metrics on /metrics, probes on /healthz and /readyz");
        tokio::spawn(metrics.clone().serve(listener));
    }
    event_loop
        .run(
            outputs.uplink.as_ref().map(|(sender, _)| sender),
            outputs.source_records.as_ref(),
            shutdown_signal(),
        )
        .await?;
    let Outputs {
        uplink,
        sources_stop,
        ..
    } = outputs;
    stop::stop(pod_watch, enforcement_client, uplink, sources_stop).await;
    tracing::info!(counters = ?event_loop.data_plane().counters()?, "stopped");
    // Dropping the loop detaches the programs and removes the debug socket: after the stop.
    drop(event_loop);
    Ok(())
}

/// Where the agent's records go: the uplink to the controller, and the sink the flow sources (and
/// the enforcement's deny evidence) fill for each flush.
struct Outputs {
    uplink: Option<(UplinkSender, tokio::task::JoinHandle<()>)>,
    source_records: Option<RecordSink>,
    sources_stop: SourcesStop,
}

impl Outputs {
    fn start(
        args: &RunArgs,
        uplink_config: Option<UplinkConfig>,
        enforcing: bool,
        metrics: &AgentMetrics,
    ) -> Result<Self> {
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
        if enforcing && source_records.is_none() {
            // Deny evidence joins each flush like a flow source's records.
            source_records = Some(Default::default());
        }
        if args.sources.hubble_socket.is_some() || args.sources.hubble_relay_address.is_some() {
            metrics.source_enabled(crate::sources::SourceName::hubble);
        }
        if args.sources.ztunnel_log_glob.is_some() {
            metrics.source_enabled(crate::sources::SourceName::ztunnel);
        }
        Ok(Self {
            uplink,
            source_records,
            sources_stop,
        })
    }
}
