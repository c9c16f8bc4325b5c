//! A NetworkPolicy conformance harness with real packets, modelled on Kubernetes' own "Netpol" e2e
//! suite, and a differential against `network-enforcer-controller check`.
//!
//! - [`Pods`]: namespaces x, y, z (real names carry the test process's pid) with pods a, b, c, each
//!   labelled `pod=<name>` and serving TCP and UDP on ports 80 and 81 (our echo server; container ports
//!   named `serve-80-tcp` and so on, as upstream names them).
//! - [`Pods::probe`]: the whole truth table ([`table`]) from real connections, one `kubectl exec
//!   echo-server --probe` per source pod, all source pods at once; to the pods' own IPs, or to the
//!   ClusterIP of a Service in front of each pod ([`Via`]): policies hold for a Service's backends
//!   after kube-proxy's DNAT.
//! - [`Pods::predict`]: the same table as `check` predicts it from the policies the API server stored,
//!   the pods' labels, IPs and named ports.
//! - [`Runner`]: applies a [`Case`]'s steps, polls the truth table until it equals the step's
//!   expectation (bounded), compares `check`'s prediction with what the kernel did, and undoes the
//!   case before the next one.
//!
//! Synchronous (kubectl and the controller binary as child processes), like the rest of `e2e`.

pub mod table;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster::components::kubectl;
use crate::cluster::layout::kubernetes_bin;
use crate::cluster::process::output_with_input;
use crate::e2e::poll;
use crate::e2e::workload::{Namespace, START_TIMEOUT};
use crate::images::{ECHO_SERVER, TEST_IMAGE};
use table::{NAMESPACES, PODS, PORTS, PROTOCOLS, PodRef, Probe, Protocol, Table, all_pods};

/// How long one probe waits: a TCP connect, or a UDP reply (two datagrams, half of it each). Blocked
/// probes cost this much, so it bounds the time of a table; replies on the node's bridge take
/// microseconds.
pub const PROBE_TIMEOUT_MS: u64 = 1000;

