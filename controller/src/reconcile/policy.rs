//! The policy reconciler: checks each WorkloadNetworkPolicy against the CRDs' rules, renders it,
//! repairs drift of what it rendered, never touches objects it does not own, and reports all of it as
//! conditions (and a refused policy also as a Warning Event).

use super::{Context, Error, publish};
use crate::cluster::names::WorkloadKey;
use crate::cluster::shared_watch::PolicyObjects;
use crate::cluster::workload;
use crate::policy::conditions::{self, Desired as Condition};
use crate::policy::protect_gate;
use crate::policy::render::{self, Desired};
use crate::policy::rule_usage;
use crate::policy::standing::{self, Standing};
use crate::policy::uniqueness;
use crate::policy::validity::{self, INVALID_REASON, OnInvalid};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use network_enforcer_api::authorization_policy::AuthorizationPolicy;
use network_enforcer_api::keys::FIELD_MANAGER;
use network_enforcer_api::selector;
use network_enforcer_api::validation::{self, Violation};
use network_enforcer_api::{Backend, PolicyMode, WorkloadNetworkPolicy};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// How often a duplicate checks whether it has become the winner.
const DUPLICATE_RECHECK: Duration = Duration::from_secs(10);

/// The policy controller over the shared watches of `objects`. It reconciles a policy when the
/// policy, a NetworkPolicy it owns, or another policy with the same target changes (so a duplicate
/// takes over when the winner goes away).
pub fn controller(objects: &PolicyObjects) -> Controller<WorkloadNetworkPolicy> {
    let siblings = objects.policies.store();
    Controller::for_stream(objects.policies.applied(), objects.policies.store())
        .owns_stream(objects.network_policies.touched())
        .watches_stream(objects.policies.touched(), move |changed| {
            siblings
                .state()
                .into_iter()
                .filter(|p| {
                    p.namespace() == changed.namespace()
                        && p.spec.target_ref == changed.spec.target_ref
                        && p.spec.direction == changed.spec.direction
                        && p.uid() != changed.uid()
                })
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
}

/// Reconciles one policy.
pub async fn reconcile(
    policy: Arc<WorkloadNetworkPolicy>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ns = policy.namespace().ok_or(Error::NoNamespace)?;
    if policy.meta().deletion_timestamp.is_some() {
        // Garbage collection removes what we rendered through the ownerReference.
        return Ok(Action::await_change());
    }
    let rules = check_rules(&ctx, &policy, &ns).await?;
    let siblings = ctx.policies_in(&ns);
    // Judged after check_rules, which has remembered this policy's backend: its validity here is that
    // check's. (name, valid) of the policy that governs the target instead of this one.
    let winner = {
        let backends = ctx.backends.lock().expect("backends lock");
        uniqueness::winner_over(&policy, siblings.iter().map(|p| p.as_ref()), |p| {
            backends.is_valid(p)
        })
        .map(|w| (w.name_any(), backends.is_valid(w)))
    };
    // Clusters without the CRDs' CEL rules (< 1.25), CRDs applied without validation and restored
    // backups let invalid policies in; nothing of them is rendered (docs/api.md, "Invalid policies").
    if let Err(violations) = rules {
        let ready = match &winner {
            // A valid policy governs the target: what this one rendered would add to what that one
            // renders, so it goes, as any duplicate's does.
            Some((_, true)) => {
                remove_rendered(&ctx, &policy, &ns).await?;
                Condition::new(
                    conditions::READY,
                    false,
                    INVALID_REASON,
                    validity::invalid_message(&violations, &[]),
                )
            }
            _ => refuse_invalid(&ctx, &policy, &ns, &violations).await?,
        };
        // Like any duplicate's, its DuplicateTarget must follow the winner's deletion soon (see below).
        let requeue = if winner.is_some() {
            DUPLICATE_RECHECK
        } else {
            ctx.settings.resync
        };
        let wanted = standing::desired(
            &policy,
            Standing::Invalid {
                ready: ready.clone(),
                winner: winner.map(|(name, _)| name),
            },
        );
        // One Event per change of the refusal, not one per resync nor per change of another
        // condition (DuplicateTarget may flip while the refusal stays the same).
        let news = !conditions::holds(
            policy
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default(),
            &ready,
        );
        write_conditions(&ctx, &policy, &ns, &wanted).await?;
        if news {
            tracing::warn!(name = %policy.name_any(), namespace = %ns, message = %ready.message, "invalid policy refused");
            publish(
                &ctx,
                policy.as_ref(),
                EventType::Warning,
                INVALID_REASON,
                "Render",
                ready.message.clone(),
            )
            .await;
        }
        return Ok(Action::requeue(requeue));
    }
    let mut requeue = ctx.settings.resync;

    let standing = if let Some((winner, _)) = winner {
        remove_owned::<NetworkPolicy>(&ctx, &policy, &ns).await?;
        if policy.spec.backend == Backend::Istio && authorization_policy_kind_exists(&ctx).await? {
            remove_owned::<AuthorizationPolicy>(&ctx, &policy, &ns).await?;
        }
        // The winner's deletion reaches this policy through the sibling watch, possibly before the
        // cache has dropped the winner; re-check soon rather than wait for the resync.
        requeue = DUPLICATE_RECHECK;
        Standing::Duplicate {
            winner,
            overlap: overlap_condition(&ctx, &policy, &ns).await?,
        }
    } else {
        let gate = protect_gate(&ctx, &policy).await;
        if ctx.settings.gate.is_some() && gate.condition.reason == protect_gate::REASON_NO_HISTORY {
            // The history is not ready yet (the controller has just started): check again soon.
            requeue = requeue.min(GATE_NOT_READY_RECHECK);
        }
        let (ready, again) = if gate.held {
            // Rendered as monitor: what protect would render stays out until the gate is clean.
            let mut as_monitor = policy.as_ref().clone();
            as_monitor.spec.mode = PolicyMode::Monitor;
            let (_, again) = render_and_apply(&ctx, &as_monitor, &ns).await?;
            requeue = requeue.min(GATE_RECHECK);
            let held = Condition::new(
                conditions::READY,
                false,
                protect_gate::REASON_HELD,
                "held in monitor by the protect gate (protect-gate: strict): see WouldBlock; \
                 violations are recorded, nothing is rendered",
            );
            (held, again)
        } else {
            render_and_apply(&ctx, &policy, &ns).await?
        };
        if let Some(again) = again {
            requeue = requeue.min(again);
        }
        // The status sync writes `ruleUsage`, which brings the policy here; with no new traffic the
        // condition changes only with time, so come back when the next rule would reach the threshold.
        let (unused, due) = rule_usage::unused_rules(
            &policy.spec,
            policy
                .status
                .as_ref()
                .map(|s| s.rule_usage.as_slice())
                .unwrap_or_default(),
            policy.metadata.creation_timestamp.as_ref(),
            policy.metadata.generation,
            &Time(k8s_openapi::jiff::Timestamp::now()),
            ctx.settings.unused_rule_after,
        );
        if let Some(due) = due {
            requeue = requeue.min(due + Duration::from_secs(1));
        }
        Standing::InForce {
            ready,
            would_block: gate.condition,
            unused_rules: unused,
            overlap: overlap_condition(&ctx, &policy, &ns).await?,
        }
    };
    write_conditions(&ctx, &policy, &ns, &standing::desired(&policy, standing)).await?;
    Ok(Action::requeue(requeue))
}

/// How often a policy the protect gate holds is checked again (its history ages, NetworkPolicies change).
const GATE_RECHECK: Duration = Duration::from_secs(60);
/// How soon the gate is checked again while its history is not ready (the status sync has not listed yet).
const GATE_NOT_READY_RECHECK: Duration = Duration::from_secs(10);

/// The protect gate's verdict for `policy` (docs/api.md, "Protect gate"), with a Warning Event when
/// observed flows would now be blocked and were not before (or for another reason).
async fn protect_gate(ctx: &Context, policy: &WorkloadNetworkPolicy) -> protect_gate::Verdict {
    let report = ctx.settings.gate.as_ref().and_then(|g| g.0.replay(policy));
    let verdict = protect_gate::verdict(policy, report.as_ref());
    if let Some(g) = &ctx.settings.gate {
        g.0.hold(policy, verdict.held);
    }
    let before = conditions::of(policy, conditions::WOULD_BLOCK);
    let news = verdict.condition.status
        && before.is_none_or(|c| c.status != "True" || c.reason != verdict.condition.reason);
    if news {
        tracing::info!(name = %policy.name_any(), namespace = ?policy.namespace(), reason = %verdict.condition.reason, message = %verdict.condition.message, "protect gate: observed flows would be blocked");
        publish(
            ctx,
            policy,
            EventType::Warning,
            conditions::WOULD_BLOCK,
            "ProtectGate",
            verdict.condition.message.clone(),
        )
        .await;
    }
    verdict
}

/// Logs and backs off after a failed reconcile.
pub fn error_policy(
    policy: Arc<WorkloadNetworkPolicy>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(name = %policy.name_any(), namespace = ?policy.namespace(), %error, "policy reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Checks the policy against every rule of the CRDs, including the immutable backend: the backend to
/// compare with is the one this process remembers, else the one its rendered objects show (see
/// [`validity::Backends`]).
async fn check_rules(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<Result<(), Vec<Violation>>, Error> {
    let uid = policy.uid().unwrap_or_default();
    let remembered = ctx.backends.lock().expect("backends lock").remembered(&uid);
    let previous = match remembered {
        Some(backend) => backend,
        None => {
            let rendered = rendered_as_other_backend(ctx, policy, ns).await?;
            let live = ctx.policies.state();
            let mut backends = ctx.backends.lock().expect("backends lock");
            // Policies deleted since are forgotten now and then (their uids never come back).
            if backends.len() > 2 * live.len() + 16 {
                backends.retain_live(live.iter().filter_map(|p| p.metadata.uid.as_deref()));
            }
            backends.previous(&uid, policy.spec.backend, rendered)
        }
    };
    Ok(validation::validate(&policy.spec, Some(previous)))
}

/// The other backend, when the policy owns an object that backend renders (its backend was changed).
async fn rendered_as_other_backend(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<Option<Backend>, Error> {
    Ok(match policy.spec.backend {
        Backend::Istio => owned::<NetworkPolicy>(ctx, policy, ns)
            .await?
            .map(|_| Backend::Kubernetes),
        Backend::Kubernetes if authorization_policy_kind_exists(ctx).await? => {
            owned::<AuthorizationPolicy>(ctx, policy, ns)
                .await?
                .map(|_| Backend::Istio)
        }
        Backend::Kubernetes => None,
    })
}

/// Removes whatever the policy rendered, with either backend (an invalid policy's may have changed).
async fn remove_rendered(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<(), Error> {
    remove_owned::<NetworkPolicy>(ctx, policy, ns).await?;
    if authorization_policy_kind_exists(ctx).await? {
        remove_owned::<AuthorizationPolicy>(ctx, policy, ns).await?;
    }
    Ok(())
}

/// Renders nothing for an invalid policy: what it rendered from a valid generation stays in force,
/// anything else it owns is removed (see [`validity::on_invalid`]). Returns the `Ready=False` condition.
async fn refuse_invalid(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
    violations: &[Violation],
) -> Result<Condition, Error> {
    let mut kept = Vec::new();
    keep_or_remove::<NetworkPolicy>(ctx, policy, ns, &mut kept).await?;
    if authorization_policy_kind_exists(ctx).await? {
        keep_or_remove::<AuthorizationPolicy>(ctx, policy, ns, &mut kept).await?;
    }
    Ok(Condition::new(
        conditions::READY,
        false,
        INVALID_REASON,
        validity::invalid_message(violations, &kept),
    ))
}

/// Keeps the policy's rendered `K` when a valid generation produced it (noting it in `kept`), deletes it
/// otherwise.
async fn keep_or_remove<K>(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
    kept: &mut Vec<String>,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let Some(existing) = owned::<K>(ctx, policy, ns).await? else {
        return Ok(());
    };
    let kind = K::kind(&());
    match validity::on_invalid(existing.meta().annotations.as_ref()) {
        OnInvalid::Keep { generation } => {
            kept.push(format!(
                "{kind} {} (rendered from generation {generation})",
                existing.name_any()
            ));
        }
        OnInvalid::Remove => remove_owned::<K>(ctx, policy, ns).await?,
    }
    Ok(())
}

/// Renders the policy and brings the cluster in line; returns the Ready condition and, when the
/// result must be re-checked sooner than the resync, after how long.
async fn render_and_apply(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<(Condition, Option<Duration>), Error> {
    let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let workload = target_workload(policy, ns);
    let desired = match render::desired_with(policy, |rule| match &ctx.settings.names {
        Some(names) => names.addresses(
            &workload,
            |name| {
                rule.names
                    .iter()
                    .any(|p| network_enforcer_api::dns_name::matches(p, name))
            },
            now_ms,
        ),
        None => Default::default(),
    }) {
        Ok(desired) => desired,
        Err(e) => {
            return Ok((
                Condition::new(conditions::READY, false, e.reason(), e.to_string()),
                None,
            ));
        }
    };
    let outcome = match desired {
        Desired::NetworkPolicy(np) => apply_owned(ctx, policy, ns, np.as_ref()).await?,
        Desired::NoNetworkPolicy => {
            remove_owned::<NetworkPolicy>(ctx, policy, ns).await?;
            return Ok((
                Condition::new(
                    conditions::READY,
                    true,
                    "Monitoring",
                    "monitor mode: no NetworkPolicy is rendered; violations are recorded",
                ),
                None,
            ));
        }
        Desired::AuthorizationPolicy(ap) => {
            if !authorization_policy_kind_exists(ctx).await? {
                return Ok((
                    Condition::new(
                        conditions::READY,
                        false,
                        "AuthorizationPolicyCRDMissing",
                        "security.istio.io/v1 AuthorizationPolicy is not served by this cluster; install \
                         Istio; this is checked again periodically",
                    ),
                    Some(ctx.settings.istio_recheck),
                ));
            }
            let outcome = apply_owned(ctx, policy, ns, ap.as_ref()).await?;
            return Ok((outcome, Some(ctx.settings.istio_recheck)));
        }
    };
    // Addresses of names age out: render again within the retention.
    let requeue = match (&ctx.settings.names, policy.spec.egress_names.is_empty()) {
        (Some(names), false) => Some(names.retention() / 2),
        _ => None,
    };
    Ok((outcome, requeue))
}

/// The workload `policy` targets, as [`crate::cluster::names`] keys it.
fn target_workload(policy: &WorkloadNetworkPolicy, ns: &str) -> WorkloadKey {
    WorkloadKey {
        namespace: ns.to_string(),
        kind: policy.spec.target_ref.kind,
        name: policy.spec.target_ref.name.clone(),
    }
}

/// Whether `policy` renders addresses of names that pods of `workload` resolve: a protect policy
/// with `egressNames` targeting it.
pub fn renders_names_of(policy: &WorkloadNetworkPolicy, workload: &WorkloadKey) -> bool {
    policy.spec.mode == PolicyMode::Protect
        && !policy.spec.egress_names.is_empty()
        && policy.metadata.namespace.as_deref() == Some(workload.namespace.as_str())
        && target_workload(policy, &workload.namespace) == *workload
}

/// Server-side applies `desired` unless an object of that name exists that we do not own.
async fn apply_owned<K>(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
    desired: &K,
) -> Result<Condition, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = ctx.api(ns);
    let name = policy.name_any();
    let kind = K::kind(&());
    if let Some(existing) = api.get_opt(&name).await? {
        if !render::is_owned_by(existing.meta().owner_references.as_ref(), policy) {
            return Ok(Condition::new(
                conditions::READY,
                false,
                "NotOwned",
                format!(
                    "a {kind} named {name} exists that this policy does not own; it is left untouched. \
                     Delete or rename it to let this policy render"
                ),
            ));
        }
    }
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await?;
    Ok(Condition::new(
        conditions::READY,
        true,
        "Rendered",
        format!("{kind} {name} is in sync with the policy"),
    ))
}

/// The object of the policy's name, if the policy owns it.
async fn owned<K>(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<Option<K>, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let existing = ctx.api::<K>(ns).get_opt(&policy.name_any()).await?;
    Ok(existing.filter(|o| render::is_owned_by(o.meta().owner_references.as_ref(), policy)))
}

/// Deletes the object of the policy's name if, and only if, the policy owns it.
async fn remove_owned<K>(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned,
{
    if owned::<K>(ctx, policy, ns).await?.is_none() {
        return Ok(());
    }
    let name = policy.name_any();
    match ctx
        .api::<K>(ns)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => {
            tracing::info!(namespace = ns, name, kind = %K::kind(&()), "deleted rendered object")
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// True when the cluster serves `security.istio.io/v1` AuthorizationPolicies. Asked on each istio
/// reconcile, so a CRD installed after start-up is used without a restart.
async fn authorization_policy_kind_exists(ctx: &Context) -> Result<bool, Error> {
    match ctx
        .client
        .list_api_group_resources("security.istio.io/v1")
        .await
    {
        Ok(list) => Ok(list
            .resources
            .iter()
            .any(|r| r.name == "authorizationpolicies")),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The policy's pod selector, whichever backend it uses.
fn pod_selector(policy: &WorkloadNetworkPolicy) -> Option<&LabelSelector> {
    match policy.spec.backend {
        Backend::Kubernetes => policy.spec.kubernetes.as_ref()?.pod_selector.as_ref(),
        Backend::Istio => Some(&policy.spec.istio.as_ref()?.selector),
    }
}

/// `SelectorOverlapsWorkload`: does the selector also pick pods that belong to another workload?
async fn overlap_condition(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
) -> Result<Condition, Error> {
    let Some(sel) = pod_selector(policy) else {
        return Ok(Condition::new(
            conditions::SELECTOR_OVERLAPS_WORKLOAD,
            false,
            "NoSelector",
            "the policy has no selector",
        ));
    };
    let pods = ctx.api::<Pod>(ns).list(&ListParams::default()).await?;
    let target = &policy.spec.target_ref;
    let selected: Vec<&Pod> = pods
        .items
        .iter()
        .filter(|pod| {
            selector::matches(
                sel,
                pod.metadata.labels.as_ref().unwrap_or(&Default::default()),
            )
        })
        .collect();
    // A Job's pods belong to its CronJob, when it has one: the Jobs are read only when a Job's pod is
    // selected.
    let job_owned = |pod: &&Pod| {
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Job" && o.controller == Some(true))
    };
    let jobs = if selected.iter().any(job_owned) {
        ctx.api::<Job>(ns).list(&ListParams::default()).await?.items
    } else {
        Vec::new()
    };
    let jobs = workload::JobOwners::new(&jobs);
    let others: BTreeSet<String> = selected
        .iter()
        .filter_map(|pod| match jobs.unit(pod) {
            Some(w) if w.kind == target.kind && w.name == target.name => None,
            Some(w) => Some(format!("{} {}", w.kind.as_str(), w.name)),
            None => Some(format!("Pod {}", pod.name_any())),
        })
        .collect();
    Ok(if others.is_empty() {
        Condition::new(
            conditions::SELECTOR_OVERLAPS_WORKLOAD,
            false,
            "SelectsOnlyTarget",
            "the selector selects only pods of the target workload",
        )
    } else {
        let list: Vec<String> = others.into_iter().collect();
        Condition::new(
            conditions::SELECTOR_OVERLAPS_WORKLOAD,
            true,
            "SelectsOtherWorkloads",
            format!(
                "the selector also selects pods of {}; the rendered policy would govern them too",
                list.join(", ")
            ),
        )
    })
}

/// Merges `wanted` into the policy's conditions and patches the status only when something changed;
/// returns whether it did.
async fn write_conditions(
    ctx: &Context,
    policy: &WorkloadNetworkPolicy,
    ns: &str,
    wanted: &[Condition],
) -> Result<bool, Error> {
    let mut current = policy
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut changed = false;
    for condition in wanted {
        changed |= conditions::set(&mut current, condition, policy.metadata.generation, &now);
    }
    if !changed {
        return Ok(false);
    }
    let patch = serde_json::json!({"status": {"conditions": current}});
    ctx.api::<WorkloadNetworkPolicy>(ns)
        .patch_status(
            &policy.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(true)
}
