//! Kernel tests with network namespaces as pods: real TCP and UDP traffic between two namespaces joined by
//! a veth pair, and exactly what the programs report about it, including each end's network namespace.
//!
//! Needs root (CI runs as root). The programs see every connection on the machine; each test looks only
//! at events touching its own namespaces (by namespace inode), so parallel tests and other traffic do not
//! disturb it.

mod support;

use network_enforcer_agent::{Direction, LoadOptions, Outcome, Protocol};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;
use support::{PodPair, collect, load, own_cgroup_id};

/// Dedupe as in production (an edge at most once per window), long enough to span a test.
fn deduping() -> LoadOptions {
    LoadOptions {
        dedupe_window: Duration::from_secs(30),
        connection_pids: true,
        ..LoadOptions::default()
    }
}

/// A TCP connection from pod a to pod b: one event per end, with exact addresses, ports, namespaces.
async fn tcp_between_pods(ipv6: bool) {
    let (_data_plane, mut reader) = load(&deduping());
    let pods = PodPair::new();
    let server_ip = if ipv6 { pods.v6(2) } else { pods.v4(2) };
    let server: SocketAddr = (server_ip, 8080).into();
    let listener = pods.b.run(move || TcpListener::bind(server).unwrap());
    let client: SocketAddr = pods.a.run(move || {
        let stream = TcpStream::connect(server).unwrap();
        stream.local_addr().unwrap()
    });
    listener.accept().unwrap();

    let (ns_a, ns_b) = (pods.a.inode(), pods.b.inode());
    let events = collect(&mut reader, 2, |e| {
        e.netns_ino == Some(ns_a) || e.netns_ino == Some(ns_b)
    })
    .await;
    assert_eq!(events.len(), 2, "{events:#?}");
    let out = events
        .iter()
        .find(|e| e.direction == Direction::Outbound)
        .expect("outbound event");
    let inb = events
        .iter()
        .find(|e| e.direction == Direction::Inbound)
        .expect("inbound event");

    assert_eq!(
        (out.protocol, out.outcome),
        (Protocol::Tcp, Outcome::Established)
    );
    assert_eq!((out.local, out.remote), (client, server));
    assert_eq!(out.netns_ino, Some(ns_a), "the client's pod");
    assert_eq!(out.cgroup_id, Some(own_cgroup_id()));
    assert_eq!(out.pid, Some(std::process::id()));
    assert_eq!(out.count, 1);

    assert_eq!(
        (inb.protocol, inb.outcome),
        (Protocol::Tcp, Outcome::Established)
    );
    assert_eq!((inb.local, inb.remote), (server, client));
    assert_eq!(inb.netns_ino, Some(ns_b), "the server's pod");
    assert_eq!(inb.cgroup_id, Some(own_cgroup_id()));
}

#[tokio::test]
async fn tcp_ipv4_between_pods_is_reported_at_both_ends_with_their_namespaces() {
    tcp_between_pods(false).await;
}

#[tokio::test]
async fn tcp_ipv6_between_pods_is_reported_at_both_ends_with_their_namespaces() {
    tcp_between_pods(true).await;
}

