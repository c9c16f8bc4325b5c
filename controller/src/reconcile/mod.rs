//! The Kubernetes layer: two kube-runtime controllers that feed the pure decisions of [`crate::policy::promote`],
//! [`crate::policy::render`] and [`crate::policy::uniqueness`] and write their results.
//!
//! - [`proposal`]: promotion and leftover clean-up; also triggered by policy changes, so a leftover is
//!   deleted as soon as it (or its policy) is seen, not only on the periodic resync.
//! - [`policy`]: renders NetworkPolicies / AuthorizationPolicies, repairs drift, reports conditions.
//! - [`cluster_proposals`]: learns ClusterNetworkPolicyProposals from the namespace graph and puts
//!   promoted ones in force ([`crate::policy::cluster_promote`]); a loop of its own, on the leader.

pub mod cluster_proposals;
pub mod policy;
pub mod proposal;

use crate::cluster::shared_watch::PolicyObjects;
use crate::policy::protect_gate::GateHistory;
use crate::policy::validity::SharedBackends;
use crate::runtime::events::publish_with;
use crate::runtime::metrics::{ReconcileMetrics, Reconciler};
use futures::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use network_enforcer_api::WorkloadNetworkPolicy;
use std::sync::Arc;
use std::time::Duration;

/// Errors of one reconcile; they are logged, counted and retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("object has no namespace")]
    NoNamespace,
}

/// Settings of the reconcilers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace (tests, single-tenant installs); `None` watches all.
    pub namespace: Option<String>,
    /// The name events are reported under (`reportingController`).
    pub reporter: String,
    /// The instance reporting events (`reportingInstance`), usually the pod name.
    pub instance: Option<String>,
    /// How often every object is reconciled even without changes (the reference's resync, 10h).
    pub resync: Duration,
    /// How often istio policies are re-checked: AuthorizationPolicies are not watched (their CRD may
    /// be missing), so drift and a newly installed CRD are picked up by this requeue.
    pub istio_recheck: Duration,
    /// Proposals are promoted only when signed with this key ([`crate::learn::provenance`]); `None`:
    /// every proposal is promoted.
    pub signing_key: Option<std::sync::Arc<crate::learn::provenance::SigningKey>>,
    /// Where reconciles are counted and timed.
    pub metrics: ReconcileMetrics,
    /// A rule that allowed no observed flow for this long makes `UnusedRules=True`
    /// (`--unused-rule-after`, docs/api.md "Rule usage").
    pub unused_rule_after: Duration,
    /// The observed traffic the protect gate replays (docs/api.md, "Protect gate"); `None`: no history,
    /// `WouldBlock` says so and nothing is held.
    pub gate: Option<GateHistory>,
    /// The backend each policy had when first seen, for the immutable-backend rule; shared with the
    /// status sync (`status_sync::Settings::backends`) so that both elect the same policy per target.
    pub backends: SharedBackends,
    /// The addresses pods resolved names to, which `egressNames` render into; `None`: those entries
    /// render nothing.
    pub names: Option<Arc<crate::cluster::names::ResolvedNames>>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: None,
            reporter: "network-enforcer-controller".into(),
            instance: None,
            resync: Duration::from_secs(10 * 3600),
            istio_recheck: Duration::from_secs(60),
            signing_key: None,
            metrics: ReconcileMetrics::default(),
            unused_rule_after: Duration::from_secs(7 * 86_400),
            gate: None,
            backends: SharedBackends::default(),
            names: None,
        }
    }
}

/// What the reconcilers share.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// Every WorkloadNetworkPolicy in scope, kept current by the shared watch.
    pub policies: Store<WorkloadNetworkPolicy>,
    /// The backend each policy had when first seen, for the immutable-backend rule
    /// ([`Settings::backends`]).
    pub backends: SharedBackends,
    pub settings: Settings,
}

impl Context {
    /// An Api for `K` in `namespace`.
    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The policies in `namespace`, from the cache.
    pub fn policies_in(&self, namespace: &str) -> Vec<Arc<WorkloadNetworkPolicy>> {
        self.policies
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }
}

