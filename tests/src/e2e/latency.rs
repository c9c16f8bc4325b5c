//! How long a new connection takes to be learned: a client connects to a server on ports it never used
//! before, one at a time, and each sample is the time from sending to the client's egress proposal
//! listing that port. Used by `cargo xtask bench e2e` next to the scenario's own samples.

use anyhow::Result;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

use super::poll;
use super::workload::{self, Namespace, Protocol, send};

/// The first of the server's ports; the samples use `FIRST_PORT..FIRST_PORT + count`.
const FIRST_PORT: u16 = 21000;

/// `count` samples in a fresh namespace `name` (deleted at the end), against the installed chart.
pub fn new_edge_samples(kubeconfig: &Path, name: &str, count: u16) -> Result<Vec<Duration>> {
    let ns = Namespace::create(kubeconfig, name)?;
    let ports: Vec<u16> = (FIRST_PORT..FIRST_PORT + count).collect();
    let declared: Vec<(u16, &str)> = ports.iter().map(|p| (*p, "TCP")).collect();
    ns.apply(&workload::deployment(
        "server",
        "default",
        &workload::echo_server_script(&ports, &[]),
        &declared,
    ))?;
    ns.apply(&workload::deployment(
        "client",
        "default",
        "exec sleep 100000",
        &[],
    ))?;
    let (_, server_ip) = ns.wait_for_deployment("server")?.remove(0);
    let (client, _) = ns.wait_for_deployment("client")?.remove(0);
    let mut samples = Vec::new();
    for port in ports {
        let sent = Instant::now();
        send(&ns, &client, Protocol::Tcp, &server_ip, port, "learn-me")?;
        poll(
            &format!("the client's egress proposal to list port {port}"),
            Duration::from_secs(60),
            Duration::from_millis(50),
            || Ok(egress_ports(&ns)?.contains(&port).then_some(())),
            || ns.describe(),
        )?;
        samples.push(sent.elapsed());
    }
    ns.delete_and_wait()?;
    Ok(samples)
}

/// The ports of the client's egress proposal (empty until it exists).
fn egress_ports(ns: &Namespace) -> Result<Vec<u16>> {
    let out = ns.kubectl(&[
        "get",
        "workloadnetworkpolicyproposals",
        "deployment-client-egress",
        "--ignore-not-found",
        "-o",
        "json",
    ])?;
    if out.trim().is_empty() {
        return Ok(Vec::new());
    }
    let proposal: Value = serde_json::from_str(&out)?;
    Ok(proposal["spec"]["kubernetes"]["egress"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["ports"].as_array().into_iter().flatten())
        .filter_map(|p| p["port"].as_u64()?.try_into().ok())
        .collect())
}
