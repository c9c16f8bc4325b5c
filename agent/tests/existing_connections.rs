//! Kernel test: connections open before the agent started are found by the start-up socket scan (the
//! real BPF iterator over every open file on this machine) and become the same edges, with the same
//! direction and attribution, as the live programs report for connections made after it started.
//!
//! Two network namespaces joined by a veth pair stand in for pods. Before the agent loads: a TCP
//! connection over IPv4 and one over IPv6 from pod a to servers in pod b, and a connected UDP socket in
//! a talking to a UDP server in b that answers on a socket connected back to a (as QUIC servers do).
//! Needs root (CI runs as root). Only events of the test's own namespaces are looked at.

mod support;

use network_enforcer_agent::aggregate::EdgeKey;
use network_enforcer_agent::clock::monotonic_now;
use network_enforcer_agent::identity::attribution::{Attributor, Owner, PodInfo};
use network_enforcer_agent::kernel::existing;
use network_enforcer_agent::pipeline::{EdgeCaps, Pipeline};
use network_enforcer_agent::{ConnectionEvent, Direction, LoadOptions, Outcome, Protocol};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::FromRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{PodPair, collect, load, own_cgroup_id};

/// A UDP socket bound to `bind` with SO_REUSEPORT (so a server can bind a second socket to its port
/// and connect it to one peer), connected to `peer` when given.
fn udp_reuseport(bind: SocketAddr, peer: Option<SocketAddr>) -> UdpSocket {
    // SAFETY: plain socket calls on a descriptor this function owns; the pointer and length passed to
    // setsockopt describe a live c_int.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        let rc = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "SO_REUSEPORT: {}", std::io::Error::last_os_error());
        fd
    };
    // SAFETY: `fd` is a fresh UDP socket owned by nobody else.
    let socket = unsafe { UdpSocket::from_raw_fd(fd) };
    let socket = bind_v4(socket, bind);
    if let Some(peer) = peer {
        socket.connect(peer).unwrap();
    }
    socket
}

/// Binds `socket` to an IPv4 address (std has no bind for an existing socket).
fn bind_v4(socket: UdpSocket, bind: SocketAddr) -> UdpSocket {
    use std::os::fd::AsRawFd;
    let SocketAddr::V4(v4) = bind else {
        panic!("IPv4 only: {bind}")
    };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(v4.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: the pointer and length describe a live sockaddr_in.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "bind {bind}: {}", std::io::Error::last_os_error());
    socket
}

/// The sockets of the scenario, kept open for the test's length.
struct Scenario {
    pods: PodPair,
    tcp4_server: SocketAddr,
    tcp6_server: SocketAddr,
    udp_server: SocketAddr,
    tcp4_client: SocketAddr,
    tcp6_client: SocketAddr,
    udp_client: SocketAddr,
    _sockets: Vec<Box<dyn std::any::Any + Send>>,
}

/// Opens the connections (before any agent runs).
fn open_connections() -> Scenario {
    let pods = PodPair::new();
    let tcp4_server: SocketAddr = (pods.v4(2), 8080).into();
    let tcp6_server: SocketAddr = (pods.v6(2), 8443).into();
    let udp_server: SocketAddr = (pods.v4(2), 5300).into();
    let (l4, l6, udp_bound) = pods.b.run(move || {
        (
            TcpListener::bind(tcp4_server).unwrap(),
            TcpListener::bind(tcp6_server).unwrap(),
            udp_reuseport(udp_server, None),
        )
    });
    let udp_bind: SocketAddr = (pods.v4(1), 0).into();
    let (c4, c6, udp_c) = pods.a.run(move || {
        let udp = UdpSocket::bind(udp_bind).unwrap();
        udp.connect(udp_server).unwrap();
        udp.send(b"hello").unwrap();
        (
            TcpStream::connect(tcp4_server).unwrap(),
            TcpStream::connect(tcp6_server).unwrap(),
            udp,
        )
    });
    let (a4, _) = l4.accept().unwrap();
    let (a6, _) = l6.accept().unwrap();
    let mut buf = [0u8; 16];
    let (_, from) = udp_bound.recv_from(&mut buf).unwrap();
    // The server answers this peer on its own socket, connected to it.
    let udp_per_peer = pods.b.run(move || udp_reuseport(udp_server, Some(from)));
    let (tcp4_client, tcp6_client, udp_client) = (
        c4.local_addr().unwrap(),
        c6.local_addr().unwrap(),
        udp_c.local_addr().unwrap(),
    );
    assert_eq!(from, udp_client);
    Scenario {
        pods,
        tcp4_server,
        tcp6_server,
        udp_server,
        tcp4_client,
        tcp6_client,
        udp_client,
        _sockets: vec![
            Box::new(l4),
            Box::new(l6),
            Box::new(udp_bound),
            Box::new(c4),
            Box::new(c6),
            Box::new(udp_c),
            Box::new(a4),
            Box::new(a6),
            Box::new(udp_per_peer),
        ],
    }
}

