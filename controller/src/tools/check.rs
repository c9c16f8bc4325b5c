//! Offline policy evaluation for `network-enforcer-controller check`: "what would protect block?"
//! reviews and CI pipelines, without a cluster.
//!
//! A [`Scenario`] (JSON or YAML) lists namespaces, pods, policies (NetworkPolicy and
//! WorkloadNetworkPolicy objects) and flows. [`Checker`] builds the same [`ClusterView`] the
//! controller evaluates against and runs the semantic evaluators on every flow:
//!
//! - a NetworkPolicy is in force as written;
//! - a WorkloadNetworkPolicy is evaluated as if rendered, whatever its mode (the question is what
//!   protect mode would block): the kubernetes backend as the NetworkPolicy of the same name it
//!   renders (replacing a listed NetworkPolicy of that name, which is the rendered one), the istio
//!   backend as the AuthorizationPolicy it renders, at the destination, for the source pod's
//!   `serviceAccount` identity.
//!
//! [`Checker::explain`] also names, for each side, the rules that allowed the flow or the policies
//! that isolate it ([`explain`]); [`diff()`] compares the verdicts under the scenario's policies and
//! under another set ([`Checker::with_policies`]).
//!
//! [`Checker::rule_usage`] shows, per rule of each WorkloadNetworkPolicy whose status has `ruleUsage`,
//! when it last allowed an observed flow and how many peers ("last matched 2h ago, 3 peers").
//!
//! [`Checker::replay`] evaluates recorded agent records (the `flows -o json` lines) and reports the
//! difference: what went through and would now be denied, and what failed and would now pass.
//!
//! [`live`] makes the scenario from the cluster and the traffic the controller observed
//! (`check --from-cluster`); its `load` is the only I/O of `check`.
//!
//! Invalid input is refused with a [`CheckError`] naming the offending field
//! (`flows[2].from.pod: ...`). Policies are validated as the API server
//! validates them (module `validate`): one it would refuse is refused here too, not evaluated.

mod diff;
pub mod explain;
pub mod live;
mod validate;

pub use diff::{DiffChange, DiffReport, Verdict, diff, parse_policies};
use explain::{Decision, MatchedRule};

use crate::monitor::evaluate::authorization_policy::{self, AuthzVerdict, Connection};
use crate::monitor::evaluate::network_policy;
use crate::monitor::evaluate::view::{
    ClusterView, ContainerPort, Endpoint, Flow, NamedPolicy, PodInfo,
};
use crate::monitor::evaluate::{Labels, PodKey, SideVerdict, evaluate};
use crate::policy::rule_usage;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use network_enforcer_api::{
    Backend, Direction, IstioPolicy, PolicyMode, Protocol, RuleUsage, WorkloadNetworkPolicy,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

/// Invalid input: the field at fault (a path such as `flows[2].port`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CheckError {
    /// Where in the input the problem is; `.` for the document itself.
    pub field: String,
    pub message: String,
}

impl CheckError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        CheckError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The input of `check --scenario`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub namespaces: Vec<ScenarioNamespace>,
    #[serde(default)]
    pub pods: Vec<ScenarioPod>,
    /// NetworkPolicy and WorkloadNetworkPolicy objects, as `kubectl get -o yaml` prints them.
    #[serde(default)]
    pub policies: Vec<serde_json::Value>,
    #[serde(default)]
    pub flows: Vec<ScenarioFlow>,
}

/// A namespace and its labels (namespaces pods use need not be listed).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioNamespace {
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
}

/// A pod: what NetworkPolicy selectors, ipBlocks and named ports see.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScenarioPod {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
    /// The pod's IP: ipBlocks match it, and replayed records are mapped to the pod by it.
    #[serde(default)]
    pub ip: Option<IpAddr>,
    #[serde(default)]
    pub ports: Vec<ScenarioPort>,
    /// The pod's ServiceAccount: its mesh identity `cluster.local/ns/<namespace>/sa/<name>` is what
    /// istio policies match. Without one the pod has no identity.
    #[serde(default)]
    pub service_account: Option<String>,
}

/// A declared container port.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScenarioPort {
    #[serde(default)]
    pub name: Option<String>,
    pub container_port: u16,
    #[serde(default = "tcp")]
    pub protocol: Protocol,
}

fn tcp() -> Protocol {
    Protocol::TCP
}

