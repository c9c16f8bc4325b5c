//! `check --from-cluster`: the scenario as the cluster is now. Namespaces, pods, NetworkPolicies and
//! WorkloadNetworkPolicies come from the API server; the flows are the observed edges the controller
//! keeps for the protect gate (docs/api.md, "Protect gate"), read from its web view API
//! (`/api/v1/namespaces/<ns>/edges`, reached with `kubectl port-forward`). Each edge is evaluated
//! between a current pod of each of its workloads (or its address), as the gate replays it.
//!
//! [`scenario`] and [`explain_flow`] are pure; [`load`] and [`load_flow`] do the I/O.

use super::{Scenario, ScenarioFlow, ScenarioNamespace, ScenarioPeer, ScenarioPod, ScenarioPort};
use crate::cluster::workload::JobOwners;
use crate::monitor::edge_history::HistoryEdge;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
use network_enforcer_api::{Protocol, WorkloadNetworkPolicy, WorkloadRef, pod};
use std::collections::BTreeSet;
use std::time::Duration;

/// The longest the controller's API may take to answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// What the cluster and the controller hold now.
#[derive(Clone, Debug, Default)]
pub struct LiveInput {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    /// The Jobs of the same namespaces: which CronJob a Job's pods belong to.
    pub jobs: Vec<Job>,
    pub network_policies: Vec<NetworkPolicy>,
    /// Empty when the cluster has no ClusterNetworkPolicy CRD.
    pub cluster_policies: Vec<ClusterNetworkPolicy>,
    pub policies: Vec<WorkloadNetworkPolicy>,
    pub edges: Vec<HistoryEdge>,
    /// The controller left edges out (more than its API answers).
    pub truncated: bool,
}

/// Why the live scenario could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("listing {what}: {source}")]
    Kube {
        what: &'static str,
        source: kube::Error,
    },
    #[error(
        "reading the observed edges from the controller's web view at {url}: {message} (reach it with \
         `kubectl port-forward -n <release namespace> deploy/<release>-network-enforcer-controller 8090`, \
         or give --controller-url)"
    )]
    Controller { url: String, message: String },
}

/// The edges route's answer.
#[derive(serde::Deserialize)]
struct EdgesAnswer {
    edges: Vec<HistoryEdge>,
    #[serde(default)]
    truncated: bool,
}

/// Reads the objects of `namespace` and the namespaces its edges reach, and the edges, from the
/// controller's web view at `controller_url` (e.g. `http://127.0.0.1:8090`).
pub async fn load(
    client: &kube::Client,
    namespace: &str,
    controller_url: &str,
) -> Result<LiveInput, LiveError> {
    let url = format!(
        "{}/api/v1/namespaces/{namespace}/edges",
        controller_url.trim_end_matches('/')
    );
    let answer = fetch_edges(&url)
        .await
        .map_err(|message| LiveError::Controller {
            url: url.clone(),
            message,
        })?;
    load_objects(client, namespace, answer.edges, answer.truncated).await
}

/// What evaluating one flow from `from` to `to` needs: the objects of the namespaces of both ends
/// (the web view's explain panel, docs/ui.md).
pub async fn load_flow(
    client: &kube::Client,
    from: &WorkloadRef,
    to: &WorkloadRef,
    protocol: Protocol,
    port: u16,
) -> Result<LiveInput, LiveError> {
    let edge = HistoryEdge::flow(from.clone(), to.clone(), protocol, port);
    let namespace = [from, to]
        .into_iter()
        .map(|side| side.namespace.clone())
        .find(|ns| !ns.is_empty())
        .unwrap_or_default();
    load_objects(client, &namespace, vec![edge], false).await
}

/// The objects of `namespace` and of the namespaces `edges` reach, with `edges`.
async fn load_objects(
    client: &kube::Client,
    namespace: &str,
    edges: Vec<HistoryEdge>,
    truncated: bool,
) -> Result<LiveInput, LiveError> {
    use kube::api::{Api, ListParams};
    let mut namespaces_used: BTreeSet<String> = BTreeSet::new();
    namespaces_used.insert(namespace.to_string());
    for edge in &edges {
        for side in [&edge.source, &edge.destination] {
            if side.address.is_empty() && !side.namespace.is_empty() {
                namespaces_used.insert(side.namespace.clone());
            }
        }
    }
    namespaces_used.remove("");
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| LiveError::Kube {
            what: "namespaces",
            source,
        })?
        .items;
    let mut input = LiveInput {
        namespaces,
        edges,
        truncated,
        ..LiveInput::default()
    };
    input.cluster_policies = list_cluster_policies(client).await?;
    for ns in &namespaces_used {
        input.pods.extend(list_in(client, ns, "pods").await?);
        input.jobs.extend(list_in(client, ns, "jobs").await?);
        input
            .network_policies
            .extend(list_in(client, ns, "networkpolicies").await?);
        input
            .policies
            .extend(list_in(client, ns, "workloadnetworkpolicies").await?);
    }
    Ok(input)
}

