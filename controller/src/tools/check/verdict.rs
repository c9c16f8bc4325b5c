//! Evaluating the scenario's flows: each side's verdict, the policies that decided it and,
//! explained, the rules that match.

use super::*;
use netpol::cluster::Decider;

impl Checker {
    /// Evaluates every flow of the scenario, in input order.
    pub fn run(&self) -> CheckReport {
        self.results(false)
    }

    /// [`Checker::run`], each side also saying how it was decided: the rules that allow the flow, the
    /// policies that isolate it, or that nothing isolates it.
    pub fn explain(&self) -> CheckReport {
        self.results(true)
    }

    fn results(&self, explain: bool) -> CheckReport {
        let results = self
            .flows
            .iter()
            .map(|f| {
                let flow = Flow {
                    source: self.endpoint("", &f.from).expect("validated in new"),
                    destination: self.endpoint("", &f.to).expect("validated in new"),
                    protocol: f.protocol,
                    port: f.port,
                };
                let (egress, ingress) = self.evaluate(&flow, f.to.name.as_deref(), explain);
                CheckResult {
                    from: f.from.clone(),
                    to: f.to.clone(),
                    protocol: f.protocol,
                    port: f.port,
                    allowed: egress.allowed && ingress.allowed,
                    egress,
                    ingress,
                }
            })
            .collect();
        CheckReport { results }
    }

    /// The endpoint a peer stands for; an address of a listed pod is that pod.
    pub(super) fn endpoint(
        &self,
        field: &str,
        peer: &ScenarioPeer,
    ) -> Result<Endpoint, CheckError> {
        match (&peer.pod, peer.ip) {
            (Some(pod), None) => {
                let key = pod
                    .split_once('/')
                    .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
                    .map(|(ns, name)| PodKey::new(ns, name))
                    .ok_or_else(|| {
                        CheckError::new(
                            format!("{field}.pod"),
                            format!("{pod:?} is not `namespace/name`"),
                        )
                    })?;
                if self.view.pod(&key).is_none() {
                    return Err(CheckError::new(
                        format!("{field}.pod"),
                        format!("no pod {key} in `pods`"),
                    ));
                }
                Ok(Endpoint::Pod(key))
            }
            (None, Some(ip)) => Ok(self.address(ip)),
            _ => Err(CheckError::new(
                field,
                "exactly one of `pod` or `ip` must be set",
            )),
        }
    }

    /// The endpoint of an address: the listed pod that has it, else the bare address.
    pub(super) fn address(&self, ip: IpAddr) -> Endpoint {
        match self.pods_by_ip.get(&ip) {
            Some(key) => Endpoint::Pod(key.clone()),
            None => Endpoint::Ip(ip),
        }
    }

