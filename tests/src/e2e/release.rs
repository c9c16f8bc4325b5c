//! Our images and our chart in the local cluster.
//!
//! - [`build_image`] / [`images_from_debug_build`]: `network-enforcer.local/{agent,controller}:dev` from the
//!   workspace's binaries (debug info stripped), imported into the cluster's containerd. Tests use the
//!   debug binaries `cargo test --workspace` has already built (cargo builds every package's binaries for
//!   its integration tests, and a test cannot run cargo itself: cargo holds the target directory's lock
//!   while tests run).
//! - [`Release`]: `helm install` with those images, the admission policy off (v1.20 has no
//!   ValidatingAdmissionPolicy) and no collector; waits until the controller and every agent are ready.
//!   Dropping it (also on panic) runs `helm uninstall`, deletes the release namespace and checks that
//!   nothing labelled with the release is left. A release left over by a killed run is removed first.

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::poll;
use crate::cluster::components::{self, kubectl};
use crate::cluster::layout::{State, cache_dir};
use crate::cluster::process::{self, output};
use crate::images;

/// Our two components: image `network-enforcer.local/<name>:dev`, binary `network-enforcer-<name>`.
pub const COMPONENTS: [&str; 2] = ["agent", "controller"];

/// Generous: two cores shared with builds, and pods of a new ServiceAccount are refused until its token
/// Secret exists (v1.20), after which controllers retry with backoff.
pub const READY_TIMEOUT: Duration = Duration::from_secs(240);

/// helm v4 from `cargo xtask setup`.
pub fn helm_bin() -> PathBuf {
    cache_dir().join("bin/helm")
}

/// The chart in this workspace.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/network-enforcer")
}

/// The workspace's target directory (`CARGO_TARGET_DIR` if set).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// The debug binary of `component` (`agent` or `controller`) under [`target_dir`].
pub fn debug_binary(component: &str) -> PathBuf {
    target_dir()
        .join("debug")
        .join(format!("network-enforcer-{component}"))
}

/// Builds image `network-enforcer.local/<component>:dev` from the shipped `docker/<component>.Dockerfile`
/// with `binary` (debug info stripped) as its prebuilt binary ([`crate::buildah`]) into the image cache
/// and imports it into the cluster's containerd when the cluster runs. The tar is rewritten only when the binary is newer. Returns the tar's path.
pub fn build_image(component: &str, binary: &Path) -> Result<PathBuf> {
    let tar = images::tar_path(component);
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let binary_time = modified(binary).with_context(|| {
        format!(
            "{} is missing: build it first (`cargo build --bins`; `cargo test --workspace` does)",
            binary.display()
        )
    })?;
    if modified(&tar).is_none_or(|t| t < binary_time) {
        let stripped = tar.with_extension("bin");
        if let Some(dir) = stripped.parent() {
            std::fs::create_dir_all(dir)?;
        }
        output(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(&stripped)
                .arg(binary),
        )?;
        let reference = format!("{}/{component}:{}", images::REGISTRY, images::TAG);
        let built = crate::buildah::build(component, &stripped, &reference, &tar);
        let _ = std::fs::remove_file(&stripped);
        built.with_context(|| format!("building image {reference}"))?;
    }
    let state = State::new();
    if process::running_pid(&state, "containerd").is_some() {
        components::import_image(&state, &tar)?;
    }
    Ok(tar)
}

/// Warns when a source file of `component` (or the crates it shares) is newer than its debug binary:
/// the test would run yesterday's code. Not an error: someone may be editing while tests run.
fn warn_if_stale(component: &str, binary: &Path) {
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut stack: Vec<PathBuf> = [component, "api", "agent-common", "agent-ebpf"]
        .iter()
        .map(|c| root.join(c).join("src"))
        .collect();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(t) = entry.metadata().and_then(|m| m.modified()) {
                if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                    newest = Some((t, path));
                }
            }
        }
    }
    if let Some((t, path)) = newest.filter(|(t, _)| *t > built) {
        let _ = t;
        eprintln!(
            "warning: {} is newer than {}: run `cargo build --bins` to test the current code",
            path.display(),
            binary.display()
        );
    }
}

