//! `helm install` of our chart into the local cluster: our images (built from the workspace's debug
//! binaries), the admission policy off (v1.20 has none). The controller Deployment and the agent
//! DaemonSet become ready, the agent loads and attaches its eBPF programs and serves its metrics, and
//! `helm uninstall` leaves nothing of the release behind — including enforcement: a protect policy's
//! NetworkPolicy in an app namespace that outlives the release is removed and stays removed
//! (docs/install.md, "Uninstall"). Needs root, `cargo xtask setup` and the binaries
//! (`cargo build --bins`; `cargo test --workspace` builds them).

use anyhow::{Result, ensure};
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release, http_get, metric};
use network_enforcer_tests::e2e::workload::Namespace;
use network_enforcer_tests::fixture;
use std::time::Duration;

/// Not the agent's default (9464): agents of other test binaries may hold that port on the host.
const METRICS_PORT: u16 = 19464;

#[test]
fn helm_install_runs_the_controller_and_an_agent_that_loads_its_programs_and_uninstall_leaves_nothing()
-> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-chart",
        "ne-chart-install",
        &[
            "controller.provider.name=ebpf".into(),
            format!("agent.metricsPort={METRICS_PORT}"),
            "controller.edgeHistory.persistInterval=1s".into(),
        ],
    )?;

    // The programs are loaded before the agent logs this, and a failed load ends the process (the pod
    // would not stay ready).
    poll(
        "the agent to log that its eBPF programs are attached",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let log = release.logs("agent")?;
            Ok(log.contains("eBPF programs attached").then_some(()))
        },
        || release.describe(),
    )?;
    // hostNetwork: the agent's metrics endpoint is on the node, i.e. here.
    let metrics = poll(
        "the agent's metrics endpoint",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let text = http_get(&format!("127.0.0.1:{METRICS_PORT}"), "/metrics")?;
            Ok(metric(&text, "network_enforcer_agent_events_total").map(|_| text))
        },
        || release.describe(),
    )?;
    ensure!(
        metric(&metrics, "network_enforcer_agent_decode_errors_total") == Some(0.0),
        "the agent could not decode kernel records:\n{metrics}"
    );
    // The fill of the kernel's buffers is sampled at the agent's first flush.
    let capacity = r#"network_enforcer_agent_ebpf_map_capacity{map="edges"}"#;
    poll(
        "the agent to report its eBPF maps' fill",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let text = http_get(&format!("127.0.0.1:{METRICS_PORT}"), "/metrics")?;
            Ok((metric(&text, capacity) == Some(65536.0)).then_some(()))
        },
        || release.describe(),
    )?;
    // The operator's view of the agent's cost and health, from inside its pod.
    let status = release.exec_agent(&["network-enforcer-agent", "status", "--sample", "2s"])?;
    for expected in [
        "agent: ready",
        "ok ebpf: programs attached",
        "PROGRAM",
        // The typed TCP program loads in a pod with the chart's capabilities (no fallback).
        "inet_sock_set_state_btf",
        "memory: ",
        "ring buffer: ",
        "of 4096 KiB",
        "map edges: ",
        "map connecting: ",
        "map udp_peers: ",
    ] {
        ensure!(
            status.contains(expected),
            "`status` lacks {expected:?}:\n{status}"
        );
    }
    ensure!(
        !status.contains("memory: 0.0 MiB"),
        "`status` reads no resident memory:\n{status}"
    );
    let controller_log = release.logs("controller")?;
    ensure!(
        controller_log.contains("starting controller"),
        "the controller did not start:\n{controller_log}"
    );
    let controllers = release.pods("controller")?;
    ensure!(
        controllers.len() == 1,
        "expected one controller pod\n{}",
        release.describe()
    );
    web_view_is_reached_by_port_forward_only(&release, &controllers[0])?;
    // The leader persists the protect gate's history with what the chart's Role allows it
    // (docs/behaviour.md §3.11): a write it may not do would leave no ConfigMap.
    let history = format!("{}-edge-history-0", release.object_name("controller"));
    poll(
        "the controller to persist its protect gate's history",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let found = release.kubectl(&[
                "get",
                "configmap",
                &history,
                "-o",
                "name",
                "--ignore-not-found",
            ])?;
            Ok((!found.trim().is_empty()).then_some(()))
        },
        || {
            format!(
                "{}\n{}",
                release.describe(),
                release.logs("controller").unwrap_or_default()
            )
        },
    )?;
    the_dashboard_queries_only_metrics_that_exist(&release, &controllers[0], &metrics)?;

    // Enforcement in force at uninstall time: a protect policy in an app namespace that stays, its
    // NetworkPolicy rendered by the release's controller.
    let app = Namespace::create(&cluster.kubeconfig, "ne-chart-install-app")?;
    app.apply(&protect_policy(&app.name).to_string())?;
    let rendered = poll(
        "the controller to render the protect policy's NetworkPolicy",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || rendered_network_policies(&app).map(|l| (!l.is_empty()).then_some(l)),
        || release.describe(),
    )?;

    // Asked for, the web view is served on the pod network, behind its Service.
    release.upgrade(&["controller.ui.service=true".into()])?;
    web_view_is_served_on_the_pod_network(&release)?;

    let name = release.name.clone();
    let namespace = release.namespace.clone();
    let kubeconfig = cluster.kubeconfig.clone();
    // Returns once helm is done and the release namespace, with every controller pod, is gone: from
    // then on nothing can render again, so one look afterwards is conclusive.
    release.uninstall()?;
    let left = rendered_network_policies(&app)?;
    ensure!(
        left.is_empty(),
        "enforcement outlived the uninstall: rendered NetworkPolicies left in {} (uid, managers): \
         {left:?}; before the uninstall: {rendered:?}",
        app.name
    );
    ensure!(
        app.kubectl(&["get", "workloadnetworkpolicy", POLICY, "-o", "name"])?
            .contains(POLICY),
        "the uninstall must keep the user's policy"
    );
    // Uninstall waited for this; look once more with a fresh handle, as a user would.
    let left = Release::leftover_objects(&kubeconfig, &name, &namespace)?;
    ensure!(left.is_empty(), "left after helm uninstall: {left:?}");
    Ok(())
}

