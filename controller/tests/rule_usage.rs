//! Rule usage against the real local API server (docs/api.md, "Rule usage"): records go through a real
//! gRPC stream into the real ingest service; the status sync (1 s) writes `status.ruleUsage` in its
//! status patch; the policy reconciler sets `UnusedRules` from it.

use anyhow::{Result, ensure};
use kube::api::{ListParams, Patch, PatchParams};
use network_enforcer_api::keys::PROMOTE_LABEL;
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

#[tokio::test]
async fn rule_usage_is_written_by_the_status_sync_and_unused_rules_are_named() -> Result<()> {
    let ns = TestNamespace::create_with_crds("rule-usage").await?;
    let n = ns.name.clone();
    let client = ns.client.clone();
    let workloads = create_workloads(&ns, 1).await?;
    let (client_pod, client_ip) = workloads.clients[0].clone();
    let server_pod = workloads.server.clone();
    service_account_with_token(&ns, AGENT_SA).await?;
    let (agent_pod, node) = scheduled_pod(&ns, &pod_json("agent", AGENT_SA, None)?).await?;
    let token = agent_token(&ns, AGENT_SA, &agent_pod).await?;

    // The controller, in process: index watches, reconcilers (UnusedRules after the default 7 days),
    // status sync (1 s), ingest on loopback.
    let shared = Arc::new(SharedIndex::default());
    let feed = tokio::spawn(watches::run(client.clone(), shared.clone()));
    let reconcilers = tokio::spawn(reconcile::run(
        client.clone(),
        reconcile::Settings {
            namespace: Some(n.clone()),
            ..reconcile::Settings::default()
        },
    ));
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
    let grpc = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(FlowUplinkServer::new(service))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
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
    use uplink::Direction::{Inbound, Outbound};
    use uplink::Outcome::{Datagram, Established};
    use uplink::Protocol::{Tcp, Udp};
    let record = |pod: &str, peer, port, protocol, direction, outcome| {
        flow_record(&n, pod, peer, port, protocol, direction, outcome)
    };
    let tcp = || {
        vec![
            record(&client_pod, service_ip, 18080, Tcp, Outbound, Established),
            record(&server_pod, client_ip, 18080, Tcp, Inbound, Established),
        ]
    };

    // Learning (TCP 18080 and the client's DNS lookup), then promotion to monitor.
    let mut sequence = 1;
    let learned = [
        tcp(),
        vec![record(&client_pod, dns, 53, Udp, Outbound, Datagram)],
    ]
    .concat();
    send(address, &token, &node, sequence, learned).await?;
    // Evidence of the learning flows is evaluated now, while no policy exists: they match no rule.
    sync.attribute_evidence();
    let report = writer.flush().await;
    ensure!(report.written == 2, "{report:?}");
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
    send(address, &token, &node, sequence, [tcp(), tcp()].concat()).await?;
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
    send(address, &token, &node, sequence, tcp()).await?;
    let seen = sync.passes();
    ns.wait_for("three more status passes", WAIT, || async {
        Ok((sync.passes() >= seen + 3).then_some(()))
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

    for task in [feed, reconcilers, sync_task] {
        task.abort();
    }
    grpc.abort();
    Ok(())
}
