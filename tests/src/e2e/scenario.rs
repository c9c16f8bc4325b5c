//! The end-to-end scenario (docs/development.md), Kubernetes backend with the eBPF-only provider,
//! against our chart installed in the local cluster: every step and assertion of the reference's
//! end-to-end suite. Every flow comes from the agent's eBPF programs seeing real socat traffic from
//! inside the pods.
//!
//! The local cluster's CNI does not enforce NetworkPolicy. When the scenario says a flow becomes
//! blocked (step 5: UDP from `http-client` to `http-service:18083`), the agent's own enforcement
//! blocks it through the NetworkPolicy the controller rendered (the release is installed with
//! [`AGENT_ENFORCEMENT`], the chart's `agent.enforcement.mode=networkpolicy`). Which flow must be
//! blocked comes from the scenario, never from our evaluator.

use anyhow::{Context, Result, bail, ensure};
use network_enforcer_api::keys::{PROMOTE_LABEL, PROMOTED_FROM_LABEL};
use network_enforcer_api::{
    Direction, PolicyMode, Protocol as CrdProtocol, ViolationRecord, WorkloadNetworkPolicy,
    WorkloadNetworkPolicyProposal,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::poll;
use super::release::Release;
use super::workload::{self, Namespace, Protocol, send};

/// The proposal learned for the client's egress.
pub const EGRESS: &str = "deployment-http-client-egress";
/// The proposal learned for the server's ingress.
pub const INGRESS: &str = "deployment-http-server-ingress";
/// The scenario's Service.
pub const SERVICE: &str = "http-service";
/// Step 2 of the scenario: "within 2 minutes".
pub const LEARN_TIMEOUT: Duration = Duration::from_secs(120);
/// Promotion, rendering and status sync each take a few controller passes.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the controller writes WorkloadNetworkPolicy status in these installs (chart value
/// `controller.wnpStatusUpdateInterval`; the reference's default is 30 s).
pub const STATUS_INTERVAL_SECONDS: u64 = 5;

/// The `--set` value that makes the agent enforce NetworkPolicies.
pub const AGENT_ENFORCEMENT: &str = "agent.enforcement.mode=networkpolicy";

/// `--set` values of the release (in `release_namespace`) the scenario runs against, besides the
/// local ones.
pub fn release_values(release_namespace: &str) -> Vec<String> {
    vec![
        "controller.provider.name=ebpf".into(),
        format!("controller.wnpStatusUpdateInterval={STATUS_INTERVAL_SECONDS}s"),
        // Our own namespace (the default), and kube-system, shared with every other test on this
        // cluster: learn nothing there.
        format!("controller.excludeNamespaces={{kube-system,{release_namespace}}}"),
        // The local cluster's ranges: external peers outside them are learned without the grace.
        format!(
            "controller.clusterCIDRs={{{},{}}}",
            crate::cluster::layout::CLUSTER_CIDR,
            crate::cluster::layout::SERVICE_CIDR
        ),
    ]
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Timings {
    /// From creating the namespace to the last assertion.
    pub scenario: Duration,
    /// From the first packet of step 1 to each proposal existing (one sample per proposal).
    pub first_packet_to_proposal: Vec<Duration>,
}

/// Step progress, for the demo and test output.
pub fn say(step: &str) {
    eprintln!("[e2e] {step}");
}

/// The running workload of the scenario.
pub struct Workload {
    /// Its namespace (deleted on drop).
    pub ns: Namespace,
    /// The `http-client` pod: name and IP.
    pub client: (String, String),
    /// The `http-server` pod: name and IP.
    pub server: (String, String),
    /// `http-service`'s ClusterIP.
    pub service_ip: String,
}

/// Which node each of the scenario's pods runs on (by Node name); `None`: wherever the scheduler puts
/// it (node 1 of the local cluster: extra nodes are tainted).
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// The node of `http-client`.
    pub client: Option<String>,
    /// The node of `http-server`.
    pub server: Option<String>,
}

/// Creates the scenario's workload in a fresh namespace `name`: ServiceAccounts `http-client-sa` and
/// `http-server-sa`, Service `http-service` (TCP 18080→18080, TCP 18082→18082, UDP 18083→18081),
/// Deployment `http-server` echoing on TCP 18080, TCP 18082 and UDP 18081, Deployment `http-client`.
pub fn create_workload(kubeconfig: &Path, name: &str) -> Result<Workload> {
    create_workload_on(kubeconfig, name, &Placement::default())
}

/// [`create_workload`] with the pods on the nodes `placement` names.
pub fn create_workload_on(
    kubeconfig: &Path,
    name: &str,
    placement: &Placement,
) -> Result<Workload> {
    let placed = |manifest: String, node: &Option<String>| match node {
        Some(node) => workload::on_node(&manifest, node),
        None => Ok(manifest),
    };
    let ns = Namespace::create(kubeconfig, name)?;
    ns.service_account("http-client-sa")?;
    ns.service_account("http-server-sa")?;
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE},
        "spec": {"selector": {"app": "http-server"}, "ports": [
            {"name": "tcp-18080", "port": 18080, "targetPort": 18080, "protocol": "TCP"},
            {"name": "tcp-18082", "port": 18082, "targetPort": 18082, "protocol": "TCP"},
            {"name": "udp-18083", "port": 18083, "targetPort": 18081, "protocol": "UDP"}]}
    });
    ns.apply(&service.to_string())?;
    ns.apply(&placed(
        workload::deployment(
            "http-server",
            "http-server-sa",
            &workload::echo_server_script(&[18080, 18082], &[18081]),
            &[(18080, "TCP"), (18082, "TCP"), (18081, "UDP")],
        ),
        &placement.server,
    )?)?;
    ns.apply(&placed(
        workload::deployment("http-client", "http-client-sa", "sleep 100000", &[]),
        &placement.client,
    )?)?;
    let server = ns.wait_for_deployment("http-server")?.remove(0);
    let client = ns.wait_for_deployment("http-client")?.remove(0);
    ns.wait_for_endpoints(SERVICE, 1)?;
    let service_ip = ns.cluster_ip(SERVICE)?;
    Ok(Workload {
        ns,
        client,
        server,
        service_ip,
    })
}

