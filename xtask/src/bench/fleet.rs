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

struct Settings {
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
        let s = Self {
            sizes,
            rate: env_or("NE_FLEET_RATE", 1000)?,
            seconds: env_or("NE_FLEET_SECONDS", 30)?,
            warmup: env_or("NE_FLEET_WARMUP_SECONDS", 5)?,
            batch_ms: env_or("NE_FLEET_BATCH_MS", 1000)?,
            apps: env_or("NE_FLEET_APPS", 40)?,
            pods_per_node: env_or("NE_FLEET_PODS_PER_NODE", 3)?,
            flush_seconds: env_or("NE_FLEET_FLUSH_SECONDS", 2)?,
            new_edge_every: env_or("NE_FLEET_NEW_EDGE_EVERY", 10)?,
            new_edges_spread: match std::env::var("NE_FLEET_NEW_EDGES").as_deref() {
                Err(_) | Ok("") | Ok("burst") => false,
                Ok("spread") => true,
                Ok(other) => bail!("NE_FLEET_NEW_EDGES={other:?}: use `burst` or `spread`"),
            },
        };
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
    report("fleet", &figures)?;
    Ok(())
}

/// `records_merged_per_sec_per_core` from the controller bench's last figures.
fn merged_per_core() -> Option<f64> {
    let path = run::workspace_root().join("target/bench/controller.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["records_merged_per_sec_per_core"].as_f64()
}

// ---------------------------------------------------------------------------------------------
// The fleet: Nodes, agent pods with tokens, apps.

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

fn pod_ip(index: usize) -> Ipv4Addr {
    // 100.64.0.0/10 (shared address space): clear of the cluster's pod and service ranges.
    Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 1)) + index as u32)
}

/// Creates `items` with at most [`CONCURRENCY`] requests in flight; fails with the first error.
async fn in_parallel<T, F, Fut, O>(items: Vec<T>, f: F) -> Result<Vec<O>>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<O>>,
{
    let results: Vec<Result<O>> = futures::stream::iter(items.into_iter().map(f))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect()
}

fn tolerations() -> serde_json::Value {
    json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        {"key": NODE_LABEL, "operator": "Exists"}
    ])
}

impl Fleet {
    async fn create(client: &Client, settings: &Settings) -> Result<Self> {
        let pid = std::process::id();
        let n = settings.max_agents();
        let apps_ns = TestNamespace::create_with_crds("fleet-apps").await?;
        let agents_ns = TestNamespace::create("fleet-agents").await?;
        let mut fleet = Fleet {
            client: client.clone(),
            apps_ns,
            agents_ns,
            agents: Vec::new(),
            pod_ips: Arc::default(),
            services: Arc::default(),
        };
        // From here on, a failure still deletes what was made.
        if let Err(e) = fleet.populate(settings, pid, n).await {
            fleet.delete().await;
            return Err(e);
        }
        Ok(fleet)
    }

