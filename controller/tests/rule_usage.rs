//! Rule usage and the protect gate against the real local API server (docs/api.md, "Rule usage",
//! "Protect gate"): records go through a real gRPC stream into the real ingest service; the status
//! sync (1 s) writes `status.ruleUsage` in its status patch and keeps the edge history; the policy
//! reconciler sets `UnusedRules` and `WouldBlock` from them.

#[path = "support/in_process.rs"]
mod in_process;

use anyhow::{Context as _, Result, ensure};
use in_process::InProcess;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{ListParams, Patch, PatchParams};
use network_enforcer_api::keys::PROTECT_GATE_ANNOTATION;
use network_enforcer_api::uplink::{self, FlowRecord};
use network_enforcer_api::{
    PolicyMode, RuleUsage, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal,
};
use network_enforcer_controller::monitor::otlp::Disabled;
use network_enforcer_controller::runtime::metrics::Reason;
use network_enforcer_tests::fixture::TestNamespace;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const EGRESS: &str = "deployment-http-client-egress";
const INGRESS: &str = "deployment-http-server-ingress";
const WAIT: Duration = Duration::from_secs(90);

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

/// Sends the learning flows (TCP 18080 both sides, the client's DNS over UDP), writes the two
/// proposals and returns the TCP records.
async fn learn(c: &InProcess) -> Result<Vec<FlowRecord>> {
    use uplink::Direction::{Inbound, Outbound};
    use uplink::Outcome::{Datagram, Established};
    use uplink::Protocol::{Tcp, Udp};
    let tcp = vec![
        c.record(
            &c.client_pod,
            c.service_ip,
            18080,
            Tcp,
            Outbound,
            Established,
        ),
        c.record(&c.server_pod, c.client_ip, 18080, Tcp, Inbound, Established),
    ];
    let dns = c.record(&c.client_pod, c.dns, 53, Udp, Outbound, Datagram);
    c.send([tcp.clone(), vec![dns]].concat()).await?;
    // Evidence of the learning flows is evaluated now, while no policy exists: they match no rule.
    c.sync.attribute_evidence();
    let report = c.app.flush().await;
    ensure!(report.written == 2, "{report:?}");
    Ok(tcp)
}

