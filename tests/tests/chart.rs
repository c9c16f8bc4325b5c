//! The Helm chart (docs/install.md), rendered with `helm template`: every provider × uplink TLS mode ×
//! collector strategy renders and validates with `kubernetes-validate --strict` against Kubernetes 1.31;
//! the values schema rejects unknown keys and bad enums, and templates refuse inconsistent values with
//! clear messages; RBAC is exactly the least privilege each component needs; the agent gets exactly its
//! capabilities and host mounts; the controller runs non-root on a read-only root FS; TLS certificates
//! name the Services they serve and chain to the CA the clients mount; the default OTEL collector's
//! pipelines count violation events into Prometheus. Renders are cached: each value set renders once.

use network_enforcer_controller::monitor::history_store::Limits;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// A tool from PATH, else where `cargo xtask setup` puts it.
fn tool(name: &str, probe: &str) -> PathBuf {
    let on_path = Command::new(name)
        .arg(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if on_path {
        return PathBuf::from(name);
    }
    let cached = PathBuf::from(std::env::var("HOME").unwrap())
        .join(".cache/network-enforcer/bin")
        .join(name);
    assert!(cached.exists(), "{name} not found: run `cargo xtask setup`");
    cached
}

fn helm() -> PathBuf {
    tool("helm", "version")
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/network-enforcer")
}

/// `helm template` with these `--set` values (and the CRDs), in namespace `ne-system`. Entries starting
/// with `--` are passed as flags (`--kube-version=1.20.0`, `--skip-schema-validation`).
fn template(sets: &[&str]) -> Output {
    let mut cmd = Command::new(helm());
    cmd.args([
        "template",
        "release",
        "--namespace",
        "ne-system",
        "--include-crds",
    ])
    .arg(chart());
    for s in sets {
        if s.starts_with("--") {
            cmd.arg(s);
        } else {
            cmd.args(["--set", s]);
        }
    }
    cmd.output().expect("helm runs")
}

/// The rendered text; panics with helm's message if rendering fails. Each value set renders once per
/// test binary (tests share renders; helm costs ~0.5 s a run).
fn render_text(sets: &[&str]) -> String {
    static CACHE: OnceLock<Mutex<HashMap<Vec<String>, String>>> = OnceLock::new();
    let key: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(text) = cache.lock().unwrap().get(&key) {
        return text.clone();
    }
    let out = template(sets);
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    cache.lock().unwrap().insert(key, text.clone());
    text
}

fn render(sets: &[&str]) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(&render_text(sets))
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// helm's error message for values that must be rejected.
fn rejected(sets: &[&str]) -> String {
    let out = template(sets);
    assert!(
        !out.status.success(),
        "helm template {sets:?} should fail but rendered"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

const CONTROLLER: &str = "release-network-enforcer-controller";
const AGENT: &str = "release-network-enforcer-agent";
const CLEANUP: &str = "release-network-enforcer-cleanup";

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
}

fn env_value(container: &Value, name: &str) -> String {
    env(container, name)
        .unwrap_or_else(|| panic!("no env {name}"))
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("env {name} has no literal value"))
        .to_owned()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("{v} is not an array"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_provider_renders_with_its_env() {
    for provider in ["istio", "cilium", "calico", "ebpf"] {
        let docs = render(&[&format!("controller.provider.name={provider}")]);
        let controller = container(find(&docs, "Deployment", CONTROLLER), "controller");
        assert_eq!(env_value(controller, "CONTROLLER_PROVIDER"), provider);
        assert_eq!(env_value(controller, "INGEST_ADDRESS"), "0.0.0.0:9443");
        assert_eq!(
            env_value(controller, "AGENT_SERVICE_ACCOUNT"),
            format!("ne-system/{AGENT}")
        );
        assert_eq!(strings(&controller["args"]), ["run"]);
        find(&docs, "DaemonSet", AGENT);
    }
}

#[test]
fn default_provider_is_istio() {
    let docs = render(&[]);
    let controller = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(controller, "CONTROLLER_PROVIDER"), "istio");
}

#[test]
fn schema_rejects_bad_enums_and_unknown_keys() {
    let cases: &[(&str, &str)] = &[
        (
            "controller.provider.name=linkerd",
            "/controller/provider/name",
        ),
        (
            "controller.provider.calico.tls.mode=insecure",
            "/controller/provider/calico/tls/mode",
        ),
        (
            "controller.provider.cilium.tls.mode=plaintext",
            "/controller/provider/cilium/tls/mode",
        ),
        (
            "controller.image.pullPolicy=Sometimes",
            "/controller/image/pullPolicy",
        ),
        (
            "agent.image.pullPolicy=Sometimes",
            "/agent/image/pullPolicy",
        ),
        (
            "telemetry.collectorStrategy=otel",
            "/telemetry/collectorStrategy",
        ),
        (
            "telemetry.externalCollector.protocol=udp",
            "/telemetry/externalCollector/protocol",
        ),
        ("controller.logFormat=xml", "/controller/logFormat"),
        (
            "controller.agentBudget.cpuCores=lots",
            "/controller/agentBudget/cpuCores",
        ),
        (
            "controller.agentBudget.memoryMiB=-1",
            "/controller/agentBudget/memoryMiB",
        ),
        ("bogus=1", "bogus"),
        ("controller.bogus=1", "bogus"),
        ("controller.provider.istio.bogus=1", "bogus"),
        ("agent.bogus=1", "bogus"),
        ("agent.hostPaths.bogus=/x", "bogus"),
        ("telemetry.bogus=1", "bogus"),
        ("controller.replicas=0", "/controller/replicas"),
        (
            "agent.flushIntervalSeconds=0",
            "/agent/flushIntervalSeconds",
        ),
        ("imagePullSecrets[0].nam=x", "/imagePullSecrets/0"),
        ("controller.env[0].value=1", "/controller/env/0"),
    ];
    for (set, expected) in cases {
        let message = rejected(&[set]);
        assert!(
            message.contains(expected),
            "--set {set}: the message should name {expected}: {message}"
        );
    }
}

#[test]
fn external_collector_needs_an_endpoint() {
    let message = rejected(&["telemetry.collectorStrategy=external"]);
    assert!(
        message.contains("telemetry.externalCollector.endpoint"),
        "{message}"
    );
    render(&[
        "telemetry.collectorStrategy=external",
        "telemetry.externalCollector.endpoint=otel.example:4317",
    ]);
    render(&["telemetry.collectorStrategy=none"]);
}

#[test]
fn local_images_with_pull_policy_never() {
    let docs = render(&[
        "controller.image.repository=network-enforcer.local/controller",
        "controller.image.tag=dev",
        "controller.image.pullPolicy=Never",
        "agent.image.repository=network-enforcer.local/agent",
        "agent.image.tag=dev",
        "agent.image.pullPolicy=Never",
    ]);
    let controller = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(controller["image"], "network-enforcer.local/controller:dev");
    assert_eq!(controller["imagePullPolicy"], "Never");
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(agent["image"], "network-enforcer.local/agent:dev");
    assert_eq!(agent["imagePullPolicy"], "Never");
    let cleanup = container(find(&docs, "Job", CLEANUP), "cleanup");
    assert_eq!(cleanup["image"], "network-enforcer.local/controller:dev");
    assert_eq!(cleanup["imagePullPolicy"], "Never");
}

#[test]
fn image_tag_defaults_to_app_version() {
    let docs = render(&[]);
    let controller = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert!(
        controller["image"].as_str().unwrap().ends_with(":0.1.0"),
        "{}",
        controller["image"]
    );
}

#[test]
fn image_pull_secrets_as_strings_or_names() {
    let docs = render(&[
        "imagePullSecrets[0]=plain",
        "imagePullSecrets[1].name=named",
    ]);
    let expected = serde_json::json!([{"name": "plain"}, {"name": "named"}]);
    for (kind, name) in [
        ("Deployment", CONTROLLER),
        ("DaemonSet", AGENT),
        ("Job", CLEANUP),
        ("Deployment", COLLECTOR),
    ] {
        let w = find(&docs, kind, name);
        assert_eq!(
            w["spec"]["template"]["spec"]["imagePullSecrets"], expected,
            "{kind}"
        );
    }
    let docs = render(&[]);
    let w = find(&docs, "Deployment", CONTROLLER);
    assert!(w["spec"]["template"]["spec"]["imagePullSecrets"].is_null());
}

/// A ClusterRole's rules as (apiGroup, resource, sorted verbs), one per group × resource.
fn rules(role: &Value) -> BTreeSet<(String, String, Vec<String>)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let mut verbs = strings(&rule["verbs"]);
        verbs.sort();
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                out.insert((group.clone(), resource, verbs.clone()));
            }
        }
        assert!(rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none());
    }
    out
}

fn expect(spec: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, Vec<String>)> {
    spec.iter()
        .map(|(g, r, v)| {
            let mut verbs: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            verbs.sort();
            (g.to_string(), r.to_string(), verbs)
        })
        .collect()
}

const READ: &[&str] = &["get", "list", "watch"];
const CRUD: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

