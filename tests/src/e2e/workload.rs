//! Real workloads and real traffic: namespaces (deleted on drop), Deployments of the test image running
//! our echo server, and payloads sent with socat from inside a client pod (`kubectl exec`). Nothing
//! here injects a flow: whatever our agent reports, it saw in the kernel.

use anyhow::{Context, Result, bail};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::poll;
use crate::cluster::components::kubectl;
use crate::cluster::layout::kubernetes_bin;
use crate::cluster::process::output_with_input;
use crate::fixture::OWNER_LABEL;
use crate::images::{ECHO_SERVER, TEST_IMAGE};

/// How long pods get to start (two shared cores; ServiceAccount tokens appear asynchronously).
pub const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A namespace of ours, labelled with this process's pid (so a later run removes it if we are
/// killed, see `fixture`), deleted on drop without waiting.
pub struct Namespace {
    /// The namespace's name.
    pub name: String,
    kubeconfig: PathBuf,
    /// Keep the namespace on drop (the demo leaves its app running until Ctrl-C, then deletes it).
    pub keep: bool,
}

impl Namespace {
    /// Creates namespace `name` and waits for its `default` ServiceAccount's token Secret.
    pub fn create(kubeconfig: &Path, name: &str) -> Result<Self> {
        let manifest = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {OWNER_LABEL: std::process::id().to_string()}}
        });
        apply(kubeconfig, None, &manifest.to_string())?;
        let ns = Self {
            name: name.into(),
            kubeconfig: kubeconfig.into(),
            keep: false,
        };
        ns.wait_for_token("default")?;
        Ok(ns)
    }

    /// kubectl in this namespace with the admin kubeconfig; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let ns = format!("--namespace={}", self.name);
        let mut all = vec![ns.as_str()];
        all.extend_from_slice(args);
        kubectl(&self.kubeconfig, &all)
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON) in this namespace.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        apply(&self.kubeconfig, Some(&self.name), manifest)
    }

    /// Creates ServiceAccount `name` and waits for its token Secret: v1.20 refuses pods of a
    /// ServiceAccount until the controller-manager has made it, and controllers then retry with backoff.
    pub fn service_account(&self, name: &str) -> Result<()> {
        self.apply(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
                .to_string(),
        )?;
        self.wait_for_token(name)
    }

    fn wait_for_token(&self, account: &str) -> Result<()> {
        poll(
            &format!("the token Secret of ServiceAccount {account}"),
            Duration::from_secs(60),
            Duration::from_millis(250),
            || {
                let secret = self.kubectl(&[
                    "get",
                    "serviceaccount",
                    account,
                    "-o",
                    "jsonpath={.secrets[0].name}",
                ])?;
                let secret = secret.trim();
                if secret.is_empty() {
                    return Ok(None);
                }
                let token =
                    self.kubectl(&["get", "secret", secret, "-o", "jsonpath={.data.token}"])?;
                Ok((!token.trim().is_empty()).then_some(()))
            },
            || self.describe(),
        )
    }

    /// Waits until Deployment `name` has all its replicas available; returns its pods' (name, IP).
    pub fn wait_for_deployment(&self, name: &str) -> Result<Vec<(String, String)>> {
        poll(
            &format!("Deployment {name} to be available"),
            START_TIMEOUT,
            Duration::from_millis(500),
            || {
                let counts = self.kubectl(&[
                    "get",
                    "deployment",
                    name,
                    "-o",
                    "jsonpath={.spec.replicas} {.status.availableReplicas} {.status.updatedReplicas}",
                ])?;
                let n: Vec<&str> = counts.split_whitespace().collect();
                if n.len() != 3 || n[0] != n[1] || n[0] != n[2] {
                    return Ok(None);
                }
                let pods = self.running_pods(&format!("app={name}"))?;
                Ok((pods.len().to_string() == n[0]).then_some(pods))
            },
            || self.describe(),
        )
    }

    /// (name, IP) of the running, not terminating pods matching `selector`.
    pub fn running_pods(&self, selector: &str) -> Result<Vec<(String, String)>> {
        let out = self.kubectl(&[
            "get",
            "pods",
            "-l",
            selector,
            "--field-selector=status.phase=Running",
            "-o",
            r#"go-template={{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{.status.podIP}}{{"\n"}}{{end}}{{end}}"#,
        ])?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let (name, ip) = l.split_once(' ')?;
                (!ip.trim().is_empty()).then(|| (name.to_string(), ip.trim().to_string()))
            })
            .collect())
    }

    /// Waits until Service `name` has `count` ready endpoint addresses.
    pub fn wait_for_endpoints(&self, name: &str, count: usize) -> Result<()> {
        poll(
            &format!("{count} ready endpoints behind Service {name}"),
            START_TIMEOUT,
            Duration::from_millis(250),
            || {
                let ips = self.kubectl(&[
                    "get",
                    "endpoints",
                    name,
                    "-o",
                    "jsonpath={.subsets[*].addresses[*].ip}",
                ])?;
                Ok((ips.split_whitespace().count() == count).then_some(()))
            },
            || self.describe(),
        )
    }

    /// The ClusterIP of Service `name` in this namespace.
    pub fn cluster_ip(&self, name: &str) -> Result<String> {
        let ip = self.kubectl(&["get", "service", name, "-o", "jsonpath={.spec.clusterIP}"])?;
        let ip = ip.trim();
        if ip.is_empty() || ip == "None" {
            bail!("Service {}/{name} has no ClusterIP", self.name);
        }
        Ok(ip.to_string())
    }

    /// Runs `script` with `sh -c` in pod `pod` (`kubectl exec`); returns stdout, fails on a non-zero
    /// exit with stderr.
    pub fn exec(&self, pod: &str, script: &str) -> Result<String> {
        self.kubectl(&["exec", pod, "--", "sh", "-c", script])
    }

    /// Objects and events of the namespace (for failure messages).
    pub fn describe(&self) -> String {
        let show = |args: &[&str]| self.kubectl(args).unwrap_or_else(|e| format!("{e:#}\n"));
        format!(
            "--- kubectl get all -n {0} ---\n{1}--- events in {0} ---\n{2}",
            self.name,
            show(&["get", "all", "-o", "wide"]),
            show(&["get", "events", "--sort-by=.lastTimestamp"]),
        )
    }

    /// Deletes the namespace and waits until it is gone.
    pub fn delete_and_wait(mut self) -> Result<()> {
        self.keep = true;
        kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "namespace",
                &self.name,
                "--ignore-not-found",
                "--timeout=120s",
            ],
        )
        .map(drop)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Err(e) = kubectl(
            &self.kubeconfig,
            &["delete", "namespace", &self.name, "--wait=false"],
        ) {
            eprintln!("warning: could not delete namespace {}: {e:#}", self.name);
        }
    }
}

