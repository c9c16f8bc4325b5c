//! Where everything lives: the Kubernetes binaries and images that `cargo xtask setup` builds into the
//! cache, and the cluster's state directory (one directory; `down` removes it).

use std::path::{Path, PathBuf};

/// The name of the single node (kubelet, kube-proxy and the scheduler agree on it).
pub const NODE_NAME: &str = "network-enforcer";
/// The bridge the pods hang off. It is also where the API server listens, so that pods reach it.
pub const BRIDGE: &str = "nek0";
/// The bridge's address: node IP, pod gateway and the address the API server advertises.
pub const NODE_IP: &str = "10.244.0.1";
/// Pod addresses (host-local IPAM on the bridge).
pub const POD_CIDR: &str = "10.244.0.0/24";
/// Every node's pod range (node i has 10.244.(i-1).0/24): the cluster network.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// ClusterIPs.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's ClusterIP (first address of the service range).
pub const API_SERVICE_IP: &str = "10.96.0.1";
/// The `kube-system/kube-dns` Service's ClusterIP, given to pods by kubelet.
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// API server port. Not 6443, so that a separate test API server can run beside the cluster.
pub const API_PORT: u16 = 16443;
/// etcd client and peer ports (not the defaults, for the same reason).
pub const ETCD_CLIENT_PORT: u16 = 23790;
pub const ETCD_PEER_PORT: u16 = 23800;
/// The CNI network name (also the prefix of the CNI result cache files in /var/lib/cni/results).
pub const CNI_NETWORK: &str = "network-enforcer";

/// The cache `cargo xtask setup` fills: `~/.cache/network-enforcer`.
pub fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/network-enforcer")
}

/// Kubernetes v1.20.2 built from Debian's source package: its source tree and binaries.
pub fn kubernetes_dir() -> PathBuf {
    cache_dir().join("kubernetes")
}

/// Where the built kube-apiserver, kubelet, kubectl, ... are.
pub fn kubernetes_bin_dir() -> PathBuf {
    kubernetes_dir().join("bin")
}

/// One built Kubernetes binary.
pub fn kubernetes_bin(name: &str) -> PathBuf {
    kubernetes_bin_dir().join(name)
}

/// The unpacked Kubernetes source tree (pause.c lives there).
pub fn kubernetes_src_dir() -> PathBuf {
    kubernetes_dir().join("src")
}

/// Local image tars (docker-archive), imported into the cluster's containerd by `up`.
pub fn images_dir() -> PathBuf {
    cache_dir().join("images")
}

/// The cluster's state: everything `up` creates on disk lives under here.
/// `NETWORK_ENFORCER_CLUSTER_DIR` overrides it.
pub fn state_dir() -> PathBuf {
    std::env::var_os("NETWORK_ENFORCER_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/network-enforcer/cluster"))
}

/// Paths inside the state directory.
#[derive(Clone, Debug)]
pub struct State {
    /// The state directory itself.
    pub root: PathBuf,
}

impl State {
    /// The layout under [`state_dir`].
    pub fn new() -> Self {
        Self { root: state_dir() }
    }

    fn join(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }

    /// The admin kubeconfig (bearer token + CA), for kubectl and tests.
    pub fn kubeconfig(&self) -> PathBuf {
        self.join("kubeconfig")
    }
    /// Certificates, keys and the static token file.
    pub fn pki(&self) -> PathBuf {
        self.join("pki")
    }
    /// One log file per component.
    pub fn log(&self, component: &str) -> PathBuf {
        self.join("logs").join(format!("{component}.log"))
    }
    /// One pid file per component.
    pub fn pid_file(&self, component: &str) -> PathBuf {
        self.join("pids").join(format!("{component}.pid"))
    }
    /// Cluster DNS: the hosts directory dnsmasq serves and the feeder script.
    pub fn dns(&self) -> PathBuf {
        self.join("dns")
    }
    /// etcd's data.
    pub fn etcd(&self) -> PathBuf {
        self.join("etcd")
    }
    /// Host sysctls as they were before `up` changed them (restored by `down`).
    pub fn saved_sysctls(&self) -> PathBuf {
        self.join("sysctls.json")
    }
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

/// True when `path` is `root` or below it.
pub fn is_under(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}