impl Workload {
    /// Sends `payload` from the client pod to `http-service:port` (the name resolved through the
    /// cluster DNS); returns whether it was echoed.
    pub fn send(&self, protocol: Protocol, port: u16, payload: &str) -> Result<bool> {
        send(&self.ns, &self.client.0, protocol, SERVICE, port, payload)
    }

    /// Sends until the echo comes back (a Service is programmed into kube-proxy and the DNS a moment
    /// after its endpoints exist). Fails after `timeout`.
    pub fn send_until_echoed(
        &self,
        protocol: Protocol,
        port: u16,
        timeout: Duration,
    ) -> Result<()> {
        poll(
            &format!("{protocol:?} {SERVICE}:{port} to echo"),
            timeout,
            Duration::from_millis(500),
            || Ok(self.send(protocol, port, "hello")?.then_some(())),
            || self.ns.describe(),
        )
    }

    /// The proposals in the namespace, by name.
    pub fn proposals(&self) -> Result<BTreeMap<String, WorkloadNetworkPolicyProposal>> {
        list(&self.ns, "workloadnetworkpolicyproposals")
    }

    /// The policies in the namespace, by name.
    pub fn policies(&self) -> Result<BTreeMap<String, WorkloadNetworkPolicy>> {
        list(&self.ns, "workloadnetworkpolicies")
    }

    /// Sets label `promote=<mode>` on proposal `name`.
    pub fn promote(&self, name: &str, mode: &str) -> Result<()> {
        self.ns
            .kubectl(&[
                "label",
                "workloadnetworkpolicyproposal",
                name,
                &format!("{PROMOTE_LABEL}={mode}"),
            ])
            .map(drop)
    }