/// Every `K` in namespace `ns` (`what` names them in the error).
async fn list_in<K>(
    client: &kube::Client,
    ns: &str,
    what: &'static str,
) -> Result<Vec<K>, LiveError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    kube::Api::<K>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| LiveError::Kube { what, source })
}

/// Every ClusterNetworkPolicy; none when the cluster does not serve the kind (no CRD installed).
async fn list_cluster_policies(
    client: &kube::Client,
) -> Result<Vec<ClusterNetworkPolicy>, LiveError> {
    match kube::Api::<ClusterNetworkPolicy>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(source) => Err(LiveError::Kube {
            what: "clusternetworkpolicies",
            source,
        }),
    }
}

/// One GET of the edges route: its answer, or what went wrong.
async fn fetch_edges(url: &str) -> Result<EdgesAnswer, String> {
    use http_body_util::BodyExt as _;
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// is served (the web view has no TLS; use a port-forward)".into());
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let response = tokio::time::timeout(FETCH_TIMEOUT, client.get(uri))
        .await
        .map_err(|_| format!("no answer within {FETCH_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = tokio::time::timeout(FETCH_TIMEOUT, response.into_body().collect())
        .await
        .map_err(|_| format!("no answer within {FETCH_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    serde_json::from_slice(&body).map_err(|e| format!("an answer that is not the edges: {e}"))
}

/// The scenario `input` makes, and how many edges were left out because a workload of theirs has no
/// pod now (or an address did not parse).
pub fn scenario(input: &LiveInput) -> (Scenario, usize) {
    let pods: Vec<&Pod> = input.pods.iter().filter(|p| evaluable(p)).collect();
    let jobs = JobOwners::new(&input.jobs);
    let mut scenario = Scenario {
        namespaces: input
            .namespaces
            .iter()
            .map(|ns| ScenarioNamespace {
                name: ns.name_any(),
                labels: ns.labels().clone(),
            })
            .collect(),
        pods: pods.iter().map(|p| scenario_pod(p)).collect(),
        policies: Vec::new(),
        flows: Vec::new(),
    };
    for cnp in &input.cluster_policies {
        if let Ok(v) = serde_json::to_value(cnp) {
            scenario.policies.push(v);
        }
    }
    // Our rendered NetworkPolicies are in the list too: the checker replaces them by their policy.
    for np in &input.network_policies {
        if let Ok(v) = serde_json::to_value(np) {
            scenario.policies.push(v);
        }
    }
    for p in input
        .policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        if let Ok(v) = serde_json::to_value(p) {
            scenario.policies.push(v);
        }
    }
    let mut skipped = 0;
    for edge in &input.edges {
        match (
            peer(&pods, &jobs, &edge.source),
            peer(&pods, &jobs, &edge.destination),
        ) {
            (Some(from), Some(to)) => scenario.flows.push(ScenarioFlow {
                // Only a destination is named (the name its source resolved it from).
                from: ScenarioPeer { name: None, ..from },
                to,
                protocol: edge.protocol,
                port: edge.port,
            }),
            _ => skipped += 1,
        }
    }
    (scenario, skipped)
}

/// How the one flow of `input` ([`load_flow`]) is decided, side by side, with the scenario that
/// reproduces it offline (`check --scenario FILE --explain`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct FlowExplanation {
    pub allowed: bool,
    /// [`super::explain::explanation_text`] of each side.
    pub egress: String,
    pub ingress: String,
    pub scenario: Scenario,
}

/// Why a flow could not be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0} has no pod now: there is nothing to evaluate the flow against")]
    NoPod(String),
    #[error("the policies do not parse: {0}")]
    Invalid(String),
}

/// Explains the first edge of `input` between a current pod of each of its workloads (or its
/// address), as `check --from-cluster --explain` does.
pub fn explain_flow(input: &LiveInput) -> Result<FlowExplanation, ExplainError> {
    let (scenario, _) = scenario(input);
    let Some(edge) = input.edges.first() else {
        return Err(ExplainError::NoPod("the flow".into()));
    };
    if scenario.flows.is_empty() {
        let pods: Vec<&Pod> = input.pods.iter().filter(|p| evaluable(p)).collect();
        let jobs = JobOwners::new(&input.jobs);
        let side = if peer(&pods, &jobs, &edge.source).is_none() {
            &edge.source
        } else {
            &edge.destination
        };
        return Err(ExplainError::NoPod(describe(side)));
    }
    let scenario = only_the_flow(scenario);
    let checker = super::Checker::new(scenario.clone())
        .map_err(|e| ExplainError::Invalid(format!("{e:#}")))?;
    let report = checker.explain();
    let Some(result) = report.results.first() else {
        return Err(ExplainError::NoPod("the flow".into()));
    };
    Ok(FlowExplanation {
        allowed: result.allowed,
        egress: super::explain::explanation_text(&result.egress),
        ingress: super::explain::explanation_text(&result.ingress),
        scenario,
    })
}

/// `scenario` cut to what its first flow's verdict depends on: the two pods, their namespaces, and
/// the policies without what evaluation never reads (annotations, managed fields): the answer (and
/// the scenario it serves) shows no other pod of the cluster.
fn only_the_flow(mut scenario: Scenario) -> Scenario {
    let Some(flow) = scenario.flows.first().cloned() else {
        return scenario;
    };
    let ends: Vec<&str> = [&flow.from.pod, &flow.to.pod]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    scenario
        .pods
        .retain(|p| ends.contains(&format!("{}/{}", p.namespace, p.name).as_str()));
    let namespaces: BTreeSet<&str> = scenario.pods.iter().map(|p| p.namespace.as_str()).collect();
    scenario
        .namespaces
        .retain(|n| namespaces.contains(n.name.as_str()));
    for policy in &mut scenario.policies {
        if let Some(metadata) = policy.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            metadata.remove("annotations");
            metadata.remove("managedFields");
        }
    }
    scenario.flows.truncate(1);
    scenario
}

