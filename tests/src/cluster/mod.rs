//! The local single-node Kubernetes cluster: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, containerd, kubelet, kube-proxy and a dnsmasq cluster DNS, all from Debian (Kubernetes
//! v1.20.2 built from Debian's source package by `cargo xtask setup`). See `docs/local-cluster.md`.
//!
//! Everything on disk lives under one state directory ([`layout::state_dir`]); every process names that
//! directory on its command line, which is how [`down`] finds them even after a crash. A file lock next
//! to the state directory serialises `up` and `down`; test processes hold it shared while they use the
//! cluster, so `down` waits for running tests.

pub mod components;
pub mod dns;
pub mod host;
pub mod layout;
pub mod node;
mod pki;
pub mod process;

use anyhow::{Context, Result, bail};
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use layout::{API_PORT, NODE_IP, State, kubernetes_bin};
use node::Node;

/// The components in start order; `status` reports them in this order.
pub const COMPONENTS: [&str; 9] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
    "dns-feeder",
    // Not a process of ours but a pod; listed so that status shows DNS.
    "dns",
];

/// What a running cluster offers to its users.
#[derive(Clone, Debug)]
pub struct ClusterInfo {
    /// The admin kubeconfig (token auth, system:masters).
    pub kubeconfig: PathBuf,
    /// The API server URL.
    pub server: String,
}

/// The API server URL (on the node/bridge address, reachable from the host and from pods).
pub fn server_url() -> String {
    format!("https://{NODE_IP}:{API_PORT}")
}

/// Starts the cluster, or does nothing when it is already healthy. A half-running cluster (a crash, a
/// killed component) is torn down and started afresh.
pub fn up() -> Result<ClusterInfo> {
    let (lock, info) = ensure_up()?;
    drop(lock);
    Ok(info)
}

/// [`up`] for a test process: starts the cluster if needed, then keeps a shared lock until the process
/// exits so that `cargo xtask cluster down` waits for the tests.
pub fn up_for_tests() -> Result<ClusterInfo> {
    let (lock, info) = ensure_up()?;
    // Held for the life of the process: the lock is released when the process exits.
    std::mem::forget(lock);
    Ok(info)
}

/// Makes sure the cluster is up and returns it with a shared lock held. The common case (a healthy
/// cluster, maybe in use by a test process right now) needs only the shared lock; starting or repairing
/// takes the exclusive one, which waits for every other user.
fn ensure_up() -> Result<(Lock, ClusterInfo)> {
    let lock = Lock::shared()?;
    let state = State::new();
    if healthy(&state) {
        return Ok((lock, info(&state)));
    }
    drop(lock);
    let lock = Lock::exclusive()?;
    let info = up_locked()?;
    lock.downgrade_to_shared()?;
    Ok((lock, info))
}

