//! The cluster guardrail step of the end-to-end test (docs/behaviour.md §1.11, §4.9): on the
//! scenario's install, with the agent enforcing, the controller learns the namespace isolation
//! `ne-isolate-<ns>` from real traffic inside the namespace; labelled `promote=protect` it becomes a
//! ClusterNetworkPolicy, and the agent drops a connection into the namespace from another one while
//! the namespace's own traffic passes; unlabelled, the policy is deleted and the connection passes
//! again (so the drop was the policy's); once the namespace is deleted, the proposals learned for
//! it go too. Which connection must be dropped comes from the isolation's
//! meaning (only the namespaces seen sending may), never from our evaluator.

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
