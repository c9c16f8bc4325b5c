//! The long-running tasks `run` starts besides serving: index readiness, the names' expiry, agent
//! coverage and cluster proposals. Each is a future that runs until the process stops (pending
//! forever when its flag turns it off).

use super::RunArgs;
use crate::app::App;
use crate::cluster::watches::SharedIndex;
use crate::learn::provenance::SigningKey;
use crate::monitor::coverage::{Budget, Coverage};
use crate::monitor::status_sync::StatusSync;
use crate::reconcile::Settings;
use crate::reconcile::cluster_proposals::{ClusterProposals, ProposalMetrics};
use crate::runtime::http::{Component, Health};
use crate::runtime::metrics::ControllerMetrics;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Keeps `health` ready once every watch of the index has listed.
pub async fn index_readiness(index: Arc<SharedIndex>, health: Component) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if index.ready() {
            health.ready("every watch has listed");
        } else {
            health.not_ready("listing pods, Services, workloads and nodes");
        }
    }
}

/// Ages the addresses of names out of the store (renderings follow at their requeue).
pub async fn names_expiry(names: Arc<crate::cluster::names::ResolvedNames>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        names.expire(k8s_openapi::jiff::Timestamp::now().as_millisecond());
    }
}

/// Reports nodes whose agents stopped streaming (`--agent-silence-after`; `0s`: off). Its health
/// component and gauges exist from the start, on every replica; it runs once polled (when leading).
pub fn coverage(
    args: &RunArgs,
    app: &App,
    client: &kube::Client,
    settings: &Settings,
    metrics: &ControllerMetrics,
    health: &Health,
) -> impl Future<Output = ()> + use<> {
    let health = health.component("agents", false);
    let (silent_nodes, silent_pods) = (Gauge::default(), Gauge::default());
    metrics.register(
        "agent_silent_nodes",
        "Nodes that run pods while no agent of theirs has streamed for --agent-silence-after",
        silent_nodes.clone(),
    );
    metrics.register(
        "agent_silent_pods",
        "Running pods on nodes without an agent streaming: their flows are not observed",
        silent_pods.clone(),
    );
    let dropping_nodes = Gauge::default();
    metrics.register(
        "agent_dropping_nodes",
        "Nodes whose agent said it lost flows (ring buffer full, edge caps, uplink buffer full) \
         since the coverage loop's last look",
        dropping_nodes.clone(),
    );
    let over_budget_nodes = Gauge::default();
    metrics.register(
        "agent_over_budget_nodes",
        "Nodes whose agent costs more CPU or memory than --agent-cpu-budget / \
         --agent-memory-budget-mib",
        over_budget_nodes.clone(),
    );
    let coverage = (!args.agent_silence_after.is_zero()).then(|| Coverage {
        index: app.index.clone(),
        presence: app.presence.clone(),
        client: client.clone(),
        reporter: kube::runtime::events::Reporter {
            controller: settings.reporter.clone(),
            instance: settings.instance.clone(),
        },
        after: args.agent_silence_after,
        silent_nodes,
        silent_pods,
        dropping_nodes,
        budget: Budget {
            cpu_cores: args.agent_cpu_budget.max(0.0),
            memory_bytes: args.agent_memory_budget_mib.saturating_mul(1 << 20),
        },
        over_budget_nodes,
        health,
    });
    async move {
        match coverage {
            Some(coverage) => coverage.run().await,
            None => std::future::pending().await,
        }
    }
}

/// Learns ClusterNetworkPolicyProposals from the namespace graph every `--cluster-proposals-interval`
/// (default 60 s cluster-wide, off when watching one namespace); runs once polled (when leading).
pub fn cluster_proposals(
    args: &RunArgs,
    client: &kube::Client,
    settings: &Settings,
    excluded: &BTreeSet<String>,
    history: Arc<StatusSync>,
    signing_key: Option<Arc<SigningKey>>,
    metrics: &ControllerMetrics,
) -> impl Future<Output = ()> + use<> {
    let every = args
        .cluster_proposals_interval
        .unwrap_or(if settings.namespace.is_none() {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        });
    let proposals = (!every.is_zero()).then(|| ClusterProposals {
        client: client.clone(),
        history,
        // Namespaces excluded from learning (the release's own among them) are no subjects either.
        settings: {
            let mut s = crate::learn::cluster_policies::Settings::default();
            s.system.extend(excluded.iter().cloned());
            s
        },
        every: every.max(Duration::from_secs(1)),
        signing_key,
        metrics: {
            let m = ProposalMetrics::default();
            m.register(metrics);
            m
        },
        reporter: kube::runtime::events::Reporter {
            controller: settings.reporter.clone(),
            instance: settings.instance.clone(),
        },
    });
    if let Some(p) = &proposals {
        tracing::info!(every = ?p.every, "learning ClusterNetworkPolicyProposals from the namespace graph");
    }
    async move {
        match proposals {
            Some(proposals) => proposals.run().await,
            None => std::future::pending().await,
        }
    }
}

/// A task that runs until the process stops.
pub type Task<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>;

/// What runs on the leader only: the reconcilers, the proposal flusher, the status sync, Goldmane's
/// reader, the agents' coverage and the cluster proposals.
pub fn leader_tasks<'a>(
    args: &'a RunArgs,
    client: &kube::Client,
    app: &'a App,
    setup: &super::setup::Setup,
    status_sync: &Arc<StatusSync>,
    metrics: &'a ControllerMetrics,
    health: &'a Health,
) -> Vec<Task<'a>> {
    // One watch per kind: the reconcilers, the status sync, the proposal writer and the web view
    // share the app's. The protect gate replays the flows the status sync has seen.
    let mut reconcilers =
        crate::reconcile::Reconcilers::new(client, app.objects.clone(), setup.settings.clone())
            .with_gate(crate::policy::protect_gate::GateHistory(
                status_sync.clone(),
            ));
    if let Some(changes) = app.take_name_changes() {
        reconcilers = reconcilers.with_names(app.names.clone(), changes);
    }
    let status_sync = status_sync.clone();
    vec![
        Box::pin(async move { reconcilers.run().await }),
        Box::pin(
            app.flusher
                .run(Duration::from_secs(args.flush_interval_seconds.max(1))),
        ),
        Box::pin(status_sync.clone().run()),
        Box::pin(
            args.goldmane
                .run(client.clone(), app.learning.clone(), metrics, || {
                    health.component("goldmane", false)
                }),
        ),
        Box::pin(coverage(
            args,
            app,
            client,
            &setup.settings,
            metrics,
            health,
        )),
        Box::pin(cluster_proposals(
            args,
            client,
            &setup.settings,
            &setup.excluded,
            status_sync,
            setup.signing_key.clone(),
            metrics,
        )),
    ]
}

/// Waits to lead, then runs `tasks` until one ends. Writers and reconcilers run on the leader only; a
/// replica that loses the lead exits, so that it restarts as a clean follower instead of stopping
/// its tasks halfway.
pub async fn lead(election: Option<&super::election::Election>, tasks: Vec<Task<'_>>) {
    super::election::until_leading(election).await;
    futures::future::select_all(tasks).await;
}
