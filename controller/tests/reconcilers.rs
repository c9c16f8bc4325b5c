//! The promotion and policy reconcilers against the real local Kubernetes API server (docs/design.md,
//! "Promotion and rendering"). Each test runs its own controller instance scoped to its own namespace.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use network_enforcer_api::authorization_policy::AuthorizationPolicy;
use network_enforcer_api::crd::rules;
use network_enforcer_api::keys::{
    PROMOTE_LABEL, PROMOTED_FROM_LABEL, RENDERED_GENERATION_ANNOTATION,
};
use network_enforcer_api::{PolicyMode, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::reconcile::{self, Settings};
use network_enforcer_controller::runtime::metrics::{ReconcileMetrics, Reconciler};
use network_enforcer_controller::tools::uninstall;
use network_enforcer_tests::fixture::TestNamespace;
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// A controller for one test namespace, with its reconcile counters; stopped when dropped.
struct RunningController(tokio::task::JoinHandle<()>, ReconcileMetrics);

impl Drop for RunningController {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn start_controller(ns: &TestNamespace) -> RunningController {
    let settings = Settings {
        namespace: Some(ns.name.clone()),
        istio_recheck: Duration::from_secs(1),
        ..Settings::default()
    };
    run_controller(ns, settings)
}

fn run_controller(ns: &TestNamespace, settings: Settings) -> RunningController {
    let metrics = settings.metrics.clone();
    RunningController(
        tokio::spawn(reconcile::run(ns.client.clone(), settings)),
        metrics,
    )
}

impl RunningController {
    /// Stops the reconcilers and waits until their task has ended.
    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

fn kubernetes_proposal(
    ns: &str,
    name: &str,
    promote: Option<&str>,
) -> WorkloadNetworkPolicyProposal {
    let mut labels = serde_json::Map::new();
    if let Some(v) = promote {
        labels.insert(PROMOTE_LABEL.into(), json!(v));
    }
    serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicyProposal",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "backend": "kubernetes", "direction": "Egress",
            "targetRef": {"kind": "Deployment", "name": "http-client"},
            "kubernetes": {
                "podSelector": {"matchLabels": {"app": "http-client"}},
                "policyTypes": ["Egress"],
                "egress": [
                    {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                             "podSelector": {"matchLabels": {"app": "http-server"}}}],
                     "ports": [{"protocol": "TCP", "port": 18080}]},
                    {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                             "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                     "ports": [{"protocol": "UDP", "port": 53}]}
                ]
            }
        }
    }))
    .unwrap()
}

fn policy_from_json(ns: &str, name: &str, target: &str, mode: &str) -> WorkloadNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "backend": "kubernetes", "direction": "Ingress", "mode": mode,
            "targetRef": {"kind": "Deployment", "name": target},
            "kubernetes": {
                "podSelector": {"matchLabels": {"app": target}},
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"protocol": "TCP", "port": 8080}]}]
            }
        }
    }))
    .unwrap()
}