/// One end of a flow: a pod (`namespace/name`) or an address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
}

/// A connection to evaluate.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFlow {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    /// TCP (default), UDP or SCTP.
    #[serde(default = "tcp")]
    pub protocol: Protocol,
    /// The destination (container) port.
    pub port: u16,
}

/// Which kind of object decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum PolicyKind {
    NetworkPolicy,
    WorkloadNetworkPolicy,
}

/// A policy that decided one side of a flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecidingPolicy {
    pub kind: PolicyKind,
    pub namespace: String,
    pub name: String,
    /// The WorkloadNetworkPolicy's mode (`monitor` records what `protect` would block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<PolicyMode>,
}

/// The verdict of one side: allowed or not, and the policies that decided. When allowed, those are
/// the policies that allow the flow (empty: no policy isolates this side); when denied, every policy
/// isolating this side (none of them allows it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Side {
    pub allowed: bool,
    pub policies: Vec<DecidingPolicy>,
    /// Explained results only ([`Checker::explain`]): how this side was decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Explained results only, when policies allow: every rule of theirs that matches the flow,
    /// policy by policy.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<MatchedRule>,
}

/// The verdict for one flow of the scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    pub protocol: Protocol,
    pub port: u16,
    /// Both sides allow the flow.
    pub allowed: bool,
    pub egress: Side,
    pub ingress: Side,
}

/// The results of a scenario, in input order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub results: Vec<CheckResult>,
}

/// Parses a scenario document: JSON when it starts with `{`, YAML otherwise. Errors name the field.
pub fn parse_scenario(text: &str) -> Result<Scenario, CheckError> {
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text)
            .map_err(|e| CheckError::new(".", format!("invalid JSON: {e}")))?
    } else {
        serde_yaml::from_str(text)
            .map_err(|e| CheckError::new(".", format!("invalid YAML: {e}")))?
    };
    if value.is_null() {
        return Err(CheckError::new(".", "the scenario is empty"));
    }
    from_value("", value)
}

/// Deserializes `value`, naming the failing field below `prefix` in the error.
fn from_value<T: DeserializeOwned>(
    prefix: &str,
    value: serde_json::Value,
) -> Result<T, CheckError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = e.path().to_string();
        // A key of blanks or control characters (`{"\n": 1}`) is shown quoted and escaped; an empty
        // key is an empty path: the document, or the object, is at fault.
        if !path.is_empty() && (path.trim().is_empty() || path.chars().any(char::is_control)) {
            path = format!("{path:?}");
        }
        let field = match (prefix.is_empty(), path.as_str()) {
            (true, "." | "") => ".".to_string(),
            (true, _) => path,
            (false, "." | "") => prefix.to_string(),
            (false, _) => format!("{prefix}.{path}"),
        };
        CheckError::new(field, e.into_inner().to_string())
    })
}

/// A WorkloadNetworkPolicy of the istio backend, evaluated at the destination.
struct IstioEntry {
    namespace: String,
    name: String,
    mode: PolicyMode,
    policy: IstioPolicy,
}

/// A validated scenario, ready to evaluate flows.
pub struct Checker {
    /// The scenario's namespaces and pods, to evaluate the same flows under other policies.
    namespaces: Vec<ScenarioNamespace>,
    pods: Vec<ScenarioPod>,
    view: ClusterView,
    /// Pods by IP, to map addresses (flows given by IP, replayed records) to pods.
    pods_by_ip: HashMap<IpAddr, PodKey>,
    /// Mesh identities by pod.
    identities: HashMap<PodKey, String>,
    /// The WorkloadNetworkPolicies among the NetworkPolicies in the view: (namespace, name) → mode.
    workload_policies: HashMap<(String, String), PolicyMode>,
    istio: Vec<IstioEntry>,
    flows: Vec<ScenarioFlow>,
    /// The WorkloadNetworkPolicies whose status has `ruleUsage`, in input order.
    usage: Vec<PolicyUsage>,
    /// What "2h ago" is measured from.
    now: Time,
}

/// A WorkloadNetworkPolicy's rules and the usage its status recorded.
struct PolicyUsage {
    namespace: String,
    name: String,
    rules: Vec<rule_usage::RuleRef>,
    usage: Vec<RuleUsage>,
}

