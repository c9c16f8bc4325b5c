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

/// A process running in the pod cgroup `pod_dir` (its own `cgroup.procs`, else a container's).
fn process_of(pod_dir: &Path) -> Option<u32> {
    let first = |dir: &Path| {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .ok()?
            .lines()
            .find_map(|l| l.trim().parse::<u32>().ok())
    };
    first(pod_dir).or_else(|| {
        std::fs::read_dir(pod_dir)
            .ok()?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .find_map(|e| first(&e.path()))
    })
}

/// The addresses of pod `uid`'s network namespace, read on the node: `None` while its sandbox has no
/// running process, or when its namespace has no address other than loopback (a host-network pod's
/// process is in the host's namespace: callers ask only for pods that are not).
pub fn sandbox_addresses(proc_root: &Path, pods_dir: &Path, uid: &str) -> Option<Vec<IpAddr>> {
    let pid = process_of(&pod_cgroup(pods_dir, uid)?)?;
    let net = proc_root.join(pid.to_string()).join("net");
    let mut addresses = ipv4_local_addresses(&std::fs::read_to_string(net.join("fib_trie")).ok()?);
    addresses.extend(ipv6_global_addresses(
        &std::fs::read_to_string(net.join("if_inet6")).unwrap_or_default(),
    ));
    (!addresses.is_empty()).then_some(addresses)
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
        assert_eq!(process_of(&pod), Some(4242));
        // The systemd driver's names.
        let slice = root.join("systemd/kubepods.slice/kubepods-burstable.slice");
        let systemd = slice.join(format!(
            "kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        ));
        std::fs::create_dir_all(&systemd).unwrap();
        assert_eq!(
            pod_cgroup(&root.join("systemd/kubepods.slice"), uid),
            Some(systemd.clone())
        );
        // No process yet: no addresses.
        assert_eq!(process_of(&systemd), None);
        assert_eq!(
            sandbox_addresses(&root, &root.join("systemd/kubepods.slice"), uid),
            None
        );
        // A process whose namespace we can read: this test's own.
        std::fs::write(
            systemd.join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        let own = std::fs::read_to_string("/proc/self/net/fib_trie").unwrap_or_default();
        let found = sandbox_addresses(
            Path::new("/proc"),
            &root.join("systemd/kubepods.slice"),
            uid,
        )
        .unwrap_or_default();
        let v4: Vec<IpAddr> = found.into_iter().filter(IpAddr::is_ipv4).collect();
        assert_eq!(v4, ipv4_local_addresses(&own));
        assert_eq!(pod_cgroup(&root.join("kubepods"), "no-such-uid"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
