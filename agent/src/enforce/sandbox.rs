//! A new pod's addresses, read from the node itself before the API server reports them.
//!
//! Why: a pod's IP reaches the API server (`status.podIPs`) only after the kubelet's next status
//! update, and every agent learns it from there. Meanwhile the pod's containers may already send: a
//! new client's first SYN to a protected server on this node met a table that did not know the
//! client yet, was dropped, and the kernel sent it again a second later (and the drop was reported as
//! a violation from a bare address). The container runtime sets up the pod's network namespace (the
//! CNI assigns its addresses) before it starts the sandbox's first process, and starts the app's
//! containers only after that. So once a process of the pod's cgroup is running, its network
//! namespace holds the pod's addresses; the agent (host PID namespace) reads them from
//! `/proc/<pid>/net/` and enforces with them at once ([`crate::enforce::watch`]).
//!
//! Pure parsers ([`ipv4_local_addresses`], [`ipv6_global_addresses`]) and the lookup
//! ([`sandbox_addresses`]): find the pod's cgroup by UID below the node's pods cgroup, take a process
//! of it, read its namespace's addresses.

use crate::identity::pod_identity::pod_uid_from_cgroup_path;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// How deep below the pods cgroup a pod's cgroup may be (`kubepods/<qos>/pod<UID>`, or the systemd
/// driver's `kubepods-<qos>.slice/kubepods-<qos>-pod<UID>.slice`).
const MAX_DEPTH: usize = 3;

/// The IPv4 addresses of a network namespace that are not loopback, from its `/proc/<pid>/net/fib_trie`:
/// each `|-- <address>` leaf followed by a `/32 host LOCAL` line is an address of an interface.
pub fn ipv4_local_addresses(fib_trie: &str) -> Vec<IpAddr> {
    let mut found = Vec::new();
    let mut leaf: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let line = line.trim();
        if let Some(address) = line.strip_prefix("|-- ") {
            leaf = address.trim().parse().ok();
        } else if line.starts_with("/32 host LOCAL")
            && let Some(address) = leaf
            && !address.is_loopback()
            && !found.contains(&IpAddr::V4(address))
        {
            found.push(IpAddr::V4(address));
        }
    }
    found
}

/// The global-scope IPv6 addresses of a network namespace, from its `/proc/<pid>/net/if_inet6`
/// (`<32 hex digits> <ifindex> <prefix> <scope> <flags> <name>`; scope 00 is global).
pub fn ipv6_global_addresses(if_inet6: &str) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for line in if_inet6.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [hex, _, _, scope, _, name] = fields[..] else {
            continue;
        };
        if scope != "00" || name == "lo" || hex.len() != 32 {
            continue;
        }
        let Ok(bits) = u128::from_str_radix(hex, 16) else {
            continue;
        };
        let address = IpAddr::V6(Ipv6Addr::from(bits));
        if !found.contains(&address) {
            found.push(address);
        }
    }
    found
}

/// The cgroup directory of pod `uid` below `pods_dir`, if its sandbox exists.
pub fn pod_cgroup(pods_dir: &Path, uid: &str) -> Option<PathBuf> {
    fn walk(dir: &Path, uid: &str, depth: usize) -> Option<PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            match pod_uid_from_cgroup_path(&name) {
                Some(found) if found == uid => return Some(entry.path()),
                // Another pod: its containers are no pods.
                Some(_) => {}
                None if depth < MAX_DEPTH => {
                    if let Some(path) = walk(&entry.path(), uid, depth + 1) {
                        return Some(path);
                    }
                }
                None => {}
            }
        }
        None
    }
    walk(pods_dir, uid, 1)
}

/// The processes in the pod cgroup `pod_dir` (its own `cgroup.procs`, then its containers').
fn processes_of(pod_dir: &Path) -> Vec<u32> {
    let read = |dir: &Path| -> Vec<u32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .collect()
    };
    let mut pids = read(pod_dir);
    for entry in std::fs::read_dir(pod_dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(read(&entry.path()));
        }
    }
    pids
}

/// The addresses of the network namespace process `pid` is in (`self`: the agent's), from
/// `/proc/<pid>/net/` (readable for any process: unlike `/proc/<pid>/ns/net` it needs no ptrace
/// access); `None` when that process is gone.
fn addresses_of(proc_root: &Path, pid: &str) -> Option<Vec<IpAddr>> {
    let net = proc_root.join(pid).join("net");
    let mut addresses = ipv4_local_addresses(&std::fs::read_to_string(net.join("fib_trie")).ok()?);
    addresses.extend(ipv6_global_addresses(
        &std::fs::read_to_string(net.join("if_inet6")).unwrap_or_default(),
    ));
    Some(addresses)
}

