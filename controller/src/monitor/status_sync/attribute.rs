//! Evidence passes: queued records attributed to the policies in force, as pending observations.

use super::*;

impl StatusSync {
    /// Observations waiting for policy `namespace/name`.
    pub fn pending(&self, namespace: &str, name: &str) -> usize {
        self.state
            .lock()
            .expect("state lock")
            .pending
            .len_of(&PolicyKey {
                namespace: namespace.into(),
                name: name.into(),
            })
    }

    /// The evaluator's view now (what [`StatusSync::sync_policy`] evaluates against).
    pub fn current_view(&self) -> ClusterView {
        let index = self.index.index.read().expect("index lock");
        self.view(&index)
    }

    /// The evaluator's view now: the index's pods, the watched namespaces, NetworkPolicies and
    /// ClusterNetworkPolicies.
    fn view(&self, index: &Index) -> ClusterView {
        let namespaces = self.namespaces.state();
        let network_policies = self.network_policies.state();
        let mut view = ClusterView::from_index(
            index,
            namespaces
                .iter()
                .map(|ns| (ns.name_any(), ns.labels().clone())),
            network_policies
                .iter()
                .filter_map(|np| NamedPolicy::from_network_policy(np)),
        );
        let mut invalid = BTreeMap::new();
        for policy in self.cluster_policies.state() {
            if let Some(policy) = NamedClusterPolicy::from_object(&policy) {
                if let Err(why) = netpol::cluster::ClusterPolicy::parse(&policy.name, &policy.spec)
                {
                    invalid.insert(policy.name.clone(), why.to_string());
                }
                view.insert_cluster_policy(policy);
            }
        }
        self.note_invalid_cluster_policies(invalid);
        view.set_ip_blocks_match_pods(self.settings.ip_blocks_match_pods);
        view
    }

    /// Reports ClusterNetworkPolicies that apply to nothing (a spec the API server would refuse,
    /// admitted where it does not run the CRD's CEL rules): judged fail-closed like the agent does,
    /// logged once each time the set changes, counted in `cluster_policies_invalid`.
    fn note_invalid_cluster_policies(&self, invalid: BTreeMap<String, String>) {
        self.metrics
            .cluster_policies_invalid
            .set(invalid.len() as i64);
        let mut last = self.invalid_cluster_policies.lock().expect("invalid lock");
        if *last == invalid {
            return;
        }
        for (name, why) in &invalid {
            if last.get(name) != Some(why) {
                tracing::warn!(policy = %name, %why, "ClusterNetworkPolicy is invalid: it applies to nothing (as the agent enforces it)");
            }
        }
        *last = invalid;
    }

