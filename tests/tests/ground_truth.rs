//! Every fault at once, against one ground truth (docs/behaviour.md §3.6 "One occurrence counts
//! once"). Our chart in the local cluster (eBPF provider, two controller replicas electing a leader),
//! a server echoing on many TCP ports and a client pod whose generator script makes a known set of
//! connections and writes each one it made into a file in the pod. A monitor-mode policy `guard`
//! allows the client to the server on one port: every other port is a violation.
//!
//! In nine phases, the generator connects to the allowed port and to two ports no other phase uses
//! (three connections each: repeats within a 60-second window, one occurrence), and the test injects
//! a fault in eight of them: the agent's streams closed (several times while its batches wait for
//! acknowledgements), the agent stopped (SIGTERM, a rollout) and killed (SIGKILL, once what it sent
//! is acknowledged: what it still held would be lost with its memory, the documented exception), the
//! leader killed (SIGKILL) right after traffic, with the phase's violations learned but held by
//! refused status writes, and after the gate's verdict, status writes refused until the policy is
//! parked and then delayed by the API server; at the end the leader is killed right after a
//! promotion to protect was asked for, its last step (the proposal's delete) refused meanwhile.
//! Monitor learns every observed edge: the learned proposals are all the generator's edges.
//!
//! At the end it compares with what the generator wrote: the learned proposals hold exactly the
//! generator's edges, `guard`'s violations are exactly its violating ports, `violationCount` is their
//! number (none lost, none counted twice) and the hourly history sums to it, the gate's verdict is the
//! same before and after the leader's SIGKILL, and the promotion was finished by the next leader.
//! Needs root, `cargo xtask setup` and the binaries (`cargo build --bins`).