fn condition(policy: &WorkloadNetworkPolicy, type_: &str) -> Option<(String, String)> {
    policy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn set_mode(api: &Api<WorkloadNetworkPolicy>, name: &str, mode: PolicyMode) -> Result<()> {
    let patch = json!({"spec": {"mode": mode.as_str()}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn promote_monitor_protect_drift_and_garbage_collection() -> Result<()> {
    let ns = TestNamespace::create_with_crds("promote").await?;
    let controller = start_controller(&ns);
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let netpols = ns.api::<NetworkPolicy>();
    let name = "deployment-http-client-egress";
    let proposal = kubernetes_proposal(&ns.name, name, None);
    proposals.create(&PostParams::default(), &proposal).await?;

    // Learning owns an unlabelled proposal: nothing happens to it once it has been reconciled (the
    // namespace holds no other proposal, so the first reconcile is this one's).
    ns.wait_for("the proposal's first reconcile", WAIT, || async {
        Ok((controller.1.runs(Reconciler::proposal) > 0).then_some(()))
    })
    .await?;
    assert!(proposals.get_opt(name).await?.is_some());
    assert!(policies.get_opt(name).await?.is_none());

    // Promote to monitor: a policy with the same name, spec and the link; the proposal is gone.
    let label = json!({"metadata": {"labels": {PROMOTE_LABEL: "monitor"}}});
    proposals
        .patch(name, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let policy = ns
        .wait_for("the promoted policy", WAIT, || async {
            Ok(policies.get_opt(name).await?)
        })
        .await?;
    assert_eq!(policy.spec.mode, PolicyMode::Monitor);
    assert_eq!(policy.labels()[PROMOTED_FROM_LABEL], name);
    assert_eq!(policy.spec.kubernetes, proposal.spec.kubernetes);
    assert_eq!(policy.spec.target_ref, proposal.spec.target_ref);
    ns.wait_for("the proposal to be deleted", WAIT, || async {
        Ok(proposals.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    let ready = ns
        .wait_for("Ready in monitor mode", WAIT, || async {
            Ok(condition(&policies.get(name).await?, "Ready"))
        })
        .await?;
    assert_eq!(ready, ("True".into(), "Monitoring".into()));
    assert!(
        netpols.get_opt(name).await?.is_none(),
        "monitor renders no NetworkPolicy"
    );

    // A leftover re-created by learning is deleted as soon as it is seen.
    proposals
        .create(
            &PostParams::default(),
            &kubernetes_proposal(&ns.name, name, None),
        )
        .await?;
    ns.wait_for("the leftover proposal to be deleted", WAIT, || async {
        Ok(proposals.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;

    // Protect: the NetworkPolicy equals spec.kubernetes and is controlled by the policy.
    set_mode(&policies, name, PolicyMode::Protect).await?;
    let np = ns
        .wait_for("the NetworkPolicy", WAIT, || async {
            Ok(netpols.get_opt(name).await?)
        })
        .await?;
    let policy = policies.get(name).await?;
    let spec = np.spec.clone().unwrap();
    let want = policy.spec.kubernetes.clone().unwrap();
    assert_eq!(spec.pod_selector, want.pod_selector);
    assert_eq!(spec.policy_types, want.policy_types);
    assert_eq!(spec.egress, want.egress);
    let owners = np.owner_references();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, policy.uid().unwrap());
    assert_eq!(owners[0].controller, Some(true));
    assert_eq!(owners[0].block_owner_deletion, Some(true));

    // Drift: someone empties our NetworkPolicy's egress; it is repaired.
    let drift = json!({"spec": {"egress": []}});
    netpols
        .patch(name, &PatchParams::default(), &Patch::Merge(&drift))
        .await?;
    ns.wait_for("the drift to be repaired", WAIT, || async {
        let np = netpols.get(name).await?;
        Ok((np.spec.and_then(|s| s.egress) == want.egress).then_some(()))
    })
    .await?;

    // Someone deletes our NetworkPolicy: it is rendered again at once (its deletion reaches the
    // policy controller through the shared watch; the periodic resync is hours away).
    netpols.delete(name, &DeleteParams::default()).await?;
    ns.wait_for(
        "the deleted NetworkPolicy to be rendered again",
        WAIT,
        || async {
            let np = netpols.get_opt(name).await?;
            Ok(np
                .filter(|np| np.metadata.deletion_timestamp.is_none())
                .filter(|np| np.spec.as_ref().and_then(|s| s.egress.clone()) == want.egress)
                .map(|_| ()))
        },
    )
    .await?;

    // Back to monitor: our NetworkPolicy is deleted.
    set_mode(&policies, name, PolicyMode::Monitor).await?;
    ns.wait_for("the NetworkPolicy to be deleted", WAIT, || async {
        Ok(netpols.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;

    // Protect again.
    set_mode(&policies, name, PolicyMode::Protect).await?;
    ns.wait_for("the NetworkPolicy again", WAIT, || async {
        Ok(netpols.get_opt(name).await?)
    })
    .await?;

    // Uninstall clean-up removes what we rendered (with no controller running to put it back), and
    // nothing else.
    controller.stop().await;
    let foreign: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "not-ours", "namespace": ns.name,
                     "labels": {"app.kubernetes.io/managed-by": "network-enforcer"}},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}
    }))?;
    netpols.create(&PostParams::default(), &foreign).await?;
    let removed = uninstall::remove_rendered_objects(&ns.client, Some(&ns.name)).await?;
    assert_eq!(removed, 1);
    assert!(netpols.get_opt(name).await?.is_none());
    assert!(
        netpols.get_opt("not-ours").await?.is_some(),
        "not controlled by a policy: kept"
    );
    let _controller = start_controller(&ns);
    ns.wait_for(
        "the reinstalled controller to render again",
        WAIT,
        || async { Ok(netpols.get_opt(name).await?) },
    )
    .await?;

    // Deleting the policy garbage-collects the NetworkPolicy.
    policies.delete(name, &DeleteParams::foreground()).await?;
    ns.wait_for(
        "garbage collection of the NetworkPolicy",
        Duration::from_secs(60),
        || async { Ok(netpols.get_opt(name).await?.is_none().then_some(())) },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn refused_promotions_are_reported_and_keep_the_proposal() -> Result<()> {
    let ns = TestNamespace::create_with_crds("refuse").await?;
    let _controller = start_controller(&ns);
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let policies = ns.api::<WorkloadNetworkPolicy>();

    // An invalid label value (the admission policy is not on this test server) is ignored with a condition.
    let bad = "deployment-bad-egress";
    proposals
        .create(
            &PostParams::default(),
            &kubernetes_proposal(&ns.name, bad, Some("enforce")),
        )
        .await?;
    let promoted = ns
        .wait_for("the Promoted condition", WAIT, || async {
            let p = proposals.get(bad).await?;
            Ok(p.status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Promoted")))
        })
        .await?;
    assert_eq!(
        (promoted.status.as_str(), promoted.reason.as_str()),
        ("False", "InvalidPromoteLabel")
    );
    assert!(policies.get_opt(bad).await?.is_none());

    // A hand-made policy of the same name: the proposal is not deleted, promotion is refused visibly.
    let name = "deployment-http-client-egress";
    let mut hand_made = policy_from_json(&ns.name, name, "http-client", "monitor");
    hand_made.spec.direction = network_enforcer_api::Direction::Egress;
    policies.create(&PostParams::default(), &hand_made).await?;
    proposals
        .create(
            &PostParams::default(),
            &kubernetes_proposal(&ns.name, name, None),
        )
        .await?;
    // Whether a policy is this proposal's promotion is decided before its label is looked at, so the
    // labelled proposal below, reconciled with the hand-made policy present, shows it is kept.
    let label = json!({"metadata": {"labels": {PROMOTE_LABEL: "protect"}}});
    proposals
        .patch(name, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let promoted = ns
        .wait_for("the PolicyExists condition", WAIT, || async {
            let p = proposals.get(name).await?;
            Ok(p.status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Promoted")))
        })
        .await?;
    assert_eq!(promoted.reason, "PolicyExists");
    assert!(
        proposals.get_opt(name).await?.is_some(),
        "a hand-made policy does not remove the proposal"
    );
    let policy = policies.get(name).await?;
    assert_eq!(
        policy.spec.mode,
        PolicyMode::Monitor,
        "the existing policy is untouched"
    );
    assert!(!policy.labels().contains_key(PROMOTED_FROM_LABEL));
    Ok(())
}

#[tokio::test]
async fn foreign_objects_duplicates_and_overlaps() -> Result<()> {
    let ns = TestNamespace::create_with_crds("owners").await?;
    let _controller = start_controller(&ns);
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let netpols = ns.api::<NetworkPolicy>();

    // A NetworkPolicy we do not own, with the policy's name, is never touched.
    let foreign: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "web-ingress", "namespace": ns.name},
        "spec": {"podSelector": {"matchLabels": {"app": "other"}}, "policyTypes": ["Ingress"]}
    }))?;
    netpols.create(&PostParams::default(), &foreign).await?;
    policies
        .create(
            &PostParams::default(),
            &policy_from_json(&ns.name, "web-ingress", "web", "protect"),
        )
        .await?;
    let ready = ns
        .wait_for("Ready=False NotOwned", WAIT, || async {
            Ok(condition(&policies.get("web-ingress").await?, "Ready")
                .filter(|(_, r)| r == "NotOwned"))
        })
        .await?;
    assert_eq!(ready.0, "False");
    let still = netpols.get("web-ingress").await?;
    assert!(still.owner_references().is_empty());
    assert_eq!(
        still
            .spec
            .unwrap()
            .pod_selector
            .unwrap()
            .match_labels
            .unwrap()["app"],
        "other"
    );

    // A second policy for the same target and direction is a duplicate and renders nothing.
    tokio::time::sleep(Duration::from_millis(1100)).await; // creation timestamps have 1 s resolution
    policies
        .create(
            &PostParams::default(),
            &policy_from_json(&ns.name, "web-ingress-2", "web", "protect"),
        )
        .await?;
    let dup = ns
        .wait_for("DuplicateTarget", WAIT, || async {
            Ok(condition(
                &policies.get("web-ingress-2").await?,
                "DuplicateTarget",
            ))
        })
        .await?;
    assert_eq!(dup, ("True".into(), "DuplicateTarget".into()));
    assert!(netpols.get_opt("web-ingress-2").await?.is_none());

    // The first goes away: the duplicate takes over and renders.
    policies
        .delete("web-ingress", &DeleteParams::default())
        .await?;
    ns.wait_for("the former duplicate to render", WAIT, || async {
        Ok(netpols.get_opt("web-ingress-2").await?)
    })
    .await?;
    // Its status follows the rendering (the same reconcile writes it just after: failed CI once when
    // read at once).
    ns.wait_for(
        "the former duplicate's DuplicateTarget=False",
        WAIT,
        || async {
            Ok(
                condition(&policies.get("web-ingress-2").await?, "DuplicateTarget")
                    .filter(|(s, _)| s == "False"),
            )
        },
    )
    .await?;

    // A pod of another workload that the selector also picks is reported.
    let stray: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "namespace": ns.name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "never-pulled", "imagePullPolicy": "Never"}]}
    }))?;
    ns.api::<Pod>()
        .create(&PostParams::default(), &stray)
        .await?;
    // Any change to the policy reconciles it; the periodic resync would too.
    let touch = json!({"metadata": {"annotations": {"touch": "1"}}});
    policies
        .patch(
            "web-ingress-2",
            &PatchParams::default(),
            &Patch::Merge(&touch),
        )
        .await?;
    let overlap = ns
        .wait_for("SelectorOverlapsWorkload", WAIT, || async {
            Ok(condition(
                &policies.get("web-ingress-2").await?,
                "SelectorOverlapsWorkload",
            )
            .filter(|(s, _)| s == "True"))
        })
        .await?;
    assert_eq!(overlap.1, "SelectsOtherWorkloads");
    Ok(())
}

/// A policy for a Job or a bare pod that selects only that Job's (or that pod's) pods overlaps nothing:
/// their pods are units of their own, not "other workloads" (was reported as overlapping its own pods).
#[tokio::test]
async fn policies_for_jobs_and_bare_pods_do_not_overlap_their_own_pods() -> Result<()> {
    let ns = TestNamespace::create_with_crds("unit-overlap").await?;
    let _controller = start_controller(&ns);
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(json!({
        "metadata": {"name": "migrate", "namespace": ns.name},
        "spec": {"template": {
            "metadata": {"labels": {"app": "migrate"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "never-pulled", "imagePullPolicy": "Never"}]}
        }}
    }))?;
    ns.api::<k8s_openapi::api::batch::v1::Job>()
        .create(&PostParams::default(), &job)
        .await?;
    // The Job controller makes its pod (a pod made here with the Job as owner would be released by it:
    // its labels lack the Job's controller-uid). Only then is the policy judged, so its pod counts.
    ns.wait_for("the Job's pod", WAIT, || async {
        let pods = ns
            .api::<Pod>()
            .list(&ListParams::default().labels("job-name=migrate"))
            .await?;
        Ok(pods.items.into_iter().next())
    })
    .await?;
    let solo: Pod = serde_json::from_value(json!({
        "metadata": {"name": "solo", "namespace": ns.name, "labels": {"app": "solo"}},
        "spec": {"containers": [{"name": "c", "image": "never-pulled", "imagePullPolicy": "Never"}]}
    }))?;
    ns.api::<Pod>()
        .create(&PostParams::default(), &solo)
        .await?;
    for (name, kind, target) in [
        ("migrate-ingress", "Job", "migrate"),
        ("solo-ingress", "Pod", "solo"),
    ] {
        let mut policy = policy_from_json(&ns.name, name, target, "monitor");
        policy.spec.target_ref.kind = serde_json::from_value(json!(kind))?;
        policies.create(&PostParams::default(), &policy).await?;
    }
    for name in ["migrate-ingress", "solo-ingress"] {
        let overlap = ns
            .wait_for("SelectorOverlapsWorkload", WAIT, || async {
                Ok(condition(
                    &policies.get(name).await?,
                    "SelectorOverlapsWorkload",
                ))
            })
            .await?;
        assert_eq!(
            overlap,
            ("False".into(), "SelectsOnlyTarget".into()),
            "{name}"
        );
    }
    Ok(())
}

/// The stand-in for Istio's AuthorizationPolicy CRD (no Istio exists here).
fn authorization_policy_crd() -> CustomResourceDefinition {
    serde_json::from_value(network_enforcer_tests::fixture::authorization_policy_crd()).unwrap()
}

#[tokio::test]
async fn istio_policy_waits_for_the_crd_then_renders_dry_run_in_monitor() -> Result<()> {
    let ns = TestNamespace::create_with_crds("istio").await?;
    let crds = Api::<CustomResourceDefinition>::all(ns.client.clone());
    let crd_name = "authorizationpolicies.security.istio.io";
    if crds.get_opt(crd_name).await?.is_some() {
        crds.delete(crd_name, &DeleteParams::default()).await?;
        ns.wait_for("the old CRD to go", Duration::from_secs(60), || async {
            Ok(crds.get_opt(crd_name).await?.is_none().then_some(()))
        })
        .await?;
    }
    let _controller = start_controller(&ns);
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let name = "deployment-http-server-ingress";
    let policy: WorkloadNetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": name, "namespace": ns.name},
        "spec": {
            "backend": "istio", "direction": "Ingress", "mode": "monitor",
            "targetRef": {"kind": "Deployment", "name": "http-server"},
            "istio": {
                "selector": {"matchLabels": {"app": "http-server"}},
                "rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/{}/sa/http-client-sa", ns.name)]}}],
                           "to": [{"operation": {"ports": ["18080"]}}]}]
            }
        }
    }))?;
    // Promote an istio proposal with the same payload: the policy appears and waits for Istio.
    let mut proposal = serde_json::to_value(&policy)?;
    proposal["kind"] = json!("WorkloadNetworkPolicyProposal");
    proposal["metadata"]["labels"] = json!({PROMOTE_LABEL: "monitor"});
    proposal["spec"].as_object_mut().unwrap().remove("mode");
    let proposal: WorkloadNetworkPolicyProposal = serde_json::from_value(proposal)?;
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    proposals.create(&PostParams::default(), &proposal).await?;
    ns.wait_for("the proposal to be promoted", WAIT, || async {
        Ok(proposals.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    let promoted = policies.get(name).await?;
    assert_eq!(promoted.spec.istio, policy.spec.istio);
    assert_eq!(promoted.spec.mode, PolicyMode::Monitor);
    assert_eq!(promoted.labels()[PROMOTED_FROM_LABEL], name);
    ns.wait_for(
        "Ready=False AuthorizationPolicyCRDMissing",
        WAIT,
        || async {
            Ok(condition(&policies.get(name).await?, "Ready")
                .filter(|(s, r)| s == "False" && r == "AuthorizationPolicyCRDMissing"))
        },
    )
    .await?;

    // Istio gets installed after the controller started: no restart needed.
    crds.create(&PostParams::default(), &authorization_policy_crd())
        .await?;
    let aps = ns.api::<AuthorizationPolicy>();
    let ap = ns
        .wait_for(
            "the AuthorizationPolicy",
            Duration::from_secs(60),
            || async { Ok(aps.get_opt(name).await.ok().flatten()) },
        )
        .await?;
    assert_eq!(
        ap.annotations().get("istio.io/dry-run").map(String::as_str),
        Some("true")
    );
    assert_eq!(ap.spec.action.as_deref(), Some("ALLOW"));
    assert_eq!(
        ap.spec.selector.as_ref().unwrap().match_labels["app"],
        "http-server"
    );
    assert_eq!(ap.spec.rules, policy.spec.istio.as_ref().unwrap().rules);
    assert_eq!(
        ap.owner_references()[0].uid,
        policies.get(name).await?.uid().unwrap()
    );

    // Protect removes the dry-run annotation and changes nothing else; monitor puts it back.
    set_mode(&policies, name, PolicyMode::Protect).await?;
    let protected = ns
        .wait_for("the dry-run annotation to go", WAIT, || async {
            let ap = aps.get(name).await?;
            Ok((!ap.annotations().contains_key("istio.io/dry-run")).then_some(ap))
        })
        .await?;
    assert_eq!(protected.spec, ap.spec);
    set_mode(&policies, name, PolicyMode::Monitor).await?;
    ns.wait_for("the dry-run annotation to return", WAIT, || async {
        let ap = aps.get(name).await?;
        Ok(ap
            .annotations()
            .contains_key("istio.io/dry-run")
            .then_some(()))
    })
    .await?;

    // Deleting the policy garbage-collects the AuthorizationPolicy.
    policies.delete(name, &DeleteParams::foreground()).await?;
    ns.wait_for(
        "garbage collection of the AuthorizationPolicy",
        Duration::from_secs(60),
        || async { Ok(aps.get_opt(name).await?.is_none().then_some(())) },
    )
    .await?;
    crds.delete(crd_name, &DeleteParams::default()).await?;
    Ok(())
}

/// A protect policy for `target`, edited by `edit` (the spec as JSON).
fn protect_policy(
    ns: &str,
    name: &str,
    target: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> WorkloadNetworkPolicy {
    let mut policy = serde_json::to_value(policy_from_json(ns, name, target, "protect")).unwrap();
    edit(&mut policy["spec"]);
    serde_json::from_value(policy).unwrap()
}

/// The condition of `type_` once its reason is `reason`: (status, message).
async fn wait_for_condition(
    ns: &TestNamespace,
    name: &str,
    type_: &str,
    reason: &str,
) -> Result<(String, String)> {
    let policies = ns.api::<WorkloadNetworkPolicy>();
    ns.wait_for(
        &format!("{name}: {type_} reason {reason}"),
        WAIT,
        || async {
            Ok(policies
                .get(name)
                .await?
                .status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
                .filter(|c| c.reason == reason)
                .map(|c| (c.status, c.message)))
        },
    )
    .await
}

/// The note of the Warning Event `reason` about object `name`.
async fn wait_for_warning(ns: &TestNamespace, name: &str, reason: &str) -> Result<String> {
    let events = ns.api::<Event>();
    ns.wait_for(
        &format!("a Warning Event {reason} about {name}"),
        WAIT,
        || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .and_then(|e| e.note))
        },
    )
    .await
}

/// The API server accepts what the CEL rules would refuse (v1.20 runs none; the fixture strips them):
/// the controller refuses each example itself, with the rule's message, a Warning Event, and nothing
/// rendered or promoted.
#[tokio::test]
async fn invalid_policies_and_proposals_are_refused_not_rendered() -> Result<()> {
    let ns = TestNamespace::create_with_crds("invalid").await?;
    let _controller = start_controller(&ns);
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let netpols = ns.api::<NetworkPolicy>();

    let cases: Vec<(&str, WorkloadNetworkPolicy, &str)> = vec![
        (
            // Rendered, it would isolate every pod of the namespace.
            "empty-pod-selector",
            protect_policy(&ns.name, "empty-pod-selector", "web", |s| {
                s["kubernetes"]["podSelector"] = json!({})
            }),
            rules::POD_SELECTOR_NOT_EMPTY_MSG,
        ),
        (
            "ingress-with-egress-types",
            protect_policy(&ns.name, "ingress-with-egress-types", "api", |s| {
                s["kubernetes"]["policyTypes"] = json!(["Egress"])
            }),
            rules::POLICY_TYPES_MSG,
        ),
        (
            "both-payloads",
            protect_policy(&ns.name, "both-payloads", "db", |s| {
                s["istio"] = json!({"selector": {"matchLabels": {"app": "db"}}, "rules": []})
            }),
            rules::ONE_PAYLOAD_MSG,
        ),
        (
            // Without the CRD check first, this reported AuthorizationPolicyCRDMissing.
            "istio-egress",
            protect_policy(&ns.name, "istio-egress", "cache", |s| {
                s["backend"] = json!("istio");
                s["direction"] = json!("Egress");
                s.as_object_mut().unwrap().remove("kubernetes");
                s["istio"] = json!({"selector": {"matchLabels": {"app": "cache"}}, "rules": []});
            }),
            rules::ISTIO_INGRESS_ONLY_MSG,
        ),
    ];
    for (name, policy, _) in &cases {
        policies
            .create(&PostParams::default(), policy)
            .await
            .with_context(|| format!("v1.20 accepts {name}"))?;
    }
    for (name, _, message) in &cases {
        let (status, text) = wait_for_condition(&ns, name, "Ready", "Invalid").await?;
        assert_eq!(status, "False", "{name}");
        assert!(text.starts_with(message), "{name}: {text}");
        assert!(text.contains("Nothing is rendered"), "{name}: {text}");
        let note = wait_for_warning(&ns, name, "Invalid").await?;
        assert!(note.starts_with(message), "{name}: {note}");
    }
    // Nothing was rendered for any of them: no NetworkPolicy at all in the namespace, and no
    // AuthorizationPolicy (whose kind exists here only while the istio test runs).
    assert_eq!(netpols.list(&ListParams::default()).await?.items.len(), 0);
    let aps = ns.api::<AuthorizationPolicy>();
    assert!(aps.get_opt("istio-egress").await.ok().flatten().is_none());

    // An invalid proposal labelled for promotion is not promoted.
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let name = "deployment-http-client-egress";
    let mut proposal = kubernetes_proposal(&ns.name, name, Some("protect"));
    proposal.spec.kubernetes.as_mut().unwrap().pod_selector = Some(Default::default());
    proposals.create(&PostParams::default(), &proposal).await?;
    let promoted = ns
        .wait_for("the Promoted condition", WAIT, || async {
            let p = proposals.get(name).await?;
            Ok(p.status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Promoted")))
        })
        .await?;
    assert_eq!(
        (promoted.status.as_str(), promoted.reason.as_str()),
        ("False", "Invalid")
    );
    assert!(
        promoted
            .message
            .starts_with(rules::POD_SELECTOR_NOT_EMPTY_MSG),
        "{}",
        promoted.message
    );
    let note = wait_for_warning(&ns, name, "Invalid").await?;
    assert!(
        note.starts_with(rules::POD_SELECTOR_NOT_EMPTY_MSG),
        "{note}"
    );
    assert!(policies.get_opt(name).await?.is_none(), "not promoted");
    assert!(
        proposals.get_opt(name).await?.is_some(),
        "the proposal stays"
    );
    assert_eq!(netpols.list(&ListParams::default()).await?.items.len(), 0);
    Ok(())
}

/// A policy that becomes invalid keeps what its last valid generation rendered (as it would where the
/// API server refuses the update); a changed backend is refused; a rendering without the
/// rendered-generation annotation (an older controller's, possibly of the invalid spec) is removed.
#[tokio::test]
async fn a_policy_that_becomes_invalid_keeps_its_last_valid_rendering() -> Result<()> {
    let ns = TestNamespace::create_with_crds("invalid-edit").await?;
    let _controller = start_controller(&ns);
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let netpols = ns.api::<NetworkPolicy>();
    let name = "web-ingress";
    policies
        .create(
            &PostParams::default(),
            &policy_from_json(&ns.name, name, "web", "protect"),
        )
        .await?;
    let rendered = ns
        .wait_for("the NetworkPolicy", WAIT, || async {
            Ok(netpols.get_opt(name).await?)
        })
        .await?;
    assert_eq!(
        rendered.annotations().get(RENDERED_GENERATION_ANNOTATION),
        Some(&"1".to_string())
    );

    // Edited into an empty podSelector: refused, the generation-1 NetworkPolicy stays as it was.
    let edit = json!({"spec": {"kubernetes": {"podSelector": {"matchLabels": null}}}});
    policies
        .patch(name, &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    let (_, message) = wait_for_condition(&ns, name, "Ready", "Invalid").await?;
    assert!(
        message.starts_with(rules::POD_SELECTOR_NOT_EMPTY_MSG),
        "{message}"
    );
    assert!(
        message.ends_with(&format!(
            "stays in force until the policy is fixed: NetworkPolicy {name} (rendered from generation 1)"
        )),
        "{message}"
    );
    wait_for_warning(&ns, name, "Invalid").await?;
    let kept = netpols.get(name).await?;
    assert_eq!(kept.spec, rendered.spec, "the last valid rendering is kept");

    // Fixed: rendered again from the new generation.
    let fix = json!({"spec": {"kubernetes": {"podSelector": {"matchLabels": {"app": "web", "tier": "front"}}}}});
    policies
        .patch(name, &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    wait_for_condition(&ns, name, "Ready", "Rendered").await?;
    let np = netpols.get(name).await?;
    assert_eq!(
        np.annotations().get(RENDERED_GENERATION_ANNOTATION),
        Some(&"3".to_string())
    );

    // The backend is immutable: switching to istio (payload and all) is refused, the NetworkPolicy stays.
    let switch = json!({"spec": {"backend": "istio", "kubernetes": null,
        "istio": {"selector": {"matchLabels": {"app": "web"}}, "rules": []}}});
    policies
        .patch(name, &PatchParams::default(), &Patch::Merge(&switch))
        .await?;
    let (_, message) = wait_for_condition(&ns, name, "Ready", "Invalid").await?;
    assert!(
        message.starts_with(rules::BACKEND_IMMUTABLE_MSG),
        "{message}"
    );
    assert!(netpols.get_opt(name).await?.is_some());

    // A restarted controller remembers nothing, yet the NetworkPolicy it owns shows the old backend.
    // A spec change (generation 5) proves the new controller has looked at it.
    drop(_controller);
    let _controller = start_controller(&ns);
    let rules_edit =
        json!({"spec": {"istio": {"rules": [{"to": [{"operation": {"ports": ["8080"]}}]}]}}});
    policies
        .patch(name, &PatchParams::default(), &Patch::Merge(&rules_edit))
        .await?;
    let ready = ns
        .wait_for("Ready for generation 5", WAIT, || async {
            Ok(policies
                .get(name)
                .await?
                .status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
                .filter(|c| c.observed_generation == Some(5)))
        })
        .await?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Invalid")
    );
    assert!(
        ready.message.starts_with(rules::BACKEND_IMMUTABLE_MSG),
        "{}",
        ready.message
    );
    assert!(netpols.get_opt(name).await?.is_some());

    // A rendering an older controller made for an invalid policy (no rendered-generation annotation):
    // removed, not kept.
    let old = "old-render";
    let invalid = protect_policy(&ns.name, old, "api", |s| {
        s["kubernetes"]["podSelector"] = json!({})
    });
    let invalid = policies.create(&PostParams::default(), &invalid).await?;
    wait_for_condition(&ns, old, "Ready", "Invalid").await?;
    let leftover: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": old, "namespace": ns.name,
                     "labels": {"app.kubernetes.io/managed-by": "network-enforcer"},
                     "ownerReferences": [{"apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
                                          "kind": "WorkloadNetworkPolicy", "name": old,
                                          "uid": invalid.uid().unwrap(), "controller": true}]},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}
    }))?;
    netpols.create(&PostParams::default(), &leftover).await?;
    ns.wait_for(
        "the unannotated rendering of the invalid policy to be removed",
        WAIT,
        || async { Ok(netpols.get_opt(old).await?.is_none().then_some(())) },
    )
    .await?;
    Ok(())
}

