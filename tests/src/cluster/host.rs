//! What the cluster changes on the host outside its processes — the bridge, sysctls, iptables rules,
//! cgroups, mounts — and how `down` removes all of it, also after a crash (nothing here relies on a
//! process still running or on a record that a crash could have lost).

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::layout::{BRIDGE, CLUSTER_CIDR, CNI_NETWORK, NODE_IP, SERVICE_CIDR, State};
use super::node;
use super::process::output;

/// The bridge with the node address, created before the API server so it can bind to that address.
/// The bridge CNI plugin adopts it (same name, same gateway address).
pub fn create_bridge() -> Result<()> {
    if !Path::new("/sys/class/net").join(BRIDGE).exists() {
        output(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
    }
    let addrs = output(Command::new("ip").args(["-4", "-o", "addr", "show", "dev", BRIDGE]))?;
    if !addrs.contains(&format!("{NODE_IP}/")) {
        output(Command::new("ip").args(["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE]))?;
    }
    output(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
    // ClusterIPs are virtual: kube-proxy DNATs the known ones. Route the range to the bridge so that a
    // packet to an unknown one dies here instead of following the default route off the machine.
    // The route goes away with the bridge.
    output(Command::new("ip").args([
        "route",
        "replace",
        SERVICE_CIDR,
        "dev",
        BRIDGE,
        "src",
        NODE_IP,
    ]))?;
    Ok(())
}

/// Sysctls the cluster needs (`ip_forward`) and those its components set on their own (kubelet:
/// `vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`; kube-proxy: `route_localnet`): their
/// previous values are saved once and restored by `down`.
const SYSCTLS: [(&str, &str); 5] = [
    ("net/ipv4/ip_forward", "1"),
    ("vm/overcommit_memory", ""),
    ("kernel/panic", ""),
    ("kernel/panic_on_oops", ""),
    ("net/ipv4/conf/all/route_localnet", ""),
];

/// The pseudo file systems every node has mounted (systemd mounts them at boot), by type and place.
const PSEUDO_FILESYSTEMS: &[(&str, &str)] =
    &[("bpf", "/sys/fs/bpf"), ("tracefs", "/sys/kernel/tracing")];

/// Mounts the [`PSEUDO_FILESYSTEMS`] that are not there, as on a node: the agent's container may not
/// mount them itself (it has no CAP_SYS_ADMIN). They stay after `down`, like on a node.
pub fn mount_pseudo_filesystems() -> Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    for (fstype, point) in PSEUDO_FILESYSTEMS {
        let mounted = mountinfo.lines().any(|l| {
            let mut halves = l.split(" - ");
            let at = halves.next().and_then(|f| f.split(' ').nth(4));
            let kind = halves.next().and_then(|f| f.split(' ').next());
            at == Some(*point) && kind == Some(*fstype)
        });
        if !mounted {
            output(Command::new("mount").args(["-t", fstype, fstype, point]))
                .with_context(|| format!("mounting {fstype} at {point}"))?;
        }
    }
    Ok(())
}

/// Saves the host sysctls that the cluster will change and sets those it needs.
pub fn save_and_set_sysctls(state: &State) -> Result<()> {
    let saved = state.saved_sysctls();
    if !saved.exists() {
        let mut values = BTreeMap::new();
        for (key, _) in SYSCTLS {
            let v = fs::read_to_string(Path::new("/proc/sys").join(key))?;
            values.insert(key.to_string(), v.trim().to_string());
        }
        fs::write(&saved, serde_json::to_string_pretty(&values)?)?;
    }
    for (key, value) in SYSCTLS.iter().filter(|(_, v)| !v.is_empty()) {
        fs::write(Path::new("/proc/sys").join(key), value)
            .with_context(|| format!("setting sysctl {key}"))?;
    }
    Ok(())
}

fn restore_sysctls(state: &State) {
    let Ok(text) = fs::read_to_string(state.saved_sysctls()) else {
        return;
    };
    let values: BTreeMap<String, String> = serde_json::from_str(&text).unwrap_or_default();
    for (key, value) in values {
        let _ = fs::write(Path::new("/proc/sys").join(key), value);
    }
}

/// Our own iptables chain: pods may talk to each other, to Services and to the node, never beyond the
/// machine (this workplace allows traffic only to loopback and namespaces we create).
const GUARD_CHAIN: &str = "NE-CLUSTER-GUARD";

/// Drops forwarded pod traffic that would leave through any interface but a node's: the bridge of node
/// 1's pods or the link to an extra node. Inserted at the top of FORWARD, ahead of kube-proxy's and the
/// bridge plugin's accepts.
pub fn install_egress_guard() -> Result<()> {
    let exists = Command::new("iptables")
        .args(["-w", "-n", "-L", GUARD_CHAIN])
        .output()
        .is_ok_and(|o| o.status.success());
    if !exists {
        output(Command::new("iptables").args(["-w", "-N", GUARD_CHAIN]))?;
        let append = |rule: &[&str]| {
            output(
                Command::new("iptables")
                    .args(["-w", "-A", GUARD_CHAIN, "-s", CLUSTER_CIDR])
                    .args(rule),
            )
        };
        let extra_nodes = format!("{}+", node::HOST_VETH_PREFIX);
        for out in [BRIDGE, extra_nodes.as_str()] {
            append(&["-o", out, "-j", "RETURN"])?;
        }
        append(&["-j", "DROP"])?;
    }
    let jump = ["FORWARD", "-j", GUARD_CHAIN];
    let present = Command::new("iptables")
        .args(["-w", "-C"])
        .args(jump)
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        output(Command::new("iptables").args(["-w", "-I"]).args(jump))?;
    }
    Ok(())
}

/// Removes everything the cluster left on the host, in an order that works whatever survived:
/// container processes (by cgroup), mounts and files under the state directory, network namespaces,
/// the bridge, iptables rules, cgroups, kubelet's log directories, sysctls.
pub fn clean(state: &State) -> Result<()> {
    kill_kubepods();
    unmount_below(&state.root);
    remove_pod_veths();
    let _ = Command::new("ip").args(["link", "del", BRIDGE]).output();
    for tool in ["iptables", "ip6tables"] {
        remove_chains(tool);
    }
    remove_kubepods_cgroups();
    node::remove_all_leftovers();
    remove_cni_cache();
    // kubelet 1.20 always writes container logs here (its `--root-dir` does not move them).
    for dir in ["/var/log/pods", "/var/log/containers"] {
        let _ = fs::remove_dir_all(dir);
    }
    restore_sysctls(state);
    Ok(())
}

/// Every cgroup hierarchy mounted on the host (v1 controllers and the unified v2 tree).
pub(super) fn cgroup_roots() -> Vec<PathBuf> {
    fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// The `kubepods` cgroup trees the nodes' kubelets (cgroupfs driver) created in each hierarchy.
fn kubepods_dirs() -> Vec<PathBuf> {
    let parents = node::cgroup_parents();
    cgroup_roots()
        .into_iter()
        .flat_map(|r| parents.iter().map(move |p| r.join(p).join("kubepods")))
        .filter(|p| p.is_dir())
        .collect()
}

/// Kills what runs in cgroup `name` (below each hierarchy's root) and removes it, deepest first.
pub(super) fn remove_cgroup_tree(name: &str) {
    for _ in 0..30 {
        let dirs: Vec<PathBuf> = cgroup_roots()
            .into_iter()
            .map(|r| r.join(name))
            .filter(|p| p.is_dir())
            .collect();
        if dirs.is_empty() {
            return;
        }
        for root in dirs {
            for dir in dirs_deepest_first(&root) {
                let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                    super::process::signal(pid, libc::SIGKILL);
                }
                let _ = fs::remove_dir(&dir);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Every directory below (and including) `dir`, deepest first.
fn dirs_deepest_first(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(dirs_deepest_first(&e.path()));
            }
        }
    }
    out.push(dir.to_path_buf());
    out
}

/// SIGKILLs every process in the pods' cgroups (containers and pause processes).
fn kill_kubepods() {
    for _ in 0..20 {
        let mut any = false;
        for root in kubepods_dirs() {
            for dir in dirs_deepest_first(&root) {
                let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                    any = true;
                    super::process::signal(pid, libc::SIGKILL);
                }
            }
        }
        if !any {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Removes the (now empty) `kubepods` cgroups, deepest first, retrying while the kernel finishes
/// tearing down killed tasks.
fn remove_kubepods_cgroups() {
    for _ in 0..30 {
        let roots = kubepods_dirs();
        if roots.is_empty() {
            return;
        }
        for root in roots {
            for dir in dirs_deepest_first(&root) {
                let _ = fs::remove_dir(&dir);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Lazily unmounts every mount point at or below `root` (pod volumes, container root filesystems,
/// shm, network namespace bind mounts), deepest first.
fn unmount_below(root: &Path) {
    let mut points: Vec<PathBuf> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(unescape_mount_path))
        .filter(|p| p.starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        if let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2 with a valid NUL-terminated path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> PathBuf {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// Host ends of pod veths still attached to our bridge (normally they vanish with the pods' network
/// namespaces; this covers a namespace kept alive by a straggler).
fn remove_pod_veths() {
    let dir = Path::new("/sys/class/net").join(BRIDGE).join("brif");
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = Command::new("ip")
                .args(["link", "del"])
                .arg(e.file_name())
                .output();
        }
    }
}

/// Chain prefixes that only the cluster creates: kube-proxy and kubelet (`KUBE-`), the bridge CNI
/// plugin's masquerade chains (`CNI-`) and our guard (`NE-CLUSTER-`).
const CHAIN_PREFIXES: [&str; 3] = ["KUBE-", "CNI-", "NE-CLUSTER-"];

fn ours(chain: &str) -> bool {
    CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// Deletes, in every table, the rules that jump to our chains, then the chains themselves.
fn remove_chains(tool: &str) {
    for table in ["filter", "nat", "mangle"] {
        let Ok(rules) = output(Command::new(tool).args(["-w", "-t", table, "-S"])) else {
            continue;
        };
        let mut chains = Vec::new();
        for line in rules.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["-N", chain] if ours(chain) => chains.push(chain.to_string()),
                ["-A", chain, rest @ ..] if !ours(chain) => {
                    let jumps_to_ours = rest
                        .windows(2)
                        .any(|w| (w[0] == "-j" || w[0] == "-g") && ours(w[1]));
                    if jumps_to_ours {
                        // `-S` prints rules in the syntax `-D` accepts; quoted comments need a shell.
                        let delete = format!("{tool} -w -t {table} -D {}", &line[3..]);
                        let _ = Command::new("sh").args(["-c", &delete]).output();
                    }
                }
                _ => {}
            }
        }
        for chain in &chains {
            let _ = Command::new(tool)
                .args(["-w", "-t", table, "-F", chain])
                .output();
        }
        for chain in &chains {
            let _ = Command::new(tool)
                .args(["-w", "-t", table, "-X", chain])
                .output();
        }
    }
}

/// libcni keeps a result cache per attachment in /var/lib/cni/results (containerd 1.6 does not move
/// it): ours are prefixed with our network name, and containerd's own loopback attachments with
/// `cni-loopback-`. containerd-shim-runc-v2 keeps its sockets under /run/containerd/s whatever
/// containerd's state directory is; that directory goes too when no other containerd runs.
fn remove_cni_cache() {
    let dir = Path::new("/var/lib/cni/results");
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{CNI_NETWORK}-")) || name.starts_with("cni-loopback-") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    if super::process::pids_mentioning("containerd").is_empty() {
        let _ = fs::remove_dir_all("/run/containerd");
    }
}