use anyhow::{Context, Result, bail};
use network_enforcer_api::WorkloadNetworkPolicy;
use network_enforcer_tests::e2e::release::{self, Release, metric};
use network_enforcer_tests::e2e::scenario;
use network_enforcer_tests::e2e::workload::{deployment, echo_server_script};
use network_enforcer_tests::faults::{StatusFault, StatusWritesFault, Writes};
use network_enforcer_tests::fixture::{self, TestNamespace};
use network_enforcer_tests::scenario_fixture::{learned_rules, rule_entries};
use network_enforcer_tests::wait::poll;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The port `guard` allows.
const ALLOWED: u16 = 18080;
/// The first violating port; each phase takes the next two.
const FIRST_VIOLATING: u16 = 19000;
/// Connections per port and phase (one occurrence: all within a few seconds).
const REPEATS: u32 = 3;
/// The phases' faults, in order.
const FAULTS: [Fault; 9] = [
    Fault::None,
    Fault::StreamsClosed,
    Fault::AgentStopped,
    Fault::LeaderKilled,
    Fault::LeaderKilledWithViolationsHeld,
    Fault::StatusWritesRefused,
    Fault::StatusWritesDelayed,
    Fault::AgentKilledOnceAcknowledged,
    Fault::LeaderKilledAfterTheGate,
];
/// Not the agent's default (9464) nor another test's: every release's agent uses the host network.
const AGENT_METRICS_PORT: u16 = 19_468;
/// The agent's ingest port on the controller (the chart's `controller.ingestPort`).
const INGEST_PORT: u16 = 9443;
/// Each wait: a leader change takes the Lease's 15 s, a restarted container a few more.
const STEP: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    StreamsClosed,
    AgentStopped,
    LeaderKilled,
    LeaderKilledWithViolationsHeld,
    StatusWritesRefused,
    StatusWritesDelayed,
    AgentKilledOnceAcknowledged,
    LeaderKilledAfterTheGate,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_at_once_loses_no_occurrence_and_counts_none_twice() -> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let ns = TestNamespace::create_with_crds("truth").await?;
    let n = ns.name.clone();
    let release_ns = "ne-truth-system";
    let mut values = scenario::release_values(release_ns);
    values.extend([
        format!("controller.watchNamespace={n}"),
        "controller.replicas=2".into(),
        // 3 failed passes park a policy: 9 s, well after a kill that follows the learning.
        "controller.wnpStatusUpdateInterval=3s".into(),
        "controller.flushIntervalSeconds=1".into(),
        "controller.edgeHistory.persistInterval=1s".into(),
        "controller.edgeHistory.warmup=1s".into(),
        format!("agent.metricsPort={AGENT_METRICS_PORT}"),
        "agent.flushIntervalSeconds=2".into(),
        // Every connection of a phase reaches the controller within a flush: the gate's verdict
        // names each flow's last-seen minute, read once the phase's flows are in (a repeat held
        // for the agent's refresh could cross a minute after it was read).
        "agent.refreshSeconds=0".into(),
    ]);
    let release = Release::install(&cluster.kubeconfig, "ne-truth", release_ns, &values)?;
    let (client, server_ip) = create_workload(&ns)?;
    create_guard(&ns).await?;
    wait_for_leader(&release)?;

    let mut generator = Generator {
        ns: &ns,
        client: &client,
        server_ip: &server_ip,
        next_port: FIRST_VIOLATING,
        violating: Vec::new(),
    };
    let mut injected = Vec::new();
    let mut gate = None;
    for fault in FAULTS {
        eprintln!("[truth] phase with fault {fault:?}");
        let mut refusal = None;
        let mut delay = None;
        if fault == Fault::LeaderKilledWithViolationsHeld {
            // Everything of the phases before written and acknowledged: nothing of theirs may
            // start the refused policy's count of failed passes early.
            wait_until_written(&ns, &generator)?;
            wait_for_agent_acknowledged()?;
        }
        // Looked up first, so that the kill follows the traffic (or the learning) at once.
        let leader = match fault {
            Fault::LeaderKilled | Fault::LeaderKilledWithViolationsHeld => {
                Some(leader_pid(&release)?)
            }
            _ => None,
        };
        match fault {
            Fault::StatusWritesRefused | Fault::LeaderKilledWithViolationsHeld => {
                refusal = Some(StatusWritesFault::start(&ns, "guard", StatusFault::Refuse).await?);
            }
            Fault::StatusWritesDelayed => {
                delay = Some(StatusWritesFault::start(&ns, "guard", StatusFault::Delay).await?);
            }
            _ => {}
        }
        generator.phase()?;
        match fault {
            Fault::None => {}
            Fault::StreamsClosed => {
                // While the agent flushes (every 2 s) and waits for acknowledgements.
                let (mut closed, mut pending) = (0, 0.0_f64);
                for _ in 0..6 {
                    pending = pending.max(agent_pending_batches()?);
                    closed += close_agent_streams()?;
                    std::thread::sleep(Duration::from_millis(500));
                }
                anyhow::ensure!(closed > 0, "no agent stream to close");
                injected.push(format!(
                    "{closed} agent streams closed (at most {pending} batches unacknowledged then)"
                ));
            }
            Fault::AgentStopped => {
                let agent = release.agent_pod()?;
                release.kubectl(&["delete", "pod", &agent, "--wait=false"])?;
                wait_for_agent(&release, "a new agent pod to be ready", |p| p.name != agent)?;
                injected.push("agent stopped (SIGTERM) and replaced".into());
            }
            Fault::LeaderKilled => {
                let (pod, pid) = leader.context("looked up")?;
                signal(pid, "KILL")?;
                let next = wait_for_leader(&release)?;
                injected.push(format!(
                    "leader {pod} killed (SIGKILL) right after traffic; next leader {next}"
                ));
            }
            Fault::LeaderKilledWithViolationsHeld => {
                // The phase's records are merged and their proposal written, their violations wait
                // for a status write the API server refuses (killed before the policy is parked,
                // 3 failed passes of 3 s): the agent's batch is unacknowledged, and is resent to
                // the next leader.
                wait_until_learned(&ns, &generator.violating[generator.violating.len() - 2..])
                    .await?;
                let held = agent_pending_batches()?;
                let (pod, pid) = leader.context("looked up")?;
                signal(pid, "KILL")?;
                // The premise: the batch was unacknowledged when the leader died (were the policy
                // parked first, 3 failed passes, its loss would be the documented one).
                anyhow::ensure!(
                    held >= 1.0,
                    "the phase's premise was not met: the agent held no batch at the kill"
                );
                if let Some(refusal) = refusal.take() {
                    refusal.end().await?;
                }
                let next = wait_for_leader(&release)?;
                injected.push(format!(
                    "leader {pod} killed (SIGKILL) with the phase's violations learned but held \
                     by refused status writes ({held} batches unacknowledged); next leader {next}"
                ));
            }
            Fault::StatusWritesRefused => {
                // Long enough for the policy to be parked (3 failed passes of 3 s).
                wait_for_controller_metric(&release, "status_writes_failing", 1.0)?;
                if let Some(refusal) = refusal.take() {
                    refusal.end().await?;
                }
                injected.push("status writes refused (until parked), then accepted".into());
            }
            Fault::StatusWritesDelayed => {
                std::thread::sleep(Duration::from_secs(6));
                if let Some(delay) = delay.take() {
                    delay.end().await?;
                }
                injected.push("status writes delayed for 6 s".into());
            }
            Fault::AgentKilledOnceAcknowledged => {
                wait_until_written(&ns, &generator)?;
                let agent = release.agent_pod()?;
                wait_for_agent_acknowledged()?;
                let restarts = restart_count(&release, &agent)?;
                signal(release.host_pid(&agent, "network-enforcer-agent")?, "KILL")?;
                wait_for_agent(&release, "the killed agent to restart and be ready", |p| {
                    p.name == agent && p.restarts > restarts
                })?;
                injected.push("agent killed (SIGKILL) once acknowledged, restarted".into());
            }
            Fault::LeaderKilledAfterTheGate => {
                // Settled: every flow in the history, persisted, and the verdict (which names
                // each flow's last minute) the same over two reads.
                wait_until_written(&ns, &generator)?;
                let edges = (generator.violating.len() + 1) as f64;
                wait_for_controller_metric(&release, "edge_history_persisted_edges", edges)?;
                let before = stable_verdict(&ns, generator.violating.len())?;
                let (pod, pid) = leader_pid(&release)?;
                signal(pid, "KILL")?;
                let next = wait_for_leader(&release)?;
                wait_for_controller_metric(&release, "edge_history_restored_edges", edges)?;
                // Longer than the gate's recheck (10 s): the new leader judges again within it.
                let seen = verdicts_for(&ns, Duration::from_secs(14))?;
                gate = Some((before, seen));
                injected.push(format!(
                    "leader {pod} killed (SIGKILL) once the gate had answered; next leader {next}"
                ));
            }
        }
    }

    // The promotion of the client's learned egress to protect, and the leader killed at once; the
    // proposal's delete (a promotion's last step) is refused meanwhile, so the promotion cannot be
    // over before the kill.
    let egress = scenario::EGRESS;
    wait_until_written(&ns, &generator)?;
    let deletes =
        StatusWritesFault::start_on(&ns, Writes::ProposalDeletes, StatusFault::Refuse).await?;
    let (pod, pid) = leader_pid(&release)?;
    ns.kubectl(&[
        "label",
        "workloadnetworkpolicyproposal",
        egress,
        &format!("{}=protect", network_enforcer_api::keys::PROMOTE_LABEL),
    ])?;
    signal(pid, "KILL")?;
    anyhow::ensure!(
        ns.kubectl(&["get", "workloadnetworkpolicyproposal", egress])
            .is_ok(),
        "the proposal is still there at the kill"
    );
    deletes.end().await?;
    let next = wait_for_leader(&release)?;
    injected.push(format!(
        "leader {pod} killed (SIGKILL) right after a promotion to protect; next leader {next}"
    ));

    // The ground truth: what the generator wrote it made.
    let made = generator.made()?;
    let failed: Vec<_> = made.iter().filter(|l| !l.ends_with(" ok")).collect();
    anyhow::ensure!(failed.is_empty(), "connections that failed: {failed:?}");
    let ports: BTreeSet<u16> = made
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    let violating: BTreeSet<u16> = ports.iter().copied().filter(|p| *p != ALLOWED).collect();
    anyhow::ensure!(
        violating == generator.violating.iter().copied().collect(),
        "the generator wrote {made:?}"
    );

    // The promotion finished by a later leader: one policy in protect with the learned rules, the
    // proposal gone, its NetworkPolicy rendered.
    let promoted = poll(
        "the promotion to protect to be finished by the next leader",
        STEP,
        Duration::from_secs(1),
        || {
            let policies = ns.kubectl(&["get", "workloadnetworkpolicies", "-o", "json"])?;
            let proposals = ns.kubectl(&[
                "get",
                "workloadnetworkpolicyproposals",
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ])?;
            let policies: serde_json::Value = serde_json::from_str(&policies)?;
            let policy = policies["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["metadata"]["name"] == egress && p["spec"]["mode"] == "protect")
                .cloned();
            let rendered = ns.kubectl(&[
                "get",
                "networkpolicies",
                "-o",
                "jsonpath={.items[*].metadata.ownerReferences[*].name}",
            ])?;
            Ok(policy.filter(|_| {
                !proposals.split_whitespace().any(|p| p == egress)
                    && rendered.split_whitespace().any(|o| o == egress)
            }))
        },
        || release.logs("controller").unwrap_or_default(),
    )?;

    // Settled: two more status passes of the last leader after everything was written.
    release.wait_for_status_passes(2, STEP)?;
    let guard: WorkloadNetworkPolicy = serde_json::from_str(&ns.kubectl(&[
        "get",
        "workloadnetworkpolicy",
        "guard",
        "-o",
        "json",
    ])?)?;
    let status = guard.status.unwrap_or_default();
    let written: Vec<u16> = status
        .violations
        .iter()
        .filter_map(|v| u16::try_from(v.dst_port?).ok())
        .collect();
    let distinct: BTreeSet<u16> = written.iter().copied().collect();
    let lost: Vec<u16> = violating.difference(&distinct).copied().collect();
    let twice = status.violation_count - violating.len() as i64;
    eprintln!(
        "[truth] faults: {injected:?}\n[truth] connections made {} ({} ports, {} violating); \
         violations written {}, violationCount {}; lost {}, counted twice {}",
        made.len(),
        ports.len(),
        violating.len(),
        written.len(),
        status.violation_count,
        lost.len(),
        twice
    );
    let phases: Vec<u16> = lost.iter().map(|p| (p - FIRST_VIOLATING) / 2).collect();
    assert!(
        lost.is_empty(),
        "violations lost: ports {lost:?}, of the phases {phases:?} (0: the first) ({status:?})"
    );
    assert_eq!(written.len(), distinct.len(), "one record per occurrence");
    assert_eq!(
        distinct, violating,
        "no violation the generator did not make"
    );
    assert_eq!(twice, 0, "counted twice: {status:?}");
    let per_hour: i64 = status.violation_history.iter().map(|b| b.count).sum();
    assert_eq!(per_hour, status.violation_count, "the hourly history");

    // Learning: exactly the generator's edges, each once, on both ends.
    let expected_ingress: Vec<String> = ports
        .iter()
        .map(|p| format!("{} ingress {n}/app=http-client TCP/{p}", scenario::INGRESS))
        .collect();
    let learned: Vec<String> = learned_rules(&ns)
        .await?
        .into_iter()
        .filter(|r| r.starts_with(scenario::INGRESS))
        .collect();
    assert_eq!(learned, expected_ingress, "the server's learned ingress");
    let mut promoted_rules = rule_entries(egress, &promoted["spec"]);
    promoted_rules.sort();
    let expected_egress: Vec<String> = ports
        .iter()
        .map(|p| format!("{egress} egress {n}/app=http-server TCP/{p}"))
        .collect();
    assert_eq!(promoted_rules, expected_egress, "the promoted egress");

    // The gate: the same verdict before and after the leader's SIGKILL, and none other.
    let (before, seen) = gate.context("the gate phase ran")?;
    assert_eq!(seen, vec![before], "the gate's verdicts across the restart");
    release.uninstall()?;
    Ok(())
}

