//! Which workload a pod belongs to, as in the reference: a ReplicaSet named
//! `<deployment>-<pod-template-hash>` means its Deployment; StatefulSet and DaemonSet own their pods
//! directly; a Job's pods belong to its CronJob, else to the Job; a pod without a controller is its own
//! unit. One model for the controller's index, `check` (scenario and `--from-cluster`) and the
//! reconciler's overlap condition: [`unit_of`], with the Job → CronJob step from [`JobOwners`] or the
//! index's Jobs.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use network_enforcer_api::WorkloadKind;
use std::collections::BTreeMap;

/// A workload: kind and name, in the pod's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub name: String,
}

/// The workload that controls `pod`, or `None` for pods of kinds we do not resolve (bare pods, Jobs).
pub fn owner_of(pod: &Pod) -> Option<Workload> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    match owner.kind.as_str() {
        "ReplicaSet" => {
            // Only ReplicaSets a Deployment made carry the pod-template-hash suffix; a bare
            // ReplicaSet is not a workload we target.
            let hash = pod.metadata.labels.as_ref()?.get("pod-template-hash")?;
            let deployment = owner.name.strip_suffix(hash)?.strip_suffix('-')?;
            Some(Workload {
                kind: WorkloadKind::Deployment,
                name: deployment.to_string(),
            })
        }
        "StatefulSet" => Some(Workload {
            kind: WorkloadKind::StatefulSet,
            name: owner.name.clone(),
        }),
        "DaemonSet" => Some(Workload {
            kind: WorkloadKind::DaemonSet,
            name: owner.name.clone(),
        }),
        _ => None,
    }
}

/// The unit a policy targets that `pod` belongs to: its workload ([`owner_of`]), else a Job's CronJob
/// (`cronjob_of_job` names the CronJob of a Job in the pod's namespace, if any) or the Job itself,
/// else, for a pod without a controller, the pod itself. `None` for pods of other controllers.
pub fn unit_of(pod: &Pod, cronjob_of_job: impl Fn(&str) -> Option<String>) -> Option<Workload> {
    if let Some(w) = owner_of(pod) {
        return Some(w);
    }
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    match controller {
        None => Some(Workload {
            kind: WorkloadKind::Pod,
            name: pod.metadata.name.clone().unwrap_or_default(),
        }),
        Some(o) if o.kind == "Job" => Some(match cronjob_of_job(&o.name) {
            Some(cronjob) => Workload {
                kind: WorkloadKind::CronJob,
                name: cronjob,
            },
            None => Workload {
                kind: WorkloadKind::Job,
                name: o.name.clone(),
            },
        }),
        Some(_) => None,
    }
}

/// A Job's CronJob ownerReference: the controller one first, else one not marked `controller`. The
/// CronJob controller marks its scheduled runs' reference as controller; `kubectl create job
/// --from=cronjob/<name>` of v1.20 sets the reference without it, and such a manual run is still a run
/// of the CronJob.
pub fn cronjob_reference(refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter()
        .filter(|o| o.kind == "CronJob")
        .max_by_key(|o| o.controller == Some(true))
}

/// The CronJob each of a set of Jobs was made from ([`cronjob_reference`]), by namespace and Job
/// name: the Job → CronJob step of [`unit_of`] for callers that list Jobs rather than keep an index.
#[derive(Clone, Debug, Default)]
pub struct JobOwners(BTreeMap<(String, String), String>);

impl JobOwners {
    pub fn new<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Self {
        Self(
            jobs.into_iter()
                .filter_map(|job| {
                    let refs = job.metadata.owner_references.as_deref()?;
                    Some((
                        (
                            job.metadata.namespace.clone().unwrap_or_default(),
                            job.metadata.name.clone()?,
                        ),
                        cronjob_reference(refs)?.name.clone(),
                    ))
                })
                .collect(),
        )
    }

    /// The unit `pod` belongs to ([`unit_of`]), its Jobs' CronJobs looked up here.
    pub fn unit(&self, pod: &Pod) -> Option<Workload> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        unit_of(pod, |job| {
            self.0.get(&(namespace.clone(), job.to_string())).cloned()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(owner_kind: &str, owner_name: &str, hash: Option<&str>) -> Pod {
        let mut labels = serde_json::Map::new();
        if let Some(h) = hash {
            labels.insert("pod-template-hash".into(), json!(h));
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "p",
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": owner_kind, "name": owner_name,
                    "uid": "u", "controller": true
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn deployment_through_its_replicaset() {
        assert_eq!(
            owner_of(&pod(
                "ReplicaSet",
                "http-client-5d8f7c9b6",
                Some("5d8f7c9b6")
            )),
            Some(Workload {
                kind: WorkloadKind::Deployment,
                name: "http-client".into()
            })
        );
    }

    #[test]
    fn bare_replicaset_is_not_a_deployment() {
        assert_eq!(owner_of(&pod("ReplicaSet", "rs", None)), None);
        assert_eq!(owner_of(&pod("ReplicaSet", "rs-abc", Some("xyz"))), None);
    }

    #[test]
    fn statefulset_daemonset_and_others() {
        assert_eq!(
            owner_of(&pod("StatefulSet", "db", None)).map(|w| w.kind),
            Some(WorkloadKind::StatefulSet)
        );
        assert_eq!(
            owner_of(&pod("DaemonSet", "agent", None)).map(|w| w.kind),
            Some(WorkloadKind::DaemonSet)
        );
        assert_eq!(owner_of(&pod("Job", "j", None)), None);
        assert_eq!(owner_of(&Pod::default()), None);
    }

    #[test]
    fn units_of_jobs_cronjobs_and_bare_pods() {
        let cronjobs = |job: &str| (job == "tick-28000").then(|| "tick".to_string());
        let unit = |p: &Pod| unit_of(p, cronjobs).map(|w| (w.kind, w.name));
        assert_eq!(
            unit(&pod("Job", "tick-28000", None)),
            Some((WorkloadKind::CronJob, "tick".into()))
        );
        assert_eq!(
            unit(&pod("Job", "migrate", None)),
            Some((WorkloadKind::Job, "migrate".into()))
        );
        let mut bare = Pod::default();
        bare.metadata.name = Some("debug".into());
        assert_eq!(unit(&bare), Some((WorkloadKind::Pod, "debug".into())));
        assert_eq!(
            unit(&pod("StatefulSet", "db", None)),
            Some((WorkloadKind::StatefulSet, "db".into()))
        );
        // Another controller's pod is no unit of ours.
        assert_eq!(unit(&pod("ReplicaSet", "rs", None)), None);
    }
}