    async fn populate(&mut self, settings: &Settings, pid: u32, n: usize) -> Result<()> {
        let nodes: Vec<String> = (0..n).map(|i| format!("fleet-{pid}-{i}")).collect();
        let t = Instant::now();
        let node_api = Api::<Node>::all(self.client.clone());
        in_parallel(nodes.clone(), |name| {
            let api = node_api.clone();
            async move {
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {NODE_LABEL: pid.to_string()}},
                    "spec": {"unschedulable": true,
                             "taints": [{"key": NODE_LABEL, "effect": "NoSchedule"}]}
                }))?;
                api.create(&PostParams::default(), &node).await?;
                Ok(())
            }
        })
        .await
        .context("creating Nodes")?;
        println!("    {n} Nodes in {:.1}s", t.elapsed().as_secs_f64());

        // Apps: a ReplicaSet each (its template names a ServiceAccount that does not exist, so the
        // ReplicaSet controller cannot add pods of its own) and a Service.
        let apps = settings.apps;
        let ppn = settings.pods_per_node;
        let total_pods = n * ppn;
        let app_ns = self.apps_ns.name.clone();
        let rs_api = self.apps_ns.api::<ReplicaSet>();
        let svc_api = self.apps_ns.api::<Service>();
        let sets = in_parallel((0..apps).collect(), |k| {
            let (rs_api, svc_api) = (rs_api.clone(), svc_api.clone());
            let replicas = (0..total_pods).filter(|p| p % apps == k).count();
            async move {
                let labels = json!({"app": format!("app-{k}"), "pod-template-hash": HASH});
                let rs: ReplicaSet = serde_json::from_value(json!({
                    "metadata": {"name": format!("app-{k}-{HASH}"), "labels": labels},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                        "template": {"metadata": {"labels": labels}, "spec": {
                            "serviceAccountName": "fleet-does-not-exist",
                            "automountServiceAccountToken": false,
                            "containers": [{"name": "main", "image": "fleet.invalid/none:0",
                                "ports": [{"name": "http", "containerPort": 8000 + k}]}]}}}
                }))?;
                let rs = rs_api.create(&PostParams::default(), &rs).await?;
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("app-{k}")},
                    "spec": {"selector": {"app": format!("app-{k}")},
                             "ports": [{"name": "http", "port": 80, "targetPort": 8000 + k}]}
                }))?;
                let svc = svc_api.create(&PostParams::default(), &svc).await?;
                let ip: Ipv4Addr = svc
                    .spec
                    .and_then(|s| s.cluster_ip)
                    .context("Service without ClusterIP")?
                    .parse()?;
                Ok((rs.uid().context("ReplicaSet without uid")?, ip))
            }
        })
        .await
        .context("creating apps")?;
        self.services = Arc::new(sets.iter().map(|(_, ip)| *ip).collect());

        let t = Instant::now();
        let pod_api = self.apps_ns.api::<Pod>();
        let workload_pods: Vec<(usize, usize)> =
            (0..n).flat_map(|i| (0..ppn).map(move |j| (i, j))).collect();
        let created = in_parallel(workload_pods, |(i, j)| {
            let api = pod_api.clone();
            let p = i * ppn + j;
            let k = p % apps;
            let node = nodes[i].clone();
            let rs_uid = sets[k].0.clone();
            let app_ns = app_ns.clone();
            async move {
                let name = format!("app-{k}-{HASH}-n{i}p{j}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name,
                        "labels": {"app": format!("app-{k}"), "pod-template-hash": HASH},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": format!("app-{k}-{HASH}"), "uid": rs_uid, "controller": true}]},
                    "spec": {"nodeName": node, "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 0, "tolerations": tolerations(),
                        "containers": [{"name": "main", "image": "fleet.invalid/none:0",
                            "ports": [{"name": "http", "containerPort": 8000 + k}]}]}
                }))?;
                let pod = api.create(&PostParams::default(), &pod).await?;
                let ip = pod_ip(p).to_string();
                let status = json!({"status": {"phase": "Running", "podIP": ip,
                    "podIPs": [{"ip": ip}]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                let local = LocalPod {
                    namespace: app_ns,
                    name,
                    uid: pod.uid().unwrap_or_default(),
                };
                Ok((i, local, k))
            }
        })
        .await
        .context("creating workload pods")?;
        println!(
            "    {} workload pods with IPs in {:.1}s",
            n * ppn,
            t.elapsed().as_secs_f64()
        );
        self.pod_ips = Arc::new((0..n * ppn).map(|p| (pod_ip(p), p % apps)).collect());

        let t = Instant::now();
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": AGENT_SA}}))?;
        self.agents_ns
            .api::<ServiceAccount>()
            .create(&PostParams::default(), &sa)
            .await?;
        let agent_pods = self.agents_ns.api::<Pod>();
        let accounts = self.agents_ns.api::<ServiceAccount>();
        let tokens = in_parallel((0..n).collect(), |i| {
            let (pods, accounts) = (agent_pods.clone(), accounts.clone());
            let node = nodes[i].clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("agent-{i}"), "labels": {"app": "fleet-agent"}},
                    "spec": {"nodeName": node, "serviceAccountName": AGENT_SA,
                        "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 0,
                        "tolerations": tolerations(),
                        "containers": [{"name": "agent", "image": "fleet.invalid/none:0"}]}
                }))?;
                let pod = pods.create(&PostParams::default(), &pod).await?;
                let request: TokenRequest = serde_json::from_value(json!({"spec": {
                    "audiences": [AUDIENCE], "expirationSeconds": 3600,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                        "name": pod.name_any(), "uid": pod.uid()}}}))?;
                let token = accounts
                    .create_token_request(AGENT_SA, &PostParams::default(), &request)
                    .await?
                    .status
                    .and_then(|s| s.token)
                    .context("the API server issued no token")?;
                Ok(token)
            }
        })
        .await
        .context("creating agent pods and tokens")?;
        println!(
            "    {n} agent pods and tokens in {:.1}s",
            t.elapsed().as_secs_f64()
        );
        let mut agents: Vec<AgentSpec> = nodes
            .into_iter()
            .zip(tokens)
            .map(|(node, token)| AgentSpec {
                node,
                token,
                pods: Vec::new(),
            })
            .collect();
        for (i, local, k) in created {
            agents[i].pods.push((local, k));
        }
        self.agents = agents;
        Ok(())
    }

    /// Deletes the pods (at once: no kubelet confirms), the apps, the Nodes and both namespaces.
    async fn delete(&self) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        for ns in [&self.apps_ns, &self.agents_ns] {
            if let Err(e) = ns
                .api::<Pod>()
                .delete_collection(&now, &ListParams::default())
                .await
            {
                eprintln!("warning: deleting the pods of {}: {e}", ns.name);
            }
        }
        let _ = self
            .apps_ns
            .api::<ReplicaSet>()
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        delete_nodes(&self.client, std::process::id()).await;
        // The namespaces go when the TestNamespaces are dropped.
    }
}

