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
    let edge = HistoryEdge {
        source: from.clone(),
        destination: to.clone(),
        protocol,
        port,
        first_seen_ms: 0,
        last_seen_ms: 0,
        count: 0,
    };
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
mod tests {
    use super::*;
    use network_enforcer_api::WorkloadKind;
    use serde_json::json;

    fn pod(name: &str, app: &str, ip: &str, owner: Option<(&str, &str)>) -> Pod {
        // A Deployment's ReplicaSet is `<deployment>-<pod-template-hash>`, and its pods carry the hash.
        let hash = owner
            .filter(|(kind, _)| *kind == "ReplicaSet")
            .and_then(|(_, rs)| rs.rsplit('-').next());
        let mut labels = json!({"app": app});
        if let Some(hash) = hash {
            labels["pod-template-hash"] = json!(hash);
        }
        let owners = owner.map(|(kind, name)| {
            json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "demo", "labels": labels,
                         "ownerReferences": owners},
            "spec": {"serviceAccountName": "sa", "containers": [{"name": "c", "image": "i",
                     "ports": [{"name": "http", "containerPort": 18080}, {"containerPort": 53, "protocol": "UDP"}]}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
    }

    fn side(kind: &str, name: &str) -> WorkloadRef {
        WorkloadRef {
            namespace: "demo".into(),
            owner_kind: kind.into(),
            owner_name: name.into(),
            ..WorkloadRef::default()
        }
    }

    fn edge(source: WorkloadRef, destination: WorkloadRef, port: u16) -> HistoryEdge {
        HistoryEdge {
            source,
            destination,
            protocol: Protocol::TCP,
            port,
            first_seen_ms: 0,
            last_seen_ms: 0,
            count: 1,
        }
    }

    #[test]
    fn one_flow_is_explained_side_by_side_with_the_scenario_that_reproduces_it() {
        let web = pod(
            "web-5d8f7c9b6-abcde",
            "web",
            "10.1.0.2",
            Some(("ReplicaSet", "web-5d8f7c9b6")),
        );
        let db = pod("db-0", "db", "10.1.0.3", Some(("StatefulSet", "db")));
        // The database admits only the web pods on 5432.
        let isolate: NetworkPolicy = serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "db-ingress", "namespace": "demo"},
            "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                  "ports": [{"protocol": "TCP", "port": 5432}]}]}
        }))
        .unwrap();
        let input = |port: u16, pods: Vec<Pod>| LiveInput {
            pods,
            network_policies: vec![isolate.clone()],
            edges: vec![edge(
                side("Deployment", "web"),
                side("StatefulSet", "db"),
                port,
            )],
            ..LiveInput::default()
        };
        let allowed = explain_flow(&input(5432, vec![web.clone(), db.clone()])).unwrap();
        assert!(allowed.allowed);
        assert_eq!(allowed.egress, "not isolated");
        assert!(
            allowed.ingress.contains("np/demo/db-ingress"),
            "{}",
            allowed.ingress
        );
        let denied = explain_flow(&input(6379, vec![web.clone(), db.clone()])).unwrap();
        assert!(!denied.allowed);
        assert!(
            denied.ingress.contains("no rule matches"),
            "{}",
            denied.ingress
        );
        // The scenario gives the same answer offline, through `check --scenario`'s parser.
        let text = serde_json::to_string(&denied.scenario).unwrap();
        let checker =
            crate::tools::check::Checker::new(crate::tools::check::parse_scenario(&text).unwrap())
                .unwrap();
        assert!(!checker.explain().results[0].allowed);
        // A workload with no pod now cannot be evaluated, and says which one.
        let missing = explain_flow(&input(5432, vec![web])).unwrap_err();
        assert!(
            missing.to_string().contains("StatefulSet demo/db"),
            "{missing}"
        );
    }

    #[test]
    fn edges_become_flows_between_current_pods_of_their_workloads() {
        let mut host = pod("node-agent", "agent", "10.0.0.1", None);
        host.spec.as_mut().unwrap().host_network = Some(true);
        let mut done = pod(
            "old",
            "web",
            "10.1.0.9",
            Some(("ReplicaSet", "web-5d8f7c9b6")),
        );
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let input = LiveInput {
            pods: vec![
                done,
                pod(
                    "web-5d8f7c9b6-abcde",
                    "web",
                    "10.1.0.2",
                    Some(("ReplicaSet", "web-5d8f7c9b6")),
                ),
                pod("db-0", "db", "10.1.0.3", Some(("StatefulSet", "db"))),
                pod("debug", "debug", "10.1.0.4", None),
                host,
            ],
            edges: vec![
                edge(side("Deployment", "web"), side("StatefulSet", "db"), 5432),
                edge(side("Pod", "debug"), side("Deployment", "web"), 18080),
                edge(
                    side("Deployment", "web"),
                    WorkloadRef {
                        address: "192.0.2.7".into(),
                        ..WorkloadRef::default()
                    },
                    443,
                ),
                // Reached by the name its pod resolved: the flow's destination keeps the name.
                edge(
                    side("Deployment", "web"),
                    WorkloadRef {
                        address: "192.0.2.8".into(),
                        dns_name: "api.example.test".into(),
                        ..WorkloadRef::default()
                    },
                    443,
                ),
                // No pod of it now.
                edge(
                    side("Deployment", "retired"),
                    side("StatefulSet", "db"),
                    5432,
                ),
            ],
            ..LiveInput::default()
        };
        let (scenario, skipped) = scenario(&input);
        assert_eq!(skipped, 1);
        let names: Vec<&str> = scenario.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["web-5d8f7c9b6-abcde", "db-0", "debug"],
            "evaluable pods only"
        );
        assert_eq!(scenario.pods[0].ports.len(), 2);
        assert_eq!(scenario.pods[0].service_account.as_deref(), Some("sa"));
        let flows: Vec<String> = scenario
            .flows
            .iter()
            .map(|f| {
                let end = |p: &ScenarioPeer| match (&p.pod, p.ip) {
                    (Some(pod), _) => pod.clone(),
                    (None, Some(ip)) => ip.to_string(),
                    (None, None) => "?".into(),
                };
                format!("{} -> {}:{}", end(&f.from), end(&f.to), f.port)
            })
            .collect();
        assert_eq!(
            flows,
            [
                "demo/web-5d8f7c9b6-abcde -> demo/db-0:5432",
                "demo/debug -> demo/web-5d8f7c9b6-abcde:18080",
                "demo/web-5d8f7c9b6-abcde -> 192.0.2.7:443",
                "demo/web-5d8f7c9b6-abcde -> 192.0.2.8:443",
            ]
        );
        let names: Vec<Option<&str>> = scenario
            .flows
            .iter()
            .map(|f| f.to.name.as_deref())
            .collect();
        assert_eq!(names, [None, None, None, Some("api.example.test")]);
        // The checker takes it as it is.
        super::super::Checker::new(scenario).expect("a valid scenario");
    }

    #[test]
    fn pod_addresses_are_read_as_everywhere_else() {
        // Dual stack: `podIPs` first, its first entry is the scenario pod's address.
        let mut dual = pod("dual", "web", "10.1.0.5", None);
        dual.status.as_mut().unwrap().pod_ips =
            Some(serde_json::from_value(json!([{"ip": "fd00::5"}, {"ip": "10.1.0.5"}])).unwrap());
        let input = LiveInput {
            pods: vec![dual, pod("no-address", "web", "not-an-ip", None)],
            ..LiveInput::default()
        };
        let (scenario, _) = scenario(&input);
        let pods: Vec<(&str, Option<std::net::IpAddr>)> = scenario
            .pods
            .iter()
            .map(|p| (p.name.as_str(), p.ip))
            .collect();
        assert_eq!(pods, [("dual", Some("fd00::5".parse().unwrap()))]);
    }

    /// A pod of `owner` (kind, name; controller or not), in namespace `demo`.
    fn owned_pod(name: &str, ip: &str, owner: Option<(&str, &str, bool)>) -> Pod {
        let hash = owner
            .filter(|(kind, _, _)| *kind == "ReplicaSet")
            .and_then(|(_, rs, _)| rs.rsplit('-').next());
        let mut labels = json!({"app": name});
        if let Some(hash) = hash {
            labels["pod-template-hash"] = json!(hash);
        }
        let owners = owner.map(|(kind, owner, controller)| {
            json!([{"apiVersion": "v1", "kind": kind, "name": owner, "uid": format!("uid-{owner}"),
                    "controller": controller}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "demo", "uid": format!("uid-{name}"),
                         "labels": labels, "ownerReferences": owners},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
    }

    fn job(name: &str, cronjob: Option<(&str, bool)>) -> Job {
        let owners = cronjob.map(|(cronjob, controller)| {
            json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob,
                    "uid": format!("uid-{cronjob}"), "controller": controller}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "demo", "uid": format!("uid-{name}"),
                         "ownerReferences": owners},
            "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}}
        }))
        .unwrap()
    }

    /// The differential test of issue 40: the same pods (and Jobs) fed to the controller's index and
    /// to `check`'s model, which must name the same workload for every pod: the index's endpoint (what
    /// learning writes as `targetRef`, [`WorkloadKind::Pod`] for a bare pod), `check --from-cluster`'s
    /// lookup of an edge's pod ([`JobOwners::unit`]) and the evaluator's `PodInfo::from_pod` (against
    /// `PodInfo` from the index's record).
    #[test]
    fn check_and_the_controller_agree_on_every_pods_workload() {
        use crate::cluster::index::Index;
        use crate::monitor::evaluate::PodInfo;
        let jobs = vec![
            job("tick-28000", Some(("tick", true))),
            // `kubectl create job --from=cronjob/tick` (v1.20): a reference not marked controller.
            job("tick-manual", Some(("tick", false))),
            job("migrate", None),
        ];
        let pods = vec![
            owned_pod(
                "web-5d8f7c9b6-abcde",
                "10.1.0.1",
                Some(("ReplicaSet", "web-5d8f7c9b6", true)),
            ),
            owned_pod("db-0", "10.1.0.2", Some(("StatefulSet", "db", true))),
            owned_pod("agent-x1", "10.1.0.3", Some(("DaemonSet", "agent", true))),
            owned_pod(
                "tick-28000-q",
                "10.1.0.4",
                Some(("Job", "tick-28000", true)),
            ),
            owned_pod(
                "tick-manual-q",
                "10.1.0.5",
                Some(("Job", "tick-manual", true)),
            ),
            owned_pod("migrate-q", "10.1.0.6", Some(("Job", "migrate", true))),
            // A Job not listed (yet): its own unit, in both.
            owned_pod("other-q", "10.1.0.7", Some(("Job", "other", true))),
            owned_pod("debug", "10.1.0.8", None),
            // A ReplicaSet of its own (no hash) and another controller: no unit of ours.
            owned_pod("rs-x", "10.1.0.9", Some(("ReplicaSet", "rs", true))),
            owned_pod("custom-x", "10.1.0.10", Some(("Rollout", "custom", true))),
            // An ownerReference that is not the controller: a bare pod.
            owned_pod("adopted", "10.1.0.11", Some(("StatefulSet", "db", false))),
        ];
        let mut index = Index::default();
        jobs.iter().for_each(|j| index.apply_job(j));
        pods.iter().for_each(|p| index.apply_pod(p, 0));
        let owners = JobOwners::new(&jobs);
        let mut seen = Vec::new();
        for pod in &pods {
            let name = pod.name_any();
            let record = index.pod("demo", &name).expect("indexed");
            let endpoint = index.endpoint_of(record);
            // What learning targets: the endpoint's kind, a bare pod itself, none for another controller.
            let controller = match (endpoint.kind, &endpoint.foreign_controller) {
                (Some(kind), _) => Some((kind, endpoint.name.clone())),
                (None, None) => Some((WorkloadKind::Pod, endpoint.name.clone())),
                (None, Some(_)) => None,
            };
            let check = owners.unit(pod).map(|w| (w.kind, w.name));
            assert_eq!(check, controller, "pod {name}");
            assert_eq!(
                PodInfo::from_pod(pod, &owners).map(|p| p.workload),
                Some(PodInfo::from(&**record).workload),
                "pod {name}"
            );
            seen.push(check);
        }
        // The table covers every kind.
        for kind in [
            WorkloadKind::Deployment,
            WorkloadKind::StatefulSet,
            WorkloadKind::DaemonSet,
            WorkloadKind::Job,
            WorkloadKind::CronJob,
            WorkloadKind::Pod,
        ] {
            assert!(seen.iter().flatten().any(|(k, _)| *k == kind), "{kind:?}");
        }

        // And an edge of the CronJob finds its run's pod in `check --from-cluster`.
        let input = LiveInput {
            pods: pods.clone(),
            jobs,
            edges: vec![edge(
                side("CronJob", "tick"),
                side("Deployment", "web"),
                18080,
            )],
            ..LiveInput::default()
        };
        let (scenario, skipped) = scenario(&input);
        assert_eq!(skipped, 0);
        assert_eq!(
            scenario.flows[0].from.pod.as_deref(),
            Some("demo/tick-28000-q")
        );
    }
}
