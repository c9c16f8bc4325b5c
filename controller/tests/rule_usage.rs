//! Rule usage and the protect gate against the real local API server (docs/api.md, "Rule usage",
//! "Protect gate"): records go through a real gRPC stream into the real ingest service; the status
//! sync (1 s) writes `status.ruleUsage` in its status patch and keeps the edge history; the policy
//! reconciler sets `UnusedRules` and `WouldBlock` from them.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{ListParams, Patch, PatchParams};
use network_enforcer_api::keys::{PROMOTE_LABEL, PROTECT_GATE_ANNOTATION};
use network_enforcer_api::uplink::flow_uplink_server::FlowUplinkServer;
use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord};
use network_enforcer_api::{
    Backend, PolicyMode, RuleUsage, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal,
};
use network_enforcer_controller::cluster::watches::{self, SharedIndex};
use network_enforcer_controller::ingest::{
    IngestService, Learning, Limits, TokenReviewAuthenticator,
};
use network_enforcer_controller::learn::proposal_writer::ProposalWriter;
use network_enforcer_controller::monitor::status_sync::{self, StatusSync};
use network_enforcer_controller::policy::protect_gate::GateHistory;
use network_enforcer_controller::reconcile;
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::section10::{
    AGENT_SA, agent_token, cluster_ip, create_workloads, flow_record, pod_json, scheduled_pod,
    send_batches, service_account_with_token,
};
use serde_json::json;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const EGRESS: &str = "deployment-http-client-egress";
const INGRESS: &str = "deployment-http-server-ingress";
const WAIT: Duration = Duration::from_secs(90);

async fn send(
    address: SocketAddr,
    token: &str,
    node: &str,
    sequence: u64,
    records: Vec<FlowRecord>,
) -> Result<()> {
    let n = records.len() as u32;
    let acks = send_batches(
        address,
        token,
        vec![FlowBatch {
            sequence,
            node: node.into(),
            records,
        }],
    )
    .await?;
    ensure!(
        acks.len() == 1 && acks[0].accepted == n && acks[0].rejected == 0,
        "{acks:?}"
    );
    Ok(())
}

fn usage(policy: &WorkloadNetworkPolicy) -> Vec<RuleUsage> {
    policy
        .status
        .as_ref()
        .map(|s| s.rule_usage.clone())
        .unwrap_or_default()
}

fn condition(policy: &WorkloadNetworkPolicy, type_: &str) -> Option<(String, String, String)> {
    policy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The index of the egress rule allowing `port`.
fn egress_rule(policy: &WorkloadNetworkPolicy, port: i32) -> usize {
    let rules = policy
        .spec
        .kubernetes
        .as_ref()
        .unwrap()
        .egress
        .as_ref()
        .unwrap();
    rules
        .iter()
        .position(|r| {
            r.ports.iter().flatten().any(|p| {
                p.port == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port))
            })
        })
        .unwrap_or_else(|| panic!("no egress rule for port {port}: {rules:?}"))
}

