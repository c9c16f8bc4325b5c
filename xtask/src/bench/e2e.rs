//! `cargo xtask bench e2e`: the end-to-end scenario (docs/development.md), Kubernetes backend
//! (`tests::e2e::scenario`), against our chart in the local cluster, `NE_E2E_RUNS` times (default 3) on
//! one install. Figures: the scenario's median run time, and first-packet-to-proposal latency over
//! every proposal of every run (the time from the client's first TCP packet to each proposal existing
//! in the API) plus `NE_E2E_LATENCY_SAMPLES` (default 20) new connections of an existing workload, each
//! until its rule is in the proposal.

use anyhow::{Context, Result};
use network_enforcer_tests::e2e::latency;
use network_enforcer_tests::e2e::release::Release;
use network_enforcer_tests::e2e::scenario::{self, percentile_ms};
use network_enforcer_tests::fixture;
use std::time::Duration;

use super::{Figure, report};

/// Builds the binaries and images, installs the chart, runs the scenario and reports.
pub fn run() -> Result<()> {
    let runs: usize = std::env::var("NE_E2E_RUNS")
        .ok()
        .map(|v| v.parse().context("NE_E2E_RUNS must be a number"))
        .transpose()?
        .unwrap_or(3)
        .max(1);
    let cluster = fixture::cluster_with_crds()?;
    crate::image::ours_from_debug_build()?;
    let namespace = "ne-bench-system";
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-bench",
        namespace,
        &[
            scenario::release_values(namespace),
            vec![scenario::AGENT_ENFORCEMENT.to_string()],
        ]
        .concat(),
    )?;
    let mut scenario_times = Vec::new();
    let mut latencies: Vec<Duration> = Vec::new();
    for i in 0..runs {
        println!("==> scenario run {}/{runs}", i + 1);
        let t = scenario::run(
            &cluster.kubeconfig,
            &release,
            &format!("bench-e2e-{}-{i}", std::process::id()),
        )?;
        scenario_times.push(t.scenario);
        latencies.extend(t.first_packet_to_proposal);
    }
    // New edges of a workload that already has a proposal: the path every later connection takes.
    let probes = std::env::var("NE_E2E_LATENCY_SAMPLES")
        .ok()
        .map(|v| v.parse().context("NE_E2E_LATENCY_SAMPLES must be a number"))
        .transpose()?
        .unwrap_or(20);
    println!("==> {probes} new connections, one at a time, each until its rule is learned");
    let new_edges = latency::new_edge_samples(
        &cluster.kubeconfig,
        &format!("bench-latency-{}", std::process::id()),
        probes,
    )?;
    println!(
        "    new edge → rule: p50 {:.0} ms, p99 {:.0} ms",
        percentile_ms(&new_edges, 50.0),
        percentile_ms(&new_edges, 99.0)
    );
    latencies.extend(new_edges);
    release.uninstall()?;
    scenario::require_samples(&latencies)?;
    scenario_times.sort();
    let median = scenario_times[scenario_times.len() / 2];
    report(
        "e2e",
        &[
            Figure::new("scenario_seconds", median.as_secs_f64(), "s (median)"),
            Figure::new(
                "first_packet_to_proposal_p50_ms",
                percentile_ms(&latencies, 50.0),
                "ms",
            ),
            Figure::new(
                "first_packet_to_proposal_p99_ms",
                percentile_ms(&latencies, 99.0),
                "ms",
            ),
            Figure::new("runs", runs as f64, ""),
            Figure::new("samples", latencies.len() as f64, ""),
        ],
    )?;
    Ok(())
}