    /// Sets `spec.mode` of policy `name`.
    pub fn set_mode(&self, name: &str, mode: &str) -> Result<()> {
        self.ns
            .kubectl(&[
                "patch",
                "workloadnetworkpolicy",
                name,
                "--type=merge",
                "-p",
                &json!({"spec": {"mode": mode}}).to_string(),
            ])
            .map(drop)
    }
}

/// `kubectl get <resource> -o json` in `ns`, by name.
pub fn list<T: serde::de::DeserializeOwned>(
    ns: &Namespace,
    resource: &str,
) -> Result<BTreeMap<String, T>> {
    let text = ns.kubectl(&["get", resource, "-o", "json"])?;
    let list: Value = serde_json::from_str(&text)?;
    let mut out = BTreeMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let name = item["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let object = serde_json::from_value(item.clone())
            .with_context(|| format!("reading {resource} {name}"))?;
        out.insert(name, object);
    }
    Ok(out)
}

/// The spec of step 2's two proposals, as the reference's scenario states them: the client's egress to
/// the server's pods on TCP 18080 and to the cluster DNS on UDP 53; the server's ingress from the
/// client's pods on TCP 18080.
pub fn expected_proposal_specs(namespace: &str) -> BTreeMap<String, Value> {
    expected_proposal_specs_as_written(namespace)
        .into_iter()
        .map(|(name, spec)| (name, rules_sorted(spec)))
        .collect()
}

/// [`expected_proposal_specs`] in the order the controller writes the rules.
pub fn expected_proposal_specs_as_written(namespace: &str) -> BTreeMap<String, Value> {
    let peer = |ns: &str, key: &str, value: &str| {
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
               "podSelector": {"matchLabels": {key: value}}})
    };
    BTreeMap::from([
        (
            EGRESS.to_string(),
            json!({
                "backend": "kubernetes", "direction": "Egress",
                "targetRef": {"kind": "Deployment", "name": "http-client"},
                "kubernetes": {
                    "podSelector": {"matchLabels": {"app": "http-client"}},
                    "policyTypes": ["Egress"],
                    "egress": [
                        {"to": [peer(namespace, "app", "http-server")],
                         "ports": [{"protocol": "TCP", "port": 18080}]},
                        {"to": [peer("kube-system", "k8s-app", "kube-dns")],
                         "ports": [{"protocol": "UDP", "port": 53}]}
                    ]
                }
            }),
        ),
        (
            INGRESS.to_string(),
            json!({
                "backend": "kubernetes", "direction": "Ingress",
                "targetRef": {"kind": "Deployment", "name": "http-server"},
                "kubernetes": {
                    "podSelector": {"matchLabels": {"app": "http-server"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {"from": [peer(namespace, "app", "http-client")],
                         "ports": [{"protocol": "TCP", "port": 18080}]}
                    ]
                }
            }),
        ),
    ])
}

/// The proposals' specs as JSON, by name, with their rules in a canonical order ([`rules_sorted`]).
pub fn proposal_specs(w: &Workload) -> Result<BTreeMap<String, Value>> {
    w.proposals()?
        .into_iter()
        .map(|(name, p)| Ok((name, rules_sorted(serde_json::to_value(&p.spec)?))))
        .collect()
}

