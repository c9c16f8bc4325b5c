//! A hostile workload on the local cluster, with our chart installed: one pod sends UDP datagrams to
//! all 65,535 ports of a server pod and to 10,000 addresses nobody holds, while a normal client talks
//! to the same server. Learning must go on for the normal workload, the hostile pod's proposal must
//! stay a small object with its caps visible (agent drop counters, `LearningCapped` /
//! `ExternalPeersCapped` Events), no agent stream may be refused or lose batches, and the agent's
//! memory stays bounded.
//!
//! The unheld addresses are in 10.97.0.0/16, which the test routes to a blackhole on the node for its
//! duration: the datagrams stay on the machine, and no neighbour resolution storms the pods' bridge.
//!
//! Needs root, `cargo xtask setup` and the binaries (`cargo test --workspace` builds them).

use anyhow::{Context, Result, ensure};
use network_enforcer_api::WorkloadNetworkPolicyProposal;
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release, http_get, metric};
use network_enforcer_tests::e2e::scenario;
use network_enforcer_tests::e2e::workload::{self, Namespace, Protocol, send};
use network_enforcer_tests::fixture;
use network_enforcer_tests::images::ECHO_SERVER;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Not the agent's default (9464): agents of other test binaries may hold that port on the host.
const METRICS_PORT: u16 = 29466;
/// The controller's bounds (its defaults): what the hostile proposal must stay within.
const MAX_PORTS_PER_RULE: usize = 64;
const MAX_RULES: usize = 500;
const MAX_EXTERNAL_PEERS_PER_PORT: usize = 50;
const MAX_PROPOSAL_BYTES: usize = 1024 * 1024;
/// The bounds on the agent's memory under this load: its growth over the peak before the spray (the
/// edges it holds are capped), and its peak: half the chart's default limit (256Mi).
const MAX_AGENT_RSS_GROWTH_MIB: f64 = 32.0;
const MAX_AGENT_RSS_MIB: f64 = 128.0;
/// The first of the 10,000 unheld addresses (10.97.0.0 – 10.97.39.15).
const UNHELD: &str = "10.97.0.0";
/// Where they go: dropped by the node.
const UNHELD_ROUTE: &str = "10.97.0.0/16";

/// A blackhole route on the node for [`UNHELD_ROUTE`], removed on drop.
struct Blackhole;

impl Blackhole {
    fn add() -> Result<Self> {
        let status = std::process::Command::new("ip")
            .args(["route", "replace", "blackhole", UNHELD_ROUTE])
            .status()
            .context("running ip route")?;
        ensure!(
            status.success(),
            "ip route replace blackhole {UNHELD_ROUTE}: {status}"
        );
        Ok(Self)
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["route", "del", "blackhole", UNHELD_ROUTE])
            .status();
    }
}

fn proposal(ns: &Namespace, name: &str) -> Result<Option<WorkloadNetworkPolicyProposal>> {
    Ok(
        scenario::list::<WorkloadNetworkPolicyProposal>(ns, "workloadnetworkpolicyproposals")?
            .remove(name),
    )
}

/// Events with `reason` on objects of the namespace.
fn events(ns: &Namespace, reason: &str) -> Result<Vec<String>> {
    let text = ns.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("reason={reason}"),
        "-o",
        "json",
    ])?;
    let list: Value = serde_json::from_str(&text)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect())
}

/// The highest peak RSS (VmHWM, MiB) of the agent processes on this machine (the tests install one
/// release at a time, so these are this release's).
fn agent_peak_rss_mib() -> Result<f64> {
    let mut peak: Option<f64> = None;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_agent = args
            .first()
            .is_some_and(|a| a.ends_with(b"network-enforcer-agent"))
            && args.get(1) == Some(&&b"run"[..]);
        if !is_agent {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        peak = Some(peak.unwrap_or(0.0).max(kib / 1024.0));
    }
    peak.context("no agent process found on this machine")
}