/// One rule's usage as `check` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleUsageLine {
    pub namespace: String,
    pub name: String,
    /// `ingress[0]`.
    pub rule: String,
    /// `last matched 2h ago, 3 peers`, `never matched`, or `usage unknown` (the status has no entry
    /// for the rule as it is now).
    pub usage: String,
    /// When the rule last allowed an observed flow, as recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_matched: Option<Time>,
    /// Distinct peers it allowed (at most 1000).
    pub peers: i64,
}

/// The usage of every rule of the WorkloadNetworkPolicies whose status records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleUsageReport {
    pub rules: Vec<RuleUsageLine>,
}

impl RuleUsageReport {
    /// `POLICY  RULE  USAGE` rows.
    pub fn render_table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .rules
            .iter()
            .map(|r| {
                vec![
                    format!("wnp/{}/{}", r.namespace, r.name),
                    r.rule.clone(),
                    r.usage.clone(),
                ]
            })
            .collect();
        table(&["POLICY", "RULE", "USAGE"], &rows)
    }
}

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
                        "missing: expected NetworkPolicy or WorkloadNetworkPolicy",
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
                other => {
                    return Err(CheckError::new(
                        format!("{field}.kind"),
                        format!(
                            "{other:?} is not supported: expected NetworkPolicy or WorkloadNetworkPolicy"
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
            istio,
            flows: scenario.flows,
            usage,
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        for (i, flow) in checker.flows.iter().enumerate() {
            let field = format!("flows[{i}]");
            checker.endpoint(&format!("{field}.from"), &flow.from)?;
            checker.endpoint(&format!("{field}.to"), &flow.to)?;
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

    /// Measures "how long ago" in [`Checker::rule_usage`] from `now` instead of the clock.
    pub fn with_now(mut self, now: Time) -> Self {
        self.now = now;
        self
    }

    /// The usage of each rule of the scenario's WorkloadNetworkPolicies whose status records
    /// `ruleUsage` (e.g. taken with `kubectl get -o yaml`); `None` when none does.
    pub fn rule_usage(&self) -> Option<RuleUsageReport> {
        if self.usage.is_empty() {
            return None;
        }
        let rules = self
            .usage
            .iter()
            .flat_map(|p| {
                p.rules.iter().map(move |rule| {
                    let entry = p.usage.iter().find(|u| {
                        u.direction == rule.direction && u.fingerprint == rule.fingerprint
                    });
                    RuleUsageLine {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        rule: rule.name(),
                        usage: rule_usage::describe(rule, &p.usage, &self.now),
                        last_matched: entry.and_then(|e| e.last_matched.clone()),
                        peers: entry.map_or(0, |e| e.peers),
                    }
                })
            })
            .collect();
        Some(RuleUsageReport { rules })
    }

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
                let (egress, ingress) = self.evaluate(&flow, explain);
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
    fn endpoint(&self, field: &str, peer: &ScenarioPeer) -> Result<Endpoint, CheckError> {
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
    fn address(&self, ip: IpAddr) -> Endpoint {
        match self.pods_by_ip.get(&ip) {
            Some(key) => Endpoint::Pod(key.clone()),
            None => Endpoint::Ip(ip),
        }
    }

    /// Egress and ingress verdicts of one flow, with the deciding policies; with `explain`, also the
    /// decision and the matching rules of each side.
    fn evaluate(&self, flow: &Flow, explain: bool) -> (Side, Side) {
        let verdict = evaluate(&self.view, flow).expect("endpoints are pods of the view");
        let mut egress = self.side(&verdict.egress);
        let mut ingress = self.side(&verdict.ingress);
        if explain {
            egress.rules = self.matching_rules(&verdict.egress, Direction::Egress, flow);
            ingress.rules = self.matching_rules(&verdict.ingress, Direction::Ingress, flow);
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
                side.decision = Some(Decision::of(side.allowed, !side.policies.is_empty()));
            }
        }
        (egress, ingress)
    }

    fn side(&self, verdict: &SideVerdict) -> Side {
        let policies = verdict
            .policies
            .iter()
            .filter(|p| !verdict.allowed || p.allows)
            .map(|p| self.deciding(&p.namespace, &p.name))
            .collect();
        Side {
            allowed: verdict.allowed,
            policies,
            decision: None,
            rules: Vec::new(),
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
            let indexes =
                network_policy::matching_rules(&self.view, policy.into(), direction, flow)
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

    /// Replays recorded agent records against the scenario's policies (see [`parse_records`]).
    /// Both ends of a record are mapped to the scenario's pods by IP; records of the same flow
    /// (the client's outbound and the server's inbound copy) are evaluated once.
    pub fn replay(&self, records: &[AgentRecord]) -> ReplayReport {
        let mut flows: BTreeMap<(IpAddr, IpAddr, Protocol, u16), ReplayedFlow> = BTreeMap::new();
        for record in records {
            let (source, destination) = match record.direction {
                RecordDirection::Outbound => (record.local_ip, record.peer_ip),
                RecordDirection::Inbound => (record.peer_ip, record.local_ip),
            };
            let entry = flows
                .entry((source, destination, record.protocol, record.port))
                .or_insert_with(|| ReplayedFlow {
                    from: self.peer_of(source),
                    to: self.peer_of(destination),
                    passed: 0,
                    failed: 0,
                });
            match record.outcome {
                // Counts come from a file: add without overflowing.
                RecordOutcome::Established | RecordOutcome::Datagram => {
                    entry.passed = entry.passed.saturating_add(record.count)
                }
                RecordOutcome::Failed => entry.failed = entry.failed.saturating_add(record.count),
            }
        }
        let mut report = ReplayReport {
            records: records.len(),
            flows: flows.len(),
            unchanged: 0,
            would_deny: Vec::new(),
            would_allow: Vec::new(),
        };
        for ((source, destination, protocol, port), flow) in flows {
            let (egress, ingress) = self.evaluate(
                &Flow {
                    source: self.address(source),
                    destination: self.address(destination),
                    protocol,
                    port,
                },
                false,
            );
            let allowed = egress.allowed && ingress.allowed;
            let change = ReplayChange {
                from: flow.from,
                to: flow.to,
                protocol,
                port,
                passed: flow.passed,
                failed: flow.failed,
                egress,
                ingress,
            };
            if !allowed && change.passed > 0 {
                report.would_deny.push(change);
            } else if allowed && change.passed == 0 {
                report.would_allow.push(change);
            } else {
                report.unchanged += 1;
            }
        }
        report
    }

    fn peer_of(&self, ip: IpAddr) -> ScenarioPeer {
        match self.pods_by_ip.get(&ip) {
            Some(key) => ScenarioPeer {
                pod: Some(key.to_string()),
                ip: None,
            },
            None => ScenarioPeer {
                pod: None,
                ip: Some(ip),
            },
        }
    }
}

struct ReplayedFlow {
    from: ScenarioPeer,
    to: ScenarioPeer,
    passed: u64,
    failed: u64,
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

/// Direction of a recorded edge, as the agent's `flows -o json` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordDirection {
    /// The local pod opened the connection (or sent the datagram) to the peer.
    Outbound,
    /// The peer connected to the local pod.
    Inbound,
}

/// Outcome of a recorded edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordOutcome {
    Established,
    Failed,
    Datagram,
}

/// One agent record, as a line of `network-enforcer-agent flows -o json` (other fields ignored).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct AgentRecord {
    pub local_ip: IpAddr,
    pub peer_ip: IpAddr,
    /// The service port: the peer's port for outbound edges, the local one for inbound.
    pub port: u16,
    #[serde(deserialize_with = "lowercase_protocol")]
    pub protocol: Protocol,
    pub direction: RecordDirection,
    pub outcome: RecordOutcome,
    /// How many connections or datagrams the edge stands for.
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

fn lowercase_protocol<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Protocol, D::Error> {
    let name = String::deserialize(d)?;
    Protocol::from_lowercase(&name.to_ascii_lowercase()).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "unknown protocol {name:?}: expected tcp, udp or sctp"
        ))
    })
}

/// Parses JSON lines of agent records; blank lines are skipped. Errors name the line and field
/// (`line 3: peer_ip: ...`).
pub fn parse_records(text: &str) -> Result<Vec<AgentRecord>, CheckError> {
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let field = format!("line {}", i + 1);
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| CheckError::new(&field, format!("invalid JSON: {e}")))?;
        records.push(from_value(&field, value)?);
    }
    Ok(records)
}