/// [`build_image`] for both components from their debug binaries.
pub fn images_from_debug_build() -> Result<()> {
    for component in COMPONENTS {
        let binary = debug_binary(component);
        warn_if_stale(component, &binary);
        build_image(component, &binary)?;
    }
    Ok(())
}

/// The chart's `uplink.tls.mode` in local installs: the chart's default, a self-signed CA generated by
/// helm, so every local install exercises authenticated TLS between agent and controller.
pub const UPLINK_TLS_MODE: &str = "selfSigned";

/// `--set` values every local install needs: our local images (never pulled), no admission policy (the
/// v1.20 API server has no ValidatingAdmissionPolicy), no collector (none is shipped as an image here),
/// the uplink's TLS mode ([`UPLINK_TLS_MODE`]). The agent gets the chart's default capabilities only
/// (no CAP_SYS_PTRACE): what users get.
pub fn local_values() -> Vec<String> {
    let mut sets = Vec::new();
    for component in COMPONENTS {
        sets.push(format!(
            "{component}.image.repository={}/{component}",
            images::REGISTRY
        ));
        sets.push(format!("{component}.image.tag={}", images::TAG));
        sets.push(format!("{component}.image.pullPolicy=Never"));
    }
    sets.push("admissionPolicy.enabled=false".into());
    sets.push("telemetry.collectorStrategy=none".into());
    sets.push(format!("uplink.tls.mode={UPLINK_TLS_MODE}"));
    sets
}

/// The controller's metrics port, the chart's default (`controller.metricsPort`).
const CONTROLLER_METRICS_PORT: u16 = 8080;
/// The chart's default web view port (`controller.ui.port`).
const CONTROLLER_UI_PORT: u16 = 8090;

/// One installed release of our chart; uninstalled on drop.
pub struct Release {
    /// The release name.
    pub name: String,
    /// The release namespace (created and deleted by us).
    pub namespace: String,
    kubeconfig: PathBuf,
    removed: bool,
}

impl Release {
    /// Installs the chart as `name` in a fresh namespace `namespace` with [`local_values`] plus `sets`
    /// (later ones win), after removing what a killed run may have left, and waits until the controller
    /// Deployment is available and every agent pod is ready. The CRDs must be installed already (the
    /// fixture installs them without the CEL rules v1.20 rejects), so helm skips `crds/`.
    pub fn install(
        kubeconfig: &Path,
        name: &str,
        namespace: &str,
        sets: &[String],
    ) -> Result<Self> {
        let release = Self {
            name: name.into(),
            namespace: namespace.into(),
            kubeconfig: kubeconfig.into(),
            removed: false,
        };
        release.remove_leftovers()?;
        kubectl(kubeconfig, &["create", "namespace", namespace])?;
        let mut cmd = release.helm();
        cmd.args(["install", name]).arg(chart_dir()).args([
            "--namespace",
            namespace,
            "--skip-crds",
        ]);
        for set in local_values().iter().chain(sets) {
            cmd.arg("--set").arg(set);
        }
        output(&mut cmd).context("helm install")?;
        release.wait_ready()?;
        Ok(release)
    }

    /// `helm upgrade --reuse-values` with `sets`, then waits until the new pods are rolled out and ready.
    pub fn upgrade(&self, sets: &[String]) -> Result<()> {
        let mut cmd = self.helm();
        cmd.args(["upgrade", &self.name]).arg(chart_dir()).args([
            "--namespace",
            &self.namespace,
            "--reuse-values",
            "--skip-crds",
        ]);
        for set in sets {
            cmd.arg("--set").arg(set);
        }
        output(&mut cmd).context("helm upgrade")?;
        for (kind, component) in [("daemonset", "agent"), ("deployment", "controller")] {
            self.kubectl(&[
                "rollout",
                "status",
                &format!("{kind}/{}", self.object_name(component)),
                &format!("--timeout={}s", READY_TIMEOUT.as_secs()),
            ])
            .with_context(|| format!("rolling out the {component} after helm upgrade"))?;
        }
        self.wait_ready()
    }

