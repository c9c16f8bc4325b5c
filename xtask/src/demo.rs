//! `cargo xtask demo`: the product's main job on this machine. Setup, the local cluster, our images and
//! chart (`helm install`), then a small multi-tier app (`frontend` → `api` → `db`, each resolving the
//! next through the cluster DNS) whose traffic our agent sees and our controller learns; progress for
//! every phase: proposals appearing, promotion to monitor, a violation, promotion to protect, a blocked
//! attempt recorded. Then a summary, a picture of the learned graph, and how to explore; everything
//! stays until Ctrl-C, then the app, the release and the node's drop rule are removed.

use anyhow::{Context, Result};
use network_enforcer_api::keys::PROMOTE_LABEL;
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::e2e::scenario::{self, list};
use network_enforcer_tests::e2e::workload::{self, Namespace, Protocol};
use network_enforcer_tests::e2e::{catch_interrupts, check_interrupted, interrupted, poll};
use network_enforcer_tests::fixture;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::run;

const RELEASE: &str = "network-enforcer";
const RELEASE_NAMESPACE: &str = "network-enforcer";
const APP_NAMESPACE: &str = "demo";
const WAIT: Duration = Duration::from_secs(180);

fn phase(text: &str) {
    println!("\n\x1b[1m==> {text}\x1b[0m");
}

fn info(text: &str) {
    println!("    {text}");
}

/// Runs the demo (see the module docs).
pub fn run() -> Result<()> {
    catch_interrupts();
    let started = Instant::now();
    phase("setup (toolchains and tools, cached)");
    crate::setup::run()?;
    check_interrupted()?;
    phase("local cluster");
    let cluster = fixture::cluster_with_crds()?;
    info(&format!("up; KUBECONFIG={}", cluster.kubeconfig.display()));
    check_interrupted()?;

    phase("our binaries and images");
    crate::image::ours_from_debug_build()?;
    info("network-enforcer.local/agent:dev and network-enforcer.local/controller:dev imported");
    check_interrupted()?;

    phase("helm install (eBPF provider, the agent enforcing NetworkPolicies)");
    let release = Release::install(
        &cluster.kubeconfig,
        RELEASE,
        RELEASE_NAMESPACE,
        &[
            scenario::release_values(RELEASE_NAMESPACE),
            vec![scenario::AGENT_ENFORCEMENT.to_string()],
        ]
        .concat(),
    )?;
    info(&format!(
        "controller {:?} and agent {:?} ready in namespace {RELEASE_NAMESPACE}",
        release.pods("controller")?,
        release.pods("agent")?
    ));
    check_interrupted()?;

    let mut app = deploy_app(&cluster.kubeconfig)?;
    check_interrupted()?;
    show_lifecycle(&app, &release)?;

    phase("summary");
    let policies = list::<WorkloadNetworkPolicy>(&app, "workloadnetworkpolicies")?;
    for (name, p) in &policies {
        let s = p.status.clone().unwrap_or_default();
        info(&format!(
            "{name}: mode {:?}, {} violation(s) ({} active)",
            p.spec.mode, s.violation_count, s.active_violation_count
        ));
    }
    info(&format!(
        "from nothing to protect in {:.0}s",
        started.elapsed().as_secs_f64()
    ));
    write_graph(&cluster.kubeconfig)?;
    explore(&cluster.kubeconfig, &release);

    println!("\nEverything keeps running: press Ctrl-C to remove the app and the release.");
    while !interrupted() {
        std::thread::sleep(Duration::from_millis(200));
    }
    phase("cleaning up");
    app.keep = true;
    app.delete_and_wait()?;
    info(&format!("namespace {APP_NAMESPACE} deleted"));
    release.uninstall()?;
    info(
        "release uninstalled (its hook removed the rendered NetworkPolicies, the agent its nftables table)",
    );
    Ok(())
}