/// The web view's default (docs/ui.md): on the pod's loopback. `kubectl port-forward` serves the page;
/// the pod's address answers on the metrics port (so it is reachable from here, the node) but refuses
/// the web view's port.
fn web_view_is_reached_by_port_forward_only(release: &Release, pod: &str) -> Result<()> {
    const UI_PORT: u16 = 8090;
    let forward = release.port_forward(
        &format!("deploy/{}", release.object_name("controller")),
        UI_PORT,
    )?;
    let page = poll(
        "the web view through kubectl port-forward",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || Ok(http_get(&forward.address(), "/").ok()),
        || release.describe(),
    )?;
    ensure!(
        page.contains("<html") || page.contains("<!DOCTYPE"),
        "the web view's page through port-forward is no HTML page: {page:.200}"
    );
    drop(forward);
    let ip = release.kubectl(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])?;
    let ip: std::net::IpAddr = ip.trim().parse()?;
    let reach = |port: u16| {
        std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_secs(5))
    };
    reach(8080).map_err(|e| {
        anyhow::anyhow!("the controller pod's metrics port is not reachable at {ip}: {e}")
    })?;
    match reach(UI_PORT) {
        Ok(_) => anyhow::bail!("the web view answers on the pod network at {ip}:{UI_PORT}"),
        Err(e) => ensure!(
            e.kind() == std::io::ErrorKind::ConnectionRefused,
            "expected the pod to refuse {ip}:{UI_PORT}, got {e}"
        ),
    }
    Ok(())
}

