//! Workloads (Deployments, StatefulSets, DaemonSets, Jobs and CronJobs) and what their pods inherit.

use super::*;

impl Index {
    /// Adds or updates a workload (its apiVersion: `apps/v1` for the apps kinds, else `batch/v1`).
    pub fn apply_workload(
        &mut self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
        uid: &str,
        selector: LabelSelector,
    ) {
        self.set_workload(
            (namespace.to_string(), kind, name.to_string()),
            Some(WorkloadInfo {
                uid: uid.to_string(),
                selector,
                api_version: default_api_version(kind).into(),
            }),
        );
    }

    /// Removes a workload.
    pub fn delete_workload(&mut self, namespace: &str, kind: WorkloadKind, name: &str) {
        self.set_workload((namespace.to_string(), kind, name.to_string()), None);
    }

    /// What the index knows of a workload.
    pub fn workload(
        &self,
        namespace: &str,
        kind: WorkloadKind,
        name: &str,
    ) -> Option<&WorkloadInfo> {
        self.workloads
            .get(&(namespace.to_string(), kind, name.to_string()))
    }

    pub(super) fn set_workload(&mut self, key: WorkloadKey, info: Option<WorkloadInfo>) {
        let changed = match info {
            Some(info) => self.workloads.insert(key.clone(), info.clone()) != Some(info),
            None => self.workloads.remove(&key).is_some(),
        };
        if changed {
            let names: Vec<String> = self
                .pods_of_workload
                .get(&key)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            self.refresh_pods(&key.0, names);
        }
    }

    /// Adds or updates a Deployment, StatefulSet or DaemonSet.
    pub fn apply_deployment(&mut self, d: &Deployment) {
        let sel = d.spec.selector.clone();
        self.apply_workload(
            &d.namespace().unwrap_or_default(),
            WorkloadKind::Deployment,
            &d.name_any(),
            &d.uid().unwrap_or_default(),
            sel,
        );
    }
    /// See [`Index::apply_deployment`].
    pub fn apply_statefulset(&mut self, s: &StatefulSet) {
        let sel = s.spec.selector.clone();
        self.apply_workload(
            &s.namespace().unwrap_or_default(),
            WorkloadKind::StatefulSet,
            &s.name_any(),
            &s.uid().unwrap_or_default(),
            sel,
        );
    }
    /// See [`Index::apply_deployment`].
    pub fn apply_daemonset(&mut self, d: &DaemonSet) {
        let sel = d.spec.selector.clone();
        self.apply_workload(
            &d.namespace().unwrap_or_default(),
            WorkloadKind::DaemonSet,
            &d.name_any(),
            &d.uid().unwrap_or_default(),
            sel,
        );
    }

    /// Adds or updates a Job. A Job made from a CronJob (see `cronjob_of`) makes its pods part of the
    /// CronJob; a Job of its own is the unit. Either way the selector is the Job's pod template labels
    /// without the per-run Job labels ([`without_run_labels`]): the CronJob's own object is not needed
    /// (`batch/v1` CronJobs do not exist on older API servers), and the Job's `spec.selector` (its
    /// `controller-uid`) would name this one run only.
    pub fn apply_job(&mut self, job: &Job) {
        let namespace = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let cronjob = cronjob_of(job.metadata.owner_references.as_ref());
        let template_labels = job
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.as_ref())
            .map(without_run_labels)
            .unwrap_or_default();
        let selector = LabelSelector {
            match_labels: Some(template_labels),
            match_expressions: None,
        };
        let (key, info) = match &cronjob {
            Some(c) => (
                (namespace.clone(), WorkloadKind::CronJob, c.name.clone()),
                WorkloadInfo {
                    uid: c.uid.clone(),
                    selector,
                    api_version: c.api_version.clone(),
                },
            ),
            None => (
                (namespace.clone(), WorkloadKind::Job, name.clone()),
                WorkloadInfo {
                    uid: job.uid().unwrap_or_default(),
                    selector,
                    api_version: "batch/v1".into(),
                },
            ),
        };
        self.set_workload(key, Some(info));
        let info = JobInfo {
            cronjob,
            deleted: false,
        };
        let job_key = (namespace.clone(), name);
        if self.jobs.insert(job_key.clone(), info.clone()) != Some(info) {
            let names: Vec<String> = self
                .pods_of_job
                .get(&job_key)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            self.refresh_pods(&namespace, names);
        }
    }

    /// Removes a Job (its CronJob, if any, stays known: its other runs still refer to it).
    pub fn delete_job(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(job) = self.jobs.get_mut(&key) else {
            return;
        };
        let standalone = job.cronjob.is_none();
        if self.pods_of_job.contains_key(&key) {
            job.deleted = true;
        } else {
            self.jobs.remove(&key);
        }
        if standalone {
            self.delete_workload(namespace, WorkloadKind::Job, name);
        }
    }
}