/// The client's generator: connects from the client pod and appends `tcp <port> ok|failed` per
/// connection to `/tmp/made` in the pod.
struct Generator<'a> {
    ns: &'a TestNamespace,
    client: &'a str,
    server_ip: &'a str,
    next_port: u16,
    violating: Vec<u16>,
}

impl Generator<'_> {
    /// One phase: [`REPEATS`] connections each to the allowed port and two new violating ones.
    fn phase(&mut self) -> Result<()> {
        let ports = [ALLOWED, self.next_port, self.next_port + 1];
        self.violating.extend(&ports[1..]);
        self.next_port += 2;
        let list = ports.map(|p| p.to_string()).join(" ");
        let script = format!(
            "for p in {list}; do for i in $(seq {REPEATS}); do \
               if echo x | socat -t 3 - TCP:{ip}:$p,connect-timeout=3 2>/dev/null | grep -q x; \
               then echo \"tcp $p ok\"; else echo \"tcp $p failed\"; fi >> /tmp/made; \
             done; done",
            ip = self.server_ip
        );
        self.ns
            .kubectl(&["exec", self.client, "--", "sh", "-c", &script])
            .map(drop)
    }

    /// Every connection the generator wrote it made.
    fn made(&self) -> Result<Vec<String>> {
        let out = self
            .ns
            .kubectl(&["exec", self.client, "--", "cat", "/tmp/made"])?;
        Ok(out.lines().map(String::from).collect())
    }
}

