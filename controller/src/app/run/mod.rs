//! `network-enforcer-controller run`: the controller as the binary starts it. [`run()`] reads the
//! command line into an [`App`](crate::app::App) (index, learning, flusher, ingest, status sync) and adds what only a
//! process in the cluster has: leader election, TLS, `/metrics` and health, the reconcilers, the flow
//! sources and the web view; then it runs until SIGTERM (the last status sync and flush included).

mod election;
mod ingest_server;
mod setup;
mod shutdown;
mod tasks;

use crate::learn::learner::{self, ExcludedWorkload};
use crate::runtime::http::Health;
use crate::runtime::metrics::ControllerMetrics;
use anyhow::{Context as _, Result};
use clap::ValueEnum;
use election::Election;
use network_enforcer_api::Backend;
use setup::Setup;
use std::time::Duration;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Log format: `json` in the cluster, `text` for people.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `network_enforcer_controller=debug`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Reconcile every object at least this often, in seconds, even without changes.
    #[arg(long, env = "RESYNC_SECONDS", default_value_t = 36_000)]
    resync_seconds: u64,
    /// This instance's name in Events (the pod name in the cluster).
    #[arg(long, env = "POD_NAME")]
    instance: Option<String>,
    /// The flow provider: `istio` learns AuthorizationPolicies; `calico`, `cilium` and `ebpf` (eBPF flows
    /// only, for any CNI that enforces NetworkPolicy) learn NetworkPolicies.
    #[arg(long, env = "CONTROLLER_PROVIDER", value_enum, default_value_t = Provider::Istio)]
    provider: Provider,
    /// Where agents stream their flow batches (gRPC).
    #[arg(long, env = "INGEST_ADDRESS", default_value = "0.0.0.0:9443")]
    ingest_address: std::net::SocketAddr,
    /// At most this many agent streams at once (open or being authenticated); further connections are
    /// refused before their token is reviewed. One agent holds one stream: size it above the node count.
    #[arg(long, env = "MAX_AGENT_STREAMS", default_value_t = 5_000)]
    max_agent_streams: usize,
    /// The longest an agent stream lives, in seconds, even if its token is valid longer; the agent
    /// then reconnects with its current token (nothing is lost: it resends what was not acknowledged).
    #[arg(long, env = "MAX_AGENT_STREAM_AGE_SECONDS", default_value_t = 3_600)]
    max_agent_stream_age_seconds: u64,
    /// Let an agent's report teach the peer's proposal even when the peer's workload has no pod on the
    /// agent's node. Off (default): a node speaks only for its own pods; the peer's own node reports
    /// the connection from its side, so a compromised node cannot add rules to workloads elsewhere.
    #[arg(long, env = "TRUST_REMOTE_PEERS", default_value_t = false, action = clap::ArgAction::Set)]
    trust_remote_peers: bool,
    /// A file holding the key (at least 32 bytes) proposals are signed with; only proposals whose spec
    /// the controller signed are promoted, so writing a proposal by hand does not let anyone create
    /// NetworkPolicies with the controller's rights (docs/install.md, "Who can promote what"). The chart
    /// generates and mounts one. Without it every proposal is promoted (a warning at start).
    #[arg(long, env = "PROPOSAL_SIGNING_KEY_FILE")]
    proposal_signing_key_file: Option<std::path::PathBuf>,
    /// The agents' ServiceAccount, `namespace/name`; tokens of any other account are refused.
    #[arg(
        long,
        env = "AGENT_SERVICE_ACCOUNT",
        default_value = "network-enforcer/network-enforcer-agent"
    )]
    agent_service_account: String,
    /// Namespaces whose workloads get no proposals (still resolved as peers of others). Default: the
    /// controller's own namespace.
    #[arg(
        long = "exclude-namespace",
        env = "EXCLUDE_NAMESPACES",
        value_delimiter = ','
    )]
    exclude_namespaces: Vec<String>,
    /// Workloads that get no proposals (still resolved as peers of others), `namespace/kind/name`,
    /// e.g. `shop/deployment/web`; comma-separated in the variable.
    #[arg(
        long = "exclude-workload",
        env = "EXCLUDE_WORKLOADS",
        value_delimiter = ','
    )]
    exclude_workloads: Vec<ExcludedWorkload>,
    /// At most this many distinct external addresses are learned per proposal and port; further ones
    /// are counted, logged and reported with an `ExternalPeersCapped` Event (0: none is learned).
    #[arg(
        long,
        env = "MAX_EXTERNAL_PEERS_PER_PORT",
        default_value_t = learner::DEFAULT_MAX_EXTERNAL_PEERS
    )]
    max_external_peers_per_port: usize,
    /// At most this many port entries per learned rule: past it, runs of consecutive ports collapse
    /// into ranges (`endPort`), and ports that still do not fit are reported with a `LearningCapped`
    /// Event.
    #[arg(
        long,
        env = "MAX_PORTS_PER_RULE",
        default_value_t = crate::learn::DEFAULT_MAX_PORTS_PER_RULE
    )]
    max_ports_per_rule: usize,
    /// At most this many rules (peers) per learned proposal; further peers are reported with a
    /// `LearningCapped` Event.
    #[arg(
        long = "max-rules-per-proposal",
        env = "MAX_RULES_PER_PROPOSAL",
        default_value_t = crate::learn::DEFAULT_MAX_RULES
    )]
    max_rules: usize,
    /// Learn `*.<parent>` once this many distinct names directly under one parent were reached on one
    /// port (never for a public suffix; 0: never, names stay exact; docs/behaviour.md §1.6).
    #[arg(
        long,
        env = "WILDCARD_MIN_NAMES",
        default_value_t = crate::learn::DEFAULT_WILDCARD_MIN_NAMES
    )]
    wildcard_min_names: usize,
    /// How long a flow whose peer resolves to no pod (or whose pod is not known yet) waits for the pod
    /// and Service watches to catch up before it is learned as an external address (or dropped): a new
    /// pod talks before its IP reaches the API (0: learn at once).
    #[arg(long, env = "RESOLUTION_GRACE_SECONDS", default_value_t = 30)]
    resolution_grace_seconds: u64,
    /// The address ranges the cluster gives pods and Services, comma-separated (e.g.
    /// 10.244.0.0/16,10.96.0.0/12). An external peer outside them cannot be a pod or Service not
    /// listed yet, so it is learned without the resolution grace and its batch acknowledged at the next
    /// flush. Empty (the default): every unresolved peer waits the grace.
    #[arg(long, env = "CLUSTER_CIDRS", value_delimiter = ',')]
    cluster_cidrs: Vec<ipnet::IpNet>,
    /// The controller's own namespace (set from the downward API in the cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = "network-enforcer")]
    pod_namespace: String,
    /// How often learned edges are written to proposals, in seconds (at most one write per proposal).
    #[arg(long, env = "FLUSH_INTERVAL_SECONDS", default_value_t = 2)]
    flush_interval_seconds: u64,
    /// Calico Goldmane as a flow source (off without --goldmane-address).
    #[command(flatten)]
    goldmane: crate::sources::goldmane::GoldmaneArgs,
    /// Where `/metrics` (Prometheus), `/healthz` (liveness) and `/readyz` (readiness, JSON detail) are
    /// served over HTTP.
    #[arg(long, env = "METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: std::net::SocketAddr,
    /// Where the read-only web view and its JSON API are served (docs/ui.md); `''` turns it off. On
    /// loopback by default: it shows every watched namespace's traffic to whoever reaches it.
    #[arg(long, env = "UI_ADDRESS", default_value = "127.0.0.1:8090")]
    ui_address: String,
    /// Do not serve the web view (the same as `--ui-address ''`).
    #[arg(long, env = "NO_UI")]
    no_ui: bool,
    /// Elect a leader among replicas with a Lease (only the leader learns, writes and reconciles;
    /// followers are not ready). `--leader-elect=false` for a single replica without the Lease.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// The Lease's name, in the controller's namespace (POD_NAMESPACE); identity: POD_NAME.
    #[arg(
        long,
        env = "LEADER_ELECTION_LEASE",
        default_value = "network-enforcer-controller"
    )]
    leader_election_lease: String,
    /// The ingest endpoint's TLS certificate chain (PEM); reloaded when the file changes.
    #[arg(long, env = "INGEST_TLS_CERT_FILE")]
    ingest_tls_cert_file: Option<std::path::PathBuf>,
    /// The key of --ingest-tls-cert-file (PEM: PKCS#8, PKCS#1 or SEC1); reloaded when the file changes.
    #[arg(long, env = "INGEST_TLS_KEY_FILE")]
    ingest_tls_key_file: Option<std::path::PathBuf>,
    /// Serve the ingest endpoint in plaintext (agents' tokens travel unencrypted). Needed when no TLS
    /// files are given; tests and debugging only.
    #[arg(long, env = "INGEST_INSECURE")]
    ingest_insecure: bool,
    /// How often violation records are written to policy statuses (Go-style duration: 30s, 1m, 500ms).
    #[arg(long, env = "WNP_STATUS_UPDATE_INTERVAL", default_value = "30s",
          value_parser = crate::monitor::status_sync::parse_duration)]
    status_update_interval: Duration,
    /// A rule that allowed no observed flow for this long makes the policy's `UnusedRules` condition
    /// True, naming it (docs/api.md, "Rule usage"; same duration syntax, e.g. 7d, 36h). Keep it well
    /// above 5m: a busy rule's `lastMatched` is written in 5-minute steps.
    #[arg(long, env = "UNUSED_RULE_AFTER", default_value = "7d",
          value_parser = crate::monitor::status_sync::parse_duration)]
    unused_rule_after: Duration,
    /// How long an observed edge stays in the protect gate's history after it was last seen
    /// (docs/api.md, "Protect gate"; same duration syntax).
    #[arg(long, env = "EDGE_HISTORY_RETENTION", default_value = "7d",
          value_parser = crate::monitor::status_sync::parse_duration)]
    edge_history_retention: Duration,
    /// For this long after the controller starts judging evidence (it became the leader), the
    /// protect gate's history counts as still being rebuilt: the gate reports the flows it finds
    /// blocked but keeps its previous verdict instead of saying none would be (docs/behaviour.md
    /// §3.11; `0s`: off).
    #[arg(long, env = "EDGE_HISTORY_WARMUP", default_value = "2m",
          value_parser = crate::monitor::status_sync::parse_duration_or_zero)]
    edge_history_warmup: Duration,
    /// How often the leader persists the protect gate's history into ConfigMaps of its namespace
    /// (`<--edge-history-configmap>-0` … `-7`, read by the next leader: docs/behaviour.md §3.11;
    /// `0s`: not persisted, a new leader starts from the violation records).
    #[arg(long, env = "EDGE_HISTORY_PERSIST_INTERVAL", default_value = "1m",
          value_parser = crate::monitor::status_sync::parse_duration_or_zero)]
    edge_history_persist_interval: Duration,
    /// How often the leader learns ClusterNetworkPolicyProposals from the observed namespace graph
    /// (docs/behaviour.md §1.11). Default: `1m` when the controller watches every namespace, off when
    /// it watches one (`WATCH_NAMESPACE`: it sees only part of the graph); `0s`: off.
    #[arg(long, env = "CLUSTER_PROPOSALS_INTERVAL",
          value_parser = crate::monitor::status_sync::parse_duration_or_zero)]
    cluster_proposals_interval: Option<Duration>,
    /// The name prefix of the ConfigMaps the protect gate's history is persisted in.
    #[arg(
        long,
        env = "EDGE_HISTORY_CONFIGMAP",
        default_value = "network-enforcer-edge-history"
    )]
    edge_history_configmap: String,
    /// The ConfigMap the evidence claims are persisted in, so that a batch resent to a new leader
    /// counts once (docs/behaviour.md §1.10); empty: not persisted.
    #[arg(
        long,
        env = "EVIDENCE_CLAIMS_CONFIGMAP",
        default_value = "network-enforcer-evidence-claims"
    )]
    evidence_claims_configmap: String,
    /// A node that runs pods while no agent of it has streamed to the leader for this long is
    /// reported: Warning Event `AgentSilent` on the Node, gauges `agent_silent_nodes`/`_pods`, the
    /// `agents` readiness detail (docs/behaviour.md §3.12; `0s`: off).
    #[arg(long, env = "AGENT_SILENCE_AFTER", default_value = "2m",
          value_parser = crate::monitor::status_sync::parse_duration_or_zero)]
    agent_silence_after: Duration,
    /// An agent whose process (with its `nft` runs) and eBPF programs use more CPU than this many
    /// cores (over at least 10 s of its samples) is reported: Warning Event `AgentOverBudget` on the
    /// Node, gauge
    /// `agent_over_budget_nodes` (docs/behaviour.md §3.12; `0`: not checked; checked at the coverage
    /// loop's looks, so off with `--agent-silence-after 0s` too).
    #[arg(long, env = "AGENT_CPU_BUDGET", default_value_t = 1.0)]
    agent_cpu_budget: f64,
    /// An agent process with more resident memory than this many MiB is reported as over its budget
    /// (set it below the agent's memory limit, where the OOM killer stops it; `0`: not checked).
    #[arg(long, env = "AGENT_MEMORY_BUDGET_MIB", default_value_t = 200)]
    agent_memory_budget_mib: u64,
    /// How long an address that pods of a workload resolved a name to stays in the NetworkPolicy a
    /// protect policy allowing the name renders, after it was last resolved (e.g. `10m`). Longer
    /// than the names' TTLs: clients cache answers, and a rendering that follows every TTL churns.
    #[arg(long, env = "NAME_ADDRESS_RETENTION", default_value = "10m",
          value_parser = crate::monitor::status_sync::parse_duration)]
    name_address_retention: Duration,
    /// At most this many observed edges (workload pair, protocol, port) in the protect gate's
    /// history, about 220 bytes each (44 MiB at the default); past it the least recently seen are
    /// evicted and counted.
    #[arg(long, env = "EDGE_HISTORY_MAX_EDGES", default_value_t = 200_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    edge_history_max_edges: u32,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Provider {
    Istio,
    Calico,
    Cilium,
    Ebpf,
}