/// An invalid policy never shadows a valid one of the same target and direction, however old it is
/// (docs/behaviour.md §4.3): when the policy in force becomes invalid, the valid duplicate takes over and
/// the invalid one's rendering goes (both would be in force otherwise); fixed, the oldest governs again.
/// On every path every condition is set anew (docs/behaviour.md §5.1).
#[tokio::test]
async fn an_invalid_policy_does_not_shadow_a_valid_one() -> Result<()> {
    let ns = TestNamespace::create_with_crds("invalid-dup").await?;
    let _controller = start_controller(&ns);
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let netpols = ns.api::<NetworkPolicy>();
    let (old, new) = ("web-old", "web-new");
    policies
        .create(
            &PostParams::default(),
            &policy_from_json(&ns.name, old, "web", "protect"),
        )
        .await?;
    wait_for_condition(&ns, old, "Ready", "Rendered").await?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // creation timestamps have 1 s resolution
    policies
        .create(
            &PostParams::default(),
            &policy_from_json(&ns.name, new, "web", "protect"),
        )
        .await?;
    wait_for_condition(&ns, new, "DuplicateTarget", "DuplicateTarget").await?;
    assert!(netpols.get_opt(new).await?.is_none());

    // The older one becomes invalid (v1.20 runs no CEL): the newer, valid one governs.
    let edit = json!({"spec": {"kubernetes": {"podSelector": {"matchLabels": null}}}});
    policies
        .patch(old, &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    wait_for_condition(&ns, new, "Ready", "Rendered").await?;
    let (status, _) = wait_for_condition(&ns, new, "DuplicateTarget", "UniqueTarget").await?;
    assert_eq!(status, "False");
    let (_, message) = wait_for_condition(&ns, old, "Ready", "Invalid").await?;
    assert!(message.contains("Nothing is rendered"), "{message}");
    ns.wait_for(
        "the invalid policy's rendering to be removed",
        WAIT,
        || async { Ok(netpols.get_opt(old).await?.is_none().then_some(())) },
    )
    .await?;
    // Every condition it had in force is set anew, none left over.
    let (status, message) =
        wait_for_condition(&ns, old, "DuplicateTarget", "DuplicateTarget").await?;
    assert_eq!(status, "True");
    assert!(message.starts_with(&format!("policy {new} ")), "{message}");
    for type_ in ["SelectorOverlapsWorkload", "UnusedRules", "WouldBlock"] {
        let (status, _) = wait_for_condition(&ns, old, type_, "Invalid").await?;
        assert_eq!(status, "False", "{type_}");
    }

    // Fixed: it is the oldest valid one again and governs; the newer one is a duplicate again.
    let fix = json!({"spec": {"kubernetes": {"podSelector": {"matchLabels": {"app": "web"}}}}});
    policies
        .patch(old, &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    wait_for_condition(&ns, old, "Ready", "Rendered").await?;
    wait_for_condition(&ns, new, "DuplicateTarget", "DuplicateTarget").await?;
    ns.wait_for("the duplicate's rendering to be removed", WAIT, || async {
        Ok(netpols.get_opt(new).await?.is_none().then_some(()))
    })
    .await?;

    // The duplicate becomes invalid, then its winner goes: DuplicateTarget follows, on the invalid
    // path too (it stayed True before).
    policies
        .patch(new, &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    wait_for_condition(&ns, new, "Ready", "Invalid").await?;
    let (status, _) = wait_for_condition(&ns, new, "DuplicateTarget", "DuplicateTarget").await?;
    assert_eq!(status, "True");
    policies.delete(old, &DeleteParams::default()).await?;
    let (status, _) = wait_for_condition(&ns, new, "DuplicateTarget", "UniqueTarget").await?;
    assert_eq!(status, "False");
    assert!(
        netpols.get_opt(new).await?.is_none(),
        "invalid: nothing rendered"
    );
    Ok(())
}

/// The uninstall clean-up's stop of the controller: a Failed pod of the controller (an evicted pod
/// stays in the API until garbage-collected) runs nothing and must not hold the wait; when a pod does
/// keep running past the timeout, nothing is deleted and the Deployment gets its replicas back, so a
/// failed `helm uninstall` leaves the release as it was.
#[tokio::test]
async fn stopping_the_controller_ignores_failed_pods_and_restores_it_when_it_cannot_stop()
-> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let ns = TestNamespace::create_with_crds("uninstall-stop").await?;
    let deployments = ns.api::<Deployment>();
    let pods = ns.api::<Pod>();
    // Its own pods can never be scheduled (no node has the label): scaling to 0 removes them at once.
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "ctl", "namespace": ns.name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "ctl"}},
            "template": {
                "metadata": {"labels": {"app": "ctl"}},
                "spec": {"nodeSelector": {"network-enforcer.test/nowhere": "true"},
                         "containers": [{"name": "c", "image": "none", "imagePullPolicy": "Never"}]}
            }
        }
    }))?;
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    // Controller pods on a node with no kubelet: their phase is whatever the test says.
    let ghost_pod = |name: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns.name, "labels": {"app": "ctl"}},
            "spec": {"nodeName": "ghost-node", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "none"}]}
        }))?)
    };
    let set_phase = |name: String, phase: &'static str| {
        let pods = pods.clone();
        async move {
            pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
        }
    };
    pods.create(&PostParams::default(), &ghost_pod("ctl-evicted")?)
        .await?;
    set_phase("ctl-evicted".into(), "Failed").await?;

    let controller = uninstall::ControllerDeployment {
        namespace: ns.name.clone(),
        name: "ctl".into(),
        timeout: Duration::from_secs(20),
    };
    let stopped = uninstall::stop_controller(&ns.client, &controller)
        .await
        .context("a Failed pod held the stop")?
        .context("the Deployment exists")?;
    assert_eq!(stopped.replicas, 2);

    // Now a pod that keeps running: the clean-up gives up, deletes nothing, and scales back up.
    deployments
        .patch_scale(
            "ctl",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await?;
    pods.create(&PostParams::default(), &ghost_pod("ctl-stuck")?)
        .await?;
    set_phase("ctl-stuck".into(), "Running").await?;
    // What the controller rendered for a policy (no controller runs in this test to render it).
    let policy = ns
        .api::<WorkloadNetworkPolicy>()
        .create(
            &PostParams::default(),
            &policy_from_json(&ns.name, "p", "x", "protect"),
        )
        .await?;
    let netpols = ns.api::<NetworkPolicy>();
    let rendered: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "rendered", "namespace": ns.name,
                     "labels": {"app.kubernetes.io/managed-by": "network-enforcer"},
                     "ownerReferences": [{"apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
                        "kind": "WorkloadNetworkPolicy", "name": "p", "controller": true,
                        "uid": policy.uid()}]},
        "spec": {"podSelector": {"matchLabels": {"app": "x"}}, "policyTypes": ["Ingress"]}
    }))?;
    netpols.create(&PostParams::default(), &rendered).await?;
    let short = uninstall::ControllerDeployment {
        timeout: Duration::from_secs(2),
        ..controller
    };
    let err = uninstall::uninstall(&ns.client, Some(&short), Some(&ns.name))
        .await
        .expect_err("a controller pod still runs");
    assert!(
        matches!(err, uninstall::Error::StillRunning { .. }),
        "{err}"
    );
    assert!(
        netpols.get_opt("rendered").await?.is_some(),
        "nothing is deleted while a controller may still run"
    );
    let replicas = deployments
        .get_scale("ctl")
        .await?
        .spec
        .and_then(|s| s.replicas);
    assert_eq!(replicas, Some(2), "the controller is scaled back up");

    for name in ["ctl-evicted", "ctl-stuck"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    Ok(())
}