/// Runs both controllers, over watches of their own, until the process is asked to stop.
pub async fn run(client: Client, settings: Settings) {
    let objects = Arc::new(PolicyObjects::new(&client, settings.namespace.as_deref()));
    Reconcilers::new(&client, objects, settings).run().await
}

/// Both controllers, not yet running: they subscribe to the shared watches when they start
/// ([`Reconcilers::run`]), on the leader only.
pub struct Reconcilers {
    client: Client,
    settings: Settings,
    objects: Arc<PolicyObjects>,
    /// Workloads that got a new address of a name ([`Reconcilers::with_names`]).
    name_changes: Option<tokio::sync::mpsc::Receiver<crate::cluster::names::WorkloadKey>>,
}

impl Reconcilers {
    /// The policy and proposal controllers over `objects` (whose scope is that of `settings`).
    pub fn new(client: &Client, objects: Arc<PolicyObjects>, settings: Settings) -> Self {
        Self {
            client: client.clone(),
            settings,
            objects,
            name_changes: None,
        }
    }

    /// Protects policies with `gate` (see [`Settings::gate`]), known only once the status sync exists.
    pub fn with_gate(mut self, gate: GateHistory) -> Self {
        self.settings.gate = Some(gate);
        self
    }

    /// Renders `egressNames` from `names`, and renders a workload's protect policies again when
    /// `changes` tells it got a new address.
    pub fn with_names(
        mut self,
        names: Arc<crate::cluster::names::ResolvedNames>,
        changes: tokio::sync::mpsc::Receiver<crate::cluster::names::WorkloadKey>,
    ) -> Self {
        self.settings.names = Some(names);
        self.name_changes = Some(changes);
        self
    }

    /// Runs both controllers until the process is asked to stop.
    pub async fn run(self) {
        let Self {
            client,
            settings,
            objects,
            name_changes,
        } = self;
        let mut policies = policy::controller(&objects);
        if let Some(changes) = name_changes {
            let cache = objects.policies.store();
            let refs = tokio_stream::wrappers::ReceiverStream::new(changes).flat_map(move |key| {
                let refs: Vec<_> = cache
                    .state()
                    .into_iter()
                    .filter(|p| policy::renders_names_of(p, &key))
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect();
                futures::stream::iter(refs)
            });
            policies = policies.reconcile_on(refs);
        }
        let proposals = proposal::controller(&objects);
        let reporter = Reporter {
            controller: settings.reporter.clone(),
            instance: settings.instance.clone(),
        };
        let ctx = Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            policies: objects.policies.store(),
            backends: settings.backends.clone(),
            settings,
        });
        let policies = policies
            .shutdown_on_signal()
            .run(
                |policy, ctx| {
                    counted(
                        Reconciler::policy,
                        policy::reconcile(policy, ctx.clone()),
                        ctx,
                    )
                },
                policy::error_policy,
                ctx.clone(),
            )
            .for_each(|_| async {});
        let proposals = proposals
            .shutdown_on_signal()
            .run(
                |proposal, ctx| {
                    counted(
                        Reconciler::proposal,
                        proposal::reconcile(proposal, ctx.clone()),
                        ctx,
                    )
                },
                proposal::error_policy,
                ctx,
            )
            .for_each(|_| async {});
        tokio::join!(policies, proposals);
    }
}

/// Runs one reconcile of `controller`, counted and timed.
async fn counted(
    controller: Reconciler,
    reconcile: impl std::future::Future<Output = Result<Action, Error>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    ctx.settings
        .metrics
        .observe(controller, started.elapsed().as_secs_f64(), result.is_err());
    result
}

/// Publishes an Event about `obj`; failures to publish are logged, never fatal.
pub async fn publish<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    publish_with(
        &ctx.recorder,
        &obj.object_ref(&()),
        type_,
        reason,
        action,
        note,
    )
    .await
}
