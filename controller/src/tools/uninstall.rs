//! Removing enforcement on uninstall.
//!
//! The CRDs are kept when the chart is removed (`helm.sh/resource-policy: keep`), so users' policies
//! survive a reinstall. Their rendered NetworkPolicies and AuthorizationPolicies would survive too and keep
//! enforcing with no controller left to explain them. The chart's pre-delete hook runs
//! `network-enforcer-controller cleanup`, which deletes exactly the objects we rendered: those labelled
//! as ours *and* controlled by a WorkloadNetworkPolicy. The policies themselves stay; a reinstall renders
//! them again.

use crate::policy::authorization_policy::AuthorizationPolicy;
use crate::policy::render::MANAGED_BY_LABEL;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

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
