//! The test fixture: `TestNamespace::create("name").await?` gives a test a kube client and a fresh
//! namespace on the shared local cluster.
//!
//! - The cluster is started on first use (by whichever test process comes first; the others wait on
//!   the cluster's file lock) and left running for the next test binary; `cargo xtask cluster down`
//!   stops it. A cluster that cannot start fails the test with the components' logs.
//! - [`TestNamespace::create_with_crds`] also installs our CRDs (`charts/network-enforcer/crds/*.yaml`)
//!   once per process, with `x-kubernetes-validations` stripped (the v1.20 API server rejects CEL rules).
//!   Tests of the cluster itself use [`TestNamespace::create`] and do not depend on the chart.
//! - Each test gets its own namespace, deleted when the [`TestNamespace`] is dropped (also when the test
//!   panics). Namespaces of test processes that were killed are deleted by the next run.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use kube::api::{Api, ListParams, LogParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::cluster::{self, ClusterInfo, components::kubectl, process};

/// Label on every test namespace: the pid of the test process that owns it.
pub const OWNER_LABEL: &str = "network-enforcer.test/owner-pid";

/// The shared cluster, started (or found running) once per process.
pub fn cluster() -> Result<&'static ClusterInfo> {
    static CLUSTER: OnceLock<std::result::Result<ClusterInfo, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            let info = cluster::up_for_tests().map_err(|e| format!("{e:#}"))?;
            delete_orphaned_namespaces(&info.kubeconfig);
            Ok(info)
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("the local cluster is not available: {e}"))
}

/// The shared cluster with our CRDs installed (once per process; see [`install_crds`]).
pub fn cluster_with_crds() -> Result<&'static ClusterInfo> {
    static CRDS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let info = cluster()?;
    CRDS.get_or_init(|| install_crds(&info.kubeconfig).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("our CRDs could not be installed: {e}"))?;
    Ok(info)
}