/// The label namespaces are selected by in the cases (`ns=x`), as upstream does.
pub const NS_LABEL: &str = "ns";
/// The label every namespace has from v1.21 on, set by the API server; v1.20 (the local cluster) does
/// not, so we set it ourselves: policies selecting a namespace by name use it.
pub const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The label our ClusterNetworkPolicies carry (value: this process's id), so that undoing a case
/// deletes ours and nobody else's.
pub const CLUSTER_POLICY_LABEL: &str = "netpol-test";

/// The container port name of `port`/`protocol`, as upstream names them.
pub fn port_name(port: u16, protocol: Protocol) -> String {
    format!("serve-{port}-{}", protocol.lower())
}

/// The nine pods of the model in their three namespaces.
pub struct Pods {
    kubeconfig: PathBuf,
    /// Logical name → namespace (deleted on drop, also when the test fails).
    namespaces: BTreeMap<&'static str, Namespace>,
    ips: BTreeMap<PodRef, String>,
    /// The ClusterIP of the Service `s-<pod>` in front of each pod.
    services: BTreeMap<PodRef, String>,
    /// The labels as they are now (cases change some): `check` must see the same.
    ns_labels: BTreeMap<&'static str, BTreeMap<String, String>>,
    pod_labels: BTreeMap<PodRef, BTreeMap<String, String>>,
    /// The `network-enforcer-controller` binary whose `check` is compared with the kernel.
    controller: PathBuf,
}

impl Pods {
    /// Creates namespaces `<x|y|z>-<pid>` and the pods, and waits until every pod runs with an IP.
    pub fn create(kubeconfig: &Path, controller: &Path) -> Result<Self> {
        let mut namespaces = BTreeMap::new();
        let mut ns_labels = BTreeMap::new();
        for ns in NAMESPACES {
            let name = format!("{ns}-{}", std::process::id());
            let namespace = Namespace::create(kubeconfig, &name)?;
            let labels = base_ns_labels(ns, &name);
            let mut args = vec!["label".to_string(), "namespace".into(), name.clone()];
            args.extend(labels.iter().map(|(k, v)| format!("{k}={v}")));
            args.push("--overwrite".into());
            namespace.kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
            namespaces.insert(ns, namespace);
            ns_labels.insert(ns, labels);
        }
        let mut pod_labels = BTreeMap::new();
        for pod in all_pods() {
            namespaces[pod.ns].apply(&pod_manifest(pod.pod).to_string())?;
            pod_labels.insert(pod, base_pod_labels(pod.pod));
        }
        let mut pods = Self {
            kubeconfig: kubeconfig.into(),
            namespaces,
            ips: BTreeMap::new(),
            services: BTreeMap::new(),
            ns_labels,
            pod_labels,
            controller: controller.into(),
        };
        for ns in NAMESPACES {
            let namespace = &pods.namespaces[ns];
            let running = poll(
                &format!("pods a, b, c in {} to run", namespace.name),
                START_TIMEOUT,
                Duration::from_millis(500),
                || {
                    let running = namespace.running_pods("pod")?;
                    Ok((running.len() == PODS.len()).then_some(running))
                },
                || namespace.describe(),
            )?;
            for (name, ip) in running {
                let pod = *PODS
                    .iter()
                    .find(|p| **p == name)
                    .with_context(|| format!("unexpected pod {name} in {}", namespace.name))?;
                pods.ips.insert(PodRef { ns, pod }, ip);
            }
        }
        for pod in all_pods() {
            let namespace = &pods.namespaces[pod.ns];
            let name = format!("s-{}", pod.pod);
            namespace.apply(&service_manifest(&name, pod.pod).to_string())?;
            namespace.wait_for_endpoints(&name, 1)?;
            pods.services.insert(pod, namespace.cluster_ip(&name)?);
        }
        Ok(pods)
    }

    /// The real name of namespace `ns` (`x` → `x-<pid>`).
    pub fn ns_name(&self, ns: &str) -> &str {
        &self.namespaces[ns].name
    }

    /// The IP of pod `pod` (`"x/a"`).
    pub fn ip(&self, pod: &str) -> &str {
        self.ips
            .iter()
            .find(|(p, _)| p.is(pod))
            .map(|(_, ip)| ip.as_str())
            .unwrap_or_else(|| panic!("no pod {pod} in the model"))
    }

    /// Every pod's IP.
    pub fn ips(&self) -> impl Iterator<Item = &str> {
        self.ips.values().map(String::as_str)
    }

    /// The whole truth table from real connections: every source pod probes every other pod on every
    /// port and protocol, all in parallel (one `kubectl exec` per source, all sources at once).
    pub fn probe(&self, via: Via) -> Result<Table> {
        let rows: Vec<Result<Vec<(Probe, bool)>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = all_pods()
                .into_iter()
                .map(|from| scope.spawn(move || self.probe_row(from, via)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a probing thread panicked")))
                })
                .collect()
        });
        let mut verdicts = BTreeMap::new();
        for row in rows {
            verdicts.extend(row?);
        }
        Table::from_verdicts(verdicts).map_err(anyhow::Error::msg)
    }

    fn probe_row(&self, from: PodRef, via: Via) -> Result<Vec<(Probe, bool)>> {
        let mut targets = HashMap::new();
        let mut args = vec![
            "exec".to_string(),
            from.pod.to_string(),
            "--".into(),
            ECHO_SERVER.into(),
            "--probe".into(),
            PROBE_TIMEOUT_MS.to_string(),
        ];
        for to in all_pods().into_iter().filter(|to| *to != from) {
            for protocol in PROTOCOLS {
                for port in PORTS {
                    let address = match via {
                        Via::PodIp => &self.ips[&to],
                        Via::Service => &self.services[&to],
                    };
                    let target = format!("{}:{address}:{port}", protocol.lower());
                    args.push(target.clone());
                    targets.insert(
                        target,
                        Probe {
                            from,
                            to,
                            port,
                            protocol,
                        },
                    );
                }
            }
        }
        let out = self.namespaces[from.ns]
            .kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .with_context(|| format!("probing from {from}"))?;
        let mut row = Vec::new();
        for line in out.lines() {
            let (target, verdict) = line
                .split_once(' ')
                .with_context(|| format!("probe output line {line:?} from {from}"))?;
            let probe = targets
                .remove(target)
                .with_context(|| format!("probe output for an unknown target {line:?}"))?;
            row.push((probe, verdict == "connected"));
        }
        if let Some(target) = targets.keys().next() {
            bail!("the probe from {from} printed nothing for {target}:\n{out}");
        }
        Ok(row)
    }

    /// The truth table as `network-enforcer-controller check` predicts it: the NetworkPolicies the API
    /// server stored in our namespaces (what the agent reads, not what the case wrote), the pods with
    /// their labels, IPs and named ports, the namespaces with their labels, every probe as a flow.
    pub fn predict(&self) -> Result<Table> {
        let policies = self.stored_policies()?;
        let namespaces: Vec<Value> = NAMESPACES
            .iter()
            .map(|ns| json!({"name": self.ns_name(ns), "labels": self.ns_labels[ns]}))
            .collect();
        let pods: Vec<Value> = all_pods()
            .iter()
            .map(|pod| {
                json!({
                    "namespace": self.ns_name(pod.ns),
                    "name": pod.pod,
                    "labels": self.pod_labels[pod],
                    "ip": self.ips[pod],
                    "ports": container_ports(),
                })
            })
            .collect();
        let probes = table::all_probes();
        let flows: Vec<Value> = probes
            .iter()
            .map(|p| {
                json!({
                    "from": {"pod": format!("{}/{}", self.ns_name(p.from.ns), p.from.pod)},
                    "to": {"pod": format!("{}/{}", self.ns_name(p.to.ns), p.to.pod)},
                    "protocol": p.protocol.kubernetes(),
                    "port": p.port,
                })
            })
            .collect();
        let scenario = json!({
            "namespaces": namespaces, "pods": pods, "policies": policies, "flows": flows,
        });
        let out = output_with_input(
            Command::new(&self.controller).args(["check", "--scenario", "-", "-o", "json"]),
            scenario.to_string().as_bytes(),
        )
        .context("network-enforcer-controller check")?;
        let report: Value = serde_json::from_str(&out).context("check's JSON report")?;
        let results = report["results"]
            .as_array()
            .context("check's report has no results")?;
        if results.len() != probes.len() {
            bail!("check answered {} flows of {}", results.len(), probes.len());
        }
        let mut verdicts = BTreeMap::new();
        for (probe, result) in probes.into_iter().zip(results) {
            let allowed = result["allowed"]
                .as_bool()
                .with_context(|| format!("check's result for {probe} has no verdict: {result}"))?;
            verdicts.insert(probe, allowed);
        }
        Table::from_verdicts(verdicts).map_err(anyhow::Error::msg)
    }

    /// Our ClusterNetworkPolicies, deleted.
    fn delete_cluster_policies(&self) -> Result<()> {
        let selector = format!("{CLUSTER_POLICY_LABEL}={}", std::process::id());
        kubectl(
            &self.kubeconfig,
            &["delete", "clusternetworkpolicies", "-l", &selector],
        )
        .map(drop)
    }

    /// The NetworkPolicies of our namespaces and our ClusterNetworkPolicies, as the API server
    /// stored them.
    pub fn stored_policies(&self) -> Result<Vec<Value>> {
        let selector = format!("{CLUSTER_POLICY_LABEL}={}", std::process::id());
        let list: Value = serde_json::from_str(&kubectl(
            &self.kubeconfig,
            &[
                "get",
                "clusternetworkpolicies",
                "-l",
                &selector,
                "-o",
                "json",
            ],
        )?)?;
        let mut policies = list["items"].as_array().cloned().unwrap_or_default();
        for ns in NAMESPACES {
            let list: Value = serde_json::from_str(&self.namespaces[ns].kubectl(&[
                "get",
                "networkpolicies",
                "-o",
                "json",
            ])?)?;
            policies.extend(list["items"].as_array().cloned().unwrap_or_default());
        }
        Ok(policies)
    }

    /// `policy` as the API server would store it in namespace `ns` (a server-side dry run: nothing
    /// is created).
    pub fn dry_run_apply(&self, ns: &str, policy: &Value) -> Result<Value> {
        let out = self.apply_policy(ns, policy, &["--dry-run=server", "-o", "json"])?;
        Ok(serde_json::from_str(&out)?)
    }

    /// `kubectl apply` of `policy` in namespace `ns`, without kubectl's own schema validation: kubectl
    /// v1.20 refuses fields newer than itself (endPort), and what matters is what the API server
    /// stores, which is what the agent and `check` get.
    fn apply_policy(&self, ns: &str, policy: &Value, extra: &[&str]) -> Result<String> {
        output_with_input(
            Command::new(kubernetes_bin("kubectl"))
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .arg(format!("--namespace={}", self.ns_name(ns)))
                .args(["apply", "--validate=false", "-f", "-"])
                .args(extra),
            policy.to_string().as_bytes(),
        )
    }

    /// Does one action of a case.
    pub fn act(&mut self, action: &Action) -> Result<()> {
        match action {
            Action::Apply(ns, policy) => {
                self.apply_policy(ns, policy, &[])?;
            }
            Action::Delete(ns, name) => {
                self.namespaces[ns].kubectl(&["delete", "networkpolicy", name])?;
            }
            Action::ApplyCluster(policy) => {
                let mut policy = policy.clone();
                policy["metadata"]["labels"][CLUSTER_POLICY_LABEL] =
                    Value::String(std::process::id().to_string());
                output_with_input(
                    Command::new(kubernetes_bin("kubectl"))
                        .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                        .args(["apply", "--validate=false", "-f", "-"]),
                    policy.to_string().as_bytes(),
                )?;
            }
            Action::LabelNamespace(ns, key, value) => {
                let name = self.ns_name(ns).to_string();
                self.label(&["namespace", &name], key, value.as_deref())?;
                set_label(self.ns_labels.get_mut(ns).unwrap(), key, value.as_deref());
            }
            Action::LabelPod(pod, key, value) => {
                let pod = *self
                    .pod_labels
                    .keys()
                    .find(|p| p.is(pod))
                    .with_context(|| format!("no pod {pod} in the model"))?;
                let ns = format!("--namespace={}", self.ns_name(pod.ns));
                self.label(&[&ns, "pod", pod.pod], key, value.as_deref())?;
                set_label(
                    self.pod_labels.get_mut(&pod).unwrap(),
                    key,
                    value.as_deref(),
                );
            }
        }
        Ok(())
    }

    /// `kubectl label OBJECT key=value` (or `key-` to remove it).
    fn label(&self, object: &[&str], key: &str, value: Option<&str>) -> Result<()> {
        let change = match value {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        let mut args = vec!["label"];
        args.extend_from_slice(object);
        args.extend([change.as_str(), "--overwrite"]);
        kubectl(&self.kubeconfig, &args).map(drop)
    }

    /// Undoes a case: deletes every NetworkPolicy of our namespaces and our ClusterNetworkPolicies,
    /// and puts every label back.
    pub fn reset(&mut self) -> Result<()> {
        for ns in NAMESPACES {
            self.namespaces[ns].kubectl(&["delete", "networkpolicies", "--all"])?;
        }
        self.delete_cluster_policies()?;
        let mut undo = Vec::new();
        for ns in NAMESPACES {
            let base = base_ns_labels(ns, self.ns_name(ns));
            undo.extend(
                label_changes(&self.ns_labels[ns], &base)
                    .into_iter()
                    .map(|(key, value)| Action::LabelNamespace(ns, key, value)),
            );
        }
        for (pod, labels) in &self.pod_labels {
            let base = base_pod_labels(pod.pod);
            undo.extend(
                label_changes(labels, &base)
                    .into_iter()
                    .map(|(key, value)| Action::LabelPod(pod.to_string(), key, value)),
            );
        }
        for action in &undo {
            self.act(action)?;
        }
        Ok(())
    }

    /// Objects and events of our namespaces (for failure messages).
    pub fn describe(&self) -> String {
        self.namespaces.values().map(Namespace::describe).collect()
    }
}

