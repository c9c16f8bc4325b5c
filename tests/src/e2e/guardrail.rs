//! The cluster guardrail step of the end-to-end test (docs/behaviour.md §1.11, §4.9): on the
//! scenario's install, with the agent enforcing, the controller learns the namespace isolation
//! `ne-isolate-<ns>` from real traffic inside the namespace; labelled `promote=protect` it becomes a
//! ClusterNetworkPolicy, and the agent drops a connection into the namespace from another one while
//! the namespace's own traffic passes; unlabelled, the policy is deleted and the connection passes
//! again (so the drop was the policy's); the web view's graph says which tier decides the observed
//! edges (the NetworkPolicy-less default under the isolation's Pass, then an Admin Accept written for
//! the test); once the namespace is deleted, the proposals learned for it go too. Which connection
//! must be dropped comes from the isolation's meaning (only the namespaces seen sending may), never
//! from our evaluator.

use anyhow::{Context, Result, ensure};
use network_enforcer_api::keys::PROMOTE_LABEL;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::poll;
use super::release::Release;
use super::scenario::{self, say};
use super::workload::{self, Namespace, Protocol, send};

/// The chart value that makes the controller learn cluster proposals often enough for a test (the
/// default is every minute).
pub const LEARN_OFTEN: &str = "controller.clusterProposals.interval=5s";

/// How long learning, promotion and the agent's enforcement may each take.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// The cluster-scoped objects the step leaves behind otherwise (a namespace's deletion does not
/// take them), deleted on drop.
struct ClusterScoped {
    kubeconfig: PathBuf,
    names: Vec<String>,
}

impl Drop for ClusterScoped {
    fn drop(&mut self) {
        for kind in ["clusternetworkpolicies", "clusternetworkpolicyproposals"] {
            let mut args = vec!["delete", kind, "--ignore-not-found", "--wait=false"];
            args.extend(self.names.iter().map(String::as_str));
            let _ = crate::cluster::components::kubectl(&self.kubeconfig, &args);
        }
    }
}

/// `kubectl get <kind> <name> -o json`, `None` while there is none.
fn get(release: &Release, kind: &str, name: &str) -> Result<Option<Value>> {
    let out = release.kubectl(&["get", kind, name, "-o", "json", "--ignore-not-found"])?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_str(&out)?))
}

/// The ClusterNetworkPolicy the step writes to accept the outsider into namespace `name`.
fn accept_name(name: &str) -> String {
    format!("ne-test-accept-{name}")
}

