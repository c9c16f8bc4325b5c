//! Starting the agent's parts before the loop: the metrics and health endpoint, the enforcement, the
//! pod watch and the peers' names.

use super::{EnforcementMode, RunArgs};
use crate::debug::peers;
use crate::enforce::{self, nft};
use crate::identity::pod_watch::{self, SharedAttributor};
use crate::metrics::AgentMetrics;
use anyhow::{Context, Result};
use std::net::SocketAddr;

/// The addresses of the metrics and health endpoint: --metrics-address, else each --listen-address with
/// --metrics-port.
pub(super) fn endpoint_addresses(args: &RunArgs) -> Vec<SocketAddr> {
    match args.metrics_address {
        Some(address) => vec![address],
        None => args
            .listen_address
            .iter()
            .map(|ip| SocketAddr::new(*ip, args.metrics_port))
            .collect(),
    }
}

/// Binds the metrics and health endpoint on each of its addresses.
pub(super) async fn bind_endpoints(
    args: &RunArgs,
) -> Result<Vec<(SocketAddr, tokio::net::TcpListener)>> {
    let addresses = endpoint_addresses(args);
    anyhow::ensure!(
        !addresses.is_empty(),
        "no address for the metrics and health endpoint: give --listen-address (NE_LISTEN_ADDRESS)"
    );
    let mut listeners = Vec::new();
    for address in addresses {
        let listener = tokio::net::TcpListener::bind(address).await.with_context(|| {
            format!(
                "binding the metrics and health endpoint to {address}: --listen-address \
                 (NE_LISTEN_ADDRESS, chart value agent.listenAddresses) must name addresses of this host \
                 (the chart's default is the node IP from status.hostIP, and 127.0.0.1), and the port \
                 (--metrics-port, NE_METRICS_PORT, chart value agent.metricsPort) must be free on them"
            )
        })?;
        listeners.push((address, listener));
    }
    Ok(listeners)
}

/// The enforcement settings when it is on; a missing node name is an error then (the agent would not
/// know which pods to isolate).
pub(super) fn enforcement_config(args: &RunArgs) -> Result<Option<enforce::watch::Config>> {
    let e = &args.enforcement;
    if e.enforcement == EnforcementMode::Off {
        return Ok(None);
    }
    let node = args
        .node_name
        .clone()
        .context("--enforcement networkpolicy needs the node name: --node-name or NODE_NAME")?;
    let daemonset = match &e.daemonset {
        Some(text) => {
            let (namespace, name) = text
                .split_once('/')
                .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
                .with_context(|| format!("--daemonset {text:?}: expected namespace/name"))?;
            Some((namespace.to_string(), name.to_string()))
        }
        None => None,
    };
    let dns_hold = (e.enforcement_dns_hold_queue != 0).then_some((
        e.enforcement_dns_hold_queue,
        e.enforcement_dns_hold_query_group,
    ));
    if dns_hold.is_some() {
        anyhow::ensure!(
            e.enforcement_dns_hold_query_group != e.enforcement_log_group,
            "--enforcement-dns-hold-query-group {} is also the --enforcement-log-group: an NFLOG group has \
             one reader, give the DNS hold's queries a group of their own",
            e.enforcement_dns_hold_query_group
        );
        nft::valid_table_name(&enforce::nft::dns_hold_table(&e.enforcement_table)).map_err(|why| {
            anyhow::anyhow!("the DNS hold's table: {why}; use a shorter --enforcement-table or --enforcement-dns-hold-queue 0")
        })?;
    }
    Ok(Some(enforce::watch::Config {
        node,
        table: e.enforcement_table.clone(),
        fail_open: e.enforcement_fail_open,
        log_group: (e.enforcement_log_group != 0).then_some(e.enforcement_log_group),
        daemonset,
        // Where new pods' addresses are read before the API server has them; without it (no cgroup v2
        // found) they come from the API server only.
        pods_cgroup: match crate::kernel::host::NodeCgroups::detect() {
            Ok(cgroups) => Some(cgroups.pods_dir()),
            Err(error) => {
                tracing::warn!(%error, "no cgroup v2 tree: new pods are enforced once the API server reports their addresses");
                None
            }
        },
        dns_hold,
    }))
}

/// Starts enforcement; it needs the Kubernetes API (the policies are there), so without it the agent
/// does not start.
pub(super) async fn start_enforcement(
    config: enforce::watch::Config,
    metrics: &AgentMetrics,
    records: crate::sources::RecordSink,
) -> Result<(kube::Client, enforce::watch::Config, enforce::watch::Handle)> {
    let client = pod_watch::client().await.map_err(|e| {
        anyhow::anyhow!(
            "NetworkPolicy enforcement needs the Kubernetes API (in-cluster or kubeconfig): {e}"
        )
    })?;
    tracing::info!(node = %config.node, table = %config.table, fail_open = config.fail_open,
        "NetworkPolicy enforcement on");
    metrics.enforcement_enabled();
    let handle = enforce::watch::spawn(
        client.clone(),
        config.clone(),
        metrics.enforcement(),
        records,
    );
    Ok((client, config, handle))
}

/// With enforcement off, a table left by an earlier agent that enforced would keep enforcing
/// policies nobody updates: remove it.
pub(super) fn clear_leftover_table(table: &str) {
    match nft::clear_all(table) {
        Ok(true) => tracing::warn!(
            table,
            "enforcement is off: removed the enforcement table an earlier agent left"
        ),
        Ok(false) => {}
        // No nft binary or no right to use it: then no table of ours can exist either.
        Err(e) => tracing::debug!(error = %e, "could not look for a leftover enforcement table"),
    }
}

/// Starts the pod watch when this node's name and a Kubernetes API configuration are known; otherwise
/// says why pods will be named by UID only.
pub(super) async fn start_pod_watch(
    node: Option<&str>,
    attributor: &SharedAttributor,
    metrics: &AgentMetrics,
) -> Option<tokio::task::JoinHandle<()>> {
    let Some(node) = node else {
        tracing::info!("no --node-name/NODE_NAME: no pod watch; pods are attributed by UID only");
        return None;
    };
    match pod_watch::client().await {
        Ok(client) => {
            tracing::info!(%node, "pod watch on (spec.nodeName={node})");
            metrics.pod_watch_enabled();
            Some(pod_watch::spawn(
                client,
                node.to_string(),
                attributor.clone(),
                metrics.pod_watch(),
            ))
        }
        Err(err) => {
            tracing::warn!(
                %err,
                "no Kubernetes API configuration (in-cluster or kubeconfig): no pod watch; pods are attributed by UID only"
            );
            None
        }
    }
}

/// Starts the watches naming peer addresses in `flows` (pods, Services, nodes cluster-wide; see
/// `debug::peers`) where the pod watch runs: in a cluster, with the node's name and API access.
/// Elsewhere peers are shown as addresses.
pub(super) async fn start_peer_names(node: Option<&str>) -> Option<peers::SharedPeers> {
    node?;
    match pod_watch::client().await {
        Ok(client) => {
            let directory = peers::SharedPeers::default();
            peers::spawn(client, directory.clone());
            tracing::info!(
                max_addresses = peers::MAX_ADDRESSES,
                "flows names peers (pods, Services, nodes)"
            );
            Some(directory)
        }
        // start_pod_watch has said why already.
        Err(_) => None,
    }
}