type Shape = (u32, Protocol, Direction, Outcome, SocketAddr, SocketAddr);

fn shape(e: &ConnectionEvent) -> Shape {
    (
        e.netns_ino.unwrap_or(0),
        e.protocol,
        e.direction,
        e.outcome,
        e.local,
        e.remote,
    )
}

/// The scan's events of the two pods, sorted.
fn scanned(s: &Scenario) -> Vec<ConnectionEvent> {
    let scan = existing::scan(existing::DEFAULT_MAX_SOCKETS).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        scan.sockets >= 9,
        "the scan read {} sockets; this test alone holds 9",
        scan.sockets
    );
    eprintln!(
        "scan: {} sockets read, {} connections on this machine, {:?}",
        scan.sockets,
        scan.events.len(),
        scan.elapsed
    );
    let (ns_a, ns_b) = (s.pods.a.inode(), s.pods.b.inode());
    let mut events: Vec<ConnectionEvent> = scan
        .events
        .into_iter()
        .filter(|e| e.netns_ino == Some(ns_a) || e.netns_ino == Some(ns_b))
        .collect();
    events.sort_by_key(shape);
    events
}

#[tokio::test]
async fn connections_open_before_the_agent_are_scanned_with_their_direction() {
    let s = open_connections();
    // The agent starts now: its live programs do not see these connections.
    let (_data_plane, _reader) = load(&LoadOptions::default());
    let started = std::time::Instant::now();
    let events = scanned(&s);
    let took = started.elapsed();
    eprintln!("scan took {took:?}");

    let (ns_a, ns_b) = (s.pods.a.inode(), s.pods.b.inode());
    use Direction::*;
    use Outcome::*;
    use Protocol::*;
    let mut expected: Vec<Shape> = vec![
        // Pod a: the client of each connection.
        (
            ns_a,
            Tcp,
            Outbound,
            Established,
            s.tcp4_client,
            s.tcp4_server,
        ),
        (
            ns_a,
            Tcp,
            Outbound,
            Established,
            s.tcp6_client,
            s.tcp6_server,
        ),
        (ns_a, Udp, Outbound, Datagram, s.udp_client, s.udp_server),
        // Pod b: the server side, its local port a listening (or bound) one in its namespace. The bound,
        // unconnected UDP socket has no peer and is no edge.
        (
            ns_b,
            Tcp,
            Inbound,
            Established,
            s.tcp4_server,
            s.tcp4_client,
        ),
        (
            ns_b,
            Tcp,
            Inbound,
            Established,
            s.tcp6_server,
            s.tcp6_client,
        ),
        (ns_b, Udp, Inbound, Datagram, s.udp_server, s.udp_client),
    ];
    expected.sort();
    let got: Vec<Shape> = events.iter().map(shape).collect();
    assert_eq!(got, expected, "{events:#?}");
    for e in &events {
        assert_eq!(e.cgroup_id, Some(own_cgroup_id()), "{e:?}");
        assert_eq!(e.count, 1, "{e:?}");
        let want_pid = !(e.protocol == Tcp && e.direction == Inbound);
        assert_eq!(
            e.pid.is_some(),
            want_pid,
            "pid as live events have it: {e:?}"
        );
        if let Some(pid) = e.pid {
            assert_eq!(pid, std::process::id());
        }
    }
    assert!(
        took < Duration::from_secs(10),
        "the scan took {took:?} on this machine"
    );
}

/// Pod A and pod B, known by their network namespaces (as the /proc scan would report them).
fn attributor(s: &Scenario) -> Arc<Mutex<Attributor>> {
    let host = std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32;
    let mut at = Attributor::default();
    for (uid, name) in [("uid-a", "a"), ("uid-b", "b")] {
        at.apply(
            PodInfo {
                uid: uid.into(),
                namespace: "shop".into(),
                name: name.into(),
                ips: vec![],
                host_network: false,
            },
            monotonic_now(),
        );
    }
    at.observe_scan(
        host,
        [(s.pods.a.inode(), "uid-a"), (s.pods.b.inode(), "uid-b")],
        [],
        monotonic_now(),
    );
    Arc::new(Mutex::new(at))
}

