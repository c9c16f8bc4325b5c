//! Kernel test: the real eBPF programs on this machine's kernel see TCP connections made over loopback.
//!
//! Needs root (CI runs as root). Each test loads its own copy of the programs, makes its own connections
//! and looks only at events for the ports it used, so other traffic on the machine does not disturb it.
//! Each runs with both hooks of the TCP program ([`TcpHook`]): they must report the same events.

use network_enforcer_agent::{
    ConnectionEvent, DataPlane, Direction, EventReader, LoadOptions, Outcome, Protocol, Switch,
    TcpHook,
};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

/// The inode of this process's network namespace, as the kernel reports it.
fn own_netns() -> u32 {
    std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32
}

/// The cgroup v2 id of this process: the inode of its cgroup directory in the cgroup2 file system.
fn own_cgroup_id() -> u64 {
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

/// Fails the test with a clear message when not root: these tests load eBPF programs.
fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this kernel test loads eBPF programs and must run as root (uid 0); it runs as uid {uid}. \
         Run `sudo -E cargo test -p network-enforcer-agent` (CI runs as root)."
    );
}

/// Both hooks; this machine's kernel takes the typed one (no fallback is accepted here).
const HOOKS: [TcpHook; 2] = [TcpHook::Typed, TcpHook::Raw];

fn load(tcp_hook: TcpHook) -> (DataPlane, EventReader) {
    require_root();
    // Processes named: these tests check them.
    let mut data_plane = DataPlane::load(&LoadOptions {
        connection_pids: true,
        tcp_hook,
        ..LoadOptions::default()
    })
    .expect("loading the eBPF programs");
    assert_eq!(data_plane.tcp_hook(), tcp_hook, "the TCP program's hook");
    let reader = data_plane.events().expect("taking the events reader");
    (data_plane, reader)
}

/// Reads events until `wanted` of them touch `port` (as local or remote port), or fails after 5 s.
async fn events_for_port(
    reader: &mut EventReader,
    port: u16,
    wanted: usize,
) -> Vec<ConnectionEvent> {
    let mut seen = Vec::new();
    let mut batch = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen.len() < wanted {
        let read = tokio::time::timeout_at(deadline, reader.read_batch(&mut batch)).await;
        match read {
            Ok(result) => result.expect("reading events"),
            Err(_) => panic!(
                "timed out waiting for {wanted} events on port {port}; saw {}: {seen:#?}",
                seen.len()
            ),
        }
        seen.extend(
            batch
                .drain(..)
                .filter(|e| e.local.port() == port || e.remote.port() == port),
        );
    }
    // Give stray duplicates a moment to show up, so "exactly these events" is really checked.
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(Ok(())) =
        tokio::time::timeout(Duration::from_millis(50), reader.read_batch(&mut batch)).await
    {
        seen.extend(
            batch
                .drain(..)
                .filter(|e| e.local.port() == port || e.remote.port() == port),
        );
    }
    seen
}

/// Connects a client bound to `client_ip` to a listener on `server_ip`, and checks the two events:
/// the client's outbound establishment and the server's inbound one, with exact addresses and ports.
async fn sees_both_ends_of_a_connection(server_ip: &str, client_ip: &str) {
    for hook in HOOKS {
        sees_both_ends_with(hook, server_ip, client_ip).await;
    }
}

async fn sees_both_ends_with(hook: TcpHook, server_ip: &str, client_ip: &str) {
    let (_data_plane, mut reader) = load(hook);
    let listener = TcpListener::bind((server_ip, 0)).await.unwrap();
    let server: SocketAddr = listener.local_addr().unwrap();

    let socket = if server.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .unwrap();
    socket
        .bind((client_ip.parse::<std::net::IpAddr>().unwrap(), 0).into())
        .unwrap();
    let client: SocketAddr = socket.local_addr().unwrap();
    let (stream, accepted) = tokio::join!(socket.connect(server), listener.accept());
    let (_stream, _accepted) = (stream.unwrap(), accepted.unwrap());

    let mut events = events_for_port(&mut reader, server.port(), 2).await;
    events.sort_by_key(|e| e.direction);
    assert_eq!(
        events.len(),
        2,
        "{hook:?}: exactly one event per end: {events:#?}"
    );

    let outbound = &events[0];
    assert_eq!(
        (outbound.protocol, outbound.direction, outbound.outcome),
        (Protocol::Tcp, Direction::Outbound, Outcome::Established)
    );
    assert_eq!(
        (outbound.local, outbound.remote),
        (client, server),
        "{hook:?}"
    );
    assert_eq!(
        outbound.pid,
        Some(std::process::id()),
        "pid captured at connect()"
    );
    assert_eq!(outbound.error, None);
    assert_eq!(outbound.netns_ino, Some(own_netns()), "{hook:?}");
    assert_eq!(outbound.cgroup_id, Some(own_cgroup_id()), "{hook:?}");
    assert_eq!(outbound.count, 1);

    let inbound = &events[1];
    assert_eq!(
        (inbound.protocol, inbound.direction, inbound.outcome),
        (Protocol::Tcp, Direction::Inbound, Outcome::Established)
    );
    assert_eq!(
        (inbound.local, inbound.remote),
        (server, client),
        "{hook:?}"
    );
    assert_eq!(inbound.error, None);
    // The accepted socket carries the listener's namespace and cgroup (ours), not the softirq's task.
    assert_eq!(inbound.netns_ino, Some(own_netns()), "{hook:?}");
    assert_eq!(inbound.cgroup_id, Some(own_cgroup_id()), "{hook:?}");
}