/// What the agent's *live* programs do and do not see of traffic that started before it (the start-up
/// scan of open sockets, tested in `existing_connections.rs`, reports those connections once):
/// - a TCP connection established before the agent started is not reported (its handshake is over;
///   data on it is not an event), only new connections are;
/// - a connected UDP socket is not reported either (sends on it carry no address, the connect is
///   over), while an unconnected UDP socket is reported at its next `sendto`.
#[tokio::test]
async fn traffic_that_started_before_the_agent_is_seen_only_where_the_kernel_shows_it() {
    use std::io::{Read, Write};
    let pods = PodPair::new();
    let server: SocketAddr = (pods.v4(2), 8081).into();
    let udp_server: SocketAddr = (pods.v4(2), 5300).into();
    let (listener, udp_sink) = pods.b.run(move || {
        (
            TcpListener::bind(server).unwrap(),
            UdpSocket::bind(udp_server).unwrap(),
        )
    });
    let (a_bind, a_bind2): (SocketAddr, SocketAddr) =
        ((pods.v4(1), 0).into(), (pods.v4(1), 0).into());
    let (mut old_tcp, connected_udp, unconnected_udp) = pods.a.run(move || {
        let tcp = TcpStream::connect(server).unwrap();
        let connected = UdpSocket::bind(a_bind).unwrap();
        connected.connect(udp_server).unwrap();
        connected.send(b"before").unwrap();
        let unconnected = UdpSocket::bind(a_bind2).unwrap();
        unconnected.send_to(b"before", udp_server).unwrap();
        (tcp, connected, unconnected)
    });
    let (mut old_peer, _) = listener.accept().unwrap();

    // The agent starts now.
    let (_data_plane, mut reader) = load(&deduping());
    old_tcp.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    old_peer.read_exact(&mut buf).unwrap();
    connected_udp.send(b"after").unwrap();
    unconnected_udp.send_to(b"after", udp_server).unwrap();
    // A new connection, to show the programs are attached and to bound the wait.
    let new_client = pods
        .a
        .run(move || TcpStream::connect(server).unwrap().local_addr().unwrap());
    listener.accept().unwrap();
    drop(udp_sink);

    let ns_a = pods.a.inode();
    let events = collect(&mut reader, 2, |e| e.netns_ino == Some(ns_a)).await;
    assert_eq!(events.len(), 2, "{events:#?}");
    let tcp = events.iter().find(|e| e.protocol == Protocol::Tcp).unwrap();
    assert_eq!(
        (tcp.local, tcp.remote),
        (new_client, server),
        "only the new TCP connection"
    );
    let udp = events.iter().find(|e| e.protocol == Protocol::Udp).unwrap();
    assert_eq!(
        (udp.local, udp.remote, udp.direction),
        (
            unconnected_udp.local_addr().unwrap(),
            udp_server,
            Direction::Outbound
        ),
        "only the unconnected UDP socket"
    );
}

/// A UDP request and its reply: one event per end, the reply joins the request's edge (it is not a
/// new connection in the other direction), and repeated datagrams are deduped in the kernel.
async fn udp_request_reply(server_ip: std::net::IpAddr, client_ip: std::net::IpAddr) {
    let (data_plane, mut reader) = load(&deduping());
    let pods = PodPair::new();
    let server: SocketAddr = (
        if server_ip.is_ipv4() {
            pods.v4(2)
        } else {
            pods.v6(2)
        },
        5353,
    )
        .into();
    let client_bind: SocketAddr = (
        if client_ip.is_ipv4() {
            pods.v4(1)
        } else {
            pods.v6(1)
        },
        0,
    )
        .into();
    const EXTRA: usize = 5;

    let server_socket = pods.b.run(move || UdpSocket::bind(server).unwrap());
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..=EXTRA {
            let (n, from) = server_socket.recv_from(&mut buf).unwrap();
            server_socket.send_to(&buf[..n], from).unwrap();
        }
    });
    let client: SocketAddr = pods.a.run(move || {
        let socket = UdpSocket::bind(client_bind).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 64];
        for _ in 0..=EXTRA {
            socket.send_to(b"ping", server).unwrap();
            let (_, from) = socket.recv_from(&mut buf).unwrap();
            assert_eq!(from, server);
        }
        socket.local_addr().unwrap()
    });
    echo.join().unwrap();

    let (ns_a, ns_b) = (pods.a.inode(), pods.b.inode());
    let events = collect(&mut reader, 2, |e| {
        e.netns_ino == Some(ns_a) || e.netns_ino == Some(ns_b)
    })
    .await;
    assert_eq!(
        events.len(),
        2,
        "one event per end, replies and repeats deduped: {events:#?}"
    );
    let out = events.iter().find(|e| e.netns_ino == Some(ns_a)).unwrap();
    let inb = events.iter().find(|e| e.netns_ino == Some(ns_b)).unwrap();

    assert_eq!(
        (out.protocol, out.direction, out.outcome),
        (Protocol::Udp, Direction::Outbound, Outcome::Datagram)
    );
    assert_eq!((out.local, out.remote), (client, server));
    assert_eq!(out.pid, Some(std::process::id()));
    assert_eq!(out.cgroup_id, Some(own_cgroup_id()));

    assert_eq!(
        (inb.protocol, inb.direction, inb.outcome),
        (Protocol::Udp, Direction::Inbound, Outcome::Datagram)
    );
    assert_eq!((inb.local, inb.remote), (server, client));

    // Each end saw 1 + EXTRA sends and 1 + EXTRA receives; all but the first per end were deduped.
    let hits = data_plane.counters().unwrap().dedupe_hits;
    assert!(
        hits >= 2 * (2 * (EXTRA as u64 + 1) - 1),
        "dedupe hits {hits} (other traffic on the machine may add more, never fewer)"
    );
}