/// After promotion, for 15 s (an agent flush and a few controller flushes): no proposal is re-created;
/// then the policies' specs are still `promoted_specs`. Returns the policies.
pub fn no_proposal_and_specs_unchanged(
    w: &Workload,
    promoted_specs: &BTreeMap<&'static str, Value>,
) -> Result<BTreeMap<String, WorkloadNetworkPolicy>> {
    let settle = Instant::now() + Duration::from_secs(15);
    while Instant::now() < settle {
        let proposals = w.proposals()?;
        ensure!(
            proposals.is_empty(),
            "proposals re-created after promotion: {:?}",
            proposals.keys().collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let policies = w.policies()?;
    for (name, policy) in &policies {
        let spec = serde_json::to_value(&policy.spec)?;
        ensure!(
            Some(&spec) == promoted_specs.get(name.as_str()),
            "{name}: spec changed after monitor violations: {spec:#}"
        );
    }
    Ok(policies)
}

/// Step 3: labels both proposals `promote=monitor`, waits until they are two monitor-mode policies
/// and no proposal is left, and checks the policies against what was `learned` (see
/// [`check_promoted`], whose specs it returns). `describe` explains a timeout.
pub fn promote_both_to_monitor(
    w: &Workload,
    learned: &BTreeMap<String, Value>,
    describe: impl Fn() -> String,
) -> Result<BTreeMap<&'static str, Value>> {
    say("step 3: promote=monitor on both proposals");
    for name in [EGRESS, INGRESS] {
        w.promote(name, "monitor")?;
    }
    let policies = poll(
        "two monitor policies and no proposals",
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let policies = w.policies()?;
            let monitor = policies
                .values()
                .filter(|p| p.spec.mode == PolicyMode::Monitor)
                .count();
            Ok((monitor == 2 && w.proposals()?.is_empty()).then_some(policies))
        },
        describe,
    )?;
    check_promoted(&policies, learned)
}

/// Step 3's check: each policy carries its proposal's name in the promoted-from label and exactly the
/// proposal's (rule-sorted) spec. Returns each policy's spec as promoted, for the later checks that
/// the controller never changes it.
pub fn check_promoted(
    policies: &BTreeMap<String, WorkloadNetworkPolicy>,
    learned: &BTreeMap<String, Value>,
) -> Result<BTreeMap<&'static str, Value>> {
    let mut promoted_specs = BTreeMap::new();
    for name in [EGRESS, INGRESS] {
        let policy = policies.get(name).context("policy missing")?;
        let from = policy
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PROMOTED_FROM_LABEL));
        ensure!(
            from.map(String::as_str) == Some(name),
            "{name}: label {PROMOTED_FROM_LABEL} is {from:?}"
        );
        let spec = rules_sorted(spec_without_mode(policy)?);
        let proposal = learned.get(name).context("proposal missing")?;
        ensure!(
            spec == *proposal,
            "{name}: the policy's spec differs from its proposal's: {spec:#} vs {proposal:#}"
        );
        promoted_specs.insert(name, serde_json::to_value(&policy.spec)?);
    }
    Ok(promoted_specs)
}

/// `spec` with its `kubernetes.egress` / `kubernetes.ingress` rules sorted: the order of a
/// NetworkPolicy's rules carries no meaning, and a proposal lists them in the order they were learned
/// (here the DNS lookup comes before the TCP connection it resolves for).
pub fn rules_sorted(mut spec: Value) -> Value {
    for key in ["egress", "ingress"] {
        if let Some(rules) = spec["kubernetes"][key].as_array_mut() {
            rules.sort_by_key(|r| r.to_string());
        }
    }
    spec
}

/// A policy's spec without `mode`: what it took over from its proposal.
pub fn spec_without_mode(policy: &WorkloadNetworkPolicy) -> Result<Value> {
    let mut spec = serde_json::to_value(&policy.spec)?;
    if let Some(map) = spec.as_object_mut() {
        map.remove("mode");
    }
    Ok(spec)
}