    /// Attributes the queued records to the policies in force; returns how many observations were
    /// queued for a status patch. Until every watch it reads has listed ([`StatusSync::listed`]) it
    /// does nothing: the records stay queued (and unacknowledged), since against a store not listed
    /// yet a record finds no policy, and its batch would be acknowledged without its violation.
    pub fn attribute_evidence(&self) -> usize {
        if !self.is_ready() {
            return 0;
        }
        if self.started.get().is_none() {
            self.seed_history();
        }
        let (records, drain) = self.queue.drain_numbered();
        let policies = self.policies.state();
        let proposals = self.monitored_proposals();
        // A strict protect policy the gate holds renders nothing yet: what it sees counts as monitor's.
        let held = self.held.lock().expect("held lock").clone();
        let as_monitor: Vec<WorkloadNetworkPolicy> = policies
            .iter()
            .filter(|p| held.contains(&policy_key(p)))
            .map(|p| {
                let mut p = p.as_ref().clone();
                p.spec.mode = PolicyMode::Monitor;
                p
            })
            .collect();
        let set = {
            let backends = self.settings.backends.lock().expect("backends lock");
            PolicySet::judged(
                policies
                    .iter()
                    .filter(|p| !held.contains(&policy_key(p)))
                    .map(|p| p.as_ref())
                    .chain(&as_monitor),
                |p| backends.is_valid(p),
            )
        };
        self.metrics.policies_evaluated.set(policies.len() as i64);
        if records.is_empty() {
            let number = drain.number();
            drop(drain);
            self.settle_if_written(number);
            return 0;
        }
        let backends: HashMap<PolicyKey, Backend> = policies
            .iter()
            .map(|p| (policy_key(p), p.spec.backend))
            .collect();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let index = self.index.index.read().expect("index lock");
        let view = self.view(&index);
        let monitored = Self::monitored_view(&view, &proposals);
        let mut state = self.state.lock().expect("state lock");
        let mut history = self.history.lock().expect("history lock");
        let mut queued = 0;
        let mut matches: Vec<RuleMatch> = Vec::new();
        // Each policy's rules with their fingerprints, computed once per pass for the policies used.
        let mut rules: HashMap<PolicyKey, Vec<RuleRef>> = HashMap::new();
        let mut names = std::mem::take(&mut state.names);
        for Evidence {
            kind,
            record,
            waited_for_peer,
            claim,
        } in &records
        {
            let kind = *kind;
            let flows = match observed_flows(&index, &view, &mut names, record, &now) {
                Ok(flows) => flows,
                Err(unresolved) => {
                    self.metrics.evidence_unresolved.inc();
                    tracing::debug!(%unresolved, "evidence not resolvable");
                    continue;
                }
            };
            // Evidence that waited for its peer: per flow, whether the peer is a workload now and
            // whether a policy records it (what it came to, [`WaitedOutcome`]).
            let mut judged: Vec<(bool, bool)> = Vec::new();
            for flow in flows {
                let peer_is_workload = waited_for_peer.then(|| {
                    names_a_workload(match record.opened {
                        Opened::Inbound => &flow.source,
                        Opened::Outbound => &flow.destination,
                    })
                });
                if kind != EvidenceKind::Blocked {
                    let to_api_server = match flow.destination.endpoint {
                        Endpoint::Ip(ip) => index.is_api_server(ip, flow.port),
                        Endpoint::Pod(_) => false,
                    };
                    history.record(&flow, to_api_server);
                }
                if set.is_empty() && monitored.is_none() {
                    judged.extend(peer_is_workload.map(|p| (p, false)));
                    continue;
                }
                matches.clear();
                let mut attributed =
                    match attribution::attribute_with_usage(&view, &set, &flow, Some(&mut matches))
                    {
                        Ok(attributed) => attributed,
                        Err(error) => {
                            tracing::debug!(%error, "evidence not evaluable");
                            continue;
                        }
                    };
                // What a cluster proposal in monitor would deny: only evidence of a flow that
                // went through counts for it, as for a policy in monitor.
                if let Some(monitored) = monitored
                    .as_ref()
                    .filter(|_| kind.counts_for(PolicyMode::Monitor))
                {
                    match monitored.denial(&flow) {
                        Ok(denial) => attributed.extend(denial),
                        Err(error) => tracing::debug!(%error, "evidence not evaluable"),
                    }
                }
                for used in &matches {
                    let rules = rules.entry(used.policy.clone()).or_insert_with(|| {
                        policies
                            .iter()
                            .find(|p| policy_key(p) == used.policy)
                            .map(|p| rule_usage::rules_of(&p.spec))
                            .unwrap_or_default()
                    });
                    let peer = peer_of(&flow, used.direction);
                    let at = flow.seen_at.0.as_millisecond();
                    for rule in used.rules.iter().filter_map(|&i| rules.get(i)) {
                        state.usage.record(&used.policy, rule, &peer, at);
                    }
                }
                let at = flow.seen_at.0.as_millisecond();
                let mut violation = false;
                for a in attributed {
                    if !kind.counts_for(a.action()) {
                        continue;
                    }
                    // A repeat is a violation all the same, counted once (§3.6).
                    violation = true;
                    if !state.repeats.admit_key(a.repeat_key(), at) {
                        continue;
                    }
                    let (policy, observation) = (a.key(), a.observation());
                    let backend = backends
                        .get(&policy)
                        .copied()
                        .unwrap_or(Backend::Kubernetes);
                    self.sink.observed(backend, &observation);
                    tracing::debug!(?policy, ?observation, "violation observed");
                    state.pending.push(policy, observation);
                    queued += 1;
                    if let Some(claim) = claim {
                        claim.counted();
                    }
                }
                judged.extend(peer_is_workload.map(|p| (p, violation)));
            }
            if let Some(outcome) = WaitedOutcome::of(judged) {
                self.metrics.waited_for_peer(outcome);
                tracing::debug!(?outcome, peer = %record.peer, port = record.port,
                    pod = %format_args!("{}/{}", record.local.namespace, record.local.name),
                    "a blocked connection whose peer waited for the index, judged");
            }
        }
        state.repeats.forget_before(now.0.as_millisecond());
        history.forget_expired(now.0.as_millisecond());
        names.end_pass(|name| history.interned(name));
        state.names = names;
        self.metrics.history_edges.set(history.len() as i64);
        let evicted = history.evicted();
        self.metrics
            .history_evicted
            .inc_by(evicted.saturating_sub(self.metrics.history_evicted.get()));
        drop(history);
        self.count_pending(&mut state);
        drop(state);
        // Its observations are pending: the drain is attributed.
        let number = drain.number();
        drop(drain);
        self.settle_if_written(number);
        queued
    }

    /// Marks drains up to `drain` settled when no observation waits for a patch (but those of
    /// policies whose status keeps failing, [`FAILED_PASSES_BEFORE_PARKED`]), except drains
    /// another pass is still attributing (the protect gate's replay runs beside the sync's own
    /// passes): their observations are not pending yet, so that nothing is pending says nothing
    /// about them.
    pub(super) fn settle_if_written(&self, drain: u64) {
        let settleable = self.queue.settleable(drain);
        if self.all_written() {
            self.queue.settle(settleable);
        }
    }

    /// Whether no observation waits for a patch, but those of policies whose status keeps failing:
    /// they hold back nobody (see [`FAILED_PASSES_BEFORE_PARKED`]).
    pub(super) fn all_written(&self) -> bool {
        let state = self.state.lock().expect("state lock");
        state.pending.policies().all(|policy| {
            state
                .failing
                .get(policy)
                .is_some_and(|n| *n >= FAILED_PASSES_BEFORE_PARKED)
        })
    }
}

/// The far end of `flow` for a policy of `direction`, as one string per distinct peer: the workload,
/// else the address, else the identity.
fn peer_of(flow: &attribution::ObservedFlow, direction: Direction) -> String {
    let w: &WorkloadRef = match direction {
        Direction::Ingress => &flow.source.workload,
        Direction::Egress => &flow.destination.workload,
    };
    if !w.owner_name.is_empty() {
        format!("{}/{}/{}", w.namespace, w.owner_kind, w.owner_name)
    } else if !w.address.is_empty() {
        w.address.clone()
    } else {
        w.identity.clone()
    }
}
