//! The objects the web view shows, as plain data: [`Snapshot`] (what the pure views are built from)
//! and [`Reflected`] (the live source: the controller's shared watches of WorkloadNetworkPolicies and
//! proposals, [`PolicyObjects`], and watches of the cluster-scoped ClusterNetworkPolicyProposals and
//! ClusterNetworkPolicies).
//!
//! A policy's `status.ruleUsage` (docs/api.md) reaches the page as JSON, as the policy holds it.

use crate::cluster::shared_watch::{Listed, PolicyObjects};
use futures::StreamExt as _;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposal;
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A policy and the raw `status.ruleUsage` (absent on clusters whose controller does not write it).
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyObject {
    pub policy: WorkloadNetworkPolicy,
    pub rule_usage: Option<serde_json::Value>,
}

impl PolicyObject {
    /// A policy without rule usage.
    pub fn new(policy: WorkloadNetworkPolicy) -> Self {
        Self {
            policy,
            rule_usage: None,
        }
    }

    /// Reads an untyped object; `None` when it is not a valid WorkloadNetworkPolicy (logged by the
    /// caller: one bad object must not hide the others).
    pub fn from_json(mut value: serde_json::Value) -> Result<Self, serde_json::Error> {
        let rule_usage = value
            .get_mut("status")
            .and_then(|s| s.as_object_mut())
            .and_then(|s| s.remove("ruleUsage"));
        Ok(Self {
            policy: serde_json::from_value(value)?,
            rule_usage,
        })
    }

    pub fn namespace(&self) -> &str {
        self.policy
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }
}

/// Everything a view needs, copied out of the watches for one request.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub policies: Vec<PolicyObject>,
    pub proposals: Vec<WorkloadNetworkPolicyProposal>,
    /// Cluster-scoped: every one, whatever the namespace asked for.
    pub cluster_proposals: Vec<ClusterNetworkPolicyProposal>,
    /// Whether `cluster_proposals` has listed (it never does where the CRD is not installed).
    pub cluster_proposals_listed: bool,
    /// Every ClusterNetworkPolicy, learned or not.
    pub cluster_policies: Vec<ClusterNetworkPolicy>,
    /// Whether `cluster_policies` has listed (never where upstream's CRD is not installed).
    pub cluster_policies_listed: bool,
    /// Milliseconds since the epoch when the snapshot was taken (the time window's end).
    pub now_ms: i64,
}

/// Where the web view reads objects from: the watches in the controller, fixed objects in tests.
pub trait ObjectSource: Send + Sync {
    /// The objects of `namespace` (all namespaces when `None`).
    fn snapshot(&self, namespace: Option<&str>) -> Snapshot;
    /// True once every watch has listed (before that, pages would show a partial cluster).
    fn ready(&self) -> bool;
}

/// A fixed snapshot (tests, `--from-file` style uses).
impl ObjectSource for Snapshot {
    fn snapshot(&self, namespace: Option<&str>) -> Snapshot {
        Snapshot {
            policies: self
                .policies
                .iter()
                .filter(|p| namespace.is_none_or(|ns| p.namespace() == ns))
                .cloned()
                .collect(),
            proposals: self
                .proposals
                .iter()
                .filter(|p| namespace.is_none_or(|ns| p.metadata.namespace.as_deref() == Some(ns)))
                .cloned()
                .collect(),
            cluster_proposals: self.cluster_proposals.clone(),
            cluster_proposals_listed: self.cluster_proposals_listed,
            cluster_policies: self.cluster_policies.clone(),
            cluster_policies_listed: self.cluster_policies_listed,
            now_ms: self.now_ms,
        }
    }

    fn ready(&self) -> bool {
        true
    }
}

