//! The read-only web view (docs/ui.md): the controller serves, on its own port (`--ui-address`,
//! default `127.0.0.1:8090`), a cluster overview, a graph of each namespace's workloads and flows, a
//! page per workload with its proposals, policies, violations and the `kubectl` commands that promote
//! or acknowledge, and a proposal diff; the pages read the JSON API under `/api/v1/`.
//!
//! - [`objects`]: where the data comes from (watches of policies and proposals).
//! - [`overview`], [`graph_view`], [`workload_view`], [`proposal_diff`], [`cluster_view`]: pure
//!   functions from objects to answers; [`explain_view`]: one edge explained by an [`Explainer`]
//!   (the checker, wired in by the app).
//! - [`server`]: the routes, bounds, errors and metrics.
//!
//! Nothing here writes to the cluster: the controller's role needs only list and watch for it.

pub mod cluster_view;
pub mod explain_view;
pub mod graph_view;
pub mod objects;
pub mod overview;
pub mod proposal_diff;
pub mod server;
pub mod workload_view;

pub use explain_view::Explainer;
pub use objects::{ObjectSource, PolicyObject, Reflected, Snapshot};
pub use server::{EdgeSource, UiMetrics, UiState, router, serve};

#[cfg(test)]
mod tests;

use crate::cluster::shared_watch::PolicyObjects;
use crate::runtime::metrics::ControllerMetrics;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Why the web view could not start.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("--ui-address {0:?} is not an address:port (empty turns the web view off)")]
    Address(String),
    #[error("binding --ui-address {address}: {source}")]
    Bind {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The server future: runs until the process ends (never ends when the view is off).
pub type Serving = Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;

/// Binds `address` (empty: the view is off), starts the shared watches of `objects` it reads and
/// returns the server to run, answering observed edges from `edges` and explaining flows with
/// `explainer`; its metrics go on `metrics`.
pub async fn start(
    address: &str,
    client: kube::Client,
    objects: &PolicyObjects,
    edges: Arc<dyn EdgeSource>,
    explainer: Arc<dyn Explainer>,
    metrics: &ControllerMetrics,
) -> Result<Serving, UiError> {
    if address.trim().is_empty() {
        tracing::info!("web view off (--ui-address '')");
        return Ok(Box::pin(std::future::pending()));
    }
    let address: std::net::SocketAddr = address
        .trim()
        .parse()
        .map_err(|_| UiError::Address(address.to_string()))?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| UiError::Bind { address, source })?;
    let ui_metrics = UiMetrics::default();
    ui_metrics.register(metrics);
    let source = Reflected::start(client, objects);
    tracing::info!(%address, "serving the web view (read-only) and its API under /api/v1/");
    let mut state = UiState::new(source, ui_metrics)
        .with_edges(edges)
        .with_explainer(explainer);
    if address.ip().is_loopback() {
        // Reached through kubectl port-forward: requests name localhost.
        state = state.loopback_hosts_only();
    }
    Ok(Box::pin(serve(listener, state)))
}
