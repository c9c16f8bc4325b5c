//! The end-to-end scenario (docs/development.md) through the CNI and mesh flow sources
//! (docs/flow-sources.md): our chart installed per provider, the scenario's real pods, and in place of
//! the data plane that does not exist on this machine a wire-faithful fake of it describing those pods'
//! traffic:
//!
//! - [`hubble`]: a Hubble `observer.Observer` server (our proto) on a unix socket in a host directory
//!   the chart mounts into the agent (provider `cilium`, `agent.hubble.socketPath`);
//! - [`ztunnel`]: a pod named like ztunnel whose container prints ztunnel's JSON log lines, so the real
//!   container runtime writes the CRI log files the agent tails (provider `istio`, `agent.ztunnel.logGlob`);
//! - [`goldmane`]: a Goldmane `goldmane.Flows` server with mutual TLS on a host port, reached by the
//!   controller pod through a selector-less Service (provider `calico`).
//!
//! No traffic is sent between the scenario's pods here: the agent's eBPF programs run with every provider
//! and would learn the same edges from real packets, so a source that delivered nothing could not fail
//! the test. Every record comes from the fake data plane; what each source reports and when follows the
//! scenario's steps (the eBPF-only scenario, `super::scenario`, sends the real traffic).
//!
//! Each release watches only its scenario's namespace (`controller.watchNamespace`) and uses its own
//! agent metrics port, so it can run next to other releases on the same node.

pub mod goldmane;
pub mod hubble;
pub mod kubernetes;
pub mod ztunnel;

use anyhow::{Context, Result, bail};
use std::path::Path;

use super::release::{Release, http_get};
use super::scenario::STATUS_INTERVAL_SECONDS;
use crate::cluster::components::kubectl;

/// A pod of the scenario as a data plane names it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod IP.
    pub ip: String,
    /// The `metadata.generateName` (what Goldmane names pods by, with `*`).
    pub generate_name: String,
    /// Its labels, `key=value`.
    pub labels: Vec<String>,
    /// Its ServiceAccount.
    pub service_account: String,
    /// The owning workload: (kind, name), e.g. (`Deployment`, `http-client`).
    pub workload: (String, String),
}

impl PodInfo {
    /// Reads pod `name` in `namespace`; the workload is the ReplicaSet's owner (a Deployment) when the
    /// pod belongs to one.
    pub fn get(kubeconfig: &Path, namespace: &str, name: &str) -> Result<Self> {
        let text = kubectl(
            kubeconfig,
            &["get", "pod", name, "-n", namespace, "-o", "json"],
        )?;
        let pod: serde_json::Value = serde_json::from_str(&text)?;
        let meta = &pod["metadata"];
        let labels = meta["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let owner = &meta["ownerReferences"][0];
        let workload = match owner["kind"].as_str() {
            Some("ReplicaSet") => {
                let rs = owner["name"].as_str().unwrap_or_default();
                let hash = meta["labels"]["pod-template-hash"].as_str().unwrap_or("");
                let deployment = rs
                    .strip_suffix(hash)
                    .and_then(|d| d.strip_suffix('-'))
                    .unwrap_or(rs);
                ("Deployment".to_string(), deployment.to_string())
            }
            Some(kind) => (
                kind.to_string(),
                owner["name"].as_str().unwrap_or_default().to_string(),
            ),
            None => ("Pod".to_string(), name.to_string()),
        };
        let ip = pod["status"]["podIP"]
            .as_str()
            .filter(|ip| !ip.is_empty())
            .with_context(|| format!("pod {namespace}/{name} has no IP"))?;
        Ok(Self {
            namespace: namespace.into(),
            name: name.into(),
            ip: ip.into(),
            generate_name: meta["generateName"].as_str().unwrap_or_default().into(),
            labels,
            service_account: pod["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or("default")
                .into(),
            workload,
        })
    }

    /// The Istio principal of the pod (`cluster.local/ns/<ns>/sa/<sa>`, no `spiffe://`).
    pub fn principal(&self) -> String {
        format!(
            "cluster.local/ns/{}/sa/{}",
            self.namespace, self.service_account
        )
    }
}

/// The cluster DNS pod (`k8s-app=kube-dns` in `kube-system`).
pub fn dns_pod(kubeconfig: &Path) -> Result<PodInfo> {
    let names = kubectl(
        kubeconfig,
        &[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "k8s-app=kube-dns",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    )?;
    let Some(name) = names.split_whitespace().next() else {
        bail!("no running kube-dns pod in kube-system");
    };
    PodInfo::get(kubeconfig, "kube-system", name)
}

/// The name of the cluster's only node.
pub fn node_name(kubeconfig: &Path) -> Result<String> {
    let names = kubectl(
        kubeconfig,
        &["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"],
    )?;
    match names.split_whitespace().collect::<Vec<_>>().as_slice() {
        [one] => Ok(one.to_string()),
        other => bail!("expected one node, found {other:?}"),
    }
}

/// `--set` values every source release needs besides the provider's own: status every
/// [`STATUS_INTERVAL_SECONDS`], nothing learned in kube-system or the release namespace, only
/// `watch_namespace` watched (other tests' releases run on the same cluster), the agent's metrics on
/// `metrics_port` of the node (the agent uses the host network: two releases cannot share a port), and
/// short agent flushes.
pub fn common_values(
    release_namespace: &str,
    watch_namespace: &str,
    metrics_port: u16,
) -> Vec<String> {
    vec![
        format!("controller.wnpStatusUpdateInterval={STATUS_INTERVAL_SECONDS}s"),
        format!("controller.excludeNamespaces={{kube-system,{release_namespace}}}"),
        format!("controller.watchNamespace={watch_namespace}"),
        format!("agent.metricsPort={metrics_port}"),
        "agent.flushIntervalSeconds=2".into(),
    ]
}

/// Now as (seconds, nanos) since the epoch.
pub fn now() -> (i64, i32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos() as i32)
}

/// What the release's pods say about the flow sources (for failure messages): the agent's source
/// and uplink metrics (from its port `agent_metrics_port` on this node) and the log lines of both
/// components that mention a source or a refused record.
pub fn diagnostics(release: &Release, agent_metrics_port: u16) -> String {
    let metrics = http_get(&format!("127.0.0.1:{agent_metrics_port}"), "/metrics")
        .map(|text| {
            text.lines()
                .filter(|l| {
                    !l.starts_with('#')
                        && (l.contains("_source_") || l.contains("uplink") || l.contains("records"))
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|e| format!("{e:#}"));
    let mut text = format!("--- agent metrics (sources, uplink) ---\n{metrics}\n");
    for component in ["agent", "controller"] {
        let log = release.logs(component).unwrap_or_else(|e| format!("{e:#}"));
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                [
                    "ztunnel", "hubble", "goldmane", "tailing", "log file", "reject", "refused",
                ]
                .iter()
                .any(|k| l.contains(k))
            })
            .collect();
        text += &format!(
            "--- {component} log, source lines (last 40 of {}) ---\n{}\n",
            lines.len(),
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }
    text
}
