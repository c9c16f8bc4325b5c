//! `cargo xtask bench fleet`: one controller replica (the real `network-enforcer-controller run`,
//! release build) against the local cluster's API server, with N simulated agents per phase
//! (`NE_FLEET_SIZES`, default 100,300,1000). Each simulated agent is its own gRPC stream over its own
//! TLS connection, authenticated as its own node: the cluster gets one Node object per agent (no
//! kubelet), an agent pod bound to it, and a pod-bound ServiceAccount token from the TokenRequest API,
//! which the controller checks with a TokenReview like a real agent's projected token.
//!
//! Workloads: `NE_FLEET_APPS` (default 40) Deployment-style apps (a ReplicaSet whose own pod template
//! cannot be created, so its controller leaves the pods alone, and a Service each), with
//! `NE_FLEET_PODS_PER_NODE` (default 3) pods on every node, each given a pod IP through the status
//! subresource. Every agent sends one batch per `NE_FLEET_BATCH_MS` (default 1000) with
//! `NE_FLEET_RATE` records per second (default 1000): pod-to-pod traffic both ways, Service ClusterIPs,
//! external peers, UDP, and every `NE_FLEET_NEW_EDGE_EVERY` batches (default 10) one edge on a port the
//! fleet may not have used yet (a new rule). Acknowledgements come once the controller has written
//! what a batch taught (WIRE: acknowledged means written), so the ack latency includes the flush.
//! `NE_FLEET_NEW_EDGES` says when the agents teach their new edges: `burst` (default) all in the same
//! batch interval, the worst case for the acknowledgement p99 (every proposal with a new edge is
//! written in one flush); `spread`, each agent in its own turn (agent i on the batches where
//! sequence + i is a multiple of `NE_FLEET_NEW_EDGE_EVERY`), as nodes learning independently do.
//! The figure `new_edges_spread` (0 or 1) says which a run used.
//!
//! `NE_FLEET_PROFILE=steady` measures a quiet fleet instead of a storm (figures in
//! `target/bench/fleet_steady.json`, among them `controller_cores_steady_1000`): each agent knows
//! `NE_FLEET_EDGES_PER_NODE` edges (default 1,000) and, as an agent with the default refresh
//! (`--refresh-seconds 30`) does once they are known, sends each of them once per 30 s, in batches
//! every 10 s (the agent's flush), with one new edge per batch (0.6 % of the edges per minute), agents
//! in turns; window 60 s. The records are what the refresh lets through; the simulator does not run
//! the agent's refresh itself.
//!
//! Per phase: a fresh controller (`FLUSH_INTERVAL_SECONDS` = `NE_FLEET_FLUSH_SECONDS`, default 2, the
//! chart's default), every agent opens a stream once and drops it (first connects: one TokenReview
//! each), then opens it again and keeps it (reconnects within the review cache's TTL), then a warm-up
//! (`NE_FLEET_WARMUP_SECONDS`, 5) and the measured window (`NE_FLEET_SECONDS`, 30). Figures: records
//! acknowledged as accepted per second, ack latency (send → ack) percentiles, the controller's CPU
//! (utime+stime from /proc) and peak RSS (VmHWM), the simulator's own CPU and the whole machine's,
//! proposal spec writes per second (`proposal_writes_total`), TokenReviews per connect (the API
//! server's `apiserver_request_total` for `tokenreviews`: the controller has no metric for reviews it
//! answered from its cache), refused streams and records, and the records the controller's evidence
//! queue dropped (`evidence_records_dropped_total`). Everything the bench created (namespaces,
//! Nodes) is deleted at the end, also on failure.
//!
//! The xtask binary is a debug build; this bench re-runs itself from a release build of the xtask so
//! the simulator's encoding and TLS do not cost the controller its share of the two cores.

mod agent;
mod cluster;
mod controller;
mod mix;
mod phase;
mod tls;

use agent::{agent_loop, open};
use cluster::{delete_nodes, delete_stale_nodes};
use controller::{api_token_reviews, machine_jiffies, metric_sum};
use mix::Mix;
use phase::{Window, phase};
use tls::SERVER_NAME;

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use network_enforcer_api::crd::WorkloadNetworkPolicyProposal;
use network_enforcer_api::uplink::flow_uplink_client::FlowUplinkClient;
use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord, LocalPod};
use network_enforcer_tests::cluster::process;
use network_enforcer_tests::fixture::{self, TestNamespace};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::{Figure, report};
use crate::run;

