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
