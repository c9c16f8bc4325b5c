//! The command lines and configuration files of each cluster component, in start order. The flags are
//! the ones found necessary on this machine (docs/local-cluster.md); each non-obvious one says why.

use anyhow::{Context, Result};
use std::fs;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::layout::{
    API_PORT, BRIDGE, CNI_NETWORK, DNS_SERVICE_IP, ETCD_CLIENT_PORT, ETCD_PEER_PORT, NODE_IP,
    NODE_NAME, POD_CIDR, SERVICE_CIDR, State, kubernetes_bin,
};
use super::process::{output, spawn, wait_for};

/// etcd (Debian `etcd-server`), on non-default loopback ports.
pub fn start_etcd(state: &State) -> Result<()> {
    let client = format!("http://127.0.0.1:{ETCD_CLIENT_PORT}");
    let peer = format!("http://127.0.0.1:{ETCD_PEER_PORT}");
    spawn(
        state,
        "etcd",
        Command::new("etcd")
            .arg("--name=network-enforcer")
            .arg(format!("--data-dir={}", state.etcd().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=network-enforcer={peer}"))
            // Tests create and delete a lot; an unsynced etcd keeps the disk out of the way.
            .arg("--unsafe-no-fsync"),
    )?;
    wait_for(
        state,
        "etcd",
        "etcd to accept connections",
        Duration::from_secs(30),
        || Ok(TcpStream::connect(("127.0.0.1", ETCD_CLIENT_PORT)).is_ok()),
    )
}

/// kube-apiserver, listening on the node (bridge) address so that pods reach it through the
/// `kubernetes` Service, with token authentication and RBAC (the chart's RBAC must be real).
pub fn start_apiserver(state: &State) -> Result<()> {
    let pki = state.pki();
    spawn(
        state,
        "kube-apiserver",
        Command::new(kubernetes_bin("kube-apiserver"))
            .arg(format!(
                "--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}"
            ))
            .arg(format!("--bind-address={NODE_IP}"))
            .arg(format!("--advertise-address={NODE_IP}"))
            .arg(format!("--secure-port={API_PORT}"))
            .arg("--insecure-port=0")
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg(format!(
                "--tls-cert-file={}",
                pki.join("apiserver.crt").display()
            ))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.join("apiserver.key").display()
            ))
            .arg(format!("--client-ca-file={}", pki.join("ca.crt").display()))
            .arg(format!(
                "--token-auth-file={}",
                pki.join("tokens.csv").display()
            ))
            .arg(format!(
                "--service-account-key-file={}",
                pki.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.join("sa.key").display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg("--authorization-mode=Node,RBAC")
            .arg("--allow-privileged=true")
            // `kubectl exec`/`logs` go to the node's InternalIP (the bridge address), not its hostname.
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg("--profiling=false")
            .arg("--v=1"),
    )?;
    let kubeconfig = state.kubeconfig();
    wait_for(
        state,
        "kube-apiserver",
        "the API server to be ready",
        Duration::from_secs(90),
        || Ok(kubectl(&kubeconfig, &["get", "--raw", "/readyz"]).is_ok_and(|o| o.trim() == "ok")),
    )
}

/// kube-controller-manager with the controllers the tests and the product need. `nodelifecycle` is
/// needed even on one node: it removes the `not-ready` taint kubelet registers the Node with.
pub fn start_controller_manager(state: &State) -> Result<()> {
    const CONTROLLERS: &str = "deployment,replicaset,statefulset,daemonset,job,cronjob,\
        endpoint,endpointslice,endpointslicemirroring,garbagecollector,namespace,serviceaccount,\
        serviceaccount-token,clusterrole-aggregation,root-ca-cert-publisher,podgc,ttl-after-finished,\
        disruption,resourcequota,nodelifecycle";
    let pki = state.pki();
    spawn(
        state,
        "kube-controller-manager",
        Command::new(kubernetes_bin("kube-controller-manager"))
            .arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .arg(format!("--controllers={CONTROLLERS}"))
            .arg(format!(
                "--service-account-private-key-file={}",
                pki.join("sa.key").display()
            ))
            .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()))
            .arg("--use-service-account-credentials=false")
            .arg("--leader-elect=false")
            // No serving ports: nothing scrapes them, and fixed ports could collide with other tests.
            .arg("--port=0")
            .arg("--secure-port=0")
            .arg("--v=1"),
    )?;
    Ok(())
}