/// The server (echoing on [`ALLOWED`] and every violating port the phases use) and the client; returns
/// the client pod's name and the server pod's address.
fn create_workload(ns: &TestNamespace) -> Result<(String, String)> {
    for account in ["http-client-sa", "http-server-sa"] {
        ns.apply(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}
            })
            .to_string(),
        )?;
    }
    let violating: Vec<u16> = (0..2 * FAULTS.len() as u16)
        .map(|i| FIRST_VIOLATING + i)
        .collect();
    let tcp: Vec<u16> = std::iter::once(ALLOWED).chain(violating).collect();
    let ports: Vec<(u16, &str)> = tcp.iter().map(|p| (*p, "TCP")).collect();
    ns.apply(&deployment(
        "http-server",
        "http-server-sa",
        &echo_server_script(&tcp, &[]),
        &ports,
    ))?;
    ns.apply(&deployment(
        "http-client",
        "http-client-sa",
        "sleep 100000",
        &[],
    ))?;
    let running = |app: &str| -> Result<Option<(String, String)>> {
        let out = ns.kubectl(&[
            "get",
            "pods",
            "-l",
            &format!("app={app}"),
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}",
        ])?;
        Ok(out.lines().find_map(|l| {
            let (name, ip) = l.split_once(' ')?;
            (!ip.is_empty()).then(|| (name.to_string(), ip.to_string()))
        }))
    };
    let describe = || ns.describe();
    let client = poll(
        "the client pod",
        STEP,
        Duration::from_millis(500),
        || running("http-client"),
        describe,
    )?;
    let server = poll(
        "the server pod",
        STEP,
        Duration::from_millis(500),
        || running("http-server"),
        describe,
    )?;
    // The echo server listens once its process runs: the first allowed connection answers.
    poll(
        "the server to echo",
        STEP,
        Duration::from_secs(1),
        || {
            let script = format!(
                "echo x | socat -t 3 - TCP:{}:{ALLOWED},connect-timeout=3 2>/dev/null",
                server.1
            );
            Ok((ns
                .kubectl(&["exec", &client.0, "--", "sh", "-c", &script])?
                .trim()
                == "x")
                .then_some(()))
        },
        describe,
    )?;
    Ok((client.0, server.1))
}