    /// Egress and ingress verdicts of one flow, with the deciding policies; with `explain`, also the
    /// decision and the matching rules of each side. `peer_name`: the name the source pod resolved
    /// an outside destination from.
    pub(super) fn evaluate(
        &self,
        flow: &Flow,
        peer_name: Option<&str>,
        explain: bool,
    ) -> (Side, Side) {
        let verdict = evaluate(&self.view, flow).expect("endpoints are pods of the view");
        let mut egress = self.side(&verdict.egress);
        let mut ingress = self.side(&verdict.ingress);
        if explain {
            egress.rules = self.matching_rules(&verdict.egress, Direction::Egress, flow);
            ingress.rules = self.matching_rules(&verdict.ingress, Direction::Ingress, flow);
        }
        // Names allow addresses only (no pod), as in the controller (`attribution`), and only where
        // the NetworkPolicy tier decides (they are part of a rendered NetworkPolicy).
        if let (Endpoint::Ip(_), Some(name)) = (&flow.destination, peer_name)
            && verdict.egress.decider == Decider::NetworkPolicy
        {
            self.allow_by_name(&verdict.egress, &mut egress, name, flow, explain);
        }
        // ztunnel enforces the istio policies at the destination, on top of the NetworkPolicies.
        if let Endpoint::Pod(key) = &flow.destination {
            let pod = self.view.pod(key).expect("validated");
            let principal = match &flow.source {
                Endpoint::Pod(source) => self.identities.get(source).map(String::as_str),
                Endpoint::Ip(_) => None,
            };
            let connection = Connection {
                destination_labels: &pod.labels,
                source_principal: principal,
                protocol: flow.protocol,
                port: flow.port,
            };
            let mut allowing = Vec::new();
            let mut denying = Vec::new();
            let mut rules = Vec::new();
            for entry in self.istio.iter().filter(|e| e.namespace == pod.namespace) {
                let decided = DecidingPolicy {
                    kind: PolicyKind::WorkloadNetworkPolicy,
                    namespace: entry.namespace.clone(),
                    name: entry.name.clone(),
                    mode: Some(entry.mode),
                };
                match authorization_policy::evaluate(&entry.policy, &connection) {
                    AuthzVerdict::NotApplicable => {}
                    AuthzVerdict::Allowed => {
                        if explain {
                            rules.extend(
                                authorization_policy::matching_rules(&entry.policy, &connection)
                                    .into_iter()
                                    .filter_map(|i| {
                                        Some(MatchedRule {
                                            policy: decided.clone(),
                                            index: i,
                                            rule: explain::istio_rule(
                                                i,
                                                entry.policy.rules.get(i)?,
                                            ),
                                        })
                                    }),
                            );
                        }
                        allowing.push(decided)
                    }
                    AuthzVerdict::Denied => denying.push(decided),
                }
            }
            // ALLOW policies add up: any one allowing is enough.
            if allowing.is_empty() && !denying.is_empty() {
                if ingress.allowed {
                    ingress.policies.clear();
                    ingress.rules.clear();
                }
                ingress.allowed = false;
                ingress.policies.extend(denying);
            } else if ingress.allowed {
                ingress.policies.extend(allowing);
                ingress.rules.extend(rules);
            }
            ingress.policies.sort_by(|a, b| {
                (&a.namespace, &a.name, a.kind).cmp(&(&b.namespace, &b.name, b.kind))
            });
            ingress.rules.sort_by(|a, b| {
                (&a.policy.namespace, &a.policy.name, a.policy.kind, a.index).cmp(&(
                    &b.policy.namespace,
                    &b.policy.name,
                    b.policy.kind,
                    b.index,
                ))
            });
        }
        if explain {
            for side in [&mut egress, &mut ingress] {
                side.decision = Some(if side.decided_by.is_some() {
                    Decision::ClusterPolicy
                } else {
                    Decision::of(side.allowed, !side.policies.is_empty())
                });
            }
        }
        (egress, ingress)
    }

    /// Adds to the egress side what the `spec.egressNames` of the WorkloadNetworkPolicies isolating
    /// the source allow: a flow to an address resolved from `name`. Each such policy's names add to
    /// what its payload allows, and NetworkPolicies add up, so one entry allowing is enough; a side
    /// its NetworkPolicies denied is then decided by those entries alone.
    fn allow_by_name(
        &self,
        verdict: &SideVerdict,
        egress: &mut Side,
        name: &str,
        flow: &Flow,
        explain: bool,
    ) {
        let mut matched = Vec::new();
        for decision in &verdict.policies {
            let Some(entries) = self
                .egress_names
                .get(&(decision.namespace.clone(), decision.name.clone()))
            else {
                continue;
            };
            for (index, entry) in entries.iter().enumerate() {
                if names::allows(std::slice::from_ref(entry), name, flow.protocol, flow.port) {
                    matched.push(MatchedRule {
                        policy: self.deciding(&decision.namespace, &decision.name),
                        index,
                        rule: explain::name_rule(index, entry, name),
                    });
                }
            }
        }
        if matched.is_empty() {
            return;
        }
        if !egress.allowed {
            egress.allowed = true;
            egress.policies.clear();
            egress.rules.clear();
        }
        for m in &matched {
            if !egress.policies.contains(&m.policy) {
                egress.policies.push(m.policy.clone());
            }
        }
        egress
            .policies
            .sort_by(|a, b| (&a.namespace, &a.name, a.kind).cmp(&(&b.namespace, &b.name, b.kind)));
        if explain {
            egress.rules.extend(matched);
        }
    }

