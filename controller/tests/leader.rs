//! Leader election between two controller replicas (in-process, the real API server and a real Lease):
//! exactly one leads and writes proposals; the follower refuses agent streams with UNAVAILABLE naming the
//! leader; when the leader dies without a word, the follower takes over once the Lease expires, learning
//! continues there without duplicates, and agents' streams are accepted; a released Lease is taken over
//! at once.

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use network_enforcer_api::uplink::FlowBatch;
use network_enforcer_api::{Backend, Protocol, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::app::{Acknowledge, App};
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::index::Opened;
use network_enforcer_controller::cluster::watches::{self, SharedIndex};
use network_enforcer_controller::ingest::{AgentIdentity, Authenticate};
use network_enforcer_controller::learn::ReportedConnection;
use network_enforcer_controller::learn::flush_report::FlushReport;
use network_enforcer_controller::runtime::leader::{self, Elector, Leadership, Settings};
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::scenario_fixture::{
    Workloads, cluster_ip, create_workloads, send_batches,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The index as the controller's watches would build it, from the cluster's current objects.
async fn index(client: &kube::Client) -> Result<Index> {
    Ok(watches::snapshot(client).await?)
}

/// Accepts any token as an agent on `node-1` (authentication is not what this test is about).
struct AnyToken;

#[tonic::async_trait]
impl Authenticate for AnyToken {
    async fn authenticate(&self, _token: &str) -> Result<AgentIdentity, tonic::Status> {
        Ok(AgentIdentity {
            node: "node-1".into(),
            pod: "network-enforcer/agent".into(),
        })
    }
}

/// One controller replica: its elector, its writer (gated by leadership) and its ingest endpoint.
struct Replica {
    elector: tokio::task::JoinHandle<()>,
    leadership: watch::Receiver<Leadership>,
    app: App,
    ingest: SocketAddr,
    settings: Settings,
}

impl Replica {
    async fn start(ns: &TestNamespace, identity: &str) -> Result<Self> {
        // Short timings so the test does not wait 15 s for an expiry; the logic is the same.
        let settings = Settings {
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(300),
            ..Settings::new(&ns.name, "network-enforcer-controller", identity)
        };
        let elector = Elector::new(ns.client.clone(), settings.clone());
        let leadership = elector.subscribe();
        let elector = tokio::spawn(elector.run());
        let app = App::builder(ns.client.clone(), Backend::Kubernetes)
            .excluded_namespaces(["kube-system".to_string()])
            .leadership(leadership.clone())
            .index(Arc::new(SharedIndex::listed(Index::default())))
            .acknowledge(Acknowledge::OnceMerged)
            .build();
        let service = app.ingest(Arc::new(AnyToken));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let ingest = listener.local_addr()?;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service.into_server())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Ok(Self {
            elector,
            leadership,
            app,
            ingest,
            settings,
        })
    }

    async fn wait_until(&mut self, what: &str, f: impl Fn(&Leadership) -> bool) -> Result<()> {
        tokio::time::timeout(Duration::from_secs(60), self.leadership.wait_for(f))
            .await
            .with_context(|| format!("{} waiting for {what}", self.settings.identity))??;
        Ok(())
    }

    /// Opens an agent stream and sends one empty batch: the ack, or the refusal.
    async fn agent_stream(&self) -> Result<(), tonic::Status> {
        send_batches(
            self.ingest,
            "token",
            vec![FlowBatch {
                sequence: 1,
                node: "node-1".into(),
                records: vec![],
                instance: 0,
                health: None,
            }],
        )
        .await
        .map(drop)
    }
}

fn observation(
    ix: &Index,
    ns: &str,
    local: &str,
    peer: IpAddr,
    port: u16,
    protocol: Protocol,
) -> ReportedConnection {
    ReportedConnection {
        local: ix.pod(ns, local).expect("the pod is in the index").clone(),
        peer,
        port,
        protocol,
        opened: Opened::Outbound,
        at_ms: k8s_openapi::jiff::Timestamp::now().as_millisecond(),
        reporter: network_enforcer_controller::learn::Reporter::Node,
        peer_name: Default::default(),
    }
}

/// Proposal name → number of rules.
async fn rules(ns: &TestNamespace) -> Result<Vec<(String, usize)>> {
    Ok(ns
        .api::<WorkloadNetworkPolicyProposal>()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|p| {
            let np = p.spec.kubernetes.as_ref();
            let n = np.and_then(|n| n.egress.as_ref()).map_or(0, Vec::len)
                + np.and_then(|n| n.ingress.as_ref()).map_or(0, Vec::len);
            (p.name_any(), n)
        })
        .collect())
}