/// Set in the release build's environment: run the bench itself (not the build step).
const INNER: &str = "NE_FLEET_INNER";
/// Label on the Node objects the bench creates: the pid of the bench process.
const NODE_LABEL: &str = "network-enforcer.bench/fleet";
/// The audience the controller requires (the controller's `ingest::AUDIENCE`).
const AUDIENCE: &str = "network-enforcer";
/// The agents' ServiceAccount.
const AGENT_SA: &str = "fleet-agent";
/// The pod-template-hash of every app's ReplicaSet (the index names the Deployment after it).
const HASH: &str = "5d9c8f7b6";
/// Concurrent API requests while creating or deleting the fleet, and concurrent agent connects.
const CONCURRENCY: usize = 32;
/// The goal per agent.
const GOAL_RATE: f64 = 1000.0;
const GOAL_P99_MS: f64 = 1000.0;
const GOAL_RSS_MIB: f64 = 512.0;
/// An agent sustains its rate when this share of it was acknowledged as accepted in the window.
const SUSTAINED: f64 = 0.95;
/// External addresses the agents talk to (below the controller's default cap of 50 per port).
const EXTERNAL_PEERS: u64 = 48;
/// New-edge ports are drawn from this many ports above 20000.
const NEW_EDGE_PORTS: u64 = 1000;

/// What the agents send: a storm of records, or a known fleet's steady refreshes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Profile {
    Storm,
    /// Each agent's known edges, each once per [`STEADY_REFRESH`].
    Steady {
        edges: usize,
    },
}

/// How often an agent with the default refresh sends a known edge.
pub(super) const STEADY_REFRESH: Duration = Duration::from_secs(30);

struct Settings {
    profile: Profile,
    sizes: Vec<usize>,
    rate: u32,
    seconds: u64,
    warmup: u64,
    batch_ms: u64,
    apps: usize,
    pods_per_node: usize,
    flush_seconds: u64,
    new_edge_every: u64,
    /// `NE_FLEET_NEW_EDGES=spread`: each agent teaches its new edge in its own turn.
    new_edges_spread: bool,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid number")),
        _ => Ok(default),
    }
}

impl Settings {
    fn from_env() -> Result<Self> {
        let sizes = std::env::var("NE_FLEET_SIZES").unwrap_or_else(|_| "100,300,1000".into());
        let mut sizes = sizes
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .context("NE_FLEET_SIZES must be comma-separated numbers")?;
        sizes.sort_unstable();
        sizes.dedup();
        if sizes.is_empty() || sizes[0] == 0 {
            bail!("NE_FLEET_SIZES needs at least one size above 0");
        }
        let profile = match std::env::var("NE_FLEET_PROFILE").as_deref() {
            Err(_) | Ok("") | Ok("storm") => Profile::Storm,
            Ok("steady") => Profile::Steady {
                edges: env_or("NE_FLEET_EDGES_PER_NODE", 1000)?,
            },
            Ok(other) => bail!("NE_FLEET_PROFILE={other:?}: use `storm` or `steady`"),
        };
        let steady = matches!(profile, Profile::Steady { .. });
        let batch_ms = env_or("NE_FLEET_BATCH_MS", if steady { 10_000 } else { 1000 })?;
        let rate = match profile {
            // Each known edge once per refresh.
            Profile::Steady { edges } => {
                (edges as u64).div_ceil(STEADY_REFRESH.as_secs()).max(1) as u32
            }
            Profile::Storm => env_or("NE_FLEET_RATE", 1000)?,
        };
        let s = Self {
            profile,
            sizes,
            rate,
            seconds: env_or("NE_FLEET_SECONDS", if steady { 60 } else { 30 })?,
            warmup: env_or("NE_FLEET_WARMUP_SECONDS", 5)?,
            batch_ms,
            apps: env_or("NE_FLEET_APPS", 40)?,
            pods_per_node: env_or("NE_FLEET_PODS_PER_NODE", 3)?,
            flush_seconds: env_or("NE_FLEET_FLUSH_SECONDS", 2)?,
            new_edge_every: env_or("NE_FLEET_NEW_EDGE_EVERY", if steady { 1 } else { 10 })?,
            new_edges_spread: match std::env::var("NE_FLEET_NEW_EDGES").as_deref() {
                Err(_) | Ok("") => steady,
                Ok("burst") => false,
                Ok("spread") => true,
                Ok(other) => bail!("NE_FLEET_NEW_EDGES={other:?}: use `burst` or `spread`"),
            },
        };
        if s.profile == (Profile::Steady { edges: 0 }) {
            bail!("NE_FLEET_EDGES_PER_NODE must be above 0");
        }
        if s.rate == 0 || s.seconds == 0 || s.batch_ms == 0 || s.apps == 0 || s.pods_per_node == 0 {
            bail!("NE_FLEET_RATE, _SECONDS, _BATCH_MS, _APPS and _PODS_PER_NODE must be above 0");
        }
        Ok(s)
    }