impl Drop for Pods {
    /// Our ClusterNetworkPolicies go with our namespaces, also when a case failed (they are
    /// cluster-scoped: deleting the namespaces does not delete them).
    fn drop(&mut self) {
        if let Err(error) = self.delete_cluster_policies() {
            eprintln!("[netpol] deleting our ClusterNetworkPolicies: {error:#}");
        }
    }
}

/// What a namespace is labelled with before any case changes it.
fn base_ns_labels(ns: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NS_LABEL.to_string(), ns.to_string()),
        (NAME_LABEL.to_string(), name.to_string()),
    ])
}

/// What a pod is labelled with before any case changes it.
fn base_pod_labels(pod: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("pod".to_string(), pod.to_string())])
}

fn set_label(labels: &mut BTreeMap<String, String>, key: &str, value: Option<&str>) {
    match value {
        Some(v) => labels.insert(key.to_string(), v.to_string()),
        None => labels.remove(key),
    };
}

/// The label changes that turn `now` into `base`.
fn label_changes(
    now: &BTreeMap<String, String>,
    base: &BTreeMap<String, String>,
) -> Vec<(String, Option<String>)> {
    let mut changes: Vec<_> = now
        .keys()
        .filter(|k| !base.contains_key(*k))
        .map(|k| (k.clone(), None))
        .collect();
    changes.extend(
        base.iter()
            .filter(|(k, v)| now.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), Some(v.clone()))),
    );
    changes
}