/// Every metric the Grafana dashboard (charts/network-enforcer/dashboards) queries is one the running
/// controller or agent describes on its `/metrics` (`# TYPE <name>`), so no panel stays empty because
/// of a misspelt or renamed metric. A labelled family without samples yet is not described (nothing
/// rejected, enforcement off): such a name must then be registered in the sources (its name as a
/// string literal, the component's prefix and a sub-registry's prefix taken off).
fn the_dashboard_queries_only_metrics_that_exist(
    release: &Release,
    controller_pod: &str,
    agent_metrics: &str,
) -> Result<()> {
    let ip = release.kubectl(&[
        "get",
        "pod",
        controller_pod,
        "-o",
        "jsonpath={.status.podIP}",
    ])?;
    let controller_metrics = http_get(&format!("{}:8080", ip.trim()), "/metrics")?;
    let path = release::chart_dir().join("dashboards/network-enforcer.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut names = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            for (at, _) in expr.match_indices("network_enforcer_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    ensure!(
        names.len() >= 15,
        "the dashboard queries too little: {names:?}"
    );
    let described = |name: &str| {
        let base = ["_bucket", "_total"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        let line = format!("# TYPE {base} ");
        agent_metrics.contains(&line) || controller_metrics.contains(&line)
    };
    let sources: String = ["controller/src", "agent/src"]
        .iter()
        .flat_map(|dir| rust_files(&release::chart_dir().join("../..").join(dir)))
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .collect();
    let registered = |name: &str| {
        let base = ["_bucket", "_total"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        let Some(short) = ["network_enforcer_controller_", "network_enforcer_agent_"]
            .iter()
            .find_map(|prefix| base.strip_prefix(prefix))
        else {
            return false;
        };
        // A sub-registry's prefix (`enforcement_`) is registered apart from the name.
        std::iter::once(short)
            .chain(short.split_once('_').map(|(_, rest)| rest))
            .any(|n| sources.contains(&format!("\"{n}\"")))
    };
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !described(n) && !registered(n))
        .collect();
    ensure!(
        missing.is_empty(),
        "the dashboard queries metrics no endpoint describes: {missing:?}"
    );
    Ok(())
}

/// The `.rs` files below `dir`.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// `controller.ui.service=true`: the pod's address serves the web view, and its Service exists.
fn web_view_is_served_on_the_pod_network(release: &Release) -> Result<()> {
    let pod = poll(
        "one controller pod after the upgrade",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || Ok(<[String; 1]>::try_from(release.pods("controller")?).ok()),
        || release.describe(),
    )?;
    let ip = release.kubectl(&["get", "pod", &pod[0], "-o", "jsonpath={.status.podIP}"])?;
    let address = format!("{}:8090", ip.trim());
    let page = poll(
        "the web view on the pod network",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || Ok(http_get(&address, "/").ok()),
        || release.describe(),
    )?;
    ensure!(
        page.contains("<html") || page.contains("<!DOCTYPE"),
        "no HTML page at {address}"
    );
    let service = format!("{}-ui", release.object_name("controller"));
    release.kubectl(&["get", "service", &service, "-o", "name"])?;
    Ok(())
}

/// The protect policy of the uninstall check.
const POLICY: &str = "deployment-web-ingress";

/// A valid kubernetes-backend policy in protect mode: the controller renders it into a NetworkPolicy.
fn protect_policy(namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": POLICY, "namespace": namespace},
        "spec": {
            "backend": "kubernetes", "direction": "Ingress", "mode": "protect",
            "targetRef": {"kind": "Deployment", "name": "web"},
            "kubernetes": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                             "ports": [{"protocol": "TCP", "port": 8080}]}]
            }
        }
    })
}

/// The NetworkPolicies in `app` that our controller rendered (labelled as ours), as
/// `name uid managers` lines: a re-created one shows a new uid.
fn rendered_network_policies(app: &Namespace) -> Result<Vec<String>> {
    let out = app.kubectl(&[
        "get",
        "networkpolicies",
        "-l",
        "app.kubernetes.io/managed-by=network-enforcer",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.metadata.managedFields[*].manager}{\"\\n\"}{end}",
    ])?;
    Ok(out.lines().map(String::from).collect())
}
