//! Removing enforcement on uninstall (docs/install.md, "Uninstall").
//!
//! The CRDs are kept when the chart is removed (`helm.sh/resource-policy: keep`), so users' policies
//! survive a reinstall. Their rendered NetworkPolicies and AuthorizationPolicies would survive too and keep
//! enforcing with no controller left to explain them. The chart's pre-delete hook runs
//! `network-enforcer-controller cleanup`, which
//!
//! 1. stops the controller first ([`stop_controller`]): scales its Deployment to 0 and waits until none
//!    of its pods exists any more. A controller that still runs treats a deleted rendering as drift and
//!    renders it again within milliseconds, and helm removes the Deployment only after the hook. Scaling
//!    the Deployment rather than fencing each process covers every replica (leader election or not),
//!    and a Deployment at 0 restarts nothing while the hook works;
//! 2. then deletes exactly the objects we rendered ([`remove_rendered_objects`]): those labelled as ours
//!    *and* controlled by a WorkloadNetworkPolicy. The policies themselves stay; a reinstall renders
//!    them again.

use crate::policy::render::MANAGED_BY_LABEL;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use network_enforcer_api::authorization_policy::AuthorizationPolicy;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// How often the controller's pods are listed while waiting for them to go.
const POLL: Duration = Duration::from_secs(1);

/// Why the clean-up did not finish. Each one fails the hook, so `helm uninstall` reports it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error(
        "Deployment {namespace}/{deployment} has no label selector in its scale subresource; \
         cannot tell which pods are the controller's"
    )]
    NoSelector {
        namespace: String,
        deployment: String,
    },
    #[error(
        "controller pods still exist {waited:?} after scaling Deployment {namespace}/{deployment} to 0: \
         {pods:?}. Nothing was deleted and the controller is scaled back up (a controller still running \
         would render deleted objects again); if \
         the pods are stuck terminating on a lost node, delete them (`kubectl delete pod --force`) and \
         run the uninstall again"
    )]
    StillRunning {
        namespace: String,
        deployment: String,
        pods: Vec<String>,
        waited: Duration,
    },
    #[error(
        "controller pods appeared again while rendered objects were being deleted: {pods:?}. Something \
         scaled Deployment {namespace}/{deployment} back up and may have rendered some again; run the \
         uninstall again"
    )]
    Restarted {
        namespace: String,
        deployment: String,
        pods: Vec<String>,
    },
}

/// The controller Deployment to stop before deleting what it rendered.
#[derive(Clone, Debug)]
pub struct ControllerDeployment {
    pub namespace: String,
    pub name: String,
    /// How long its pods may take to terminate (the controller writes pending proposals on SIGTERM).
    pub timeout: Duration,
}

/// Stops the controller, deletes everything it rendered in `namespace` (all namespaces when `None`),
/// and checks that no controller came back meanwhile. Returns how many objects were deleted. Without
/// `controller` (the command run by hand) only the deletion happens: a controller still running would
/// render them again.
pub async fn uninstall(
    client: &Client,
    controller: Option<&ControllerDeployment>,
    namespace: Option<&str>,
) -> Result<usize, Error> {
    let Some(c) = controller else {
        tracing::warn!(
            "no controller Deployment given: if a controller still runs, it renders the deleted objects again"
        );
        return Ok(remove_rendered_objects(client, namespace).await?);
    };
    let Some(stopped) = stop_controller(client, c).await? else {
        return Ok(remove_rendered_objects(client, namespace).await?);
    };
    let result = remove_and_check(client, c, &stopped.selector, namespace).await;
    if result.is_err() {
        restore(client, c, stopped.replicas).await;
    }
    result
}

/// A controller Deployment scaled to 0 by [`stop_controller`].
#[derive(Clone, Debug)]
pub struct Stopped {
    /// The label selector of its pods.
    pub selector: String,
    /// Its replicas before, restored when the clean-up fails.
    pub replicas: i32,
}

/// Deletes what was rendered, then fails if a controller pod came back meanwhile (something scaled the
/// Deployment up again): it may have rendered some objects again, so the uninstall must be retried.
async fn remove_and_check(
    client: &Client,
    c: &ControllerDeployment,
    selector: &str,
    namespace: Option<&str>,
) -> Result<usize, Error> {
    let removed = remove_rendered_objects(client, namespace).await?;
    let pods = pod_names(client, &c.namespace, selector).await?;
    if !pods.is_empty() {
        return Err(Error::Restarted {
            namespace: c.namespace.clone(),
            deployment: c.name.clone(),
            pods,
        });
    }
    Ok(removed)
}