/// The shared watches of policies and proposals, and watches of cluster proposals and cluster
/// policies (read-only: list and watch, nothing else).
pub struct Reflected {
    policies: Store<WorkloadNetworkPolicy>,
    proposals: Store<WorkloadNetworkPolicyProposal>,
    policies_listed: Listed,
    proposals_listed: Listed,
    cluster_proposals: Store<ClusterNetworkPolicyProposal>,
    cluster_proposals_listed: Arc<AtomicBool>,
    cluster_policies: Store<ClusterNetworkPolicy>,
    cluster_policies_listed: Arc<AtomicBool>,
}

impl Reflected {
    /// Starts the shared watches of policies and proposals of `objects` (in their scope) and the
    /// watches of the cluster-scoped kinds on the current runtime; they retry with backoff for as
    /// long as the process runs.
    pub fn start(client: kube::Client, objects: &PolicyObjects) -> Arc<Self> {
        objects.policies.start();
        objects.proposals.start();
        let (cluster_proposals, proposals_writer) = reflector::store();
        let (cluster_policies, policies_writer) = reflector::store();
        let this = Arc::new(Self {
            policies: objects.policies.store(),
            proposals: objects.proposals.store(),
            policies_listed: objects.policies.listed_flag(),
            proposals_listed: objects.proposals.listed_flag(),
            cluster_proposals,
            cluster_proposals_listed: Arc::default(),
            cluster_policies,
            cluster_policies_listed: Arc::default(),
        });
        watch_cluster_scoped(
            Api::all(client.clone()),
            proposals_writer,
            this.cluster_proposals_listed.clone(),
        );
        watch_cluster_scoped(
            Api::all(client),
            policies_writer,
            this.cluster_policies_listed.clone(),
        );
        this
    }
}

/// Watches every `K` into `writer` until the process ends, setting `listed` once the first list is
/// in. Where the kind is not served the watch fails and retries with backoff, and the page says the
/// kind has not listed.
fn watch_cluster_scoped<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    listed: Arc<AtomicBool>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&()).to_string();
    tokio::spawn(async move {
        watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|event| {
                match event {
                    // Not at `Init`: the watcher says that before it lists (also where the
                    // kind is not served).
                    Ok(watcher::Event::InitDone) => listed.store(true, Ordering::Relaxed),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, %kind, "web view watch failed; retrying")
                    }
                }
                async {}
            })
            .await;
    });
}

impl ObjectSource for Reflected {
    fn snapshot(&self, namespace: Option<&str>) -> Snapshot {
        let in_namespace =
            |ns: Option<&String>| namespace.is_none_or(|n| ns.map(String::as_str) == Some(n));
        let cluster_proposals = self
            .cluster_proposals
            .state()
            .iter()
            .map(|p| p.as_ref().clone())
            .collect();
        let cluster_policies = self
            .cluster_policies
            .state()
            .iter()
            .map(|p| p.as_ref().clone())
            .collect();
        let policies = self
            .policies
            .state()
            .iter()
            .filter(|o| in_namespace(o.metadata.namespace.as_ref()))
            .filter_map(|o| {
                let value = serde_json::to_value(o.as_ref()).ok()?;
                match PolicyObject::from_json(value) {
                    Ok(p) => Some(p),
                    Err(error) => {
                        tracing::debug!(name = ?o.metadata.name, %error, "web view skips an invalid policy");
                        None
                    }
                }
            })
            .collect();
        let proposals = self
            .proposals
            .state()
            .iter()
            .filter(|p| in_namespace(p.metadata.namespace.as_ref()))
            .map(|p| p.as_ref().clone())
            .collect();
        Snapshot {
            policies,
            proposals,
            cluster_proposals,
            cluster_proposals_listed: self.cluster_proposals_listed.load(Ordering::Relaxed),
            cluster_policies,
            cluster_policies_listed: self.cluster_policies_listed.load(Ordering::Relaxed),
            now_ms: k8s_openapi::jiff::Timestamp::now().as_millisecond(),
        }
    }

    fn ready(&self) -> bool {
        // Not the cluster proposals: a cluster upgraded without applying the new CRD has none to
        // list, and the other pages must not wait for them (the cluster page says so instead).
        self.policies_listed.get() && self.proposals_listed.get()
    }
}