fn up_locked() -> Result<ClusterInfo> {
    let state = State::new();
    check_prerequisites()?;
    if healthy(&state) {
        return Ok(info(&state));
    }
    if state.root.exists() || !process::pids_mentioning(&state.root.to_string_lossy()).is_empty() {
        eprintln!("==> cluster: cleaning up a previous, unhealthy cluster");
        down_locked(&state)?;
    }
    let start = Instant::now();
    eprintln!("==> cluster: starting (state in {})", state.root.display());
    let result = start_all(&state);
    if let Err(e) = result {
        let logs = COMPONENTS
            .iter()
            .filter(|c| state.log(c).exists())
            .map(|c| {
                format!(
                    "--- {} (last 15 lines) ---\n{}",
                    c,
                    process::tail(&state.log(c), 15)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        return Err(e.context(format!(
            "the local cluster did not start; logs are in {}.\n{logs}\n\
             (the cluster is left as it is for inspection; `cargo xtask cluster down` removes it)",
            state.root.join("logs").display()
        )));
    }
    eprintln!("==> cluster: up in {:.1}s", start.elapsed().as_secs_f64());
    Ok(info(&state))
}

fn start_all(state: &State) -> Result<()> {
    fs::create_dir_all(&state.root)?;
    let step = |name: &str, t: Instant| eprintln!("    {name}: {:.1}s", t.elapsed().as_secs_f64());

    let t = Instant::now();
    crate::images::ensure_base_images()?;
    // Every image in the cache: the base images and whatever `cargo xtask image` built before.
    let images = crate::images::all_tars()?;
    let creds = pki::create(&state.pki())?;
    fs::write(
        state.kubeconfig(),
        pki::kubeconfig(
            &server_url(),
            &state.pki().join("ca.crt"),
            &creds.admin_token,
        ),
    )?;
    host::save_and_set_sysctls(state)?;
    host::create_bridge()?;
    host::mount_pseudo_filesystems()?;
    step("images, certificates, bridge", t);

    let t = Instant::now();
    components::start_etcd(state)?;
    components::start_apiserver(state)?;
    step("etcd + kube-apiserver ready", t);
    let t = Instant::now();
    components::start_controller_manager(state)?;
    components::start_scheduler(state)?;
    components::start_containerd(state, &Node::FIRST)?;
    for tar in &images {
        components::import_image_into(state, &Node::FIRST, tar)?;
    }
    step("controller-manager, scheduler, containerd + images", t);
    let t = Instant::now();
    components::start_kubelet(state, &Node::FIRST)?;
    step("kubelet: node Ready", t);
    let t = Instant::now();
    components::start_kube_proxy(state, &Node::FIRST)?;
    host::install_egress_guard()?;
    step("kube-proxy synced", t);
    let t = Instant::now();
    dns::start(state)?;
    step("DNS ready", t);
    Ok(())
}

fn info(state: &State) -> ClusterInfo {
    ClusterInfo {
        kubeconfig: state.kubeconfig(),
        server: server_url(),
    }
}

/// Everything `up` needs from `cargo xtask setup`, with a clear message when something is missing.
fn check_prerequisites() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the local cluster needs root (network namespaces, cgroups, iptables, mounts)");
    }
    let mut missing: Vec<String> = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "kubectl",
    ]
    .iter()
    .map(|b| kubernetes_bin(b))
    .filter(|p| !p.exists())
    .map(|p| p.display().to_string())
    .collect();
    for tool in [
        "etcd",
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "iptables",
        "ip",
        "gcc",
    ] {
        if which(tool).is_none() {
            missing.push(tool.to_string());
        }
    }
    if !Path::new("/usr/lib/cni/bridge").exists() {
        missing.push("/usr/lib/cni/bridge (containernetworking-plugins)".into());
    }
    if !missing.is_empty() {
        bail!(
            "the local cluster needs what `cargo xtask setup` installs; missing: {}",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Where `tool` is on PATH (or in /usr/sbin, /sbin).
pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.exists())
}

/// True when every daemon runs, the API server is ready and the node is Ready.
fn healthy(state: &State) -> bool {
    let daemons_up = COMPONENTS
        .iter()
        .filter(|c| **c != "dns")
        .all(|c| process::running_pid(state, c).is_some());
    daemons_up
        && components::kubectl(&state.kubeconfig(), &["get", "--raw", "/readyz"])
            .is_ok_and(|o| o.trim() == "ok")
        && node_ready(state)
        && dns::ready(state)
        && crate::images::base_images_current()
}

fn node_ready(state: &State) -> bool {
    components::node_ready(state, &Node::FIRST)
}

/// The daemons each node runs, in start order.
const NODE_DAEMONS: [&str; 3] = ["containerd", "kubelet", "kube-proxy"];

/// The nodes whose containerd runs (node 1 first).
pub fn running_nodes(state: &State) -> Vec<Node> {
    (1..=node::MAX_NODES)
        .filter_map(|i| Node::new(i).ok())
        .filter(|n| process::running_pid(state, &n.component("containerd")).is_some())
        .collect()
}

/// Starts the cluster if needed and makes sure it has nodes 1 to `count` (see [`node`]): each extra
/// node that is missing or unhealthy is (re)started. Returns with nodes `count + 1` and up left as
/// they are; [`remove_nodes_above`] takes them away.
pub fn up_with_nodes(count: u8) -> Result<ClusterInfo> {
    let info = up()?;
    let state = State::new();
    let extra: Vec<Node> = Node::first_n(count)?.into_iter().skip(1).collect();
    if extra.iter().all(|n| node_healthy(&state, n)) {
        return Ok(info);
    }
    // Starting a node waits for every other user of the cluster: call this before the process takes
    // its own shared lock ([`up_for_tests`]), or it waits for itself.
    let lock = Lock::exclusive()?;
    for node in &extra {
        ensure_node(&state, node)?;
    }
    drop(lock);
    Ok(info)
}

fn node_healthy(state: &State, node: &Node) -> bool {
    NODE_DAEMONS
        .iter()
        .all(|d| process::running_pid(state, &node.component(d)).is_some())
        && components::node_ready(state, node)
}

/// Starts extra node `node`, after removing what a previous, unhealthy start left.
fn ensure_node(state: &State, node: &Node) -> Result<()> {
    if node_healthy(state, node) {
        return Ok(());
    }
    remove_node(state, node)?;
    start_node(state, node, true)
}

/// Starts `node`'s namespaces (when missing) and daemons; `import` the cached images first.
fn start_node(state: &State, node: &Node, import: bool) -> Result<()> {
    let start = Instant::now();
    eprintln!("==> cluster: starting node {}", node.name());
    let result = (|| -> Result<()> {
        node.create_namespaces(state)?;
        components::start_containerd(state, node)?;
        if import {
            for tar in crate::images::all_tars()? {
                components::import_image_into(state, node, &tar)?;
            }
        }
        components::start_kubelet(state, node)?;
        components::start_kube_proxy(state, node)
    })();
    result.with_context(|| {
        format!(
            "node {} did not start; logs are in {} (`cargo xtask cluster down` removes everything)",
            node.name(),
            state.root.join("logs").display()
        )
    })?;
    eprintln!(
        "==> cluster: node {} up in {:.1}s",
        node.name(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Simulates the loss of extra node `node`, as a power cut: its daemons and every process of its pods
/// are SIGKILLed. Its namespaces, files and Node object stay, so that [`restart_node`] brings the same
/// node back, as a reboot would. Takes no lock (see [`remove_nodes_above`]).
pub fn kill_node(node: &Node) -> Result<()> {
    if node.is_first() {
        bail!("node 1 runs the control plane: only extra nodes can be killed");
    }
    let state = State::new();
    for _ in 0..2 {
        process::terminate(&node.processes(&state), Duration::ZERO);
    }
    if let Some(root) = node.cgroup_root() {
        host::remove_cgroup_tree(root.trim_start_matches('/'));
    }
    Ok(())
}

/// Starts a killed extra node's daemons again on the state it kept (see [`kill_node`]) and waits until
/// it is Ready.
pub fn restart_node(node: &Node) -> Result<()> {
    let state = State::new();
    start_node(&state, node, false)
}

/// Stops extra node `node` (its daemons, then its pods) and removes its Node object and everything it
/// made on the host. Node 1 cannot be removed this way (`down` removes the cluster).
pub fn remove_node(state: &State, node: &Node) -> Result<()> {
    if node.is_first() {
        bail!("node 1 is the cluster itself: use `cargo xtask cluster down`");
    }
    let dir = node.dir(state);
    for _ in 0..2 {
        process::terminate(&node.processes(state), Duration::from_secs(5));
    }
    node.remove_namespaces(state);
    // The Node object: its pods are gone with it (the pod GC deletes pods bound to a missing node).
    let _ = components::kubectl(
        &state.kubeconfig(),
        &[
            "delete",
            "node",
            &node.name(),
            "--ignore-not-found",
            "--wait=false",
        ],
    );
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Removes every extra node above `count`, for a test that added nodes and leaves the cluster with
/// the one node the other tests expect. It takes no lock (the test holds the shared one): only the
/// process that added the nodes may use them.
pub fn remove_nodes_above(count: u8) -> Result<()> {
    let state = State::new();
    for i in (count.max(1) + 1)..=node::MAX_NODES {
        let node = Node::new(i)?;
        if node.dir(&state).exists() {
            remove_node(&state, &node)?;
        }
    }
    Ok(())
}

/// Stops every process of the cluster and removes everything it created (see [`host::clean`]).
/// Safe to run at any time, also when nothing runs.
pub fn down() -> Result<()> {
    let lock = Lock::exclusive()?;
    let state = State::new();
    down_locked(&state)?;
    drop(lock);
    Ok(())
}

fn down_locked(state: &State) -> Result<()> {
    let needle = state.root.to_string_lossy().into_owned();
    // Every daemon, shim and helper names the state directory in its arguments. Two rounds: a dying
    // containerd or kubelet can still spawn a helper.
    for _ in 0..2 {
        let pids = process::pids_mentioning(&needle);
        process::terminate(&pids, Duration::from_secs(5));
    }
    host::clean(state)?;
    if state.root.exists() {
        fs::remove_dir_all(&state.root)
            .with_context(|| format!("removing {}", state.root.display()))?;
    }
    Ok(())
}

/// One line per component: running or not, with pid and resident memory; then the API and node.
pub fn status() -> Result<String> {
    let state = State::new();
    if !state.root.exists() {
        return Ok("the local cluster is not running (no state directory)".to_string());
    }
    let extra: Vec<Node> = (2..=node::MAX_NODES)
        .filter_map(|i| Node::new(i).ok())
        .filter(|n| n.dir(&state).exists())
        .collect();
    let daemons = COMPONENTS
        .iter()
        .filter(|c| **c != "dns")
        .map(|c| c.to_string())
        .chain(
            extra
                .iter()
                .flat_map(|n| NODE_DAEMONS.iter().map(|d| n.component(d))),
        );
    let mut out = String::new();
    let mut total_kib = 0;
    for c in daemons {
        match process::running_pid(&state, &c) {
            Some(pid) => {
                let kib = rss_kib(pid);
                total_kib += kib;
                out += &format!("{c:<24} running  pid {pid:<8} {:>6} MiB\n", kib / 1024);
            }
            None => out += &format!("{c:<24} NOT RUNNING (log: {})\n", state.log(&c).display()),
        }
    }
    for node in &extra {
        let ready = components::node_ready(&state, node);
        out += &format!(
            "node {}: {}\n",
            node.name(),
            if ready { "Ready" } else { "not Ready" }
        );
    }
    let pods_kib = kubepods_memory_kib();
    out += &format!(
        "memory: {} MiB in the cluster's daemons, {} MiB in pods\n",
        total_kib / 1024,
        pods_kib / 1024
    );
    out += &format!(
        "API server {}: {}\nnode {}: {}\n",
        server_url(),
        match components::kubectl(&state.kubeconfig(), &["get", "--raw", "/readyz"]) {
            Ok(s) => s.trim().to_string(),
            Err(e) => format!("{e:#}"),
        },
        layout::NODE_NAME,
        if node_ready(&state) {
            "Ready"
        } else {
            "not Ready"
        }
    );
    Ok(out)
}

/// Resident memory of `pid` in KiB (0 when unknown).
fn rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Memory charged to the pods' cgroup (v1 memory controller), in KiB.
fn kubepods_memory_kib() -> u64 {
    [
        "/sys/fs/cgroup/memory/kubepods/memory.usage_in_bytes",
        "/sys/fs/cgroup/unified/kubepods/memory.current",
    ]
    .iter()
    .find_map(|p| fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
    .map(|b| b / 1024)
    .unwrap_or(0)
}

/// How long `up`/`down` wait for other users of the cluster.
const LOCK_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A `flock` on a file next to the state directory (not inside it: `down` removes the state directory).
struct Lock {
    file: fs::File,
}

impl Lock {
    fn path() -> PathBuf {
        let state = layout::state_dir();
        state.with_file_name(format!(
            "{}.lock",
            state.file_name().unwrap_or_default().to_string_lossy()
        ))
    }

    fn exclusive() -> Result<Self> {
        Self::take(libc::LOCK_EX)
    }

    fn shared() -> Result<Self> {
        Self::take(libc::LOCK_SH)
    }

    fn take(mode: i32) -> Result<Self> {
        let path = Self::path();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if flock(&file, mode | libc::LOCK_NB) {
            return Ok(Self { file });
        }
        eprintln!(
            "==> cluster: waiting for {} (another `up`/`down`, or tests using the cluster)",
            path.display()
        );
        // Bounded, so that a test waiting behind a hung process fails instead of hanging CI.
        let deadline = Instant::now() + LOCK_TIMEOUT;
        while !flock(&file, mode | libc::LOCK_NB) {
            if Instant::now() > deadline {
                bail!(
                    "waited {LOCK_TIMEOUT:?} for {} (`lslocks` shows which processes hold it)",
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(Self { file })
    }

    fn downgrade_to_shared(&self) -> Result<()> {
        if !flock(&self.file, libc::LOCK_SH) {
            bail!(
                "downgrading the cluster lock: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }
}

fn flock(file: &fs::File, op: i32) -> bool {
    // SAFETY: flock on a file descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), op) == 0 }
}