#[test]
fn rbac_is_exactly_least_privilege() {
    let docs = render(&[]);
    let text = render_text(&[]);
    let roles: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .collect();
    assert_eq!(
        roles.len(),
        6,
        "controller, agent, cleanup (cluster-wide, and in the release namespace), leader election, \
         the persisted edge history"
    );
    for role in &roles {
        assert!(
            !role["rules"].to_string().contains('*'),
            "wildcard in {}",
            role["metadata"]["name"]
        );
    }
    let ne = "networkenforcer.kubewarden.io";
    let controller_rules = |cluster_policies: &[&str]| {
        expect(&[
            ("", "pods", READ),
            ("", "services", READ),
            ("", "nodes", READ),
            ("", "namespaces", READ),
            ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
            ("", "endpoints", &["list", "watch"]),
            ("apps", "deployments", READ),
            ("apps", "statefulsets", READ),
            ("apps", "daemonsets", READ),
            ("batch", "jobs", READ),
            (ne, "workloadnetworkpolicies", CRUD),
            (ne, "workloadnetworkpolicyproposals", CRUD),
            (ne, "clusternetworkpolicyproposals", CRUD),
            (
                ne,
                "workloadnetworkpolicies/status",
                &["get", "update", "patch"],
            ),
            (
                ne,
                "workloadnetworkpolicyproposals/status",
                &["get", "update", "patch"],
            ),
            (
                ne,
                "clusternetworkpolicyproposals/status",
                &["get", "update", "patch"],
            ),
            ("networking.k8s.io", "networkpolicies", CRUD),
            ("security.istio.io", "authorizationpolicies", CRUD),
            (
                "policy.networking.k8s.io",
                "clusternetworkpolicies",
                cluster_policies,
            ),
            ("authentication.k8s.io", "tokenreviews", &["create"]),
            ("events.k8s.io", "events", &["create", "patch"]),
        ])
    };
    // Cluster proposals on (the default): promoted ones are created, repaired and deleted.
    assert_eq!(
        rules(find(&docs, "ClusterRole", CONTROLLER)),
        controller_rules(&["list", "watch", "create", "patch", "delete"])
    );
    // Off, or a controller of one namespace: ClusterNetworkPolicies are only read.
    for off in [
        "controller.clusterProposals.enabled=false",
        "controller.watchNamespace=apps",
    ] {
        let docs = render(&[off]);
        assert_eq!(
            rules(find(&docs, "ClusterRole", CONTROLLER)),
            controller_rules(&["list", "watch"]),
            "{off}"
        );
        let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
        assert_eq!(env_value(c, "CLUSTER_PROPOSALS_INTERVAL"), "0s", "{off}");
    }
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(c, "CLUSTER_PROPOSALS_INTERVAL"), "1m");
    assert_eq!(
        rules(find(&docs, "ClusterRole", AGENT)),
        expect(&[
            ("", "pods", READ),
            ("", "services", &["list", "watch"]),
            ("", "nodes", &["list", "watch"]),
        ])
    );
    assert_eq!(
        rules(find(&docs, "ClusterRole", CLEANUP)),
        expect(&[
            ("networking.k8s.io", "networkpolicies", &["list", "delete"]),
            (
                "security.istio.io",
                "authorizationpolicies",
                &["list", "delete"]
            ),
            (
                "policy.networking.k8s.io",
                "clusternetworkpolicies",
                &["list", "delete"]
            ),
        ])
    );
    // The hook stops the controller first: scale exactly its Deployment, and see its pods go; then
    // it deletes the persisted edge history, by name (as many ConfigMaps as the controller writes),
    // and the evidence claims.
    let claims = format!("{CONTROLLER}-evidence-claims");
    let history_maps: Vec<String> = (0..Limits::default().max_shards)
        .map(|i| format!("{CONTROLLER}-edge-history-{i}"))
        .chain([claims.clone()])
        .collect();
    let stop = find(&docs, "Role", CLEANUP);
    assert_eq!(stop["metadata"]["namespace"], "ne-system");
    assert_eq!(
        stop["rules"],
        serde_json::json!([
            {"apiGroups": ["apps"], "resources": ["deployments/scale"],
             "resourceNames": [CONTROLLER], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["delete"],
             "resourceNames": history_maps},
        ])
    );
    let job = container(find(&docs, "Job", CLEANUP), "cleanup");
    assert_eq!(
        env_value(job, "EDGE_HISTORY_CONFIGMAP"),
        format!("{CONTROLLER}-edge-history")
    );
    assert_eq!(env_value(job, "EVIDENCE_CLAIMS_CONFIGMAP"), claims);
    // The controller persists its protect gate's history and its evidence claims: get and patch
    // those names, create any ConfigMap of the release namespace (create cannot be limited to
    // names), nothing else.
    let history = format!("{CONTROLLER}-edge-history");
    let role = find(&docs, "Role", &history);
    assert_eq!(role["metadata"]["namespace"], "ne-system");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"],
             "resourceNames": history_maps},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        ])
    );
    let binding = find(&docs, "RoleBinding", &history);
    assert_eq!(binding["roleRef"]["name"], history.as_str());
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": "ne-system"}])
    );
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(c, "EDGE_HISTORY_CONFIGMAP"), history);
    assert_eq!(env_value(c, "EVIDENCE_CLAIMS_CONFIGMAP"), claims);
    assert_eq!(env_value(c, "EDGE_HISTORY_PERSIST_INTERVAL"), "1m");
    let binding = find(&docs, "RoleBinding", CLEANUP);
    assert_eq!(binding["metadata"]["namespace"], "ne-system");
    assert_eq!(
        (&binding["roleRef"]["kind"], &binding["roleRef"]["name"]),
        (&serde_json::json!("Role"), &serde_json::json!(CLEANUP))
    );
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": CLEANUP, "namespace": "ne-system"}])
    );
    // Each role is bound to its own ServiceAccount in the release namespace, and used by its workload.
    for (name, kind) in [
        (CONTROLLER, "Deployment"),
        (AGENT, "DaemonSet"),
        (CLEANUP, "Job"),
    ] {
        let binding = find(&docs, "ClusterRoleBinding", name);
        assert_eq!(binding["roleRef"]["name"], name);
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": "ne-system"}])
        );
        find(&docs, "ServiceAccount", name);
        assert_eq!(
            find(&docs, kind, name)["spec"]["template"]["spec"]["serviceAccountName"],
            name
        );
    }
    assert!(!text.contains("cluster-admin"));

    // Leader election: the Lease in the release namespace only, named after the Deployment.
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(c, "LEADER_ELECT"), "true");
    assert_eq!(env_value(c, "LEADER_ELECTION_LEASE"), CONTROLLER);
    let election = format!("{CONTROLLER}-leader-election");
    let role = find(&docs, "Role", &election);
    assert_eq!(role["metadata"]["namespace"], "ne-system");
    assert_eq!(
        rules(role),
        expect(&[(
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"]
        )])
    );
    let binding = find(&docs, "RoleBinding", &election);
    assert_eq!(binding["metadata"]["namespace"], "ne-system");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], election.as_str());
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": "ne-system"}])
    );
    // Without leader election: no Lease access, and only one replica.
    let docs = render(&["controller.leaderElection.enabled=false"]);
    assert!(
        !docs
            .iter()
            .any(|d| d["metadata"]["name"] == election.as_str())
    );
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(c, "LEADER_ELECT"), "false");
    assert!(env(c, "LEADER_ELECTION_LEASE").is_none());
}