/// `db` (TCP 5432), `api` (TCP 8080, queries `db` every 3 s), `frontend` (calls `api` every 2 s).
fn deploy_app(kubeconfig: &Path) -> Result<Namespace> {
    phase(&format!(
        "the demo app in namespace {APP_NAMESPACE}: frontend → api → db"
    ));
    // A namespace of an earlier demo that did not get to clean up.
    let _ = network_enforcer_tests::cluster::components::kubectl(
        kubeconfig,
        &[
            "delete",
            "namespace",
            APP_NAMESPACE,
            "--ignore-not-found",
            "--timeout=120s",
        ],
    );
    let ns = Namespace::create(kubeconfig, APP_NAMESPACE)?;
    for (name, port, script) in [
        ("db", 5432, workload::echo_server_script(&[5432], &[])),
        (
            "api",
            8080,
            format!(
                "{} tcp:8080 & \
                 while true; do echo query | socat -t 2 - TCP:db:5432 >/dev/null 2>&1; sleep 3; done",
                network_enforcer_tests::images::ECHO_SERVER
            ),
        ),
        (
            "frontend",
            80,
            "while true; do echo request | socat -t 2 - TCP:api:8080 >/dev/null 2>&1; sleep 2; done"
                .to_string(),
        ),
    ] {
        let account = format!("{name}-sa");
        ns.service_account(&account)?;
        ns.apply(
            &json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"selector": {"app": name}, "ports": [{"port": port, "protocol": "TCP"}]}
            })
            .to_string(),
        )?;
        ns.apply(&workload::deployment(
            name,
            &account,
            &script,
            &[(port, "TCP")],
        ))?;
    }
    for name in ["db", "api", "frontend"] {
        let pods = ns.wait_for_deployment(name)?;
        info(&format!("{name}: {} at {}", pods[0].0, pods[0].1));
    }
    info("traffic runs by itself: frontend calls api every 2 s, api queries db every 3 s");
    Ok(ns)
}

/// One line per learned rule of a proposal's NetworkPolicy spec.
fn rules(spec: &Value) -> Vec<String> {
    let k = &spec["kubernetes"];
    let mut out = Vec::new();
    for (key, peers) in [("egress", "to"), ("ingress", "from")] {
        for rule in k[key].as_array().into_iter().flatten() {
            let peers: Vec<String> = rule[peers]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    if let Some(cidr) = p["ipBlock"]["cidr"].as_str() {
                        return cidr.to_string();
                    }
                    let ns = p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                        .as_str()
                        .unwrap_or("*");
                    let pods = p["podSelector"]["matchLabels"].to_string();
                    format!("{ns}/{pods}")
                })
                .collect();
            let ports: Vec<String> = rule["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}/{}", p["protocol"].as_str().unwrap_or("TCP"), p["port"]))
                .collect();
            let arrow = if key == "egress" { "to" } else { "from" };
            out.push(format!(
                "{arrow} {} on {}",
                peers.join(", "),
                ports.join(", ")
            ));
        }
    }
    out
}