impl Provider {
    fn backend(self) -> Backend {
        match self {
            Provider::Istio => Backend::Istio,
            Provider::Calico | Provider::Cilium | Provider::Ebpf => Backend::Kubernetes,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

pub async fn run(args: RunArgs) -> Result<()> {
    init_logs(&args)?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let setup = Setup::from_args(&args)?;
    let metrics = ControllerMetrics::new();
    setup.settings.metrics.register(&metrics);
    let health = Health::default();
    let http = setup::serve_probes(&args, &metrics, &health).await?;
    let ingest_health = health.component("ingest", true);
    let election = Election::start(&args, &client, &setup.settings, &metrics)?;
    // Kept to flush queued events on the way out.
    let violation_sink = crate::monitor::otlp::from_env(&metrics)
        .context("setting up OTLP export (OTEL_EXPORTER_OTLP_* variables)")?;
    let app = setup.app(
        &args,
        &client,
        &metrics,
        violation_sink.clone(),
        election.as_ref(),
    );
    let status_sync = app.status_sync.clone().expect("built with a status sync");
    let ui = setup::start_ui(&args, &client, &app, &setup, status_sync.clone(), &metrics).await?;
    let grpc = setup::serve_ingest(&args, &client, &app, &setup, &metrics).await?;
    let readiness = election::readiness(
        election.as_ref(),
        ingest_health,
        format!("serving on {}", args.ingest_address),
        metrics.clone(),
    );
    let leading = tasks::lead(
        election.as_ref(),
        tasks::leader_tasks(
            &args,
            &client,
            &app,
            &setup,
            &status_sync,
            &metrics,
            &health,
        ),
    );
    let stop = shutdown::signal()?;
    let result = tokio::select! {
        () = stop => Ok(()),
        () = leading => Ok(()),
        () = app.watch_cluster() => Ok(()),
        result = grpc => result.context("serving the agent ingest endpoint"),
        () = tasks::index_readiness(app.index.clone(), health.component("index", true)) => Ok(()),
        () = tasks::names_expiry(app.names.clone()) => Ok(()),
        () = readiness => Ok(()),
        () = election::lost(election.as_ref()) => {
            Err(anyhow::anyhow!("lost the leader Lease; exiting to restart as a follower"))
        }
        result = http => result.context("serving /metrics, /healthz, /readyz"),
        result = ui => result.context("serving the web view"),
    };
    shutdown::last_flush(&app, &status_sync, result.is_ok()).await;
    violation_sink.shutdown(Duration::from_secs(5)).await;
    if let Some(election) = &election {
        // Stopping (or failing): let a successor take over without waiting for the Lease to expire.
        election.release(client).await;
    }
    result
}

/// Logs to stdout at `--log-level`, as JSON or text (`--log-format`).
fn init_logs(args: &RunArgs) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    Ok(())
}
