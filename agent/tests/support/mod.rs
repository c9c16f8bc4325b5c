//! Shared helpers of the kernel tests: root check, loading the programs, reading the events of one test,
//! and network namespaces joined by veth pairs standing in for pods.
//!
//! Every namespace and interface is named after this process and a counter, so tests running in parallel
//! (and other test binaries) do not collide, and is removed by `Drop`, which also runs when a test panics.

#![allow(dead_code)] // each test file uses a different subset

pub mod dns_world;

use network_enforcer_agent::{ConnectionEvent, DataPlane, EventReader, LoadOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Fails the test with a clear message when not root: these tests load eBPF programs and create
/// network namespaces.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this kernel test loads eBPF programs and creates network namespaces: it must run as root \
         (uid 0), it runs as uid {uid}. Run it as root (CI does), e.g. `sudo -E cargo test -p \
         network-enforcer-agent`."
    );
}

/// Loads the programs with `options` and takes the event reader.
pub fn load(options: &LoadOptions) -> (DataPlane, EventReader) {
    require_root();
    let mut data_plane = DataPlane::load(options).expect("loading the eBPF programs");
    let reader = data_plane.events().expect("taking the events reader");
    (data_plane, reader)
}

/// Reads events until `wanted` of them match `keep`, then keeps reading for a short grace period so
/// that unexpected extra events are caught too. Fails after 10 s.
pub async fn collect(
    reader: &mut EventReader,
    wanted: usize,
    keep: impl Fn(&ConnectionEvent) -> bool,
) -> Vec<ConnectionEvent> {
    let mut seen = Vec::new();
    let mut batch = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < wanted {
        match tokio::time::timeout_at(deadline, reader.read_batch(&mut batch)).await {
            Ok(result) => result.expect("reading events"),
            Err(_) => panic!(
                "timed out waiting for {wanted} events; saw {}: {seen:#?}",
                seen.len()
            ),
        }
        seen.extend(batch.drain(..).filter(|e| keep(e)));
    }
    let grace = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Ok(())) = tokio::time::timeout_at(grace, reader.read_batch(&mut batch)).await {
        seen.extend(batch.drain(..).filter(|e| keep(e)));
    }
    seen
}

/// Runs `cmd args...`, failing the test with its output when it fails.
pub fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("could not run {cmd}: {e} (is iproute2/nftables installed?)"));
    assert!(
        out.status.success(),
        "{cmd} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// A unique short tag for names: interface names are limited to 15 bytes.
fn unique_tag() -> String {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{n:x}", std::process::id() & 0xfffff)
}

/// A network namespace standing in for a pod: `ip netns add`, loopback up, removed on drop.
pub struct Netns {
    /// The name under /run/netns.
    pub name: String,
}

impl Netns {
    /// Creates a fresh namespace.
    pub fn new() -> Self {
        require_root();
        let name = format!("ne-test-{}", unique_tag());
        sh("ip", &["netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `ip -n <ns> args...`.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        sh("ip", &all);
    }

    /// The namespace's inode number, as the kernel reports it in events (and in /proc/PID/ns/net).
    pub fn inode(&self) -> u32 {
        std::fs::metadata(format!("/run/netns/{}", self.name))
            .unwrap()
            .ino() as u32
    }

    /// Runs `f` on a thread that has entered this namespace: sockets it creates live in the namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on a valid namespace fd only changes this thread's network namespace.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Like [`Netns::run`], but returns at once; join the handle for the result.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            // SAFETY: as in `run`.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace also deletes the veth ends inside it (and so their peers).
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Two "pods" joined by a veth pair, with IPv4 `10.201.<n>.1/.2` and IPv6 `fd00:201:<n>::1/::2`.
pub struct PodPair {
    /// The first pod (`.1`).
    pub a: Netns,
    /// The second pod (`.2`).
    pub b: Netns,
    /// The subnet number `<n>`.
    pub subnet: u32,
}

impl PodPair {
    /// Creates both namespaces and the link between them, ready for traffic.
    pub fn new() -> Self {
        let a = Netns::new();
        let b = Netns::new();
        // Any subnet works (each pair is isolated from the host and from other pairs); a distinct one per
        // pair only makes failure messages easier to read.
        let subnet = NEXT_ID.fetch_add(1, Ordering::Relaxed) % 250;
        link(
            &a,
            &b,
            &format!("10.201.{subnet}"),
            &format!("fd00:201:{subnet}:"),
        );
        Self { a, b, subnet }
    }

    /// The IPv4 address of host `.host` (1 = a, 2 = b).
    pub fn v4(&self, host: u8) -> std::net::IpAddr {
        format!("10.201.{}.{host}", self.subnet).parse().unwrap()
    }

    /// The IPv6 address of host `::host` (1 = a, 2 = b).
    pub fn v6(&self, host: u8) -> std::net::IpAddr {
        format!("fd00:201:{}::{host}", self.subnet).parse().unwrap()
    }
}

/// Joins two namespaces with a veth pair: `a` gets `<v4_prefix>.1/24` and `<v6_prefix>:1/64`, `b` gets
/// `.2` and `:2` (e.g. prefixes `10.201.3` and `fd00:201:3:`). The link goes away with either namespace.
pub fn link(a: &Netns, b: &Netns, v4_prefix: &str, v6_prefix: &str) {
    let tag = unique_tag();
    let (va, vb) = (format!("nea{tag}"), format!("neb{tag}"));
    sh(
        "ip",
        &[
            "link", "add", &va, "netns", &a.name, "type", "veth", "peer", "name", &vb, "netns",
            &b.name,
        ],
    );
    for (ns, dev, host) in [(a, &va, 1), (b, &vb, 2)] {
        ns.ip(&["addr", "add", &format!("{v4_prefix}.{host}/24"), "dev", dev]);
        ns.ip(&[
            "addr",
            "add",
            &format!("{v6_prefix}:{host}/64"),
            "dev",
            dev,
            "nodad", // usable at once, no duplicate address detection delay
        ]);
        ns.ip(&["link", "set", dev, "up"]);
    }
}

/// The cgroup v2 id of this process (its threads in the namespaces stay in its cgroup): the inode of
/// its cgroup directory in the cgroup2 file system.
pub fn own_cgroup_id() -> u64 {
    let root = network_enforcer_agent::kernel::host::cgroup2_root().unwrap();
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 entry in /proc/self/cgroup");
    std::fs::metadata(root.join(path.trim_start_matches('/')))
        .unwrap()
        .ino()
}

/// A DNS query for the A records of `name`, as a stub resolver sends it.
pub fn dns_query(id: u16, name: &str) -> Vec<u8> {
    use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, TYPE};
    let mut packet = Packet::new_query(id);
    packet.questions.push(Question::new(
        Name::new_unchecked(name),
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    packet.build_bytes_vec().unwrap()
}

/// The answer to [`dns_query`] `id` for `name`: `addresses` as A records with `ttl`.
pub fn dns_answer(id: u16, name: &str, addresses: &[std::net::Ipv4Addr], ttl: u32) -> Vec<u8> {
    use simple_dns::rdata::{A, RData};
    use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, ResourceRecord, TYPE};
    let mut packet = Packet::new_reply(id);
    packet.questions.push(Question::new(
        Name::new_unchecked(name),
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    for address in addresses {
        packet.answers.push(ResourceRecord::new(
            Name::new_unchecked(name),
            CLASS::IN,
            ttl,
            RData::A(A {
                address: u32::from(*address),
            }),
        ));
    }
    packet.build_bytes_vec().unwrap()
}
