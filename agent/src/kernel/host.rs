//! What the host must provide before the kernel programs can load: privileges, BTF, and the bpf and
//! tracing pseudo file systems (mounted here when absent, as in a fresh container or a minimal node).

use crate::error::{Error, Result};
use crate::kernel::btf::VMLINUX_BTF;
use std::path::{Path, PathBuf};

/// The conventional bpffs mount point.
pub const BPFFS_PATH: &str = "/sys/fs/bpf";

/// Capability numbers (`include/uapi/linux/capability.h`) the programs need on kernels >= 5.8.
const CAP_NET_ADMIN: u32 = 12;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails with [`Error::NotPrivileged`] unless the process is root or has CAP_BPF, CAP_PERFMON and
/// CAP_NET_ADMIN in its effective set (a DaemonSet can grant exactly those instead of running privileged).
pub fn check_privileges() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = effective_capabilities(&status).unwrap_or(0);
    let needed = [CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN];
    if needed.iter().all(|cap| effective & (1u64 << cap) != 0) {
        Ok(())
    } else {
        Err(Error::NotPrivileged { uid })
    }
}

/// The `CapEff:` bit set from the text of `/proc/<pid>/status`.
pub fn effective_capabilities(proc_status: &str) -> Option<u64> {
    proc_status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Fails with [`Error::NoBtf`] when the kernel does not publish its BTF.
pub fn require_btf() -> Result<()> {
    if Path::new(VMLINUX_BTF).is_file() {
        Ok(())
    } else {
        Err(Error::NoBtf(VMLINUX_BTF.into()))
    }
}

/// One line of `/proc/self/mountinfo`, reduced to what we need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted (escapes like `\040` decoded).
    pub mount_point: PathBuf,
    /// The file system type, e.g. `cgroup2`.
    pub fstype: String,
}

/// Parses the text of `/proc/<pid>/mountinfo` (see proc(5)); malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            // The optional fields end at a lone "-"; the file system type follows it.
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split(' ').nth(4)?;
            let fstype = after.split(' ').next()?;
            Some(Mount {
                mount_point: PathBuf::from(unescape_octal(mount_point)),
                fstype: fstype.to_string(),
            })
        })
        .collect()
}

/// The kernel writes space, tab, newline and backslash in mount points as `\ooo` octal escapes.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if let Some(b) = octal_byte(digits) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Three ASCII octal digits as a byte (`040` → space).
fn octal_byte(digits: &[u8]) -> Option<u8> {
    digits.iter().try_fold(0u8, |acc, d| match d {
        b'0'..=b'7' => acc.checked_mul(8)?.checked_add(d - b'0'),
        _ => None,
    })
}

/// The mounts of this process's mount namespace.
pub fn mounts() -> Result<Vec<Mount>> {
    let path = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.into(),
        source,
    })?;
    Ok(parse_mountinfo(&text))
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a pure v2 host, often
/// `/sys/fs/cgroup/unified` on a hybrid one). The first cgroup2 mount wins; all show the same hierarchy.
pub fn cgroup2_root() -> Result<PathBuf> {
    mounts()?
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| m.mount_point)
        .ok_or(Error::NoCgroup2)
}

/// This node's place in the cgroup v2 tree, found from the agent's own cgroup. The kubelet keeps every
/// pod below one `kubepods` cgroup (`/kubepods` with the cgroupfs driver, `/kubepods.slice` with
/// systemd's, below its `--cgroup-root` when one is set); the agent runs in a pod, so its own cgroup
/// path names that directory. Where nodes share a kernel (the local cluster's simulated nodes) this keeps
/// the agent to its own node's pods; on a real node it changes nothing, as everything is below the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCgroups {
    /// Where the cgroup v2 hierarchy is mounted.
    pub mount: PathBuf,
    /// The pods' cgroup below the mount (`/kubepods`, `/ne-node2/kubepods`), `None` when the agent does
    /// not run in a pod cgroup (started by hand) or sees its cgroup as `/` (a private cgroup
    /// namespace): then the whole tree is the node's.
    pub pods: Option<String>,
}

impl NodeCgroups {
    /// From the mounts and `/proc/self/cgroup`.
    pub fn detect() -> Result<Self> {
        let mount = cgroup2_root()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Ok(Self {
            mount,
            pods: pods_cgroup_of(&own),
        })
    }

    /// Where the programs attach: the parent of the pods' cgroup (the hierarchy's root on a real
    /// node), so that they see every pod of the node and no other node's.
    pub fn attach_dir(&self) -> PathBuf {
        let parent = self
            .pods
            .as_deref()
            .and_then(|p| p.rsplit_once('/').map(|(parent, _)| parent))
            .unwrap_or("");
        self.mount.join(parent.trim_start_matches('/'))
    }