/// kube-scheduler.
pub fn start_scheduler(state: &State) -> Result<()> {
    spawn(
        state,
        "kube-scheduler",
        Command::new(kubernetes_bin("kube-scheduler"))
            .arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .arg("--leader-elect=false")
            .arg("--port=0")
            .arg("--secure-port=0")
            .arg("--v=1"),
    )?;
    Ok(())
}

/// The pause image containerd uses for every pod sandbox.
pub const PAUSE_IMAGE: &str = "network-enforcer.local/pause:dev";

/// containerd (Debian 1.6) with everything — root, state, runc state, network namespaces, CNI
/// configuration — under the state directory.
pub fn start_containerd(state: &State) -> Result<()> {
    let dir = state.containerd();
    let cni = state.cni();
    fs::create_dir_all(cni.join("net.d"))?;
    fs::write(
        cni.join("net.d/10-network-enforcer.conflist"),
        cni_config(state),
    )?;
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{run}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  # kubelet's --pod-infra-container-image does not choose the sandbox image with a remote runtime.
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: runc must not try to lower oom_score_adj, or every sandbox fails
  # with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  # Keep network namespaces under our state directory (down unmounts them from there).
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{dir}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}/net.d"
"#,
        root = dir.join("root").display(),
        run = dir.join("state").display(),
        socket = state.containerd_socket().display(),
        dir = dir.display(),
        cni = cni.display(),
    );
    let config_path = dir.join("config.toml");
    fs::create_dir_all(&dir)?;
    fs::write(&config_path, config)?;
    spawn(
        state,
        "containerd",
        Command::new("containerd").arg("--config").arg(&config_path),
    )?;
    let socket = state.containerd_socket();
    wait_for(
        state,
        "containerd",
        "containerd's socket",
        Duration::from_secs(30),
        || Ok(ctr(state, &["version"]).is_ok()),
    )
    .with_context(|| format!("containerd did not come up on {}", socket.display()))
}

/// Bridge CNI on our bridge: pods get addresses from host-local IPAM (leases in the state directory),
/// the bridge is their gateway, traffic to the outside is masqueraded (and then dropped by our guard),
/// hairpin mode lets a pod reach itself through a Service.
fn cni_config(state: &State) -> String {
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "{CNI_NETWORK}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{ipam}",
        "ranges": [[{{ "subnet": "{POD_CIDR}", "rangeStart": "10.244.0.10", "rangeEnd": "10.244.0.250", "gateway": "{NODE_IP}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}]
      }}
    }},
    {{ "type": "portmap", "capabilities": {{ "portMappings": true }} }}
  ]
}}
"#,
        ipam = state.cni().join("ipam").display()
    )
}

/// `ctr` against our containerd, in the `k8s.io` namespace the CRI plugin uses.
pub fn ctr(state: &State, args: &[&str]) -> Result<String> {
    output(
        Command::new("ctr")
            .arg("--address")
            .arg(state.containerd_socket())
            .args(["--namespace", "k8s.io"])
            .args(args),
    )
}

/// Imports a docker-archive tar into the cluster's containerd.
pub fn import_image(state: &State, tar: &Path) -> Result<()> {
    ctr(state, &["images", "import", &tar.to_string_lossy()])
        .with_context(|| format!("importing {}", tar.display()))?;
    Ok(())
}