/// The JSON flow lines of every agent's `flows -o json` (one agent per node).
fn agent_flows(release: &Release, namespace: &str, since: Duration) -> Result<Vec<Value>> {
    let since = format!("{}s", since.as_secs().max(1));
    let out = release.exec_agents(&[
        "network-enforcer-agent",
        "flows",
        "--since",
        &since,
        "--interval",
        "1",
        "--namespace",
        namespace,
        "--output",
        "json",
    ])?;
    out.lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// Runs the whole Kubernetes-backend scenario in namespace `name` against `release` (installed with
/// [`release_values`] and [`AGENT_ENFORCEMENT`]) and returns what it measured. Fails at the first step that does not hold.
pub fn run(kubeconfig: &Path, release: &Release, name: &str) -> Result<Timings> {
    run_on(kubeconfig, release, name, &Placement::default())
}

/// [`run`] with the pods on the nodes `placement` names (the multi-node suite: client and server on
/// different nodes, each seen by its own node's agent).
pub fn run_on(
    kubeconfig: &Path,
    release: &Release,
    name: &str,
    placement: &Placement,
) -> Result<Timings> {
    let started = Instant::now();
    say(&format!(
        "creating the workload (http-client, http-server, http-service) on {placement:?}"
    ));
    let w = create_workload_on(kubeconfig, name, placement)?;
    let n = w.ns.name.clone();

    // Step 1: TCP to 18080 works.
    say("step 1: TCP http-service:18080 from the client");
    let first_packet = Instant::now();
    w.send_until_echoed(Protocol::Tcp, 18080, Duration::from_secs(60))?;

    // Step 2: within 2 minutes exactly the two proposals, as the reference's scenario states them.
    say("step 2: waiting for the two proposals");
    let mut appeared: BTreeMap<String, Duration> = BTreeMap::new();
    let expected = expected_proposal_specs(&n);
    let learned = poll(
        "exactly the two proposals of step 2",
        LEARN_TIMEOUT,
        Duration::from_millis(200),
        || {
            let specs = proposal_specs(&w)?;
            for name in specs.keys() {
                appeared
                    .entry(name.clone())
                    .or_insert_with(|| first_packet.elapsed());
            }
            Ok((specs == expected).then_some(specs))
        },
        || {
            format!(
                "proposals: {:#?}\nexpected: {expected:#?}\n{}\n{}",
                proposal_specs(&w),
                w.ns.describe(),
                release.describe()
            )
        },
    )?;
    ensure!(learned.len() == 2, "exactly two proposals: {learned:#?}");
    let first_packet_to_proposal: Vec<Duration> = appeared.values().copied().collect();
    say(&format!(
        "step 2: proposals {EGRESS} and {INGRESS} after {:?}",
        first_packet_to_proposal
    ));

    // Step 3: promote both to monitor.
    let promoted_specs = promote_both_to_monitor(&w, &learned, || {
        format!("policies: {:#?}\n{}", w.policies(), release.describe())
    })?;

    // Step 4: UDP 18083 still echoes; one monitor violation on each policy.
    say("step 4: UDP http-service:18083 (not in either policy) still echoes");
    w.send_until_echoed(Protocol::Udp, 18083, Duration::from_secs(30))?;
    let (client_pod, server_pod) = (&w.client.0, &w.server.0);
    one_monitor_violation_on_each(&w, || {
        format!("policies: {:#?}\n{}", w.policies(), release.describe())
    })?;
    // Proposals are not re-created, specs unchanged: watch for one agent flush and one controller
    // flush after fresh traffic of both kinds.
    w.send_until_echoed(Protocol::Tcp, 18080, Duration::from_secs(30))?;
    no_proposal_and_specs_unchanged(&w, &promoted_specs)?;

    // Step 5: protect.
    say("step 5: mode protect on both policies");
    for name in [EGRESS, INGRESS] {
        w.set_mode(name, "protect")?;
    }
    for name in [EGRESS, INGRESS] {
        check_network_policy(&w, release, name)?;
    }
    // The egress policy does not allow the client's UDP to http-service:18083 (the server's 18081).
    // The blocked attempts start now (the agent's flows are looked at from here).
    let block_started = Instant::now();
    let before = release.enforcement_drops()?;
    say("step 5: the agent enforces the rendered NetworkPolicies: UDP 18083 must be dropped");
    // The agent installs a new policy within a second or so of its creation; until then a
    // datagram may still pass (counted as a violation like any other).
    let mut attempt = 0;
    poll(
        "the agent's enforcement to drop UDP 18083",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || {
            attempt += 1;
            // Dropped by the agent's rules, not an answer lost or late on a busy node (the next
            // datagram would then echo, and the check below fail though nothing flapped).
            let echoed = w.send(Protocol::Udp, 18083, &format!("blocked-{attempt}"))?;
            let counted = release.enforcement_drops().unwrap_or(0) > before;
            Ok((!echoed && counted).then_some(()))
        },
        || release.describe_enforcement(),
    )?;
    for attempt in 0..3 {
        ensure!(
            !w.send(Protocol::Udp, 18083, &format!("blocked-again-{attempt}"))?,
            "UDP 18083 echoed again after the agent dropped it"
        );
    }
    let dropped = release.enforcement_drops()? - before;
    ensure!(
        dropped >= 3,
        "the agent's deny rules counted {dropped} drops for 4 blocked datagrams"
    );
    let egress = poll(
        &format!("the protect violation on {EGRESS}"),
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let p = w.policies()?.remove(EGRESS);
            Ok(p.filter(|p| status_counts(p).0 >= 2))
        },
        || format!("policies: {:#?}\n{}", w.policies(), release.describe()),
    )?;
    // Two more status passes: whatever the ingress policy would record is in by then.
    release.wait_for_status_passes(2, STEP_TIMEOUT)?;
    let s = egress.status.clone().unwrap_or_default();
    ensure!(
        (s.violation_count, s.active_violation_count) == (2, 2),
        "{EGRESS}: expected the monitor and the protect violation: {s:#?}"
    );
    ensure!(
        s.violation_history.iter().map(|b| b.count).sum::<i64>() == 2,
        "{EGRESS}: both violations in the hourly history: {s:#?}"
    );
    let newest = &s.violations[0];
    ensure!(
        newest.action == PolicyMode::Protect
            && newest.dst_port == Some(18081)
            && newest.protocol == CrdProtocol::UDP
            && newest.dest.owner_name == "http-server",
        "{EGRESS}: the newest violation is not the blocked UDP flow: {newest:#?}"
    );
    let policies = w.policies()?;
    let egress_now = status_counts(policies.get(EGRESS).context("egress gone")?);
    ensure!(
        egress_now == (2, 2),
        "{EGRESS} after two more status intervals: {egress_now:?}"
    );
    let ingress = status_counts(policies.get(INGRESS).context("ingress gone")?);
    ensure!(
        ingress == (1, 1),
        "{INGRESS}: the blocked flow never reached the server, yet: {ingress:?}"
    );
    w.send_until_echoed(Protocol::Tcp, 18080, Duration::from_secs(30))?;
    say("step 5: egress policy 2 violations, ingress 1, TCP 18080 still works");

    // The agent saw the blocked attempts: the client's datagrams to 18083 went out, none arrived.
    let window = block_started.elapsed() + Duration::from_secs(1);
    let flows = agent_flows(release, &n, window)?;
    let sent: u64 = flows
        .iter()
        .filter(|f| {
            f["pod"]
                .as_str()
                .is_some_and(|p| p.ends_with(client_pod.as_str()))
                && f["protocol"] == json!("udp")
                && f["direction"] == json!("outbound")
                && f["port"] == json!(18083)
        })
        .map(|f| f["count"].as_u64().unwrap_or(0))
        .sum();
    let received = flows.iter().any(|f| {
        f["pod"]
            .as_str()
            .is_some_and(|p| p.ends_with(server_pod.as_str()))
            && f["protocol"] == json!("udp")
            && f["direction"] == json!("inbound")
    });
    ensure!(
        sent >= 1 && !received,
        "the agent should see the client's blocked UDP sends and no arrival at the server: {flows:#?}"
    );
    let timings = Timings {
        scenario: started.elapsed(),
        first_packet_to_proposal,
    };
    say(&format!("done in {:.1}s", timings.scenario.as_secs_f64()));
    w.ns.delete_and_wait()?;
    Ok(timings)
}

