//! The cluster's nodes. Node 1 is this machine as it is: its daemons run in the host's network and mount
//! namespaces. Extra nodes (`cargo xtask cluster up --nodes N`) are simulated on the same machine, each
//! with what a real node has of its own:
//!
//! - a network namespace `ne-node<i>` joined to the host by a veth (`nenode<i>` on the host side), with
//!   its own node address and pod range, routed from the host (the host is the "underlay" between nodes);
//! - a mount namespace in which `/var/log/pods` and `/var/log/containers` are the node's own directories
//!   (kubelet 1.20 always logs there and deletes the directories of pods it does not know, so two kubelets
//!   sharing them would delete each other's logs);
//! - its own containerd (root, state, socket), kubelet (root directory, `--cgroup-root /ne-node<i>`) and
//!   kube-proxy (iptables rules in the node's namespace);
//! - the taint [`EXTRA_NODE_TAINT`], so that only pods that ask for an extra node run there (DaemonSets
//!   tolerating every taint, like our agent's, run on every node).
//!
//! What the simulation cannot separate: the nodes share one kernel, so tracepoints and cgroup programs see
//! the sockets of every node, and `/proc` shows every node's processes. Each agent must keep to its own
//! node's pods (its pod watch is limited to its node), as it would have to with any tool that reads the
//! whole kernel.

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use super::layout::{BRIDGE, NODE_IP, NODE_NAME, POD_CIDR, State};
use super::process::output;

/// The taint every extra node registers with: `key=value:effect`.
pub const EXTRA_NODE_TAINT: &str = "network-enforcer.local/extra-node=true:NoSchedule";
/// The taint's key, for tolerations.
pub const EXTRA_NODE_TAINT_KEY: &str = "network-enforcer.local/extra-node";
/// The most nodes `up --nodes` starts (addresses and names are per index).
pub const MAX_NODES: u8 = 8;
/// Prefix of the extra nodes' network namespaces and cgroup roots.
const NETNS_PREFIX: &str = "ne-node";
/// Prefix of the host ends of the extra nodes' veths (the egress guard lets pod traffic out through them).
pub const HOST_VETH_PREFIX: &str = "nenode";

/// One node of the local cluster, by index (1 is the machine itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    index: u8,
}

impl Node {
    /// The machine itself.
    pub const FIRST: Node = Node { index: 1 };

    /// Node `index` (1-based); fails above [`MAX_NODES`].
    pub fn new(index: u8) -> Result<Self> {
        if index == 0 || index > MAX_NODES {
            bail!(
                "node index {index} is out of range: the local cluster has nodes 1 to {MAX_NODES}"
            );
        }
        Ok(Self { index })
    }

    /// Nodes 1..=n.
    pub fn first_n(n: u8) -> Result<Vec<Self>> {
        (1..=n).map(Self::new).collect()
    }

    /// 1-based.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// True for node 1, which runs in the host's namespaces.
    pub fn is_first(&self) -> bool {
        self.index == 1
    }

    /// The Node object's name (and kubelet's and kube-proxy's `--hostname-override`).
    pub fn name(&self) -> String {
        if self.is_first() {
            NODE_NAME.to_string()
        } else {
            format!("{NODE_NAME}-{}", self.index)
        }
    }

    /// The node's InternalIP. Node 1's is its bridge address; an extra node's is its veth address.
    pub fn ip(&self) -> String {
        if self.is_first() {
            NODE_IP.to_string()
        } else {
            format!("10.243.{}.2", self.index - 1)
        }
    }

    /// The host's end of the link to an extra node (the node's route to everything else).
    fn host_link_ip(&self) -> String {
        format!("10.243.{}.1", self.index - 1)
    }

    /// The node's pod range: 10.244.(i-1).0/24.
    pub fn pod_cidr(&self) -> String {
        if self.is_first() {
            POD_CIDR.to_string()
        } else {
            format!("10.244.{}.0/24", self.index - 1)
        }
    }

    /// The pods' gateway: the bridge's address.
    pub fn gateway(&self) -> String {
        format!("10.244.{}.1", self.index - 1)
    }

    /// The first and last address host-local IPAM hands out.
    pub fn pod_range(&self) -> (String, String) {
        let net = self.index - 1;
        (format!("10.244.{net}.10"), format!("10.244.{net}.250"))
    }

    /// The bridge the node's pods hang off.
    pub fn bridge(&self) -> String {
        if self.is_first() {
            BRIDGE.to_string()
        } else {
            format!("nek{}", self.index - 1)
        }
    }

    /// The node's network namespace (`ip netns` name); none for node 1.
    pub fn netns(&self) -> Option<String> {
        (!self.is_first()).then(|| format!("{NETNS_PREFIX}{}", self.index))
    }

    /// kubelet's `--cgroup-root` (none for node 1: the hierarchies' roots).
    pub fn cgroup_root(&self) -> Option<String> {
        (!self.is_first()).then(|| format!("/{NETNS_PREFIX}{}", self.index))
    }