    /// The directory below which this node's pod cgroups are.
    pub fn pods_dir(&self) -> PathBuf {
        match &self.pods {
            Some(p) => self.mount.join(p.trim_start_matches('/')),
            None => self.mount.clone(),
        }
    }

    /// Whether a cgroup v2 path (as `/proc/PID/cgroup` shows it) is this node's.
    pub fn holds(&self, path: &str) -> bool {
        match &self.pods {
            Some(p) => path
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
            None => true,
        }
    }
}

/// The pods' cgroup named by a process's `/proc/self/cgroup`: its cgroup v2 path (`0::`) up to and
/// including the first component that starts with `kubepods`.
pub fn pods_cgroup_of(proc_self_cgroup: &str) -> Option<String> {
    let path = proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?;
    let mut prefix = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        prefix.push('/');
        prefix.push_str(part);
        if part.starts_with("kubepods") {
            return Some(prefix);
        }
    }
    None
}

/// Mounts a `fstype` file system at `path` unless one is already mounted there.
pub fn ensure_mounted(fstype: &'static str, path: &Path) -> Result<()> {
    if mounts()?
        .iter()
        .any(|m| m.fstype == fstype && m.mount_point == path)
    {
        return Ok(());
    }
    tracing::info!(fstype, path = %path.display(), "mounting");
    let to_c = |s: &str| std::ffi::CString::new(s).expect("no NUL in mount arguments");
    let target = to_c(&path.to_string_lossy());
    let source = to_c(fstype);
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            source.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(Error::Mount {
            fstype,
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_cgroup_is_the_agents_own_path_up_to_kubepods() {
        let table = [
            (
                "12:pids:/kubepods/besteffort/podA/c1\n0::/kubepods/besteffort/podA/c1",
                Some("/kubepods"),
            ),
            (
                "0::/ne-node2/kubepods/burstable/podB/c2",
                Some("/ne-node2/kubepods"),
            ),
            (
                "0::/kubepods.slice/kubepods-besteffort.slice/x.scope",
                Some("/kubepods.slice"),
            ),
            // Started by hand, or a private cgroup namespace: the whole tree.
            ("0::/user.slice/session-1.scope", None),
            ("0::/", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(pods_cgroup_of(text).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn a_node_attaches_above_its_pods_and_holds_only_their_cgroups() {
        let mount = PathBuf::from("/sys/fs/cgroup/unified");
        let node2 = NodeCgroups {
            mount: mount.clone(),
            pods: Some("/ne-node2/kubepods".into()),
        };
        assert_eq!(node2.attach_dir(), mount.join("ne-node2"));
        assert_eq!(node2.pods_dir(), mount.join("ne-node2/kubepods"));
        assert!(node2.holds("/ne-node2/kubepods/besteffort/podA/c"));
        assert!(!node2.holds("/kubepods/besteffort/podB/c"));
        assert!(!node2.holds("/ne-node2/kubepods-other/x"));
        let node1 = NodeCgroups {
            mount: mount.clone(),
            pods: Some("/kubepods".into()),
        };
        assert_eq!(node1.attach_dir(), mount);
        assert!(node1.holds("/kubepods/burstable/podC/c"));
        assert!(!node1.holds("/ne-node2/kubepods/burstable/podA/c"));
        let whole = NodeCgroups {
            mount: mount.clone(),
            pods: None,
        };
        assert_eq!(
            (whole.attach_dir(), whole.pods_dir()),
            (mount.clone(), mount)
        );
        assert!(whole.holds("/anything"));
    }

    #[test]
    fn parses_mountinfo_lines_with_and_without_optional_fields() {
        let text = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 master:3 - cgroup2 cgroup2 rw
40 25 0:35 / /sys/kernel/tracing rw,relatime - tracefs tracefs rw
41 25 0:36 / /mnt/with\\040space rw - tmpfs none rw
garbage line";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 4);
        assert_eq!(mounts[1].fstype, "cgroup2");
        assert_eq!(
            mounts[1].mount_point,
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        assert_eq!(mounts[2].fstype, "tracefs");
        assert_eq!(mounts[3].mount_point, PathBuf::from("/mnt/with space"));
    }

    #[test]
    fn reads_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        let caps = effective_capabilities(status).unwrap();
        assert_ne!(caps & (1 << CAP_BPF), 0);
        assert_eq!(effective_capabilities("CapEff:\tzz\n"), None);
        assert_eq!(effective_capabilities(""), None);
    }
}
