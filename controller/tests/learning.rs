//! Learning into proposals against the real local cluster (docs/design.md, "Learning"; the end-to-end
//! scenario up to step 2): real Deployments, Service and cluster DNS; observations as the agents report
//! them.

use anyhow::Result;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};
use network_enforcer_api::keys::PROMOTED_FROM_LABEL;
use network_enforcer_api::{
    Backend, Protocol, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal,
};
use network_enforcer_controller::app::App;
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::index::Opened;
use network_enforcer_controller::cluster::watches;
use network_enforcer_controller::learn::ReportedConnection;
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::scenario_fixture::{Workloads, cluster_ip, create_workloads};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

/// The index as the controller's watches would build it, from the cluster's current objects.
async fn index(client: &kube::Client) -> Result<Index> {
    Ok(watches::snapshot(client).await?)
}

fn observation(
    ix: &Index,
    ns: &str,
    local: &str,
    peer: IpAddr,
    port: u16,
    protocol: Protocol,
    opened: Opened,
) -> ReportedConnection {
    ReportedConnection {
        local: ix.pod(ns, local).expect("the pod is in the index").clone(),
        peer,
        port,
        protocol,
        opened,
        at_ms: k8s_openapi::jiff::Timestamp::now().as_millisecond(),
        reporter: network_enforcer_controller::learn::Reporter::Node,
        peer_name: Default::default(),
    }
}

async fn specs_in(ns: &TestNamespace) -> Result<Vec<(String, Value)>> {
    let list = ns
        .api::<WorkloadNetworkPolicyProposal>()
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .iter()
        .map(|p| (p.name_any(), serde_json::to_value(&p.spec).unwrap()))
        .collect())
}

