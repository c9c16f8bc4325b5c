//! A fake Istio ambient ztunnel for the `istio` provider, and the end-to-end scenario's Istio
//! backend (docs/development.md) driven through it.
//!
//! [`ZtunnelPod`] is a pod named like ztunnel's (`ztunnel-*`, container `istio-proxy`) whose container
//! prints, on its standard output, the JSON log lines ztunnel >= 1.30 writes with `logAsJson=true` and
//! `AUTHZ_POLICY_INFO_LOGGING=true` (docs/flow-sources.md). The real container runtime frames them into
//! the CRI log files under `/var/log/pods` (linked from `/var/log/containers`) that the agent tails
//! (`agent.ztunnel.logGlob`), exactly as on a node running ztunnel. [`Lines`] writes, per connection,
//! what ztunnel logs for it: the authorization decisions on the destination side (`ztunnel::state`,
//! with the `proxy` and `inbound` spans) and the `connection complete` access lines of both halves.

use anyhow::{Context, Result, ensure};
use network_enforcer_api::keys::PROMOTED_FROM_LABEL;
use network_enforcer_api::{
    Direction, PolicyMode, Protocol as CrdProtocol, ViolationRecord, WorkloadNetworkPolicy,
};
use serde_json::{Map, Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use super::super::poll;
use super::super::release::Release;
use super::super::scenario::{
    self, INGRESS, LEARN_TIMEOUT, STATUS_INTERVAL_SECONDS, STEP_TIMEOUT, Workload, say,
    spec_without_mode, status_counts,
};
use super::super::workload::Namespace;
use super::PodInfo;
use crate::cluster::layout::kubernetes_bin;
use crate::cluster::process::output;
use crate::images::TEST_IMAGE;

/// The ztunnel container's name in Istio's DaemonSet.
pub const CONTAINER: &str = "istio-proxy";

/// `agent.ztunnel.logGlob` matching the log files of [`ZtunnelPod`]s in namespace `namespace`.
pub fn log_glob(namespace: &str) -> String {
    format!("/var/log/containers/ztunnel-*_{namespace}_{CONTAINER}-*.log")
}

/// `time` of a ztunnel line: RFC 3339 UTC with microseconds.
pub fn rfc3339_micros(at: SystemTime) -> String {
    use k8s_openapi::jiff::Timestamp;
    Timestamp::try_from(at)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// A pod standing in for the node's ztunnel: its container's standard output is what the runtime
/// logs, so lines written there land in the CRI log files as ztunnel's would.
pub struct ZtunnelPod {
    ns: String,
    name: String,
    kubeconfig: std::path::PathBuf,
    written: usize,
}

impl ZtunnelPod {
    /// Creates pod `name` (must start with `ztunnel-`) with container [`CONTAINER`] in `ns` and waits
    /// until it runs.
    pub fn create(ns: &Namespace, kubeconfig: &Path, name: &str) -> Result<Self> {
        ensure!(
            name.starts_with("ztunnel-"),
            "{name}: not a ztunnel pod name"
        );
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "ztunnel"}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": CONTAINER, "image": TEST_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 100000"],
                }],
            },
        });
        ns.apply(&pod.to_string())?;
        poll(
            &format!("pod {name} to run"),
            super::super::workload::START_TIMEOUT,
            Duration::from_millis(250),
            || {
                let phase = ns.kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"])?;
                Ok((phase.trim() == "Running").then_some(()))
            },
            || ns.describe(),
        )?;
        Ok(Self {
            ns: ns.name.clone(),
            name: name.into(),
            kubeconfig: kubeconfig.into(),
            written: 0,
        })
    }

    /// Writes `lines` (one JSON object each) to the container's standard output, and waits until the
    /// container runtime has them in the pod's CRI log file.
    ///
    /// The text goes as an argument of `kubectl exec`, not on its stdin: a CI run lost one write's
    /// lines that way (`exec -i` may close the stream before the data is through; 7 of 11 lines
    /// reached the log file).
    pub fn write(&mut self, lines: &[Value]) -> Result<()> {
        let mut text = String::new();
        for line in lines {
            text += &serde_json::to_string(line)?;
            text.push('\n');
        }
        let before: usize = cri_lines(&self.ns).iter().map(|(_, n)| n).sum();
        let mut cmd = Command::new(kubernetes_bin("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--namespace={}", self.ns))
            .args(["exec", &self.name, "-c", CONTAINER, "--"])
            .args([
                "sh",
                "-c",
                "printf '%s' \"$1\" >> /proc/1/fd/1",
                "sh",
                &text,
            ]);
        output(&mut cmd).context("writing ztunnel log lines")?;
        self.written += lines.len();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now: usize = cri_lines(&self.ns).iter().map(|(_, n)| n).sum();
            if now >= before + lines.len() {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{} ztunnel lines written, but the CRI log files hold {now} lines (had {before}) after 30 s",
                lines.len()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Lines written so far.
    pub fn written(&self) -> usize {
        self.written
    }
}

/// Lines in the CRI log files of the [`ZtunnelPod`]s of namespace `namespace`, per file.
pub fn cri_lines(namespace: &str) -> Vec<(String, usize)> {
    let prefix = "ztunnel-";
    let suffix = format!("_{namespace}_{CONTAINER}-");
    std::fs::read_dir("/var/log/containers")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name.starts_with(prefix) && name.contains(&suffix)).then(|| {
                let lines = std::fs::read_to_string(e.path())
                    .map(|t| t.lines().count())
                    .unwrap_or(0);
                (name, lines)
            })
        })
        .collect()
}

