//! Faults of the API server the controller writes to, for fault-injection tests: its writes of one
//! namespace refused or delayed by a validating admission webhook, for a while.

use crate::fixture::TestNamespace;
use anyhow::Result;
use kube::Api;
use network_enforcer_api::WorkloadNetworkPolicyProposal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A port nothing listens on right now.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// What the API server does to WorkloadNetworkPolicy status writes of one namespace while a
/// [`StatusWritesFault`] lasts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StatusFault {
    /// Refuses each ("failed calling webhook"), as when a webhook that fails closed is down.
    Refuse,
    /// Takes each after [`DELAY_SECONDS`], as behind a webhook that hangs and fails open.
    Delay,
}

/// How long a delayed status write waits for its webhook.
pub const DELAY_SECONDS: u64 = 2;

/// A fault of the API server's status writes in one namespace until [`Self::end`] or drop: a
/// validating admission webhook (named after the namespace and the fault, and owned by the
/// namespace, so a killed run's is collected with it) on a local port that either nobody listens on
/// (the webhook fails closed: each write refused) or where the test accepts connections and never
/// answers (the webhook times out after [`DELAY_SECONDS`] and fails open: each write delayed). (The
/// local cluster's Kubernetes 1.20 has no ValidatingAdmissionPolicy, nor the namespace name label.)
pub struct StatusWritesFault {
    /// The webhook's name, until it is removed.
    name: Option<String>,
    kubeconfig: PathBuf,
    /// The listener that never answers (a delay).
    hanging: Option<tokio::task::JoinHandle<()>>,
}

/// The writes a [`StatusWritesFault`] hits.
#[derive(Clone, Copy)]
pub enum Writes<'a> {
    /// Status writes of WorkloadNetworkPolicies; shown on this policy's.
    Status(&'a str),
    /// Creates and updates of WorkloadNetworkPolicyProposals (the learned edges' writes).
    Proposals,
    /// Deletes of WorkloadNetworkPolicyProposals (a promotion's last step); shown on a probe
    /// proposal the fault creates.
    ProposalDeletes,
}

impl StatusWritesFault {
    /// Starts the fault, and returns once a status write to `policy` shows it (refused, or delayed).
    pub async fn start(ns: &TestNamespace, policy: &str, fault: StatusFault) -> Result<Self> {
        Self::start_on(ns, Writes::Status(policy), fault).await
    }