    fn records_per_batch(&self) -> usize {
        ((u64::from(self.rate) * self.batch_ms).div_ceil(1000)).max(1) as usize
    }

    fn max_agents(&self) -> usize {
        *self.sizes.last().expect("at least one size")
    }
}

/// Builds the controller and this xtask in release and runs the bench from there.
pub fn run() -> Result<()> {
    if std::env::var_os(INNER).is_some() {
        return inner();
    }
    Settings::from_env()?;
    let root = run::workspace_root();
    run::step(
        "cargo build --release (controller, xtask)",
        run::cargo(
            &root,
            &[],
            &[
                "build",
                "--release",
                "--locked",
                "-p",
                "network-enforcer-controller",
                "-p",
                "xtask",
            ],
        ),
    )?;
    let release = root.join("target/release");
    run::status(
        Command::new(release.join("xtask"))
            .args(["bench", "fleet"])
            .env(INNER, "1")
            .env(
                "NE_FLEET_CONTROLLER",
                release.join("network-enforcer-controller"),
            ),
    )
}

fn inner() -> Result<()> {
    let settings = Settings::from_env()?;
    let controller = PathBuf::from(
        std::env::var_os("NE_FLEET_CONTROLLER").context("NE_FLEET_CONTROLLER is not set")?,
    );
    let cluster = fixture::cluster_with_crds()?;
    let kubeconfig = cluster.kubeconfig.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = fixture::client().await?;
        delete_stale_nodes(&client).await;
        let started = Instant::now();
        println!(
            "==> creating the fleet: {} Nodes, agent pods and tokens, {} apps, {} pods per node",
            settings.max_agents(),
            settings.apps,
            settings.pods_per_node
        );
        let fleet = Fleet::create(&client, &settings).await;
        let fleet = match fleet {
            Ok(f) => f,
            Err(e) => {
                delete_nodes(&client, std::process::id()).await;
                return Err(e);
            }
        };
        let setup = started.elapsed();
        println!("    created in {:.1}s", setup.as_secs_f64());
        let result = phases(&fleet, &settings, &controller, &kubeconfig, setup).await;
        println!("==> deleting the fleet");
        let deleting = Instant::now();
        fleet.delete().await;
        println!("    deleted in {:.1}s", deleting.elapsed().as_secs_f64());
        result
    })
}

