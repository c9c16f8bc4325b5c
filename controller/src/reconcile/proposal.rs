//! The proposal reconciler: promotion on the promote label, leftover clean-up, refusals (a bad label, a
//! same-named policy, a proposal that breaks the CRDs' rules) as Warning Events and a `Promoted=False`
//! condition (docs/behaviour.md §2).

use super::{Context, Error, publish};
use crate::cluster::shared_watch::PolicyObjects;
use crate::policy::conditions::{self, Desired};
use crate::policy::promote::{self, Decision};
use crate::policy::validity::INVALID_REASON;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use network_enforcer_api::keys::FIELD_MANAGER;
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use std::sync::Arc;
use std::time::Duration;

/// The proposal controller over the shared watches of `objects`: proposals, plus the same-named
/// proposal of every policy that changes (so a leftover is found as soon as either object is seen).
pub fn controller(objects: &PolicyObjects) -> Controller<WorkloadNetworkPolicyProposal> {
    Controller::for_stream(objects.proposals.applied(), objects.proposals.store()).watches_stream(
        objects.policies.touched(),
        |policy| {
            let ns = policy.namespace()?;
            Some(ObjectRef::new(&policy.name_any()).within(&ns))
        },
    )
}

/// Reconciles one proposal.
pub async fn reconcile(
    proposal: Arc<WorkloadNetworkPolicyProposal>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ns = proposal.namespace().ok_or(Error::NoNamespace)?;
    let name = proposal.name_any();
    let policies = ctx.policies_in(&ns);
    let decision = promote::decide(&proposal, policies.iter().map(|p| p.as_ref()));
    let decision = match &ctx.settings.signing_key {
        Some(key) => promote::gate(decision, key.check(&proposal)),
        // No key configured (the chart always sets one): every proposal counts as learned.
        None => decision,
    };
    let proposals = ctx.api::<WorkloadNetworkPolicyProposal>(&ns);
    match decision {
        Decision::Keep => {}
        Decision::Promote(mode) => {
            let policy = promote::policy_from(&proposal, mode);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            match ctx
                .api::<WorkloadNetworkPolicy>(&ns)
                .create(&params, &policy)
                .await
            {
                Ok(created) => {
                    tracing::info!(namespace = %ns, name = %name, mode = mode.as_str(), "promoted proposal");
                    publish(
                        &ctx,
                        &created,
                        EventType::Normal,
                        "Promoted",
                        "Promote",
                        format!("created from proposal {name} in {} mode", mode.as_str()),
                    )
                    .await;
                }
                // Our cache had not seen the policy yet; the next pass decides with it. Unless the
                // policy is one this build cannot read (the shared watch leaves it out): then the
                // cache never will, and the promotion is refused until it is fixed or deleted.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let policies = ctx.api::<WorkloadNetworkPolicy>(&ns);
                    if let Err(kube::Error::SerdeError(error)) = policies.get(&name).await {
                        let message = format!(
                            "a WorkloadNetworkPolicy {name} exists that this controller cannot read \
                             ({}); fix or delete it, then promote again",
                            what_not_where(&error)
                        );
                        refuse(&ctx, &proposal, "PolicyUnreadable", message).await?;
                        return Ok(Action::requeue(Duration::from_secs(300)));
                    }
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                Err(e) => return Err(e.into()),
            }
            delete(&proposals, &name).await?;
        }
        Decision::DeleteLeftover => {
            tracing::info!(namespace = %ns, name = %name, "deleting leftover proposal of a promoted policy");
            delete(&proposals, &name).await?;
        }
        Decision::InvalidLabel(value) => {
            let message = format!(
                "label {}={value:?} is not monitor or protect; the proposal is not promoted",
                network_enforcer_api::keys::PROMOTE_LABEL
            );
            refuse(&ctx, &proposal, "InvalidPromoteLabel", message).await?;
        }
        Decision::Invalid(violations) => {
            let message = format!(
                "{}. The proposal is not promoted: fix it, or delete it so that learning writes it again, then promote again",
                network_enforcer_api::validation::describe(&violations)
            );
            refuse(&ctx, &proposal, INVALID_REASON, message).await?;
        }
        Decision::NotLearned(provenance) => {
            refuse(
                &ctx,
                &proposal,
                provenance.reason(),
                provenance.message().to_string(),
            )
            .await?;
        }
        Decision::PolicyExists => {
            let message = format!(
                "a WorkloadNetworkPolicy named {name} already exists and was not promoted from this \
                 proposal; delete or rename it, then promote again"
            );
            refuse(&ctx, &proposal, "PolicyExists", message).await?;
        }
    }
    Ok(Action::requeue(ctx.settings.resync))
}

/// Logs and backs off after a failed reconcile.
pub fn error_policy(
    proposal: Arc<WorkloadNetworkPolicyProposal>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(name = %proposal.name_any(), namespace = ?proposal.namespace(), %error, "proposal reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

async fn delete(api: &kube::Api<WorkloadNetworkPolicyProposal>, name: &str) -> Result<(), Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reports a refused promotion as a Warning Event and a `Promoted=False` condition (written only when
/// it changes, so a proposal left in this state does not produce a write per resync).
/// What a decode error says, without where in the document ("at line 1 column 345"): the position
/// moves with unrelated bytes of the object, and a changed message is a new condition and Event.
fn what_not_where(error: &serde_json::Error) -> String {
    let text = error.to_string();
    match text.rfind(" at line ") {
        Some(at) if error.line() > 0 => text[..at].to_string(),
        _ => text,
    }
}

async fn refuse(
    ctx: &Context,
    proposal: &WorkloadNetworkPolicyProposal,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let mut status = proposal.status.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let desired = Desired::new(conditions::PROMOTED, false, reason, message.clone());
    if !conditions::set(
        &mut status.conditions,
        &desired,
        proposal.metadata.generation,
        &now,
    ) {
        return Ok(());
    }
    tracing::warn!(name = %proposal.name_any(), namespace = ?proposal.namespace(), reason, %message, "promotion refused");
    publish(
        ctx,
        proposal,
        EventType::Warning,
        reason,
        "Promote",
        message,
    )
    .await;
    let ns = proposal.namespace().ok_or(Error::NoNamespace)?;
    let patch = serde_json::json!({"status": {"conditions": status.conditions}});
    ctx.api::<WorkloadNetworkPolicyProposal>(&ns)
        .patch_status(
            &proposal.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_error_is_told_without_its_position() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        enum Mode {
            Monitor,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Spec {
            note: String,
            mode: Mode,
        }
        let error = |json: &str| serde_json::from_str::<Spec>(json).unwrap_err();
        let short = error(r#"{"note": "a", "mode": "Enforce"}"#);
        let long = error(r#"{"note": "a much longer note", "mode": "Enforce"}"#);
        assert_ne!(
            short.to_string(),
            long.to_string(),
            "serde tells the column"
        );
        assert_eq!(what_not_where(&short), what_not_where(&long));
        assert!(
            what_not_where(&short).starts_with("unknown variant `Enforce`"),
            "{}",
            what_not_where(&short)
        );
    }
}