#[test]
fn cleanup_runs_as_a_pre_delete_hook() {
    let docs = render(&[]);
    for (kind, name) in [
        ("ServiceAccount", CLEANUP),
        ("ClusterRole", CLEANUP),
        ("ClusterRoleBinding", CLEANUP),
        ("Role", CLEANUP),
        ("RoleBinding", CLEANUP),
        ("Job", CLEANUP),
    ] {
        assert_eq!(
            find(&docs, kind, name)["metadata"]["annotations"]["helm.sh/hook"],
            "pre-delete",
            "{kind}"
        );
    }
    let job = find(&docs, "Job", CLEANUP);
    let weight = |d: &Value| -> i64 {
        d["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(weight(find(&docs, "ClusterRoleBinding", CLEANUP)) < weight(job));
    assert!(weight(find(&docs, "RoleBinding", CLEANUP)) < weight(job));
    let c = container(job, "cleanup");
    assert_eq!(strings(&c["command"]), ["network-enforcer-controller"]);
    assert_eq!(strings(&c["args"]), ["cleanup"]);
    // It stops this release's controller before deleting what the controller rendered.
    assert_eq!(env_value(c, "CONTROLLER_DEPLOYMENT"), CONTROLLER);
    assert_eq!(env_value(c, "POD_NAMESPACE"), "ne-system");
    let stop: u64 = env_value(c, "STOP_TIMEOUT_SECONDS").parse().unwrap();
    let deadline = job["spec"]["activeDeadlineSeconds"].as_u64().unwrap();
    assert!(
        stop < deadline,
        "the hook gives up waiting before its Job's deadline"
    );
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
}

/// Every hostPath the agent mounts: (mountPath, host path, readOnly).
fn host_mounts(ds: &Value) -> BTreeSet<(String, String, bool)> {
    let pod = &ds["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    let agent = container(ds, "agent");
    let mut out = BTreeSet::new();
    for v in volumes.iter().filter(|v| v.get("hostPath").is_some()) {
        let mounts: Vec<&Value> = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["name"] == v["name"])
            .collect();
        assert_eq!(mounts.len(), 1, "host volume {} mounted once", v["name"]);
        out.insert((
            mounts[0]["mountPath"].as_str().unwrap().to_owned(),
            v["hostPath"]["path"].as_str().unwrap().to_owned(),
            mounts[0]["readOnly"] == true,
        ));
    }
    out
}

#[test]
fn agent_has_exactly_its_capabilities_and_mounts() {
    let docs = render(&[]);
    let ds = find(&docs, "DaemonSet", AGENT);
    let pod = &ds["spec"]["template"]["spec"];
    let agent = container(ds, "agent");
    let sc = &agent["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let added: BTreeSet<String> = strings(&sc["capabilities"]["add"]).into_iter().collect();
    let wanted: BTreeSet<String> = ["BPF", "PERFMON", "NET_ADMIN"]
        .map(String::from)
        .into_iter()
        .collect();
    assert_eq!(added, wanted);
    assert!(!render_text(&[]).contains("privileged: true"));
    // agent/README.md: attribution reads the host's /proc and takes its own network namespace as the host's.
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(strings(&agent["args"]), ["run"]);

    // Host mounts per provider: the kernel file systems always; the Hubble socket's directory and the
    // state directory (the only writable one: the resume point) for cilium; the container logs
    // (read-only) and the state directory (the read positions) for istio.
    let kernel = [
        ("/sys/fs/bpf", "/sys/fs/bpf", true),
        ("/sys/fs/cgroup", "/sys/fs/cgroup", true),
        ("/sys/kernel/btf", "/sys/kernel/btf", true),
    ];
    /// (mountPath, host path, readOnly).
    type Mounts<'a> = &'a [(&'a str, &'a str, bool)];
    let cases: &[(&str, Mounts)] = &[
        ("ebpf", &[]),
        ("calico", &[]),
        (
            "cilium",
            &[
                ("/var/run/cilium", "/var/run/cilium", true),
                (
                    "/var/lib/network-enforcer",
                    "/var/lib/network-enforcer",
                    false,
                ),
            ],
        ),
        (
            "istio",
            &[
                ("/var/log/containers", "/var/log/containers", true),
                ("/var/log/pods", "/var/log/pods", true),
                (
                    "/var/lib/network-enforcer",
                    "/var/lib/network-enforcer",
                    false,
                ),
            ],
        ),
    ];
    for (provider, extra) in cases {
        let docs = render(&[&format!("controller.provider.name={provider}")]);
        let ds = find(&docs, "DaemonSet", AGENT);
        let agent = container(ds, "agent");
        let wanted: BTreeSet<(String, String, bool)> = kernel
            .iter()
            .chain(extra.iter())
            .map(|(m, h, ro)| (m.to_string(), h.to_string(), *ro))
            .collect();
        assert_eq!(host_mounts(ds), wanted, "{provider}");
        match *provider {
            "cilium" => {
                assert_eq!(
                    env_value(agent, "NE_HUBBLE_SOCKET"),
                    "/var/run/cilium/hubble.sock"
                );
                assert_eq!(
                    env_value(agent, "NE_HUBBLE_STATE_FILE"),
                    "/var/lib/network-enforcer/hubble-resume.json"
                );
            }
            "istio" => {
                assert_eq!(
                    env_value(agent, "NE_ZTUNNEL_LOG_GLOB"),
                    "/var/log/containers/ztunnel-*_istio-system_istio-proxy-*.log"
                );
                assert_eq!(
                    env_value(agent, "NE_ZTUNNEL_STATE_FILE"),
                    "/var/lib/network-enforcer/ztunnel-positions.json"
                );
            }
            _ => {}
        }
        if *provider != "cilium" {
            assert!(env(agent, "NE_HUBBLE_SOCKET").is_none(), "{provider}");
        }
        if *provider != "istio" {
            assert!(env(agent, "NE_ZTUNNEL_LOG_GLOB").is_none(), "{provider}");
        }
    }

    let volumes = pod["volumes"].as_array().unwrap();
    let token = volumes
        .iter()
        .find_map(|v| v["projected"]["sources"].as_array())
        .expect("a projected token volume")
        .iter()
        .find_map(|s| s.get("serviceAccountToken"))
        .expect("a serviceAccountToken source");
    assert_eq!(token["audience"], "network-enforcer");

    assert_eq!(env_value(agent, "NE_FLUSH_SECONDS"), "10");
    assert_eq!(env_value(agent, "NE_DEDUPE_SECONDS"), "5");
    assert!(env(agent, "NE_RING_BUFFER_BYTES").is_none());
    assert!(env(agent, "NE_FLOW_MAP_ENTRIES").is_none());
    assert_eq!(agent["ports"][0]["containerPort"], 9464);
    assert_eq!(env_value(agent, "NE_METRICS_PORT"), "9464");

    assert_eq!(pod["priorityClassName"], "system-node-critical");
    // Runs on every node, tainted ones included.
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"operator": "Exists"}])
    );
}

#[test]
fn agent_values_reach_its_env_and_privileges() {
    let docs = render(&[
        "agent.flushIntervalSeconds=3",
        "agent.dedupeSeconds=0",
        "agent.refreshSeconds=12",
        "agent.ringBufferBytes=1048576",
        "agent.flowMapEntries=262144",
        "agent.extraCapabilities[0]=SYS_PTRACE",
    ]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(env_value(agent, "NE_FLUSH_SECONDS"), "3");
    assert_eq!(env_value(agent, "NE_DEDUPE_SECONDS"), "0");
    assert_eq!(env_value(agent, "NE_REFRESH_SECONDS"), "12");
    assert_eq!(env_value(agent, "NE_RING_BUFFER_BYTES"), "1048576");
    assert_eq!(env_value(agent, "NE_FLOW_MAP_ENTRIES"), "262144");
    assert_eq!(
        strings(&agent["securityContext"]["capabilities"]["add"]),
        ["BPF", "PERFMON", "NET_ADMIN", "SYS_PTRACE"]
    );

    let docs = render(&["agent.priorityClassName="]);
    let pod = &find(&docs, "DaemonSet", AGENT)["spec"]["template"]["spec"];
    assert!(pod.get("priorityClassName").is_none());

    let docs = render(&["agent.privileged=true"]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(agent["securityContext"]["privileged"], true);
}

#[test]
fn agent_enforcement_adds_only_what_it_reads_and_names_its_table_after_the_release() {
    // Off (the default): no enforcement variables but the table name (an agent with enforcement
    // off removes a table of that name left behind), no extra rights.
    let docs = render(&[]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(env_value(agent, "NE_ENFORCEMENT_TABLE"), "ne_release");
    assert!(
        agent["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != "NE_ENFORCEMENT")
    );
    assert!(
        docs.iter()
            .all(|d| !(d["kind"] == "Role" && d["metadata"]["name"] == AGENT))
    );

    let docs = render(&[
        "agent.enforcement.mode=networkpolicy",
        "agent.enforcement.failOpen=true",
    ]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(env_value(agent, "NE_ENFORCEMENT"), "networkpolicy");
    assert_eq!(env_value(agent, "NE_ENFORCEMENT_FAIL_OPEN"), "true");
    assert_eq!(
        env_value(agent, "NE_DAEMONSET"),
        format!("ne-system/{AGENT}")
    );
    let group: u32 = env_value(agent, "NE_ENFORCEMENT_LOG_GROUP")
        .parse()
        .unwrap();
    assert!((1000..61000).contains(&group), "{group}");
    assert_eq!(
        rules(find(&docs, "ClusterRole", AGENT)),
        expect(&[
            ("", "pods", READ),
            ("", "services", &["list", "watch"]),
            ("", "nodes", &["list", "watch"]),
            ("", "namespaces", &["list", "watch"]),
            ("networking.k8s.io", "networkpolicies", &["list", "watch"]),
            (
                "policy.networking.k8s.io",
                "clusternetworkpolicies",
                &["list", "watch"]
            ),
        ])
    );
    // Its own DaemonSet only, to tell an uninstall from a restart.
    let role = find(&docs, "Role", AGENT);
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": ["apps"], "resources": ["daemonsets"],
                            "resourceNames": [AGENT], "verbs": ["get", "list", "watch"]}])
    );
    assert_eq!(find(&docs, "RoleBinding", AGENT)["roleRef"]["name"], AGENT);
    assert!(rejected(&["agent.enforcement.mode=iptables"]).contains("agent/enforcement/mode"));
}

#[test]
fn controller_runs_non_root_on_a_read_only_root_fs() {
    let docs = render(&[]);
    let deploy = find(&docs, "Deployment", CONTROLLER);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(pod.get("hostNetwork").is_none() && pod.get("hostPID").is_none());
    let c = container(deploy, "controller");
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_ne!(sc["runAsUser"], 0);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"].get("add").is_none());
    // Probes on the HTTP endpoint (METRICS_ADDRESS): liveness /healthz, readiness /readyz.
    assert_eq!(env_value(c, "METRICS_ADDRESS"), "0.0.0.0:8080");
    let metrics_port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a metrics port");
    assert_eq!(metrics_port["containerPort"], 8080);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(env_value(c, "WNP_STATUS_UPDATE_INTERVAL"), "30s");
    assert_eq!(env_value(c, "UNUSED_RULE_AFTER"), "7d");
    assert_eq!(env_value(c, "EDGE_HISTORY_RETENTION"), "7d");
    assert_eq!(env_value(c, "EDGE_HISTORY_MAX_EDGES"), "200000");
    assert_eq!(env_value(c, "EDGE_HISTORY_WARMUP"), "2m");
    assert_eq!(deploy["spec"]["replicas"], 1);
    // The controller writes nothing to its file system: every mount is read-only.
    for m in c["volumeMounts"].as_array().unwrap() {
        assert_eq!(m["readOnly"], true, "{}", m["mountPath"]);
    }
    for var in ["POD_NAME", "POD_NAMESPACE"] {
        assert!(
            env(c, var).unwrap()["valueFrom"]["fieldRef"]["fieldPath"]
                .as_str()
                .unwrap()
                .starts_with("metadata."),
            "{var}"
        );
    }
    assert_eq!(env_value(c, "LOG_LEVEL"), "info");
    assert_eq!(env_value(c, "FLUSH_INTERVAL_SECONDS"), "2");
    assert_eq!(env_value(c, "RESOLUTION_GRACE_SECONDS"), "30");
    assert_eq!(env_value(c, "MAX_EXTERNAL_PEERS_PER_PORT"), "50");
    assert_eq!(env_value(c, "MAX_PORTS_PER_RULE"), "64");
    assert_eq!(env_value(c, "MAX_RULES_PER_PROPOSAL"), "500");
    assert!(env(c, "EXCLUDE_NAMESPACES").is_none());

    let docs = render(&[
        "controller.logLevel=debug",
        "controller.excludeNamespaces={kube-system,istio-system}",
        "controller.env[0].name=EXTRA",
        "controller.env[0].value=on",
        "controller.probes.enabled=false",
        "controller.metricsPort=9090",
        "controller.wnpStatusUpdateInterval=1m",
        "controller.unusedRuleAfter=36h",
        "controller.edgeHistory.retention=2d",
        "controller.edgeHistory.maxEdges=5000",
        "controller.edgeHistory.warmup=0s",
        "controller.agentSilenceAfter=5m",
        "controller.agentBudget.cpuCores=0.25",
        "controller.agentBudget.memoryMiB=96",
        "controller.replicas=2",
        "controller.resolutionGraceSeconds=0",
        "controller.maxExternalPeersPerPort=5",
        "controller.maxPortsPerRule=8",
        "controller.maxRulesPerProposal=20",
    ]);
    let deploy = find(&docs, "Deployment", CONTROLLER);
    assert_eq!(deploy["spec"]["replicas"], 2);
    // Only the leader is ready: a rolling update would never finish (docs/install.md, "Upgrade").
    assert_eq!(deploy["spec"]["strategy"]["type"], "Recreate");
    let c = container(deploy, "controller");
    assert!(c.get("livenessProbe").is_none() && c.get("readinessProbe").is_none());
    assert_eq!(env_value(c, "METRICS_ADDRESS"), "0.0.0.0:9090");
    assert_eq!(env_value(c, "WNP_STATUS_UPDATE_INTERVAL"), "1m");
    assert_eq!(env_value(c, "UNUSED_RULE_AFTER"), "36h");
    assert_eq!(env_value(c, "EDGE_HISTORY_RETENTION"), "2d");
    assert_eq!(env_value(c, "EDGE_HISTORY_MAX_EDGES"), "5000");
    assert_eq!(env_value(c, "EDGE_HISTORY_WARMUP"), "0s");
    assert_eq!(env_value(c, "AGENT_SILENCE_AFTER"), "5m");
    assert_eq!(env_value(c, "AGENT_CPU_BUDGET"), "0.25");
    assert_eq!(env_value(c, "AGENT_MEMORY_BUDGET_MIB"), "96");
    assert_eq!(env_value(c, "RESOLUTION_GRACE_SECONDS"), "0");
    assert_eq!(env_value(c, "MAX_EXTERNAL_PEERS_PER_PORT"), "5");
    assert_eq!(env_value(c, "MAX_PORTS_PER_RULE"), "8");
    assert_eq!(env_value(c, "MAX_RULES_PER_PROPOSAL"), "20");
    assert_eq!(
        find(&docs, "Service", &format!("{CONTROLLER}-metrics"))["spec"]["ports"][0]["port"],
        9090
    );
    assert_eq!(env_value(c, "LOG_LEVEL"), "debug");
    assert_eq!(
        env_value(c, "EXCLUDE_NAMESPACES"),
        "kube-system,istio-system"
    );
    assert_eq!(env_value(c, "EXTRA"), "on");
}

#[test]
fn ingest_service_selects_the_controller() {
    let docs = render(&[]);
    let svc = find(&docs, "Service", CONTROLLER);
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["port"], 9443);
    assert_eq!(port["targetPort"], "ingest");
    let labels = &find(&docs, "Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "{k}");
    }
    // The agent's pods do not match the controller's selector.
    let agent_labels = &find(&docs, "DaemonSet", AGENT)["spec"]["template"]["metadata"]["labels"];
    assert_ne!(
        agent_labels["app.kubernetes.io/component"],
        svc["spec"]["selector"]["app.kubernetes.io/component"]
    );
}