async fn delete_nodes(client: &Client, pid: u32) {
    let api = Api::<Node>::all(client.clone());
    let selector = format!("{NODE_LABEL}={pid}");
    if let Err(e) = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await
    {
        eprintln!("warning: deleting the fleet's Nodes ({selector}): {e}");
    }
}

/// Nodes of fleet benches whose process is gone (killed before cleaning up).
async fn delete_stale_nodes(client: &Client) {
    let api = Api::<Node>::all(client.clone());
    let Ok(list) = api.list(&ListParams::default().labels(NODE_LABEL)).await else {
        return;
    };
    let mut pids: Vec<u32> = list
        .items
        .iter()
        .filter_map(|n| n.labels().get(NODE_LABEL)?.parse().ok())
        .filter(|pid| !process::alive(*pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        println!("    deleting Nodes left by fleet bench {pid}");
        delete_nodes(client, pid).await;
    }
}

// ---------------------------------------------------------------------------------------------
// TLS for the ingest endpoint.

const SERVER_NAME: &str = "fleet-controller.bench.invalid";

struct Pki {
    dir: PathBuf,
    ca: Vec<u8>,
}

impl Pki {
    fn create() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("ne-fleet-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "fleet bench CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])?.signed_by(&key, &ca)?;
        std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
        std::fs::write(dir.join("tls.crt"), cert.pem())?;
        Ok(Self {
            ca: ca.pem().into_bytes(),
            dir,
        })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// The controller process.

struct Controller {
    child: Child,
    metrics_port: u16,
    ingest_port: u16,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Controller {
    fn start(
        bin: &Path,
        kubeconfig: &Path,
        fleet: &Fleet,
        settings: &Settings,
        tls: &Pki,
        log: &Path,
    ) -> Result<Self> {
        let (ingest_port, metrics_port) = (free_port()?, free_port()?);
        let log =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .arg("run")
            .env("KUBECONFIG", kubeconfig)
            .env("WATCH_NAMESPACE", &fleet.apps_ns.name)
            .env("POD_NAMESPACE", &fleet.agents_ns.name)
            .env("POD_NAME", "fleet-controller")
            .env(
                "AGENT_SERVICE_ACCOUNT",
                format!("{}/{AGENT_SA}", fleet.agents_ns.name),
            )
            .env("CONTROLLER_PROVIDER", "ebpf")
            .env("LEADER_ELECT", "false")
            .env("INGEST_ADDRESS", format!("127.0.0.1:{ingest_port}"))
            .env("INGEST_TLS_CERT_FILE", tls.dir.join("tls.crt"))
            .env("INGEST_TLS_KEY_FILE", tls.dir.join("tls.key"))
            .env("METRICS_ADDRESS", format!("127.0.0.1:{metrics_port}"))
            .env("UI_ADDRESS", "")
            .env("FLUSH_INTERVAL_SECONDS", settings.flush_seconds.to_string())
            // As a production install sets them: external peers outside are not held for the grace.
            .env(
                "CLUSTER_CIDRS",
                format!(
                    "{},{}",
                    network_enforcer_tests::cluster::layout::CLUSTER_CIDR,
                    network_enforcer_tests::cluster::layout::SERVICE_CIDR
                ),
            )
            .env("LOG_LEVEL", "warn")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            child,
            metrics_port,
            ingest_port,
        })
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the controller exited with {status} before it was ready");
            }
            if let Some((200, _)) = http_get(self.metrics_port, "/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the controller was not ready within 180 s");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn metrics(&self) -> String {
        http_get(self.metrics_port, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    fn proc(&self) -> ProcSample {
        ProcSample::of(&format!("/proc/{}", self.child.id()))
    }

    /// SIGTERM (the controller writes what is pending), then kill after 20 s.
    async fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `GET path` on 127.0.0.1:port (HTTP/1.0): status and body, `None` while nothing answers.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// The sum of every sample of `name` (with any labels) whose labels contain each of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (series, value) = rest.rsplit_once(' ')?;
            if !(series.is_empty() || series.starts_with('{')) {
                return None;
            }
            labels
                .iter()
                .all(|want| series.contains(want))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// TokenReviews the API server has answered so far (every client's).
async fn api_token_reviews(client: &Client) -> f64 {
    let request = match tonic::codegen::http::Request::get("/metrics").body(Vec::new()) {
        Ok(r) => r,
        Err(_) => return f64::NAN,
    };
    match client.request_text(request).await {
        Ok(text) => metric_sum(
            &text,
            "apiserver_request_total",
            &["resource=\"tokenreviews\"", "verb=\"POST\""],
        ),
        Err(_) => f64::NAN,
    }
}

/// CPU seconds (utime + stime) and peak RSS of a process, from `/proc/<pid>/{stat,status}`.
struct ProcSample {
    cpu_seconds: f64,
    hwm_mib: f64,
}

impl ProcSample {
    fn of(dir: &str) -> Self {
        let stat = std::fs::read_to_string(format!("{dir}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // After the command name: state is field 3, utime 14 and stime 15 (1-based, whole line).
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let cpu_seconds = (ticks(11) + ticks(12)) / clock_ticks();
        let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
        let hwm_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        Self {
            cpu_seconds,
            hwm_mib: hwm_kib / 1024.0,
        }
    }
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Busy and total jiffies of the whole machine (`/proc/stat`).
fn machine_jiffies() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = values.iter().take(8).sum();
    // idle + iowait
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

// ---------------------------------------------------------------------------------------------
// One phase.

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

impl PhaseResult {
    fn meets_goal(&self) -> bool {
        !self.drops()
            && self.min_agent_per_sec >= GOAL_RATE * SUSTAINED
            && self.p99_ms <= GOAL_P99_MS
            && self.rss_mib <= GOAL_RSS_MIB
    }

    fn drops(&self) -> bool {
        self.refused_streams > 0
            || self.rejected > 0
            || self.unacked > 0
            || self.sustaining < self.agents
    }

    fn print(&self) {
        println!(
            "    accepted {:.0} records/s of {:.0} offered (slowest agent {:.0}/s, {}/{} sustaining); \
             ack p50 {:.0} ms p99 {:.0} ms",
            self.records_per_sec,
            self.offered_per_sec,
            self.min_agent_per_sec,
            self.sustaining,
            self.agents,
            self.p50_ms,
            self.p99_ms
        );
        println!(
            "    controller {:.2} cores, peak RSS {:.0} MiB, {:.1} proposal writes/s; simulator {:.2} \
             cores; machine {:.2} cores busy",
            self.cpu_cores,
            self.rss_mib,
            self.writes_per_sec,
            self.simulator_cores,
            self.machine_cores
        );
        println!(
            "    connects: {:.1}s, {:.2} TokenReviews per first connect, {:.2} per reconnect; \
             refused streams {}, rejected records {}, evidence dropped {}, unacked batches {}",
            self.connect_seconds,
            self.reviews_first,
            self.reviews_reconnect,
            self.refused_streams,
            self.rejected,
            self.evidence_dropped,
            self.unacked
        );
        println!(
            "    API server GET p50 {:.0} ms p99 {:.0} ms; {} proposals, {:.0} KiB in all",
            self.api_get_p50_ms, self.api_get_p99_ms, self.proposals, self.proposal_kib
        );
        if let Some(e) = &self.first_error {
            println!("    first stream error: {e}");
        }
    }
}

/// Shared by the agents of one phase: when the measured window is (nanoseconds since `base`; 0:
/// not known yet) and when to stop sending.
struct Window {
    base: Instant,
    start: AtomicU64,
    end: AtomicU64,
}

impl Window {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            start: AtomicU64::new(u64::MAX),
            end: AtomicU64::new(u64::MAX),
        }
    }

    fn at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    fn contains(&self, t: Instant) -> bool {
        let t = self.at(t);
        t >= self.start.load(Ordering::Relaxed) && t < self.end.load(Ordering::Relaxed)
    }

    fn over(&self, t: Instant) -> bool {
        self.at(t) >= self.end.load(Ordering::Relaxed)
    }
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

async fn phase(
    n: usize,
    fleet: &Fleet,
    settings: &Settings,
    bin: &Path,
    kubeconfig: &Path,
    tls: &Pki,
) -> Result<PhaseResult> {
    // Start from no proposals, so every phase learns the same edges anew.
    fleet
        .apps_ns
        .api::<WorkloadNetworkPolicyProposal>()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("deleting the previous phase's proposals")?;
    let logs = run::workspace_root().join("target/bench");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log = logs.join(format!("fleet-controller-{n}.log"));
    let mut controller = Controller::start(bin, kubeconfig, fleet, settings, tls, &log)?;
    controller
        .wait_ready()
        .await
        .with_context(|| format!("controller log: {}", log.display()))?;
    let endpoint = format!("https://127.0.0.1:{}", controller.ingest_port);
    let ca = Certificate::from_pem(&tls.ca);
    let agents = &fleet.agents[..n];

    // First connects: open a stream (the controller authenticates before answering) and drop it.
    let reviews0 = api_token_reviews(&fleet.client).await;
    let t = Instant::now();
    let firsts: Vec<Result<()>> = futures::stream::iter(agents.iter().map(|a| {
        let (endpoint, ca) = (endpoint.clone(), ca.clone());
        async move {
            let (_channel, tx, _acks) = open(&endpoint, ca, a).await?;
            drop(tx);
            Ok(())
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .collect()
    .await;
    let connect_seconds = t.elapsed().as_secs_f64();
    let first_failures = firsts.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = firsts.into_iter().find(|r| r.is_err()) {
        println!("    {first_failures} first connects failed, e.g. {e:#}");
    }
    let reviews1 = api_token_reviews(&fleet.client).await;

    // Reconnects, kept: the streams of the phase.
    let window = Arc::new(Window::new());
    let interval = Duration::from_millis(settings.batch_ms);
    let per_batch = settings.records_per_batch();
    let opened: Vec<Result<_>> = futures::stream::iter(agents.iter().enumerate().map(|(i, a)| {
        let (endpoint, ca) = (endpoint.clone(), ca.clone());
        async move { open(&endpoint, ca, a).await.map(|s| (i, s)) }
    }))
    .buffer_unordered(CONCURRENCY)
    .collect()
    .await;
    let reviews2 = api_token_reviews(&fleet.client).await;
    let mut tasks = Vec::new();
    let mut open_failures = Vec::new();
    for r in opened {
        match r {
            Ok((i, (channel, tx, acks))) => {
                let mix = Mix::new(
                    &agents[i],
                    fleet.pod_ips.clone(),
                    fleet.services.clone(),
                    i as u64,
                );
                let window = window.clone();
                let node = agents[i].node.clone();
                let new_edge_every = settings.new_edge_every;
                let new_edge_turn = if settings.new_edges_spread && new_edge_every > 0 {
                    i as u64 % new_edge_every
                } else {
                    0
                };
                // Spread the agents' batches over the interval, as real agents' timers are.
                let offset = interval.mul_f64((i as f64 * 0.618_034) % 1.0);
                tasks.push(tokio::spawn(async move {
                    let _channel = channel;
                    agent_loop(
                        node,
                        mix,
                        tx,
                        acks,
                        window,
                        interval,
                        offset,
                        per_batch,
                        (new_edge_every, new_edge_turn),
                    )
                    .await
                }));
            }
            Err(e) => open_failures.push(format!("{e:#}")),
        }
    }
    if !open_failures.is_empty() {
        println!(
            "    {} streams could not be opened, e.g. {}",
            open_failures.len(),
            open_failures[0]
        );
    }

    tokio::time::sleep(Duration::from_secs(settings.warmup)).await;
    let start = Instant::now();
    let metrics0 = controller.metrics().await;
    let proc0 = controller.proc();
    let self0 = ProcSample::of("/proc/self");
    let machine0 = machine_jiffies();
    window.start.store(window.at(start), Ordering::Relaxed);
    window.end.store(
        window.at(start + Duration::from_secs(settings.seconds)),
        Ordering::Relaxed,
    );
    // The API server's own latency meanwhile: a GET of a small object every 250 ms.
    let probe = {
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(fleet.client.clone());
        let name = fleet.apps_ns.name.clone();
        let end = start + Duration::from_secs(settings.seconds);
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                if api.get(&name).await.is_ok() {
                    samples.push(t.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            samples
        })
    };
    tokio::time::sleep(Duration::from_secs(settings.seconds)).await;
    let elapsed = start.elapsed().as_secs_f64();
    let mut api_gets = probe.await.unwrap_or_default();
    api_gets.sort_unstable();
    let metrics1 = controller.metrics().await;
    let proc1 = controller.proc();
    let self1 = ProcSample::of("/proc/self");
    let machine1 = machine_jiffies();

    // The agents stop sending at the end of the window and wait for their last acks.
    let drain = Duration::from_secs(10 + 3 * settings.flush_seconds);
    let mut outcomes = Vec::new();
    for task in tasks {
        match tokio::time::timeout(drain, task).await {
            Ok(Ok(o)) => outcomes.push(o),
            Ok(Err(e)) => bail!("an agent task failed: {e}"),
            Err(_) => bail!("an agent did not finish within {drain:?} of the window's end"),
        }
    }
    let metrics2 = controller.metrics().await;
    let rss_mib = controller.proc().hwm_mib;
    controller.stop().await;
    let proposals = fleet
        .apps_ns
        .api::<WorkloadNetworkPolicyProposal>()
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let proposal_kib = proposals
        .iter()
        .map(|p| serde_json::to_vec(p).map_or(0, |v| v.len()))
        .sum::<usize>() as f64
        / 1024.0;

    let counter = |text: &str, name: &str, labels: &[&str]| {
        metric_sum(text, &format!("network_enforcer_controller_{name}"), labels)
    };
    let writes = |t: &str| {
        counter(t, "proposal_writes_total", &["result=\"created\""])
            + counter(t, "proposal_writes_total", &["result=\"updated\""])
    };
    let refused_streams = (counter(&metrics2, "batches_refused_total", &[])
        - counter(&metrics0, "batches_refused_total", &[])) as u64
        + open_failures.len() as u64
        + first_failures as u64;
    let mut latencies: Vec<Duration> = outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let pct = |p: f64| percentile_ms(&latencies, p);
    let secs = settings.seconds as f64;
    let per_agent: Vec<f64> = outcomes
        .iter()
        .map(|o| o.accepted_in_window as f64 / secs)
        .collect();
    let target = f64::from(settings.rate);
    let skipped: u64 = outcomes.iter().map(|o| o.skipped).sum();
    if skipped > 0 {
        println!("    {skipped} batches not sent on time (the stream was backed up)");
    }
    Ok(PhaseResult {
        agents: n,
        records_per_sec: outcomes
            .iter()
            .map(|o| o.accepted_in_window as f64)
            .sum::<f64>()
            / secs,
        offered_per_sec: outcomes
            .iter()
            .map(|o| o.offered_in_window as f64)
            .sum::<f64>()
            / secs,
        min_agent_per_sec: if per_agent.len() < n {
            0.0
        } else {
            per_agent.iter().copied().fold(f64::INFINITY, f64::min)
        },
        sustaining: per_agent
            .iter()
            .filter(|r| **r >= target * SUSTAINED)
            .count(),
        p50_ms: pct(50.0),
        p99_ms: pct(99.0),
        cpu_cores: (proc1.cpu_seconds - proc0.cpu_seconds) / elapsed,
        rss_mib,
        writes_per_sec: (writes(&metrics1) - writes(&metrics0)) / elapsed,
        write_ms: {
            let d = |name: &str| counter(&metrics1, name, &[]) - counter(&metrics0, name, &[]);
            let count = d("proposal_write_duration_seconds_count");
            if count > 0.0 {
                d("proposal_write_duration_seconds_sum") / count * 1000.0
            } else {
                0.0
            }
        },
        reviews_first: (reviews1 - reviews0) / n as f64,
        reviews_reconnect: (reviews2 - reviews1) / n as f64,
        connect_seconds,
        api_get_p50_ms: percentile_ms(&api_gets, 50.0),
        api_get_p99_ms: percentile_ms(&api_gets, 99.0),
        proposals: proposals.len(),
        proposal_kib,
        simulator_cores: (self1.cpu_seconds - self0.cpu_seconds) / elapsed,
        machine_cores: (machine1.0 - machine0.0) / (machine1.1 - machine0.1).max(1.0)
            * std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64),
        refused_streams,
        rejected: outcomes.iter().map(|o| o.rejected).sum(),
        evidence_dropped: (counter(&metrics2, "evidence_records_dropped_total", &[])
            - counter(&metrics0, "evidence_records_dropped_total", &[]))
            as u64,
        unacked: outcomes.iter().map(|o| o.unacked).sum(),
        first_error: outcomes.iter().find_map(|o| o.error.clone()),
    })
}

/// The `p`th percentile of sorted `samples`, in milliseconds (NaN without samples).
fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[i.clamp(1, samples.len()) - 1].as_secs_f64() * 1000.0
}

type Opened = (
    Channel,
    mpsc::Sender<FlowBatch>,
    tonic::Streaming<uplink::BatchAck>,
);

/// Dials the controller (own TCP + TLS connection) and opens the agent's stream; returns once the
/// controller has authenticated it (it answers the stream's headers after the TokenReview).
async fn open(endpoint: &str, ca: Certificate, agent: &AgentSpec) -> Result<Opened> {
    let channel = Endpoint::from_shared(endpoint.to_string())?
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(ca)
                .domain_name(SERVER_NAME),
        )?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .context("connecting")?;
    let (tx, rx) = mpsc::channel::<FlowBatch>(2);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {}", agent.token).parse()?);
    let acks = FlowUplinkClient::new(channel.clone())
        .max_decoding_message_size(8 * 1024 * 1024)
        .stream(request)
        .await
        .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    Ok((channel, tx, acks))
}

/// One simulated agent: a batch every `interval` until the window is over, then its last acks.
#[allow(clippy::too_many_arguments)]
async fn agent_loop(
    node: String,
    mut mix: Mix,
    tx: mpsc::Sender<FlowBatch>,
    mut acks: tonic::Streaming<uplink::BatchAck>,
    window: Arc<Window>,
    interval: Duration,
    offset: Duration,
    per_batch: usize,
    (new_edge_every, new_edge_turn): (u64, u64),
) -> AgentOutcome {
    let mut out = AgentOutcome::default();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sequence = 0u64;
    // Sent batches waiting for their ack: sequence, send time, inside the window.
    let mut inflight: VecDeque<(u64, Instant, bool)> = VecDeque::new();
    let mut sending = Some(tx);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick(), if sending.is_some() => {
                let now = Instant::now();
                if window.over(now) {
                    // Closing our side ends the stream once the controller has acked the rest.
                    sending = None;
                    deadline = Some(tokio::time::Instant::now() + Duration::from_secs(8));
                    if inflight.is_empty() {
                        break;
                    }
                    continue;
                }
                let in_window = window.contains(now);
                sequence += 1;
                let new_edge = new_edge_every > 0
                    && (sequence + new_edge_turn).is_multiple_of(new_edge_every);
                let batch = FlowBatch {
                    sequence,
                    node: node.clone(),
                    records: mix.records(per_batch, new_edge),
                };
                if in_window {
                    out.offered_in_window += per_batch as u64;
                }
                match sending.as_ref().expect("sending").try_send(batch) {
                    Ok(()) => {
                        inflight.push_back((sequence, now, in_window));
                        out.sent_in_window += u64::from(in_window);
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => out.skipped += 1,
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                }
            }
            message = acks.message() => match message {
                Ok(Some(ack)) => {
                    let now = Instant::now();
                    // An acknowledgement names one batch, and they may come out of order: a batch
                    // that teaches nothing new goes before an earlier one waiting for its write.
                    let acked = inflight.iter().position(|&(seq, _, _)| seq == ack.sequence);
                    if let Some((_, sent, in_window)) = acked.and_then(|i| inflight.remove(i)) {
                        if in_window {
                            out.latencies.push(now - sent);
                            out.accepted_in_window += u64::from(ack.accepted);
                        }
                    }
                    out.rejected += u64::from(ack.rejected);
                    if ack.rejected > 0 && out.error.is_none() {
                        out.error = Some(format!("rejected records: {}", ack.reason));
                    }
                    if sending.is_none() && inflight.is_empty() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    out.error = Some(format!("{:?}: {}", status.code(), status.message()));
                    break;
                }
            },
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => break,
        }
    }
    // Never acknowledged: counted, and in the latency samples as at least the time waited.
    let now = Instant::now();
    for (_, sent, in_window) in inflight {
        if in_window {
            out.unacked += 1;
            out.latencies.push(now - sent);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// What the agents send.

/// One agent's traffic mix over the pods of its node.
struct Mix {
    locals: Vec<(LocalPod, usize)>,
    pod_ips: Arc<Vec<(Ipv4Addr, usize)>>,
    services: Arc<Vec<Ipv4Addr>>,
    state: u64,
    next_local: usize,
}

impl Mix {
    fn new(
        agent: &AgentSpec,
        pod_ips: Arc<Vec<(Ipv4Addr, usize)>>,
        services: Arc<Vec<Ipv4Addr>>,
        seed: u64,
    ) -> Self {
        Self {
            locals: agent.pods.clone(),
            pod_ips,
            services,
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            next_local: 0,
        }
    }

    /// xorshift64*.
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `n` records seen just now: 55% outbound to pods, 15% inbound from pods, 15% to Service
    /// ClusterIPs, 10% to external addresses ([`EXTERNAL_PEERS`] of them), 5% UDP to pods; with `new_edge`, the first
    /// goes to a pod on a port in 20000.. (a rule the fleet may not have learned yet).
    fn records(&mut self, n: usize, new_edge: bool) -> Vec<FlowRecord> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let mut records = Vec::with_capacity(n);
        for i in 0..n {
            let (local, local_app) = self.locals[self.next_local % self.locals.len()].clone();
            self.next_local += 1;
            let r = self.next();
            let kind = r % 100;
            let (peer_ip, peer_app) = self.pod_ips[(r >> 8) as usize % self.pod_ips.len()];
            use uplink::{Direction as D, Protocol as P};
            let (peer, port, protocol, direction) = if i == 0 && new_edge {
                (
                    peer_ip,
                    20_000 + (r >> 32) % NEW_EDGE_PORTS,
                    P::Tcp,
                    D::Outbound,
                )
            } else if kind < 55 {
                (peer_ip, 8000 + peer_app as u64, P::Tcp, D::Outbound)
            } else if kind < 70 {
                (peer_ip, 8000 + local_app as u64, P::Tcp, D::Inbound)
            } else if kind < 85 {
                let svc = self.services[(r >> 8) as usize % self.services.len()];
                (svc, 80, P::Tcp, D::Outbound)
            } else if kind < 95 {
                (
                    Ipv4Addr::new(203, 0, 113, ((r >> 8) % EXTERNAL_PEERS) as u8 + 1),
                    443,
                    P::Tcp,
                    D::Outbound,
                )
            } else {
                (peer_ip, 5353, P::Udp, D::Outbound)
            };
            let outcome = if protocol == P::Udp {
                uplink::Outcome::Datagram
            } else {
                uplink::Outcome::Established
            };
            records.push(FlowRecord {
                local: Some(local),
                peer_ip: peer.octets().to_vec(),
                port: port as u32,
                protocol: protocol as i32,
                direction: direction as i32,
                outcome: outcome as i32,
                first_seen_ms: now - 900,
                last_seen_ms: now,
                count: 1 + (r >> 40) % 8,
                source: uplink::Source::Ebpf as i32,
                ..FlowRecord::default()
            });
        }
        records
    }
}