/// kubelet, registering its own Node (a hand-made Node without capacity makes kubelet 1.20 panic).
pub fn start_kubelet(state: &State) -> Result<()> {
    let dir = state.kubelet();
    fs::create_dir_all(&dir)?;
    // Pods with `dnsPolicy: Default` would inherit the host's resolvers; give them none (no traffic
    // may leave the machine). Cluster-first pods get the cluster DNS from --cluster-dns.
    let resolv = dir.join("resolv.conf");
    fs::write(
        &resolv,
        "# network-enforcer local cluster: no upstream resolvers\n",
    )?;
    spawn(
        state,
        "kubelet",
        Command::new(kubernetes_bin("kubelet"))
            .arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .arg(format!("--root-dir={}", dir.display()))
            .arg(format!("--cert-dir={}", dir.join("pki").display()))
            .arg(format!(
                "--volume-plugin-dir={}",
                dir.join("volume-plugins").display()
            ))
            .arg("--container-runtime=remote")
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                state.containerd_socket().display()
            ))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg(format!("--address={NODE_IP}"))
            .arg("--healthz-bind-address=127.0.0.1")
            .arg("--read-only-port=0")
            .arg("--cgroup-driver=cgroupfs")
            .arg(format!("--cluster-dns={DNS_SERVICE_IP}"))
            .arg("--cluster-domain=cluster.local")
            .arg(format!("--resolv-conf={}", resolv.display()))
            .arg(format!("--pod-infra-container-image={PAUSE_IMAGE}"))
            .arg("--fail-swap-on=false")
            // Root here cannot lower oom_score_adj (no CAP_SYS_RESOURCE).
            .arg("--oom-score-adj=0")
            // Images are imported locally and cannot be pulled again: never garbage-collect them,
            // never evict pods for disk pressure on a developer machine.
            .arg("--image-gc-high-threshold=100")
            .arg("--image-gc-low-threshold=99")
            .arg("--eviction-hard=memory.available<1Mi,nodefs.available<1%,imagefs.available<1%")
            .arg("--runtime-request-timeout=2m")
            // The node turns Ready at the first status update after start-up: every 2 s instead of
            // 10 s saves most of `up`'s wait (one node, so the extra API writes do not matter).
            .arg("--node-status-update-frequency=2s")
            .arg("--v=1"),
    )?;
    let kubeconfig = state.kubeconfig();
    wait_for(
        state,
        "kubelet",
        "the node to be Ready",
        Duration::from_secs(120),
        || {
            let ready = kubectl(
                &kubeconfig,
                &[
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
            );
            Ok(ready.is_ok_and(|s| s.trim() == "True"))
        },
    )
}

/// kube-proxy in iptables mode (IPVS is not in this kernel).
pub fn start_kube_proxy(state: &State) -> Result<()> {
    spawn(
        state,
        "kube-proxy",
        Command::new(kubernetes_bin("kube-proxy"))
            .arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg("--proxy-mode=iptables")
            .arg(format!("--cluster-cidr={POD_CIDR}"))
            .arg(format!("--bind-address={NODE_IP}"))
            .arg("--healthz-bind-address=127.0.0.1:10256")
            .arg("--metrics-bind-address=127.0.0.1:10249")
            // Leave the host's conntrack sysctls alone.
            .arg("--conntrack-max-per-core=0")
            .arg("--conntrack-tcp-timeout-established=0")
            .arg("--conntrack-tcp-timeout-close-wait=0")
            .arg("--oom-score-adj=0")
            .arg("--v=1"),
    )?;
    wait_for(
        state,
        "kube-proxy",
        "kube-proxy's first sync",
        Duration::from_secs(60),
        || {
            Ok(Command::new("iptables")
                .args(["-w", "-t", "nat", "-n", "-L", "KUBE-SERVICES"])
                .output()
                .is_ok_and(|o| {
                    o.status.success() && String::from_utf8_lossy(&o.stdout).contains("10.96.0.1")
                }))
        },
    )
}

/// Runs our kubectl (v1.20, from setup) with `kubeconfig`.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    output(
        Command::new(kubernetes_bin("kubectl"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=10s")
            .args(args),
    )
}
