//! How fast flows are evaluated and policy statuses synced, at the scale we aim at: 10k pods,
//! 1k WorkloadNetworkPolicies, 100 violations each.
//!
//! A plain `harness = false` benchmark (std timing, no extra dependencies): it prints its figures and
//! writes them to `target/bench/evaluate.json` (`evaluations_per_sec`,
//! `evaluations_with_rule_usage_per_sec`, `status_sync_ms_1k_policies`,
//! `view_build_ms_10k_pods`, `index_build_ms_10k_pods`), or to the file `BENCH_FIGURES` names
//! (`cargo xtask bench evaluate`). Run with `cargo bench -p network-enforcer-controller --bench
//! evaluate`; on a busy machine the figures are lower bounds.
//!
//! Every figure goes through the functions the status sync calls ([`attribute`] per flow,
//! [`AllowedNow`] per policy and record, [`ClusterView::from_index`] per pass), and the evaluation
//! figure includes what a pass pays before its first flow (the policy set and the view's policy
//! index), so it is what the controller gets. Goals: at least 1,000,000 evaluations/s, at most
//! 200 ms for the status sync of 1k policies × 100 violations.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use network_enforcer_api::{
    Protocol, ViolationRecord, WorkloadKind, WorkloadNetworkPolicy, WorkloadNetworkPolicyStatus,
    WorkloadRef,
};
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::workload::Workload;
use network_enforcer_controller::monitor::evaluate::attribution::{
    AllowedNow, FlowSide, ObservedFlow, PolicySet, attribute, attribute_with_usage,
};
use network_enforcer_controller::monitor::evaluate::{
    ClusterView, ContainerPort, Endpoint, Labels, NamedPolicy, PodInfo, PodKey,
};
use network_enforcer_controller::monitor::violations::{self, Observation, SyncInput};
use serde_json::json;
use std::hint::black_box;
use std::time::Instant;

const NAMESPACES: usize = 100;
const WORKLOADS_PER_NAMESPACE: usize = 10;
const PODS_PER_WORKLOAD: usize = 10;
/// Workloads per namespace with an egress and an ingress policy: 5 × 2 × 100 = 1,000 policies.
const GOVERNED_PER_NAMESPACE: usize = 5;
const FLOWS: usize = 200_000;

/// A small deterministic generator (no `rand` dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % below
    }
}

fn pod_name(w: usize, p: usize) -> String {
    format!("app-{w}-{p}")
}

fn workload_ref(ns: usize, w: usize) -> WorkloadRef {
    WorkloadRef {
        namespace: format!("ns-{ns}"),
        owner_kind: "Deployment".into(),
        owner_name: format!("app-{w}"),
        identity: format!("cluster.local/ns/ns-{ns}/sa/app-{w}"),
        ..WorkloadRef::default()
    }
}

fn side(ns: usize, w: usize, p: usize) -> FlowSide {
    FlowSide {
        endpoint: Endpoint::Pod(PodKey::new(format!("ns-{ns}"), pod_name(w, p))),
        workload: workload_ref(ns, w).into(),
    }
}

fn policy(ns: usize, w: usize, direction: &str, mode: &str) -> WorkloadNetworkPolicy {
    // Egress: to the next workload (TCP 8080, named port http) and to DNS. Ingress: from the
    // previous workload and from every namespace of the same team on a port range.
    let (key, rules) = if direction == "Egress" {
        (
            "egress",
            json!([
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": format!("ns-{ns}")}},
                         "podSelector": {"matchLabels": {"app": format!("app-{}", (w + 1) % WORKLOADS_PER_NAMESPACE)}}}],
                 "ports": [{"protocol": "TCP", "port": 8080}, {"port": "http"}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}]}
            ]),
        )
    } else {
        (
            "ingress",
            json!([
                {"from": [{"podSelector": {"matchLabels": {"app": format!("app-{}", (w + WORKLOADS_PER_NAMESPACE - 1) % WORKLOADS_PER_NAMESPACE)}}}],
                 "ports": [{"protocol": "TCP", "port": 8080}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", ns % 5)}}}],
                 "ports": [{"protocol": "UDP", "port": 9000, "endPort": 9010}]}
            ]),
        )
    };
    serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": format!("deployment-app-{w}-{key}"), "namespace": format!("ns-{ns}"),
                     "uid": format!("{ns}-{w}-{key}"), "generation": 1},
        "spec": {"backend": "kubernetes", "direction": direction, "mode": mode,
                 "targetRef": {"kind": "Deployment", "name": format!("app-{w}")},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": format!("app-{w}")}},
                                "policyTypes": [direction], key: rules}}
    }))
    .expect("a valid policy")
}

