//! The end-to-end scenario's workload (docs/development.md) and an agent's side of the uplink, shared
//! by the controller's tests against the real API server (learning, violations): the ServiceAccounts,
//! Deployments and Service of the scenario, an agent pod with a pod-bound token, and flow records sent
//! over a real gRPC stream.

use crate::fixture::TestNamespace;
use crate::images::TEST_IMAGE;
use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use network_enforcer_api::WorkloadNetworkPolicyProposal;
use network_enforcer_api::uplink::flow_uplink_client::FlowUplinkClient;
use network_enforcer_api::uplink::{self, BatchAck, FlowBatch, FlowRecord, LocalPod};
use serde_json::json;
use std::net::IpAddr;
use std::time::Duration;

/// The agents' ServiceAccount in tests (the controller under test is told to accept it).
pub const AGENT_SA: &str = "network-enforcer-agent";

/// The audience of agent tokens (the controller's `ingest::AUDIENCE`).
pub const AUDIENCE: &str = "network-enforcer";

/// A Deployment of the scenario: `app: <name>` pods that declare the scenario's ports (TCP `http`
/// 18080, UDP `echo-udp` 18081) and sleep; tests inject the flows themselves.
pub fn deployment(name: &str, replicas: i32, sa: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "serviceAccountName": sa,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "sleep 3600"],
                        "ports": [{"name": "http", "containerPort": 18080},
                                  {"name": "echo-udp", "containerPort": 18081, "protocol": "UDP"}]
                    }]
                }
            }
        }
    }))?)
}

/// The running scenario.
#[derive(Clone, Debug)]
pub struct Workloads {
    /// The `http-client` pods: name and IP.
    pub clients: Vec<(String, IpAddr)>,
    /// The `http-server` pod's name.
    pub server: String,
}

/// Creates the end-to-end scenario's workloads in `ns` (ServiceAccounts
/// `http-client-sa`/`http-server-sa`, Deployments `http-server` ×1 and `http-client` ×
/// `client_replicas`, Service `http-service` with TCP 18080, TCP 18082 and UDP 18083→`echo-udp`) and
/// waits for every pod to run with an IP.
pub async fn create_workloads(ns: &TestNamespace, client_replicas: i32) -> Result<Workloads> {
    for sa in ["http-client-sa", "http-server-sa"] {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": sa}}))?;
        ns.api::<ServiceAccount>()
            .create(&PostParams::default(), &sa)
            .await?;
    }
    let deployments = ns.api::<Deployment>();
    deployments
        .create(
            &PostParams::default(),
            &deployment("http-server", 1, "http-server-sa")?,
        )
        .await?;
    deployments
        .create(
            &PostParams::default(),
            &deployment("http-client", client_replicas, "http-client-sa")?,
        )
        .await?;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "http-service"},
        "spec": {"selector": {"app": "http-server"}, "ports": [
            {"name": "tcp", "port": 18080, "targetPort": 18080},
            {"name": "tcp2", "port": 18082, "targetPort": 18082},
            {"name": "udp", "port": 18083, "targetPort": "echo-udp", "protocol": "UDP"}]}
    }))?;
    ns.api::<Service>()
        .create(&PostParams::default(), &svc)
        .await?;
    let pods = ns.api::<Pod>();
    let expected = usize::try_from(client_replicas)? + 1;
    let running = ns
        .wait_for(
            &format!("{expected} running pods with IPs"),
            Duration::from_secs(120),
            || async {
                let list = pods.list(&ListParams::default()).await?;
                let running: Vec<(String, String, IpAddr)> = list
                    .items
                    .iter()
                    .filter_map(|p| {
                        let s = p.status.as_ref()?;
                        (s.phase.as_deref() == Some("Running")).then_some(())?;
                        Some((
                            p.labels().get("app")?.clone(),
                            p.name_any(),
                            s.pod_ip.as_ref()?.parse().ok()?,
                        ))
                    })
                    .collect();
                Ok((running.len() == expected).then_some(running))
            },
        )
        .await?;
    let clients = running
        .iter()
        .filter(|(a, ..)| a == "http-client")
        .map(|(_, n, ip)| (n.clone(), *ip))
        .collect();
    let server = running
        .iter()
        .find(|(a, ..)| a == "http-server")
        .map(|(_, n, _)| n.clone())
        .expect("the server pod runs");
    Ok(Workloads { clients, server })
}

/// The ClusterIP of Service `namespace/name`.
pub async fn cluster_ip(namespace: &str, name: &str, client: &kube::Client) -> Result<IpAddr> {
    let svc = Api::<Service>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    let ip = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("Service {namespace}/{name} has no ClusterIP"))?;
    Ok(ip.parse()?)
}

/// Creates ServiceAccount `name` and waits for its token Secret (v1.20 refuses pods of a
/// ServiceAccount until the controller-manager has made it).
pub async fn service_account_with_token(ns: &TestNamespace, name: &str) -> Result<()> {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    let accounts = ns.api::<ServiceAccount>();
    accounts.create(&PostParams::default(), &sa).await?;
    ns.wait_for(
        &format!("the token Secret of {name}"),
        Duration::from_secs(60),
        || async {
            let account = accounts.get(name).await?;
            Ok(account.secrets.is_some_and(|s| !s.is_empty()).then_some(()))
        },
    )
    .await
}