/// Runs every phase and reports.
async fn phases(
    fleet: &Fleet,
    settings: &Settings,
    controller: &Path,
    kubeconfig: &Path,
    setup: Duration,
) -> Result<()> {
    let tls = Pki::create()?;
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let mut results = Vec::new();
    for &n in &settings.sizes {
        println!("==> phase: {n} agents x {} records/s", settings.rate);
        let r = phase(n, fleet, settings, controller, kubeconfig, &tls).await?;
        r.print();
        results.push(r);
    }
    let mut figures = Vec::new();
    let at = |key: &str, n: usize| -> &'static str { Box::leak(format!("{key}_at_{n}").into()) };
    let goal_rate_met = f64::from(settings.rate) >= GOAL_RATE;
    let at_goal = results
        .iter()
        .filter(|r| goal_rate_met && r.meets_goal())
        .map(|r| r.agents)
        .max()
        .unwrap_or(0);
    figures.push(Figure::new(
        "agents_at_goal",
        at_goal as f64,
        "largest N: every agent >= 1000 records/s accepted, p99 ack <= 1 s, RSS <= 512 MiB",
    ));
    if let Some(r) = results.iter().find(|r| r.agents == 1000) {
        figures.push(Figure::new("p99_ack_ms_at_1000", r.p99_ms, "ms"));
        figures.push(Figure::new("controller_rss_mib_at_1000", r.rss_mib, "MiB"));
        if let Profile::Steady { .. } = settings.profile {
            figures.push(Figure::new(
                "controller_cores_steady_1000",
                r.cpu_cores,
                "controller CPU (cores), 1,000 agents in the steady profile (goal <= 0.25)",
            ));
        }
    }
    let first_drop = results.iter().find(|r| r.drops()).map_or(0, |r| r.agents);
    figures.push(Figure::new(
        "first_drop_agents",
        first_drop as f64,
        "smallest N with refused streams/records or an agent below 95% of its rate (0: none)",
    ));
    match merged_per_core() {
        Some(v) => figures.push(Figure::new(
            "records_merged_per_sec_per_core",
            v,
            "from target/bench/controller.json (bench controller)",
        )),
        None => println!(
            "    (no target/bench/controller.json: run `cargo xtask bench controller` for \
             records_merged_per_sec_per_core)"
        ),
    }
    for r in &results {
        let n = r.agents;
        figures.extend([
            Figure::new(
                at("records_per_sec", n),
                r.records_per_sec,
                "records/s accepted (acked)",
            ),
            Figure::new(
                at("offered_records_per_sec", n),
                r.offered_per_sec,
                "records/s the agents sent",
            ),
            Figure::new(
                at("min_agent_records_per_sec", n),
                r.min_agent_per_sec,
                "records/s accepted, slowest agent",
            ),
            Figure::new(
                at("agents_sustaining", n),
                r.sustaining as f64,
                "agents with >= 95% of their rate accepted",
            ),
            Figure::new(at("p50_ack_ms", n), r.p50_ms, "ms send -> ack"),
            Figure::new(at("p99_ack_ms", n), r.p99_ms, "ms send -> ack"),
            Figure::new(at("cpu_cores", n), r.cpu_cores, "controller CPU (cores)"),
            Figure::new(at("rss_mib", n), r.rss_mib, "controller peak RSS (VmHWM)"),
            Figure::new(
                at("api_writes_per_sec", n),
                r.writes_per_sec,
                "proposal spec writes/s (each also patches status)",
            ),
            Figure::new(
                at("proposal_write_ms", n),
                r.write_ms,
                "ms per proposal in a flush (reads, write, status; one after another)",
            ),
            Figure::new(
                at("api_get_p50_ms", n),
                r.api_get_p50_ms,
                "ms, API server GET of a namespace meanwhile",
            ),
            Figure::new(
                at("api_get_p99_ms", n),
                r.api_get_p99_ms,
                "ms, API server GET of a namespace meanwhile",
            ),
            Figure::new(
                at("proposals", n),
                r.proposals as f64,
                "proposals written by the end",
            ),
            Figure::new(
                at("proposal_kib", n),
                r.proposal_kib,
                "KiB of all proposals (JSON)",
            ),
            Figure::new(
                at("token_reviews_per_connect", n),
                r.reviews_first,
                "API server TokenReviews per first connect",
            ),
            Figure::new(
                at("token_reviews_per_reconnect", n),
                r.reviews_reconnect,
                "API server TokenReviews per reconnect (cache TTL 30 s)",
            ),
            Figure::new(
                at("connect_seconds", n),
                r.connect_seconds,
                "s for all first connects",
            ),
            Figure::new(
                at("simulator_cpu_cores", n),
                r.simulator_cores,
                "cores used by the simulated agents",
            ),
            Figure::new(
                at("machine_busy_cores", n),
                r.machine_cores,
                "cores busy machine-wide (of 2)",
            ),
            Figure::new(
                at("refused_streams", n),
                r.refused_streams as f64,
                "streams ended by the controller",
            ),
            Figure::new(
                at("rejected_records", n),
                r.rejected as f64,
                "records refused",
            ),
            Figure::new(
                at("evidence_dropped", n),
                r.evidence_dropped as f64,
                "records the controller's evidence queue dropped (full: the protect gate's edge history misses them)",
            ),
            Figure::new(
                at("unacked_batches", n),
                r.unacked as f64,
                "batches sent in the window never acknowledged",
            ),
        ]);
    }
    figures.extend([
        Figure::new(
            "rate_per_agent",
            f64::from(settings.rate),
            "records/s each agent offers",
        ),
        Figure::new(
            "edges_per_node",
            match settings.profile {
                Profile::Steady { edges } => edges as f64,
                Profile::Storm => 0.0,
            },
            "steady profile: edges each agent refreshes every 30 s (0: the storm profile)",
        ),
        Figure::new(
            "new_edges_spread",
            f64::from(u8::from(settings.new_edges_spread)),
            "1: agents teach new edges in turns (NE_FLEET_NEW_EDGES=spread); 0: all at once",
        ),
        Figure::new(
            "flush_interval_seconds",
            settings.flush_seconds as f64,
            "controller FLUSH_INTERVAL_SECONDS",
        ),
        Figure::new(
            "window_seconds",
            settings.seconds as f64,
            "s measured per phase",
        ),
        Figure::new(
            "load_average_1m",
            load,
            "1-min load average at start (2 cores)",
        ),
        Figure::new(
            "fleet_setup_seconds",
            setup.as_secs_f64(),
            "s to create Nodes, pods, IPs, tokens",
        ),
    ]);
    let name = match settings.profile {
        Profile::Storm => "fleet",
        Profile::Steady { .. } => "fleet_steady",
    };
    report(name, &figures)?;
    Ok(())
}