/// The cluster of the bench: the view, the namespaces and NetworkPolicies it holds, and the
/// WorkloadNetworkPolicies.
struct Cluster {
    view: ClusterView,
    namespaces: Vec<(String, Labels)>,
    network_policies: Vec<NamedPolicy>,
    policies: Vec<WorkloadNetworkPolicy>,
}

/// 10k pods in 100 namespaces, 1k policies (half in protect, rendered as NetworkPolicies).
fn cluster() -> Cluster {
    let mut view = ClusterView::new();
    let mut namespaces = Vec::new();
    let mut network_policies = Vec::new();
    let mut policies = Vec::new();
    for ns in 0..NAMESPACES {
        let namespace = format!("ns-{ns}");
        let labels = Labels::from([("team".to_string(), format!("t{}", ns % 5))]);
        namespaces.push((namespace.clone(), labels.clone()));
        view.insert_namespace(namespace.clone(), labels);
        for w in 0..WORKLOADS_PER_NAMESPACE {
            for p in 0..PODS_PER_WORKLOAD {
                view.insert_pod(PodInfo {
                    namespace: namespace.clone(),
                    name: pod_name(w, p),
                    labels: Labels::from([
                        ("app".to_string(), format!("app-{w}")),
                        ("pod-template-hash".to_string(), "5d8f7c9b6".to_string()),
                    ]),
                    ips: vec![format!("10.{ns}.{w}.{p}").parse().unwrap()],
                    ports: vec![
                        ContainerPort {
                            name: Some("http".into()),
                            port: 8080,
                            protocol: Protocol::TCP,
                        },
                        ContainerPort {
                            name: Some("stats".into()),
                            port: 9000,
                            protocol: Protocol::UDP,
                        },
                    ],
                    workload: Some(Workload {
                        kind: WorkloadKind::Deployment,
                        name: format!("app-{w}"),
                    }),
                });
            }
            if w < GOVERNED_PER_NAMESPACE {
                for direction in ["Egress", "Ingress"] {
                    let mode = if (ns + w) % 2 == 0 {
                        "monitor"
                    } else {
                        "protect"
                    };
                    let policy = policy(ns, w, direction, mode);
                    if mode == "protect" {
                        let rendered = NamedPolicy {
                            namespace: namespace.clone(),
                            name: policy.metadata.name.clone().unwrap(),
                            spec: policy.spec.kubernetes.clone().unwrap(),
                        };
                        view.insert_policy(rendered.clone());
                        network_policies.push(rendered);
                    }
                    policies.push(policy);
                }
            }
        }
    }
    Cluster {
        view,
        namespaces,
        network_policies,
        policies,
    }
}

fn time(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + seconds).unwrap())
}