/// How the destination's ztunnel decides a connection, given the policies in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No AuthorizationPolicy applies: `no allow policies, allow`.
    NoPolicy,
    /// Only a dry-run ALLOW applies, here `policy` (`ns/name`): it matches or misses, then the
    /// connection is allowed.
    DryRunAllow { policy: String, matches: bool },
    /// An enforced ALLOW applies: it matches (allowed) or misses (rejected).
    Allow { policy: String, matches: bool },
}

/// Builds ztunnel's lines for the connections of the scenario.
pub struct Lines {
    next: u64,
}

impl Default for Lines {
    fn default() -> Self {
        Self::new()
    }
}

impl Lines {
    /// A builder whose connection ids and ports start at a value of this process.
    pub fn new() -> Self {
        Self {
            next: u64::from(std::process::id()) << 16,
        }
    }

    fn base(level: &str, scope: &str, message: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("level".into(), json!(level));
        m.insert("time".into(), json!(rfc3339_micros(SystemTime::now())));
        m.insert("scope".into(), json!(scope));
        m.insert("message".into(), json!(message));
        m
    }

    /// The lines of one TCP connection `client → server:port` through `service_ip`, decided by
    /// `decision` on the server's side: decision lines (with the `proxy` and `inbound` spans), then at
    /// close the inbound (server side) and outbound (client side) access lines.
    pub fn connection(
        &mut self,
        client: &PodInfo,
        server: &PodInfo,
        service: (&str, &str),
        port: u16,
        decision: &Decision,
    ) -> Vec<Value> {
        self.next += 1;
        let src = format!("{}:{}", client.ip, 30_000 + self.next % 30_000);
        let id = format!("{:032x}", self.next);
        let decision_line = |message: &str, policy: Option<&str>| {
            let mut m = Self::base("info", "ztunnel::state", message);
            if let Some(p) = policy {
                m.insert("policy".into(), json!(p));
            }
            m.insert(
                "proxy".into(),
                json!({"wl": format!("{}/{}", server.namespace, server.name)}),
            );
            m.insert("inbound".into(), json!({"id": id, "peer": src}));
            Value::Object(m)
        };
        let mut lines = Vec::new();
        let allowed = match decision {
            Decision::NoPolicy => {
                lines.push(decision_line("no allow policies, allow", None));
                true
            }
            Decision::DryRunAllow { policy, matches } => {
                if *matches {
                    lines.push(decision_line("dry-run: allow policy match", Some(policy)));
                } else {
                    lines.push(decision_line("dry-run: no allow policies match", None));
                }
                lines.push(decision_line("no allow policies, allow", None));
                true
            }
            Decision::Allow { policy, matches } => {
                if *matches {
                    lines.push(decision_line("allow policy match", Some(policy)));
                } else {
                    lines.push(decision_line("no allow policies matched", None));
                }
                *matches
            }
        };
        let spiffe = |p: &PodInfo| format!("spiffe://{}", p.principal());
        let (service_ip, service_name) = service;
        let access = |direction: &str| {
            let mut m = Self::base(
                if allowed { "info" } else { "error" },
                "access",
                "connection complete",
            );
            m.insert("src.addr".into(), json!(src));
            m.insert("src.workload".into(), json!(client.name));
            m.insert("src.namespace".into(), json!(client.namespace));
            m.insert("src.identity".into(), json!(spiffe(client)));
            m.insert("dst.addr".into(), json!(format!("{}:15008", server.ip)));
            let hbone = if direction == "inbound" {
                format!("{}:{port}", server.ip)
            } else {
                format!("{service_ip}:{port}")
            };
            m.insert("dst.hbone_addr".into(), json!(hbone));
            m.insert("dst.service".into(), json!(service_name));
            if direction == "inbound" || allowed {
                m.insert("dst.workload".into(), json!(server.name));
                m.insert("dst.identity".into(), json!(spiffe(server)));
            }
            m.insert("dst.namespace".into(), json!(server.namespace));
            m.insert("direction".into(), json!(direction));
            let bytes = if allowed { 6 } else { 0 };
            m.insert("bytes_sent".into(), json!(bytes));
            m.insert("bytes_recv".into(), json!(bytes));
            m.insert(
                "duration".into(),
                json!(if allowed { "3ms" } else { "0ms" }),
            );
            if !allowed {
                let error = if direction == "inbound" {
                    "connection closed due to policy rejection: allow policies exist, but none allowed"
                } else {
                    "http status: 401 Unauthorized"
                };
                m.insert("error".into(), json!(error));
            }
            Value::Object(m)
        };
        lines.push(access("inbound"));
        lines.push(access("outbound"));
        lines
    }
}