#[tokio::test]
async fn one_of_two_replicas_writes_and_the_other_takes_over_when_it_dies() -> Result<()> {
    let ns = TestNamespace::create_with_crds("leader").await?;
    let Workloads { clients, .. } = create_workloads(&ns, 1).await?;
    let ix = index(&ns.client).await?;
    let service = cluster_ip(&ns.name, "http-service", &ns.client).await?;
    let dns = cluster_ip("kube-system", "kube-dns", &ns.client).await?;
    let client = clients[0].0.as_str();
    let to_server = observation(&ix, &ns.name, client, service, 18080, Protocol::TCP);
    let to_dns = observation(&ix, &ns.name, client, dns, 53, Protocol::UDP);

    let mut a = Replica::start(&ns, "controller-a").await?;
    a.wait_until("leadership", |l| l.leader).await?;
    let mut b = Replica::start(&ns, "controller-b").await?;
    b.wait_until("seeing the leader", |l| {
        l.holder.as_deref() == Some("controller-a")
    })
    .await?;
    assert!(!b.leadership.borrow().leader);
    assert!(a.leadership.borrow().leader, "still the leader");

    // Both replicas see the same flow (agents of both nodes, or a replay): only the leader writes.
    for r in [&a, &b] {
        r.app.learner.observe(&ix, &to_server)?;
    }
    let report_b = b.app.flush().await;
    assert_eq!(
        report_b,
        FlushReport::default(),
        "the follower writes nothing"
    );
    let report_a = a.app.flush().await;
    assert_eq!((report_a.written, report_a.failed), (2, 0), "{report_a:?}");
    assert_eq!(
        rules(&ns).await?,
        [
            ("deployment-http-client-egress".to_string(), 1),
            ("deployment-http-server-ingress".to_string(), 1)
        ]
    );

    // Agents that land on the follower are sent away with a hint; the leader takes them.
    let refused = b.agent_stream().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("not the leader (leader: controller-a)"),
        "{refused:?}"
    );
    a.agent_stream().await.expect("the leader accepts streams");

    // The leader dies without releasing the Lease: the follower takes over once it expires.
    a.elector.abort();
    b.wait_until("taking over", |l| l.leader).await?;
    let lease = Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .get("network-enforcer-controller")
        .await?;
    let spec = lease.spec.unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("controller-b"));
    assert_eq!(spec.lease_transitions, Some(1));

    // Learning continues on the new leader: its pending edge is written (already there: unchanged),
    // the new one added, nothing duplicated.
    b.app.learner.observe(&ix, &to_dns)?;
    let report = b.app.flush().await;
    assert_eq!((report.written, report.failed), (1, 0), "{report:?}");
    assert_eq!(report.unchanged, 1, "{report:?}");
    assert_eq!(
        rules(&ns).await?,
        [
            ("deployment-http-client-egress".to_string(), 2),
            ("deployment-http-server-ingress".to_string(), 1)
        ]
    );
    b.agent_stream()
        .await
        .expect("agents reconnect to the new leader");

    // A leader that stops cleanly releases the Lease: a successor need not wait for the expiry.
    b.elector.abort();
    leader::release(ns.client.clone(), &b.settings).await;
    let mut c = Replica::start(&ns, "controller-c").await?;
    c.wait_until("taking over a released Lease", |l| l.leader)
        .await?;
    let spec = Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .get("network-enforcer-controller")
        .await?
        .spec
        .unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("controller-c"));
    assert_eq!(spec.lease_transitions, Some(2));
    c.elector.abort();
    Ok(())
}
