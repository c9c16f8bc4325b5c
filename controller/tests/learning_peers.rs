//! Which peer a connection is learned as, against the real local cluster, with records fed through the
//! real ingest (`Learning::accept`, as the gRPC stream does) into an index fed by the real watches:
//! - a call to the `kubernetes` Service is learned as what it reaches after kube-proxy's DNAT (the API
//!   server's address and port), the same rule a direct call learns, and that rule keeps the call
//!   allowed once the proposal is promoted to protect;
//! - a host-network pod is one peer, its node's address, whichever end reports the connection.

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{Api, PostParams};
use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord};
use network_enforcer_api::{Backend, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::app::App;
use network_enforcer_controller::cluster::watches::SharedIndex;
use network_enforcer_controller::ingest::flow_record::decode;
use network_enforcer_controller::monitor::evaluate::attribution::{PolicyVerdict, policy_verdict};
use network_enforcer_controller::monitor::evaluate::{ClusterView, Endpoint, Flow};
use network_enforcer_controller::monitor::violations::evidence::{WorkloadNames, observed_flows};
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::images::TEST_IMAGE;
use network_enforcer_tests::scenario_fixture::{
    Workloads, cluster_ip, create_workloads, flow_record,
};
use serde_json::{Value, json};
use std::net::IpAddr;
use std::time::Duration;

/// The controller's side: an index fed by the real watches, and the ingest's learning in front of a
/// writer. The index is ready (every watch listed) when this returns.
async fn controller(ns: &TestNamespace) -> Result<(App, AbortOnDrop)> {
    let app = App::builder(ns.client.clone(), Backend::Kubernetes)
        // Shared by every test on this cluster: learn nothing there.
        .excluded_namespaces(["kube-system".to_string()])
        .build();
    let feed = tokio::spawn(app.watch_cluster());
    ns.wait_for("the index to sync", Duration::from_secs(30), || async {
        Ok(app.index.ready().then_some(()))
    })
    .await?;
    Ok((app, AbortOnDrop(feed)))
}

/// Stops the watches when the test ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits until the watches have brought pod `name` with an IP into the index; returns its node.
async fn indexed_pod(ns: &TestNamespace, shared: &SharedIndex, name: &str) -> Result<String> {
    ns.wait_for(
        &format!("the index to see pod {name} with an IP"),
        Duration::from_secs(60),
        || async {
            let index = shared.index.read().unwrap();
            Ok(index
                .pod(&ns.name, name)
                .filter(|p| !p.ips.is_empty())
                .and_then(|p| p.node.clone()))
        },
    )
    .await
}

/// An established connection the pod `local` opened, as its agent reports it.
fn outbound(ns: &TestNamespace, local: &str, peer: IpAddr, port: u32) -> FlowRecord {
    flow_record(
        &ns.name,
        local,
        peer,
        port,
        uplink::Protocol::Tcp,
        uplink::Direction::Outbound,
        uplink::Outcome::Established,
    )
}

/// An established connection `peer` opened to the pod `local`, as its agent reports it.
fn inbound(ns: &TestNamespace, local: &str, peer: IpAddr, port: u32) -> FlowRecord {
    flow_record(
        &ns.name,
        local,
        peer,
        port,
        uplink::Protocol::Tcp,
        uplink::Direction::Inbound,
        uplink::Outcome::Established,
    )
}

/// The rules of proposal `name` in `ns` as stored, egress and ingress alike: `[{peers, ports}]`.
async fn rules_of(ns: &TestNamespace, name: &str) -> Result<Value> {
    let proposal = ns
        .api::<WorkloadNetworkPolicyProposal>()
        .get(name)
        .await
        .with_context(|| format!("proposal {name}"))?;
    let np = serde_json::to_value(proposal.spec.kubernetes.as_ref().unwrap())?;
    let (rules, peers) = match np["egress"].as_array() {
        Some(rules) => (rules.clone(), "to"),
        None => (
            np["ingress"].as_array().cloned().unwrap_or_default(),
            "from",
        ),
    };
    Ok(rules
        .iter()
        .map(|r| json!({"peers": r[peers], "ports": r["ports"]}))
        .collect())
}

/// Regression: a call to the `kubernetes` Service (`10.96.0.1:443 established`) was dropped as
/// `service_without_backends` (a Service without a selector), so protect cut every workload using the
/// in-cluster client config. It is learned as the API server's address on its port, exactly what a
/// direct call to that address learns, and the promoted policy allows the call (post-DNAT).
#[tokio::test]
async fn a_call_to_the_kubernetes_service_is_learned_as_the_api_server_and_allowed_in_protect()
-> Result<()> {
    let ns = TestNamespace::create_with_crds("learn-apiserver").await?;
    // A pod that calls the API server the way the in-cluster client config does: by the Service name.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "api-client", "labels": {"app": "api-client"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
            "name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "socat -d -d -T1 STDIO TCP:kubernetes.default.svc:443,connect-timeout=5 \
                                     </dev/null 2>&1 && echo CONNECTED; sleep 3600"]}]}
    }))?;
    ns.api::<Pod>().create(&PostParams::default(), &pod).await?;
    let log = ns
        .wait_for(
            "the pod to connect to kubernetes.default.svc:443",
            Duration::from_secs(120),
            || async {
                let log = ns
                    .api::<Pod>()
                    .logs("api-client", &Default::default())
                    .await
                    .unwrap_or_default();
                Ok(log.contains("CONNECTED").then_some(log))
            },
        )
        .await?;
    // The address the pod's socket connected to: what its agent reports as the peer.
    let service_ip: IpAddr = log
        .lines()
        .find_map(|l| {
            l.split_once("opening connection to AF=2 ")?
                .1
                .strip_suffix(":443")
        })
        .with_context(|| format!("no connection line in the pod's log:\n{log}"))?
        .parse()?;
    assert_eq!(
        service_ip,
        cluster_ip("default", "kubernetes", &ns.client).await?
    );
    // Where kube-proxy sends it: the API server's address and port, from the Service's Endpoints.
    let endpoints = Api::<Endpoints>::namespaced(ns.client.clone(), "default")
        .get("kubernetes")
        .await?;
    let subset = &endpoints.subsets.context("no endpoints subsets")?[0];
    let api_server: IpAddr = subset.addresses.as_ref().context("no addresses")?[0]
        .ip
        .parse()?;
    let api_port = subset.ports.as_ref().context("no ports")?[0].port;

    let (app, _watches) = controller(&ns).await?;
    let (shared, learning) = (&app.index, &app.learning);
    let node = indexed_pod(&ns, shared, "api-client").await?;
    let via_service = outbound(&ns, "api-client", service_ip, 443);
    let ack = learning.accept(
        &node,
        &FlowBatch {
            sequence: 1,
            node: node.clone(),
            records: vec![via_service.clone()],
            instance: 0,
            health: None,
        },
    );
    assert_eq!((ack.accepted, ack.rejected), (1, 0), "{ack:?}");
    let report = app.flush().await;
    assert_eq!((report.created, report.failed), (1, 0), "{report:?}");
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let proposal = proposals.get("pod-api-client-egress").await?;
    let egress = serde_json::to_value(&proposal.spec.kubernetes.as_ref().unwrap().egress)?;
    assert_eq!(
        egress,
        json!([{"to": [{"ipBlock": {"cidr": format!("{api_server}/32")}}],
                "ports": [{"protocol": "TCP", "port": api_port}]}]),
        "the API server's address on its own port, as NetworkPolicies see the call after DNAT"
    );

    // The same call made to the API server's address directly teaches nothing new.
    let direct = outbound(&ns, "api-client", api_server, u32::try_from(api_port)?);
    learning.accept(
        &node,
        &FlowBatch {
            sequence: 2,
            node: node.clone(),
            records: vec![direct.clone()],
            instance: 0,
            health: None,
        },
    );
    let report = app.flush().await;
    assert_eq!((report.written, report.unchanged), (0, 1), "{report:?}");

    // Promoted to protect, the learned rule allows the call through the Service, as the violation
    // evidence path resolves it (post-DNAT); anything else to the API server's address stays denied.
    let policy: WorkloadNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1", "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "pod-api-client-egress", "namespace": ns.name},
        "spec": {"backend": "kubernetes", "direction": "Egress", "mode": "protect",
                 "targetRef": {"kind": "Pod", "name": "api-client"},
                 "kubernetes": serde_json::to_value(&proposal.spec.kubernetes)?}
    }))?;
    let index = shared.index.read().unwrap();
    let view = ClusterView::from_index(&index, std::iter::empty(), std::iter::empty());
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let flows = observed_flows(
        &index,
        &view,
        &mut WorkloadNames::default(),
        &decode(&via_service, &index, None)?,
        &now,
    )?;
    let flows: Vec<Flow> = flows.iter().map(|f| f.flow()).collect();
    let direct_flows: Vec<Flow> = observed_flows(
        &index,
        &view,
        &mut WorkloadNames::default(),
        &decode(&direct, &index, None)?,
        &now,
    )?
    .iter()
    .map(|f| f.flow())
    .collect();
    assert_eq!(flows, direct_flows, "one call, one flow");
    let [flow] = flows.as_slice() else {
        panic!("one flow expected: {flows:?}");
    };
    assert_eq!(
        (&flow.destination, flow.port),
        (&Endpoint::Ip(api_server), u16::try_from(api_port)?)
    );
    assert_eq!(
        policy_verdict(&view, &policy, flow, None, None)?,
        PolicyVerdict::Allows
    );
    let elsewhere = Flow {
        port: 10250,
        ..flow.clone()
    };
    assert_eq!(
        policy_verdict(&view, &policy, &elsewhere, None, None)?,
        PolicyVerdict::Denies,
        "the policy isolates the pod: only what it learned is allowed"
    );
    Ok(())
}

