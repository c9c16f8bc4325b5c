//! Cluster DNS. Bookworm has no CoreDNS: dnsmasq runs as a real pod (`kube-system`, label
//! `k8s-app: kube-dns`, behind Service `kube-dns` at the ClusterIP kubelet hands to pods) and serves a
//! hosts directory from the node. A small feeder on the node keeps that directory equal to the
//! Services in the API: `<clusterIP> <name>.<namespace>.svc.cluster.local` for a Service with a
//! ClusterIP; for a headless one, that name for each ready endpoint address and
//! `<hostname>.<name>.<namespace>.svc.cluster.local` for pods with a hostname and subdomain (StatefulSet
//! pods). dnsmasq reloads when the file is replaced. It has no upstream servers: nothing leaves the
//! machine.

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
    let script = feeder_path(state);
    fs::write(&script, feeder_script(state))?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    spawn(state, "dns-feeder", Command::new("/bin/bash").arg(&script))?;

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

/// True when the `kube-dns` Service has a ready endpoint and the feeder is today's. A cluster started
/// with an older feeder (one that, say, served no headless Services) is not a healthy cluster for
/// today's tests: `up` replaces it.
pub fn ready(state: &State) -> bool {
    let current_feeder =
        fs::read_to_string(feeder_path(state)).is_ok_and(|s| s == feeder_script(state));
    current_feeder
        && kubectl(
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

fn feeder_path(state: &State) -> std::path::PathBuf {
    state.dns().join("feed.sh")
}

/// The feeder: a bash loop around kubectl (from setup) that renders the hosts file from the Services and
/// Endpoints in the API, once per burst of changes to either.
///
/// Names, as cluster DNS serves them:
/// - `<svc>.<ns>.svc.cluster.local` → the ClusterIP of a Service that has one;
/// - for a headless Service (`clusterIP: None`), the same name → every ready address of its Endpoints
///   (`subsets[].addresses`, which hold ready pods only; `notReadyAddresses` are left out), and
///   `<hostname>.<svc>.<ns>.svc.cluster.local` → the address of a pod with `spec.hostname` and
///   `spec.subdomain: <svc>` (the endpoints controller copies that hostname into the address; a
///   StatefulSet's pods get `hostname: <pod>`, `subdomain: <serviceName>`).
///
/// kubectl watches one resource type at a time, so each type has its own watch loop and both feed one
/// reader. `--watch` lists before it watches (no change falls between what was listed and what is
/// watched); the loop restarts a watch the API server ended. The reader coalesces a burst of lines (a
/// listing, a rollout) into one render, and the file is replaced only when it changes: dnsmasq re-reads
/// the directory on every replacement.
fn feeder_script(state: &State) -> String {
    let kubectl = kubernetes_bin("kubectl");
    let kubeconfig = state.kubeconfig();
    let dir = state.dns();
    format!(
        r#"#!/bin/bash
# Keeps {dir}/hosts/services equal to the Service names in the API (network-enforcer local cluster DNS).
K=("{kubectl}" "--kubeconfig={kubeconfig}")
D="{dir}"
T='
{{{{- range $svc := .items}}}}
  {{{{- if and (eq $svc.kind "Service") $svc.spec.clusterIP}}}}
    {{{{- $name := printf "%s.%s.svc.cluster.local" $svc.metadata.name $svc.metadata.namespace}}}}
    {{{{- if eq $svc.spec.clusterIP "None"}}}}
      {{{{- range $.items}}}}
        {{{{- if and (eq .kind "Endpoints") (eq .metadata.namespace $svc.metadata.namespace) (eq .metadata.name $svc.metadata.name)}}}}
          {{{{- range .subsets}}}}
            {{{{- range .addresses}}}}
              {{{{- .ip}}}} {{{{$name}}}}{{{{"\n"}}}}
              {{{{- if .hostname}}}}{{{{.ip}}}} {{{{.hostname}}}}.{{{{$name}}}}{{{{"\n"}}}}{{{{end}}}}
            {{{{- end}}}}
          {{{{- end}}}}
        {{{{- end}}}}
      {{{{- end}}}}
    {{{{- else}}}}
      {{{{- $svc.spec.clusterIP}}}} {{{{$name}}}}{{{{"\n"}}}}
    {{{{- end}}}}
  {{{{- end}}}}
{{{{- end}}}}'
render() {{
  if "${{K[@]}}" get services,endpoints --all-namespaces -o go-template="$T" > "$D/services.tmp"; then
    cmp -s "$D/services.tmp" "$D/hosts/services" || mv "$D/services.tmp" "$D/hosts/services"
  fi
}}
# One line per change of resource type $1, forever.
follow() {{
  while true; do
    "${{K[@]}}" get "$1" --all-namespaces --watch -o name --request-timeout=0
    sleep 1
  done
}}
{{ follow services & follow endpoints & wait; }} | while read -r _; do
  # Coalesce the burst this line starts (at most 50 lines, so that a steady trickle still renders).
  for ((i = 0; i < 50; i++)); do read -r -t 0.2 _ || break; done
  render
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