/// A kube client for the shared cluster (admin).
pub async fn client() -> Result<Client> {
    let info = cluster()?;
    let kubeconfig = Kubeconfig::read_from(&info.kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A client whose API server refuses connections (nothing listens on port 9): for code that needs a
/// client but must not reach a cluster.
pub fn offline_client() -> Client {
    Client::try_from(Config::new("http://127.0.0.1:9".parse().expect("a URL")))
        .expect("a client that is never used")
}

/// One test's namespace on the shared cluster; deleted on drop.
pub struct TestNamespace {
    /// Admin client.
    pub client: Client,
    /// The namespace's name.
    pub name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates a fresh namespace named after `prefix` (lowercase letters, digits, dashes).
    pub async fn create(prefix: &str) -> Result<Self> {
        cluster()?;
        Self::create_on_ready_cluster(prefix).await
    }

    /// Like [`TestNamespace::create`], on a cluster with our CRDs installed (controller and e2e tests).
    pub async fn create_with_crds(prefix: &str) -> Result<Self> {
        cluster_with_crds()?;
        Self::create_on_ready_cluster(prefix).await
    }

    async fn create_on_ready_cluster(prefix: &str) -> Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let client = client().await?;
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { OWNER_LABEL: std::process::id().to_string() } }
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let ns = Self {
            client,
            name,
            kubeconfig: cluster()?.kubeconfig.clone(),
        };
        ns.wait_for_default_token().await?;
        Ok(ns)
    }

    /// v1.20 refuses pods until the namespace's `default` ServiceAccount has its token Secret (created
    /// by the controller-manager a moment after the namespace), and the API server rejects that token
    /// until its cache has the Secret. Waits for both, so pods can start and use the API at once.
    async fn wait_for_default_token(&self) -> Result<()> {
        let accounts = self.api::<ServiceAccount>();
        let secrets = self.api::<Secret>();
        let reviews = Api::<TokenReview>::all(self.client.clone());
        self.wait_for(
            "the default ServiceAccount's token to authenticate",
            Duration::from_secs(60),
            || async {
                let Some(sa) = accounts.get_opt("default").await? else {
                    return Ok(None);
                };
                let Some(secret) = sa
                    .secrets
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|r| r.name)
                else {
                    return Ok(None);
                };
                let token = secrets
                    .get_opt(&secret)
                    .await?
                    .and_then(|s| s.data)
                    .and_then(|mut d| d.remove("token"))
                    .map(|t| String::from_utf8_lossy(&t.0).into_owned());
                let Some(token) = token else {
                    return Ok(None);
                };
                let review: TokenReview = serde_json::from_value(serde_json::json!({
                    "spec": { "token": token }
                }))?;
                let result = reviews.create(&PostParams::default(), &review).await?;
                let authenticated = result.status.and_then(|s| s.authenticated).unwrap_or(false);
                Ok(authenticated.then_some(()))
            },
        )
        .await
    }

    /// A namespaced API in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Polls `check` every 250 ms until it returns `Some`, failing after `timeout` with `what` and a
    /// description of the namespace (pods, events) to make the failure readable.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        crate::wait::eventually(what, timeout, Duration::from_millis(250), check, || {
            self.describe()
        })
        .await
    }

    /// Waits until pod `name` has terminated successfully and returns its log.
    pub async fn wait_for_pod_success(&self, name: &str, timeout: Duration) -> Result<String> {
        let pods = self.api::<Pod>();
        let phase = self
            .wait_for(&format!("pod {name} to finish"), timeout, || async {
                let pod = pods.get(name).await?;
                let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
                Ok((phase == "Succeeded" || phase == "Failed").then_some(phase))
            })
            .await?;
        let log = pods.logs(name, &LogParams::default()).await?;
        if phase != "Succeeded" {
            bail!("pod {name} failed; its log:\n{log}\n{}", self.describe());
        }
        Ok(log)
    }

    /// Pods, events and other objects of the namespace as kubectl shows them (for failure messages).
    pub fn describe(&self) -> String {
        let ns = format!("--namespace={}", self.name);
        let all = kubectl(&self.kubeconfig, &[&ns, "get", "all", "-o", "wide"])
            .unwrap_or_else(|e| format!("{e:#}"));
        let events = kubectl(
            &self.kubeconfig,
            &[&ns, "get", "events", "--sort-by=.lastTimestamp"],
        )
        .unwrap_or_else(|e| format!("{e:#}"));
        format!(
            "--- kubectl get all -n {0} ---\n{all}--- events in {0} ---\n{events}",
            self.name
        )
    }

    /// The admin kubeconfig of the cluster (for helm, kubectl, a controller under test).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Runs kubectl v1.20 (from setup) in this namespace with the admin kubeconfig; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let ns = format!("--namespace={}", self.name);
        let mut all = vec![ns.as_str()];
        all.extend_from_slice(args);
        kubectl(&self.kubeconfig, &all)
    }

    /// `kubectl apply -f -` of `manifest` (YAML, several documents allowed) in this namespace.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        process::output_with_input(
            std::process::Command::new(cluster::layout::kubernetes_bin("kubectl"))
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .arg(format!("--namespace={}", self.name))
                .args(["apply", "-f", "-"]),
            manifest.as_bytes(),
        )
    }

    /// Pods of this namespace matching `selector` (a label selector).
    pub async fn pods(&self, selector: &str) -> Result<Vec<Pod>> {
        Ok(self
            .api::<Pod>()
            .list(&ListParams::default().labels(selector))
            .await?
            .items)
    }
}

impl Drop for TestNamespace {
    /// Deletes the namespace without waiting for it to disappear. kubectl rather than the kube client:
    /// the client's background tasks belong to the test's runtime, which may be shutting down here.
    fn drop(&mut self) {
        if let Err(e) = kubectl(
            &self.kubeconfig,
            &["delete", "namespace", &self.name, "--wait=false"],
        ) {
            eprintln!(
                "warning: could not delete test namespace {}: {e:#}",
                self.name
            );
        }
    }
}

/// Deletes the namespaces of test processes that no longer run (killed before their clean-up ran).
fn delete_orphaned_namespaces(kubeconfig: &Path) {
    let Ok(list) = kubectl(
        kubeconfig,
        &[
            "get",
            "namespaces",
            "-l",
            OWNER_LABEL,
            "-o",
            &format!(
                "jsonpath={{range .items[*]}}{{.metadata.name}} {{.metadata.labels.{}}}{{\"\\n\"}}{{end}}",
                OWNER_LABEL.replace('.', "\\.").replace('/', "\\/")
            ),
        ],
    ) else {
        return;
    };
    for line in list.lines() {
        if let Some((name, pid)) = line.split_once(' ') {
            if pid.trim().parse().is_ok_and(|pid| !process::alive(pid)) {
                let _ = kubectl(kubeconfig, &["delete", "namespace", name, "--wait=false"]);
            }
        }
    }
}