/// Waits for the NetworkPolicy `name` rendered from the protect-mode policy: spec equal to
/// `spec.kubernetes`, one controller ownerReference to the policy.
pub fn check_network_policy(w: &Workload, release: &Release, name: &str) -> Result<()> {
    let policy = poll(
        &format!("NetworkPolicy {name}"),
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let out = w.ns.kubectl(&[
                "get",
                "networkpolicy",
                name,
                "--ignore-not-found",
                "-o",
                "json",
            ])?;
            if out.trim().is_empty() {
                return Ok(None);
            }
            Ok(Some(serde_json::from_str::<Value>(&out)?))
        },
        || release.describe(),
    )?;
    let wnp: WorkloadNetworkPolicy = w.policies()?.remove(name).context("policy gone")?;
    let want = serde_json::to_value(&wnp.spec.kubernetes)?;
    ensure!(
        policy["spec"] == want,
        "{name}: NetworkPolicy spec {:#} differs from spec.kubernetes {want:#}",
        policy["spec"]
    );
    let owners = policy["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let controllers: Vec<&Value> = owners
        .iter()
        .filter(|o| o["controller"] == json!(true))
        .collect();
    ensure!(
        controllers.len() == 1
            && controllers[0]["kind"] == json!("WorkloadNetworkPolicy")
            && controllers[0]["name"] == json!(name),
        "{name}: ownerReferences {owners:#?}"
    );
    Ok(())
}

