//! Cluster DNS. Bookworm has no CoreDNS: dnsmasq runs as a real pod (`kube-system`, label
//! `k8s-app: kube-dns`, behind Service `kube-dns` at the ClusterIP kubelet hands to pods) and serves a
//! hosts directory from the node. A small feeder on the node keeps that directory equal to the
//! Services in the API: one `<clusterIP> <name>.<namespace>.svc.cluster.local` line each. dnsmasq
//! reloads when the file is replaced. It has no upstream servers: nothing leaves the machine.

use anyhow::Result;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use super::components::kubectl;
use super::layout::{DNS_SERVICE_IP, State, kubernetes_bin};
use super::process::{output_with_input, spawn, wait_for};

/// The DNS server image (dnsmasq and the libraries it needs).
pub const DNS_IMAGE: &str = "network-enforcer.local/dns:dev";

/// Starts the feeder, then creates the DNS Service and Deployment and waits until the Service has a
/// ready endpoint.
pub fn start(state: &State) -> Result<()> {
    let dir = state.dns();
    let hosts = dir.join("hosts");
    fs::create_dir_all(&hosts)?;
    let script = dir.join("feed.sh");
    fs::write(&script, feeder_script(state))?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    spawn(state, "dns-feeder", Command::new("/bin/sh").arg(&script))?;

    let manifest = manifest(&hosts.to_string_lossy());
    output_with_input(
        Command::new(kubernetes_bin("kubectl"))
            .arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .args(["apply", "-f", "-"]),
        manifest.as_bytes(),
    )?;
    wait_for(
        state,
        "kubelet",
        "the DNS pod to be ready",
        Duration::from_secs(90),
        || Ok(ready(state)),
    )
}

/// True when the `kube-dns` Service has a ready endpoint.
pub fn ready(state: &State) -> bool {
    kubectl(
        &state.kubeconfig(),
        &[
            "-n",
            "kube-system",
            "get",
            "endpoints",
            "kube-dns",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ],
    )
    .is_ok_and(|ips| !ips.trim().is_empty())
}

/// A shell loop (kubectl from setup): render once, then re-render on every Service watch event;
/// restart the watch when it ends (API server restarts, timeouts).
fn feeder_script(state: &State) -> String {
    let kubectl = kubernetes_bin("kubectl");
    let kubeconfig = state.kubeconfig();
    let dir = state.dns();
    format!(
        r#"#!/bin/sh
# Keeps {dir}/hosts/services equal to the Services in the API (network-enforcer local cluster DNS).
K="{kubectl} --kubeconfig={kubeconfig}"
T='{{{{range .items}}}}{{{{if and .spec.clusterIP (ne .spec.clusterIP "None")}}}}{{{{.spec.clusterIP}}}} {{{{.metadata.name}}}}.{{{{.metadata.namespace}}}}.svc.cluster.local{{{{"\n"}}}}{{{{end}}}}{{{{end}}}}'
render() {{
  $K get services --all-namespaces -o go-template="$T" > {dir}/services.tmp && mv {dir}/services.tmp {dir}/hosts/services
}}
while true; do
  render
  $K get services --all-namespaces --watch-only -o name --request-timeout=0 | while read -r _; do render; done
  sleep 1
done
"#,
        kubectl = kubectl.display(),
        kubeconfig = kubeconfig.display(),
        dir = dir.display(),
    )
}

/// The DNS Service and Deployment.
fn manifest(hosts_dir: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  clusterIP: {DNS_SERVICE_IP}
  selector: {{k8s-app: kube-dns}}
  ports:
  - {{name: dns, port: 53, protocol: UDP}}
  - {{name: dns-tcp, port: 53, protocol: TCP}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 1
  selector:
    matchLabels: {{k8s-app: kube-dns}}
  template:
    metadata:
      labels: {{k8s-app: kube-dns}}
    spec:
      dnsPolicy: Default
      terminationGracePeriodSeconds: 1
      containers:
      - name: dnsmasq
        image: {DNS_IMAGE}
        imagePullPolicy: Never
        args: ["--keep-in-foreground", "--log-facility=-", "--user=root", "--group=root",
               "--no-resolv", "--no-hosts", "--hostsdir=/hosts", "--local=/cluster.local/"]
        ports:
        - {{containerPort: 53, protocol: UDP}}
        - {{containerPort: 53, protocol: TCP}}
        volumeMounts:
        - {{name: hosts, mountPath: /hosts, readOnly: true}}
      volumes:
      - name: hosts
        hostPath: {{path: "{hosts_dir}", type: Directory}}
"#
    )
}