/// The spec of Istio step 2's proposal, as the reference's scenario states it.
pub fn expected_proposal_spec(namespace: &str) -> Value {
    json!({
        "backend": "istio", "direction": "Ingress",
        "targetRef": {"kind": "Deployment", "name": "http-server"},
        "istio": {
            "selector": {"matchLabels": {"app": "http-server"}},
            "rules": [{
                "from": [{"source": {"principals": [format!("cluster.local/ns/{namespace}/sa/http-client-sa")]}}],
                "to": [{"operation": {"ports": ["18080"]}}]
            }]
        }
    })
}

/// The stand-in for Istio's AuthorizationPolicy CRD ([`crate::fixture::authorization_policy_crd`]),
/// applied if missing (shared by every test of the cluster; never deleted).
pub fn ensure_authorization_policy_crd(kubeconfig: &Path) -> Result<()> {
    let crd = crate::fixture::authorization_policy_crd();
    let existing = crate::cluster::components::kubectl(
        kubeconfig,
        &[
            "get",
            "crd",
            "authorizationpolicies.security.istio.io",
            "--ignore-not-found",
            "-o",
            "name",
        ],
    )?;
    if existing.trim().is_empty() {
        super::super::workload::apply(kubeconfig, None, &crd.to_string())?;
    }
    poll(
        "the AuthorizationPolicy CRD to be established",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let status = crate::cluster::components::kubectl(
                kubeconfig,
                &[
                    "get",
                    "crd",
                    "authorizationpolicies.security.istio.io",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                ],
            )?;
            Ok((status.trim() == "True").then_some(()))
        },
        String::new,
    )
}

/// Checks one violation of the Istio scenario: the client's TCP to the server's 18082.
fn check_tcp_violation(v: &ViolationRecord, namespace: &str, action: PolicyMode) -> Result<()> {
    ensure!(
        (
            v.source.owner_name.as_str(),
            v.dest.owner_name.as_str(),
            v.protocol,
            v.dst_port,
            v.action,
            v.direction
        ) == (
            "http-client",
            "http-server",
            CrdProtocol::TCP,
            Some(18082),
            action,
            Some(Direction::Ingress)
        ),
        "{INGRESS}: {v:#?}"
    );
    ensure!(
        (
            v.denying_policy_namespace.as_str(),
            v.denying_policy_name.as_str()
        ) == (namespace, INGRESS),
        "{INGRESS}: denying policy: {v:#?}"
    );
    ensure!(
        v.source.identity == format!("cluster.local/ns/{namespace}/sa/http-client-sa"),
        "{INGRESS}: source identity: {v:#?}"
    );
    Ok(())
}

/// The AuthorizationPolicy `name` in the workload's namespace, if any.
fn authorization_policy(w: &Workload, name: &str) -> Result<Option<Value>> {
    let out = w.ns.kubectl(&[
        "get",
        "authorizationpolicies.security.istio.io",
        name,
        "--ignore-not-found",
        "-o",
        "json",
    ])?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_str(&out)?))
}