/// The controller, in process, on a test namespace holding the end-to-end scenario's workloads: index
/// watches, reconcilers (UnusedRules after the default 7 days; the protect gate fed by the status
/// sync), status sync (1 s), ingest on loopback, and a token of an agent pod on the pods' node.
struct InProcess {
    ns: TestNamespace,
    client_pod: String,
    client_ip: std::net::IpAddr,
    server_pod: String,
    service_ip: std::net::IpAddr,
    dns: std::net::IpAddr,
    token: String,
    node: String,
    address: SocketAddr,
    sync: Arc<StatusSync>,
    writer: Arc<ProposalWriter>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl InProcess {
    async fn start(prefix: &str) -> Result<Self> {
        let ns = TestNamespace::create_with_crds(prefix).await?;
        let n = ns.name.clone();
        let client = ns.client.clone();
        let workloads = create_workloads(&ns, 1).await?;
        let (client_pod, client_ip) = workloads.clients[0].clone();
        let server_pod = workloads.server.clone();
        service_account_with_token(&ns, AGENT_SA).await?;
        let (agent_pod, node) = scheduled_pod(&ns, &pod_json("agent", AGENT_SA, None)?).await?;
        let token = agent_token(&ns, AGENT_SA, &agent_pod).await?;

        let shared = Arc::new(SharedIndex::default());
        let feed = tokio::spawn(watches::run(client.clone(), shared.clone()));
        let sync = StatusSync::new(
            client.clone(),
            shared.clone(),
            status_sync::Settings {
                namespace: Some(n.clone()),
                interval: Duration::from_secs(1),
                evidence_interval: Duration::from_millis(250),
                ..status_sync::Settings::default()
            },
            Arc::new(network_enforcer_controller::monitor::otlp::Disabled),
        );
        let reconcilers = tokio::spawn(reconcile::run(
            client.clone(),
            reconcile::Settings {
                namespace: Some(n.clone()),
                gate: Some(GateHistory(sync.clone())),
                ..reconcile::Settings::default()
            },
        ));
        let sync_task = tokio::spawn(sync.clone().run());
        let writer = Arc::new(ProposalWriter::new(
            client.clone(),
            Backend::Kubernetes,
            BTreeSet::from(["kube-system".to_string()]),
        ));
        let service = IngestService {
            admission: network_enforcer_controller::ingest::admission::Admission::new(
                Default::default(),
            ),
            authenticator: Arc::new(TokenReviewAuthenticator::new(client.clone(), &n, AGENT_SA)),
            learning: Arc::new(Learning {
                index: shared.clone(),
                writer: writer.clone(),
                evidence: Some(sync.evidence()),
            }),
            limits: Limits::default(),
            written: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let grpc = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(FlowUplinkServer::new(service))
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
        let service_ip = cluster_ip(&n, "http-service", &client).await?;
        let dns = cluster_ip("kube-system", "kube-dns", &client).await?;
        let tasks = vec![
            feed.abort_handle(),
            reconcilers.abort_handle(),
            sync_task.abort_handle(),
            grpc.abort_handle(),
        ];
        Ok(Self {
            ns,
            client_pod,
            client_ip,
            server_pod,
            service_ip,
            dns,
            token,
            node,
            address,
            sync,
            writer,
            tasks,
        })
    }

    /// A record of `pod` in this namespace.
    fn record(
        &self,
        pod: &str,
        peer: std::net::IpAddr,
        port: u32,
        protocol: uplink::Protocol,
        direction: uplink::Direction,
        outcome: uplink::Outcome,
    ) -> FlowRecord {
        flow_record(&self.ns.name, pod, peer, port, protocol, direction, outcome)
    }

    /// Sends `records` as batch `sequence`, all accepted.
    async fn send(&self, sequence: u64, records: Vec<FlowRecord>) -> Result<()> {
        send(self.address, &self.token, &self.node, sequence, records).await
    }

    /// Sends the learning flows (TCP 18080 both sides, the client's DNS over UDP), writes the two
    /// proposals and returns the TCP records.
    async fn learn(&self) -> Result<Vec<FlowRecord>> {
        use uplink::Direction::{Inbound, Outbound};
        use uplink::Outcome::{Datagram, Established};
        use uplink::Protocol::{Tcp, Udp};
        let tcp = vec![
            self.record(
                &self.client_pod,
                self.service_ip,
                18080,
                Tcp,
                Outbound,
                Established,
            ),
            self.record(
                &self.server_pod,
                self.client_ip,
                18080,
                Tcp,
                Inbound,
                Established,
            ),
        ];
        let dns = self.record(&self.client_pod, self.dns, 53, Udp, Outbound, Datagram);
        self.send(1, [tcp.clone(), vec![dns]].concat()).await?;
        // Evidence of the learning flows is evaluated now, while no policy exists: they match no rule.
        self.sync.attribute_evidence();
        let report = self.writer.flush().await;
        ensure!(report.written == 2, "{report:?}");
        Ok(tcp)
    }
}

#[tokio::test]
async fn rule_usage_is_written_by_the_status_sync_and_unused_rules_are_named() -> Result<()> {
    let c = InProcess::start("rule-usage").await?;
    let ns = &c.ns;
    // Learning (TCP 18080 and the client's DNS lookup), then promotion to monitor.
    let tcp = c.learn().await?;
    let tcp = || tcp.clone();
    let mut sequence = 1;
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    for name in [EGRESS, INGRESS] {
        proposals
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {PROMOTE_LABEL: "monitor"}}})),
            )
            .await?;
    }
    let policies = ns.api::<WorkloadNetworkPolicy>();
    // The first passes write one entry per rule, never matched, watched since then.
    let (egress, ingress) = ns
        .wait_for("ruleUsage entries on both policies", WAIT, || async {
            let list = policies.list(&ListParams::default()).await?;
            let get = |name: &str| {
                list.items
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(name))
                    .filter(|p| p.spec.mode == PolicyMode::Monitor && !usage(p).is_empty())
                    .cloned()
            };
            Ok(get(EGRESS).zip(get(INGRESS)))
        })
        .await?;
    let tcp_rule = egress_rule(&egress, 18080);
    let dns_rule = egress_rule(&egress, 53);
    assert_eq!(usage(&egress).len(), 2, "{:#?}", usage(&egress));
    assert_eq!(usage(&ingress).len(), 1, "{:#?}", usage(&ingress));
    for entry in usage(&egress).iter().chain(&usage(&ingress)) {
        assert_eq!(
            (entry.last_matched.as_ref(), entry.peers),
            (None, 0),
            "{entry:?}"
        );
    }

    // Traffic on the TCP rule only: both sides' rules record it, the DNS rule stays unmatched.
    let sent_at = k8s_openapi::jiff::Timestamp::now();
    sequence += 1;
    c.send(sequence, [tcp(), tcp()].concat()).await?;
    let matched = |p: &WorkloadNetworkPolicy, rule: usize| {
        usage(p)
            .into_iter()
            .find(|u| u.rule == rule as i32)
            .filter(|u| u.last_matched.is_some())
    };
    let egress = ns
        .wait_for(
            "the TCP rule's usage on the egress policy",
            WAIT,
            || async {
                let p = policies.get(EGRESS).await?;
                Ok(matched(&p, tcp_rule).map(|_| p))
            },
        )
        .await?;
    let ingress = ns
        .wait_for(
            "the TCP rule's usage on the ingress policy",
            WAIT,
            || async {
                let p = policies.get(INGRESS).await?;
                Ok(matched(&p, 0).map(|_| p))
            },
        )
        .await?;
    for (policy, rule) in [(&egress, tcp_rule), (&ingress, 0)] {
        let entry = matched(policy, rule).unwrap();
        assert_eq!(entry.peers, 1, "one client workload, one server: {entry:?}");
        let last = entry.last_matched.unwrap().0;
        // The records' own time (a millisecond may round either way).
        let skew = k8s_openapi::jiff::SignedDuration::from_secs(5);
        assert!(
            last >= sent_at - skew && last <= k8s_openapi::jiff::Timestamp::now(),
            "{last} vs {sent_at}"
        );
    }
    let dns_entry = usage(&egress)
        .into_iter()
        .find(|u| u.rule == dns_rule as i32)
        .unwrap();
    assert_eq!((dns_entry.last_matched, dns_entry.peers), (None, 0));
    let used = |p: &WorkloadNetworkPolicy| condition(p, "UnusedRules");
    ns.wait_for("UnusedRules=False on both", WAIT, || async {
        let (e, i) = (policies.get(EGRESS).await?, policies.get(INGRESS).await?);
        Ok([used(&e), used(&i)]
            .iter()
            .all(|c| {
                c.as_ref()
                    .is_some_and(|c| c.0 == "False" && c.1 == "RulesUsed")
            })
            .then_some(()))
    })
    .await?;

    // What the status holds outlives the process's memory: a status written by an earlier controller
    // (the DNS rule watched for 30 days, 5 peers on the TCP rule) is merged, not overwritten, and the
    // DNS rule, never matched for 30 days, is named by UnusedRules.
    let mut earlier = usage(&egress);
    for entry in &mut earlier {
        if entry.rule == dns_rule as i32 {
            entry.since = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now()
                    - k8s_openapi::jiff::SignedDuration::from_hours(30 * 24),
            );
        } else {
            entry.peers = 5;
        }
    }
    policies
        .patch_status(
            EGRESS,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ruleUsage": earlier}})),
        )
        .await?;
    let (status, reason, message) = ns
        .wait_for("UnusedRules=True on the egress policy", WAIT, || async {
            let p = policies.get(EGRESS).await?;
            Ok(used(&p).filter(|c| c.0 == "True"))
        })
        .await?;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "RulesUnused"));
    assert!(
        message.starts_with("1 of 2 rules allowed no observed flow within 7d")
            && message.contains(&format!("egress[{dns_rule}] (never matched)"))
            && !message.contains(&format!("egress[{tcp_rule}]")),
        "{message}"
    );
    // More traffic and passes: the stored 5 peers stay (max of both), and the ingress policy is fine.
    sequence += 1;
    c.send(sequence, tcp()).await?;
    let seen = c.sync.passes();
    ns.wait_for("three more status passes", WAIT, || async {
        Ok((c.sync.passes() >= seen + 3).then_some(()))
    })
    .await?;
    let now = policies.get(EGRESS).await?;
    let tcp_entry = matched(&now, tcp_rule).unwrap();
    assert_eq!(tcp_entry.peers, 5, "{:#?}", usage(&now));
    let dns_entry = usage(&now)
        .into_iter()
        .find(|u| u.rule == dns_rule as i32)
        .unwrap();
    // Times are stored to the second.
    assert_eq!(
        dns_entry.since.0.as_second(),
        earlier[dns_rule].since.0.as_second()
    );
    assert_eq!(
        used(&policies.get(INGRESS).await?).map(|c| c.0),
        Some("False".to_string())
    );

    Ok(())
}

