//! The test image's TCP and UDP echo server, and a client that checks one under parallel load.
//!
//! ```text
//! echo-server tcp:PORT|udp:PORT...
//!     Serve: echo every TCP connection until the client's EOF, then shut the write side down; send
//!     every UDP datagram back to its sender. One process, one thread per port (plus one per TCP
//!     connection). Port 0 picks a free port; the bound ports are printed on stdout.
//! echo-server --check HOST CLIENTS tcp:PORT|udp:PORT...
//!     Start CLIENTS clients per port at once, each with its own payload (TCP: send, half-close, read to
//!     EOF; UDP: send, wait for the reply, resend up to 3 times). Prints one line per port and exits 1
//!     unless every client got exactly its payload back.
//! echo-server --probe TIMEOUT_MS tcp:HOST:PORT|udp:HOST:PORT...
//!     Probe every target at once, each from its own thread and socket (TCP: connect within
//!     TIMEOUT_MS, send, half-close, read the payload back; UDP: send, wait TIMEOUT_MS/2 for the reply,
//!     resend once). Prints one line per target, in the order given: `TARGET connected` or
//!     `TARGET blocked: REASON`. A blocked target is a result, not an error: exits 0 unless the
//!     arguments are bad. One `kubectl exec` can thus probe a whole row of a NetworkPolicy truth table.
//! echo-server --spray FIRST_IP HOSTS FIRST_PORT PORTS
//!     Send one UDP datagram from one unconnected socket to each of PORTS consecutive ports from
//!     FIRST_PORT on each of HOSTS consecutive IPv4 addresses from FIRST_IP, without waiting for
//!     anything (what a scanning or misbehaving pod does). Prints how many were sent and how many
//!     failed; exits 0 unless the arguments are bad.
//! ```
//!
//! Why not socat, as the tests used before: under parallel load `socat UDP-RECVFROM,fork` stopped
//! answering on a port (forked children that never exited kept the inherited socket and took its
//! datagrams without answering), and `socat
//! TCP-LISTEN,fork EXEC:cat` raced clients that half-close at once (the child's close timeout against
//! `cat`'s reply). A red test has to mean the product, not the test's own echo server.
//!
//! Plain std on purpose: the image builder compiles this file with `rustc` alone (tests/src/images.rs),
//! without cargo or crates, and cargo builds it as a binary of the tests crate (clippy, the loopback test
//! in tests/tests/echo_server.rs).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// Stack of the per-connection and per-client threads: they hold a copy buffer and little else, and a
/// check starts hundreds of them at once.
const SMALL_STACK: usize = 256 * 1024;
/// How long a checking client waits to connect and for its reply (TCP).
const TCP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a checking client waits for a UDP reply before it resends its datagram.
const UDP_WAIT: Duration = Duration::from_secs(1);
/// UDP may drop a datagram under a burst (a full receive buffer) even when the server is healthy; a
/// stalled server answers none of the resends.
const UDP_ATTEMPTS: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Tcp,
    Udp,
}

#[derive(Clone, Copy, Debug)]
struct Port {
    protocol: Protocol,
    number: u16,
}

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        };
        write!(f, "{name}:{}", self.number)
    }
}

fn parse_port(arg: &str) -> Result<Port, String> {
    let (protocol, number) = match arg.split_once(':') {
        Some(("tcp", n)) => (Protocol::Tcp, n),
        Some(("udp", n)) => (Protocol::Udp, n),
        _ => return Err(format!("`{arg}`: expected tcp:PORT or udp:PORT")),
    };
    let number = number
        .parse()
        .map_err(|e| format!("`{arg}`: bad port number: {e}"))?;
    Ok(Port { protocol, number })
}