/// The four named container ports of every pod.
fn container_ports() -> Vec<Value> {
    PORTS
        .iter()
        .flat_map(|port| {
            PROTOCOLS.iter().map(move |protocol| {
                json!({
                    "name": port_name(*port, *protocol),
                    "containerPort": port,
                    "protocol": protocol.kubernetes(),
                })
            })
        })
        .collect()
}

/// Service `name` in front of pod `pod`, every port and protocol the pod serves (a ClusterIP: kube-proxy
/// DNATs to the pod's IP on the node).
fn service_manifest(name: &str, pod: &str) -> Value {
    let ports: Vec<Value> = container_ports()
        .into_iter()
        .map(|p| {
            json!({"name": p["name"], "port": p["containerPort"], "targetPort": p["containerPort"],
                   "protocol": p["protocol"]})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": base_pod_labels(pod), "ports": ports},
    })
}

/// Pod `name`: our echo server on TCP and UDP ports 80 and 81. A bare pod (no controller): the model
/// needs exactly these names, and a replacement pod with a new IP would stale the ipBlock cases.
fn pod_manifest(name: &str) -> Value {
    let mut command = vec![ECHO_SERVER.to_string()];
    for port in PORTS {
        for protocol in PROTOCOLS {
            command.push(format!("{}:{port}", protocol.lower()));
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": base_pod_labels(name)},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "serve", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                "command": command,
                "ports": container_ports(),
            }],
        },
    })
}

