//! The pod UIDs behind what the kernel reports of a socket: its network namespace and cgroup. The
//! kubelet puts every container in a cgroup whose path names the pod UID
//! (`.../kubepods/besteffort/pod<UID>/<container>` with the cgroupfs driver,
//! `.../kubepods-besteffort-pod<UID_with_underscores>.slice/...` with the systemd driver), so:
//!
//! - cgroup id → pod UID: walk the cgroup v2 tree; a cgroup's id is its directory's inode number;
//! - network namespace → pod UID: for each process in a pod cgroup, `/proc/PID/ns/net` names its pod's
//!   namespace (all containers of a pod share it). Where that link may not be read (it needs
//!   CAP_SYS_PTRACE when the target holds capabilities the agent lacks), attribution goes by the socket's
//!   own cgroup.
//!
//! Attribution happens in [`crate::identity::attribution`] only; this module only scans.
//!
//! The agent needs the host's `/proc` (DaemonSet `hostPID: true`), the host network namespace
//! (`hostNetwork: true`) and the cgroup tree for this; a process whose namespace it may not read is skipped. Pod UIDs are
//! mapped to namespaces and names by the pod watch ([`crate::identity::pod_watch`], [`crate::identity::attribution`]).

use crate::clock::monotonic_now;
use crate::error::{Error, Result};
use crate::identity::pod_watch::SharedAttributor;
use crate::kernel::host::NodeCgroups;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The pod UID named by a cgroup path, if it is (inside) a Kubernetes pod cgroup.
pub fn pod_uid_from_cgroup_path(path: &str) -> Option<String> {
    path.split('/').find_map(|component| {
        let name = component.strip_suffix(".slice").unwrap_or(component);
        // systemd driver: "kubepods-burstable-pod<uid with _>"; cgroupfs: "pod<uid>".
        let uid = name
            .rsplit_once("-pod")
            .map_or_else(|| name.strip_prefix("pod"), |(_, uid)| Some(uid))?;
        let uid = uid.replace('_', "-");
        is_uid(&uid).then_some(uid)
    })
}

/// Kubernetes UIDs are RFC 4122 UUIDs: 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A snapshot of the node's pod network namespaces and cgroups.
#[derive(Clone, Debug, Default)]
pub struct PodIdentities {
    host_netns: u32,
    by_netns: HashMap<u32, String>,
    by_cgroup: HashMap<u64, String>,
}

impl PodIdentities {
    /// Scans `proc_root` (normally `/proc`, the host's) and the cgroup v2 tree at `cgroup2_root`.
    /// Processes and cgroups that vanish during the scan are skipped.
    pub fn scan(proc_root: &Path, cgroup2_root: &Path) -> std::io::Result<Self> {
        Self::scan_node(
            proc_root,
            &NodeCgroups {
                mount: cgroup2_root.to_path_buf(),
                pods: None,
            },
        )
    }