/// The NetworkPolicy `name` rendered in the namespace, if any.
async fn network_policy(ns: &TestNamespace, name: &str) -> Result<Option<NetworkPolicy>> {
    Ok(ns.api::<NetworkPolicy>().get_opt(name).await?)
}

/// The protect gate (docs/api.md, "Protect gate") on the real API server: flows observed after the
/// proposals were written (TCP 18082 to the server, DNS over TCP) are replayed when the proposals are
/// promoted to protect. The client's strict egress policy stays in monitor (no NetworkPolicy, Ready
/// False HeldByProtectGate, WouldBlock naming the DNS cut, a Warning Event) until its rules allow the
/// flows; the server's ingress policy, not strict, is rendered and says what it blocks.
#[tokio::test]
async fn the_protect_gate_replays_observed_flows_and_holds_a_strict_policy() -> Result<()> {
    use uplink::Direction::{Inbound, Outbound};
    use uplink::Outcome::Established;
    use uplink::Protocol::Tcp;
    let c = InProcess::start("protect-gate").await?;
    let ns = &c.ns;
    c.learn().await?;
    // After the proposals: a second port, and DNS over TCP (the proposal has UDP 53 only).
    c.send(
        2,
        vec![
            c.record(
                &c.client_pod,
                c.service_ip,
                18082,
                Tcp,
                Outbound,
                Established,
            ),
            c.record(&c.server_pod, c.client_ip, 18082, Tcp, Inbound, Established),
            c.record(&c.client_pod, c.dns, 53, Tcp, Outbound, Established),
        ],
    )
    .await?;
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    proposals
        .patch(
            EGRESS,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {PROTECT_GATE_ANNOTATION: "strict"}}}),
            ),
        )
        .await?;
    for name in [EGRESS, INGRESS] {
        proposals
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {PROMOTE_LABEL: "protect"}}})),
            )
            .await?;
    }
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let gate = |p: &WorkloadNetworkPolicy| condition(p, "WouldBlock");
    let (status, reason, message) = ns
        .wait_for("WouldBlock on the egress policy", WAIT, || async {
            Ok(match policies.get_opt(EGRESS).await? {
                Some(p) => gate(&p),
                None => None,
            })
        })
        .await?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "WouldCutDNS"),
        "{message}"
    );
    assert!(
        message
            .starts_with("2 of 4 observed flows would be blocked, including the workload's DNS: ")
            && message.contains("/Deployment/http-server TCP/18082")
            && message.contains("kube-system/")
            && message.contains(" TCP/53 ")
            && message.contains("protect-gate strict"),
        "{message}"
    );
    let egress = policies.get(EGRESS).await?;
    assert_eq!(egress.spec.mode, PolicyMode::Protect);
    let ready = condition(&egress, "Ready").unwrap();
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "HeldByProtectGate")
    );
    ensure!(
        network_policy(ns, EGRESS).await?.is_none(),
        "a held policy renders no NetworkPolicy"
    );
    let events = ns.api::<Event>();
    ns.wait_for("the WouldBlock Event", WAIT, || async {
        let list = events.list(&ListParams::default()).await?;
        Ok(list
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("WouldBlock")
                    && e.involved_object.name.as_deref() == Some(EGRESS)
                    && e.type_.as_deref() == Some("Warning")
            })
            .map(drop))
    })
    .await?;
    // Not strict: rendered, and the condition says what it blocks (the second port).
    let (status, reason, message) = ns
        .wait_for("WouldBlock on the ingress policy", WAIT, || async {
            Ok(match policies.get_opt(INGRESS).await? {
                Some(p) => gate(&p),
                None => None,
            })
        })
        .await?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "WouldBlockObservedFlows")
    );
    assert!(
        message.starts_with("1 of 2 observed flows would be blocked: "),
        "{message}"
    );
    ns.wait_for("the ingress NetworkPolicy", WAIT, || async {
        network_policy(ns, INGRESS).await
    })
    .await?;

    // The egress rules grow to allow what was observed: the gate is clean and protect renders.
    let mut spec = egress.spec.kubernetes.clone().unwrap();
    let rules = spec.egress.as_mut().unwrap();
    let to_server = rules[egress_rule(&egress, 18080)].clone();
    let to_dns = rules[egress_rule(&egress, 53)].clone();
    for (mut rule, protocol, port) in [(to_server, "TCP", 18082), (to_dns, "TCP", 53)] {
        rule.ports = Some(vec![serde_json::from_value(
            json!({"protocol": protocol, "port": port}),
        )?]);
        rules.push(rule);
    }
    policies
        .patch(
            EGRESS,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetes": spec}})),
        )
        .await?;
    let (status, reason, _) = ns
        .wait_for("WouldBlock=False on the egress policy", WAIT, || async {
            Ok(gate(&policies.get(EGRESS).await?).filter(|c| c.0 == "False"))
        })
        .await?;
    assert_eq!(reason, "NoObservedFlowBlocked");
    assert_eq!(status, "False");
    ns.wait_for("the egress NetworkPolicy", WAIT, || async {
        network_policy(ns, EGRESS).await
    })
    .await?;
    let ready = condition(&policies.get(EGRESS).await?, "Ready").unwrap();
    assert_eq!(ready.0, "True", "{ready:?}");
    Ok(())
}