/// The monitor-mode policy `guard`: the server's ingress from the client on [`ALLOWED`] only.
async fn create_guard(ns: &TestNamespace) -> Result<()> {
    let guard: WorkloadNetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "guard", "namespace": ns.name},
        "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "http-server"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "http-server"}},
                                "policyTypes": ["Ingress"],
                                "ingress": [{
                                    "from": [{"podSelector": {"matchLabels": {"app": "http-client"}}}],
                                    "ports": [{"protocol": "TCP", "port": ALLOWED}]}]}}
    }))?;
    ns.api::<WorkloadNetworkPolicy>()
        .create(&kube::api::PostParams::default(), &guard)
        .await?;
    Ok(())
}

/// Waits for a leading controller that has passed its status sync once; returns its pod.
fn wait_for_leader(release: &Release) -> Result<String> {
    poll(
        "a leading controller with a status pass done",
        STEP,
        Duration::from_secs(1),
        || {
            let text = release.controller_metrics()?;
            let leading = metric(&text, "network_enforcer_controller_leader") == Some(1.0)
                && metric(&text, "network_enforcer_controller_status_passes_total")
                    .is_some_and(|p| p >= 1.0);
            Ok(if leading { release.leader()? } else { None })
        },
        || release.describe(),
    )
}

/// The leading controller's pod and its process on this machine. Killed (SIGKILL: no last write),
/// the container restarts in the same pod, which may take the Lease back at once (the holder is
/// the pod's name), or the other replica takes over once the Lease expires (15 s).
fn leader_pid(release: &Release) -> Result<(String, u32)> {
    let leader = release.leader()?.context("a leader holds the Lease")?;
    let pid = release.host_pid(&leader, "network-enforcer-controller")?;
    Ok((leader, pid))
}