    fn host_veth(&self) -> String {
        format!("{HOST_VETH_PREFIX}{}", self.index)
    }

    /// Where the node's files live: the state directory for node 1, `nodes/<i>` below it for others.
    pub fn dir(&self, state: &State) -> PathBuf {
        if self.is_first() {
            state.root.clone()
        } else {
            state.root.join("nodes").join(self.index.to_string())
        }
    }

    /// The name of one of the node's daemons, for its pid file and log: `kubelet`, `kubelet-2`, ...
    pub fn component(&self, daemon: &str) -> String {
        if self.is_first() {
            daemon.to_string()
        } else {
            format!("{daemon}-{}", self.index)
        }
    }

    /// containerd's configuration, root and state.
    pub fn containerd_dir(&self, state: &State) -> PathBuf {
        self.dir(state).join("containerd")
    }

    /// containerd's gRPC socket.
    pub fn containerd_socket(&self, state: &State) -> PathBuf {
        self.containerd_dir(state).join("containerd.sock")
    }

    /// kubelet's root directory.
    pub fn kubelet_dir(&self, state: &State) -> PathBuf {
        self.dir(state).join("kubelet")
    }

    /// CNI configuration and IPAM leases.
    pub fn cni_dir(&self, state: &State) -> PathBuf {
        self.dir(state).join("cni")
    }

    /// The file the node's mount namespace is bound to.
    fn mount_ns(&self, state: &State) -> PathBuf {
        self.dir(state).join("ns/mnt")
    }

    /// A command that runs `program` on this node: as is on node 1, in the node's network and mount
    /// namespaces on the others (`nsenter` execs, so the pid is the program's own).
    pub fn command(&self, state: &State, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match self.netns() {
            None => Command::new(program),
            Some(netns) => {
                let mut cmd = Command::new("nsenter");
                cmd.arg(format!("--mount={}", self.mount_ns(state).display()))
                    .arg(format!("--net=/run/netns/{netns}"))
                    .arg("--")
                    .arg(program);
                cmd
            }
        }
    }

    /// Creates what an extra node needs before its daemons start: the network namespace with its link,
    /// addresses and routes, the mount namespace with the node's own log directories, the cgroup root.
    pub fn create_namespaces(&self, state: &State) -> Result<()> {
        let Some(netns) = self.netns() else {
            return Ok(());
        };
        let dir = self.dir(state);
        fs::create_dir_all(&dir)?;
        if !std::path::Path::new("/run/netns").join(&netns).exists() {
            output(Command::new("ip").args(["netns", "add", &netns]))?;
        }
        let in_ns = |args: &[&str]| output(Command::new("ip").args(["-n", &netns]).args(args));
        let veth = self.host_veth();
        if !std::path::Path::new("/sys/class/net").join(&veth).exists() {
            output(Command::new("ip").args([
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ]))?;
        }
        output(Command::new("ip").args([
            "addr",
            "replace",
            &format!("{}/24", self.host_link_ip()),
            "dev",
            &veth,
        ]))?;
        output(Command::new("ip").args(["link", "set", &veth, "up"]))?;
        in_ns(&["link", "set", "lo", "up"])?;
        in_ns(&[
            "addr",
            "replace",
            &format!("{}/24", self.ip()),
            "dev",
            "eth0",
        ])?;
        in_ns(&["link", "set", "eth0", "up"])?;
        in_ns(&["route", "replace", "default", "via", &self.host_link_ip()])?;
        // The host routes the node's pods to it, as a cluster network routes pod ranges to nodes.
        output(Command::new("ip").args(["route", "replace", &self.pod_cidr(), "via", &self.ip()]))?;
        // A node forwards its pods' traffic; sysctls under /proc/sys/net are per network namespace.
        output(Command::new("ip").args([
            "netns",
            "exec",
            &netns,
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward",
        ]))?;

        // kubelet refuses a --cgroup-root that does not exist in every hierarchy.
        if let Some(root) = self.cgroup_root() {
            for hierarchy in super::host::cgroup_roots() {
                let path = hierarchy.join(root.trim_start_matches('/'));
                fs::create_dir_all(&path)
                    .with_context(|| format!("creating cgroup {}", path.display()))?;
            }
        }

        let mount_ns = self.mount_ns(state);
        if !mount_ns.exists() {
            let ns_dir = mount_ns.parent().expect("ns/mnt has a parent");
            fs::create_dir_all(ns_dir)?;
            // unshare(1) can bind a new mount namespace only onto a file on a private mount.
            output(Command::new("mount").arg("--bind").arg(ns_dir).arg(ns_dir))?;
            output(Command::new("mount").arg("--make-private").arg(ns_dir))?;
            fs::write(&mount_ns, "")?;
            let logs = dir.join("logs");
            let (pods, containers) = (logs.join("pods"), logs.join("containers"));
            for d in [&pods, &containers] {
                fs::create_dir_all(d)?;
            }
            for d in ["/var/log/pods", "/var/log/containers"] {
                fs::create_dir_all(d)?;
            }
            // Slave propagation: the host's mounts (bpffs, tracefs, kubelet 1's volumes) appear in the
            // node, the node's own (its containers' root file systems) stay in it.
            output(
                Command::new("unshare")
                    .arg(format!("--mount={}", mount_ns.display()))
                    .args(["--propagation", "slave", "sh", "-c"])
                    .arg(format!(
                        "mount --bind {} /var/log/pods && mount --bind {} /var/log/containers",
                        pods.display(),
                        containers.display()
                    )),
            )
            .context("creating the node's mount namespace")?;
        }
        Ok(())
    }