    fn helm(&self) -> Command {
        let mut cmd = Command::new(helm_bin());
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// kubectl with the admin kubeconfig in the release namespace.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let ns = format!("--namespace={}", self.namespace);
        let mut all = vec![ns.as_str()];
        all.extend_from_slice(args);
        kubectl(&self.kubeconfig, &all)
    }

    /// `kubectl port-forward <target> :<remote>` in the release namespace (e.g. `deploy/<controller>`),
    /// as a user reaches a port that only the pod's loopback serves. Returns once kubectl listens;
    /// the forward ends when the returned value is dropped.
    pub fn port_forward(&self, target: &str, remote: u16) -> Result<PortForward> {
        use std::io::BufRead;
        let mut child = Command::new(crate::cluster::layout::kubernetes_bin("kubectl"))
            .env("KUBECONFIG", &self.kubeconfig)
            .args([
                "--namespace",
                &self.namespace,
                "port-forward",
                "--address=127.0.0.1",
            ])
            .arg(target)
            .arg(format!(":{remote}"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting kubectl port-forward")?;
        let stdout = child.stdout.take().context("kubectl's stdout")?;
        let mut forward = PortForward { child, local: 0 };
        // "Forwarding from 127.0.0.1:41235 -> 8090"
        let mut line = String::new();
        let mut reader = std::io::BufReader::new(stdout);
        reader.read_line(&mut line)?;
        // kubectl writes a line per connection: its stdout must stay open (a closed pipe ends it).
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        forward.local = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|port| port.parse().ok())
            .with_context(|| {
                let mut err = String::new();
                if let Some(mut stderr) = forward.child.stderr.take() {
                    let _ = forward.child.kill();
                    let _ = stderr.read_to_string(&mut err);
                }
                format!("kubectl port-forward {target} :{remote} did not start: {line:?} {err}")
            })?;
        Ok(forward)
    }

    /// The label selector of one component's pods (`controller`, `agent`).
    pub fn selector(&self, component: &str) -> String {
        format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component={component}",
            self.name
        )
    }

    /// Waits until the controller has completed `passes` status passes after this call (its metric
    /// `status_passes_total`, read through a port-forward to the leader's metrics port, the chart's
    /// default 8080; only the leader passes). Each pass attributes the evidence queued before it,
    /// then writes every policy's status: after two, whatever reached the controller before the call
    /// is in the statuses.
    pub fn wait_for_status_passes(&self, passes: u64, timeout: Duration) -> Result<()> {
        let forward = self.port_forward(&self.leader_target()?, CONTROLLER_METRICS_PORT)?;
        let read = || -> Result<Option<f64>> {
            let text = http_get(&forward.address(), "/metrics")?;
            Ok(metric(
                &text,
                "network_enforcer_controller_status_passes_total",
            ))
        };
        let describe = || self.logs("controller").unwrap_or_default();
        let start = poll(
            "the controller's status_passes_total through port-forward",
            Duration::from_secs(30),
            Duration::from_millis(250),
            read,
            describe,
        )?;
        poll(
            &format!("{passes} more status passes of the controller (from {start})"),
            timeout,
            Duration::from_millis(250),
            || Ok(read()?.filter(|now| *now >= start + passes as f64)),
            describe,
        )?;
        Ok(())
    }

    /// The controller replica holding the Lease (its pod name); `None` when there is no Lease (no
    /// leader election) or nobody holds it.
    pub fn leader(&self) -> Result<Option<String>> {
        let holder = match self.kubectl(&[
            "get",
            "lease",
            &self.object_name("controller"),
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]) {
            Ok(holder) => holder,
            Err(e) if format!("{e:#}").contains("NotFound") => return Ok(None),
            Err(e) => return Err(e),
        };
        let holder = holder.trim();
        Ok((!holder.is_empty()).then(|| holder.to_string()))
    }

    /// What `kubectl port-forward` reaches the leading controller by: its pod, or the Deployment
    /// without leader election (the one replica).
    fn leader_target(&self) -> Result<String> {
        Ok(match self.leader()? {
            Some(pod) => format!("pod/{pod}"),
            None => format!("deploy/{}", self.object_name("controller")),
        })
    }

