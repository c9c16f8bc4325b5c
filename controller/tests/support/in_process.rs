//! The controller in process on a test namespace holding the end-to-end scenario's workloads: index
//! watches, reconcilers, the status sync (1 s, evidence every 250 ms), ingest on loopback, and the
//! token of an agent pod on the pods' node. Dropping it stops every task.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use anyhow::{Result, ensure};
use kube::api::{Patch, PatchParams};
use network_enforcer_api::keys::PROMOTE_LABEL;
use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord};
use network_enforcer_api::{Backend, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::app::{Acknowledge, App};
use network_enforcer_controller::ingest::TokenReviewAuthenticator;
use network_enforcer_controller::monitor::otlp::ViolationSink;
use network_enforcer_controller::monitor::status_sync::{self, StatusSync};
use network_enforcer_controller::policy::protect_gate::GateHistory;
use network_enforcer_controller::reconcile;
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::scenario_fixture::{
    AGENT_SA, agent_token, cluster_ip, create_workloads, flow_record, pod_json, scheduled_pod,
    send_batches, service_account_with_token,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

pub struct InProcess {
    pub ns: TestNamespace,
    pub client_pod: String,
    pub client_ip: IpAddr,
    pub server_pod: String,
    /// `http-service`'s ClusterIP.
    pub service_ip: IpAddr,
    /// `kube-system/kube-dns`'s ClusterIP.
    pub dns: IpAddr,
    pub sync: Arc<StatusSync>,
    pub app: App,
    /// The status sync's passes, until a test stops them ([`InProcess::stop_passes`]).
    passes: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    token: String,
    node: String,
    address: SocketAddr,
    sequence: AtomicU64,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(passes) = self.passes.lock().unwrap().take() {
            passes.abort();
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl InProcess {
    /// Starts it in a new namespace named after `prefix`, reporting violations to `sink`; with
    /// `gate`, the reconcilers replay the status sync's edge history (the protect gate).
    pub async fn start(prefix: &str, sink: Arc<dyn ViolationSink>, gate: bool) -> Result<Self> {
        let ns = TestNamespace::create_with_crds(prefix).await?;
        let n = ns.name.clone();
        let client = ns.client.clone();
        let workloads = create_workloads(&ns, 1).await?;
        let (client_pod, client_ip) = workloads.clients[0].clone();
        let server_pod = workloads.server.clone();
        service_account_with_token(&ns, AGENT_SA).await?;
        let (agent_pod, node) = scheduled_pod(&ns, &pod_json("agent", AGENT_SA, None)?).await?;
        let token = agent_token(&ns, AGENT_SA, &agent_pod).await?;

        // As the binary wires them: the reconcilers share the app's watches of policies, proposals
        // and NetworkPolicies (proposal writes start from its cache of proposals).
        let settings = reconcile::Settings {
            namespace: Some(n.clone()),
            ..reconcile::Settings::default()
        };
        let app = App::builder(client.clone(), Backend::Kubernetes)
            .excluded_namespaces(["kube-system".to_string()])
            .status_sync(
                status_sync::Settings {
                    namespace: Some(n.clone()),
                    interval: Duration::from_secs(1),
                    evidence_interval: Duration::from_millis(250),
                    // As the binary does: the reconciler's memory of backends.
                    backends: settings.backends.clone(),
                    ..status_sync::Settings::default()
                },
                sink,
            )
            .acknowledge(Acknowledge::OnceMerged)
            .build();
        let shared = app.index.clone();
        let sync = app.status_sync.clone().expect("built with a status sync");
        let feed = tokio::spawn(app.watch_cluster());
        let reconcilers = reconcile::Reconcilers::new(&client, app.objects.clone(), settings);
        let reconcilers = if gate {
            reconcilers.with_gate(GateHistory(sync.clone()))
        } else {
            reconcilers
        };
        let reconcilers = tokio::spawn(reconcilers.run());
        let sync_watches = tokio::spawn(sync.clone().watches());
        let passes = tokio::spawn(sync.clone().passes_forever());
        let service = app.ingest(Arc::new(TokenReviewAuthenticator::new(
            client.clone(),
            &n,
            AGENT_SA,
        )));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let grpc = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service.into_server())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        ns.wait_for("the index to see the pods", WAIT, || async {
            let index = shared.index.read().unwrap();
            Ok((shared.ready()
                && index
                    .pod(&n, &server_pod)
                    .is_some_and(|p| !p.ips.is_empty())
                && index.pod(&n, &client_pod).is_some())
            .then_some(()))
        })
        .await?;
        // Evidence is attributed once the status sync's watches have listed; tests that drive
        // `attribute_evidence` by hand start from there.
        tokio::time::timeout(WAIT, sync.wait_ready())
            .await
            .map_err(|_| {
                anyhow::anyhow!("the status sync's watches did not list within {WAIT:?}")
            })?;
        let service_ip = cluster_ip(&n, "http-service", &client).await?;
        let dns = cluster_ip("kube-system", "kube-dns", &client).await?;
        let tasks = vec![
            feed.abort_handle(),
            reconcilers.abort_handle(),
            sync_watches.abort_handle(),
            grpc.abort_handle(),
        ];
        Ok(Self {
            ns,
            client_pod,
            client_ip,
            server_pod,
            service_ip,
            dns,
            sync,
            app,
            passes: std::sync::Mutex::new(Some(passes)),
            token,
            node,
            address,
            sequence: AtomicU64::new(0),
            tasks,
        })
    }

    /// Stops the status sync's passes (and waits until they have), so that a test drives them by hand.
    pub async fn stop_passes(&self) {
        let passes = self.passes.lock().unwrap().take();
        if let Some(passes) = passes {
            passes.abort();
            let _ = passes.await;
        }
    }

    /// Fails once the status sync's passes have ended without [`InProcess::stop_passes`]: a panic in
    /// their task would otherwise show only as a test waiting for a status that never comes.
    pub fn passes_running(&self) -> Result<()> {
        let passes = self.passes.lock().unwrap();
        ensure!(
            passes.as_ref().is_none_or(|p| !p.is_finished()),
            "the status sync's passes have ended (a panic in them?)"
        );
        Ok(())
    }

    /// Labels proposal `name` for promotion into `mode` (`monitor` or `protect`).
    pub async fn promote(&self, name: &str, mode: &str) -> Result<()> {
        self.ns
            .api::<WorkloadNetworkPolicyProposal>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {PROMOTE_LABEL: mode}}})),
            )
            .await?;
        Ok(())
    }

    /// A record of `pod` in this namespace.
    pub fn record(
        &self,
        pod: &str,
        peer: IpAddr,
        port: u32,
        protocol: uplink::Protocol,
        direction: uplink::Direction,
        outcome: uplink::Outcome,
    ) -> FlowRecord {
        flow_record(&self.ns.name, pod, peer, port, protocol, direction, outcome)
    }

    /// Sends `records` as the agent's next batch and requires every record accepted.
    pub async fn send(&self, records: Vec<FlowRecord>) -> Result<()> {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
        let n = records.len() as u32;
        let acks = send_batches(
            self.address,
            &self.token,
            vec![FlowBatch {
                sequence,
                node: self.node.clone(),
                records,
                instance: 0,
                health: None,
            }],
        )
        .await?;
        ensure!(
            acks.len() == 1 && acks[0].accepted == n && acks[0].rejected == 0,
            "{acks:?}"
        );
        Ok(())
    }
}