/// Waits until the leading controller's graph of `namespace` has an edge from one of `from` to `to`
/// whose observed flows the tier `tier` decides (its `tiers`), by policy `by` on the ingress side
/// when given (docs/ui.md, "Graph").
fn wait_for_tier(
    release: &Release,
    namespace: &str,
    (from, to): (&[&str], &str),
    tier: &str,
    by: Option<&str>,
) -> Result<()> {
    let path = format!("/api/v1/namespaces/{namespace}/graph");
    poll(
        &format!("the web view's graph to say tier {tier} decides {from:?} → {to}"),
        STEP_TIMEOUT,
        Duration::from_secs(1),
        || {
            let graph = release.controller_web_view(&path)?;
            let found = graph["edges"].as_array().into_iter().flatten().any(|e| {
                from.iter().any(|f| e["from"] == *f)
                    && e["to"] == to
                    && e["tiers"] == serde_json::json!([tier])
                    && by.is_none_or(|by| {
                        e["decisions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|d| d["ingress"]["by"] == serde_json::json!([by]))
                    })
            });
            Ok(found.then_some(()))
        },
        || match release.controller_web_view(&path) {
            Ok(graph) => format!("the graph now: {graph:#}"),
            Err(error) => format!("the graph: {error:#}"),
        },
    )?;
    Ok(())
}

/// Runs the step in fresh namespaces `name` (the scenario's workload) and `<name>-x` (a pod the
/// isolation must keep out). Fails at the first check that does not hold.
pub fn isolation_protected_by_the_agent(
    kubeconfig: &Path,
    release: &Release,
    name: &str,
) -> Result<()> {
    let isolate = format!("ne-isolate-{name}");
    let outsider_ns = format!("{name}-x");
    let _cleanup = ClusterScoped {
        kubeconfig: kubeconfig.to_path_buf(),
        names: [name, outsider_ns.as_str()]
            .iter()
            .flat_map(|n| [format!("ne-isolate-{n}"), format!("ne-floor-{n}")])
            .chain([accept_name(name)])
            .collect(),
    };
    let w = scenario::create_workload(kubeconfig, name)?;
    // The outsider sends nothing until the isolation is in force: what it sent would be learned.
    let outsider = Namespace::create(kubeconfig, &outsider_ns)?;
    outsider.apply(&workload::deployment(
        "outsider",
        "default",
        "sleep 100000",
        &[],
    ))?;
    let (outsider_pod, _) = outsider.wait_for_deployment("outsider")?.remove(0);
    let server_ip = w.server.1.clone();

    say("guardrail: traffic inside the namespace, then its learned isolation");
    w.send_until_echoed(Protocol::Tcp, 18080, STEP_TIMEOUT)?;
    let proposal = poll(
        &format!("ClusterNetworkPolicyProposal {isolate} passing the namespace to itself"),
        STEP_TIMEOUT,
        Duration::from_secs(1),
        || {
            Ok(
                get(release, "clusternetworkpolicyproposal", &isolate)?.filter(|p| {
                    let passes = p["spec"]["policy"]["ingress"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|r| r["action"] == "Pass")
                        .map(|r| r["from"].to_string())
                        .collect::<String>();
                    passes.contains(&format!("\"{name}\""))
                }),
            )
        },
        || release.describe(),
    )?;
    ensure!(
        proposal["spec"]["policy"]["tier"] == "Admin",
        "the isolation is an Admin policy: {proposal:#}"
    );

    say("guardrail: promote=protect; the agent keeps the other namespace out");
    release.kubectl(&[
        "label",
        "clusternetworkpolicyproposal",
        &isolate,
        &format!("{PROMOTE_LABEL}=protect"),
    ])?;
    poll(
        &format!("ClusterNetworkPolicy {isolate}"),
        STEP_TIMEOUT,
        Duration::from_secs(1),
        || get(release, "clusternetworkpolicy", &isolate),
        || release.describe(),
    )?;
    let before = release.enforcement_drops()?;
    let mut attempt = 0;
    poll(
        "the agent to drop the outsider's connection to the server",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            attempt += 1;
            let echoed = send(
                &outsider,
                &outsider_pod,
                Protocol::Tcp,
                &server_ip,
                18080,
                &format!("outsider-{attempt}"),
            )?;
            let counted = release.enforcement_drops().unwrap_or(0) > before;
            Ok((!echoed && counted).then_some(()))
        },
        || release.describe_enforcement(),
    )?;
    ensure!(
        !send(
            &outsider,
            &outsider_pod,
            Protocol::Tcp,
            &server_ip,
            18080,
            "outsider-again"
        )?,
        "the outsider's connection passed again while the isolation is in force"
    );
    // Its own namespace passes to NetworkPolicy (none here): a few tries, for a slow echo.
    poll(
        "the namespace's own client to pass its isolation",
        Duration::from_secs(15),
        Duration::from_millis(500),
        || Ok(w.send(Protocol::Tcp, 18080, "inside")?.then_some(())),
        || release.describe(),
    )?;
    // The Admin tier passes the namespace's own traffic on, and no NetworkPolicy isolates the
    // server: the graph's client → server edge says nothing decides it ("default").
    let client = format!("w:{name}/Deployment/http-client");
    let server = format!("w:{name}/Deployment/http-server");
    wait_for_tier(release, name, (&[&client], &server), "default", None)?;
    // The client's DNS is drawn on its learned rule to the DNS pods' selector (which says the tier
    // deciding it), not as a flow no rule stands for.
    let path = format!("/api/v1/namespaces/{name}/graph");
    poll(
        "the client's DNS flows on its learned rule to the DNS selector",
        STEP_TIMEOUT,
        Duration::from_secs(1),
        || {
            let graph = release.controller_web_view(&path)?;
            let edges = graph["edges"].as_array().cloned().unwrap_or_default();
            let to =
                |e: &Value, prefix: &str| e["to"].as_str().is_some_and(|t| t.starts_with(prefix));
            let on_rule = edges.iter().any(|e| {
                e["from"] == client.as_str() && to(e, "s:kube-system/") && e["tiers"].is_array()
            });
            let stray = edges
                .iter()
                .any(|e| e["state"] == "observed" && to(e, "w:kube-system/"));
            Ok((on_rule && !stray).then_some(()))
        },
        || match release.controller_web_view(&path) {
            Ok(graph) => format!("the graph now: {graph:#}"),
            Err(error) => format!("the graph: {error:#}"),
        },
    )?;

    say("guardrail: the label removed; the policy goes and the outsider gets through");
    release.kubectl(&[
        "label",
        "clusternetworkpolicyproposal",
        &isolate,
        &format!("{PROMOTE_LABEL}-"),
    ])?;
    poll(
        &format!("ClusterNetworkPolicy {isolate} deleted"),
        STEP_TIMEOUT,
        Duration::from_secs(1),
        || {
            Ok(get(release, "clusternetworkpolicy", &isolate)?
                .is_none()
                .then_some(()))
        },
        || release.describe(),
    )?;
    poll(
        "the outsider's connection to pass once the isolation is gone",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            Ok(send(
                &outsider,
                &outsider_pod,
                Protocol::Tcp,
                &server_ip,
                18080,
                "outsider-after",
            )?
            .then_some(()))
        },
        || release.describe_enforcement(),
    )
    .context("the drop was not the isolation's")?;

    say("guardrail: an Admin Accept for the outsider; the graph says the Admin tier decides it");
    let accept = accept_name(name);
    workload::apply(
        kubeconfig,
        None,
        &serde_json::json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": accept},
            "spec": {
                "tier": "Admin", "priority": 10,
                "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": name}}},
                "ingress": [{"action": "Accept", "from": [{"namespaces": {"matchLabels": {
                    "kubernetes.io/metadata.name": outsider_ns}}}]}]
            }
        })
        .to_string(),
    )?;
    // Drawn on the server's learned rule for the outsider's pods, or on an edge of its own.
    let outsider_rule = format!("s:{outsider_ns}/{{app=outsider}}");
    let outsider_node = format!("w:{outsider_ns}/Deployment/outsider");
    wait_for_tier(
        release,
        name,
        (&[&outsider_rule, &outsider_node], &server),
        "admin",
        Some(&accept),
    )?;
    release.kubectl(&["delete", "clusternetworkpolicy", &accept, "--wait=false"])?;

    say("guardrail: the namespaces deleted; the proposals learned for them go too");
    outsider.delete_and_wait()?;
    w.ns.delete_and_wait()?;
    poll(
        &format!("the proposals learned for {name} to be deleted with it"),
        STEP_TIMEOUT,
        Duration::from_secs(1),
        || {
            let left = release.kubectl(&["get", "clusternetworkpolicyproposals", "-o", "name"])?;
            Ok((!left.contains(&format!("-{name}"))).then_some(()))
        },
        || release.describe(),
    )?;
    Ok(())
}
