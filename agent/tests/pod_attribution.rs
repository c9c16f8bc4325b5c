//! Kernel test: events are attributed to pods the way the kubelet lays them out, from the socket's network
//! namespace (a pod with its own network) or cgroup (a hostNetwork pod). The test builds a kubelet-style
//! cgroup tree (`<cgroup2>/ne-test-*/kubepods/besteffort/pod<UID>/<container>`), moves real processes into
//! it, and has them connect. Needs root (CI runs as root). Cgroups and namespaces are removed on drop.

mod support;

use network_enforcer_agent::LoadOptions;
use network_enforcer_agent::identity::attribution::{Attributor, Owner, PodRef};
use network_enforcer_agent::identity::pod_identity::Scanner;
use network_enforcer_agent::kernel::host::{NodeCgroups, cgroup2_root};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{PodPair, collect, load};

const POD_UID: &str = "0f0e0d0c-0b0a-4909-8807-060504030201";
const HOST_NETWORK_POD_UID: &str = "1f1e1d1c-1b1a-4919-8817-161514131211";

/// A kubelet-style cgroup tree for two pods, removed (deepest first) on drop.
struct FakeKubepods {
    top: PathBuf,
    containers: Vec<PathBuf>,
}

impl FakeKubepods {
    fn new() -> Self {
        let top = cgroup2_root()
            .unwrap()
            .join(format!("ne-test-{}", std::process::id()));
        let containers: Vec<PathBuf> = [POD_UID, HOST_NETWORK_POD_UID]
            .iter()
            .map(|uid| top.join(format!("kubepods/besteffort/pod{uid}/ctr")))
            .collect();
        for c in &containers {
            std::fs::create_dir_all(c).unwrap();
        }
        Self { top, containers }
    }

    /// Moves a process into a container cgroup.
    fn enter(&self, container: usize, pid: u32) {
        std::fs::write(
            self.containers[container].join("cgroup.procs"),
            pid.to_string(),
        )
        .unwrap();
    }

    fn cgroup_id(&self, container: usize) -> u64 {
        std::fs::metadata(&self.containers[container])
            .unwrap()
            .ino()
    }
}

impl Drop for FakeKubepods {
    fn drop(&mut self) {
        // rmdir only works on empty cgroups, leaves first.
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&e.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.top);
    }
}

/// A shell that connects to `target` (with bash's /dev/tcp) when it reads a line, then waits for
/// another line (or end of input) before exiting.
fn connecting_shell(netns: Option<&str>, target: SocketAddr) -> Child {
    let script = format!(
        "read go; exec 3<>/dev/tcp/{}/{}; read done",
        target.ip(),
        target.port()
    );
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "bash", "-c", &script]);
            c
        }
        None => {
            let mut c = Command::new("bash");
            c.args(["-c", &script]);
            c
        }
    };
    cmd.stdin(Stdio::piped()).spawn().unwrap()
}

/// Ends the shells and waits for them, so their cgroups are empty before they are removed.
struct Shells(Vec<Child>);

impl Drop for Shells {
    fn drop(&mut self) {
        for child in &mut self.0 {
            drop(child.stdin.take());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn events_are_attributed_to_pods_by_namespace_or_host_network_cgroup() {
    let (_data_plane, mut reader) = load(&LoadOptions::default());
    let pods = PodPair::new(); // a: a pod with its own network; b: not a pod (no pod process in it)
    let kubepods = FakeKubepods::new();

    let server: SocketAddr = (pods.v4(2), 8080).into();
    let pod_listener = pods.b.run(move || TcpListener::bind(server).unwrap());
    let host_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host_server = host_listener.local_addr().unwrap();
    let mut shells = Shells(vec![
        connecting_shell(Some(&pods.a.name), server),
        connecting_shell(None, host_server),
    ]);
    for (container, child) in shells.0.iter().enumerate() {
        kubepods.enter(container, child.id());
    }
    // `ip netns exec` enters the namespace before it runs bash: wait until the shell is in it.
    let a_ns = pods.a.inode();
    let pid = shells.0[0].id();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .map(|m| m.ino() as u32)
        .ok()
        != Some(a_ns)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the shell never entered its namespace"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // As in production: a scan feeds the attribution state, which resolves each event.
    let attributor = Arc::new(Mutex::new(Attributor::default()));
    let node = NodeCgroups {
        mount: cgroup2_root().unwrap(),
        pods: None,
    };
    Scanner::new(node, attributor.clone()).scan().unwrap();
    for child in &mut shells.0 {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    pod_listener.accept().unwrap();
    host_listener.accept().unwrap();

    let events = collect(&mut reader, 4, |e| {
        e.remote == server || e.local == server || e.remote == host_server || e.local == host_server
    })
    .await;
    assert_eq!(events.len(), 4, "{events:#?}");
    let attributed = |local_is_server: bool, server: SocketAddr| {
        let e = events
            .iter()
            .find(|e| {
                if local_is_server {
                    e.local == server
                } else {
                    e.remote == server
                }
            })
            .unwrap();
        attributor
            .lock()
            .unwrap()
            .resolve(e.netns_ino, e.cgroup_id, e.local.ip(), e.monotonic)
    };

    // The pod's outbound connection: by its network namespace.
    assert_eq!(
        attributed(false, server),
        Owner::Pod(PodRef {
            uid: POD_UID.into(),
            name: None,
            host_network: false
        })
    );
    // The hostNetwork pod's outbound connection: host namespace, but the pod's cgroup.
    let host_pod_event = events.iter().find(|e| e.remote == host_server).unwrap();
    assert_eq!(host_pod_event.cgroup_id, Some(kubepods.cgroup_id(1)));
    assert_eq!(
        attributed(false, host_server),
        Owner::Pod(PodRef {
            uid: HOST_NETWORK_POD_UID.into(),
            name: None,
            host_network: true
        })
    );
    // The server in a namespace no pod lives in: unknown, not guessed.
    assert_eq!(attributed(true, server), Owner::Unknown);
    // The test process itself listens in the host namespace, outside any pod cgroup: the host.
    assert_eq!(attributed(true, host_server), Owner::Host);
    drop(shells);
}