    fn side(&self, verdict: &SideVerdict) -> Side {
        let decided_by = verdict.decider.tier();
        let policies = verdict
            .deciding_policies()
            .map(|p| self.deciding(&p.namespace, &p.name))
            .collect();
        Side {
            allowed: verdict.allowed,
            policies,
            decision: None,
            rules: Vec::new(),
            tiers: verdict
                .cluster
                .iter()
                .map(|step| TierStep {
                    tier: step.tier.to_string(),
                    policy: step.policy.clone(),
                    index: step.rule,
                    name: step.rule_name.clone(),
                    action: step.action.to_string(),
                })
                .collect(),
            decided_by: decided_by.map(|t| t.to_string()),
        }
    }

    /// A NetworkPolicy of the view as the report names it: a WorkloadNetworkPolicy when it stands
    /// for one (the kubernetes backend, as if rendered).
    fn deciding(&self, namespace: &str, name: &str) -> DecidingPolicy {
        let mode = self
            .workload_policies
            .get(&(namespace.to_string(), name.to_string()))
            .copied();
        DecidingPolicy {
            kind: if mode.is_some() {
                PolicyKind::WorkloadNetworkPolicy
            } else {
                PolicyKind::NetworkPolicy
            },
            namespace: namespace.to_string(),
            name: name.to_string(),
            mode,
        }
    }

    /// The rules of the NetworkPolicies allowing one side of `flow`, each rendered.
    fn matching_rules(
        &self,
        verdict: &SideVerdict,
        direction: Direction,
        flow: &Flow,
    ) -> Vec<MatchedRule> {
        let mut matched = Vec::new();
        if verdict.decider != Decider::NetworkPolicy {
            return matched;
        }
        for decision in verdict.allowing() {
            let Some(policy) = self
                .view
                .policies_in(&decision.namespace)
                .iter()
                .find(|p| p.name == decision.name)
            else {
                continue;
            };
            // The verdict came from the same view and flow, so the lookup cannot fail; an error would
            // only leave the rules out.
            let indexes = compiled::resolve(&self.view, &flow.source, &flow.destination)
                .map(|ends| {
                    let parsed = PolicyRef::from(policy).parse();
                    compiled::matching_rules(
                        &self.view,
                        &parsed,
                        direction,
                        ends,
                        flow.protocol,
                        flow.port,
                    )
                })
                .unwrap_or_default();
            for index in indexes {
                let rendered = match direction {
                    Direction::Egress => policy
                        .spec
                        .egress
                        .as_deref()
                        .and_then(|r| r.get(index))
                        .map(|r| {
                            explain::network_policy_rule(
                                direction,
                                index,
                                r.to.as_deref(),
                                r.ports.as_deref(),
                                &policy.namespace,
                            )
                        }),
                    Direction::Ingress => policy
                        .spec
                        .ingress
                        .as_deref()
                        .and_then(|r| r.get(index))
                        .map(|r| {
                            explain::network_policy_rule(
                                direction,
                                index,
                                r.from.as_deref(),
                                r.ports.as_deref(),
                                &policy.namespace,
                            )
                        }),
                };
                if let Some(rule) = rendered {
                    matched.push(MatchedRule {
                        policy: self.deciding(&policy.namespace, &policy.name),
                        index,
                        rule,
                    });
                }
            }
        }
        matched
    }
}