/// Waits until the server's learned ingress has every port of `ports`.
async fn wait_until_learned(ns: &TestNamespace, ports: &[u16]) -> Result<()> {
    let want: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{} ingress {}/app=http-client TCP/{p}",
                scenario::INGRESS,
                ns.name
            )
        })
        .collect();
    network_enforcer_tests::wait::eventually(
        "the phase's edges to be learned",
        STEP,
        Duration::from_millis(200),
        || async {
            let learned = learned_rules(ns).await?;
            Ok(want.iter().all(|w| learned.contains(w)).then_some(()))
        },
        || ns.describe(),
    )
    .await
}

/// Sends `signal` (`KILL`, `TERM`) to host process `pid`.
fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid}");
    Ok(())
}

/// Closes (`ss -K`) the agents' connections to the controller's ingest port, from the host network the
/// agents use; returns how many it closed.
fn close_agent_streams() -> Result<usize> {
    let out = std::process::Command::new("ss")
        .args(["-K", "-t", "-n", "state", "established"])
        .arg(format!("dport = :{INGEST_PORT}"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "ss -K: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A header line, then one line per closed socket.
    Ok(String::from_utf8_lossy(&out.stdout).lines().skip(1).count())
}

/// Waits until `metric` of the leading controller reaches `at_least`.
fn wait_for_controller_metric(release: &Release, name: &str, at_least: f64) -> Result<()> {
    let name = format!("network_enforcer_controller_{name}");
    poll(
        &format!("{name} ≥ {at_least}"),
        STEP,
        Duration::from_secs(1),
        || {
            let text = release.controller_metrics()?;
            Ok(metric(&text, &name).filter(|v| *v >= at_least).map(drop))
        },
        || release.logs("controller").unwrap_or_default(),
    )
}

/// Waits until every violating port the generator used so far is in `guard`'s status.
fn wait_until_written(ns: &TestNamespace, generator: &Generator) -> Result<()> {
    let want: BTreeSet<i64> = generator.violating.iter().map(|p| i64::from(*p)).collect();
    let written = || -> Result<BTreeSet<i64>> {
        let ports = ns.kubectl(&[
            "get",
            "workloadnetworkpolicy",
            "guard",
            "-o",
            "jsonpath={.status.violations[*].dstPort}",
        ])?;
        Ok(ports
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    };
    poll(
        "the violations so far to be written",
        STEP,
        Duration::from_secs(1),
        || Ok(want.is_subset(&written()?).then_some(())),
        || match written() {
            Ok(have) => format!(
                "missing violating ports {:?} (written {have:?})",
                want.difference(&have).collect::<Vec<_>>()
            ),
            Err(e) => format!("{e:#}"),
        },
    )
}

/// The agent's uplink metrics on the host network.
fn agent_metrics() -> Result<String> {
    release::http_get(&format!("127.0.0.1:{AGENT_METRICS_PORT}"), "/metrics")
}

/// The agent's unacknowledged batches now.
fn agent_pending_batches() -> Result<f64> {
    metric(
        &agent_metrics()?,
        "network_enforcer_agent_uplink_pending_batches",
    )
    .context("the agent's pending batches")
}

/// Waits until the agent holds no unacknowledged batch.
fn wait_for_agent_acknowledged() -> Result<()> {
    poll(
        "the agent's batches to be acknowledged",
        STEP,
        Duration::from_millis(200),
        || {
            let text = agent_metrics()?;
            Ok(
                (metric(&text, "network_enforcer_agent_uplink_pending_batches") == Some(0.0))
                    .then_some(()),
            )
        },
        || agent_metrics().unwrap_or_default(),
    )
}

/// An agent pod as the API server has it now.
struct AgentPod {
    name: String,
    /// Its container's restarts.
    restarts: u32,
    ready: bool,
}

/// The release's agent pods.
fn agent_pods(release: &Release) -> Result<Vec<AgentPod>> {
    let out = release.kubectl(&[
        "get",
        "pods",
        "-l",
        &release.selector("agent"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].restartCount} \
         {.status.containerStatuses[0].ready}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .filter_map(
            |l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
                [name, restarts, ready] => Some(AgentPod {
                    name: name.to_string(),
                    restarts: restarts.parse().ok()?,
                    ready: *ready == "true",
                }),
                _ => None,
            },
        )
        .collect())
}

/// The restarts of agent pod `pod`'s container.
fn restart_count(release: &Release, pod: &str) -> Result<u32> {
    agent_pods(release)?
        .into_iter()
        .find(|p| p.name == pod)
        .map(|p| p.restarts)
        .with_context(|| format!("agent pod {pod}"))
}

/// Waits until an agent pod `ready` says of is ready.
fn wait_for_agent(release: &Release, what: &str, ready: impl Fn(&AgentPod) -> bool) -> Result<()> {
    poll(
        what,
        STEP,
        Duration::from_millis(500),
        || {
            Ok(agent_pods(release)?
                .iter()
                .any(|p| p.ready && ready(p))
                .then_some(()))
        },
        || release.describe(),
    )
}

/// `guard`'s WouldBlock condition: (status, reason, message).
fn verdict(ns: &TestNamespace) -> Result<Option<(String, String, String)>> {
    let policy: WorkloadNetworkPolicy = serde_json::from_str(&ns.kubectl(&[
        "get",
        "workloadnetworkpolicy",
        "guard",
        "-o",
        "json",
    ])?)?;
    Ok(policy
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "WouldBlock")
        .map(|c| (c.status, c.reason, c.message)))
}

/// Waits until the gate says `blocked` observed flows would be blocked; returns that verdict.
fn wait_for_verdict(ns: &TestNamespace, blocked: usize) -> Result<(String, String, String)> {
    poll(
        &format!("the gate's verdict on {blocked} flows"),
        STEP,
        Duration::from_secs(1),
        || {
            Ok(verdict(ns)?.filter(|(status, _, message)| {
                status == "True" && message.starts_with(&format!("{blocked} of "))
            }))
        },
        || ns.describe(),
    )
}

/// [`wait_for_verdict`], until it reads the same twice 3 s apart.
fn stable_verdict(ns: &TestNamespace, blocked: usize) -> Result<(String, String, String)> {
    poll(
        "the gate's verdict to settle",
        STEP,
        Duration::from_secs(1),
        || {
            let first = wait_for_verdict(ns, blocked)?;
            std::thread::sleep(Duration::from_secs(3));
            Ok((verdict(ns)?.as_ref() == Some(&first)).then_some(first))
        },
        || ns.describe(),
    )
}

/// Every verdict other than `NoHistory` (the new leader's "not yet") seen during `span`, in order,
/// each once.
fn verdicts_for(ns: &TestNamespace, span: Duration) -> Result<Vec<(String, String, String)>> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + span;
    while Instant::now() < deadline {
        let now = verdict(ns)?.context("the WouldBlock condition is gone")?;
        if now.1 != "NoHistory" && !seen.contains(&now) {
            seen.push(now);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    if seen.is_empty() {
        bail!("the new leader gave no verdict within {span:?}");
    }
    Ok(seen)
}