/// One change a case makes. Namespaces and pods by their logical names (`"x"`, `"x/a"`).
#[derive(Clone, Debug)]
pub enum Action {
    /// `kubectl apply` of a NetworkPolicy (JSON) in a namespace: creates it, or updates one of the
    /// same name.
    Apply(&'static str, Value),
    /// Deletes the NetworkPolicy of that name.
    Delete(&'static str, &'static str),
    /// `kubectl apply` of a ClusterNetworkPolicy (JSON, cluster-scoped). [`Pods::reset`] deletes
    /// it by the [`CLUSTER_POLICY_LABEL`] it is given, so its subject must select our namespaces
    /// only (the cluster is shared).
    ApplyCluster(Value),
    /// Sets (`Some`) or removes (`None`) a namespace label.
    LabelNamespace(&'static str, String, Option<String>),
    /// Sets (`Some`) or removes (`None`) a pod label.
    LabelPod(String, String, Option<String>),
}

/// Where the probes connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The destination pod's own IP.
    PodIp,
    /// The ClusterIP of the destination pod's Service.
    Service,
}

/// Actions, then the truth table they must lead to.
#[derive(Clone)]
pub struct Step {
    pub what: String,
    pub actions: Vec<Action>,
    pub expect: Table,
}

/// A named sequence of steps; the runner undoes all of it afterwards.
#[derive(Clone)]
pub struct Case {
    pub name: String,
    pub steps: Vec<Step>,
    /// Where this case's probes connect to.
    pub via: Via,
}

/// How one case went.
pub struct Outcome {
    pub name: String,
    pub elapsed: Duration,
    /// Why it failed; empty when it passed.
    pub failures: Vec<String>,
}

/// Runs cases one after the other on the same pods.
pub struct Runner<'a> {
    pub pods: &'a mut Pods,
    /// How long a step's truth table gets to reach its expectation.
    pub wait: Duration,
    /// The table the last step was seen to reach (`None`: not known).
    confirmed: Option<Table>,
    /// Where the probes connect to now (the running case's).
    via: Via,
    /// Probe nothing and take every expectation as observed: compares `check` with the cases'
    /// expectations alone, in seconds (for writing cases; `NE_NETPOL_DRY=1`).
    pub dry: bool,
}

/// How long a step whose expectation equals the table already seen waits before it probes: long enough
/// for an enforcer that would (wrongly) change something to have done so.
const SETTLE: Duration = Duration::from_secs(2);

impl<'a> Runner<'a> {
    pub fn new(pods: &'a mut Pods, wait: Duration) -> Self {
        Self {
            pods,
            wait,
            confirmed: None,
            via: Via::PodIp,
            dry: false,
        }
    }

    /// Waits until every probe is allowed (no policies in force): before the first case, after a
    /// case whose undoing would otherwise be invisible, after the last case.
    pub fn wait_for_all_allowed(&mut self, what: &str) -> Result<()> {
        let expect = Table::all(true);
        match self.poll_table(&expect) {
            (Ok(_), _) => {
                self.confirmed = Some(expect);
                Ok(())
            }
            (Err(e), observed) => bail!(
                "{what}: not every probe is allowed after {:?}: {e:#}\n{}",
                self.wait,
                observed
                    .map(|o| expect.render_against(&o, ("expected", "observed")))
                    .unwrap_or_default()
            ),
        }
    }