fn parse_ports(args: &[String]) -> Result<Vec<Port>, String> {
    if args.is_empty() {
        return Err("no ports given (tcp:PORT or udp:PORT)".into());
    }
    args.iter().map(|a| parse_port(a)).collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("--check") => check_command(&args[1..]),
        Some("--probe") => probe_command(&args[1..]),
        Some("--spray") => spray_command(&args[1..]),
        Some("--help" | "-h") => {
            println!(
                "usage: echo-server tcp:PORT|udp:PORT...\n       \
                 echo-server --check HOST CLIENTS tcp:PORT|udp:PORT...\n       \
                 echo-server --probe TIMEOUT_MS tcp:HOST:PORT|udp:HOST:PORT...\n       \
                 echo-server --spray FIRST_IP HOSTS FIRST_PORT PORTS"
            );
            Ok(true)
        }
        _ => parse_ports(&args).and_then(|ports| serve(&ports)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("echo-server: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--spray FIRST_IP HOSTS FIRST_PORT PORTS`: see the module docs.
fn spray_command(args: &[String]) -> Result<bool, String> {
    let [first_ip, hosts, first_port, ports] = args else {
        return Err("--spray needs FIRST_IP HOSTS FIRST_PORT PORTS".into());
    };
    let first_ip: Ipv4Addr = first_ip
        .parse()
        .map_err(|e| format!("FIRST_IP {first_ip:?}: {e}"))?;
    let number = |name: &str, text: &str| {
        text.parse::<u32>()
            .map_err(|e| format!("{name} {text:?}: {e}"))
    };
    let (hosts, first_port, ports) = (
        number("HOSTS", hosts)?,
        number("FIRST_PORT", first_port)?,
        number("PORTS", ports)?,
    );
    if first_port == 0 || first_port.saturating_add(ports) > 65_536 {
        return Err(format!("ports {first_port}.. +{ports} leave 1..=65535"));
    }
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| e.to_string())?;
    let (mut sent, mut failed) = (0u64, 0u64);
    for h in 0..hosts {
        let ip = Ipv4Addr::from(u32::from(first_ip).wrapping_add(h));
        for p in 0..ports {
            match socket.send_to(b"spray", (ip, (first_port + p) as u16)) {
                Ok(_) => sent += 1,
                Err(_) => failed += 1,
            }
        }
    }
    println!("sent {sent}, failed {failed}");
    Ok(true)
}

/// Binds every port first (a port that cannot be bound fails the start, instead of leaving a server
/// that answers on some ports only), then serves each on its own thread, forever.
fn serve(ports: &[Port]) -> Result<bool, String> {
    let mut servers = Vec::new();
    for port in ports {
        let address = (Ipv4Addr::UNSPECIFIED, port.number);
        let bound = match port.protocol {
            Protocol::Tcp => {
                let listener =
                    TcpListener::bind(address).map_err(|e| format!("binding {port}: {e}"))?;
                let local = listener.local_addr().map_err(|e| e.to_string())?;
                (local, Server::Tcp(listener))
            }
            Protocol::Udp => {
                let socket =
                    UdpSocket::bind(address).map_err(|e| format!("binding {port}: {e}"))?;
                let local = socket.local_addr().map_err(|e| e.to_string())?;
                (local, Server::Udp(socket))
            }
        };
        servers.push(bound);
    }
    let mut threads = Vec::new();
    for (local, server) in servers {
        let (name, run): (_, Box<dyn FnOnce() + Send>) = match server {
            Server::Tcp(listener) => (
                format!("tcp:{}", local.port()),
                Box::new(move || serve_tcp(&listener)),
            ),
            Server::Udp(socket) => (
                format!("udp:{}", local.port()),
                Box::new(move || serve_udp(&socket)),
            ),
        };
        // Tests that pass port 0 read the bound ports from here.
        println!("listening {name}");
        threads.push(
            thread::Builder::new()
                .name(name.clone())
                .spawn(run)
                .map_err(|e| format!("starting the {name} thread: {e}"))?,
        );
    }
    for thread in threads {
        // The serving loops never return; a panic is a bug worth a non-zero exit.
        thread
            .join()
            .map_err(|_| "a serving thread panicked".to_string())?;
    }
    Ok(true)
}

enum Server {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

/// Accepts forever; each connection gets its own thread, so a slow or silent client holds up nobody.
fn serve_tcp(listener: &TcpListener) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let spawned = thread::Builder::new()
                    .stack_size(SMALL_STACK)
                    .spawn(move || {
                        if let Err(e) = echo_tcp(&stream) {
                            eprintln!("echo-server: tcp connection from {peer}: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    eprintln!("echo-server: no thread for the connection from {peer}: {e}");
                }
            }
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning, and keep accepting.
                eprintln!("echo-server: accept: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Echoes until the client's EOF, then shuts the write side down: the client reads to EOF and is done.
fn echo_tcp(stream: &TcpStream) -> io::Result<()> {
    io::copy(&mut &*stream, &mut &*stream)?;
    stream.shutdown(Shutdown::Write)
}

/// Answers every datagram from the one thread that reads: a send to an unconnected UDP socket does not
/// wait for its peer, so no peer can stop the loop from reading.
fn serve_udp(socket: &UdpSocket) {
    let mut buf = vec![0u8; 65536];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((n, peer)) => {
                if let Err(e) = socket.send_to(&buf[..n], peer) {
                    eprintln!("echo-server: udp reply to {peer}: {e}");
                }
            }
            Err(e) => {
                eprintln!("echo-server: udp receive: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// `--check HOST CLIENTS PORT...`
fn check_command(args: &[String]) -> Result<bool, String> {
    let [host, clients, ports @ ..] = args else {
        return Err("usage: echo-server --check HOST CLIENTS tcp:PORT|udp:PORT...".into());
    };
    let clients: usize = clients
        .parse()
        .map_err(|e| format!("`{clients}`: bad client count: {e}"))?;
    let ports = parse_ports(ports)?;
    let mut all_ok = true;
    for (port, failures) in check(host, clients, &ports)? {
        all_ok &= failures.is_empty();
        println!(
            "{port} {}/{clients} echoed{}",
            clients - failures.len(),
            if failures.is_empty() {
                ""
            } else {
                "; failures:"
            }
        );
        for failure in failures.iter().take(5) {
            println!("  {failure}");
        }
        if failures.len() > 5 {
            println!("  ... and {} more", failures.len() - 5);
        }
    }
    Ok(all_ok)
}

/// Starts `clients` clients per port, all released at once by a barrier, and returns each port's
/// failures (empty: every client got its payload back).
fn check(host: &str, clients: usize, ports: &[Port]) -> Result<Vec<(Port, Vec<String>)>, String> {
    let mut targets = Vec::new();
    for port in ports {
        // Resolved once, before the clients start: the load is on the server, not on the DNS.
        let address = (host, port.number)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {host}: {e}"))?
            .find(SocketAddr::is_ipv4)
            .ok_or_else(|| format!("{host} has no IPv4 address"))?;
        targets.push((*port, address));
    }
    let barrier = Arc::new(Barrier::new(targets.len() * clients));
    let mut running = Vec::new();
    for (port, address) in &targets {
        let mut threads = Vec::new();
        for i in 0..clients {
            let (port, address, barrier) = (*port, *address, barrier.clone());
            // Unique per client, so that a reply meant for another client cannot pass.
            let payload = format!("{port}-client-{i}-{}", std::process::id());
            let thread = thread::Builder::new()
                .stack_size(SMALL_STACK)
                .spawn(move || {
                    barrier.wait();
                    let result = match port.protocol {
                        Protocol::Tcp => tcp_exchange(address, payload.as_bytes(), TCP_TIMEOUT),
                        Protocol::Udp => {
                            udp_exchange(address, payload.as_bytes(), UDP_WAIT, UDP_ATTEMPTS)
                        }
                    };
                    result.map_err(|e| format!("client {i} ({payload}): {e}"))
                })
                .map_err(|e| format!("starting client {i} of {port}: {e}"))?;
            threads.push(thread);
        }
        running.push((*port, threads));
    }
    Ok(running
        .into_iter()
        .map(|(port, threads)| {
            let failures = threads
                .into_iter()
                .filter_map(|t| match t.join() {
                    Ok(result) => result.err(),
                    Err(_) => Some("a client thread panicked".into()),
                })
                .collect();
            (port, failures)
        })
        .collect())
}

/// Connects, sends `payload`, half-closes at once (the pattern that raced socat's `EXEC:cat`) and reads
/// to EOF.
fn tcp_exchange(address: SocketAddr, payload: &[u8], timeout: Duration) -> Result<(), String> {
    let start = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&address, timeout).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(payload)
        .and_then(|()| stream.shutdown(Shutdown::Write))
        .map_err(|e| format!("send: {e}"))?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .map_err(|e| format!("read after {:?}: {e}", start.elapsed()))?;
    if reply != payload {
        return Err(format!("got back {:?}", String::from_utf8_lossy(&reply)));
    }
    Ok(())
}

/// Sends `payload` from a socket of its own and waits for it to come back, resending on silence.
fn udp_exchange(
    address: SocketAddr,
    payload: &[u8],
    wait: Duration,
    attempts: u32,
) -> Result<(), String> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| format!("bind: {e}"))?;
    // Connected: only datagrams from the server's address reach this socket.
    socket
        .connect(address)
        .and_then(|()| socket.set_read_timeout(Some(wait)))
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65536];
    let mut last = String::from("no reply");
    for _ in 0..attempts {
        socket.send(payload).map_err(|e| format!("send: {e}"))?;
        match socket.recv(&mut buf) {
            Ok(n) if &buf[..n] == payload => return Ok(()),
            Ok(n) => last = format!("got back {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            // E.g. connection refused (an ICMP port unreachable): nobody listens.
            Err(e) => last = format!("receive: {e}"),
        }
    }
    Err(format!("{last} after {attempts} datagrams {wait:?} apart"))
}

/// `--probe TIMEOUT_MS TARGET...`
fn probe_command(args: &[String]) -> Result<bool, String> {
    let [timeout, targets @ ..] = args else {
        return Err("usage: echo-server --probe TIMEOUT_MS tcp:HOST:PORT|udp:HOST:PORT...".into());
    };
    let timeout = Duration::from_millis(
        timeout
            .parse()
            .map_err(|e| format!("`{timeout}`: bad timeout in milliseconds: {e}"))?,
    );
    if targets.is_empty() {
        return Err("no targets given (tcp:HOST:PORT or udp:HOST:PORT)".into());
    }
    let targets = targets
        .iter()
        .map(|t| parse_target(t).map(|parsed| (t.clone(), parsed)))
        .collect::<Result<Vec<_>, _>>()?;
    // All at once: a blocked target costs its timeout, and the row's time is that of the slowest
    // target, not the sum.
    let running = targets
        .into_iter()
        .enumerate()
        .map(|(i, (name, (protocol, address)))| {
            let payload = format!("probe-{i}-{}", std::process::id());
            let thread = thread::Builder::new()
                .stack_size(SMALL_STACK)
                .spawn(move || match protocol {
                    Protocol::Tcp => tcp_exchange(address, payload.as_bytes(), timeout),
                    // Two datagrams half the time apart: one lost datagram does not read as a block.
                    Protocol::Udp => udp_exchange(address, payload.as_bytes(), timeout / 2, 2),
                })
                .map_err(|e| format!("starting the probe of {name}: {e}"))?;
            Ok((name, thread))
        })
        .collect::<Result<Vec<_>, String>>()?;
    for (name, thread) in running {
        match thread.join() {
            Ok(Ok(())) => println!("{name} connected"),
            Ok(Err(reason)) => println!("{name} blocked: {reason}"),
            Err(_) => return Err(format!("the probe of {name} panicked")),
        }
    }
    Ok(true)
}

/// `tcp:HOST:PORT` or `udp:HOST:PORT`; HOST is resolved here, before any probe starts.
fn parse_target(arg: &str) -> Result<(Protocol, SocketAddr), String> {
    let (protocol, rest) = match arg.split_once(':') {
        Some(("tcp", rest)) => (Protocol::Tcp, rest),
        Some(("udp", rest)) => (Protocol::Udp, rest),
        _ => return Err(format!("`{arg}`: expected tcp:HOST:PORT or udp:HOST:PORT")),
    };
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("`{arg}`: expected tcp:HOST:PORT or udp:HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|e| format!("`{arg}`: bad port number: {e}"))?;
    let address = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("`{arg}`: resolving {host}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("`{arg}`: {host} has no IPv4 address"))?;
    Ok((protocol, address))
}