/// (violationCount, activeViolationCount) of a policy.
pub fn status_counts(policy: &WorkloadNetworkPolicy) -> (i64, i64) {
    policy
        .status
        .as_ref()
        .map(|s| (s.violation_count, s.active_violation_count))
        .unwrap_or_default()
}

/// The p-th percentile (0..=100) of `samples` in milliseconds, nearest rank.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * ms.len() as f64).ceil().max(1.0) as usize;
    ms[rank.min(ms.len()) - 1]
}

/// Fails when `samples` is empty (nothing measured is not a figure).
pub fn require_samples(samples: &[Duration]) -> Result<()> {
    if samples.is_empty() {
        bail!("no first-packet-to-proposal samples");
    }
    Ok(())
}

/// Step 4's check: each policy has exactly one violation, the client's UDP to the server's 18081
/// in monitor mode, in the policy's direction. `describe` says what the test saw on a timeout.
pub fn one_monitor_violation_on_each(w: &Workload, describe: impl Fn() -> String) -> Result<()> {
    for name in [EGRESS, INGRESS] {
        let policy = poll(
            &format!("a violation on {name}"),
            STEP_TIMEOUT,
            Duration::from_millis(250),
            || {
                let p = w.policies()?.remove(name);
                Ok(p.filter(|p| status_counts(p).0 > 0))
            },
            &describe,
        )?;
        let s = policy.status.clone().unwrap_or_default();
        ensure!(
            (s.violation_count, s.active_violation_count) == (1, 1),
            "{name}: expected exactly one violation: {s:#?}"
        );
        let direction = if name == EGRESS {
            Direction::Egress
        } else {
            Direction::Ingress
        };
        check_udp_violation(
            &s.violations[0],
            &w.ns.name,
            name,
            PolicyMode::Monitor,
            direction,
        )?;
    }
    say("step 4: one monitor violation on each policy");
    Ok(())
}

/// Checks one violation record of the scenario: the client's UDP to the server's 18081 with `action`
/// on policy `name` in `namespace`, in `direction`.
pub fn check_udp_violation(
    v: &ViolationRecord,
    namespace: &str,
    name: &str,
    action: PolicyMode,
    direction: Direction,
) -> Result<()> {
    ensure!(
        (
            v.source.owner_name.as_str(),
            v.dest.owner_name.as_str(),
            v.protocol,
            v.dst_port,
            v.action
        ) == (
            "http-client",
            "http-server",
            CrdProtocol::UDP,
            Some(18081),
            action
        ),
        "{name}: {v:#?}"
    );
    ensure!(
        (
            v.denying_policy_namespace.as_str(),
            v.denying_policy_name.as_str()
        ) == (namespace, name),
        "{name}: denying policy: {v:#?}"
    );
    ensure!(v.direction == Some(direction), "{name}: {v:#?}");
    Ok(())
}
