//! An agent stopped by Kubernetes (a rollout, a node drain: SIGTERM) first flushes the edges it has
//! aggregated but not sent yet, so the controller still learns them. Our chart in the local cluster with
//! the eBPF provider, the scenario's real `http-client` / `http-server` pods and real socat traffic; the
//! agent pod is deleted right after the traffic. Needs root, `cargo xtask setup` and the binaries
//! (`cargo build --bins`; `cargo test --workspace` builds them).

use anyhow::Result;
use network_enforcer_tests::cluster::components::kubectl;
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::e2e::scenario::{self, EGRESS};
use network_enforcer_tests::e2e::workload::{Protocol, send};
use network_enforcer_tests::fixture;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The agent's flush interval: far longer than the test, so only the flush at SIGTERM can deliver the
/// edge (its first tick is at start, before any traffic; with 60 s a tick could still fall between the
/// traffic and the delete, depending on how long the setup took).
const FLUSH_SECONDS: u64 = 3600;

/// Not the agent's default (9464) nor another test's: every release's agent uses the host network.
const METRICS_PORT: u16 = 19_467;

/// The agent's last flush, its delivery (2 s at most) and the controller's write (every 2 s).
const LEARN_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn an_agent_stopped_with_sigterm_first_sends_the_edges_it_has_not_flushed() -> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let release_ns = "ne-shutdown-system";
    let app_ns = format!("shutdown-{}", std::process::id());
    let mut values = scenario::release_values(release_ns);
    values.extend([
        // Other tests' releases may run on this cluster: learn only in our own namespace.
        format!("controller.watchNamespace={app_ns}"),
        format!("agent.metricsPort={METRICS_PORT}"),
        format!("agent.flushIntervalSeconds={FLUSH_SECONDS}"),
    ]);
    let release = Release::install(&cluster.kubeconfig, "ne-shutdown", release_ns, &values)?;
    let w = scenario::create_workload(&cluster.kubeconfig, &app_ns)?;
    // Looked up first, so the delete follows the traffic at once.
    let agent = release.agent_pod()?;

    // To the server pod's IP: no DNS or Service in the way, just the one edge under test.
    let (server_ip, port) = (w.server.1.clone(), 18080);
    poll(
        &format!("TCP {server_ip}:{port} to echo"),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || Ok(send(&w.ns, &w.client.0, Protocol::Tcp, &server_ip, port, "hello")?.then_some(())),
        || w.ns.describe(),
    )?;
    // SIGTERM, as in a rollout; the DaemonSet starts a new agent, which never saw this connection.
    release.kubectl(&["delete", "pod", &agent, "--wait=false"])?;
    let deleted = Instant::now();
    let stopping_log = keep_log_while_it_exists(&cluster.kubeconfig, release_ns, &agent);

    let rule = json!({
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": app_ns}},
                "podSelector": {"matchLabels": {"app": "http-server"}}}],
        "ports": [{"protocol": "TCP", "port": port}]
    });
    poll(
        &format!(
            "proposal {EGRESS} with the edge to http-server:{port}, sent by the stopping agent"
        ),
        LEARN_TIMEOUT,
        Duration::from_millis(500),
        || {
            let specs = scenario::proposal_specs(&w)?;
            let egress = specs.get(EGRESS).map(|s| &s["kubernetes"]["egress"]);
            Ok(egress
                .and_then(|rules| rules.as_array())
                .is_some_and(|rules| rules.contains(&rule))
                .then_some(()))
        },
        || {
            format!(
                "proposals: {:?}\n{}--- the stopping agent's log ---\n{}",
                scenario::proposal_specs(&w),
                release.describe(),
                stopping_log.lock().expect("log lock")
            )
        },
    )?;
    eprintln!(
        "learned {:.1}s after the agent pod's delete",
        deleted.elapsed().as_secs_f64()
    );
    release.uninstall()
}

/// The log of `pod`, read again every half second until the pod is gone: a failure is explained by
/// the stopping agent's own last words, which `kubectl logs` no longer has by then.
fn keep_log_while_it_exists(
    kubeconfig: &std::path::Path,
    namespace: &str,
    pod: &str,
) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::from("(not read yet)")));
    let (kubeconfig, namespace, pod, kept) = (
        kubeconfig.to_path_buf(),
        format!("--namespace={namespace}"),
        pod.to_string(),
        log.clone(),
    );
    std::thread::spawn(move || {
        let started = Instant::now();
        while started.elapsed() < LEARN_TIMEOUT {
            match kubectl(&kubeconfig, &[namespace.as_str(), "logs", pod.as_str()]) {
                Ok(text) => *kept.lock().expect("log lock") = text,
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    log
}