    /// [`PodIdentities::scan`] of this node's pods only: the cgroups below `node.pods_dir()` and the
    /// processes in them.
    pub fn scan_node(proc_root: &Path, node: &NodeCgroups) -> std::io::Result<Self> {
        let cgroup2_root = node.mount.as_path();
        // The agent runs in the host's network namespace (DaemonSet `hostNetwork: true`), so its own is
        // the host's. (/proc/1/ns/net would need CAP_SYS_PTRACE, which the agent does not ask for.)
        let host_netns = std::fs::metadata(proc_root.join("self/ns/net"))?.ino() as u32;
        let mut ids = Self {
            host_netns,
            ..Self::default()
        };
        ids.walk_cgroups(cgroup2_root, &node.pods_dir(), 0);
        for entry in std::fs::read_dir(proc_root)?.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let dir = entry.path();
            let Ok(cgroups) = std::fs::read_to_string(dir.join("cgroup")) else {
                continue;
            };
            let Some(uid) = cgroups
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .filter(|path| node.holds(path))
                .and_then(pod_uid_from_cgroup_path)
            else {
                continue;
            };
            if let Ok(ns) = std::fs::metadata(dir.join("ns/net")) {
                let ns = ns.ino() as u32;
                if ns != host_netns {
                    ids.by_netns.insert(ns, uid);
                }
            }
        }
        Ok(ids)
    }

    fn walk_cgroups(&mut self, root: &Path, dir: &Path, depth: usize) {
        // Pod cgroups are a few levels down (kubepods/<qos>/pod<UID>/<container>); don't wander.
        if depth > 8 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap_or(&path);
            if let Some(uid) = pod_uid_from_cgroup_path(&relative.to_string_lossy()) {
                if let Ok(meta) = entry.metadata() {
                    self.by_cgroup.insert(meta.ino(), uid);
                }
            }
            self.walk_cgroups(root, &path, depth + 1);
        }
    }

    /// The host's network namespace inode.
    pub fn host_netns(&self) -> u32 {
        self.host_netns
    }

    /// Pod network namespaces found: (namespace inode, pod UID).
    pub fn netns_pods(&self) -> impl Iterator<Item = (u32, &str)> {
        self.by_netns.iter().map(|(ns, uid)| (*ns, uid.as_str()))
    }

    /// Pod cgroups found: (cgroup id, pod UID).
    pub fn cgroup_pods(&self) -> impl Iterator<Item = (u64, &str)> {
        self.by_cgroup.iter().map(|(cg, uid)| (*cg, uid.as_str()))
    }

    /// Number of pod network namespaces found.
    pub fn pod_namespaces(&self) -> usize {
        self.by_netns.len()
    }

    /// Number of pod cgroups found (pod and container levels).
    pub fn pod_cgroups(&self) -> usize {
        self.by_cgroup.len()
    }
}

/// Scans /proc and the cgroup tree into the attribution state: at every flush (pods come and go), and
/// between flushes when events come from a namespace no scan knows (a pod started since), at most once
/// per [`Scanner::MIN_GAP`].
pub struct Scanner {
    proc_root: PathBuf,
    node: NodeCgroups,
    attributor: SharedAttributor,
    last: Option<Instant>,
}

impl Scanner {
    /// The least time between two scans asked for by unknown namespaces.
    pub const MIN_GAP: Duration = Duration::from_secs(1);

    /// A scanner of the host's `/proc` and of `node`'s pods in the cgroup v2 tree, into `attributor`.
    pub fn new(node: NodeCgroups, attributor: SharedAttributor) -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            node,
            attributor,
            last: None,
        }
    }

    /// Scans now.
    pub fn scan(&mut self) -> Result<()> {
        let ids = PodIdentities::scan_node(&self.proc_root, &self.node).map_err(Error::Scan)?;
        self.attributor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe_scan(
                ids.host_netns(),
                ids.netns_pods(),
                ids.cgroup_pods(),
                monotonic_now(),
            );
        self.last = Some(Instant::now());
        Ok(())
    }

    /// Scans unless the last scan is younger than [`Scanner::MIN_GAP`]; whether it scanned.
    pub fn scan_if_due(&mut self) -> Result<bool> {
        if self.last.is_some_and(|t| t.elapsed() < Self::MIN_GAP) {
            return Ok(false);
        }
        self.scan().map(|()| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "d239b24c-7868-4104-8ad7-1f488ce7726f";

    #[test]
    fn finds_the_pod_uid_with_either_cgroup_driver() {
        let cgroupfs = format!("/kubepods/besteffort/pod{UID}/0123abcd");
        assert_eq!(pod_uid_from_cgroup_path(&cgroupfs).as_deref(), Some(UID));
        let guaranteed = format!("/kubepods/pod{UID}");
        assert_eq!(pod_uid_from_cgroup_path(&guaranteed).as_deref(), Some(UID));
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-01.scope",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid_from_cgroup_path(&systemd).as_deref(), Some(UID));
    }

    #[test]
    fn ignores_paths_that_are_not_pods() {
        for path in [
            "/",
            "/system.slice/containerd.service",
            "/kubepods/besteffort",
            "/podman/pod1234",
            "/user.slice/pod-not-a-uid",
        ] {
            assert_eq!(pod_uid_from_cgroup_path(path), None, "{path}");
        }
    }
}