/// `kubectl apply -f -` of `manifest`, in `namespace` if given.
pub fn apply(kubeconfig: &Path, namespace: Option<&str>, manifest: &str) -> Result<String> {
    let mut cmd = std::process::Command::new(kubernetes_bin("kubectl"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()));
    if let Some(ns) = namespace {
        cmd.arg(format!("--namespace={ns}"));
    }
    cmd.args(["apply", "-f", "-"]);
    output_with_input(&mut cmd, manifest.as_bytes()).context("kubectl apply")
}

/// A Deployment of the test image: one replica labelled `app: <name>` with ServiceAccount `account`,
/// running `script` (`sh -c`) and declaring `ports` (`(port, protocol)`).
pub fn deployment(name: &str, account: &str, script: &str, ports: &[(u16, &str)]) -> String {
    let ports: Vec<_> = ports
        .iter()
        .map(|(port, protocol)| json!({"containerPort": port, "protocol": protocol}))
        .collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "serviceAccountName": account,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                        "ports": ports,
                    }],
                },
            },
        },
    })
    .to_string()
}

/// A Deployment manifest of [`deployment`] with its pods on Node `node`: a node selector on the
/// hostname label and a toleration of the local cluster's extra-node taint.
pub fn on_node(manifest: &str, node: &str) -> Result<String> {
    let mut d: serde_json::Value =
        serde_json::from_str(manifest).context("a Deployment manifest")?;
    let spec = &mut d["spec"]["template"]["spec"];
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = json!([{
        "key": crate::cluster::node::EXTRA_NODE_TAINT_KEY,
        "operator": "Exists",
        "effect": "NoSchedule",
    }]);
    Ok(d.to_string())
}

/// A shell script that echoes back every TCP connection on `tcp` ports and every UDP datagram on `udp`
/// ports: our echo server (`tests/src/bin/echo-server.rs`), one process for all ports. Not socat: its
/// forking servers stalled under parallel load (see the echo server's docs).
pub fn echo_server_script(tcp: &[u16], udp: &[u16]) -> String {
    let ports = tcp
        .iter()
        .map(|p| format!(" tcp:{p}"))
        .chain(udp.iter().map(|p| format!(" udp:{p}")));
    format!("exec {}{}", ECHO_SERVER, ports.collect::<String>())
}

/// The protocol of a payload sent with [`send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// One TCP connection: send, half-close, read the reply.
    Tcp,
    /// One UDP datagram, then wait for a reply datagram.
    Udp,
}

/// Sends `payload` from pod `pod` to `host:port` with socat and returns whether it came back
/// (`false`: connection refused/reset/timed out, or no reply datagram within 3 s).
pub fn send(
    ns: &Namespace,
    pod: &str,
    protocol: Protocol,
    host: &str,
    port: u16,
    payload: &str,
) -> Result<bool> {
    let address = match protocol {
        Protocol::Tcp => format!("TCP:{host}:{port},connect-timeout=3"),
        Protocol::Udp => format!("UDP:{host}:{port}"),
    };
    // socat exits non-zero when the connection fails; that is an answer here, not an error.
    let script = format!("echo {payload} | socat -t 3 - {address} 2>/dev/null; true");
    let reply = ns.exec(pod, &script)?;
    Ok(reply.trim() == payload)
}