/// Runs the end-to-end scenario's Istio backend (ambient) in a new namespace `name` against `release`
/// (provider `istio`, `agent.ztunnel.logGlob` = [`log_glob`] of `ztunnel_ns`), every connection
/// reported by the ztunnel lines of a [`ZtunnelPod`] in `ztunnel_ns`. Returns the scenario's duration.
pub fn run(
    kubeconfig: &Path,
    release: &Release,
    agent_metrics_port: u16,
    name: &str,
    ztunnel_ns: &Namespace,
) -> Result<Duration> {
    let started = Instant::now();
    say("creating the workload (http-client, http-server, http-service)");
    let w = scenario::create_workload(kubeconfig, name)?;
    let n = w.ns.name.clone();
    // Step 1: the namespace is in the ambient mesh.
    w.ns.kubectl(&["label", "namespace", &n, "istio.io/dataplane-mode=ambient"])?;
    let client = PodInfo::get(kubeconfig, &n, &w.client.0)?;
    let server = PodInfo::get(kubeconfig, &n, &w.server.0)?;
    let service = (
        w.service_ip.clone(),
        format!("{}.{n}.svc.cluster.local", scenario::SERVICE),
    );
    let service = (service.0.as_str(), service.1.as_str());
    let mut ztunnel = ZtunnelPod::create(
        ztunnel_ns,
        kubeconfig,
        &format!("ztunnel-{}", std::process::id()),
    )?;
    let mut lines = Lines::new();
    let describe = |w: &Workload, written: usize| {
        format!(
            "proposals: {:#?}\npolicies: {:#?}\nztunnel lines written: {written}, in the CRI log files: {:?}\n{}\n{}\n{}",
            w.proposals().map(|p| p
                .into_iter()
                .map(|(k, v)| (k, serde_json::to_value(v.spec).ok()))
                .collect::<Vec<_>>()),
            w.policies(),
            cri_lines(&ztunnel_ns.name),
            w.ns.describe(),
            release.describe(),
            super::diagnostics(release, agent_metrics_port)
        )
    };

    say("step 1: ztunnel logs the client's TCP http-service:18080 (no policy yet)");
    ztunnel.write(&lines.connection(&client, &server, service, 18080, &Decision::NoPolicy))?;

    // Step 2: exactly the server's ingress proposal with the client's principal on 18080.
    say("step 2: waiting for the ingress proposal");
    let expected = expected_proposal_spec(&n);
    let learned = poll(
        "exactly the istio proposal of step 2",
        LEARN_TIMEOUT,
        Duration::from_millis(250),
        || {
            let proposals = w.proposals()?;
            let specs: Vec<(String, Value)> = proposals
                .into_iter()
                .map(|(k, p)| Ok((k, serde_json::to_value(&p.spec)?)))
                .collect::<Result<_>>()?;
            Ok(
                (specs.len() == 1 && specs[0].0 == INGRESS && specs[0].1 == expected)
                    .then(|| specs[0].1.clone()),
            )
        },
        || {
            format!(
                "expected: {expected:#}\n{}",
                describe(&w, ztunnel.written())
            )
        },
    )?;
    say("step 2: proposal learned from ztunnel's access log");

    // Step 3: promote to monitor: the policy, no proposal, a dry-run ALLOW AuthorizationPolicy.
    say("step 3: promote=monitor");
    w.promote(INGRESS, "monitor")?;
    let policy = poll(
        "the monitor policy and no proposal",
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let p = w.policies()?.remove(INGRESS);
            Ok(p.filter(|p| p.spec.mode == PolicyMode::Monitor)
                .filter(|_| w.proposals().is_ok_and(|p| p.is_empty())))
        },
        || describe(&w, ztunnel.written()),
    )?;
    let from = policy
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PROMOTED_FROM_LABEL));
    ensure!(
        from.map(String::as_str) == Some(INGRESS),
        "label {PROMOTED_FROM_LABEL} is {from:?}"
    );
    ensure!(
        spec_without_mode(&policy)? == learned,
        "the policy's spec differs from its proposal's: {:#?}",
        policy.spec
    );
    let ap = poll(
        "the dry-run AuthorizationPolicy",
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || authorization_policy(&w, INGRESS),
        || describe(&w, ztunnel.written()),
    )?;
    check_authorization_policy(&ap, &policy, true)?;

    // Step 4: TCP 18082 still works; a monitor violation.
    let policy_ref = format!("{n}/{INGRESS}");
    say(
        "step 4: ztunnel logs TCP 18080 (dry-run match) and TCP 18082 (dry-run miss), both allowed",
    );
    let dry_run = |matches| Decision::DryRunAllow {
        policy: policy_ref.clone(),
        matches,
    };
    ztunnel.write(&lines.connection(&client, &server, service, 18080, &dry_run(true)))?;
    ztunnel.write(&lines.connection(&client, &server, service, 18082, &dry_run(false)))?;
    let policy = poll(
        "the monitor violation",
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let p = w.policies()?.remove(INGRESS);
            Ok(p.filter(|p| status_counts(p).0 > 0))
        },
        || describe(&w, ztunnel.written()),
    )?;
    // One more status interval: a second (wrong) record would be in by then.
    std::thread::sleep(Duration::from_secs(STATUS_INTERVAL_SECONDS + 3));
    let s = w
        .policies()?
        .remove(INGRESS)
        .context("policy gone")?
        .status
        .unwrap_or_default();
    ensure!(
        (s.violation_count, s.active_violation_count) == (1, 1),
        "expected exactly one monitor violation: {s:#?} (first seen: {:#?})",
        policy.status
    );
    check_tcp_violation(&s.violations[0], &n, PolicyMode::Monitor)?;
    ensure!(
        w.proposals()?.is_empty(),
        "the proposal was re-created after promotion"
    );
    say("step 4: one monitor violation (TCP 18082)");

    // Step 5: protect: the dry-run annotation goes; 18080 allowed, 18082 rejected.
    say("step 5: mode protect");
    w.set_mode(INGRESS, "protect")?;
    let ap = poll(
        "the AuthorizationPolicy without the dry-run annotation",
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            Ok(authorization_policy(&w, INGRESS)?
                .filter(|ap| ap["metadata"]["annotations"]["istio.io/dry-run"].is_null()))
        },
        || describe(&w, ztunnel.written()),
    )?;
    let policy = w.policies()?.remove(INGRESS).context("policy gone")?;
    check_authorization_policy(&ap, &policy, false)?;
    let enforced = |matches| Decision::Allow {
        policy: policy_ref.clone(),
        matches,
    };
    say("step 5: ztunnel logs TCP 18080 allowed and TCP 18082 rejected");
    ztunnel.write(&lines.connection(&client, &server, service, 18080, &enforced(true)))?;
    ztunnel.write(&lines.connection(&client, &server, service, 18082, &enforced(false)))?;
    poll(
        "the protect violation",
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let p = w.policies()?.remove(INGRESS);
            Ok(p.filter(|p| status_counts(p).0 >= 2))
        },
        || describe(&w, ztunnel.written()),
    )?;
    std::thread::sleep(Duration::from_secs(2 * STATUS_INTERVAL_SECONDS + 3));
    let s = w
        .policies()?
        .remove(INGRESS)
        .context("policy gone")?
        .status
        .unwrap_or_default();
    ensure!(
        (s.violation_count, s.active_violation_count) == (2, 2),
        "expected the monitor and the protect violation: {s:#?}"
    );
    check_tcp_violation(&s.violations[0], &n, PolicyMode::Protect)
        .context("the newest violation is not the rejected connection")?;
    say("step 5: monitor + protect violation, 18080 records nothing");
    let took = started.elapsed();
    say(&format!("done in {:.1}s", took.as_secs_f64()));
    w.ns.delete_and_wait()?;
    Ok(took)
}