/// Regression: a hostNetwork DaemonSet calling a Deployment gave the callee's ingress proposal both
/// `ipBlock <node IP>/32` (from the callee's record) and `podSelector {app: probe}` (from the caller's
/// record, attributed to its pod): a pod selector never matches host-network traffic, so that rule
/// enforced nothing and would admit any ordinary pod labelled `app=probe`. One connection is one peer:
/// the node's address, from either end, also when the host-network pod is called (directly or through a
/// Service). The host-network DaemonSet keeps its own proposals.
#[tokio::test]
async fn a_host_network_pod_is_learned_as_its_node_address_from_either_side() -> Result<()> {
    let ns = TestNamespace::create_with_crds("learn-hostnet").await?;
    let Workloads { server, .. } = create_workloads(&ns, 1).await?;
    let probe: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"selector": {"matchLabels": {"app": "probe"}},
                 "template": {"metadata": {"labels": {"app": "probe"}},
                              "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 0,
                                       "containers": [{"name": "main", "image": TEST_IMAGE,
                                                       "imagePullPolicy": "Never",
                                                       "command": ["sleep", "3600"]}]}}}
    }))?;
    ns.api::<DaemonSet>()
        .create(&PostParams::default(), &probe)
        .await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"selector": {"app": "probe"}, "ports": [{"port": 19100}]}
    }))?;
    ns.api::<Service>()
        .create(&PostParams::default(), &service)
        .await?;
    let (probe, node_ip): (String, IpAddr) = ns
        .wait_for(
            "the host-network probe to run",
            Duration::from_secs(120),
            || async {
                Ok(ns.pods("app=probe").await?.into_iter().find_map(|p| {
                    let status = p.status.as_ref()?;
                    (status.phase.as_deref() == Some("Running")).then_some(())?;
                    Some((
                        p.metadata.name.clone()?,
                        status.pod_ip.as_ref()?.parse().ok()?,
                    ))
                }))
            },
        )
        .await?;
    let server_ip: IpAddr = ns
        .api::<Pod>()
        .get(&server)
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("the server's IP")?
        .parse()?;
    let probe_service = cluster_ip(&ns.name, "probe", &ns.client).await?;

    let (app, _watches) = controller(&ns).await?;
    let (shared, learning) = (&app.index, &app.learning);
    let node = indexed_pod(&ns, shared, &probe).await?;
    indexed_pod(&ns, shared, &server).await?;
    assert!(
        shared
            .index
            .read()
            .unwrap()
            .pod(&ns.name, &probe)
            .unwrap()
            .host_network,
        "the index knows the probe is on the host network"
    );
    // Both ends' agents report each connection: the probe calls the server; the server calls the
    // probe, by its address and through its Service.
    let records = vec![
        outbound(&ns, &probe, server_ip, 18080),
        inbound(&ns, &server, node_ip, 18080),
        outbound(&ns, &server, node_ip, 19100),
        inbound(&ns, &probe, server_ip, 19100),
        outbound(&ns, &server, probe_service, 19100),
    ];
    let ack = learning.accept(
        &node,
        &FlowBatch {
            sequence: 1,
            node: node.clone(),
            records,
            instance: 0,
            health: None,
        },
    );
    assert_eq!((ack.accepted, ack.rejected), (5, 0), "{ack:?}");
    let report = app.flush().await;
    assert_eq!(report.failed, 0, "{report:?}");

    let node_peer = |port: u16| {
        json!([{"peers": [{"ipBlock": {"cidr": format!("{node_ip}/32")}}],
                "ports": [{"protocol": "TCP", "port": port}]}])
    };
    let server_peer = |port: u16| {
        json!([{"peers": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}},
                           "podSelector": {"matchLabels": {"app": "http-server"}}}],
                "ports": [{"protocol": "TCP", "port": port}]}])
    };
    for (proposal, expected) in [
        // One peer per connection: the node's address, never `podSelector {app: probe}`.
        ("deployment-http-server-ingress", node_peer(18080)),
        ("deployment-http-server-egress", node_peer(19100)),
        // The host-network DaemonSet keeps its own proposals.
        ("daemonset-probe-egress", server_peer(18080)),
        ("daemonset-probe-ingress", server_peer(19100)),
    ] {
        assert_eq!(rules_of(&ns, proposal).await?, expected, "{proposal}");
    }
    Ok(())
}