/// Proposals, monitor, a violation, protect, a blocked attempt (blocked by the agent's enforcement).
fn show_lifecycle(app: &Namespace, release: &Release) -> Result<()> {
    let expected = ["api-egress", "api-ingress", "db-ingress", "frontend-egress"]
        .map(|s| format!("deployment-{s}"));
    phase("learning: proposals appear (kubectl get wnpp -n demo)");
    let mut shown = BTreeMap::<String, Vec<String>>::new();
    let learning = Instant::now();
    poll(
        "the four proposals of the app",
        WAIT,
        Duration::from_millis(500),
        || {
            check_interrupted()?;
            let proposals =
                list::<WorkloadNetworkPolicyProposal>(app, "workloadnetworkpolicyproposals")?;
            for (name, p) in &proposals {
                let lines = rules(&serde_json::to_value(&p.spec)?);
                if shown.get(name) != Some(&lines) {
                    info(&format!(
                        "[{:>5.1}s] {name}",
                        learning.elapsed().as_secs_f64()
                    ));
                    for l in &lines {
                        info(&format!("          {l}"));
                    }
                    shown.insert(name.clone(), lines);
                }
            }
            // Learned in full: every proposal there, with the DNS rule on both egress ones.
            let complete = expected.iter().all(|e| proposals.contains_key(e))
                && ["deployment-frontend-egress", "deployment-api-egress"]
                    .iter()
                    .all(|e| shown.get(*e).is_some_and(|r| r.len() == 2));
            Ok(complete.then_some(()))
        },
        || release.describe(),
    )?;

    phase(
        "promote every proposal to monitor (kubectl label wnpp <name> networkenforcer.kubewarden.io/promote=monitor)",
    );
    for name in &expected {
        app.kubectl(&[
            "label",
            "workloadnetworkpolicyproposal",
            name,
            &format!("{PROMOTE_LABEL}=monitor"),
        ])?;
    }
    poll(
        "four monitor policies",
        WAIT,
        Duration::from_millis(500),
        || {
            check_interrupted()?;
            let policies = list::<WorkloadNetworkPolicy>(app, "workloadnetworkpolicies")?;
            Ok((policies.len() == 4).then_some(()))
        },
        || release.describe(),
    )?;
    info("4 WorkloadNetworkPolicies in monitor mode; the proposals are gone");

    phase("a violation: the frontend talks to the db directly (kubectl exec)");
    let frontend = app.running_pods("app=frontend")?.remove(0);
    let db_ip = app.cluster_ip("db")?;
    let reached = workload::send(app, &frontend.0, Protocol::Tcp, "db", 5432, "select")?;
    info(&format!(
        "frontend → db:5432 answered: {reached} (monitor records, never blocks)"
    ));
    let violation = wait_for_violation(app, release, "deployment-frontend-egress", 1)?;
    info(&format!("deployment-frontend-egress: {violation}"));

    phase(
        "promote to protect (kubectl patch wnp <name> --type=merge -p '{\"spec\":{\"mode\":\"protect\"}}')",
    );
    for name in &expected {
        app.kubectl(&[
            "patch",
            "workloadnetworkpolicy",
            name,
            "--type=merge",
            "-p",
            r#"{"spec":{"mode":"protect"}}"#,
        ])?;
    }
    poll(
        "four NetworkPolicies",
        WAIT,
        Duration::from_millis(500),
        || {
            check_interrupted()?;
            let out = app.kubectl(&["get", "networkpolicies", "-o", "name"])?;
            Ok((out.lines().count() == 4).then_some(()))
        },
        || release.describe(),
    )?;
    info("4 NetworkPolicies rendered (kubectl get networkpolicies -n demo)");
    info(
        "the local cluster's CNI does not enforce them; the agent does (agent.enforcement.mode=networkpolicy):",
    );
    let dropped_before = release.enforcement_drops()?;
    let reached = poll(
        "the agent to enforce the new NetworkPolicies",
        WAIT,
        Duration::from_millis(500),
        || {
            check_interrupted()?;
            let reached = workload::send(app, &frontend.0, Protocol::Tcp, "db", 5432, "select")?;
            Ok((!reached).then_some(reached))
        },
        || release.describe_enforcement(),
    )?;
    info(&format!(
        "nft list table inet {}: {} packet(s) of {} → db ({db_ip}):5432 dropped",
        release.enforcement_table(),
        release.enforcement_drops()? - dropped_before,
        frontend.1
    ));
    info(&format!("frontend → db:5432 answered: {reached}"));
    let violation = wait_for_violation(app, release, "deployment-frontend-egress", 2)?;
    info(&format!("deployment-frontend-egress: {violation}"));
    let api = workload::send(app, &frontend.0, Protocol::Tcp, "api", 8080, "request")?;
    info(&format!(
        "frontend → api:8080 (allowed) still answers: {api}"
    ));
    Ok(())
}