/// `records_merged_per_sec_per_core` from the controller bench's last figures.
fn merged_per_core() -> Option<f64> {
    let path = run::workspace_root().join("target/bench/controller.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["records_merged_per_sec_per_core"].as_f64()
}

// The types the files of this module share (their fields are read across them).

struct AgentSpec {
    node: String,
    token: String,
    /// The workload pods on this agent's node, with their app index.
    pods: Vec<(LocalPod, usize)>,
}

struct Fleet {
    client: Client,
    apps_ns: TestNamespace,
    agents_ns: TestNamespace,
    agents: Vec<AgentSpec>,
    /// Every workload pod's IP and app index.
    pod_ips: Arc<Vec<(Ipv4Addr, usize)>>,
    /// Every app's Service ClusterIP.
    services: Arc<Vec<Ipv4Addr>>,
}

struct Pki {
    dir: PathBuf,
    ca: Vec<u8>,
}

struct Controller {
    child: Child,
    metrics_port: u16,
    ingest_port: u16,
}

/// CPU seconds (utime + stime) and peak RSS of a process, from `/proc/<pid>/{stat,status}`.
struct ProcSample {
    cpu_seconds: f64,
    hwm_mib: f64,
}

struct PhaseResult {
    agents: usize,
    records_per_sec: f64,
    offered_per_sec: f64,
    min_agent_per_sec: f64,
    sustaining: usize,
    p50_ms: f64,
    p99_ms: f64,
    cpu_cores: f64,
    rss_mib: f64,
    writes_per_sec: f64,
    write_ms: f64,
    reviews_first: f64,
    reviews_reconnect: f64,
    connect_seconds: f64,
    api_get_p50_ms: f64,
    api_get_p99_ms: f64,
    proposals: usize,
    proposal_kib: f64,
    simulator_cores: f64,
    machine_cores: f64,
    refused_streams: u64,
    rejected: u64,
    evidence_dropped: u64,
    unacked: u64,
    first_error: Option<String>,
}
#[derive(Default)]
struct AgentOutcome {
    sent_in_window: u64,
    offered_in_window: u64,
    accepted_in_window: u64,
    rejected: u64,
    latencies: Vec<Duration>,
    unacked: u64,
    skipped: u64,
    error: Option<String>,
}