/// `Deployment ns/name`, or the address.
fn describe(side: &WorkloadRef) -> String {
    if side.address.is_empty() {
        format!("{} {}/{}", side.owner_kind, side.namespace, side.owner_name)
    } else {
        side.address.clone()
    }
}

/// A pod NetworkPolicies apply to, with its own address: running (or starting), not host network.
fn evaluable(pod: &Pod) -> bool {
    let spec_host = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    !spec_host && !pod::ips(pod).is_empty() && !pod::finished(pod)
}

fn scenario_pod(pod: &Pod) -> ScenarioPod {
    let spec = pod.spec.as_ref();
    ScenarioPod {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        labels: pod.labels().clone(),
        // A scenario pod has one address; the first of `status.podIPs` is the primary one.
        ip: pod::ips(pod).first().copied(),
        ports: spec
            .into_iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(ScenarioPort {
                    name: p.name.clone(),
                    container_port: u16::try_from(p.container_port).ok()?,
                    protocol: Protocol::from_kubernetes(p.protocol.as_deref())
                        .unwrap_or(Protocol::TCP),
                })
            })
            .collect(),
        service_account: spec.and_then(|s| s.service_account_name.clone()),
    }
}

/// An edge's end in the scenario: its address, or a pod of its workload (the controller's model:
/// [`JobOwners::unit`]).
fn peer(pods: &[&Pod], jobs: &JobOwners, side: &WorkloadRef) -> Option<ScenarioPeer> {
    if !side.address.is_empty() {
        return Some(ScenarioPeer {
            ip: Some(side.address.parse().ok()?),
            pod: None,
            // What the source pod resolved the address from, when it did: egressNames may allow it.
            name: Some(side.dns_name.clone()).filter(|n| !n.is_empty()),
        });
    }
    let pod = pods.iter().find(|p| {
        p.metadata.namespace.as_deref() == Some(side.namespace.as_str())
            && jobs
                .unit(p)
                .is_some_and(|w| w.kind.as_str() == side.owner_kind && w.name == side.owner_name)
    })?;
    Some(ScenarioPeer {
        pod: Some(format!("{}/{}", side.namespace, pod.name_any())),
        ip: None,
        name: None,
    })
}

#[cfg(test)]
mod tests;