#[test]
fn admission_policy_can_be_disabled() {
    let kinds = |docs: &[Value]| {
        docs.iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
            .count()
    };
    // The promote-label policy (both kinds of proposal) and the proposal-author policy.
    assert_eq!(kinds(&render(&[])), 2);
    assert_eq!(kinds(&render(&["admissionPolicy.enabled=false"])), 0);
}

const PROVIDERS: [&str; 4] = ["istio", "cilium", "calico", "ebpf"];
const UPLINK_MODES: [&str; 4] = ["selfSigned", "issuer", "existingSecret", "insecure"];
const STRATEGIES: [&str; 3] = ["default", "external", "none"];

/// The values of one matrix cell: what each mode needs to render.
fn matrix_sets(provider: &str, mode: &str, strategy: &str) -> Vec<String> {
    let mut sets = vec![
        format!("controller.provider.name={provider}"),
        format!("uplink.tls.mode={mode}"),
        format!("telemetry.collectorStrategy={strategy}"),
    ];
    match mode {
        "issuer" => sets.push("uplink.tls.issuerRef.name=ca-issuer".into()),
        "existingSecret" => sets.push("uplink.tls.existingSecret.name=my-ingest-tls".into()),
        _ => {}
    }
    if strategy == "external" {
        sets.extend([
            "telemetry.externalCollector.endpoint=https://otel.example:4317".to_string(),
            "telemetry.externalCollector.otelCollectorCertificateSecret=otel-ca".into(),
            "telemetry.externalCollector.otelCollectorClientCertificateSecret=otel-client".into(),
        ]);
    }
    sets
}

fn mount_path<'a>(c: &'a Value, volume: &str) -> Option<&'a str> {
    c["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == volume)
        .and_then(|m| m["mountPath"].as_str())
}

fn volume<'a>(workload: &'a Value, name: &str) -> Option<&'a Value> {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
}

/// Every provider × uplink TLS mode × collector strategy renders; in each, the agent and the controller
/// agree on the transport, every file an env var names is mounted, and the whole output validates
/// against the Kubernetes 1.31 schemas (cert-manager Certificates are checked by hand: no schema).
#[test]
fn every_provider_tls_mode_and_collector_strategy_renders_and_validates_for_kubernetes_1_31() {
    let cells: Vec<(&str, &str, &str)> = PROVIDERS
        .iter()
        .flat_map(|p| {
            UPLINK_MODES
                .iter()
                .flat_map(move |m| STRATEGIES.iter().map(move |s| (*p, *m, *s)))
        })
        .collect();
    let texts: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = cells
            .chunks(cells.len().div_ceil(4))
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|(p, m, s)| {
                            let sets = matrix_sets(p, m, s);
                            render_text(&sets.iter().map(String::as_str).collect::<Vec<_>>())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(texts.len(), 48);

    // kubernetes-validate costs ~80 ms per document; most documents are the same in every cell, so
    // each distinct one is validated once (generated key material normalized first).
    let mut unique: BTreeSet<String> = BTreeSet::new();
    for ((provider, mode, strategy), text) in cells.iter().zip(&texts) {
        let cell = format!("{provider}/{mode}/{strategy}");
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(text)
            .map(|doc| Value::deserialize(doc).unwrap())
            .filter(|v: &Value| !v.is_null())
            .collect();
        let deploy = find(&docs, "Deployment", CONTROLLER);
        let controller = container(deploy, "controller");
        let ds = find(&docs, "DaemonSet", AGENT);
        let agent = container(ds, "agent");
        assert_eq!(
            env_value(controller, "CONTROLLER_PROVIDER"),
            *provider,
            "{cell}"
        );

        // Transport: https + CA + server name, or http on both sides.
        let url = env_value(agent, "NE_CONTROLLER_URL");
        if *mode == "insecure" {
            assert_eq!(
                url,
                format!("http://{CONTROLLER}.ne-system.svc:9443"),
                "{cell}"
            );
            assert_eq!(env_value(controller, "INGEST_INSECURE"), "true", "{cell}");
            assert_eq!(env_value(agent, "NE_CONTROLLER_INSECURE"), "true", "{cell}");
            assert!(env(controller, "INGEST_TLS_CERT_FILE").is_none(), "{cell}");
            assert!(env(agent, "NE_CONTROLLER_CA_FILE").is_none(), "{cell}");
        } else {
            assert_eq!(
                url,
                format!("https://{CONTROLLER}.ne-system.svc:9443"),
                "{cell}"
            );
            assert_eq!(
                env_value(agent, "NE_CONTROLLER_SERVER_NAME"),
                format!("{CONTROLLER}.ne-system.svc"),
                "{cell}"
            );
            assert!(env(controller, "INGEST_INSECURE").is_none(), "{cell}");
            assert!(env(agent, "NE_CONTROLLER_INSECURE").is_none(), "{cell}");
            let secret = if *mode == "existingSecret" {
                "my-ingest-tls".to_string()
            } else {
                "release-network-enforcer-uplink-tls".to_string()
            };
            // The controller mounts the key pair, the agent only the CA, from the same Secret.
            let cv = volume(deploy, "ingest-tls").expect("ingest-tls volume");
            assert_eq!(cv["secret"]["secretName"], secret.as_str(), "{cell}");
            let av = volume(ds, "controller-ca").expect("controller-ca volume");
            assert_eq!(av["secret"]["secretName"], secret.as_str(), "{cell}");
            assert_eq!(
                av["secret"]["items"],
                serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}]),
                "{cell}: the agents never see the key"
            );
            for (c, var, vol) in [
                (controller, "INGEST_TLS_CERT_FILE", "ingest-tls"),
                (controller, "INGEST_TLS_KEY_FILE", "ingest-tls"),
                (agent, "NE_CONTROLLER_CA_FILE", "controller-ca"),
            ] {
                let file = env_value(c, var);
                let dir = mount_path(c, vol).unwrap_or_else(|| panic!("{cell}: {vol} mounted"));
                assert!(file.starts_with(&format!("{dir}/")), "{cell}: {var}={file}");
            }
            let generated = docs
                .iter()
                .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == secret.as_str());
            let certificate = docs
                .iter()
                .any(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == secret.as_str());
            assert_eq!(generated, *mode == "selfSigned", "{cell}");
            assert_eq!(certificate, *mode == "issuer", "{cell}");
        }

        // Telemetry.
        let collector = docs
            .iter()
            .any(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == COLLECTOR);
        assert_eq!(collector, *strategy == "default", "{cell}");
        let endpoint = env(controller, "OTEL_EXPORTER_OTLP_ENDPOINT");
        assert_eq!(endpoint.is_some(), *strategy != "none", "{cell}");
        for var in [
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ] {
            if let Some(e) = env(controller, var) {
                let file = e["value"].as_str().unwrap();
                let mounted = controller["volumeMounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| file.starts_with(m["mountPath"].as_str().unwrap()));
                assert!(mounted, "{cell}: {var}={file} is mounted");
            }
        }

        // Goldmane (calico only).
        assert_eq!(
            env(controller, "GOLDMANE_ADDRESS").is_some(),
            *provider == "calico",
            "{cell}"
        );

        for d in docs.iter().filter(|d| d["kind"] == "Certificate") {
            assert_eq!(d["apiVersion"], "cert-manager.io/v1", "{cell}");
            assert!(d["spec"]["secretName"].is_string(), "{cell}");
            assert!(d["spec"]["issuerRef"]["name"].is_string(), "{cell}");
            assert!(!strings(&d["spec"]["usages"]).is_empty(), "{cell}");
        }

        for mut doc in docs {
            if doc["kind"] == "Secret" {
                for v in doc["data"]
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|m| m.values_mut())
                {
                    *v = Value::from("AA==");
                }
            }
            unique.insert(serde_json::to_string(&doc).unwrap());
        }
    }

    let file = std::env::temp_dir().join(format!("ne-chart-matrix-{}.yaml", std::process::id()));
    let docs: Vec<Value> = unique
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let yaml: Vec<String> = docs
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    std::fs::write(&file, yaml.join("---\n")).unwrap();
    let validate = tool("kubernetes-validate", "--version");
    let out = Command::new(&validate)
        .args(["--strict", "-k", "1.31.0"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&file).unwrap();
    assert!(out.status.success(), "{report}");
    assert!(!report.contains("ERROR"), "{report}");
    // Only Certificates lack a schema; everything else was validated.
    for line in report.lines().filter(|l| l.starts_with("WARN")) {
        assert!(line.contains("kind Certificate"), "{line}");
    }
    for kind in [
        "deployment/",
        "daemonset/",
        "validatingadmissionpolicy/",
        "secret/",
    ] {
        assert!(report.contains(kind), "{kind} validated:\n{report}");
    }
    // Every distinct document was validated (or, for Certificates, warned about).
    let certificates = docs.iter().filter(|d| d["kind"] == "Certificate").count();
    assert_eq!(
        report.matches(" passed for resource ").count(),
        docs.len() - certificates,
        "{report}"
    );
    // Distinct agent DaemonSets: {istio, cilium, calico = ebpf} × {chart Secret, user Secret, insecure}.
    assert_eq!(docs.iter().filter(|d| d["kind"] == "DaemonSet").count(), 9);
}