#[test]
fn a_pod_spraying_every_port_and_ten_thousand_addresses_stalls_nothing() -> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let release_namespace = "ne-hostile-system";
    let mut values = scenario::release_values(release_namespace);
    values.push(format!("agent.metricsPort={METRICS_PORT}"));
    // Unheld addresses are learned as external once this grace has passed.
    values.push("controller.resolutionGraceSeconds=3".into());
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-hostile",
        release_namespace,
        &values,
    )?;
    let ns = Namespace::create(
        &cluster.kubeconfig,
        &format!("hostile-{}", std::process::id()),
    )?;
    ns.apply(&workload::deployment(
        "server",
        "default",
        &workload::echo_server_script(&[8080], &[]),
        &[(8080, "TCP")],
    ))?;
    for name in ["client", "sprayer"] {
        ns.apply(&workload::deployment(
            name,
            "default",
            "exec sleep 100000",
            &[],
        ))?;
    }
    let (_, server_ip) = ns.wait_for_deployment("server")?.remove(0);
    let (client, _) = ns.wait_for_deployment("client")?.remove(0);
    let (sprayer, _) = ns.wait_for_deployment("sprayer")?.remove(0);
    let _blackhole = Blackhole::add()?;
    let rss_before = agent_peak_rss_mib()?;

    // The spray, in the background: port 53 of 10,000 addresses, then (in the agent's next budget
    // interval, 10 s) every port of the server.
    ns.exec(
        &sprayer,
        &format!(
            "({ECHO_SERVER} --spray {UNHELD} 10000 53 1; sleep 11; {ECHO_SERVER} --spray {server_ip} 1 1 65535) \
             > /tmp/spray.log 2>&1 < /dev/null &"
        ),
    )?;
    // Meanwhile, the normal client: its connection is learned as usual.
    let started = Instant::now();
    ensure!(
        send(&ns, &client, Protocol::Tcp, &server_ip, 8080, "normal")?,
        "the server must answer the normal client"
    );
    let normal = "deployment-client-egress";
    poll(
        "the normal client's proposal with its rule to the server",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            Ok(proposal(&ns, normal)?
                .filter(|p| serde_json::to_string(&p.spec).is_ok_and(|s| s.contains("8080"))))
        },
        || release.describe(),
    )?;
    eprintln!(
        "the normal client's connection was learned {:?} after it was made, during the spray",
        started.elapsed()
    );

    // The spray has finished, and its proposal holds what the bounds let through.
    poll(
        "the spray to finish",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let log = ns.exec(&sprayer, "cat /tmp/spray.log")?;
            Ok((log.lines().count() >= 2).then_some(log))
        },
        || release.describe(),
    )
    .map(|log| eprintln!("spray: {}", log.replace('\n', "; ")))?;
    let hostile = "deployment-sprayer-egress";
    let spec = poll(
        "the sprayer's proposal with its external peers on port 53 (capped)",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let Some(p) = proposal(&ns, hostile)? else {
                return Ok(None);
            };
            let spec = serde_json::to_value(&p.spec)?;
            let external = spec["kubernetes"]["egress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["to"][0]["ipBlock"].is_object())
                .count();
            Ok((external >= MAX_EXTERNAL_PEERS_PER_PORT).then_some((p, spec)))
        },
        || format!("{:?}\n{}", proposal(&ns, hostile), release.describe()),
    )?;
    let (object, spec) = spec;
    let bytes = serde_json::to_vec(&object)?.len();
    let rules = spec["kubernetes"]["egress"]
        .as_array()
        .context("the sprayer's proposal has no egress rules")?;
    let external = rules
        .iter()
        .filter(|r| r["to"][0]["ipBlock"].is_object())
        .count();
    let server_rule = rules
        .iter()
        .find(|r| r["to"][0]["podSelector"].is_object())
        .context("the sprayer's proposal has no rule to the server")?;
    let server_ports = server_rule["ports"].as_array().map_or(0, Vec::len);
    let ranges = server_rule["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["endPort"].is_number())
        .count();
    eprintln!(
        "the sprayer's proposal: {bytes} bytes, {} rules ({external} external), {server_ports} port \
         entries to the server ({ranges} ranges)",
        rules.len()
    );
    ensure!(bytes <= MAX_PROPOSAL_BYTES, "{bytes} bytes");
    ensure!(rules.len() <= MAX_RULES, "{} rules", rules.len());
    ensure!(
        external == MAX_EXTERNAL_PEERS_PER_PORT,
        "{external} external peers on port 53, expected the cap of {MAX_EXTERNAL_PEERS_PER_PORT}"
    );
    ensure!(
        (1..=MAX_PORTS_PER_RULE).contains(&server_ports) && ranges > 0,
        "the spray over every port must collapse into ranges within {MAX_PORTS_PER_RULE} entries: \
         {server_rule:#}"
    );
    let capped = poll(
        "an ExternalPeersCapped Event on the sprayer's proposal",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || Ok(Some(events(&ns, "ExternalPeersCapped")?).filter(|e| !e.is_empty())),
        || ns.describe(),
    )?;
    eprintln!("Event: {}", capped[0]);

    // The agent: its caps counted, nothing lost on the way up, its memory bounded.
    let text = http_get(&format!("127.0.0.1:{METRICS_PORT}"), "/metrics")?;
    let sample = |name: &str| metric(&text, name).unwrap_or(0.0);
    let dropped = text
        .lines()
        .filter(|l| l.starts_with("network_enforcer_agent_events_dropped_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    let rss = agent_peak_rss_mib()?;
    eprintln!(
        "agent: {} events read, {dropped} dropped by its edge caps, {} batches dropped, {} records \
         rejected by the controller, peak RSS {rss:.1} MiB ({rss_before:.1} MiB before the spray)",
        sample("network_enforcer_agent_events_total"),
        sample("network_enforcer_agent_uplink_batches_dropped_total"),
        sample("network_enforcer_agent_uplink_records_rejected_total"),
    );
    ensure!(
        sample("network_enforcer_agent_uplink_batches_dropped_total") == 0.0,
        "the agent lost batches on the way to the controller"
    );
    ensure!(
        rss - rss_before <= MAX_AGENT_RSS_GROWTH_MIB && rss <= MAX_AGENT_RSS_MIB,
        "agent peak RSS {rss:.1} MiB, {rss_before:.1} MiB before the spray: at most \
         {MAX_AGENT_RSS_GROWTH_MIB} MiB more and {MAX_AGENT_RSS_MIB} MiB in all"
    );
    let logs = release.logs("controller")?;
    ensure!(
        !logs.contains("agent stream refused"),
        "the controller refused an agent's stream:\n{logs}"
    );

    ns.delete_and_wait()?;
    release.uninstall()
}