#[tokio::test]
async fn the_scenario_is_learned_on_both_backends() -> Result<()> {
    let ns = TestNamespace::create_with_crds("learn").await?;
    let Workloads { clients, server } = create_workloads(&ns, 3).await?;
    let ix = index(&ns.client).await?;
    let service = cluster_ip(&ns.name, "http-service", &ns.client).await?;
    let dns = cluster_ip("kube-system", "kube-dns", &ns.client).await?;
    let n = ns.name.as_str();
    // What the agents report for one `nc` to the server and the DNS lookup before it.
    let scenario = |client: &(String, IpAddr)| {
        vec![
            observation(
                &ix,
                n,
                &client.0,
                service,
                18080,
                Protocol::TCP,
                Opened::Outbound,
            ),
            observation(&ix, n, &client.0, dns, 53, Protocol::UDP, Opened::Outbound),
            observation(
                &ix,
                n,
                &server,
                client.1,
                18080,
                Protocol::TCP,
                Opened::Inbound,
            ),
        ]
    };
    // kube-system is shared by every test on this cluster: learn nothing there.
    let excluded = BTreeSet::from(["kube-system".to_string()]);
    let app = App::builder(ns.client.clone(), Backend::Kubernetes)
        .excluded_namespaces(excluded.clone())
        .build();
    for o in scenario(&clients[0]) {
        app.learner.observe(&ix, &o)?;
    }
    let report = app.flush().await;
    assert_eq!((report.written, report.failed), (2, 0), "{report:?}");

    let specs = specs_in(&ns).await?;
    let names: Vec<&str> = specs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "deployment-http-client-egress",
            "deployment-http-server-ingress"
        ]
    );
    // The scenario's proposals (docs/development.md), rules in the order the controller writes them.
    let expected = network_enforcer_tests::e2e::scenario::expected_proposal_specs_as_written(n);
    for (name, spec) in &specs {
        assert_eq!(Some(spec), expected.get(name), "{name}");
    }
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let ingress = proposals.get("deployment-http-server-ingress").await?;
    let server_deployment = ns.api::<Deployment>().get("http-server").await?;
    let owner = &ingress.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Deployment", Some(true))
    );
    assert_eq!(Some(owner.uid.clone()), server_deployment.uid());
    assert_eq!(ingress.status.as_ref().and_then(|s| s.peer_count), Some(1));

    // The same flows from all 3 replicas, 100 times: no new rule and no write.
    for _ in 0..100 {
        for client in &clients {
            for o in scenario(client) {
                app.learner.observe(&ix, &o)?;
            }
        }
    }
    let report = app.flush().await;
    assert_eq!((report.written, report.unchanged), (0, 2), "{report:?}");
    assert_eq!(specs_in(&ns).await?, specs, "specs unchanged");

    // Promoted: the egress proposal becomes a policy; learning leaves it alone.
    let egress = proposals.get("deployment-http-client-egress").await?;
    let policy: WorkloadNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1", "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "deployment-http-client-egress", "labels": {PROMOTED_FROM_LABEL: "deployment-http-client-egress"}},
        "spec": {"backend": "kubernetes", "direction": "Egress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "http-client"},
                 "kubernetes": serde_json::to_value(&egress.spec.kubernetes)?}
    }))?;
    ns.api::<WorkloadNetworkPolicy>()
        .create(&PostParams::default(), &policy)
        .await?;
    proposals
        .delete("deployment-http-client-egress", &DeleteParams::default())
        .await?;
    app.learner.observe(
        &ix,
        &observation(
            &ix,
            n,
            &clients[0].0,
            service,
            18082,
            Protocol::TCP,
            Opened::Outbound,
        ),
    )?;
    let report = app.flush().await;
    assert_eq!((report.promoted, report.written), (1, 1), "{report:?}");
    assert!(
        proposals
            .get_opt("deployment-http-client-egress")
            .await?
            .is_none(),
        "not re-created"
    );

    // Istio: one ingress proposal, principal rule, TCP only.
    proposals
        .delete("deployment-http-server-ingress", &DeleteParams::default())
        .await?;
    let istio = App::builder(ns.client.clone(), Backend::Istio)
        .excluded_namespaces(excluded)
        .build();
    for o in scenario(&clients[0]) {
        istio.learner.observe(&ix, &o)?;
    }
    assert_eq!(istio.flush().await.written, 1);
    let specs = specs_in(&ns).await?;
    assert_eq!(specs.len(), 1);
    assert_eq!(
        specs[0].1["istio"],
        json!({"selector": {"matchLabels": {"app": "http-server"}},
               "rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/{n}/sa/http-client-sa")]}}],
                          "to": [{"operation": {"ports": ["18080"]}}]}]})
    );

    // Deleting the workload garbage-collects its proposal (real GC through the ownerReference).
    ns.api::<Deployment>()
        .delete("http-server", &DeleteParams::foreground())
        .await?;
    ns.wait_for(
        "GC of the server's proposal",
        Duration::from_secs(90),
        || async {
            Ok(proposals
                .get_opt("deployment-http-server-ingress")
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// The writer starts from the watch cache's copy of a proposal (the shared watch of proposals, which
/// the proposal reconciler and the web view read too): a current copy is written without reading the object; a copy the last write made
/// stale fails its replace with 409 and the retry reads the object; so does a copy of a proposal deleted
/// since, and the retry creates the proposal again; a copy that holds every edge already is not
/// believed without reading the object.
#[tokio::test]
async fn proposal_writes_start_from_the_watch_cache_and_read_the_object_when_it_lags() -> Result<()>
{
    use kube::runtime::watcher;
    let ns = TestNamespace::create_with_crds("learn-cache").await?;
    let Workloads { clients, .. } = create_workloads(&ns, 1).await?;
    let ix = index(&ns.client).await?;
    let n = ns.name.as_str();
    // An address outside the cluster: each edge teaches the client's egress proposal only.
    let external: IpAddr = [192, 0, 2, 10].into();
    let egress = |port| {
        observation(
            &ix,
            n,
            &clients[0].0,
            external,
            port,
            Protocol::TCP,
            Opened::Outbound,
        )
    };
    let app = App::builder(ns.client.clone(), Backend::Kubernetes)
        .excluded_namespaces(BTreeSet::from(["kube-system".to_string()]))
        .build();
    // The test fills the store of the shared watch of proposals, which the writer reads.
    let mut feed = app.objects.proposals.take_writer().expect("not started");
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let name = "deployment-http-client-egress";
    let ports_in = |p: &WorkloadNetworkPolicyProposal| {
        let spec = serde_json::to_string(&p.spec).unwrap();
        [18080, 18081, 18082, 18083]
            .into_iter()
            .filter(|port| spec.contains(&port.to_string()))
            .collect::<Vec<_>>()
    };

    let outcome = |r: &network_enforcer_controller::learn::flush_report::FlushReport| {
        (r.written, r.created, r.conflicts, r.failed)
    };
    // Not in the cache: read from the API (absent) and created.
    app.learner.observe(&ix, &egress(18080))?;
    let report = app.flush().await;
    assert_eq!(outcome(&report), (1, 1, 0, 0), "{report:?}");

    // The cache holds the current object: written from it, no conflict.
    feed.apply_watcher_event(&watcher::Event::Apply(proposals.get(name).await?));
    app.learner.observe(&ix, &egress(18081))?;
    let report = app.flush().await;
    assert_eq!(outcome(&report), (1, 0, 0, 0), "{report:?}");

    // That copy is stale now (the write changed the object): 409, then read and written.
    app.learner.observe(&ix, &egress(18082))?;
    let report = app.flush().await;
    assert_eq!(outcome(&report), (1, 0, 1, 0), "{report:?}");
    assert_eq!(ports_in(&proposals.get(name).await?), [18080, 18081, 18082]);

    // Deleted while the cache still holds it: the replace fails (the API server answers 409), the
    // retry finds no proposal and creates it.
    feed.apply_watcher_event(&watcher::Event::Apply(proposals.get(name).await?));
    proposals.delete(name, &DeleteParams::default()).await?;
    app.learner.observe(&ix, &egress(18083))?;
    let report = app.flush().await;
    assert_eq!(outcome(&report), (1, 1, 1, 0), "{report:?}");
    assert_eq!(ports_in(&proposals.get(name).await?), [18083]);

    // Deleted while the cache holds a copy that has the edge already: the copy alone would say
    // "nothing to write"; the writer reads the object before deciding that, and re-creates it.
    feed.apply_watcher_event(&watcher::Event::Apply(proposals.get(name).await?));
    proposals.delete(name, &DeleteParams::default()).await?;
    app.learner.observe(&ix, &egress(18083))?;
    let report = app.flush().await;
    assert_eq!(
        (outcome(&report), report.unchanged),
        ((1, 1, 0, 0), 0),
        "{report:?}"
    );
    assert_eq!(ports_in(&proposals.get(name).await?), [18083]);
    Ok(())
}

mod grpc {
    use super::*;
    use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord};
    use network_enforcer_controller::app::{Acknowledge, App};
    use network_enforcer_controller::ingest::{Limits, TokenReviewAuthenticator};
    use network_enforcer_tests::scenario_fixture::{
        AGENT_SA, agent_token, flow_record, pod_json, send_batches as send,
    };
    use std::sync::Arc;

    async fn token(ns: &TestNamespace, sa: &str, pod: &Pod) -> Result<String> {
        agent_token(ns, sa, pod).await
    }

    /// An established connection as the agent reports it.
    fn record(
        ns: &str,
        pod: &str,
        peer: IpAddr,
        port: u32,
        protocol: uplink::Protocol,
        direction: uplink::Direction,
    ) -> FlowRecord {
        flow_record(
            ns,
            pod,
            peer,
            port,
            protocol,
            direction,
            uplink::Outcome::Established,
        )
    }

    #[tokio::test]
    async fn agents_stream_records_over_grpc_with_token_review() -> Result<()> {
        let ns = TestNamespace::create_with_crds("ingest").await?;
        let Workloads { clients, server } = create_workloads(&ns, 3).await?;
        let n = ns.name.clone();
        for sa in [AGENT_SA, "intruder"] {
            let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": sa}}))?;
            ns.api::<ServiceAccount>()
                .create(&PostParams::default(), &sa)
                .await?;
        }
        // v1.20 refuses pods of a ServiceAccount until the controller-manager has made its token Secret.
        let accounts = ns.api::<ServiceAccount>();
        for sa in [AGENT_SA, "intruder"] {
            ns.wait_for(
                &format!("the token Secret of {sa}"),
                Duration::from_secs(60),
                || async {
                    let account = accounts.get(sa).await?;
                    Ok(account.secrets.is_some_and(|s| !s.is_empty()).then_some(()))
                },
            )
            .await?;
        }
        let pods = ns.api::<Pod>();
        let agent = pods
            .create(&PostParams::default(), &pod_json("agent", AGENT_SA, None)?)
            .await?;
        let intruder = pods
            .create(
                &PostParams::default(),
                &pod_json("intruder", "intruder", None)?,
            )
            .await?;
        // A pod placed on a node that does not exist: no agent on our node may speak for it.
        pods.create(
            &PostParams::default(),
            &pod_json("elsewhere", "default", Some("other-node"))?,
        )
        .await?;
        let agent = ns
            .wait_for(
                "the agent pod to be scheduled",
                Duration::from_secs(60),
                || async {
                    let p = pods.get(&agent.name_any()).await?;
                    Ok(p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .map(|node| (p, node)))
                },
            )
            .await?;
        let (agent, node) = agent;
        let good = token(&ns, AGENT_SA, &agent).await?;
        let bad = token(&ns, "intruder", &intruder).await?;

        // The controller side: index fed by real watches, writer, gRPC server on loopback.
        let app = App::builder(ns.client.clone(), Backend::Kubernetes)
            .excluded_namespaces(["kube-system".to_string()])
            .ingest_limits(Limits {
                max_records_per_batch: 100,
                max_batches_per_second: 1000,
            })
            .acknowledge(Acknowledge::OnceMerged)
            // Records for a pod the watch has not delivered yet wait for it this long.
            .resolution_grace(120_000)
            .build();
        let shared = app.index.clone();
        let feed = tokio::spawn(app.watch_cluster());
        let service = app.ingest(Arc::new(TokenReviewAuthenticator::new(
            ns.client.clone(),
            &n,
            AGENT_SA,
        )));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let grpc = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service.into_server())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        ns.wait_for("the index to sync", Duration::from_secs(30), || async {
            Ok(shared.ready().then_some(()))
        })
        .await?;
        // The watch must also have seen this test's pods.
        ns.wait_for(
            "the index to see the pods",
            Duration::from_secs(30),
            || async {
                Ok(shared
                    .index
                    .read()
                    .unwrap()
                    .pod(&n, &server)
                    .is_some_and(|p| !p.ips.is_empty())
                    .then_some(()))
            },
        )
        .await?;

        let service_ip = cluster_ip(&n, "http-service", &ns.client).await?;
        let dns = cluster_ip("kube-system", "kube-dns", &ns.client).await?;
        let batch = |sequence: u64, node: &str, records: Vec<FlowRecord>| FlowBatch {
            sequence,
            node: node.into(),
            records,
            instance: 0,
            health: None,
        };
        let scenario = vec![
            record(
                &n,
                &clients[0].0,
                service_ip,
                18080,
                uplink::Protocol::Tcp,
                uplink::Direction::Outbound,
            ),
            record(
                &n,
                &clients[0].0,
                dns,
                53,
                uplink::Protocol::Udp,
                uplink::Direction::Outbound,
            ),
            record(
                &n,
                &server,
                clients[0].1,
                18080,
                uplink::Protocol::Tcp,
                uplink::Direction::Inbound,
            ),
        ];

        // Another ServiceAccount's token, and no token: refused, nothing learned.
        let denied = send(addr, &bad, vec![batch(1, &node, scenario.clone())])
            .await
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
        let denied = send(addr, "not-a-token", vec![batch(1, &node, scenario.clone())])
            .await
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::Unauthenticated, "{denied:?}");
        // A batch claiming another node.
        let denied = send(addr, &good, vec![batch(1, "other-node", scenario.clone())])
            .await
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
        assert_eq!(
            app.learner.pending_proposals(),
            0,
            "nothing from refused streams"
        );

        // The agent: the scenario is accepted; a record for a pod on another node and a malformed one are refused.
        let mut malformed = record(
            &n,
            &clients[0].0,
            service_ip,
            18080,
            uplink::Protocol::Tcp,
            uplink::Direction::Outbound,
        );
        malformed.peer_ip = vec![1, 2, 3];
        let foreign = record(
            &n,
            "elsewhere",
            service_ip,
            18080,
            uplink::Protocol::Tcp,
            uplink::Direction::Outbound,
        );
        let acks = send(
            addr,
            &good,
            vec![
                batch(7, &node, scenario.clone()),
                batch(8, &node, vec![malformed, foreign]),
            ],
        )
        .await
        .expect("the agent's stream is accepted");
        assert_eq!(
            (acks[0].sequence, acks[0].accepted, acks[0].rejected),
            (7, 3, 0)
        );
        assert_eq!(
            (acks[1].sequence, acks[1].accepted, acks[1].rejected),
            (8, 0, 2)
        );
        assert!(
            acks[1].reason.contains("peer address has 3 bytes"),
            "{}",
            acks[1].reason
        );

        // A record for a pod the watch has not delivered yet (here: not even created yet) is
        // accepted and waits; the pod comes, and the flush learns it.
        let early = record(
            &n,
            "late",
            service_ip,
            18080,
            uplink::Protocol::Tcp,
            uplink::Direction::Outbound,
        );
        let acks = send(addr, &good, vec![batch(10, &node, vec![early])])
            .await
            .expect("the agent's stream is accepted");
        assert_eq!(
            (acks[0].accepted, acks[0].rejected),
            (1, 0),
            "{}",
            acks[0].reason
        );
        assert_eq!(app.learning.waiting.len(), 1, "it waits for its pod");
        pods.create(&PostParams::default(), &pod_json("late", "default", None)?)
            .await?;
        ns.wait_for(
            "the index to see the late pod on its node",
            Duration::from_secs(60),
            || async {
                Ok(shared
                    .index
                    .read()
                    .unwrap()
                    .pod(&n, "late")
                    .is_some_and(|p| p.node.is_some())
                    .then_some(()))
            },
        )
        .await?;

        // Over the limit: a clear status, the stream ends.
        let too_many = vec![scenario[0].clone(); 101];
        let denied = send(addr, &good, vec![batch(9, &node, too_many)]).await;
        let status = match denied {
            Err(status) => status,
            Ok(acks) => panic!("expected a refusal, got {acks:?}"),
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("limit is 100"),
            "{}",
            status.message()
        );

        let report = app.flush().await;
        assert!(
            app.learning.waiting.is_empty(),
            "the flush took the late pod's record in"
        );
        assert_eq!(report.written, 3, "{report:?}");
        let names: Vec<String> = specs_in(&ns).await?.into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "deployment-http-client-egress",
                "deployment-http-server-ingress",
                "pod-late-egress"
            ]
        );
        grpc.abort();
        feed.abort();
        Ok(())
    }
}
