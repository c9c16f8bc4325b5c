//! The Helm chart (SPEC section 9), rendered with `helm template`: every provider renders, the values schema
//! rejects unknown keys and bad enums, RBAC is exactly the least privilege each component needs, the agent
//! gets exactly its capabilities, the controller runs non-root on a read-only root FS, and every rendered
//! manifest validates with `kubernetes-validate --strict` against Kubernetes 1.31.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// `helm template` with these `--set` values (and the CRDs), in namespace `ne-system`.
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
        cmd.args(["--set", s]);
    }
    cmd.output().expect("helm runs")
}

/// The rendered text; panics with helm's message if rendering fails.
fn render_text(sets: &[&str]) -> String {
    let out = template(sets);
    assert!(
        out.status.success(),
        "helm template {sets:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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
    assert_eq!(roles.len(), 3, "controller, agent, cleanup");
    for role in &roles {
        assert!(
            !role["rules"].to_string().contains('*'),
            "wildcard in {}",
            role["metadata"]["name"]
        );
    }
    let ne = "networkenforcer.kubewarden.io";
    assert_eq!(
        rules(find(&docs, "ClusterRole", CONTROLLER)),
        expect(&[
            ("", "pods", READ),
            ("", "services", READ),
            ("", "nodes", READ),
            ("apps", "deployments", READ),
            ("apps", "statefulsets", READ),
            ("apps", "daemonsets", READ),
            (ne, "workloadnetworkpolicies", CRUD),
            (ne, "workloadnetworkpolicyproposals", CRUD),
            (
                ne,
                "workloadnetworkpolicies/status",
                &["get", "update", "patch"]
            ),
            (
                ne,
                "workloadnetworkpolicyproposals/status",
                &["get", "update", "patch"]
            ),
            ("networking.k8s.io", "networkpolicies", CRUD),
            ("security.istio.io", "authorizationpolicies", CRUD),
            ("authentication.k8s.io", "tokenreviews", &["create"]),
            ("events.k8s.io", "events", &["create", "patch"]),
        ])
    );
    assert_eq!(
        rules(find(&docs, "ClusterRole", AGENT)),
        expect(&[("", "pods", READ)])
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
        ])
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
}

#[test]
fn cleanup_runs_as_a_pre_delete_hook() {
    let docs = render(&[]);
    for (kind, name) in [
        ("ServiceAccount", CLEANUP),
        ("ClusterRole", CLEANUP),
        ("ClusterRoleBinding", CLEANUP),
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
    let c = container(job, "cleanup");
    assert_eq!(strings(&c["command"]), ["network-enforcer-controller"]);
    assert_eq!(strings(&c["args"]), ["cleanup"]);
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
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

    let volumes = pod["volumes"].as_array().unwrap();
    let host_path = |mount: &str| -> String {
        let m = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == mount)
            .unwrap_or_else(|| panic!("nothing mounted at {mount}"));
        let v = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("the mount's volume");
        assert_eq!(m["readOnly"], true, "{mount} is mounted read-only");
        v["hostPath"]["path"].as_str().unwrap().to_owned()
    };
    assert_eq!(host_path("/sys/fs/bpf"), "/sys/fs/bpf");
    assert_eq!(host_path("/sys/kernel/tracing"), "/sys/kernel/tracing");
    assert_eq!(host_path("/sys/fs/cgroup"), "/sys/fs/cgroup");
    assert_eq!(host_path("/sys/kernel/btf"), "/sys/kernel/btf");
    let host_paths = volumes
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .count();
    assert_eq!(host_paths, 4, "no other host paths");

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
    assert_eq!(agent["ports"][0]["containerPort"], 9464);
    assert_eq!(env_value(agent, "NE_METRICS_ADDRESS"), "0.0.0.0:9464");

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
        "agent.ringBufferBytes=1048576",
        "agent.extraCapabilities[0]=SYS_PTRACE",
    ]);
    let agent = container(find(&docs, "DaemonSet", AGENT), "agent");
    assert_eq!(env_value(agent, "NE_FLUSH_SECONDS"), "3");
    assert_eq!(env_value(agent, "NE_DEDUPE_SECONDS"), "0");
    assert_eq!(env_value(agent, "NE_RING_BUFFER_BYTES"), "1048576");
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
    // The controller serves no HTTP health endpoint yet: no probe rather than a fake one.
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert!(c.get(probe).is_none(), "{probe}");
    }
    assert_eq!(deploy["spec"]["replicas"], 1);
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
    assert!(env(c, "EXCLUDE_NAMESPACES").is_none());

    let docs = render(&[
        "controller.logLevel=debug",
        "controller.excludeNamespaces={kube-system,istio-system}",
        "controller.env[0].name=EXTRA",
        "controller.env[0].value=on",
    ]);
    let c = container(find(&docs, "Deployment", CONTROLLER), "controller");
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
    assert_eq!(kinds(&render(&[])), 1);
    assert_eq!(kinds(&render(&["admissionPolicy.enabled=false"])), 0);
}

#[test]
fn rendered_manifests_validate_for_kubernetes_1_31() {
    let validate = tool("kubernetes-validate", "--version");
    let combos: &[&[&str]] = &[
        &[],
        &["controller.provider.name=cilium"],
        &["controller.provider.name=calico"],
        &[
            "controller.provider.name=ebpf",
            "admissionPolicy.enabled=false",
        ],
        &[
            "imagePullSecrets[0]=plain",
            "imagePullSecrets[1].name=named",
            "agent.privileged=true",
            "agent.ringBufferBytes=1048576",
            "controller.watchNamespace=shop",
            "controller.excludeNamespaces={kube-system}",
            "controller.podLabels.team=net",
            "controller.podAnnotations.note=x",
            "controller.nodeSelector.role=infra",
            "telemetry.collectorStrategy=external",
            "telemetry.externalCollector.endpoint=otel:4317",
        ],
    ];
    let dir = std::env::temp_dir().join(format!("ne-chart-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, sets) in combos.iter().enumerate() {
        let file = dir.join(format!("rendered-{i}.yaml"));
        std::fs::write(&file, render_text(sets)).unwrap();
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
        assert!(out.status.success(), "{sets:?}:\n{report}");
        assert!(!report.contains("ERROR"), "{sets:?}:\n{report}");
        assert!(report.contains("deployment/"), "{sets:?}:\n{report}");
        assert!(report.contains("daemonset/"), "{sets:?}:\n{report}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lint_strict_with_non_default_values() {
    let out = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(chart())
        .args([
            "--set",
            "controller.provider.name=calico",
            "--set",
            "telemetry.collectorStrategy=none",
        ])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
