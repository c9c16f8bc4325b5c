//! The command lines and configuration files of each cluster component, in start order. The flags are
//! the ones found necessary on this machine (docs/local-cluster.md); each non-obvious one says why.

use anyhow::{Context, Result};
use std::fs;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::layout::{
    API_PORT, CLUSTER_CIDR, CNI_NETWORK, DNS_SERVICE_IP, ETCD_CLIENT_PORT, ETCD_PEER_PORT, NODE_IP,
    SERVICE_CIDR, State, kubernetes_bin,
};
use super::node::{EXTRA_NODE_TAINT, Node};
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

/// containerd (Debian 1.6) of `node` with everything — root, state, runc state, network namespaces,
/// CNI configuration — under the node's directory.
pub fn start_containerd(state: &State, node: &Node) -> Result<()> {
    let dir = node.containerd_dir(state);
    let cni = node.cni_dir(state);
    fs::create_dir_all(cni.join("net.d"))?;
    fs::write(
        cni.join("net.d/10-network-enforcer.conflist"),
        cni_config(state, node),
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
        socket = node.containerd_socket(state).display(),
        dir = dir.display(),
        cni = cni.display(),
    );
    let config_path = dir.join("config.toml");
    fs::create_dir_all(&dir)?;
    fs::write(&config_path, config)?;
    let component = node.component("containerd");
    spawn(
        state,
        &component,
        node.command(state, "containerd")
            .arg("--config")
            .arg(&config_path),
    )?;
    let socket = node.containerd_socket(state);
    wait_for(
        state,
        &component,
        "containerd's socket",
        Duration::from_secs(30),
        || Ok(ctr(state, node, &["version"]).is_ok()),
    )
    .with_context(|| format!("containerd did not come up on {}", socket.display()))
}

/// Bridge CNI on the node's bridge: pods get addresses from host-local IPAM (leases in the node's
/// directory), the bridge is their gateway, hairpin mode lets a pod reach itself through a Service.
/// Nothing is masqueraded: pods reach pods on other nodes with their own addresses, as on a cluster
/// network without SNAT, and traffic to the outside is dropped by our guard anyway.
fn cni_config(state: &State, node: &Node) -> String {
    let (range_start, range_end) = node.pod_range();
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "{CNI_NETWORK}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{bridge}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{ipam}",
        "ranges": [[{{ "subnet": "{subnet}", "rangeStart": "{range_start}", "rangeEnd": "{range_end}", "gateway": "{gateway}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}]
      }}
    }},
    {{ "type": "portmap", "capabilities": {{ "portMappings": true }} }}
  ]
}}
"#,
        bridge = node.bridge(),
        subnet = node.pod_cidr(),
        gateway = node.gateway(),
        ipam = node.cni_dir(state).join("ipam").display()
    )
}

/// `ctr` against `node`'s containerd, in the `k8s.io` namespace the CRI plugin uses.
pub fn ctr(state: &State, node: &Node, args: &[&str]) -> Result<String> {
    output(
        Command::new("ctr")
            .arg("--address")
            .arg(node.containerd_socket(state))
            .args(["--namespace", "k8s.io"])
            .args(args),
    )
}

/// Imports a docker-archive tar into the containerd of every node that runs one.
pub fn import_image(state: &State, tar: &Path) -> Result<()> {
    for node in super::running_nodes(state) {
        import_image_into(state, &node, tar)?;
    }
    Ok(())
}

/// Imports a docker-archive tar into `node`'s containerd.
pub fn import_image_into(state: &State, node: &Node, tar: &Path) -> Result<()> {
    ctr(state, node, &["images", "import", &tar.to_string_lossy()])
        .with_context(|| format!("importing {} into {}", tar.display(), node.name()))?;
    Ok(())
}

/// `node`'s kubelet, registering its own Node (a hand-made Node without capacity makes kubelet 1.20
/// panic). Extra nodes register with [`EXTRA_NODE_TAINT`] and keep their pods under their cgroup root.
pub fn start_kubelet(state: &State, node: &Node) -> Result<()> {
    let dir = node.kubelet_dir(state);
    fs::create_dir_all(&dir)?;
    // Pods with `dnsPolicy: Default` would inherit the host's resolvers; give them none (no traffic
    // may leave the machine). Cluster-first pods get the cluster DNS from --cluster-dns.
    let resolv = dir.join("resolv.conf");
    fs::write(
        &resolv,
        "# network-enforcer local cluster: no upstream resolvers\n",
    )?;
    let component = node.component("kubelet");
    let mut cmd = node.command(state, kubernetes_bin("kubelet"));
    if let Some(root) = node.cgroup_root() {
        cmd.arg(format!("--cgroup-root={root}"))
            .arg(format!("--register-with-taints={EXTRA_NODE_TAINT}"));
    }
    spawn(
        state,
        &component,
        cmd.arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .arg(format!("--root-dir={}", dir.display()))
            .arg(format!("--cert-dir={}", dir.join("pki").display()))
            .arg(format!(
                "--volume-plugin-dir={}",
                dir.join("volume-plugins").display()
            ))
            .arg("--container-runtime=remote")
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                node.containerd_socket(state).display()
            ))
            .arg(format!("--hostname-override={}", node.name()))
            .arg(format!("--node-ip={}", node.ip()))
            .arg(format!("--address={}", node.ip()))
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
    wait_for(
        state,
        &component,
        "the node to be Ready",
        Duration::from_secs(120),
        || Ok(node_ready(state, node)),
    )
}

/// True when `node`'s Node object reports Ready.
pub fn node_ready(state: &State, node: &Node) -> bool {
    kubectl(
        &state.kubeconfig(),
        &[
            "get",
            "node",
            &node.name(),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
    )
    .is_ok_and(|s| s.trim() == "True")
}

/// `node`'s kube-proxy in iptables mode (IPVS is not in this kernel), its rules in the node's network
/// namespace.
pub fn start_kube_proxy(state: &State, node: &Node) -> Result<()> {
    let component = node.component("kube-proxy");
    spawn(
        state,
        &component,
        node.command(state, kubernetes_bin("kube-proxy"))
            .arg(format!("--kubeconfig={}", state.kubeconfig().display()))
            .arg(format!("--hostname-override={}", node.name()))
            .arg("--proxy-mode=iptables")
            .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
            .arg(format!("--bind-address={}", node.ip()))
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
        &component,
        "kube-proxy's first sync",
        Duration::from_secs(60),
        || {
            Ok(node
                .command(state, "iptables")
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