    /// Starts the fault on `writes`, and returns once such a write shows it (a status write of the
    /// policy, or a dry-run create of a proposal).
    pub async fn start_on(
        ns: &TestNamespace,
        writes: Writes<'_>,
        fault: StatusFault,
    ) -> Result<Self> {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        use k8s_openapi::api::core::v1::Namespace;
        let (suffix, failure_policy) = match (fault, writes) {
            (StatusFault::Refuse, Writes::Status(_)) => ("refuse-status", "Fail"),
            (StatusFault::Delay, Writes::Status(_)) => ("delay-status", "Ignore"),
            (StatusFault::Refuse, Writes::Proposals) => ("refuse-proposals", "Fail"),
            (StatusFault::Delay, Writes::Proposals) => ("delay-proposals", "Ignore"),
            (StatusFault::Refuse, Writes::ProposalDeletes) => ("refuse-proposal-deletes", "Fail"),
            (StatusFault::Delay, Writes::ProposalDeletes) => ("delay-proposal-deletes", "Ignore"),
        };
        let (operations, resources) = match writes {
            Writes::Status(_) => (vec!["UPDATE"], "workloadnetworkpolicies/status"),
            Writes::Proposals => (vec!["CREATE", "UPDATE"], "workloadnetworkpolicyproposals"),
            Writes::ProposalDeletes => (vec!["DELETE"], "workloadnetworkpolicyproposals"),
        };
        let name = format!("{}-{suffix}", ns.name);
        let (port, hanging) = match fault {
            StatusFault::Refuse => (free_port()?, None),
            StatusFault::Delay => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let port = listener.local_addr()?.port();
                let task = tokio::spawn(async move {
                    let mut held = Vec::new();
                    while let Ok((stream, _)) = listener.accept().await {
                        held.push(stream);
                    }
                });
                (port, Some(task))
            }
        };
        let label = "network-enforcer.test/refuse-status";
        let namespaces = Api::<Namespace>::all(ns.client.clone());
        let namespace = namespaces
            .patch(
                &ns.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    serde_json::json!({"metadata": {"labels": {label: ns.name}}}),
                ),
            )
            .await?;
        let webhook: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "v1", "kind": "Namespace", "name": ns.name,
                "uid": namespace.metadata.uid,
            }]},
            "webhooks": [{
                "name": "refuse-status.network-enforcer.test",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/{suffix}")},
                "rules": [{
                    "apiGroups": ["networkenforcer.kubewarden.io"], "apiVersions": ["*"],
                    "operations": operations, "resources": [resources],
                }],
                "namespaceSelector": {"matchLabels": {label: ns.name}},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": DELAY_SECONDS,
            }]
        }))?;
        let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
        let probe: WorkloadNetworkPolicyProposal = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fault-probe"},
            "spec": {"backend": "kubernetes", "direction": "Ingress",
                     "targetRef": {"kind": "Deployment", "name": "fault-probe"},
                     "kubernetes": {"podSelector": {"matchLabels": {"app": "fault-probe"}},
                                    "policyTypes": ["Ingress"]}}
        }))?;
        if matches!(writes, Writes::ProposalDeletes)
            && proposals.get_opt("fault-probe").await?.is_none()
        {
            // What a refused delete is shown on.
            proposals
                .create(&kube::api::PostParams::default(), &probe)
                .await?;
        }
        Api::<ValidatingWebhookConfiguration>::all(ns.client.clone())
            .create(&kube::api::PostParams::default(), &webhook)
            .await?;
        let started = Self {
            name: Some(name),
            kubeconfig: ns.kubeconfig().to_path_buf(),
            hanging,
        };
        // In force once the API server's admission has seen it: a (no-op) status patch or a dry-run
        // create is refused, or takes the webhook's timeout and goes through.
        let policies = ns.api::<network_enforcer_api::WorkloadNetworkPolicy>();
        ns.wait_for(
            "the API server to refuse or delay the writes",
            Duration::from_secs(30),
            || async {
                let at = Instant::now();
                let written = match writes {
                    Writes::Status(policy) => {
                        let noop = kube::api::Patch::Merge(serde_json::json!({"status": {}}));
                        policies
                            .patch_status(policy, &kube::api::PatchParams::default(), &noop)
                            .await
                            .map(|_| ())
                    }
                    Writes::Proposals => proposals
                        .create(
                            &kube::api::PostParams {
                                dry_run: true,
                                ..Default::default()
                            },
                            &probe,
                        )
                        .await
                        .map(|_| ()),
                    Writes::ProposalDeletes => proposals
                        .delete(
                            "fault-probe",
                            &kube::api::DeleteParams {
                                dry_run: true,
                                ..Default::default()
                            },
                        )
                        .await
                        .map(|_| ()),
                };
                let shown = match fault {
                    // Refused by the webhook, not for another reason (the probe must be valid).
                    StatusFault::Refuse => {
                        matches!(&written, Err(e) if e.to_string().contains("webhook"))
                    }
                    StatusFault::Delay => {
                        written.is_ok() && at.elapsed() >= Duration::from_secs(DELAY_SECONDS)
                    }
                };
                Ok(shown.then_some(()))
            },
        )
        .await?;
        Ok(started)
    }

    pub async fn end(mut self) -> Result<()> {
        let kubeconfig = self.kubeconfig.clone();
        let Some(name) = self.name.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || remove_refusal(&kubeconfig, &name)).await??;
        // Removed: nothing left for the drop to do.
        self.name = None;
        // Dropped after the webhook: calls in flight still hang until their timeout.
        if let Some(task) = self.hanging.take() {
            task.abort();
        }
        Ok(())
    }
}

impl Drop for StatusWritesFault {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            let _ = remove_refusal(&self.kubeconfig, &name);
        }
        if let Some(task) = self.hanging.take() {
            task.abort();
        }
    }
}

fn remove_refusal(kubeconfig: &std::path::Path, name: &str) -> Result<()> {
    use crate::cluster::components::kubectl;
    kubectl(
        kubeconfig,
        &[
            "delete",
            "validatingwebhookconfiguration",
            name,
            "--ignore-not-found",
        ],
    )?;
    Ok(())
}