/// Uncommon values through the schemas too (pull secrets, privileged, scoping, scheduling).
#[test]
fn uncommon_values_validate_for_kubernetes_1_31() {
    let validate = tool("kubernetes-validate", "--version");
    let sets = [
        "imagePullSecrets[0]=plain",
        "imagePullSecrets[1].name=named",
        "agent.privileged=true",
        "agent.ringBufferBytes=1048576",
        "controller.watchNamespace=shop",
        "controller.excludeNamespaces={kube-system}",
        "controller.podLabels.team=net",
        "controller.podAnnotations.note=x",
        "controller.nodeSelector.role=infra",
        "controller.provider.name=cilium",
        "agent.hubble.source=relay",
        "controller.provider.cilium.tls.mode=existingSecret",
        "controller.provider.cilium.tls.existingSecret.name=relay-client",
        "controller.provider.cilium.tls.existingSecret.caBundleConfigMap=relay-ca",
        "telemetry.collector.nodeSelector.role=infra",
    ];
    let file = std::env::temp_dir().join(format!("ne-chart-uncommon-{}.yaml", std::process::id()));
    std::fs::write(&file, render_text(&sets)).unwrap();
    let out = Command::new(&validate)
        .args(["--strict", "-k", "1.31.0"])
        .arg(&file)
        .output()
        .expect("kubernetes-validate runs");
    std::fs::remove_file(&file).unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !report.contains("ERROR"),
        "{report}"
    );
    assert!(report.contains("daemonset/"), "{report}");
}

const COLLECTOR: &str = "release-network-enforcer-otel-collector";

/// The PEM of `key` in a rendered Secret.
fn secret_pem(docs: &[Value], name: &str, key: &str) -> String {
    let b64 = find(docs, "Secret", name)["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{name} has no {key}"))
        .to_owned();
    String::from_utf8(base64_decode(&b64)).unwrap()
}

/// Standard base64 (Secret data), padding allowed.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
    {
        let v = ALPHABET
            .iter()
            .position(|a| *a == c)
            .unwrap_or_else(|| panic!("not base64: {:?}", c as char)) as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// `openssl` on PEM inputs written to temporary files; returns stdout, panics on failure.
fn openssl(args: &[&str], pems: &[(&str, &str)]) -> String {
    let dir = std::env::temp_dir().join(format!(
        "ne-chart-pem-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("openssl");
    for a in args {
        match pems.iter().find(|(n, _)| n == a) {
            Some((n, pem)) => {
                let f = dir.join(n);
                std::fs::write(&f, pem).unwrap();
                cmd.arg(f);
            }
            None => {
                cmd.arg(a);
            }
        }
    }
    let out = cmd.output().expect("openssl runs");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chart's own certificates (selfSigned): each names its Service's DNS names, is signed by the CA the
/// clients mount, is a server certificate, and its key matches it.
#[test]
fn self_signed_certificates_name_their_services_and_chain_to_the_mounted_ca() {
    let docs = render(&[]);
    for (secret, service) in [
        ("release-network-enforcer-uplink-tls", CONTROLLER),
        ("release-network-enforcer-otel-collector-tls", COLLECTOR),
    ] {
        assert_eq!(find(&docs, "Secret", secret)["type"], "kubernetes.io/tls");
        let cert = secret_pem(&docs, secret, "tls.crt");
        let key = secret_pem(&docs, secret, "tls.key");
        let ca = secret_pem(&docs, secret, "ca.crt");
        assert_ne!(cert, ca);
        let verified = openssl(
            &[
                "verify",
                "-purpose",
                "sslserver",
                "-CAfile",
                "ca.pem",
                "cert.pem",
            ],
            &[("ca.pem", &ca), ("cert.pem", &cert)],
        );
        assert!(verified.contains("OK"), "{verified}");
        let sans = openssl(
            &[
                "x509",
                "-noout",
                "-ext",
                "subjectAltName",
                "-in",
                "cert.pem",
            ],
            &[("cert.pem", &cert)],
        );
        for name in [
            service.to_string(),
            format!("{service}.ne-system"),
            format!("{service}.ne-system.svc"),
            format!("{service}.ne-system.svc.cluster.local"),
        ] {
            assert!(
                sans.contains(&format!("DNS:{name}")),
                "{secret}: {name} in {sans}"
            );
        }
        let cert_pub = openssl(
            &["x509", "-noout", "-pubkey", "-in", "cert.pem"],
            &[("cert.pem", &cert)],
        );
        let key_pub = openssl(&["pkey", "-pubout", "-in", "key.pem"], &[("key.pem", &key)]);
        assert_eq!(
            cert_pub, key_pub,
            "{secret}: the key matches the certificate"
        );
    }
    // The default collector endpoint is one of the collector certificate's names.
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(
        env_value(c, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        format!("https://{COLLECTOR}.ne-system.svc.cluster.local:4317")
    );
    assert_eq!(env_value(c, "OTEL_EXPORTER_OTLP_PROTOCOL"), "grpc");
    // clusterDomain reaches the names.
    let docs = render(&["clusterDomain=corp.example"]);
    let cert = secret_pem(&docs, "release-network-enforcer-uplink-tls", "tls.crt");
    let sans = openssl(
        &[
            "x509",
            "-noout",
            "-ext",
            "subjectAltName",
            "-in",
            "cert.pem",
        ],
        &[("cert.pem", &cert)],
    );
    assert!(
        sans.contains(&format!("DNS:{CONTROLLER}.ne-system.svc.corp.example")),
        "{sans}"
    );
}

#[test]
fn issuer_mode_asks_cert_manager_for_the_service_names() {
    let docs = render(&[
        "uplink.tls.mode=issuer",
        "uplink.tls.issuerRef.name=corp-ca",
        "uplink.tls.issuerRef.kind=ClusterIssuer",
        "telemetry.collector.tls.mode=issuer",
        "telemetry.collector.tls.issuerRef.name=corp-ca",
    ]);
    let cert = find(&docs, "Certificate", CONTROLLER);
    assert_eq!(
        cert["spec"]["secretName"],
        "release-network-enforcer-uplink-tls"
    );
    assert_eq!(
        cert["spec"]["issuerRef"],
        serde_json::json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    assert_eq!(
        strings(&cert["spec"]["dnsNames"]),
        [
            CONTROLLER.to_string(),
            format!("{CONTROLLER}.ne-system"),
            format!("{CONTROLLER}.ne-system.svc"),
            format!("{CONTROLLER}.ne-system.svc.cluster.local"),
        ]
    );
    assert!(strings(&cert["spec"]["usages"]).contains(&"server auth".to_string()));
    let collector = find(&docs, "Certificate", COLLECTOR);
    assert_eq!(collector["spec"]["issuerRef"]["kind"], "Issuer");
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] != SIGNING_KEY),
        "no generated TLS keys"
    );
}

const SIGNING_KEY: &str = "release-network-enforcer-proposal-signing-key";

/// The controller signs the proposals it writes with a key only it reads, generated by the chart.
#[test]
fn the_controller_gets_a_generated_proposal_signing_key() {
    let docs = render(&[]);
    let secret = find(&docs, "Secret", SIGNING_KEY);
    let key = secret["data"]["key"].as_str().expect("a key");
    assert!(key.len() >= 44, "at least 32 bytes, base64: {key}");
    let controller = find(&docs, "Deployment", CONTROLLER);
    let pod = &controller["spec"]["template"]["spec"];
    let env = &pod["containers"][0]["env"];
    let file = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "PROPOSAL_SIGNING_KEY_FILE")
        .expect("PROPOSAL_SIGNING_KEY_FILE set");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == SIGNING_KEY)
        .expect("the Secret is mounted");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("and mounted in the controller");
    assert_eq!(
        file["value"].as_str().unwrap(),
        format!("{}/key", mount["mountPath"].as_str().unwrap())
    );
    // Only the controller reads it: the agent mounts no such Secret.
    let agent = find(&docs, "DaemonSet", AGENT);
    assert!(
        !agent.to_string().contains(SIGNING_KEY),
        "the agent must not see the signing key"
    );
}

/// Values that pass the schema but cannot work are refused by the templates, naming the value to set.
#[test]
fn inconsistent_values_fail_with_clear_messages() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["uplink.tls.mode=issuer"],
            "uplink.tls.mode=issuer needs uplink.tls.issuerRef.name",
        ),
        (
            &["uplink.tls.mode=existingSecret"],
            "uplink.tls.mode=existingSecret needs uplink.tls.existingSecret.name",
        ),
        (
            &["telemetry.collector.tls.mode=issuer"],
            "telemetry.collector.tls.mode=issuer needs telemetry.collector.tls.issuerRef.name",
        ),
        (
            &[
                "controller.provider.name=calico",
                "controller.provider.calico.tls.mode=issuer",
            ],
            "controller.provider.calico.tls.mode=issuer needs controller.provider.calico.tls.issuerRef.name",
        ),
        (
            &[
                "controller.provider.name=calico",
                "controller.provider.calico.tls.existingSecret.name=",
            ],
            "controller.provider.calico.tls.mode=existingSecret needs controller.provider.calico.tls.existingSecret.name",
        ),
        (
            &["telemetry.collectorStrategy=external"],
            "telemetry.collectorStrategy=external needs telemetry.externalCollector.endpoint",
        ),
        // The schema refuses calico + insecure; without the schema, the template still does.
        (
            &[
                "--skip-schema-validation",
                "controller.provider.name=calico",
                "controller.provider.calico.tls.mode=insecure",
            ],
            "controller.provider.calico.tls.mode=insecure is not allowed: Goldmane requires mutual TLS",
        ),
        (
            &[
                "controller.leaderElection.enabled=false",
                "controller.replicas=2",
            ],
            "controller.replicas > 1 needs controller.leaderElection.enabled=true",
        ),
        (
            &["--kube-version=1.20.0"],
            "admissionPolicy.enabled needs Kubernetes >= 1.30 (ValidatingAdmissionPolicy v1); this cluster is v1.20.0: set admissionPolicy.enabled=false",
        ),
    ];
    for (sets, expected) in cases {
        let message = rejected(sets);
        assert!(
            message.contains(expected),
            "{sets:?}: expected {expected:?} in {message}"
        );
    }
    // The schema's own message for calico + insecure names the value and the allowed ones.
    let message = rejected(&["controller.provider.calico.tls.mode=insecure"]);
    assert!(
        message.contains("/controller/provider/calico/tls/mode"),
        "{message}"
    );
    assert!(
        message.contains("issuer") && message.contains("existingSecret"),
        "{message}"
    );
}