    /// The leading controller's web view answer for `path` (`/api/v1/...`, docs/ui.md), through a
    /// port-forward to its web view port on the pod's loopback, as a user reads it; only the leader
    /// keeps the observed edges the graph draws.
    pub fn controller_web_view(&self, path: &str) -> Result<serde_json::Value> {
        let forward = self.port_forward(&self.leader_target()?, CONTROLLER_UI_PORT)?;
        let body = http_get(&forward.address(), path)?;
        serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON: {body}"))
    }

    /// The leading controller's `/metrics` (through a port-forward to its metrics port).
    pub fn controller_metrics(&self) -> Result<String> {
        let forward = self.port_forward(&self.leader_target()?, CONTROLLER_METRICS_PORT)?;
        http_get(&forward.address(), "/metrics")
    }

    /// The host's process id of the process running `binary` (a substring of its command line) in pod
    /// `pod` of the release namespace: the pods of the local cluster run on this machine, and each
    /// process's cgroup names its pod's UID.
    pub fn host_pid(&self, pod: &str, binary: &str) -> Result<u32> {
        let uid = self.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"])?;
        let uid = uid.trim();
        anyhow::ensure!(!uid.is_empty(), "pod {pod} has no UID");
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(binary) && cgroup.contains(uid) {
                return Ok(pid);
            }
        }
        bail!("no {binary} process of pod {pod} ({uid}) on this machine")
    }

    /// The name of the chart's object for `component` (`<release>-network-enforcer-<component>`, or
    /// `<release>-<component>` when the release name contains the chart name).
    pub fn object_name(&self, component: &str) -> String {
        if self.name.contains("network-enforcer") {
            format!("{}-{component}", self.name)
        } else {
            format!("{}-network-enforcer-{component}", self.name)
        }
    }

    /// Names of the running pods of `component`.
    pub fn pods(&self, component: &str) -> Result<Vec<String>> {
        let out = self.kubectl(&[
            "get",
            "pods",
            "-l",
            &self.selector(component),
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?;
        Ok(out.split_whitespace().map(String::from).collect())
    }

    /// The one agent pod of this single-node cluster.
    pub fn agent_pod(&self) -> Result<String> {
        let pods = self.pods("agent")?;
        match pods.as_slice() {
            [one] => Ok(one.clone()),
            other => bail!("expected one running agent pod, found {other:?}"),
        }
    }

    /// The log of `component`'s pods (all containers, with a prefix per pod).
    pub fn logs(&self, component: &str) -> Result<String> {
        self.kubectl(&[
            "logs",
            "-l",
            &self.selector(component),
            "--prefix",
            "--tail=-1",
        ])
    }

    /// `kubectl exec` in the agent pod.
    pub fn exec_agent(&self, command: &[&str]) -> Result<String> {
        self.exec_in(&self.agent_pod()?, command)
    }

    /// `kubectl exec` in every running agent pod (one per node); their outputs, concatenated.
    pub fn exec_agents(&self, command: &[&str]) -> Result<String> {
        let mut all = String::new();
        for pod in self.pods("agent")? {
            all += &self.exec_in(&pod, command)?;
        }
        Ok(all)
    }

    /// `kubectl exec` in pod `pod` of the release namespace.
    pub fn exec_in(&self, pod: &str, command: &[&str]) -> Result<String> {
        let mut args = vec!["exec", pod, "--"];
        args.extend_from_slice(command);
        self.kubectl(&args)
    }

    /// The running agent pod on Node `node`.
    pub fn agent_pod_on(&self, node: &str) -> Result<String> {
        let out = self.kubectl(&[
            "get",
            "pods",
            "-l",
            &self.selector("agent"),
            "--field-selector",
            &format!("status.phase=Running,spec.nodeName={node}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?;
        match out.split_whitespace().collect::<Vec<_>>().as_slice() {
            [one] => Ok(one.to_string()),
            other => bail!("expected one running agent pod on {node}, found {other:?}"),
        }
    }

    /// Waits until the controller Deployment has an available replica and the agent DaemonSet has every
    /// scheduled pod ready.
    pub fn wait_ready(&self) -> Result<()> {
        let controller = self.object_name("controller");
        let agent = self.object_name("agent");
        poll(
            "the controller Deployment and the agent DaemonSet to be ready",
            READY_TIMEOUT,
            Duration::from_millis(500),
            || {
                let available = self.kubectl(&[
                    "get",
                    "deployment",
                    &controller,
                    "-o",
                    "jsonpath={.status.availableReplicas}",
                ])?;
                let agents = self.kubectl(&[
                    "get",
                    "daemonset",
                    &agent,
                    "-o",
                    "jsonpath={.status.desiredNumberScheduled} {.status.numberReady} {.status.updatedNumberScheduled}",
                ])?;
                let counts: Vec<u32> = agents
                    .split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect();
                let agents_ready = matches!(counts.as_slice(), [want, ready, updated] if *want > 0 && ready == want && updated == want);
                Ok(
                    (available.trim().parse::<u32>().unwrap_or(0) >= 1 && agents_ready)
                        .then_some(()),
                )
            },
            || self.describe(),
        )
    }

    /// The release namespace's objects, events and our pods' logs (for failure messages).
    pub fn describe(&self) -> String {
        let show = |args: &[&str]| self.kubectl(args).unwrap_or_else(|e| format!("{e:#}\n"));
        let mut text = format!(
            "--- kubectl get all -n {0} ---\n{1}--- events in {0} ---\n{2}",
            self.namespace,
            show(&["get", "all", "-o", "wide"]),
            show(&["get", "events", "--sort-by=.lastTimestamp"]),
        );
        for component in COMPONENTS {
            let log = self.logs(component).unwrap_or_else(|e| format!("{e:#}"));
            let lines: Vec<&str> = log.lines().collect();
            text += &format!(
                "--- {component} log (last 40 lines) ---\n{}\n",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        text
    }

    /// Objects of this release that still exist: cluster-scoped ones with its instance label, and the
    /// namespace with whatever is in it.
    pub fn leftovers(&self) -> Result<Vec<String>> {
        Self::leftover_objects(&self.kubeconfig, &self.name, &self.namespace)
    }

    /// [`Release::leftovers`] of release `name` in `namespace`, without a handle.
    pub fn leftover_objects(kubeconfig: &Path, name: &str, namespace: &str) -> Result<Vec<String>> {
        let selector = format!("app.kubernetes.io/instance={name}");
        let mut left: Vec<String> = kubectl(
            kubeconfig,
            &[
                "get",
                "clusterroles,clusterrolebindings",
                "-l",
                &selector,
                "-o",
                "name",
            ],
        )?
        .lines()
        .map(String::from)
        .collect();
        let found = kubectl(
            kubeconfig,
            &[
                "get",
                "namespace",
                namespace,
                "--ignore-not-found",
                "-o",
                "name",
            ],
        )?;
        if !found.trim().is_empty() {
            left.push(found.trim().to_string());
            let ns = format!("--namespace={namespace}");
            left.extend(
                kubectl(
                    kubeconfig,
                    &[&ns, "get", "all,serviceaccounts,secrets", "-o", "name"],
                )
                .unwrap_or_default()
                .lines()
                .map(String::from),
            );
        }
        Ok(left)
    }

    /// `helm uninstall` (its pre-delete hook removes rendered NetworkPolicies), then deletes the release
    /// namespace and waits until nothing of the release is left.
    /// Uninstalls and checks that nothing is left, the agent's enforcement table on the node included
    /// (the agent removes it when its DaemonSet goes away).
    pub fn uninstall(mut self) -> Result<()> {
        self.removed = true;
        self.remove()?;
        if let Some(rules) = self.enforcement_rules()? {
            let _ = output(Command::new("nft").args([
                "delete",
                "table",
                "inet",
                &self.enforcement_table(),
            ]));
            bail!(
                "the agent left its enforcement table {} after the uninstall:\n{rules}",
                self.enforcement_table()
            );
        }
        Ok(())
    }

    fn remove(&self) -> Result<()> {
        let status = self
            .helm()
            .args(["status", &self.name, "--namespace", &self.namespace])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        if status.success() {
            let uninstall = |extra: &[&str]| {
                output(
                    self.helm()
                        .args([
                            "uninstall",
                            &self.name,
                            "--namespace",
                            &self.namespace,
                            "--wait",
                            "--timeout=3m",
                        ])
                        .args(extra),
                )
            };
            // A pre-delete hook that cannot run (its pod unschedulable, say) must not leave the
            // release behind: the objects go without it, and the failure is reported.
            if let Err(e) = uninstall(&[]) {
                eprintln!(
                    "warning: helm uninstall {}: {e:#}; again without hooks",
                    self.name
                );
                uninstall(&["--no-hooks"]).context("helm uninstall --no-hooks")?;
            }
        }
        kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "namespace",
                &self.namespace,
                "--ignore-not-found",
                "--wait=false",
            ],
        )?;
        // Cluster-scoped objects of a release whose record went with its namespace (a killed run).
        kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "clusterroles,clusterrolebindings",
                "-l",
                &format!("app.kubernetes.io/instance={}", self.name),
                "--ignore-not-found",
            ],
        )?;
        poll(
            "the release's objects and namespace to be gone",
            Duration::from_secs(180),
            Duration::from_millis(500),
            || Ok(self.leftovers()?.is_empty().then_some(())),
            || format!("left: {:?}", self.leftovers()),
        )
    }

    /// The nftables table (family inet) of this release's agents when they enforce NetworkPolicies
    /// (the chart names it after the release).
    pub fn enforcement_table(&self) -> String {
        let name: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("ne_{name}")
    }

    /// The enforcement table for a timeout's message ([`Release::enforcement_rules`]; empty when it
    /// could not be read).
    pub fn describe_enforcement(&self) -> String {
        self.enforcement_rules()
            .map(|r| format!("{r:#?}"))
            .unwrap_or_default()
    }

    /// The enforcement table as `nft` lists it, `None` when this node has none.
    pub fn enforcement_rules(&self) -> Result<Option<String>> {
        let out = Command::new("nft")
            .args(["list", "table", "inet", &self.enforcement_table()])
            .output()
            .context("running nft (needs root and nftables)")?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    /// Packets the agent's enforcement table dropped so far (the counters of its deny rules).
    pub fn enforcement_drops(&self) -> Result<u64> {
        let rules = self
            .enforcement_rules()?
            .context("the agent's enforcement table is not installed on this node")?;
        Ok(rules
            .lines()
            .filter(|l| l.trim_end().ends_with("drop"))
            .filter_map(|l| {
                l.split_whitespace()
                    .skip_while(|w| *w != "packets")
                    .nth(1)?
                    .parse::<u64>()
                    .ok()
            })
            .sum())
    }

    /// Removes a release of the same name and its namespace left by a run that was killed, and its
    /// enforcement table (a killed test cannot uninstall, so no agent removed it).
    fn remove_leftovers(&self) -> Result<()> {
        if self.enforcement_rules()?.is_some() && self.leftovers()?.is_empty() {
            eprintln!(
                "removing enforcement table {} left by an earlier run",
                self.enforcement_table()
            );
            output(Command::new("nft").args([
                "delete",
                "table",
                "inet",
                &self.enforcement_table(),
            ]))?;
        }
        if self.leftovers()?.is_empty() {
            return Ok(());
        }
        eprintln!(
            "removing release {} in {} left by an earlier run",
            self.name, self.namespace
        );
        self.remove()
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.removed {
            self.removed = true;
            if let Err(e) = self.remove() {
                eprintln!("warning: removing release {}: {e:#}", self.name);
            }
        }
    }
}

/// A running `kubectl port-forward` ([`Release::port_forward`]); stopped when dropped.
pub struct PortForward {
    child: std::process::Child,
    /// The local port kubectl listens on (127.0.0.1).
    pub local: u16,
}

impl PortForward {
    /// `127.0.0.1:<local>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.local)
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET http://<address>/metrics` (HTTP/1.0, no client library needed) and returns the body.
pub fn http_get(address: &str, path: &str) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(address)
        .with_context(|| format!("connecting to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("HTTP response without a header end")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path} from {address}: {head}");
    }
    Ok(body.to_string())
}

/// The value of the unlabelled Prometheus sample `name` in `text`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