    /// Every process of this extra node: those naming its directory (containerd, kubelet, shims) and
    /// every process in its network namespace (kube-proxy names no file of the node; host-network pods).
    /// Its pods' own processes are in its cgroup root, which [`super::host::remove_cgroup_tree`] kills.
    pub fn processes(&self, state: &State) -> Vec<u32> {
        let mut pids = super::process::pids_mentioning(&self.dir(state).to_string_lossy());
        if let Some(netns) = self.netns() {
            pids.extend(super::process::pids_in_netns(
                &std::path::Path::new("/run/netns").join(netns),
            ));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Removes what [`Node::create_namespaces`] made (daemons and pods must be gone first).
    pub fn remove_namespaces(&self, state: &State) {
        let Some(netns) = self.netns() else {
            return;
        };
        remove_netns(&netns);
        let ns_dir = self.dir(state).join("ns");
        for p in [ns_dir.join("mnt"), ns_dir] {
            if let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) {
                // SAFETY: umount2 with a valid NUL-terminated path.
                unsafe {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
        if let Some(root) = self.cgroup_root() {
            super::host::remove_cgroup_tree(root.trim_start_matches('/'));
        }
    }
}

/// Deletes a network namespace; the veth into it goes with it, and the host route with the veth.
fn remove_netns(netns: &str) {
    let _ = Command::new("ip").args(["netns", "del", netns]).output();
}

/// The extra nodes' network namespaces that exist now (also those of a crashed cluster).
pub fn leftover_netns() -> Vec<String> {
    fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.strip_prefix(NETNS_PREFIX)
                        .is_some_and(|i| i.parse::<u8>().is_ok())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Removes every extra node's network namespace and cgroup root (for `down`).
pub fn remove_all_leftovers() {
    for netns in leftover_netns() {
        remove_netns(&netns);
    }
    for i in 2..=MAX_NODES {
        super::host::remove_cgroup_tree(&format!("{NETNS_PREFIX}{i}"));
    }
}

/// The cgroup directory names (below each hierarchy's root) under which nodes' kubelets put `kubepods`:
/// `""` for node 1, `ne-node<i>` for the others.
pub fn cgroup_parents() -> Vec<String> {
    std::iter::once(String::new())
        .chain((2..=MAX_NODES).map(|i| format!("{NETNS_PREFIX}{i}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_get_their_own_names_addresses_and_ranges() {
        let one = Node::FIRST;
        assert_eq!(one.name(), "network-enforcer");
        assert_eq!(one.ip(), NODE_IP);
        assert_eq!(one.pod_cidr(), POD_CIDR);
        assert_eq!(one.gateway(), NODE_IP);
        assert_eq!(one.bridge(), BRIDGE);
        assert_eq!(one.netns(), None);
        assert_eq!(one.component("kubelet"), "kubelet");

        let two = Node::new(2).unwrap();
        assert_eq!(two.name(), "network-enforcer-2");
        assert_eq!(two.ip(), "10.243.1.2");
        assert_eq!(two.host_link_ip(), "10.243.1.1");
        assert_eq!(two.pod_cidr(), "10.244.1.0/24");
        assert_eq!(two.gateway(), "10.244.1.1");
        assert_eq!(two.pod_range().0, "10.244.1.10");
        assert_eq!(two.bridge(), "nek1");
        assert_eq!(two.netns().as_deref(), Some("ne-node2"));
        assert_eq!(two.cgroup_root().as_deref(), Some("/ne-node2"));
        assert_eq!(two.component("kubelet"), "kubelet-2");
        let state = State { root: "/s".into() };
        assert_eq!(
            two.containerd_socket(&state),
            PathBuf::from("/s/nodes/2/containerd/containerd.sock")
        );
        assert!(Node::new(0).is_err());
        assert!(Node::new(MAX_NODES + 1).is_err());
        // Interface names fit IFNAMSIZ (15 characters).
        let last = Node::new(MAX_NODES).unwrap();
        assert!(last.host_veth().len() <= 15 && last.bridge().len() <= 15);
    }
}