/// The script of a pod that, as soon as its container starts, opens one TCP connection to
/// `ip:port` and writes socat's exit code to /tmp/first.rc and its namespace's TCP counters to
/// /tmp/first.netstat (so the first connection's SYN retransmissions can be read back), and its
/// kernel's `tcp_syn_linear_timeouts` (0 where there is none) to /tmp/first.linear, then sleeps.
pub fn first_connection_script(ip: &str, port: u16) -> String {
    format!(
        "socat -T3 /dev/null TCP:{ip}:{port},connect-timeout=4; echo $? > /tmp/first.rc; \
         cat /proc/sys/net/ipv4/tcp_syn_linear_timeouts > /tmp/first.linear 2>/dev/null \
         || echo 0 > /tmp/first.linear; \
         grep TcpExt: /proc/net/netstat > /tmp/first.netstat; exec sleep 100000"
    )
}

/// A pod's first connection ([`first_connection_script`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstConnection {
    /// socat's exit code.
    pub rc: i32,
    /// SYNs the pod's namespace sent again by then.
    pub syn_resends: u64,
    /// The kernel's `tcp_syn_linear_timeouts` (see [`syn_resends_within`]).
    pub linear_timeouts: u64,
}

/// How many SYNs a connection has sent again by `seconds` after its first, when the peer drops them:
/// Linux resends after 1 s, then at 1 s intervals for its first `linear_timeouts` resends (6.5 and
/// later: 4 by default), and doubling the wait after that (before 6.5: 1, 3, 7 s).
pub fn syn_resends_within(seconds: u64, linear_timeouts: u64) -> u64 {
    let (mut at, mut wait, mut resends) = (0u64, 1u64, 0u64);
    loop {
        at += wait;
        if at > seconds {
            return resends;
        }
        resends += 1;
        if resends >= linear_timeouts {
            wait *= 2;
        }
    }
}

/// The first connection of a pod running [`first_connection_script`], once it has written it.
pub fn first_connection(ns: &Namespace, pod: &str) -> Result<FirstConnection> {
    poll(
        &format!("pod {pod} to report its first connection"),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let out = ns
                .exec(
                    pod,
                    // The counters last: their file has more lines (MPTcpExt: too).
                    "cat /tmp/first.rc /tmp/first.linear /tmp/first.netstat 2>/dev/null",
                )
                .unwrap_or_default();
            let mut lines = out.lines();
            let (Some(rc), Some(linear), Some(names), Some(values)) =
                (lines.next(), lines.next(), lines.next(), lines.next())
            else {
                return Ok(None);
            };
            let linear_timeouts = linear
                .trim()
                .parse()
                .with_context(|| format!("tcp_syn_linear_timeouts {linear:?}"))?;
            let rc: i32 = rc.trim().parse().with_context(|| format!("rc {rc:?}"))?;
            let retransmits = names
                .split_whitespace()
                .zip(values.split_whitespace())
                .find(|(name, _)| *name == "TCPSynRetrans")
                .and_then(|(_, v)| v.parse().ok())
                .with_context(|| format!("no TCPSynRetrans in {out:?}"))?;
            Ok(Some(FirstConnection {
                rc,
                syn_resends: retransmits,
                linear_timeouts,
            }))
        },
        || ns.describe(),
    )
}

/// The pods of `app` that did not exist in `seen`, once `count` are running; adds them to `seen`.
pub fn new_pods(ns: &Namespace, app: &str, seen: &mut Vec<String>) -> Result<Vec<String>> {
    let running = ns.wait_for_deployment(app)?;
    let fresh: Vec<String> = running
        .into_iter()
        .map(|(pod, _)| pod)
        .filter(|pod| !seen.contains(pod))
        .collect();
    seen.extend(fresh.iter().cloned());
    Ok(fresh)
}

/// A NetworkPolicy `name` isolating the pods `app: <to>` for ingress and allowing TCP `port` from the
/// pods `app: <from>` of the same namespace.
pub fn allow_ingress(name: &str, to: &str, from: &str, port: u16) -> String {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {
            "podSelector": {"matchLabels": {"app": to}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": from}}}],
                         "ports": [{"protocol": "TCP", "port": port}]}]
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::syn_resends_within;

    #[test]
    fn syn_resends_follow_the_kernels_schedule() {
        // (seconds, tcp_syn_linear_timeouts, resends by then)
        let cases = [
            (0, 4, 0),
            (1, 4, 1),
            (2, 4, 2),
            (3, 4, 3),
            (4, 4, 4),
            (5, 4, 4),
            (6, 4, 5),
            (2, 0, 1),
            (3, 0, 2),
            (6, 0, 2),
            (7, 0, 3),
        ];
        for (seconds, linear, resends) in cases {
            assert_eq!(
                syn_resends_within(seconds, linear),
                resends,
                "{seconds} s, linear {linear}"
            );
        }
    }
}
