//! The agent's NetworkPolicy enforcement under faults, on the local cluster with real pods and packets
//! (the CNI here enforces nothing: every block is the agent's):
//! - the agent killed while traffic flows: the isolated pod stays isolated and allowed traffic (new
//!   connections and an established one) keeps flowing while no agent runs;
//! - a policy edited: the old rule stops for new connections, the new one starts, and an established
//!   connection the old rule allowed keeps working (the documented choice);
//! - a new pod under a policy: isolated once its IP is known (the time is printed);
//! - new allowed client pods (a rollout, five times, and a scale to five): their first connection is
//!   never dropped (no SYN retransmitted in their network namespace), because the agent reads a new
//!   pod's address on the node before the API server reports it; a new pod that is not allowed is
//!   still blocked;
//! - deny evidence: the refused attempts are counted by the agent;
//! - uninstall: the agent removes its table.
//!
//! Needs root, `cargo xtask setup` and the binaries (`cargo test --workspace` builds them).

use anyhow::{Context, Result, ensure};
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release, http_get};
use network_enforcer_tests::e2e::scenario;
use network_enforcer_tests::e2e::workload::{self, Namespace, Protocol, send};
use network_enforcer_tests::fixture;
use serde_json::json;
use std::time::{Duration, Instant};

/// Not the agent's default (9464): agents of other test binaries may hold that port on the host.
const METRICS_PORT: u16 = 29464;

/// Whether TCP `port` of `ip` answers from the client: (8080, 8081).
fn reach(ns: &Namespace, client: &str, ip: &str) -> Result<(bool, bool)> {
    Ok((
        send(ns, client, Protocol::Tcp, ip, 8080, "p8080")?,
        send(ns, client, Protocol::Tcp, ip, 8081, "p8081")?,
    ))
}

/// Lines the client's long-lived connection has echoed so far.
fn long_lived_lines(ns: &Namespace, client: &str) -> Result<usize> {
    let out = ns.exec(client, "wc -l < /tmp/long.log")?;
    out.trim()
        .parse()
        .with_context(|| format!("wc said {out:?}"))
}

/// Fails unless the long-lived connection echoes new lines within a few seconds.
fn long_lived_flows(ns: &Namespace, client: &str, when: &str) -> Result<()> {
    let before = long_lived_lines(ns, client)?;
    poll(
        &format!("the established connection to keep echoing {when}"),
        Duration::from_secs(10),
        Duration::from_millis(500),
        || Ok((long_lived_lines(ns, client)? > before + 2).then_some(())),
        || {
            ns.exec(client, "tail -3 /tmp/long.log; ps")
                .unwrap_or_default()
        },
    )
}