/// The chart's CRDs directory, found from this crate's source location.
pub fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/network-enforcer/crds")
}

/// Applies every CRD under [`crds_dir`] with `x-kubernetes-validations` removed, and waits until they
/// are established. No CRDs yet is fine.
pub fn install_crds(kubeconfig: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(crds_dir()) else {
        return Ok(());
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let stripped =
            strip_for_v1_20(&text).with_context(|| format!("reading {}", file.display()))?;
        process::output_with_input(
            std::process::Command::new(cluster::layout::kubernetes_bin("kubectl"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["apply", "-f", "-"]),
            stripped.as_bytes(),
        )
        .with_context(|| format!("installing {}", file.display()))?;
    }
    // Upstream's ClusterNetworkPolicy kind, which the controller and the agent judge and enforce
    // where a cluster has it.
    let stripped = strip_for_v1_20(&cluster_network_policy_crd()?)?;
    process::output_with_input(
        std::process::Command::new(cluster::layout::kubernetes_bin("kubectl"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["apply", "-f", "-"]),
        stripped.as_bytes(),
    )
    .context("installing the ClusterNetworkPolicy CRD")?;
    kubectl(
        kubeconfig,
        &[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
    )?;
    Ok(())
}

/// The ClusterNetworkPolicy CRD (`policy.networking.k8s.io/v1alpha2`, network-policy-api v0.2.0)
/// the local cluster gets: the group, version, kind, plural, short name and printer columns of
/// upstream's, with the schema of our own typed kind (`network_enforcer_api::cluster_network_policy`),
/// which is more lenient than upstream's CEL rules (v1.20 runs none of them anyway); `check`
/// validates what those rules refuse.
pub fn cluster_network_policy_crd() -> Result<String> {
    use kube::CustomResourceExt;
    let mut crd = network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy::crd();
    // `*.k8s.io` groups are protected: the API server takes a CRD there only with the approval
    // annotation upstream's carries.
    crd.metadata.annotations = Some(
        [(
            "api-approved.kubernetes.io".to_string(),
            "https://github.com/kubernetes-sigs/network-policy-api/pull/30".to_string(),
        )]
        .into(),
    );
    Ok(serde_yaml::to_string(&crd)?)
}

/// Removes what the v1.20 API server cannot take from a (multi-document) CRD YAML text:
/// - every `x-kubernetes-validations` key (CEL rules arrived in 1.25);
/// - empty-string defaults (`default: ''`): v1.20 reads them as null and rejects the CRD with
///   "default: Invalid value: \"null\": in body must be of type string". Against this server such a
///   field stays absent instead of defaulting to "".
pub fn strip_for_v1_20(yaml: &str) -> Result<String> {
    fn strip(v: &mut serde_yaml::Value) {
        match v {
            serde_yaml::Value::Mapping(m) => {
                m.remove("x-kubernetes-validations");
                if m.get("default").and_then(|d| d.as_str()) == Some("") {
                    m.remove("default");
                }
                m.values_mut().for_each(strip);
            }
            serde_yaml::Value::Sequence(s) => s.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut out = String::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let mut value = serde::Deserialize::deserialize(doc)?;
        if matches!(value, serde_yaml::Value::Null) {
            continue;
        }
        strip(&mut value);
        out += "---\n";
        out += &serde_yaml::to_string(&value)?;
    }
    Ok(out)
}

/// A stand-in for Istio's AuthorizationPolicy CRD (no Istio exists here): the same group, version,
/// kind and plural, with an open schema.
pub fn authorization_policy_crd() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "authorizationpolicies.security.istio.io"},
        "spec": {
            "group": "security.istio.io",
            "scope": "Namespaced",
            "names": {"kind": "AuthorizationPolicy", "plural": "authorizationpolicies",
                      "singular": "authorizationpolicy", "listKind": "AuthorizationPolicyList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cel_rules_and_empty_defaults_are_stripped_at_every_depth() {
        let yaml = "a:\n  x-kubernetes-validations: [{rule: self}]\n  b:\n    - x-kubernetes-validations: []\n      c: 1\n      default: ''\n---\nd: 2\ne: {default: x}\n";
        let out = strip_for_v1_20(yaml).unwrap();
        assert!(!out.contains("x-kubernetes-validations"), "{out}");
        assert!(!out.contains("''") && out.contains("default: x"), "{out}");
        assert!(out.contains("c: 1") && out.contains("d: 2"), "{out}");
    }
}