#[tokio::test]
async fn udp_ipv4_request_and_reply_are_one_edge_per_end() {
    udp_request_reply("10.0.0.0".parse().unwrap(), "10.0.0.0".parse().unwrap()).await;
}

#[tokio::test]
async fn udp_ipv6_request_and_reply_are_one_edge_per_end() {
    udp_request_reply("fd00::".parse().unwrap(), "fd00::".parse().unwrap()).await;
}

#[tokio::test]
async fn connected_udp_socket_is_reported_at_connect() {
    let (_data_plane, mut reader) = load(&deduping());
    let pods = PodPair::new();
    let server: SocketAddr = (pods.v6(2), 9999).into();
    let bind: SocketAddr = (pods.v6(1), 0).into();
    let client = pods.a.run(move || {
        let socket = UdpSocket::bind(bind).unwrap();
        socket.connect(server).unwrap();
        // Sends on a connected socket carry no address: only connect() is seen, once.
        socket.send(b"x").unwrap();
        socket.local_addr().unwrap()
    });
    let ns_a = pods.a.inode();
    let events = collect(&mut reader, 1, |e| e.netns_ino == Some(ns_a)).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(
        (e.protocol, e.direction, e.outcome),
        (Protocol::Udp, Direction::Outbound, Outcome::Datagram)
    );
    assert_eq!((e.local, e.remote), (client, server));
}