fn main() {
    let Cluster {
        view,
        namespaces,
        network_policies,
        policies,
    } = cluster();
    assert_eq!(view.pod_count(), 10_000);
    assert_eq!(policies.len(), 1_000);

    // Flows: mostly within a namespace (where the policies are), a TCP/UDP mix of allowed and not.
    let mut rng = Lcg(7);
    let flows: Vec<ObservedFlow> = (0..FLOWS)
        .map(|_| {
            let ns = rng.next(NAMESPACES);
            let to_ns = if rng.next(10) == 0 {
                rng.next(NAMESPACES)
            } else {
                ns
            };
            let (protocol, port) = match rng.next(3) {
                0 => (Protocol::TCP, 8080),
                1 => (Protocol::UDP, 9000 + rng.next(20) as u16),
                _ => (Protocol::TCP, 443),
            };
            ObservedFlow {
                source: side(
                    ns,
                    rng.next(WORKLOADS_PER_NAMESPACE),
                    rng.next(PODS_PER_WORKLOAD),
                ),
                destination: side(
                    to_ns,
                    rng.next(WORKLOADS_PER_NAMESPACE),
                    rng.next(PODS_PER_WORKLOAD),
                ),
                protocol,
                port,
                seen_at: time(0),
                peer_name: None,
            }
        })
        .collect();

    // As a pass of the status sync: the policy set (payloads compiled), then the flows; the first
    // flow compiles the view's policy index.
    let started = Instant::now();
    let set = PolicySet::new(&policies);
    let mut violations = 0usize;
    for flow in &flows {
        violations += attribute(&view, &set, black_box(flow)).unwrap().len();
    }
    let elapsed = started.elapsed();
    let evaluations_per_sec = FLOWS as f64 / elapsed.as_secs_f64();
    println!(
        "attribute: {FLOWS} flows against {} policies / {} pods in {:.3} s: {:.0} flows/s ({violations} violations)",
        policies.len(),
        view.pod_count(),
        elapsed.as_secs_f64(),
        evaluations_per_sec
    );

    // The same pass noting the rules that allowed each flow (rule usage, docs/api.md), as the status
    // sync does. The view's policy index is built by now, so compare it with the pass above knowing
    // that one paid for the index.
    let started = Instant::now();
    let set = PolicySet::new(&policies);
    let mut used = Vec::new();
    let mut matches = 0usize;
    for flow in &flows {
        used.clear();
        attribute_with_usage(&view, &set, black_box(flow), Some(&mut used)).unwrap();
        matches += used.len();
    }
    let elapsed = started.elapsed();
    let with_usage_per_sec = FLOWS as f64 / elapsed.as_secs_f64();
    println!(
        "attribute with rule usage: {FLOWS} flows in {:.3} s: {:.0} flows/s ({matches} policy sides matched by rules)",
        elapsed.as_secs_f64(),
        with_usage_per_sec
    );

    // Status sync: every policy holds 100 active violations (none allowed now, so each one is
    // re-evaluated by the clear step) and receives 10 new observations.
    let statuses: Vec<WorkloadNetworkPolicyStatus> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ns = i / (2 * GOVERNED_PER_NAMESPACE);
            let records = (0..100)
                .map(|id| ViolationRecord {
                    id,
                    timestamp: time(id),
                    source: workload_ref(ns, (id as usize) % WORKLOADS_PER_NAMESPACE),
                    dest: workload_ref(ns, (id as usize + 3) % WORKLOADS_PER_NAMESPACE),
                    protocol: Protocol::TCP,
                    dst_port: Some(10_000 + id as i32),
                    action: p.spec.mode,
                    direction: Some(p.spec.direction),
                    denying_policy_namespace: format!("ns-{ns}"),
                    denying_policy_name: p.metadata.name.clone().unwrap(),
                })
                .collect::<Vec<_>>();
            WorkloadNetworkPolicyStatus {
                observed_generation: Some(1),
                violation_count: 100,
                active_violation_count: 100,
                violations: records,
                ..WorkloadNetworkPolicyStatus::default()
            }
        })
        .collect();
    let observations: Vec<Vec<Observation>> = statuses
        .iter()
        .map(|s| {
            s.violations[..10]
                .iter()
                .map(|r| Observation {
                    timestamp: time(500),
                    source: r.source.clone(),
                    dest: r.dest.clone(),
                    protocol: r.protocol,
                    dst_port: r.dst_port,
                    action: r.action,
                    direction: r.direction.unwrap(),
                    denying_policy_namespace: r.denying_policy_namespace.clone(),
                    denying_policy_name: r.denying_policy_name.clone(),
                })
                .collect()
        })
        .collect();
    let now = time(1000);
    let started = Instant::now();
    let mut changed = 0;
    for ((policy, status), observations) in policies.iter().zip(&statuses).zip(&observations) {
        let allowed_now = AllowedNow::new(&view, policy);
        let outcome = violations::sync(
            SyncInput {
                status: Some(status),
                generation: policy.metadata.generation,
                annotations: None,
                observations,
                now: &now,
            },
            |record| allowed_now.record(record),
        );
        changed += usize::from(black_box(outcome).status_changed);
    }
    let status_sync_ms = started.elapsed().as_secs_f64() * 1000.0;
    println!(
        "status sync: {} policies × 100 violations (+10 observations each) in {status_sync_ms:.1} ms ({changed} changed)",
        policies.len()
    );

    // The status sync derives the evaluator's view from the controller's index at every pass (with
    // the namespaces and NetworkPolicies it watches), and the first evaluation compiles its index.
    let index = index_of(&view);
    const BUILDS: usize = 5;
    let (mut view_build, mut index_build) = (0.0, 0.0);
    for _ in 0..BUILDS {
        let started = Instant::now();
        let built = ClusterView::from_index(
            &index,
            namespaces.iter().cloned(),
            network_policies.iter().cloned(),
        );
        let built_at = Instant::now();
        built.compile();
        index_build += built_at.elapsed().as_secs_f64();
        view_build += (built_at - started).as_secs_f64();
        assert_eq!(black_box(built).pod_count(), 10_000);
    }
    let view_build_ms = view_build * 1000.0 / BUILDS as f64;
    let index_build_ms = index_build * 1000.0 / BUILDS as f64;
    println!(
        "view from the index: 10k pods, {} NetworkPolicies in {view_build_ms:.1} ms, \
         its policy index in {index_build_ms:.1} ms",
        network_policies.len()
    );

    // `cargo xtask bench evaluate` names the file (and reports it); plain `cargo bench` writes
    // target/bench/evaluate.json itself.
    let path = std::env::var_os("BENCH_FIGURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench/evaluate.json")
        });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create the figures' directory");
    }
    let report = json!({
        "evaluations_per_sec": evaluations_per_sec.round(),
        "evaluations_with_rule_usage_per_sec": with_usage_per_sec.round(),
        "status_sync_ms_1k_policies": (status_sync_ms * 10.0).round() / 10.0,
        "view_build_ms_10k_pods": (view_build_ms * 10.0).round() / 10.0,
        "index_build_ms_10k_pods": (index_build_ms * 10.0).round() / 10.0,
        "flows": FLOWS,
        "policies": policies.len(),
        "pods": view.pod_count(),
    });
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap())
        .expect("write the figures");
    println!("wrote {}: {report}", path.display());
}

/// The controller's index holding the pods of `view`, as the pod watch would fill it.
fn index_of(view: &ClusterView) -> Index {
    let mut index = Index::default();
    for ns in 0..NAMESPACES {
        for w in 0..WORKLOADS_PER_NAMESPACE {
            for p in 0..PODS_PER_WORKLOAD {
                let pod = view
                    .pod(&PodKey::new(format!("ns-{ns}"), pod_name(w, p)))
                    .expect("in the view");
                let object: Pod = serde_json::from_value(json!({
                    "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": format!("{ns}-{w}-{p}"),
                                 "labels": pod.labels,
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": format!("app-{w}-5d8f7c9b6"), "uid": "u", "controller": true}]},
                    "spec": {"nodeName": "node-1", "containers": [{"name": "main", "ports": [
                        {"name": "http", "containerPort": 8080},
                        {"name": "stats", "containerPort": 9000, "protocol": "UDP"}]}]},
                    "status": {"phase": "Running", "podIP": pod.ips[0].to_string()}
                }))
                .expect("a valid pod");
                index.apply_pod(&object, 1_000);
            }
        }
    }
    index
}