#[tokio::test]
async fn sees_both_ends_of_an_ipv4_loopback_connection() {
    // Distinct loopback addresses for client and server, so swapped fields would show.
    sees_both_ends_of_a_connection("127.0.0.1", "127.0.0.2").await;
}

#[tokio::test]
async fn sees_both_ends_of_an_ipv6_loopback_connection() {
    sees_both_ends_of_a_connection("::1", "::1").await;
}

/// A connect to a closed port on `ip` is one failed outbound attempt, with ECONNREFUSED.
async fn reports_a_refused_connect_as_failed(ip: &str) {
    for hook in HOOKS {
        reports_refused_with(hook, ip).await;
    }
}

async fn reports_refused_with(hook: TcpHook, ip: &str) {
    let (_data_plane, mut reader) = load(hook);
    // A port nobody listens on: bind a listener to get a free port, then close it.
    let closed: SocketAddr = {
        let l = std::net::TcpListener::bind((ip, 0)).unwrap();
        l.local_addr().unwrap()
    };
    let socket = if closed.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .unwrap();
    socket.bind((closed.ip(), 0).into()).unwrap();
    let client = socket.local_addr().unwrap();
    let err = socket.connect(closed).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);

    let events = events_for_port(&mut reader, closed.port(), 1).await;
    assert_eq!(events.len(), 1, "{hook:?}: one failed attempt: {events:#?}");
    let failed = &events[0];
    assert_eq!(
        (failed.protocol, failed.direction, failed.outcome),
        (Protocol::Tcp, Direction::Outbound, Outcome::Failed)
    );
    assert_eq!((failed.local, failed.remote), (client, closed), "{hook:?}");
    assert_eq!(failed.pid, Some(std::process::id()));
    assert_eq!(
        failed.error,
        Some(libc::ECONNREFUSED as u8),
        "refused, not timed out"
    );
    assert_eq!(failed.netns_ino, Some(own_netns()), "{hook:?}");
    assert_eq!(failed.cgroup_id, Some(own_cgroup_id()), "{hook:?}");
}

#[tokio::test]
async fn reports_a_refused_ipv4_connect_as_failed() {
    reports_a_refused_connect_as_failed("127.0.0.1").await;
}

#[tokio::test]
async fn reports_a_refused_ipv6_connect_as_failed() {
    reports_a_refused_connect_as_failed("::1").await;
}

/// The process inside `connect()` is noted only while asked ([`Switch::ConnectionPids`]; the agent's
/// `run` asks only while its debug API has a client): otherwise nothing goes into the `connecting`
/// map, which is a quarter of the TCP program's time per connection.
#[tokio::test]
async fn the_connecting_process_is_named_only_while_asked() {
    require_root();
    let mut data_plane = DataPlane::load(&LoadOptions {
        connection_pids: false,
        ..LoadOptions::default()
    })
    .expect("loading the eBPF programs");
    let mut reader = data_plane.events().expect("taking the events reader");
    // One connection to a listener of its own (a new edge each time, whatever the dedupe): the
    // process its outbound event names.
    async fn connection_names(reader: &mut EventReader) -> Option<u32> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let (stream, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(server), listener.accept());
        let (_stream, _accepted) = (stream.unwrap(), accepted.unwrap());
        let events = events_for_port(reader, server.port(), 2).await;
        let outbound: Vec<_> = events
            .iter()
            .filter(|e| e.direction == Direction::Outbound)
            .collect();
        assert_eq!(outbound.len(), 1, "{events:#?}");
        outbound[0].pid
    }

    assert_eq!(connection_names(&mut reader).await, None, "not asked");
    assert_eq!(
        data_plane.counters().unwrap().connecting_inserted,
        0,
        "nothing noted while not asked"
    );
    data_plane
        .switches()
        .set(Switch::ConnectionPids, true)
        .unwrap();
    assert_eq!(
        connection_names(&mut reader).await,
        Some(std::process::id()),
        "asked while the programs run"
    );
    assert!(data_plane.counters().unwrap().connecting_inserted >= 1);
    data_plane
        .switches()
        .set(Switch::ConnectionPids, false)
        .unwrap();
    assert_eq!(connection_names(&mut reader).await, None, "no longer asked");
}