#[test]
fn agent_enforcement_holds_through_agent_restarts_policy_edits_and_new_pods() -> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let release_namespace = "ne-enforce-system";
    let mut values = scenario::release_values(release_namespace);
    values.push(scenario::AGENT_ENFORCEMENT.into());
    values.push(format!("agent.metricsPort={METRICS_PORT}"));
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-enforce",
        release_namespace,
        &values,
    )?;
    let ns = Namespace::create(
        &cluster.kubeconfig,
        &format!("enforce-{}", std::process::id()),
    )?;
    ns.apply(&workload::deployment(
        "server",
        "default",
        &workload::echo_server_script(&[8080, 8081], &[]),
        &[(8080, "TCP"), (8081, "TCP")],
    ))?;
    ns.apply(&workload::deployment(
        "client",
        "default",
        "exec sleep 100000",
        &[],
    ))?;
    let (_, server_ip) = ns.wait_for_deployment("server")?.remove(0);
    let (client, _) = ns.wait_for_deployment("client")?.remove(0);
    ensure!(
        reach(&ns, &client, &server_ip)? == (true, true),
        "before any policy the server must answer on both ports"
    );

    // Policy v1: only 8080 from the client.
    ns.apply(&workload::allow_ingress(
        "server-ingress",
        "server",
        "client",
        8080,
    ))?;
    poll(
        "the agent to enforce policy v1 (8080 allowed, 8081 denied)",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || Ok((reach(&ns, &client, &server_ip)? == (true, false)).then_some(())),
        || format!("{:?}\n{}", release.enforcement_rules(), release.describe()),
    )?;
    // A connection opened now and kept open: one line every 200 ms, echoed into /tmp/long.log.
    ns.exec(
        &client,
        &format!(
            "sh -c 'i=0; while true; do echo $i; i=$((i+1)); sleep 0.2; done \
             | socat - TCP:{server_ip}:8080' > /tmp/long.log 2>&1 < /dev/null &"
        ),
    )?;
    long_lived_flows(&ns, &client, "under policy v1")?;

    // The agent killed (no graceful stop): the table stays, the isolation holds, allowed traffic
    // flows, until and after the new agent took over.
    let agent = release.agent_pod()?;
    release.kubectl(&["delete", "pod", &agent, "--grace-period=0", "--force"])?;
    let killed = Instant::now();
    // Checked until a new agent is ready (its table installed): until then only the table the
    // killed agent left enforces.
    let mut checks_before_new_agent = 0;
    loop {
        ensure!(
            release.enforcement_rules()?.is_some(),
            "the enforcement table vanished {:?} after the agent was killed",
            killed.elapsed()
        );
        let reached = reach(&ns, &client, &server_ip)?;
        ensure!(
            reached == (true, false),
            "{:?} after the agent was killed: 8080/8081 reached {reached:?}, want (true, false)",
            killed.elapsed()
        );
        let ready = release.kubectl(&[
            "get",
            "pods",
            "-l",
            &release.selector("agent"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].ready} {end}",
        ])?;
        if ready
            .split_whitespace()
            .any(|p| !p.starts_with(&format!("{agent}=")) && p.ends_with("=true"))
        {
            break;
        }
        checks_before_new_agent += 1;
        ensure!(
            killed.elapsed() < Duration::from_secs(120),
            "no new agent ready within 120 s: {ready}"
        );
    }
    release.wait_ready()?;
    long_lived_flows(&ns, &client, "after the agent restart")?;
    ensure!(
        reach(&ns, &client, &server_ip)? == (true, false),
        "the new agent must enforce policy v1 as the old one did"
    );
    eprintln!(
        "agent killed: isolation held over {checks_before_new_agent} check(s) before a new agent was ready, {:.1}s after the kill",
        killed.elapsed().as_secs_f64()
    );

    // Policy v2: 8081 instead of 8080. New connections follow it; the established one stays.
    ns.apply(&workload::allow_ingress(
        "server-ingress",
        "server",
        "client",
        8081,
    ))?;
    let edited = Instant::now();
    poll(
        "the agent to enforce policy v2 (8080 denied, 8081 allowed)",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || Ok((reach(&ns, &client, &server_ip)? == (false, true)).then_some(())),
        || format!("{:?}", release.enforcement_rules()),
    )?;
    eprintln!(
        "policy edit enforced (observed by probes) within {:.1}s",
        edited.elapsed().as_secs_f64()
    );
    long_lived_flows(&ns, &client, "after policy v2 removed its port")?;

    // New allowed client pods (issue 49): their first connection, made the moment their container
    // starts, must not be dropped. Before the agent read new pods' addresses on the node, the
    // server's table learned a new client only from the API server, after its first SYN: every new
    // pod lost that SYN (the kernel sent it again a second later).
    ns.apply(&workload::allow_ingress(
        "starter-ingress",
        "server",
        "starter",
        8081,
    ))?;
    ns.apply(&workload::deployment(
        "starter",
        "default",
        &workload::first_connection_script(&server_ip, 8081),
        &[],
    ))?;
    // Each new pod is read as soon as it runs: the next rollout deletes it.
    let mut seen = Vec::new();
    let mut checked = Vec::new();
    let mut dropped = Vec::new();
    let mut check_new = |ns: &Namespace| -> Result<()> {
        for pod in workload::new_pods(ns, "starter", &mut seen)? {
            let first = workload::first_connection(ns, &pod)?;
            let (rc, retransmits) = (first.rc, first.syn_resends);
            ensure!(rc == 0, "pod {pod}'s first connection failed (socat {rc})");
            if retransmits > 0 {
                dropped.push(format!("{pod}: {retransmits} SYN(s) sent again"));
            }
            checked.push(pod);
        }
        Ok(())
    };
    check_new(&ns)?;
    for roll in 0..5 {
        // Not `kubectl rollout restart`: its annotation has a one-second resolution, and a second
        // restart within the same second is an empty patch that kubectl refuses.
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {
            "network-enforcer.test/roll": roll.to_string()}}}}});
        ns.kubectl(&["patch", "deployment", "starter", "-p", &patch.to_string()])?;
        ns.kubectl(&["rollout", "status", "deployment/starter", "--timeout=120s"])?;
        check_new(&ns)?;
    }
    ns.kubectl(&["scale", "deployment", "starter", "--replicas=5"])?;
    check_new(&ns)?;
    ensure!(
        checked.len() >= 10,
        "one pod per rollout and four more: {checked:?}"
    );
    ensure!(
        dropped.is_empty(),
        "new allowed pods lost their first SYN: {dropped:?}\n{}",
        release.logs("agent").unwrap_or_default()
    );
    // Not allowed: still blocked from its first packet.
    ns.apply(&workload::deployment(
        "intruder",
        "default",
        &workload::first_connection_script(&server_ip, 8081),
        &[],
    ))?;
    let (intruder, _) = ns.wait_for_deployment("intruder")?.remove(0);
    let rc = workload::first_connection(&ns, &intruder)?.rc;
    ensure!(
        rc != 0,
        "a new pod the policies do not allow must stay blocked"
    );
    let metrics = http_get(&format!("127.0.0.1:{METRICS_PORT}"), "/metrics")?;
    let metric = |name: &str| release::metric(&metrics, name).unwrap_or(0.0);
    let (found, seconds) = (
        metric("network_enforcer_agent_enforcement_address_from_node_seconds_count"),
        metric("network_enforcer_agent_enforcement_address_from_node_seconds_sum"),
    );
    ensure!(
        found >= checked.len() as f64,
        "every new pod's address read on the node ({found} of {})",
        checked.len()
    );
    eprintln!(
        "{} new pods, none lost its first SYN; address read on the node {:.0} ms (mean) after the pod was seen without one",
        checked.len(),
        seconds / found * 1000.0
    );

    // A new server pod: isolated as soon as its IP is known.
    ns.kubectl(&["scale", "deployment", "server", "--replicas=2"])?;
    let new_ip = poll(
        "the second server pod's IP",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || {
            let ips = ns.kubectl(&[
                "get",
                "pods",
                "-l",
                "app=server",
                "-o",
                "jsonpath={.items[*].status.podIP}",
            ])?;
            Ok(ips
                .split_whitespace()
                .find(|ip| *ip != server_ip)
                .map(String::from))
        },
        || ns.describe(),
    )?;
    let ip_known = Instant::now();
    poll(
        "the new pod's address in the enforcement table",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            let rules = release.enforcement_rules()?.unwrap_or_default();
            Ok(rules
                .contains(&format!("{new_ip} : jump in_"))
                .then_some(()))
        },
        || format!("{:?}", release.enforcement_rules()),
    )?;
    let isolated_after = ip_known.elapsed();
    ns.wait_for_deployment("server")?;
    ensure!(
        reach(&ns, &client, &new_ip)? == (false, true),
        "the new server pod must be isolated like the first"
    );
    eprintln!(
        "new pod isolated {:.0} ms after its IP was visible in the API",
        isolated_after.as_secs_f64() * 1000.0
    );

    // Deny evidence: every refused attempt above was read back and counted.
    let metrics = http_get(&format!("127.0.0.1:{METRICS_PORT}"), "/metrics")?;
    let denied: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("network_enforcer_agent_enforcement_denied_total{"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum();
    ensure!(
        denied >= 2.0,
        "the new agent saw at least the two denied attempts since it started, counted {denied}:\n{metrics}"
    );

    ns.delete_and_wait()?;
    // Uninstall checks that the agent removed its table.
    release.uninstall()
}
