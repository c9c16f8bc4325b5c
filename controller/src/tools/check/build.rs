//! Building a [`Checker`]: validating a scenario and building the view the evaluators read.

use super::*;

impl Checker {
    /// Validates `scenario` and builds the view. Errors name the offending field.
    pub fn new(scenario: Scenario) -> Result<Self, CheckError> {
        let namespaces = scenario.namespaces.clone();
        let pods = scenario.pods.clone();
        let mut view = ClusterView::new();
        let mut listed = BTreeSet::new();
        for (i, ns) in scenario.namespaces.iter().enumerate() {
            let field = format!("namespaces[{i}]");
            check_name(&format!("{field}.name"), &ns.name)?;
            if !listed.insert(ns.name.clone()) {
                return Err(CheckError::new(
                    format!("{field}.name"),
                    format!("namespace {:?} is listed twice", ns.name),
                ));
            }
            view.insert_namespace(ns.name.clone(), ns.labels.clone());
        }

        let mut pods_by_ip = HashMap::new();
        let mut identities = HashMap::new();
        for (i, pod) in scenario.pods.iter().enumerate() {
            let field = format!("pods[{i}]");
            check_name(&format!("{field}.namespace"), &pod.namespace)?;
            check_name(&format!("{field}.name"), &pod.name)?;
            let key = PodKey::new(&pod.namespace, &pod.name);
            if view.pod(&key).is_some() {
                return Err(CheckError::new(
                    format!("{field}.name"),
                    format!("pod {key} is listed twice"),
                ));
            }
            if let Some(ip) = pod.ip {
                if let Some(other) = pods_by_ip.insert(ip, key.clone()) {
                    return Err(CheckError::new(
                        format!("{field}.ip"),
                        format!("{ip} is already the IP of pod {other}"),
                    ));
                }
            }
            for (j, port) in pod.ports.iter().enumerate() {
                if port.container_port == 0 {
                    return Err(CheckError::new(
                        format!("{field}.ports[{j}].containerPort"),
                        "must be between 1 and 65535",
                    ));
                }
            }
            if let Some(sa) = &pod.service_account {
                check_name(&format!("{field}.serviceAccount"), sa)?;
                identities.insert(
                    key.clone(),
                    format!("cluster.local/ns/{}/sa/{sa}", pod.namespace),
                );
            }
            view.insert_pod(PodInfo {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                labels: pod.labels.clone(),
                ips: pod.ip.into_iter().collect(),
                ports: pod
                    .ports
                    .iter()
                    .map(|p| ContainerPort {
                        name: p.name.clone(),
                        port: p.container_port,
                        protocol: p.protocol,
                    })
                    .collect(),
                workload: None,
            });
        }

        let mut workload_policies = HashMap::new();
        let mut egress_names = HashMap::new();
        let mut istio = Vec::new();
        let mut usage = Vec::new();
        let mut seen = BTreeMap::new();
        for (i, value) in scenario.policies.into_iter().enumerate() {
            let field = format!("policies[{i}]");
            let kind = value
                .get("kind")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| {
                    CheckError::new(
                        format!("{field}.kind"),
                        "missing: expected NetworkPolicy, WorkloadNetworkPolicy or ClusterNetworkPolicy",
                    )
                })?
                .to_string();
            match kind.as_str() {
                "NetworkPolicy" => {
                    let policy: NetworkPolicy = from_value(&field, value)?;
                    let (namespace, name) = named(&field, &policy.metadata)?;
                    let spec = policy.spec.unwrap_or_default();
                    validate::spec(&format!("{field}.spec"), &spec)?;
                    let policy = NamedPolicy {
                        namespace,
                        name,
                        spec,
                    };
                    let id = (policy.namespace.clone(), policy.name.clone());
                    // The rendered NetworkPolicy of a WorkloadNetworkPolicy has its name: the
                    // WorkloadNetworkPolicy (as if rendered) stands for it.
                    if workload_policies.contains_key(&id) {
                        continue;
                    }
                    duplicate(&mut seen, &field, "NetworkPolicy", &id)?;
                    view.insert_policy(policy);
                }
                "WorkloadNetworkPolicy" => {
                    let policy: WorkloadNetworkPolicy = from_value(&field, value)?;
                    let (namespace, name) = named(&field, &policy.metadata)?;
                    let id = (namespace.clone(), name.clone());
                    duplicate(&mut seen, &field, "WorkloadNetworkPolicy", &id)?;
                    // The CRDs' CEL rules, reported after the more precise checks below.
                    let crd_rules = network_enforcer_api::validation::validate(&policy.spec, None)
                        .map_err(|broken| {
                            CheckError::new(
                                format!("{field}.spec"),
                                network_enforcer_api::validation::describe(&broken),
                            )
                        });
                    // Rule usage as the status records it, for `check` to show (docs/api.md).
                    if let Some(status) =
                        policy.status.as_ref().filter(|s| !s.rule_usage.is_empty())
                    {
                        usage.push(PolicyUsage {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            rules: rule_usage::rules_of(&policy.spec),
                            usage: status.rule_usage.clone(),
                        });
                    }
                    let spec = policy.spec;
                    match spec.backend {
                        Backend::Kubernetes => {
                            let Some(payload) = spec.kubernetes else {
                                return Err(CheckError::new(
                                    format!("{field}.spec.kubernetes"),
                                    "required for backend kubernetes",
                                ));
                            };
                            if payload.policy_types.as_deref()
                                != Some(&[spec.direction.as_str().to_string()])
                            {
                                return Err(CheckError::new(
                                    format!("{field}.spec.kubernetes.policyTypes"),
                                    format!("must be exactly [{}]", spec.direction.as_str()),
                                ));
                            }
                            // It renders into a NetworkPolicy, which the API server validates.
                            validate::spec(&format!("{field}.spec.kubernetes"), &payload)?;
                            crd_rules?;
                            // Replaces a listed NetworkPolicy of the same name: the rendered one.
                            view.insert_policy(NamedPolicy {
                                namespace,
                                name,
                                spec: payload,
                            });
                            // The CRD rules above allow names with direction Egress only.
                            if !spec.egress_names.is_empty() {
                                egress_names.insert(id.clone(), spec.egress_names);
                            }
                            workload_policies.insert(id, spec.mode);
                        }
                        Backend::Istio => {
                            let Some(payload) = spec.istio else {
                                return Err(CheckError::new(
                                    format!("{field}.spec.istio"),
                                    "required for backend istio",
                                ));
                            };
                            if spec.direction != Direction::Ingress {
                                return Err(CheckError::new(
                                    format!("{field}.spec.direction"),
                                    "the istio backend supports Ingress only",
                                ));
                            }
                            crd_rules?;
                            istio.push(IstioEntry {
                                namespace,
                                name,
                                mode: spec.mode,
                                policy: payload,
                            });
                        }
                    }
                }
                "ClusterNetworkPolicy" => {
                    let policy: ClusterNetworkPolicy = from_value(&field, value)?;
                    let name = policy.metadata.name.clone().unwrap_or_default();
                    if name.is_empty() {
                        return Err(CheckError::new(format!("{field}.metadata.name"), "missing"));
                    }
                    duplicate(
                        &mut seen,
                        &field,
                        "ClusterNetworkPolicy",
                        &(String::new(), name.clone()),
                    )?;
                    validate::cluster_policy(&format!("{field}.spec"), &name, &policy.spec)?;
                    view.insert_cluster_policy(NamedClusterPolicy {
                        name,
                        spec: policy.spec,
                    });
                }
                other => {
                    return Err(CheckError::new(
                        format!("{field}.kind"),
                        format!(
                            "{other:?} is not supported: expected NetworkPolicy, WorkloadNetworkPolicy \
                             or ClusterNetworkPolicy"
                        ),
                    ));
                }
            }
        }