/// Scales the controller back to `replicas` after a failed clean-up, so that a failed `helm uninstall`
/// leaves the release as it was (enforcement explained and repaired by a running controller) rather
/// than rendered objects with no controller. Best effort: a failure here is logged, the original error
/// is what the hook reports.
async fn restore(client: &Client, c: &ControllerDeployment, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &c.namespace);
    let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}}));
    match deployments
        .patch_scale(&c.name, &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => tracing::warn!(
            namespace = %c.namespace,
            deployment = %c.name,
            replicas,
            "clean-up failed: the controller is scaled back up"
        ),
        Err(e) => tracing::error!(
            namespace = %c.namespace,
            deployment = %c.name,
            replicas,
            error = %e,
            "clean-up failed and the controller could not be scaled back up: scale it by hand"
        ),
    }
}

/// Scales the controller Deployment to 0 and waits until none of its pods runs (terminating pods
/// still run, so "gone" is the condition, not "not ready"). Returns its pods' selector and former
/// replicas, or `None` when the Deployment does not exist (nothing to stop). When its pods do not go
/// within the timeout, it is scaled back up and nothing is deleted.
pub async fn stop_controller(
    client: &Client,
    controller: &ControllerDeployment,
) -> Result<Option<Stopped>, Error> {
    let (ns, name) = (controller.namespace.as_str(), controller.name.as_str());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let scale = match deployments.get_scale(name).await {
        Ok(scale) => scale,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::info!(
                namespace = ns,
                deployment = name,
                "controller Deployment not found: nothing to stop"
            );
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let selector = scale
        .status
        .and_then(|s| s.selector)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::NoSelector {
            namespace: ns.to_string(),
            deployment: name.to_string(),
        })?;
    let replicas = scale.spec.and_then(|s| s.replicas).unwrap_or_default();
    deployments
        .patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await?;
    tracing::info!(
        namespace = ns,
        deployment = name,
        from = replicas,
        "scaled the controller to 0"
    );
    let started = Instant::now();
    loop {
        let pods = pod_names(client, ns, &selector).await?;
        if pods.is_empty() {
            tracing::info!(namespace = ns, deployment = name, waited = ?started.elapsed(), "controller stopped");
            return Ok(Some(Stopped { selector, replicas }));
        }
        if started.elapsed() >= controller.timeout {
            restore(client, controller, replicas).await;
            return Err(Error::StillRunning {
                namespace: ns.to_string(),
                deployment: name.to_string(),
                pods,
                waited: started.elapsed(),
            });
        }
        tracing::debug!(?pods, "waiting for the controller's pods to go");
        tokio::time::sleep(POLL).await;
    }
}

/// The controller's pods that may still run: Failed and Succeeded ones (evicted pods stay in the API
/// until garbage-collected) run nothing and would hold the wait until its timeout.
async fn pod_names(client: &Client, namespace: &str, selector: &str) -> Result<Vec<String>, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default()
        .labels(selector)
        .fields("status.phase!=Failed,status.phase!=Succeeded");
    let list = pods.list(&params).await?;
    Ok(list.items.iter().map(|p| p.name_any()).collect())
}

/// Deletes every object we rendered in `namespace` (all namespaces when `None`); returns how many.
/// AuthorizationPolicies are skipped when their CRD is not installed.
pub async fn remove_rendered_objects(
    client: &Client,
    namespace: Option<&str>,
) -> Result<usize, kube::Error> {
    let mut removed = remove::<NetworkPolicy>(client, namespace).await?;
    match remove::<AuthorizationPolicy>(client, namespace).await {
        Ok(n) => removed += n,
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    // ClusterNetworkPolicies put in force from a promoted cluster proposal (cluster-scoped: only a
    // clean-up of every namespace removes them).
    if namespace.is_none() {
        match remove_cluster_policies(client).await {
            Ok(n) => removed += n,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Deletes the ClusterNetworkPolicies created from a ClusterNetworkPolicyProposal.
async fn remove_cluster_policies(client: &Client) -> Result<usize, kube::Error> {
    use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
    let api: Api<ClusterNetworkPolicy> = Api::all(client.clone());
    let selector = format!("{}={}", MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1);
    let mut removed = 0;
    for obj in api.list(&ListParams::default().labels(&selector)).await? {
        let ours = obj
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.kind == "ClusterNetworkPolicyProposal");
        if !ours {
            continue;
        }
        match api.delete(&obj.name_any(), &DeleteParams::default()).await {
            Ok(_) => {
                removed += 1;
                tracing::info!(name = %obj.name_any(), "removed a ClusterNetworkPolicy put in force from a proposal");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

async fn remove<K>(client: &Client, namespace: Option<&str>) -> Result<usize, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let all: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let selector = format!("{}={}", MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1);
    let mut removed = 0;
    for obj in all.list(&ListParams::default().labels(&selector)).await? {
        let ours = obj
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.kind == "WorkloadNetworkPolicy");
        let Some(ns) = obj.namespace() else { continue };
        if !ours {
            continue;
        }
        let api: Api<K> = Api::namespaced(client.clone(), &ns);
        match api.delete(&obj.name_any(), &DeleteParams::default()).await {
            Ok(_) => {
                removed += 1;
                tracing::info!(namespace = %ns, name = %obj.name_any(), kind = %K::kind(&()), "removed rendered object");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}