/// One replayed flow whose verdict differs from what the records show.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayChange {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    pub protocol: Protocol,
    pub port: u16,
    /// Connections or datagrams recorded as gone through.
    pub passed: u64,
    /// Connection attempts recorded as failed.
    pub failed: u64,
    pub egress: Side,
    pub ingress: Side,
}

/// The would-deny diff of a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Records read.
    pub records: usize,
    /// Distinct flows (source, destination, protocol, port) among them.
    pub flows: usize,
    /// Flows whose verdict matches what was recorded.
    pub unchanged: usize,
    /// Flows that went through and the policies would deny.
    pub would_deny: Vec<ReplayChange>,
    /// Flows that only ever failed and the policies would allow (they may have failed for another
    /// reason than a policy).
    pub would_allow: Vec<ReplayChange>,
}

fn peer_text(peer: &ScenarioPeer) -> String {
    match (&peer.pod, peer.ip) {
        (Some(pod), _) => pod.clone(),
        (None, Some(ip)) => ip.to_string(),
        (None, None) => "-".into(),
    }
}

fn side_text(side: &Side) -> String {
    let verdict = if side.allowed { "allow" } else { "deny" };
    if side.policies.is_empty() {
        return format!("{verdict} (not isolated)");
    }
    let names: Vec<String> = side.policies.iter().map(explain::policy_text).collect();
    format!("{verdict} ({})", names.join(", "))
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(header);
    for row in rows {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out
}

impl CheckReport {
    /// A table for people: one row per flow, in input order; explained results
    /// ([`Checker::explain`]) take two, egress then ingress, with the explanation of each.
    pub fn render_table(&self) -> String {
        if self.results.iter().any(|r| r.egress.decision.is_some()) {
            return self.render_explained_table();
        }
        let rows: Vec<Vec<String>> = self
            .results
            .iter()
            .map(|r| {
                vec![
                    peer_text(&r.from),
                    peer_text(&r.to),
                    r.protocol.to_string(),
                    r.port.to_string(),
                    if r.allowed { "ALLOW" } else { "DENY" }.to_string(),
                    side_text(&r.egress),
                    side_text(&r.ingress),
                ]
            })
            .collect();
        table(
            &[
                "FROM", "TO", "PROTO", "PORT", "VERDICT", "EGRESS", "INGRESS",
            ],
            &rows,
        )
    }
}

impl CheckReport {
    fn render_explained_table(&self) -> String {
        let mut rows = Vec::new();
        for r in &self.results {
            rows.push(vec![
                peer_text(&r.from),
                peer_text(&r.to),
                r.protocol.to_string(),
                r.port.to_string(),
                if r.allowed { "ALLOW" } else { "DENY" }.to_string(),
                "egress".to_string(),
                explain::explanation_text(&r.egress),
            ]);
            let mut ingress = vec![String::new(); 5];
            ingress.extend(["ingress".to_string(), explain::explanation_text(&r.ingress)]);
            rows.push(ingress);
        }
        table(
            &["FROM", "TO", "PROTO", "PORT", "VERDICT", "SIDE", "DECISION"],
            &rows,
        )
    }
}

impl ReplayReport {
    /// The diff for people: `-` for flows the policies would deny, `+` for failed flows they would
    /// allow, then a summary line.
    pub fn render_table(&self) -> String {
        let mut rows = Vec::new();
        for (sign, changes) in [("-", &self.would_deny), ("+", &self.would_allow)] {
            for c in changes {
                rows.push(vec![
                    sign.to_string(),
                    peer_text(&c.from),
                    peer_text(&c.to),
                    c.protocol.to_string(),
                    c.port.to_string(),
                    c.passed.to_string(),
                    c.failed.to_string(),
                    side_text(&c.egress),
                    side_text(&c.ingress),
                ]);
            }
        }
        let mut out = table(
            &[
                "", "FROM", "TO", "PROTO", "PORT", "PASSED", "FAILED", "EGRESS", "INGRESS",
            ],
            &rows,
        );
        let _ = writeln!(
            out,
            "{} record(s), {} flow(s): {} would be denied, {} would be allowed, {} unchanged",
            self.records,
            self.flows,
            self.would_deny.len(),
            self.would_allow.len(),
            self.unchanged
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let err = parse_scenario("flows:\n- from: {pod: a/b}\n  to: {ip: 10.0.0.1}\n  port: x\n")
            .unwrap_err();
        assert_eq!(err.field, "flows[0].port", "{err}");
        // Found by the fuzz tests: an empty key left the field empty.
        let err = parse_scenario(r#"{"": null}"#).unwrap_err();
        assert_eq!(err.field, ".", "{err}");
        let err = parse_records(r#"{"": null}"#).unwrap_err();
        assert_eq!(err.field, "line 1", "{err}");
        let err = parse_scenario("{\"\\n\": null}").unwrap_err();
        assert_eq!(err.field, r#""\n""#, "{err}");
        let scenario = parse_scenario(
            "pods: [{namespace: a, name: b}]\nflows:\n- from: {pod: a/c}\n  to: {ip: 10.0.0.1}\n  port: 80\n",
        )
        .unwrap();
        let err = Checker::new(scenario).err().unwrap();
        assert_eq!(err.field, "flows[0].from.pod", "{err}");
        let scenario = parse_scenario(
            "policies:\n- kind: NetworkPolicy\n  metadata: {name: x, namespace: a}\n  spec:\n    ingress: [{ports: [{port: {}}]}]\n",
        )
        .unwrap();
        let err = Checker::new(scenario).err().unwrap();
        assert_eq!(
            err.field, "policies[0].spec.ingress[0].ports[0].port",
            "{err}"
        );
    }

    /// Policies the API server would refuse are refused, not evaluated (the rules themselves are
    /// tabled in `validate`): NetworkPolicies, the NetworkPolicy a WorkloadNetworkPolicy renders, and
    /// the CRDs' own rules.
    #[test]
    fn policies_the_api_server_refuses_are_refused_naming_the_field() {
        let wnp = |kubernetes: &str| {
            format!(
                "- kind: WorkloadNetworkPolicy\n  metadata: {{name: w, namespace: a}}\n  spec:\n    backend: kubernetes\n    direction: Ingress\n    targetRef: {{kind: Deployment, name: x}}\n    kubernetes: {kubernetes}\n"
            )
        };
        let np = |name: &str, spec: &str| {
            format!(
                "- kind: NetworkPolicy\n  metadata: {{name: {name}, namespace: a}}\n  spec: {spec}\n"
            )
        };
        let valid = np("ok", "{podSelector: {}}");
        let cases = [
            (
                format!(
                    "{valid}{valid_2}{bad}",
                    valid_2 = np("ok2", "{ingress: [{ports: [{port: 80}]}]}"),
                    bad = np(
                        "bad",
                        "{ingress: [{ports: [{port: 80}, {port: 90, endPort: 89}]}]}"
                    )
                ),
                "policies[2].spec.ingress[0].ports[1].endPort",
            ),
            (np("Bad", "{}"), "policies[0].metadata.name"),
            (
                np(
                    "n",
                    "{egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}",
                ),
                "policies[0].spec.egress[0].to[0].ipBlock.except[0]",
            ),
            (
                wnp(
                    "{podSelector: {matchLabels: {app: x}}, policyTypes: [Ingress], ingress: [{ports: [{port: \"HTTP\"}]}]}",
                ),
                "policies[0].spec.kubernetes.ingress[0].ports[0].port",
            ),
            (
                wnp("{podSelector: {}, policyTypes: [Ingress]}"),
                "policies[0].spec",
            ),
        ];
        for (policies, field) in cases {
            let scenario = parse_scenario(&format!("policies:\n{policies}")).unwrap();
            let err = Checker::new(scenario).err().expect(field);
            assert_eq!(err.field, field, "{err}");
        }
        let scenario = parse_scenario(&format!("policies:\n{valid}")).unwrap();
        assert!(Checker::new(scenario).is_ok());
    }

    /// `--explain`, side by side: the rule that allows (egress and ingress, every matching rule of
    /// every allowing policy), the policies that isolate without a matching rule, or no isolation.
    #[test]
    fn explain_names_the_rule_the_isolation_or_none() {
        let pods = "pods:\n\
            - {namespace: shop, name: web, labels: {app: web}, serviceAccount: web}\n\
            - {namespace: shop, name: db, labels: {app: db}, ports: [{name: pg, containerPort: 5432}]}\n\
            - {namespace: shop, name: api, labels: {app: api}}\n";
        let np = |name: &str, spec: &str| {
            format!(
                "- {{kind: NetworkPolicy, metadata: {{name: {name}, namespace: shop}}, spec: {spec}}}\n"
            )
        };
        let db_ingress = np(
            "db-ingress",
            "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: api}}}]}, {from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: pg}]}]}",
        );
        let deny_all = np("deny-all", "{podSelector: {}}");
        let web_egress = np(
            "web-egress",
            "{podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}], ports: [{port: 443}]}, {ports: [{protocol: UDP, port: 53}]}]}",
        );
        let web_egress_wnp = "- kind: WorkloadNetworkPolicy\n  metadata: {name: web-egress, namespace: shop}\n  spec:\n    backend: kubernetes\n    mode: monitor\n    direction: Egress\n    targetRef: {kind: Deployment, name: web}\n    kubernetes: {podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: 5432}]}]}\n";
        let api_istio = "- kind: WorkloadNetworkPolicy\n  metadata: {name: api-istio, namespace: shop}\n  spec:\n    backend: istio\n    direction: Ingress\n    targetRef: {kind: Deployment, name: api}\n    istio: {selector: {matchLabels: {app: api}}, rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/db]}}]}, {from: [{source: {principals: [cluster.local/ns/shop/*]}}], to: [{operation: {ports: ['80']}}]}]}\n";
        let flow = |from: &str, to: &str, port: u16| {
            format!("- {{from: {from}, to: {to}, port: {port}}}\n")
        };
        let web_to_db = flow("{pod: shop/web}", "{pod: shop/db}", 5432);
        // Name, policies, flow, and the expected egress and ingress explanations.
        type Case = (
            &'static str,
            String,
            String,
            (Decision, &'static str),
            (Decision, &'static str),
        );
        let cases: Vec<Case> = vec![
            (
                "no policy: neither side is isolated",
                String::new(),
                web_to_db.clone(),
                (Decision::NotIsolated, "not isolated"),
                (Decision::NotIsolated, "not isolated"),
            ),
            (
                "ingress allowed by the second rule, by its named port",
                db_ingress.clone(),
                web_to_db.clone(),
                (Decision::NotIsolated, "not isolated"),
                (
                    Decision::Allowed,
                    "allowed by np/shop/db-ingress ingress[1] from app=web ns=shop TCP/pg",
                ),
            ),
            (
                "ingress denied: two policies isolate, no rule matches",
                format!("{db_ingress}{deny_all}"),
                flow("{pod: shop/web}", "{pod: shop/db}", 5433),
                (Decision::NotIsolated, "not isolated"),
                (
                    Decision::Isolated,
                    "isolated by np/shop/db-ingress, np/shop/deny-all; no rule matches",
                ),
            ),
            (
                "egress allowed by an ipBlock rule; the address is no pod",
                web_egress.clone(),
                flow("{pod: shop/web}", "{ip: 10.9.9.9}", 443),
                (
                    Decision::Allowed,
                    "allowed by np/shop/web-egress egress[0] to 10.0.0.0/8 TCP/443",
                ),
                (Decision::NotIsolated, "not isolated"),
            ),
            (
                "egress denied, ingress allowed by every rule that matches",
                format!(
                    "{web_egress}{}",
                    np(
                        "db-open",
                        "{podSelector: {}, ingress: [{}, {ports: [{port: 5432}]}]}"
                    )
                ),
                web_to_db.clone(),
                (
                    Decision::Isolated,
                    "isolated by np/shop/web-egress; no rule matches",
                ),
                (
                    Decision::Allowed,
                    "allowed by np/shop/db-open ingress[0] from anywhere all ports; np/shop/db-open ingress[1] from anywhere TCP/5432",
                ),
            ),
            (
                "a kubernetes WorkloadNetworkPolicy is named as one",
                web_egress_wnp.to_string(),
                web_to_db.clone(),
                (
                    Decision::Allowed,
                    "allowed by wnp/shop/web-egress egress[0] to app=db ns=shop TCP/5432",
                ),
                (Decision::NotIsolated, "not isolated"),
            ),
            (
                "istio: the AuthorizationPolicy allows by its second rule",
                api_istio.to_string(),
                flow("{pod: shop/web}", "{pod: shop/api}", 80),
                (Decision::NotIsolated, "not isolated"),
                (
                    Decision::Allowed,
                    "allowed by wnp/shop/api-istio rules[1] from cluster.local/ns/shop/* TCP/80",
                ),
            ),
            (
                "istio denies what no NetworkPolicy isolates",
                api_istio.to_string(),
                flow("{ip: 192.0.2.1}", "{pod: shop/api}", 80),
                (Decision::NotIsolated, "not isolated"),
                (
                    Decision::Isolated,
                    "isolated by wnp/shop/api-istio; no rule matches",
                ),
            ),
            (
                "istio denies what a NetworkPolicy allows: only the denying policy is named",
                format!(
                    "{api_istio}{}",
                    np(
                        "api-open",
                        "{podSelector: {matchLabels: {app: api}}, ingress: [{}]}"
                    )
                ),
                flow("{ip: 192.0.2.1}", "{pod: shop/api}", 80),
                (Decision::NotIsolated, "not isolated"),
                (
                    Decision::Isolated,
                    "isolated by wnp/shop/api-istio; no rule matches",
                ),
            ),
        ];
        for (name, policies, flow, egress, ingress) in cases {
            let policies = if policies.is_empty() {
                "policies: []\n".to_string()
            } else {
                format!("policies:\n{policies}")
            };
            let scenario = parse_scenario(&format!("{pods}{policies}flows:\n{flow}"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let checker = Checker::new(scenario).unwrap_or_else(|e| panic!("{name}: {e}"));
            let explained = checker.explain();
            let result = &explained.results[0];
            for (side, (decision, text)) in [(&result.egress, egress), (&result.ingress, ingress)] {
                assert_eq!(side.decision, Some(decision), "{name}");
                assert_eq!(explain::explanation_text(side), text, "{name}");
                // Rules are listed only for an allowed side (the JSON must not show stale ones).
                assert_eq!(
                    side.rules.is_empty(),
                    decision != Decision::Allowed,
                    "{name}"
                );
            }
            // Without --explain the verdicts are the same and nothing is added.
            let plain = &checker.run().results[0];
            for (plain, explained) in [
                (&plain.egress, &result.egress),
                (&plain.ingress, &result.ingress),
            ] {
                assert_eq!(
                    (plain.allowed, &plain.policies),
                    (explained.allowed, &explained.policies),
                    "{name}"
                );
                assert_eq!((&plain.decision, plain.rules.len()), (&None, 0), "{name}");
            }
        }
    }

    #[test]
    fn with_policies_keeps_the_pods_and_flows() {
        let scenario = parse_scenario(
            "pods: [{namespace: a, name: p}, {namespace: a, name: q}]\nflows:\n- {from: {pod: a/p}, to: {pod: a/q}, port: 80}\n",
        )
        .unwrap();
        let old = Checker::new(scenario).unwrap();
        let deny = parse_policies(
            "kind: NetworkPolicy\nmetadata: {name: deny, namespace: a}\nspec: {podSelector: {}}\n",
        )
        .unwrap();
        let new = old.with_policies(deny).unwrap();
        let report = diff(&old.explain(), &new.explain());
        assert_eq!(
            (report.flows, report.now_denied.len(), report.unchanged),
            (1, 1, 0)
        );
        let change = &report.now_denied[0];
        assert_eq!(change.new.ingress.decision, Some(Decision::Isolated));
        assert_eq!(change.old.ingress.decision, Some(Decision::NotIsolated));
        let bad = parse_policies("- {kind: NetworkPolicy, metadata: {name: Bad, namespace: a}}\n")
            .unwrap();
        let err = old.with_policies(bad).err().unwrap();
        assert_eq!(err.field, "policies[0].metadata.name", "{err}");
    }

    #[test]
    fn records_parse_from_agent_json_lines() {
        let line = r#"{"first_seen":"2026-12-06T13:05:09.123Z","last_seen":"2026-12-06T13:05:10.000Z","netns_ino":1,"cgroup_id":2,"local_ip":"10.0.0.1","peer_ip":"10.0.0.2","port":53,"protocol":"udp","direction":"outbound","outcome":"datagram","error":null,"count":4}"#;
        let records = parse_records(&format!("{line}\n\n{line}\n")).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].protocol, Protocol::UDP);
        assert_eq!(records[0].count, 4);
        let err = parse_records(&line.replace("udp", "icmp")).unwrap_err();
        assert_eq!(err.field, "line 1.protocol", "{err}");
    }
}