#[tokio::test]
async fn rule_usage_is_written_by_the_status_sync_and_unused_rules_are_named() -> Result<()> {
    let c = InProcess::start("rule-usage", Arc::new(Disabled), true).await?;
    let ns = &c.ns;
    // Learning (TCP 18080 and the client's DNS lookup), then promotion to monitor.
    let tcp = learn(&c).await?;
    let tcp = || tcp.clone();
    for name in [EGRESS, INGRESS] {
        c.promote(name, "monitor").await?;
    }
    let policies = ns.api::<WorkloadNetworkPolicy>();
    // The first passes write one entry per rule, never matched, watched since then.
    let (egress, ingress) = ns
        .wait_for("ruleUsage entries on both policies", WAIT, || async {
            c.passes_running()?;
            let list = policies.list(&ListParams::default()).await?;
            let find = |name: &str| {
                list.items
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(name))
            };
            let get = |name: &str| {
                find(name)
                    .filter(|p| p.spec.mode == PolicyMode::Monitor && !usage(p).is_empty())
                    .cloned()
            };
            if let Some(both) = get(EGRESS).zip(get(INGRESS)) {
                return Ok(Some(both));
            }
            // Retried until the timeout, which reports the last of these: what was missing.
            let seen = |name: &str| match find(name) {
                None => format!("{name} absent"),
                Some(p) => format!(
                    "{name} in {:?} with {} ruleUsage entries",
                    p.spec.mode,
                    usage(p).len()
                ),
            };
            let failures = |reason: &str| {
                c.sync
                    .metrics()
                    .patch_failures
                    .get_or_create(&Reason {
                        reason: reason.into(),
                    })
                    .get()
            };
            anyhow::bail!(
                "{}; {}; status sync passes: {}, failed patches: {} conflicts, {} errors",
                seen(EGRESS),
                seen(INGRESS),
                c.sync.passes(),
                failures("conflict"),
                failures("error"),
            )
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
    c.send([tcp(), tcp()].concat()).await?;
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
    c.send(tcp()).await?;
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
    let c = InProcess::start("protect-gate", Arc::new(Disabled), true).await?;
    let ns = &c.ns;
    learn(&c).await?;
    // After the proposals: a second port, and DNS over TCP (the proposal has UDP 53 only).
    c.send(vec![
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
    ])
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
        c.promote(name, "protect").await?;
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

/// `check --from-cluster` (docs/operations.md, "`check`"): the cluster's pods and policies with the
/// traffic the controller observed, read from its web view's edges API. After learning and promoting
/// the client's egress to monitor, the client calls a port the policy does not allow: the check names
/// that flow denied by the policy (evaluated as protect would render it) and the learned ones allowed,
/// and `--diff-policies` with the port added lists it as now allowed.
// Two workers: the check runs as a blocking child process while the view answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_from_cluster_evaluates_the_observed_traffic() -> Result<()> {
    use network_enforcer_controller::ui::{self, Reflected, UiMetrics, UiState};
    use uplink::Direction::Outbound;
    use uplink::Outcome::Established;
    use uplink::Protocol::Tcp;
    let c = InProcess::start("check-live", Arc::new(Disabled), true).await?;
    let ns = &c.ns;
    learn(&c).await?;
    c.promote(EGRESS, "monitor").await?;
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let egress = ns
        .wait_for("the egress policy", WAIT, || async {
            Ok(policies.get_opt(EGRESS).await?)
        })
        .await?;
    c.send(vec![c.record(
        &c.client_pod,
        c.service_ip,
        18082,
        Tcp,
        Outbound,
        Established,
    )])
    .await?;
    c.sync.attribute_evidence();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let source = Reflected::start(ns.client.clone(), &c.app.objects);
    let view = tokio::spawn(ui::serve(
        listener,
        UiState::new(source, UiMetrics::default()).with_edges(c.sync.clone()),
    ));

    // The new policies: the egress policy with TCP 18082 to the server added.
    let mut changed = egress.clone();
    let spec = changed.spec.kubernetes.as_mut().unwrap();
    let rules = spec.egress.as_mut().unwrap();
    let mut to_server = rules[egress_rule(&egress, 18080)].clone();
    to_server.ports = Some(vec![serde_json::from_value(
        json!({"protocol": "TCP", "port": 18082}),
    )?]);
    rules.push(to_server);
    let new_policies =
        std::env::temp_dir().join(format!("ne-check-live-{}.json", std::process::id()));
    std::fs::write(&new_policies, serde_json::to_string(&vec![changed])?)?;
    let run = |url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
            .args(["check", "--from-cluster", "--namespace", &ns.name])
            .args(["--controller-url", url, "--explain", "-o", "json"])
            .arg("--diff-policies")
            .arg(&new_policies)
            .env("KUBECONFIG", ns.kubeconfig())
            .output()
    };
    // The view answers once its watches have listed.
    let last_error = std::sync::Mutex::new(String::new());
    let out = ns
        .wait_for("check --from-cluster to succeed", WAIT, || async {
            let out = run(&url)?;
            if !out.status.success() {
                *last_error.lock().unwrap() = String::from_utf8_lossy(&out.stderr).into_owned();
            }
            Ok(out.status.success().then_some(out))
        })
        .await
        .with_context(|| format!("last stderr: {}", last_error.lock().unwrap()))?;
    let _ = std::fs::remove_file(&new_policies);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("3 observed edges of namespace") && stderr.contains("0 left out"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let results = report["results"].as_array().unwrap();
    let verdict = |port: u64| {
        results
            .iter()
            .find(|r| r["port"] == port)
            .unwrap_or_else(|| panic!("no flow on port {port}: {report:#}"))
    };
    let client = format!("{}/{}", ns.name, c.client_pod);
    for port in [18080, 53] {
        let r = verdict(port);
        assert_eq!(
            (&r["from"]["pod"], &r["allowed"]),
            (&json!(client), &json!(true)),
            "{r:#}"
        );
    }
    let denied = verdict(18082);
    assert_eq!(denied["allowed"], false, "{denied:#}");
    assert_eq!(denied["egress"]["allowed"], false, "{denied:#}");
    assert_eq!(
        denied["egress"]["policies"][0]["name"], EGRESS,
        "{denied:#}"
    );
    let diff = &report["diff"];
    assert_eq!(diff["flows"], 3, "{diff:#}");
    assert_eq!(diff["now_denied"], json!([]), "{diff:#}");
    assert_eq!(
        diff["now_allowed"].as_array().map(Vec::len),
        Some(1),
        "{diff:#}"
    );
    assert_eq!(diff["now_allowed"][0]["port"], 18082, "{diff:#}");

    // Without the view: a clear error naming how to reach it.
    view.abort();
    let _ = view.await;
    let out = run(&url)?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("reading the observed edges from the controller's web view")
            && stderr.contains("kubectl port-forward"),
        "{stderr}"
    );
    Ok(())
}
