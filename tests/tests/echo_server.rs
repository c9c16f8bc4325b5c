//! The test image's echo server (`tests/src/bin/echo-server.rs`) on loopback, without the cluster: many
//! parallel TCP and UDP clients, each gets its own payload back. The same check runs inside the local
//! cluster in `cluster.rs` (`the_echo_server_answers_every_one_of_200_parallel_tcp_and_udp_clients`).

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const ECHO_SERVER: &str = env!("CARGO_BIN_EXE_echo-server");

/// The server process, killed on drop (also when the test fails).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the server on free loopback ports and returns it with the ports it printed
/// (`tcp:N`, `udp:N`).
fn start_server() -> Result<(Server, Vec<String>)> {
    let mut child = Command::new(ECHO_SERVER)
        .args(["tcp:0", "tcp:0", "udp:0", "udp:0"])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {ECHO_SERVER}"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let server = Server(child);
    // The server prints one line per port once every port is bound, before it serves.
    let ports = BufReader::new(stdout)
        .lines()
        .take(4)
        .map(|line| {
            let line = line.context("reading the server's ports")?;
            line.strip_prefix("listening ")
                .map(str::to_string)
                .with_context(|| format!("unexpected server output {line:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    if ports.len() != 4 {
        bail!(
            "the server printed {} ports, expected 4: {ports:?}",
            ports.len()
        );
    }
    Ok((server, ports))
}

#[test]
fn every_one_of_200_parallel_clients_per_port_gets_its_payload_back_on_loopback() -> Result<()> {
    let (_server, ports) = start_server()?;
    let out = Command::new(ECHO_SERVER)
        .args(["--check", "127.0.0.1", "200"])
        .args(&ports)
        .output()
        .context("running the check")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the check failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for port in &ports {
        assert!(
            stdout.contains(&format!("{port} 200/200 echoed")),
            "no full result for {port}:\n{stdout}"
        );
    }
    Ok(())
}

#[test]
fn the_check_fails_when_nobody_answers() -> Result<()> {
    // A bound but silent UDP socket and a closed TCP port: the check must report both, not pass.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let out = Command::new(ECHO_SERVER)
        .args(["--check", "127.0.0.1", "3"])
        .arg(format!("udp:{}", silent.local_addr()?.port()))
        .arg(format!("tcp:{closed}"))
        .output()
        .context("running the check")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("0/3 echoed"), "{stdout}");
    assert!(stdout.contains("no reply after 3 datagrams"), "{stdout}");
    assert!(stdout.contains("connect:"), "{stdout}");
    Ok(())
}

#[test]
fn the_probe_mode_tells_served_ports_from_silent_and_closed_ones_in_parallel() -> Result<()> {
    let (_server, ports) = start_server()?;
    // A bound but silent UDP socket (what a dropped datagram looks like) and a closed TCP port.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let served: Vec<String> = ports
        .iter()
        .map(|p| p.replacen(':', ":127.0.0.1:", 1))
        .collect();
    let silent_udp = format!("udp:127.0.0.1:{}", silent.local_addr()?.port());
    let closed_tcp = format!("tcp:127.0.0.1:{closed}");
    // Several silent targets: probed in parallel, they cost one timeout together, not one each.
    let silent_targets = vec![silent_udp.clone(); 6];
    let start = std::time::Instant::now();
    let out = Command::new(ECHO_SERVER)
        .args(["--probe", "600"])
        .args(&served)
        .args(&silent_targets)
        .arg(&closed_tcp)
        .output()
        .context("running the probe")?;
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}: {stdout}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        served.len() + silent_targets.len() + 1,
        "{stdout}"
    );
    for (line, target) in lines.iter().zip(&served) {
        assert_eq!(*line, format!("{target} connected"), "{stdout}");
    }
    for line in &lines[served.len()..served.len() + silent_targets.len()] {
        assert!(
            line.starts_with(&format!("{silent_udp} blocked: no reply after 2 datagrams")),
            "{stdout}"
        );
    }
    assert!(
        lines[lines.len() - 1].starts_with(&format!("{closed_tcp} blocked: connect:")),
        "{stdout}"
    );
    assert!(
        elapsed < std::time::Duration::from_millis(2000),
        "six silent targets took {elapsed:?}: not probed in parallel"
    );
    // Bad arguments are an error, not a verdict.
    let bad = Command::new(ECHO_SERVER)
        .args(["--probe", "600", "sctp:127.0.0.1:80"])
        .output()?;
    assert_eq!(bad.status.code(), Some(2));
    Ok(())
}
