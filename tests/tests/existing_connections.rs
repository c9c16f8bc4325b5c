//! A long-lived connection opened before `helm install` (a database pool, a gRPC stream) is learned
//! from the agent's start-up socket scan, without a reconnect, and a later live connection of the same
//! kind adds nothing to the proposals (docs/design.md, "Connections open before the agent").
//!
//! `app` holds one TCP connection to Service `db` (port 15432), opened before the release exists;
//! then our chart is installed (eBPF provider, the chart's default capabilities). Both proposals must
//! appear with exactly that rule while the connection is still the one opened before the install.
//! Needs root, `cargo xtask setup` and the binaries (`cargo build --bins`; `cargo test --workspace`
//! builds them).

use anyhow::{Context, Result, ensure};
use network_enforcer_api::WorkloadNetworkPolicyProposal;
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::e2e::scenario::{list, release_values, rules_sorted};
use network_enforcer_tests::e2e::workload::{self, Namespace, Protocol, send};
use network_enforcer_tests::fixture;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const PORT: u16 = 15432;

/// The established TCP connections to `PORT` in `pod`'s network namespace, as
/// `local_hex:port remote_hex:port` from /proc/net/tcp (state 01).
fn connections_to_port(ns: &Namespace, pod: &str) -> Result<Vec<String>> {
    let table = ns.exec(pod, "cat /proc/net/tcp")?;
    let port = format!(":{PORT:04X}");
    Ok(table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[2].ends_with(&port) && f[3] == "01")
                .then(|| format!("{} {}", f[1], f[2]))
        })
        .collect())
}

fn expected_specs(namespace: &str) -> BTreeMap<String, Value> {
    let peer = |app: &str| {
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
               "podSelector": {"matchLabels": {"app": app}}})
    };
    BTreeMap::from([
        (
            "deployment-app-egress".to_string(),
            json!({
                "backend": "kubernetes", "direction": "Egress",
                "targetRef": {"kind": "Deployment", "name": "app"},
                "kubernetes": {
                    "podSelector": {"matchLabels": {"app": "app"}},
                    "policyTypes": ["Egress"],
                    "egress": [{"to": [peer("db")], "ports": [{"protocol": "TCP", "port": PORT}]}]
                }
            }),
        ),
        (
            "deployment-db-ingress".to_string(),
            json!({
                "backend": "kubernetes", "direction": "Ingress",
                "targetRef": {"kind": "Deployment", "name": "db"},
                "kubernetes": {
                    "podSelector": {"matchLabels": {"app": "db"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [peer("app")], "ports": [{"protocol": "TCP", "port": PORT}]}]
                }
            }),
        ),
    ])
}

/// The proposals' specs by name, rules sorted, absent (null) fields left out.
fn specs(ns: &Namespace) -> Result<BTreeMap<String, Value>> {
    fn without_nulls(v: Value) -> Value {
        match v {
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, without_nulls(v)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
            other => other,
        }
    }
    list::<WorkloadNetworkPolicyProposal>(ns, "workloadnetworkpolicyproposals")?
        .into_iter()
        .map(|(name, p)| {
            // After sorting: `rules_sorted` indexes both rule lists, which adds the absent one as null.
            let spec = rules_sorted(serde_json::to_value(&p.spec)?);
            Ok((name, without_nulls(spec)))
        })
        .collect()
}

#[test]
fn a_connection_opened_before_the_install_is_learned_without_a_reconnect_and_only_once()
-> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let ns = Namespace::create(
        &cluster.kubeconfig,
        &format!("ne-existing-{}", std::process::id()),
    )?;
    ns.service_account("app-sa")?;
    ns.service_account("db-sa")?;
    ns.apply(
        &json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
            "spec": {"selector": {"app": "db"},
                     "ports": [{"port": PORT, "targetPort": PORT, "protocol": "TCP"}]}
        })
        .to_string(),
    )?;
    ns.apply(&workload::deployment(
        "db",
        "db-sa",
        &workload::echo_server_script(&[PORT], &[]),
        &[(PORT, "TCP")],
    ))?;
    ns.wait_for_deployment("db")?;
    ns.wait_for_endpoints("db", 1)?;
    let db_ip = ns.cluster_ip("db")?;
    // One connection held open (socat's input never ends); retried only until it is established, so
    // nothing the agent could see live happens after the install.
    ns.apply(&workload::deployment(
        "app",
        "app-sa",
        &format!(
            "until sleep 100000 | socat - TCP:{db_ip}:{PORT},connect-timeout=2; do sleep 1; done"
        ),
        &[],
    ))?;
    let (app, _) = ns.wait_for_deployment("app")?.remove(0);
    let before = poll(
        "app's connection to db to be established",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let c = connections_to_port(&ns, &app)?;
            Ok((c.len() == 1).then_some(c))
        },
        || ns.describe(),
    )?;

    // The agent starts now, after the connection.
    let started = Instant::now();
    let release_namespace = "ne-existing-system";
    let mut values = release_values(release_namespace);
    // Not the agent's default port: agents of other test binaries may hold it on the host.
    values.push("agent.metricsPort=19465".into());
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-existing",
        release_namespace,
        &values,
    )?;
    let expected = expected_specs(&ns.name);
    let learned = poll(
        "both proposals of the connection opened before the install",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let got = specs(&ns)?;
            Ok((got.len() == 2).then_some(got))
        },
        || format!("{}\n{}", ns.describe(), release.describe()),
    )?;
    let learned_after = started.elapsed();
    ensure!(
        learned == expected,
        "learned {learned:#?}\nexpected {expected:#?}"
    );
    // Still the connection from before the install: the scan, not a reconnect, taught it.
    let now = connections_to_port(&ns, &app)?;
    ensure!(
        now == before,
        "the connection changed ({before:?} before the install, {now:?} now): a reconnect could \
         have taught the proposals"
    );
    let log = release.logs("agent")?;
    let scan_line = log
        .lines()
        .find(|l| l.contains("scanned connections open before the agent started"))
        .with_context(|| format!("the agent did not log its start-up scan:\n{log}"))?;
    eprintln!("learned {learned_after:?} after helm install started; agent: {scan_line}");

    // The same kind of connection, live now: both ends see it; the proposals stay as they are.
    ensure!(
        send(&ns, &app, Protocol::Tcp, &db_ip, PORT, "hello")?,
        "a new connection from app to db was not echoed"
    );
    let flows = poll(
        "the agent to hold the live connection on the scanned edge",
        Duration::from_secs(20),
        Duration::from_millis(500),
        || {
            let out = release.exec_agent(&[
                "network-enforcer-agent",
                "flows",
                "--since",
                "10m",
                "-o",
                "json",
                "--port",
                &PORT.to_string(),
                "--direction",
                "outbound",
            ])?;
            let counts: Vec<u64> = out
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|f| f["peer_ip"] == db_ip.as_str())
                .filter_map(|f| f["count"].as_u64())
                .collect();
            Ok((counts == [2]).then_some(counts))
        },
        || release.describe(),
    )?;
    eprintln!("app -> db:{PORT} outbound edge counts: {flows:?} (scanned + live)");
    // Two controller flushes (2 s each) after the agent's flush.
    std::thread::sleep(Duration::from_secs(6));
    let after = specs(&ns)?;
    ensure!(
        after == expected,
        "the live connection changed the proposals: {after:#?}"
    );
    release.uninstall()
}