/// The local v1.20 test cluster: the VAP off, local images never pulled; everything else as in production.
#[test]
fn local_cluster_values_render_for_kubernetes_1_20() {
    let docs = render(&[
        "--kube-version=1.20.0",
        "admissionPolicy.enabled=false",
        "telemetry.collectorStrategy=none",
        "controller.image.repository=network-enforcer.local/controller",
        "controller.image.tag=dev",
        "controller.image.pullPolicy=Never",
        "agent.image.repository=network-enforcer.local/agent",
        "agent.image.tag=dev",
        "agent.image.pullPolicy=Never",
    ]);
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ValidatingAdmissionPolicy")
    );
    for d in &docs {
        let api = d["apiVersion"].as_str().unwrap();
        assert!(
            [
                "v1",
                "apps/v1",
                "batch/v1",
                "rbac.authorization.k8s.io/v1",
                "apiextensions.k8s.io/v1"
            ]
            .contains(&api),
            "{api} {} is not served by Kubernetes 1.20",
            d["kind"]
        );
    }
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(agent["imagePullPolicy"], "Never");
    assert!(env_value(agent, "NE_CONTROLLER_URL").starts_with("https://"));
}

/// telemetry.collectorStrategy=default: the collector receives OTLP/gRPC over TLS, prints logs with the
/// debug exporter and counts violation events into a Prometheus metric; it runs non-root, read-only.
#[test]
fn default_collector_counts_violation_events_into_prometheus() {
    let docs = render(&["telemetry.collector.debugVerbosity=detailed"]);
    let cm = find(&docs, "ConfigMap", COLLECTOR);
    let config: Value = serde_yaml::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let grpc = &config["receivers"]["otlp"]["protocols"]["grpc"];
    assert_eq!(grpc["endpoint"], "0.0.0.0:4317");
    assert_eq!(grpc["tls"]["cert_file"], "/etc/otelcol/tls/tls.crt");
    assert_eq!(grpc["tls"]["key_file"], "/etc/otelcol/tls/tls.key");
    assert_eq!(config["exporters"]["debug"]["verbosity"], "detailed");
    assert_eq!(
        config["exporters"]["prometheus"]["endpoint"],
        "0.0.0.0:8889"
    );
    let logs = &config["service"]["pipelines"]["logs"];
    assert_eq!(strings(&logs["receivers"]), ["otlp"]);
    assert_eq!(strings(&logs["exporters"]), ["debug", "count"]);
    let metrics = &config["service"]["pipelines"]["metrics"];
    assert_eq!(strings(&metrics["receivers"]), ["count"]);
    assert_eq!(strings(&metrics["exporters"]), ["prometheus"]);
    let counted = &config["connectors"]["count"]["logs"]["network_enforcer.policy_violations"];
    let conditions = strings(&counted["conditions"]).join(" ");
    assert!(
        conditions.contains("\"policy_violation_observed\""),
        "{conditions}"
    );
    let keys: Vec<&str> = counted["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["action", "enforcement.provider"]);

    let deploy = find(&docs, "Deployment", COLLECTOR);
    let c = container(deploy, "otel-collector");
    assert_eq!(
        c["image"], "otel/opentelemetry-collector-contrib:0.115.1",
        "contrib: the count connector"
    );
    assert_eq!(strings(&c["args"]), ["--config=/etc/otelcol/config.yaml"]);
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(
        deploy["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    assert_eq!(mount_path(c, "tls"), Some("/etc/otelcol/tls"));
    let svc = find(&docs, "Service", COLLECTOR);
    let ports: Vec<i64> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(ports, [4317, 8889]);
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "{k}");
    }
    // The controller trusts the collector's CA (ca.crt only).
    let controller = find(&docs, "Deployment", CONTROLLER);
    let otel_ca = volume(controller, "otel-ca").expect("otel-ca volume");
    assert_eq!(otel_ca["secret"]["secretName"], format!("{COLLECTOR}-tls"));
    assert_eq!(
        otel_ca["secret"]["items"],
        serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}])
    );

    let image = render(&[
        "telemetry.collector.image.repository=registry.example/otelcol",
        "telemetry.collector.image.tag=1.2.3",
    ]);
    let c = container(find(&image, "Deployment", COLLECTOR), "otel-collector");
    assert_eq!(c["image"], "registry.example/otelcol:1.2.3");
}