        let checker = Checker {
            namespaces,
            pods,
            view,
            pods_by_ip,
            identities,
            workload_policies,
            egress_names,
            istio,
            flows: scenario.flows,
            usage,
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        for (i, flow) in checker.flows.iter().enumerate() {
            let field = format!("flows[{i}]");
            checker.endpoint(&format!("{field}.from"), &flow.from)?;
            checker.endpoint(&format!("{field}.to"), &flow.to)?;
            peer_name(&format!("{field}.from"), &flow.from, false)?;
            peer_name(&format!("{field}.to"), &flow.to, true)?;
            if flow.port == 0 {
                return Err(CheckError::new(
                    format!("{field}.port"),
                    "must be between 1 and 65535",
                ));
            }
        }
        Ok(checker)
    }

    /// The same pods and flows under `policies` instead of the scenario's (for [`diff()`]); the
    /// policies are checked as the scenario's are, errors naming `policies[i]`.
    pub fn with_policies(&self, policies: Vec<serde_json::Value>) -> Result<Checker, CheckError> {
        Checker::new(Scenario {
            namespaces: self.namespaces.clone(),
            pods: self.pods.clone(),
            policies,
            flows: self.flows.clone(),
        })
    }
}

/// Checks a peer's `name`: only a flow's destination given by `ip` has one (the agent names outbound
/// peers by what the pod resolved), and it is a host name as the agent reports it.
fn peer_name(field: &str, peer: &ScenarioPeer, destination: bool) -> Result<(), CheckError> {
    let Some(name) = &peer.name else {
        return Ok(());
    };
    let field = format!("{field}.name");
    if !destination {
        return Err(CheckError::new(
            field,
            "only a flow's `to` has a name (the one the source pod resolved it from)",
        ));
    }
    if peer.ip.is_none() {
        return Err(CheckError::new(
            field,
            "goes with `ip`: a name stands for an outside address, never for a pod",
        ));
    }
    match network_enforcer_api::dns_name::host_name(name) {
        Ok(canonical) if canonical == *name => Ok(()),
        _ => Err(CheckError::new(
            field,
            format!("{name:?} is not a lower-case host name without a trailing dot"),
        )),
    }
}

fn check_name(field: &str, name: &str) -> Result<(), CheckError> {
    if name.is_empty() {
        return Err(CheckError::new(field, "must not be empty"));
    }
    if name.contains('/') {
        return Err(CheckError::new(
            field,
            format!("{name:?} must not contain `/`"),
        ));
    }
    Ok(())
}

/// The (namespace, name) of a policy, its metadata validated as the API server does.
fn named(
    field: &str,
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(String, String), CheckError> {
    validate::metadata(&format!("{field}.metadata"), metadata)
}

fn duplicate(
    seen: &mut BTreeMap<(String, String, &'static str), ()>,
    field: &str,
    kind: &'static str,
    id: &(String, String),
) -> Result<(), CheckError> {
    if seen
        .insert((id.0.clone(), id.1.clone(), kind), ())
        .is_some()
    {
        return Err(CheckError::new(
            format!("{field}.metadata.name"),
            format!("{kind} {}/{} is listed twice", id.0, id.1),
        ));
    }
    Ok(())
}