/// Connects with only `syn_retries` SYN retransmissions, so a dropped SYN fails in seconds, not minutes.
fn connect_with_syn_retries(
    local: SocketAddr,
    remote: SocketAddr,
    syn_retries: i32,
) -> std::io::Error {
    use std::os::fd::AsRawFd;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // SAFETY: setsockopt with a valid fd and a pointer to an int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_SYNCNT,
            (&syn_retries as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    socket.bind(local).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(socket.connect(remote))
        .expect_err("the connection must fail")
}

#[tokio::test]
async fn refused_and_blocked_connects_are_failed_attempts_with_the_reason() {
    let (_data_plane, mut reader) = load(&deduping());
    let pods = PodPair::new();
    // Pod b drops SYNs to port 7000 (a NetworkPolicy as a CNI would enforce it) and listens on nothing.
    support::sh(
        "ip",
        &[
            "netns",
            "exec",
            &pods.b.name,
            "nft",
            "add table inet netest; add chain inet netest input { type filter hook input priority 0; }; add rule inet netest input tcp dport 7000 drop",
        ],
    );
    let refused: SocketAddr = (pods.v4(2), 7001).into();
    let blocked: SocketAddr = (pods.v4(2), 7000).into();
    let (local_refused, local_blocked): (SocketAddr, SocketAddr) =
        ((pods.v4(1), 40001).into(), (pods.v4(1), 40002).into());
    let (refused_err, blocked_err) = pods.a.run(move || {
        (
            connect_with_syn_retries(local_refused, refused, 1),
            connect_with_syn_retries(local_blocked, blocked, 1),
        )
    });
    assert_eq!(refused_err.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(blocked_err.kind(), std::io::ErrorKind::TimedOut);

    let ns_a = pods.a.inode();
    let mut events = collect(&mut reader, 2, |e| e.netns_ino == Some(ns_a)).await;
    events.sort_by_key(|e| e.remote.port());
    assert_eq!(events.len(), 2, "{events:#?}");
    for e in &events {
        assert_eq!(
            (e.protocol, e.direction, e.outcome),
            (Protocol::Tcp, Direction::Outbound, Outcome::Failed)
        );
        assert_eq!(e.pid, Some(std::process::id()));
    }
    assert_eq!(
        (events[0].local, events[0].remote),
        (local_blocked, blocked)
    );
    assert_eq!(
        events[0].error,
        Some(libc::ETIMEDOUT as u8),
        "dropped: timed out"
    );
    assert_eq!(
        (events[1].local, events[1].remote),
        (local_refused, refused)
    );
    assert_eq!(
        events[1].error,
        Some(libc::ECONNREFUSED as u8),
        "no listener: refused"
    );
}

#[tokio::test]
async fn an_edge_is_reported_once_per_window_with_the_suppressed_count() {
    let window = Duration::from_secs(2);
    let (data_plane, mut reader) = load(&LoadOptions {
        dedupe_window: window,
        ..LoadOptions::default()
    });
    let pods = PodPair::new();
    let server: SocketAddr = (pods.v4(2), 8443).into();
    let listener = pods.b.run(move || TcpListener::bind(server).unwrap());
    let accept = std::thread::spawn(move || {
        for _ in 0..4 {
            listener.accept().unwrap();
        }
    });
    let ns_a = pods.a.inode();
    let connect = move || {
        TcpStream::connect(server).unwrap();
    };
    // Three connections inside one window: one report; the other two are suppressed.
    let before = data_plane.counters().unwrap().dedupe_hits;
    for _ in 0..3 {
        pods.a.run(connect);
    }
    let first = collect(&mut reader, 1, |e| {
        e.netns_ino == Some(ns_a) && e.direction == Direction::Outbound
    })
    .await;
    assert_eq!(first.len(), 1, "{first:#?}");
    assert_eq!(first[0].count, 1);
    assert!(data_plane.counters().unwrap().dedupe_hits >= before + 2);

    // After the window the edge is reported again, carrying the two suppressed connections.
    tokio::time::sleep(window + Duration::from_millis(200)).await;
    pods.a.run(connect);
    let second = collect(&mut reader, 1, |e| {
        e.netns_ino == Some(ns_a) && e.direction == Direction::Outbound
    })
    .await;
    assert_eq!(second.len(), 1, "{second:#?}");
    assert_eq!(
        second[0].count, 3,
        "this connection plus the two suppressed ones"
    );
    assert_eq!(second[0].remote, server);
    accept.join().unwrap();
}

/// A UDP `connect()` to port 0 is how resolvers ask the kernel which source address a destination
/// would get (glibc's getaddrinfo sorts addresses so): nothing is sent, and nothing is reported. A
/// connect to a real port on the same socket is.
#[tokio::test]
async fn a_udp_connect_to_port_zero_is_no_edge() {
    let (_data_plane, mut reader) = load(&deduping());
    let pods = PodPair::new();
    let peer = pods.v4(2);
    let bind: SocketAddr = (pods.v4(1), 0).into();
    pods.a.run(move || {
        let probe = UdpSocket::bind(bind).unwrap();
        probe.connect((peer, 0)).unwrap();
        let real = UdpSocket::bind(bind).unwrap();
        real.connect((peer, 5301)).unwrap();
    });
    let ns_a = pods.a.inode();
    let events = collect(&mut reader, 1, |e| e.netns_ino == Some(ns_a)).await;
    let ports: Vec<u16> = events.iter().map(|e| e.remote.port()).collect();
    assert_eq!(ports, [5301], "{events:#?}");
}