/// A sleeping pod `name` (label `app: <name>`) of ServiceAccount `sa`, optionally bound to `node`.
pub fn pod_json(name: &str, sa: &str, node: Option<&str>) -> Result<Pod> {
    let mut spec = json!({
        "serviceAccountName": sa, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": name}}, "spec": spec}),
    )?)
}

/// Creates `pod` and waits until it is scheduled; returns it and its node.
pub async fn scheduled_pod(ns: &TestNamespace, pod: &Pod) -> Result<(Pod, String)> {
    let pods = ns.api::<Pod>();
    // v1.20's ServiceAccount admission reads the account's token Secret from its own cache, which
    // may lag the Secret we have seen: it then refuses the pod with a 500 ServerTimeout ("No API
    // token found ..., retry after ...") that asks the client to retry. Any other error fails.
    let created = ns
        .wait_for(
            &format!("pod {} to be admitted", pod.name_any()),
            Duration::from_secs(60),
            || async {
                match pods.create(&PostParams::default(), pod).await {
                    Err(kube::Error::Api(e)) if e.code == 500 && e.reason == "ServerTimeout" => {
                        Err(kube::Error::Api(e).into())
                    }
                    created => Ok(Some(created)),
                }
            },
        )
        .await??;
    let name = created.name_any();
    ns.wait_for(
        &format!("pod {name} to be scheduled"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(&name).await?;
            Ok(p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .map(|node| (p, node)))
        },
    )
    .await
}

/// A pod-bound token of ServiceAccount `sa` for `pod`, as the kubelet would project it into the
/// agent pod.
pub async fn agent_token(ns: &TestNamespace, sa: &str, pod: &Pod) -> Result<String> {
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": [AUDIENCE],
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()},
            "expirationSeconds": 3600
        }
    }))?;
    let created = ns
        .api::<ServiceAccount>()
        .create_token_request(sa, &PostParams::default(), &request)
        .await?;
    created
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow::anyhow!("the API server issued no token"))
}

/// A record as an agent reports it: local pod `namespace/pod`, the peer, the service port, and how it
/// went, seen once just now.
pub fn flow_record(
    namespace: &str,
    pod: &str,
    peer: IpAddr,
    port: u32,
    protocol: uplink::Protocol,
    direction: uplink::Direction,
    outcome: uplink::Outcome,
) -> FlowRecord {
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    FlowRecord {
        local: Some(LocalPod {
            namespace: namespace.into(),
            name: pod.into(),
            uid: String::new(),
        }),
        peer_ip: network_enforcer_api::uplink::ip_bytes(peer),
        port,
        protocol: protocol as i32,
        direction: direction as i32,
        outcome: outcome as i32,
        first_seen_ms: now,
        last_seen_ms: now,
        count: 1,
        source: uplink::Source::Ebpf as i32,
        ..FlowRecord::default()
    }
}

/// Sends `batches` on one stream to the ingest endpoint at `address` with `token`, as an agent does;
/// returns the acks, or the stream's error status.
pub async fn send_batches(
    address: std::net::SocketAddr,
    token: &str,
    batches: Vec<FlowBatch>,
) -> Result<Vec<BatchAck>, tonic::Status> {
    let mut client = FlowUplinkClient::connect(format!("http://{address}"))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connecting to {address}: {e}")))?;
    let n = batches.len();
    let mut request = tonic::Request::new(tonic::codegen::tokio_stream::iter(batches));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("token is not a header value"))?,
    );
    let mut acks = client.stream(request).await?.into_inner();
    let mut out = Vec::new();
    while out.len() < n {
        match acks.message().await? {
            Some(ack) => out.push(ack),
            None => break,
        }
    }
    Ok(out)
}

/// Every (proposal, direction, peer, protocol, port) the proposals of `ns` allow, one entry per rule
/// peer and port (see [`rule_entries`]), sorted but not deduplicated: a rule learned twice shows up
/// twice.
pub async fn learned_rules(ns: &TestNamespace) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in ns
        .api::<WorkloadNetworkPolicyProposal>()
        .list(&ListParams::default())
        .await?
    {
        out.extend(rule_entries(&p.name_any(), &serde_json::to_value(&p.spec)?));
    }
    out.sort();
    Ok(out)
}

/// `<name> <direction> <namespace>/<labels> <protocol>/<port>` for each peer and port of the
/// Kubernetes rules of spec `spec` (a proposal's or a policy's).
pub fn rule_entries(name: &str, spec: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for (direction, peers) in [("egress", "to"), ("ingress", "from")] {
        for rule in spec["kubernetes"][direction]
            .as_array()
            .into_iter()
            .flatten()
        {
            for peer in rule[peers].as_array().into_iter().flatten() {
                let namespace =
                    &peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"];
                let labels = peer["podSelector"]["matchLabels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_else(|| peer.to_string());
                for port in rule["ports"].as_array().into_iter().flatten() {
                    out.push(format!(
                        "{name} {direction} {}/{labels} {}/{}",
                        namespace.as_str().unwrap_or("?"),
                        port["protocol"].as_str().unwrap_or("?"),
                        port["port"]
                    ));
                }
            }
        }
    }
    out
}
