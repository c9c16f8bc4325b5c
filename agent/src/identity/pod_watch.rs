//! The pod watch: this node's pods (field selector `spec.nodeName=<node>`) from the API server, fed into
//! the [`Attributor`] so records carry namespace and name, not only the UID.
//!
//! Thin I/O around [`crate::identity::attribution`]: a kube-rs watcher with the default backoff (errors are counted
//! in `network_enforcer_agent_pod_watch_errors_total`, logged, and retried; the watch never ends the
//! agent). A restarted watch lists again, and pods missing from the new list are deleted
//! ([`Attributor::relist_start`]). Without API access (no kubeconfig and not in a pod) the agent keeps
//! attributing by UID only.

use crate::clock::monotonic_now;
use crate::identity::attribution::{Attributor, PodInfo};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use network_enforcer_api::pod;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::{Arc, Mutex};

/// The attribution state shared by the watch (writer) and the event loop (reader).
pub type SharedAttributor = Arc<Mutex<Attributor>>;

/// The watch's metrics (registered by [`crate::metrics::AgentMetrics`]).
#[derive(Clone, Debug, Default)]
pub struct PodWatchCounters {
    /// Watch or list errors (each followed by a retry with backoff).
    pub errors: Counter,
    /// Pod events applied.
    pub events: Counter,
    /// Pods of this node known now.
    pub pods: Gauge,
    /// 1 once the first list of this node's pods is complete (for `/readyz`).
    pub synced: Gauge,
}

/// What the attribution needs of a pod; `None` for a pod without a UID (never sent by an API server).
/// A pod that has finished (phase Succeeded or Failed) has given its IP back: it keeps its name but no
/// longer holds an IP, so a new pod that gets the IP is not confused with it.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let uid = pod.metadata.uid.clone()?;
    let ips = if pod::finished(pod) {
        Vec::new()
    } else {
        pod::ips(pod)
    };
    Some(PodInfo {
        uid,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        ips,
        host_network: pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false),
    })
}

/// A client from the usual places (`KUBECONFIG`, `~/.kube/config`, the in-cluster ServiceAccount), or
/// why there is none.
pub async fn client() -> Result<Client, String> {
    let config = kube::Config::infer().await.map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Watches the pods of `node` until the task is aborted.
pub fn spawn(
    client: Client,
    node: String,
    attributor: SharedAttributor,
    counters: PodWatchCounters,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(watch(client, node, attributor, counters))
}

async fn watch(
    client: Client,
    node: String,
    attributor: SharedAttributor,
    counters: PodWatchCounters,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher::watcher(Api::<Pod>::all(client), config)
        .default_backoff()
        .boxed();
    let mut synced = false;
    while let Some(event) = events.next().await {
        let now = monotonic_now();
        // A poisoned lock means a panic elsewhere already; keep serving with the state as it is.
        let mut state = attributor.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Ok(Event::Init) => state.relist_start(),
            Ok(Event::InitApply(pod) | Event::Apply(pod)) => {
                counters.events.inc();
                if let Some(info) = pod_info(&pod) {
                    state.apply(info, now);
                }
            }
            Ok(Event::Delete(pod)) => {
                counters.events.inc();
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    state.delete(uid, now);
                }
            }
            Ok(Event::InitDone) => {
                state.relist_done(now);
                if !synced {
                    synced = true;
                    counters.synced.set(1);
                    tracing::info!(%node, pods = state.live_pods(), "pod watch synced");
                }
            }
            Err(error) => {
                counters.errors.inc();
                tracing::warn!(%node, %error, "pod watch failed; retrying with backoff");
            }
        }
        counters.pods.set(state.live_pods() as i64);
    }
}