#[test]
fn external_collector_gets_the_standard_otlp_env_and_its_secrets() {
    let docs = render(&[
        "telemetry.collectorStrategy=external",
        "telemetry.externalCollector.endpoint=https://otel.example:4318",
        "telemetry.externalCollector.protocol=http/protobuf",
        "telemetry.externalCollector.otelCollectorCertificateSecret=otel-ca",
        "telemetry.externalCollector.otelCollectorClientCertificateSecret=otel-client",
    ]);
    let deploy = find(&docs, "Deployment", CONTROLLER);
    let c = container(deploy, "controller");
    assert_eq!(
        env_value(c, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        "https://otel.example:4318"
    );
    assert_eq!(env_value(c, "OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf");
    assert_eq!(
        env_value(c, "OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "/etc/network-enforcer/otel-ca/ca.crt"
    );
    assert_eq!(
        env_value(c, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        "/etc/network-enforcer/otel-client/tls.crt"
    );
    assert_eq!(
        env_value(c, "OTEL_EXPORTER_OTLP_CLIENT_KEY"),
        "/etc/network-enforcer/otel-client/tls.key"
    );
    assert_eq!(
        volume(deploy, "otel-ca").unwrap()["secret"]["secretName"],
        "otel-ca"
    );
    assert_eq!(
        volume(deploy, "otel-client").unwrap()["secret"]["secretName"],
        "otel-client"
    );
    assert!(!docs.iter().any(|d| d["metadata"]["name"] == COLLECTOR));

    // Without the optional Secrets: the endpoint only (system roots, no client certificate).
    let docs = render(&[
        "telemetry.collectorStrategy=external",
        "telemetry.externalCollector.endpoint=https://otel.example:4317",
    ]);
    let deploy = find(&docs, "Deployment", CONTROLLER);
    let c = container(deploy, "controller");
    assert_eq!(env_value(c, "OTEL_EXPORTER_OTLP_PROTOCOL"), "grpc");
    assert!(env(c, "OTEL_EXPORTER_OTLP_CERTIFICATE").is_none());
    assert!(env(c, "OTEL_EXPORTER_OTLP_CLIENT_KEY").is_none());
    assert!(volume(deploy, "otel-ca").is_none() && volume(deploy, "otel-client").is_none());

    // none: no export at all.
    let docs = render(&["telemetry.collectorStrategy=none"]);
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert!(!c["env"].to_string().contains("OTEL_"));
}

/// provider calico: the controller dials Goldmane with the client key pair (Secret) and CA bundle
/// (ConfigMap key), read through the API wherever they live; RBAC grants `get` on exactly those two.
#[test]
fn calico_goldmane_mutual_tls_values_reach_the_controller() {
    /// (namespace, resource, name) of every Role rule bound to the controller for Goldmane.
    fn goldmane_grants(docs: &[Value]) -> BTreeSet<(String, String, String)> {
        let name = format!("{CONTROLLER}-goldmane-tls");
        let mut out = BTreeSet::new();
        for role in docs
            .iter()
            .filter(|d| d["kind"] == "Role" && d["metadata"]["name"] == name.as_str())
        {
            let ns = role["metadata"]["namespace"].as_str().unwrap().to_owned();
            let binding = docs
                .iter()
                .find(|d| {
                    d["kind"] == "RoleBinding"
                        && d["metadata"]["name"] == name.as_str()
                        && d["metadata"]["namespace"] == ns.as_str()
                })
                .expect("each Role is bound");
            assert_eq!(
                binding["subjects"],
                serde_json::json!([{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": "ne-system"}])
            );
            for rule in role["rules"].as_array().unwrap() {
                assert_eq!(strings(&rule["verbs"]), ["get"]);
                assert_eq!(strings(&rule["apiGroups"]), [""]);
                let names = strings(&rule["resourceNames"]);
                assert_eq!(names.len(), 1, "exactly one object per rule");
                for resource in strings(&rule["resources"]) {
                    out.insert((ns.clone(), resource, names[0].clone()));
                }
            }
        }
        out
    }
    let grants = |v: &[(&str, &str, &str)]| -> BTreeSet<(String, String, String)> {
        v.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect()
    };

    // Default: the Calico operator's objects in calico-system (docs/install.md, `calico`).
    let docs = render(&["controller.provider.name=calico"]);
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(
        env_value(c, "GOLDMANE_ADDRESS"),
        "goldmane.calico-system.svc:7443"
    );
    assert_eq!(
        env_value(c, "GOLDMANE_TLS_SECRET"),
        "calico-system/goldmane-key-pair"
    );
    assert_eq!(
        env_value(c, "GOLDMANE_CA_CONFIGMAP"),
        "calico-system/goldmane-ca-bundle"
    );
    assert_eq!(env_value(c, "GOLDMANE_CA_KEY"), "tigera-ca-bundle.crt");
    assert!(env(c, "GOLDMANE_SERVER_NAME").is_none());
    assert_eq!(
        goldmane_grants(&docs),
        grants(&[
            ("calico-system", "secrets", "goldmane-key-pair"),
            ("calico-system", "configmaps", "goldmane-ca-bundle"),
        ])
    );
    // The controller's cluster-wide role still reads no Secrets.
    let cluster_role = find(&docs, "ClusterRole", CONTROLLER);
    assert!(!cluster_role["rules"].to_string().contains("secrets"));

    // Objects in the release namespace (namespace empty), a server name.
    let docs = render(&[
        "controller.provider.name=calico",
        "controller.provider.calico.tls.existingSecret.namespace=",
        "controller.provider.calico.tls.existingSecret.name=gm-client",
        "controller.provider.calico.tls.existingSecret.caBundleConfigMap=gm-ca",
        "controller.provider.calico.tls.existingSecret.caBundleKey=",
        "controller.provider.calico.tls.serverName=goldmane",
    ]);
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(c, "GOLDMANE_TLS_SECRET"), "ne-system/gm-client");
    assert_eq!(env_value(c, "GOLDMANE_CA_CONFIGMAP"), "ne-system/gm-ca");
    assert_eq!(env_value(c, "GOLDMANE_CA_KEY"), "ca.crt");
    assert_eq!(env_value(c, "GOLDMANE_SERVER_NAME"), "goldmane");
    assert_eq!(
        goldmane_grants(&docs),
        grants(&[
            ("ne-system", "secrets", "gm-client"),
            ("ne-system", "configmaps", "gm-ca"),
        ])
    );

    // issuer: the client certificate from cert-manager in the release namespace; the CA still Calico's.
    let docs = render(&[
        "controller.provider.name=calico",
        "controller.provider.calico.tls.mode=issuer",
        "controller.provider.calico.tls.issuerRef.name=tigera-ca",
        "controller.provider.calico.tls.issuerRef.kind=ClusterIssuer",
    ]);
    let cert = find(
        &docs,
        "Certificate",
        "release-network-enforcer-goldmane-client",
    );
    assert_eq!(strings(&cert["spec"]["usages"])[0], "client auth");
    assert_eq!(cert["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    let secret = cert["spec"]["secretName"].as_str().unwrap();
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(
        env_value(c, "GOLDMANE_TLS_SECRET"),
        format!("ne-system/{secret}")
    );
    assert_eq!(
        env_value(c, "GOLDMANE_CA_CONFIGMAP"),
        "calico-system/goldmane-ca-bundle"
    );
    assert_eq!(
        goldmane_grants(&docs),
        grants(&[
            ("ne-system", "secrets", secret),
            ("calico-system", "configmaps", "goldmane-ca-bundle"),
        ])
    );

    // Other providers: no Goldmane, no extra grants.
    for provider in ["istio", "cilium", "ebpf"] {
        let docs = render(&[&format!("controller.provider.name={provider}")]);
        let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
        assert!(!c["env"].to_string().contains("GOLDMANE"), "{provider}");
        assert!(goldmane_grants(&docs).is_empty(), "{provider}");
        assert!(
            !docs.iter().any(|d| d["kind"] == "Certificate"),
            "{provider}"
        );
    }
}

/// provider cilium: the node's Hubble socket by default; Hubble Relay with the provider's TLS values on
/// request (the agents mount the client key pair and CA).
#[test]
fn cilium_hubble_socket_or_relay_with_tls() {
    let docs = render(&["controller.provider.name=cilium"]);
    let ds = find(&docs, "DaemonSet", AGENT);
    let agent = container(ds, "agent");
    assert_eq!(
        env_value(agent, "NE_HUBBLE_SOCKET"),
        "/var/run/cilium/hubble.sock"
    );
    assert!(env(agent, "NE_HUBBLE_RELAY_ADDRESS").is_none());

    let relay = |extra: &[&str]| {
        let mut sets = vec![
            "controller.provider.name=cilium",
            "agent.hubble.source=relay",
        ];
        sets.extend_from_slice(extra);
        render(&sets)
    };
    let tls_env = |agent: &Value| {
        for (var, file) in [
            ("NE_HUBBLE_RELAY_CA_FILE", "ca.crt"),
            ("NE_HUBBLE_RELAY_CLIENT_CERT_FILE", "tls.crt"),
            ("NE_HUBBLE_RELAY_CLIENT_KEY_FILE", "tls.key"),
        ] {
            assert_eq!(
                env_value(agent, var),
                format!("/etc/network-enforcer/hubble-relay-tls/{file}")
            );
        }
        assert_eq!(
            mount_path(agent, "hubble-relay-tls"),
            Some("/etc/network-enforcer/hubble-relay-tls")
        );
        assert_eq!(
            env_value(agent, "NE_HUBBLE_RELAY_SERVER_NAME"),
            "ui.hubble-relay.cilium.io"
        );
        assert!(env(agent, "NE_HUBBLE_SOCKET").is_none());
    };

    let docs = relay(&["controller.provider.cilium.tls.issuerRef.name=cilium-ca"]);
    let ds = find(&docs, "DaemonSet", AGENT);
    let agent = container(ds, "agent");
    assert_eq!(
        env_value(agent, "NE_HUBBLE_RELAY_ADDRESS"),
        "hubble-relay.kube-system.svc:443"
    );
    tls_env(agent);
    let cert = find(
        &docs,
        "Certificate",
        "release-network-enforcer-hubble-relay-client",
    );
    assert_eq!(strings(&cert["spec"]["usages"])[0], "client auth");
    assert_eq!(
        volume(ds, "hubble-relay-tls").unwrap()["secret"]["secretName"],
        cert["spec"]["secretName"]
    );
    // No host socket mount in relay mode.
    assert!(
        !host_mounts(ds)
            .iter()
            .any(|(m, _, _)| m == "/var/run/cilium")
    );

    let docs = relay(&[
        "controller.provider.cilium.tls.mode=existingSecret",
        "controller.provider.cilium.tls.existingSecret.name=relay-client",
        "controller.provider.cilium.tls.existingSecret.caBundleConfigMap=relay-ca",
    ]);
    let ds = find(&docs, "DaemonSet", AGENT);
    tls_env(container(ds, "agent"));
    assert_eq!(
        volume(ds, "hubble-relay-tls").unwrap()["projected"]["sources"],
        serde_json::json!([
            {"secret": {"name": "relay-client", "items": [
                {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}},
            {"configMap": {"name": "relay-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
        ])
    );

    let docs = relay(&["controller.provider.cilium.tls.mode=insecure"]);
    let ds = find(&docs, "DaemonSet", AGENT);
    let agent = container(ds, "agent");
    assert!(env(agent, "NE_HUBBLE_RELAY_ADDRESS").is_some());
    assert!(env(agent, "NE_HUBBLE_RELAY_CA_FILE").is_none());
    assert!(volume(ds, "hubble-relay-tls").is_none());

    for (sets, expected) in [
        (
            vec![
                "controller.provider.name=cilium",
                "agent.hubble.source=relay",
            ],
            "controller.provider.cilium.tls.mode=issuer needs controller.provider.cilium.tls.issuerRef.name",
        ),
        (
            vec![
                "controller.provider.name=cilium",
                "agent.hubble.source=relay",
                "controller.provider.cilium.tls.mode=existingSecret",
                "controller.provider.cilium.tls.existingSecret.name=hubble-relay-client-certs",
                "controller.provider.cilium.tls.existingSecret.namespace=kube-system",
            ],
            "must be in the release namespace ne-system",
        ),
    ] {
        let message = rejected(&sets);
        assert!(message.contains(expected), "{sets:?}: {message}");
    }
}

#[test]
fn metrics_services_select_their_pods() {
    let docs = render(&[]);
    for (svc, kind, workload, port) in [
        (
            format!("{CONTROLLER}-metrics"),
            "Deployment",
            CONTROLLER,
            8080,
        ),
        (format!("{AGENT}-metrics"), "DaemonSet", AGENT, 9464),
    ] {
        let s = find(&docs, "Service", &svc);
        assert_eq!(
            s["spec"]["clusterIP"], "None",
            "{svc}: one endpoint per pod"
        );
        assert_eq!(s["spec"]["ports"][0]["port"], port, "{svc}");
        assert_eq!(s["spec"]["ports"][0]["targetPort"], "metrics", "{svc}");
        let w = find(&docs, kind, workload);
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        for (k, v) in s["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&labels[k], v, "{svc}: {k}");
        }
        let named = w["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == port);
        assert!(named, "{svc}: the container names its metrics port");
    }
}

#[test]
fn lint_strict_with_default_and_non_default_values() {
    let cases: &[&[&str]] = &[
        &[],
        &[
            "controller.provider.name=calico",
            "telemetry.collectorStrategy=none",
        ],
        &[
            "controller.provider.name=cilium",
            "agent.hubble.source=relay",
            "controller.provider.cilium.tls.issuerRef.name=cilium-ca",
            "uplink.tls.mode=issuer",
            "uplink.tls.issuerRef.name=corp-ca",
            "telemetry.collectorStrategy=external",
            "telemetry.externalCollector.endpoint=https://otel.example:4317",
        ],
        &["uplink.tls.mode=insecure", "controller.provider.name=ebpf"],
    ];
    for sets in cases {
        let mut cmd = Command::new(helm());
        cmd.args(["lint", "--strict"]).arg(chart());
        for s in *sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("helm runs");
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{sets:?}: {report}");
        assert!(report.contains("0 chart(s) failed"), "{sets:?}: {report}");
        assert!(
            !report.contains("[WARNING]") && !report.contains("[ERROR]"),
            "{sets:?}: {report}"
        );
    }
}

#[test]
fn agent_probes_use_its_health_endpoints_on_the_metrics_port() {
    let docs = render(&[]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert!(
        agent["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "metrics"),
        "{agent}"
    );
    assert_eq!(agent["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(agent["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(agent["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(agent["readinessProbe"]["httpGet"]["port"], "metrics");
}

/// The agent's securityContext: RuntimeDefault seccomp by default (containerd's default filter allows
/// bpf() with CAP_BPF and perf_event_open() with CAP_PERFMON; docs/install.md, "Agent privileges"), the
/// profile a chart value, and the rest of the context unchanged around it.
#[test]
fn agent_runs_under_the_runtime_default_seccomp_profile() {
    let docs = render(&[]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    let sc = &agent["securityContext"];
    assert_eq!(
        sc["seccompProfile"],
        serde_json::json!({"type": "RuntimeDefault"}),
        "{sc}"
    );
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsUser"], 0);
    assert_eq!(sc["readOnlyRootFilesystem"], true);

    let docs = render(&[
        "agent.seccompProfile.type=Localhost",
        "agent.seccompProfile.localhostProfile=profiles/network-enforcer-agent.json",
    ]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(
        agent["securityContext"]["seccompProfile"],
        serde_json::json!({
            "type": "Localhost",
            "localhostProfile": "profiles/network-enforcer-agent.json"
        })
    );
    let docs = render(&["agent.seccompProfile.type=Unconfined"]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(
        agent["securityContext"]["seccompProfile"]["type"],
        "Unconfined"
    );
    let error = rejected(&["agent.seccompProfile.type=Default"]);
    assert!(error.contains("seccompProfile"), "{error}");
    let error = rejected(&["agent.seccompProfile.type=Localhost"]);
    assert!(error.contains("localhostProfile"), "{error}");
}

/// The agent uses the host network: its metrics and health endpoint binds the node's IP (downward API)
/// and loopback, not every interface; `agent.listenAddresses` replaces both, and the kubelet's probes
/// follow a specific address (docs/install.md, "Metrics and health").
#[test]
fn agent_endpoint_binds_the_node_ip_and_loopback_not_every_interface() {
    let docs = render(&[]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    let node_ip = env(agent, "NE_NODE_IP").expect("NE_NODE_IP");
    assert_eq!(
        node_ip["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    let names: Vec<&str> = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let position = |name: &str| names.iter().position(|n| *n == name).unwrap();
    // $(NE_NODE_IP) expands only from a variable defined earlier in the list.
    assert!(
        position("NE_NODE_IP") < position("NE_LISTEN_ADDRESS"),
        "{names:?}"
    );
    assert_eq!(
        env_value(agent, "NE_LISTEN_ADDRESS"),
        "$(NE_NODE_IP),127.0.0.1"
    );
    assert!(env(agent, "NE_METRICS_ADDRESS").is_none());
    let daemonset = find(&docs, "DaemonSet", AGENT).to_string();
    assert!(!daemonset.contains("0.0.0.0"), "{daemonset}");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert!(
            agent[probe]["httpGet"].get("host").is_none(),
            "{probe}: the pod IP"
        );
    }

    let docs = render(&[
        "agent.listenAddresses={10.0.0.5}",
        "agent.metricsPort=19464",
    ]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(env_value(agent, "NE_LISTEN_ADDRESS"), "10.0.0.5");
    assert_eq!(env_value(agent, "NE_METRICS_PORT"), "19464");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(agent[probe]["httpGet"]["host"], "10.0.0.5", "{probe}");
    }

    let docs = render(&["agent.listenAddresses={0.0.0.0}"]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(env_value(agent, "NE_LISTEN_ADDRESS"), "0.0.0.0");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert!(agent[probe]["httpGet"].get("host").is_none(), "{probe}");
    }
    let error = rejected(&["agent.listenAddresses={node-ip}"]);
    assert!(error.contains("listenAddresses"), "{error}");
}

/// The web view is served on the pod's loopback by default (reached with `kubectl port-forward`
/// only); `controller.ui.service=true` serves it on the pod network with a ClusterIP Service.
#[test]
fn web_view_is_on_loopback_by_default_a_service_when_asked_and_can_be_turned_off() {
    let ui_port = |c: &serde_json::Value| {
        c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "ui")
            .cloned()
    };
    let ui_service = |docs: &[serde_json::Value]| {
        docs.iter()
            .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == format!("{CONTROLLER}-ui"))
            .cloned()
    };
    let docs = render(&[]);
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(
        env_value(c, "UI_ADDRESS"),
        "127.0.0.1:8090",
        "loopback: kubectl port-forward only"
    );
    assert!(ui_port(c).is_none(), "no port on the pod network");
    assert!(ui_service(&docs).is_none(), "no Service by default");

    let docs = render(&["controller.ui.service=true"]);
    let deploy = find(&docs, "Deployment", CONTROLLER);
    let c = container(deploy, "controller");
    assert_eq!(env_value(c, "UI_ADDRESS"), "0.0.0.0:8090");
    assert_eq!(ui_port(c).expect("a ui port")["containerPort"], 8090);
    let svc = ui_service(&docs).expect("the ui Service");
    assert_eq!(svc["spec"]["type"], "ClusterIP", "no external exposure");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8090);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "ui");
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "{k}");
    }
    assert!(
        !docs.iter().any(|d| d["kind"] == "Ingress"),
        "never an Ingress"
    );

    let docs = render(&["controller.ui.port=9000"]);
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
    assert_eq!(env_value(c, "UI_ADDRESS"), "127.0.0.1:9000");
    let docs = render(&["controller.ui.port=9000", "controller.ui.service=true"]);
    assert_eq!(
        ui_service(&docs).expect("the ui Service")["spec"]["ports"][0]["port"],
        9000
    );

    for off in [
        &["controller.ui.enabled=false"][..],
        &["controller.ui.enabled=false", "controller.ui.service=true"],
    ] {
        let docs = render(off);
        let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
        assert_eq!(env_value(c, "UI_ADDRESS"), "", "empty turns the view off");
        assert!(ui_port(c).is_none(), "{off:?}");
        assert!(ui_service(&docs).is_none(), "{off:?}");
    }
    assert!(rejected(&["controller.ui.port=0"]).contains("ui"));
    assert!(rejected(&["controller.ui.service=yes"]).contains("service"));
    assert!(rejected(&["controller.ui.bogus=1"]).contains("bogus"));
}

/// The Grafana dashboard (opt-in): a ConfigMap with the sidecar's label holding the dashboard JSON, whose
/// panels all query this project's metrics (that each exists is checked against live endpoints by the
/// chart install test).
#[test]
fn the_grafana_dashboard_is_an_opt_in_config_map_for_the_sidecar() {
    let dashboard = |docs: &[Value]| {
        docs.iter()
            .find(|d| {
                d["kind"] == "ConfigMap"
                    && d["metadata"]["name"] == "release-network-enforcer-dashboard"
            })
            .cloned()
    };
    assert!(dashboard(&render(&[])).is_none(), "off by default");
    let docs = render(&[
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.namespace=monitoring",
        "grafanaDashboard.annotations.grafana_folder=Security",
    ]);
    let map = dashboard(&docs).expect("the dashboard ConfigMap");
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Security");
    let json: Value = serde_json::from_str(map["data"]["network-enforcer.json"].as_str().unwrap())
        .expect("the dashboard is JSON");
    assert_eq!(json["uid"], "network-enforcer");
    let exprs = dashboard_exprs(&json);
    assert!(exprs.len() >= 15, "{exprs:?}");
    for expr in &exprs {
        assert!(expr.contains("network_enforcer_"), "{expr}");
    }
    let docs = render(&[
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.label=dashboards",
    ]);
    assert_eq!(
        dashboard(&docs).unwrap()["metadata"]["labels"]["dashboards"],
        "1"
    );
    assert!(rejected(&["grafanaDashboard.label="]).contains("label"));
}

/// Every query of the dashboard (`panels[].targets[].expr`).
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect()
}