    /// Runs `case`, then undoes it. `next` is the case that follows: when its first expectation is
    /// the table `case` ends with, every probe must be allowed again in between, or the next case
    /// could pass on what this one left in force.
    pub fn run(&mut self, case: &Case, next: Option<&Case>) -> Result<Outcome> {
        let start = Instant::now();
        self.via = case.via;
        let mut failures = Vec::new();
        for (i, step) in case.steps.iter().enumerate() {
            let step_name = format!("step {}/{} ({})", i + 1, case.steps.len(), step.what);
            if let Err(e) = self.step(step) {
                failures.push(format!("{step_name}: {e:#}"));
                // Later steps build on this one.
                break;
            }
        }
        let elapsed = start.elapsed();
        self.pods.reset()?;
        let last = case.steps.last().map(|s| &s.expect);
        let next_first = next.and_then(|n| n.steps.first()).map(|s| &s.expect);
        if !failures.is_empty() {
            // What is in force is not known.
            self.confirmed = None;
            self.wait_for_all_allowed(&format!("after the failed case {:?}", case.name))?;
        } else if next_first.is_some() && next_first == last {
            self.wait_for_all_allowed(&format!("after case {:?}", case.name))?;
        }
        Ok(Outcome {
            name: case.name.clone(),
            elapsed,
            failures,
        })
    }

    fn step(&mut self, step: &Step) -> Result<()> {
        let start = Instant::now();
        for action in &step.actions {
            self.pods.act(action)?;
        }
        let predicted = self.pods.predict()?;
        if self.confirmed.as_ref() == Some(&step.expect) && !self.dry {
            std::thread::sleep(SETTLE);
        }
        let (reached, observed) = self.poll_table(&step.expect);
        let Some(observed) = observed else {
            bail!("no truth table could be probed: {:#}", reached.unwrap_err());
        };
        let mut problems = Vec::new();
        match reached {
            Ok(rounds) => eprintln!(
                "    {}: reached in {:.1}s ({rounds} probing round(s))",
                step.what,
                start.elapsed().as_secs_f64()
            ),
            Err(e) => problems.push(format!(
                "the kernel did not reach the expected truth table: {e:#}\n{}",
                step.expect
                    .render_against(&observed, ("expected", "observed"))
            )),
        }
        let disagreements = predicted.differences(&observed);
        if !disagreements.is_empty() {
            let flows: Vec<String> = disagreements
                .iter()
                .map(|(probe, check, kernel)| {
                    format!(
                        "  {probe}: check predicts {}, the kernel {}",
                        if *check { "allowed" } else { "blocked" },
                        if *kernel {
                            "let it through"
                        } else {
                            "blocked it"
                        },
                    )
                })
                .collect();
            problems.push(format!(
                "`network-enforcer-controller check` disagrees with the kernel on {} flows:\n{}\n{}",
                flows.len(),
                flows.iter().take(20).cloned().collect::<Vec<_>>().join("\n"),
                predicted.render_against(&observed, ("check", "kernel"))
            ));
        }
        if problems.is_empty() {
            self.confirmed = Some(step.expect.clone());
            Ok(())
        } else {
            self.confirmed = None;
            bail!("{}", problems.join("\n"))
        }
    }

    /// Probes until the table equals `expect` or the wait is over. Returns how many rounds it took (or
    /// why it stopped) and the last table probed.
    fn poll_table(&self, expect: &Table) -> (Result<usize>, Option<Table>) {
        if self.dry {
            return (Ok(0), Some(expect.clone()));
        }
        let deadline = Instant::now() + self.wait;
        let mut rounds = 0;
        let mut last = None;
        let mut last_error = None;
        loop {
            rounds += 1;
            match self.pods.probe(self.via) {
                Ok(observed) => {
                    if &observed == expect {
                        return (Ok(rounds), Some(observed));
                    }
                    last = Some(observed);
                }
                // kubectl exec can fail transiently on a loaded machine; the next round retries.
                Err(e) => last_error = Some(e),
            }
            if Instant::now() > deadline {
                let error = match (&last, last_error) {
                    (Some(_), _) => anyhow::anyhow!("timed out after {rounds} probing rounds"),
                    (None, Some(e)) => e,
                    (None, None) => anyhow::anyhow!("no probing round finished"),
                };
                return (Err(error), last);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
