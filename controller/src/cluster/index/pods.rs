//! Pods: adding, updating and forgetting them, and what each carries (owner, endpoint).

use super::*;

impl Index {
    /// Adds or updates a pod, at time `now_ms`.
    pub fn apply_pod(&mut self, pod: &Pod, now_ms: i64) {
        let spec = pod.spec.as_ref();
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let ips = network_enforcer_api::pod::ips(pod);
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let terminated = network_enforcer_api::pod::finished(pod);
        let controller = controller_ref(pod.metadata.owner_references.as_ref());
        let controller_kind = controller.as_ref().map(|(kind, _)| kind.to_string());
        let job = match controller {
            Some(("Job", r)) => Some(r),
            _ => None,
        };
        // The one workload model (`workload::unit_of`); a bare pod's unit is itself, kept as no owner.
        let owner = workload::unit_of(pod, |job| {
            self.jobs
                .get(&(key.0.clone(), job.to_string()))
                .and_then(|j| j.cronjob.as_ref())
                .map(|c| c.name.clone())
        })
        .filter(|w| w.kind != WorkloadKind::Pod);
        let foreign_controller = controller_kind.filter(|_| owner.is_none());
        let mut info = PodRecord {
            namespace: key.0.clone(),
            name: key.1.clone(),
            uid: pod.uid().unwrap_or_default(),
            generate_name: pod.metadata.generate_name.clone().unwrap_or_default(),
            labels: pod.labels().clone(),
            ips: ips.clone(),
            node: spec.and_then(|s| s.node_name.clone()),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            owner,
            job,
            foreign_controller,
            ports: spec
                .into_iter()
                .flat_map(|s| s.containers.iter())
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|p| {
                    Some((
                        p.name.clone()?,
                        u16::try_from(p.container_port).ok()?,
                        protocol(p.protocol.as_deref()),
                    ))
                })
                .collect(),
            host_network,
            terminated,
            endpoint: Arc::default(),
        };
        let endpoint = self.compute_endpoint(&info);
        info.endpoint = self.intern(endpoint);
        let info = Arc::new(info);
        // Host-network pods share the node's IP: the IP says nothing about which pod it is.
        if !host_network && !terminated {
            for ip in &ips {
                let leases = self.leases.entry(*ip).or_default();
                let current = leases.iter().any(|l| l.pod == key && l.until.is_none());
                if !current {
                    for l in leases.iter_mut().filter(|l| l.until.is_none()) {
                        l.until = Some(now_ms);
                        self.next_expiry = self.next_expiry.min(now_ms + IP_HISTORY_MS);
                    }
                    leases.push(IpLease {
                        pod: key.clone(),
                        record: info.clone(),
                        since: now_ms,
                        until: None,
                    });
                }
            }
        }
        let old = self.pods.remove(&key);
        if let Some(old) = &old {
            let released: Vec<IpAddr> = old
                .ips
                .iter()
                .filter(|ip| terminated || !ips.contains(ip))
                .copied()
                .collect();
            self.release(&key, &released, now_ms);
            self.unlink(old);
        }
        self.deleted.remove(&key);
        if !info.uid.is_empty() {
            self.uids.insert(info.uid.clone(), key.clone());
        }
        self.link(&info);
        let before_ips: &[IpAddr] = old.as_deref().map_or(&[], |o| &o.ips);
        self.put_pod(&key, info, before_ips);
        self.update_backends_of(&key, old.as_deref());
        self.forget_expired(now_ms);
    }

    /// Removes a pod; its IPs keep resolving to it for [`IP_HISTORY_MS`].
    pub fn delete_pod(&mut self, namespace: &str, name: &str, now_ms: i64) {
        let key = (namespace.to_string(), name.to_string());
        let old = self.pods.get(&key).cloned();
        if let Some(old) = &old {
            self.release(&key, &old.ips, now_ms);
        }
        // Keep the PodRecord for the IP history window, so late records still resolve.
        self.deleted.insert(key.clone(), now_ms);
        self.next_expiry = self.next_expiry.min(now_ms + IP_HISTORY_MS);
        self.update_backends_of(&key, old.as_ref());
        self.forget_expired(now_ms);
    }

    /// Stores `pod` as the newest record of `key`, also in the leases it holds on its addresses and
    /// on `before_ips` (those of its previous record: a late record for one still finds it).
    pub(super) fn put_pod(&mut self, key: &PodName, pod: Arc<PodRecord>, before_ips: &[IpAddr]) {
        for ip in pod.ips.iter().chain(before_ips) {
            let Some(leases) = self.leases.get_mut(ip) else {
                continue;
            };
            for lease in leases.iter_mut().filter(|l| l.pod == *key) {
                lease.record = pod.clone();
            }
        }
        self.pods.insert(key.clone(), pod);
    }

    pub(super) fn release(&mut self, key: &PodName, ips: &[IpAddr], now_ms: i64) {
        for ip in ips {
            for l in self.leases.entry(*ip).or_default().iter_mut() {
                if &l.pod == key && l.until.is_none() {
                    l.until = Some(now_ms);
                    self.next_expiry = self.next_expiry.min(now_ms + IP_HISTORY_MS);
                }
            }
        }
    }

    /// Records `pod` in the per-namespace, per-workload and per-Job sets.
    pub(super) fn link(&mut self, pod: &PodRecord) {
        self.pods_in_namespace
            .entry(pod.namespace.clone())
            .or_default()
            .insert(pod.name.clone());
        if let Some(w) = &pod.owner {
            self.pods_of_workload
                .entry((pod.namespace.clone(), w.kind, w.name.clone()))
                .or_default()
                .insert(pod.name.clone());
            if let Some(node) = &pod.node {
                self.nodes_of_workload.add(&pod.namespace, w, node);
            }
        }
        if let Some(j) = &pod.job {
            self.pods_of_job
                .entry((pod.namespace.clone(), j.name.clone()))
                .or_default()
                .insert(pod.name.clone());
        }
        if !pod.generate_name.is_empty() {
            self.pods_generated_as
                .entry((pod.namespace.clone(), pod.generate_name.clone()))
                .or_default()
                .insert(pod.name.clone());
        }
    }

    /// Undoes [`Index::link`].
    pub(super) fn unlink(&mut self, pod: &PodRecord) {
        remove_from(&mut self.pods_in_namespace, &pod.namespace, &pod.name);
        if let Some(w) = &pod.owner {
            let key = (pod.namespace.clone(), w.kind, w.name.clone());
            remove_from(&mut self.pods_of_workload, &key, &pod.name);
            if let Some(node) = &pod.node {
                self.nodes_of_workload.remove(&pod.namespace, w, node);
            }
        }
        if let Some(j) = &pod.job {
            let key = (pod.namespace.clone(), j.name.clone());
            remove_from(&mut self.pods_of_job, &key, &pod.name);
        }
        let key = (pod.namespace.clone(), pod.generate_name.clone());
        remove_from(&mut self.pods_generated_as, &key, &pod.name);
    }

    /// Forgets IP history and deleted pods older than [`IP_HISTORY_MS`] (also done on every pod change).
    /// Scans only when something has expired since the last scan, so a pod change costs no walk over
    /// every IP.
    pub fn forget_expired(&mut self, now_ms: i64) {
        if now_ms <= self.next_expiry {
            return;
        }
        let mut next = i64::MAX;
        self.leases.retain(|_, leases| {
            leases.retain(|l| l.until.is_none_or(|u| u + IP_HISTORY_MS >= now_ms));
            for u in leases.iter().filter_map(|l| l.until) {
                next = next.min(u + IP_HISTORY_MS);
            }
            !leases.is_empty()
        });
        for at in self.deleted.values() {
            if *at + IP_HISTORY_MS >= now_ms {
                next = next.min(*at + IP_HISTORY_MS);
            }
        }
        self.next_expiry = next;
        let expired: Vec<PodName> = self
            .deleted
            .iter()
            .filter(|(_, at)| **at + IP_HISTORY_MS < now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.deleted.remove(&key);
            if let Some(pod) = self.pods.remove(&key) {
                self.uids.remove(&pod.uid);
                self.unlink(&pod);
                if let Some(job) = &pod.job {
                    let job_key = (pod.namespace.clone(), job.name.clone());
                    if !self.pods_of_job.contains_key(&job_key)
                        && self.jobs.get(&job_key).is_some_and(|j| j.deleted)
                    {
                        self.jobs.remove(&job_key);
                    }
                }
            }
        }
        self.sweep_interned();
    }

    /// The shared, interned form of `endpoint`. The interner is swept of endpoints nobody else holds
    /// whenever it has doubled since the last sweep, so its size stays proportional to the live ones.
    pub(super) fn intern(&mut self, endpoint: WorkloadEndpoint) -> Arc<WorkloadEndpoint> {
        if let Some(shared) = self.interned.get(&endpoint) {
            return shared.clone();
        }
        let shared = Arc::new(endpoint);
        self.interned.insert(shared.clone());
        self.sweep_interned();
        shared
    }

    /// Drops interned endpoints nobody else holds, once the interner has grown past twice the pods (each
    /// pod holds one) and twice its size after the last sweep (endpoints pending in the writer may keep
    /// it from shrinking): amortized constant per pod change.
    pub(super) fn sweep_interned(&mut self) {
        if self.interned.len() > 2 * self.pods.len().max(self.interned_swept) + 64 {
            self.interned.retain(|e| Arc::strong_count(e) > 1);
            self.interned_swept = self.interned.len();
        }
    }

    /// The workload a Job's pod belongs to: the Job's CronJob when the index knows the Job has one, else
    /// the Job itself.
    pub(super) fn job_owner(&self, namespace: &str, job: &str) -> Workload {
        match self
            .jobs
            .get(&(namespace.to_string(), job.to_string()))
            .and_then(|j| j.cronjob.as_ref())
        {
            Some(cronjob) => Workload {
                kind: WorkloadKind::CronJob,
                name: cronjob.name.clone(),
            },
            None => Workload {
                kind: WorkloadKind::Job,
                name: job.to_string(),
            },
        }
    }

    /// The workload endpoint of a pod, from its owner and what the index knows of that owner.
    pub(super) fn compute_endpoint(&self, pod: &PodRecord) -> WorkloadEndpoint {
        let Some(owner) = &pod.owner else {
            // A bare pod is its own unit: named after itself, owned by itself, selected by its labels
            // (NetworkPolicies select by label only; all of its labels is the narrowest selector there is).
            return WorkloadEndpoint {
                namespace: pod.namespace.clone(),
                kind: None,
                name: pod.name.clone(),
                uid: Some(pod.uid.clone())
                    .filter(|u| !u.is_empty() && pod.foreign_controller.is_none()),
                api_version: "v1".into(),
                selector: pod.labels.clone(),
                selector_expressions: String::new(),
                service_account: pod.service_account.clone(),
                foreign_controller: pod.foreign_controller.clone(),
            };
        };
        let info = self
            .workloads
            .get(&(pod.namespace.clone(), owner.kind, owner.name.clone()));
        let (selector, expressions) = match info {
            Some(w) => {
                let has_expressions = w
                    .selector
                    .match_expressions
                    .as_ref()
                    .is_some_and(|e| !e.is_empty());
                (
                    w.selector.match_labels.clone().unwrap_or_default(),
                    if has_expressions {
                        serde_json::to_string(&w.selector).unwrap_or_default()
                    } else {
                        String::new()
                    },
                )
            }
            // Not (yet) in the index: the best selector the pod itself tells.
            None => (
                match owner.kind {
                    WorkloadKind::Job | WorkloadKind::CronJob => without_run_labels(&pod.labels),
                    _ => pod.labels.clone(),
                },
                String::new(),
            ),
        };
        let job_ref = pod.job.as_ref().filter(|_| owner.kind == WorkloadKind::Job);
        WorkloadEndpoint {
            namespace: pod.namespace.clone(),
            kind: Some(owner.kind),
            name: owner.name.clone(),
            uid: info
                .map(|w| w.uid.clone())
                .or_else(|| job_ref.map(|j| j.uid.clone()))
                .filter(|u| !u.is_empty()),
            api_version: info
                .map(|w| w.api_version.clone())
                .or_else(|| job_ref.map(|j| j.api_version.clone()))
                .unwrap_or_else(|| default_api_version(owner.kind).into()),
            selector,
            selector_expressions: expressions,
            service_account: pod.service_account.clone(),
            foreign_controller: None,
        }
    }

    /// Recomputes the owner and endpoint of the pods `names` in `namespace` (their workload or Job
    /// changed), and the backends of the Services they are in.
    pub(super) fn refresh_pods(&mut self, namespace: &str, names: Vec<String>) {
        for name in names {
            let key = (namespace.to_string(), name);
            let Some(before) = self.pods.get(&key).cloned() else {
                continue;
            };
            let mut pod = before.clone();
            if let Some(job) = &pod.job {
                pod.owner = Some(self.job_owner(namespace, &job.name));
            }
            let endpoint = self.compute_endpoint(&pod);
            pod.endpoint = self.intern(endpoint);
            if pod == before {
                continue;
            }
            self.unlink(&before);
            self.link(&pod);
            // Same addresses as before: only owner and endpoint were computed again.
            self.put_pod(&key, Arc::new(pod), &[]);
            self.update_backends_of(&key, Some(&before));
        }
    }

    /// A pod by uid (also one deleted within [`IP_HISTORY_MS`]).
    pub fn pod_by_uid(&self, uid: &str) -> Option<&Arc<PodRecord>> {
        self.uids
            .get(uid)
            .and_then(|key| self.pods.get_str(&key.0, &key.1))
    }

    /// Every pod held, live and recently deleted (see [`IP_HISTORY_MS`]): the violation evaluator's
    /// view is derived from these, so the index stays the one source of truth about pods.
    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values()
    }

    /// Per node, its pods that run now (not deleted, not finished), host-network pods included: what
    /// an agent of that node observes.
    pub fn running_pods_per_node(&self) -> std::collections::BTreeMap<String, usize> {
        let mut nodes = std::collections::BTreeMap::new();
        for pod in self.pods.values() {
            let Some(node) = pod.node.as_ref() else {
                continue;
            };
            if pod.terminated || !self.pod_exists(&pod.namespace, &pod.name) {
                continue;
            }
            *nodes.entry(node.clone()).or_insert(0) += 1;
        }
        nodes
    }

    /// Number of pods held (live and recently deleted).
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}