#[tokio::test]
async fn a_scanned_connection_and_a_live_one_of_the_same_kind_are_one_edge_of_the_same_pod() {
    let s = open_connections();
    let (_data_plane, mut reader) = load(&LoadOptions::default());
    let old = scanned(&s);
    // The same kinds of connection again, now that the live programs run.
    let (tcp4_server, udp_server) = (s.tcp4_server, s.udp_server);
    let udp_bind: SocketAddr = (s.pods.v4(1), 0).into();
    let _new = s.pods.a.run(move || {
        let udp = UdpSocket::bind(udp_bind).unwrap();
        udp.connect(udp_server).unwrap();
        (TcpStream::connect(tcp4_server).unwrap(), udp)
    });
    let (ns_a, ns_b) = (s.pods.a.inode(), s.pods.b.inode());
    let live = collect(&mut reader, 3, |e| {
        (e.netns_ino == Some(ns_a) || e.netns_ino == Some(ns_b))
            && (e.local.port() == 8080 || e.remote.port() == 8080 || e.remote.port() == 5300)
    })
    .await;
    assert_eq!(live.len(), 3, "TCP at both ends, UDP connect: {live:#?}");

    // Each live edge is an edge the scan reported already: same pod, peer, port, direction, outcome.
    let old_keys: Vec<EdgeKey> = old.iter().map(EdgeKey::of).collect();
    for e in &live {
        assert!(
            old_keys.contains(&EdgeKey::of(e)),
            "live {:?} is no scanned edge: {old_keys:#?}",
            EdgeKey::of(e)
        );
    }

    // Through the agent's pipeline: the scan's events first (at start), then the live ones.
    let mut pipeline = Pipeline::new(attributor(&s), EdgeCaps::default());
    pipeline.take_in(&old).unwrap();
    pipeline.take_in(&live).unwrap();
    let flushed = pipeline.flush().unwrap();
    let mut edges: Vec<(String, Protocol, Direction, u16, u64)> = flushed
        .edges
        .iter()
        .map(|(edge, owner)| {
            let pod = match owner {
                Owner::Pod(p) => p.label(),
                other => format!("{other:?}"),
            };
            (
                pod,
                edge.key.protocol,
                edge.key.direction,
                edge.key.port,
                edge.stats.count,
            )
        })
        .collect();
    edges.sort();
    use Direction::*;
    use Protocol::*;
    assert_eq!(
        edges,
        [
            ("shop/a".to_string(), Tcp, Outbound, 8080, 2),
            ("shop/a".to_string(), Tcp, Outbound, 8443, 1),
            ("shop/a".to_string(), Udp, Outbound, 5300, 2),
            ("shop/b".to_string(), Tcp, Inbound, 8080, 2),
            ("shop/b".to_string(), Tcp, Inbound, 8443, 1),
            ("shop/b".to_string(), Udp, Inbound, 5300, 1),
        ],
        "one edge per kind, owned by its pod; the scanned and the live connection counted together"
    );
    assert_eq!(flushed.unattributed, 0);
}

/// The agent binary: `run` reports a connection open before it started, once, at both ends, without
/// any new traffic (read back through `flows --since`, the agent's recent-records buffer, and its
/// metrics).
#[tokio::test]
async fn the_agent_reports_connections_open_before_it_started() {
    support::require_root();
    let s = open_connections();
    let dir = std::env::temp_dir().join(format!("ne-existing-{}", std::process::id()));
    let socket = dir.join("agent.sock");
    let metrics_address = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let agent = || std::process::Command::new(env!("CARGO_BIN_EXE_network-enforcer-agent"));
    // Stops the agent even if an assertion fails.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill with the pid of our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let mut run = Stop(
        agent()
            .env("RUST_LOG", "warn")
            .args(["run", "--flush-seconds", "1", "--debug-socket"])
            .arg(&socket)
            .arg("--metrics-address")
            .arg(metrics_address.to_string())
            .spawn()
            .unwrap(),
    );
    let ips = [s.pods.v4(1).to_string(), s.pods.v4(2).to_string()];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let flows = loop {
        assert!(
            run.0.try_wait().unwrap().is_none(),
            "the agent exited early"
        );
        if socket.exists() {
            let out = agent()
                .args(["flows", "--since", "5m", "-o", "json", "--port", "8080"])
                .arg("--socket")
                .arg(&socket)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let mut flows: Vec<(String, String, String, u64)> = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|f| ips.contains(&f["peer_ip"].as_str().unwrap_or("").to_string()))
                .map(|f| {
                    let text = |k: &str| f[k].as_str().unwrap_or("").to_string();
                    (
                        text("local_ip"),
                        text("direction"),
                        text("outcome"),
                        f["count"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            flows.sort();
            if flows.len() >= 2 {
                break flows;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no edges of the connections opened before the agent after 20 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        flows,
        [
            (
                ips[0].clone(),
                "outbound".to_string(),
                "established".to_string(),
                1
            ),
            (
                ips[1].clone(),
                "inbound".to_string(),
                "established".to_string(),
                1
            ),
        ]
    );
    let metric = |name: &str| -> u64 {
        use std::io::{Read, Write};
        let mut stream = TcpStream::connect(metrics_address).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{response}"))
    };
    assert!(metric("network_enforcer_agent_existing_sockets_scanned_total") >= 9);
    assert!(metric("network_enforcer_agent_existing_connections_total") >= 6);
    assert_eq!(
        metric("network_enforcer_agent_existing_scan_failures_total"),
        0
    );
    drop(run);
    let _ = std::fs::remove_dir_all(&dir);
}