/// The addresses of pod `uid`'s network namespace, read on the node: `None` while no process of its
/// cgroup is in a namespace with addresses other than loopback that are none of the agent's (the
/// host's: the agent runs with `hostNetwork`). A process is placed in the pod's cgroup before it
/// enters the pod's namespace (the runtime's init), so the namespace is checked, not assumed; a pod's
/// address is its own, never the node's.
pub fn sandbox_addresses(proc_root: &Path, pods_dir: &Path, uid: &str) -> Option<Vec<IpAddr>> {
    let pod_dir = pod_cgroup(pods_dir, uid)?;
    let host = addresses_of(proc_root, "self")?;
    processes_of(&pod_dir).into_iter().find_map(|pid| {
        let addresses = addresses_of(proc_root, &pid.to_string())?;
        (!addresses.is_empty() && !addresses.iter().any(|a| host.contains(a))).then_some(addresses)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cat /proc/<pid>/net/fib_trie` of a pod with one veth (10.244.0.7/24).
    const POD_FIB_TRIE: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.244.0.0/24 2 0 2
        +-- 10.244.0.0/29 2 0 2
           |-- 10.244.0.0
              /24 link UNICAST
           |-- 10.244.0.7
              /32 host LOCAL
        |-- 10.244.0.255
           /32 link BROADCAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.244.0.7
        /32 host LOCAL
";

    #[test]
    fn a_namespaces_ipv4_addresses_are_its_local_host_leaves_without_loopback() {
        assert_eq!(
            ipv4_local_addresses(POD_FIB_TRIE),
            vec!["10.244.0.7".parse::<IpAddr>().unwrap()]
        );
        assert!(ipv4_local_addresses("").is_empty());
        assert!(ipv4_local_addresses("|-- not-an-ip\n/32 host LOCAL\n|--\n").is_empty());
    }

    #[test]
    fn a_namespaces_ipv6_addresses_are_its_global_ones() {
        let if_inet6 = "\
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000007 02 40 00 80     eth0
fe800000000000000000000000000007 02 40 20 80     eth0
zz 02 40 00 80 eth0
fd00000000000000000000000000000 02 40 00 80 eth0
";
        assert_eq!(
            ipv6_global_addresses(if_inet6),
            vec!["fd00::7".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn a_pods_cgroup_is_found_by_uid_with_either_driver_and_its_process_read() {
        let root = std::env::temp_dir().join(format!("ne-sandbox-{}", std::process::id()));
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let other = "11111111-2222-3333-4444-555555555555";
        let cgroupfs = root.join("kubepods/besteffort");
        let pod = cgroupfs.join(format!("pod{uid}"));
        let sandbox = pod.join("abc123");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::create_dir_all(cgroupfs.join(format!("pod{other}/def"))).unwrap();
        std::fs::write(pod.join("cgroup.procs"), "").unwrap();
        std::fs::write(sandbox.join("cgroup.procs"), "4242\n").unwrap();
        assert_eq!(pod_cgroup(&root.join("kubepods"), uid), Some(pod.clone()));
        assert_eq!(processes_of(&pod), vec![4242]);
        // The systemd driver's names.
        let slice = root.join("systemd/kubepods.slice/kubepods-burstable.slice");
        let systemd = slice.join(format!(
            "kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        ));
        std::fs::create_dir_all(&systemd).unwrap();
        let pods = root.join("systemd/kubepods.slice");
        assert_eq!(pod_cgroup(&pods, uid), Some(systemd.clone()));
        // No process yet: no addresses.
        assert!(processes_of(&systemd).is_empty());
        assert_eq!(sandbox_addresses(Path::new("/proc"), &pods, uid), None);
        // A process still in the host's namespace (this test's own: the runtime's init before it
        // enters the pod's namespace) is not the pod's: its addresses are the node's.
        std::fs::write(
            systemd.join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(sandbox_addresses(Path::new("/proc"), &pods, uid), None);
        // A process in a namespace of its own: a fake /proc where "self" and the pod's process
        // have different addresses.
        let proc_root = root.join("proc");
        std::fs::create_dir_all(proc_root.join("self/net")).unwrap();
        std::fs::write(
            proc_root.join("self/net/fib_trie"),
            "|-- 10.244.0.1\n/32 host LOCAL\n|-- 192.0.2.2\n/32 host LOCAL\n",
        )
        .unwrap();
        std::fs::create_dir_all(proc_root.join("77/net")).unwrap();
        std::fs::write(proc_root.join("77/net/fib_trie"), POD_FIB_TRIE).unwrap();
        // Still the host's namespace (the runtime's init).
        std::fs::create_dir_all(proc_root.join("76/net")).unwrap();
        std::fs::copy(
            proc_root.join("self/net/fib_trie"),
            proc_root.join("76/net/fib_trie"),
        )
        .unwrap();
        std::fs::write(systemd.join("cgroup.procs"), "76\n").unwrap();
        assert_eq!(sandbox_addresses(&proc_root, &pods, uid), None);
        std::fs::write(systemd.join("cgroup.procs"), "76\n77\n").unwrap();
        assert_eq!(
            sandbox_addresses(&proc_root, &pods, uid),
            Some(vec!["10.244.0.7".parse::<IpAddr>().unwrap()])
        );
        assert_eq!(pod_cgroup(&root.join("kubepods"), "no-such-uid"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