/// Waits until policy `name` has `count` violations; describes the newest.
fn wait_for_violation(
    app: &Namespace,
    release: &Release,
    name: &str,
    count: i64,
) -> Result<String> {
    let policy = poll(
        &format!("{count} violation(s) on {name}"),
        WAIT,
        Duration::from_millis(500),
        || {
            check_interrupted()?;
            let p = list::<WorkloadNetworkPolicy>(app, "workloadnetworkpolicies")?.remove(name);
            Ok(p.filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.violation_count >= count)
            }))
        },
        || release.describe(),
    )?;
    let s = policy.status.context("no status")?;
    let v = s.violations.first().context("no violation listed")?;
    Ok(format!(
        "violation #{}: {} → {} {:?}/{} action {:?} ({} total)",
        v.id,
        v.source.owner_name,
        v.dest.owner_name,
        v.protocol,
        v.dst_port.map(|p| p.to_string()).unwrap_or_default(),
        v.action,
        s.violation_count
    ))
}

/// `network-enforcer-controller graph` of the demo namespace as DOT, and SVG where Graphviz is installed.
fn write_graph(kubeconfig: &Path) -> Result<()> {
    let dir = run::workspace_root().join("target").join("demo");
    std::fs::create_dir_all(&dir)?;
    let controller = release::debug_binary("controller");
    let mut written = Vec::new();
    for (format, file) in [("dot", "graph.dot"), ("svg", "graph.svg")] {
        if format == "svg" && which("dot").is_none() {
            info("no Graphviz `dot` on PATH: DOT only (apt-get install graphviz for SVG)");
            continue;
        }
        let out = dir.join(file);
        let status = std::process::Command::new(&controller)
            .env("KUBECONFIG", kubeconfig)
            .args([
                "graph",
                "--namespace",
                APP_NAMESPACE,
                "--output",
                format,
                "--out",
            ])
            .arg(&out)
            .status()
            .with_context(|| format!("running {}", controller.display()))?;
        if status.success() {
            written.push(out.display().to_string());
        } else {
            info(&format!("graph -o {format} failed ({status})"));
        }
    }
    if !written.is_empty() {
        info(&format!("the learned graph: {}", written.join(", ")));
    }
    Ok(())
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

fn explore(kubeconfig: &Path, release: &Release) {
    let agent = release.agent_pod().unwrap_or_else(|_| "<agent pod>".into());
    let k = network_enforcer_tests::cluster::layout::kubernetes_bin("kubectl");
    phase("explore");
    println!(
        "    export KUBECONFIG={kc}
    alias kubectl={k}
    kubectl get wnpp,wnp,networkpolicies -n {APP_NAMESPACE}        # proposals, policies, rendered policies
    kubectl get wnp deployment-frontend-egress -n {APP_NAMESPACE} -o yaml   # status.violations
    kubectl get events -n {APP_NAMESPACE}                          # what the controller did
    kubectl exec -n {ns} {agent} -- network-enforcer-agent flows --since 1m --namespace {APP_NAMESPACE}
    kubectl exec -n {ns} {agent} -- network-enforcer-agent flows --follow          # live, like hubble observe
    kubectl logs -n {ns} deploy/{controller}
    target/debug/network-enforcer-controller check --help          # would this flow be allowed?
    target/debug/network-enforcer-controller graph --namespace {APP_NAMESPACE} -o svg --out graph.svg",
        kc = kubeconfig.display(),
        k = k.display(),
        ns = release.namespace,
        controller = release.object_name("controller"),
    );
    // The chart serves the web view by default on the pod's loopback (controller.ui, port 8090;
    // docs/ui.md).
    println!(
        "\n    the web view (graph, workloads, violations, promote commands; read-only):
    kubectl port-forward -n {ns} deploy/{controller} 8090:8090
    then open http://localhost:8090/#/graph/{APP_NAMESPACE}",
        ns = release.namespace,
        controller = release.object_name("controller"),
    );
}