/// With a signing key, only proposals whose spec the controller signed are promoted (docs/install.md,
/// "Who can promote what"); against the real API server, so the signature survives the round trip.
#[tokio::test]
async fn only_proposals_the_controller_signed_are_promoted() -> Result<()> {
    use network_enforcer_controller::learn::provenance::SigningKey;
    let ns = TestNamespace::create_with_crds("provenance").await?;
    let key = std::sync::Arc::new(SigningKey::new(&[42u8; 32]).expect("a key"));
    let settings = Settings {
        namespace: Some(ns.name.clone()),
        signing_key: Some(key.clone()),
        ..Settings::default()
    };
    let _controller = run_controller(&ns, settings);
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let promoted_condition = |name: &'static str| {
        let proposals = proposals.clone();
        async move {
            let p = proposals.get(name).await?;
            Ok(p.status.and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "Promoted")
                    .map(|c| (c.status, c.reason))
            }))
        }
    };

    // Written by hand: refused, no policy.
    let hand = "deployment-http-client-egress";
    proposals
        .create(
            &PostParams::default(),
            &kubernetes_proposal(&ns.name, hand, Some("protect")),
        )
        .await?;
    let refused = ns
        .wait_for("the hand-written proposal to be refused", WAIT, || {
            promoted_condition(hand)
        })
        .await?;
    assert_eq!(refused, ("False".into(), "NotLearned".into()));
    assert!(policies.get_opt(hand).await?.is_none());

    // Signed as the controller's writer signs, then edited: refused as edited.
    let edited = "deployment-http-server-egress";
    let mut signed = kubernetes_proposal(&ns.name, edited, None);
    key.sign_into(&mut signed);
    proposals.create(&PostParams::default(), &signed).await?;
    let widen = json!({"spec": {"kubernetes": {"egress": [{}]}},
                       "metadata": {"labels": {PROMOTE_LABEL: "monitor"}}});
    proposals
        .patch(edited, &PatchParams::default(), &Patch::Merge(&widen))
        .await?;
    let refused = ns
        .wait_for("the edited proposal to be refused", WAIT, || {
            promoted_condition(edited)
        })
        .await?;
    assert_eq!(refused, ("False".into(), "EditedAfterLearning".into()));
    assert!(policies.get_opt(edited).await?.is_none());

    // Signed and untouched but for the label: promoted.
    let learned = "deployment-web-egress";
    let mut signed = kubernetes_proposal(&ns.name, learned, None);
    key.sign_into(&mut signed);
    proposals.create(&PostParams::default(), &signed).await?;
    let label = json!({"metadata": {"labels": {PROMOTE_LABEL: "monitor"}}});
    proposals
        .patch(learned, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let policy = ns
        .wait_for("the learned proposal to be promoted", WAIT, || async {
            Ok(policies.get_opt(learned).await?)
        })
        .await?;
    assert_eq!(policy.spec.kubernetes, signed.spec.kubernetes);
    Ok(())
}