/// The rendered AuthorizationPolicy: ALLOW, the policy's selector and rules, the dry-run annotation
/// exactly in monitor mode, a controller ownerReference to the policy.
fn check_authorization_policy(
    ap: &Value,
    policy: &WorkloadNetworkPolicy,
    dry_run: bool,
) -> Result<()> {
    let istio = serde_json::to_value(policy.spec.istio.as_ref().context("no spec.istio")?)?;
    ensure!(
        ap["spec"]["action"] == json!("ALLOW")
            && ap["spec"]["selector"] == istio["selector"]
            && ap["spec"]["rules"] == istio["rules"],
        "AuthorizationPolicy {:#} does not render {istio:#}",
        ap["spec"]
    );
    let annotation = &ap["metadata"]["annotations"]["istio.io/dry-run"];
    ensure!(
        if dry_run {
            *annotation == json!("true")
        } else {
            annotation.is_null()
        },
        "istio.io/dry-run is {annotation} in mode {:?}",
        policy.spec.mode
    );
    let owners = ap["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        owners.iter().any(|o| o["controller"] == json!(true)
            && o["kind"] == json!("WorkloadNetworkPolicy")
            && o["name"] == json!(INGRESS)),
        "ownerReferences {owners:#?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn times_are_rfc3339_utc_with_microseconds() {
        let at = UNIX_EPOCH + Duration::from_micros(1_787_307_330_123_456);
        assert_eq!(rfc3339_micros(at), "2026-08-21T10:15:30.123456Z");
        assert_eq!(rfc3339_micros(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_micros(leap), "2000-02-29T00:00:00.000000Z");
    }
}
