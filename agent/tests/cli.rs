//! The `network-enforcer-agent` binary: help text, and `flows` showing real connections (root).

mod support;

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A local address with a port nothing listens on right now.
fn free_port() -> std::net::SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The value of a metric from the agent's `/metrics` (a plain HTTP/1.0 GET).
fn metric(address: std::net::SocketAddr, name: &str) -> u64 {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    response
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{response}"))
}

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_network-enforcer-agent"))
}

/// Out-of-range windows are refused by the argument parser with the limit named (they used to
/// overflow a clock reading and panic).
#[test]
fn flows_refuses_windows_too_long_to_add_to_a_clock() {
    for args in [
        ["flows", "--interval", "18446744073709551615"],
        ["flows", "--interval", "0"],
        ["flows", "--since", "18446744073709551615"],
        ["flows", "--since", "99999999999999d"],
    ] {
        let out = agent().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("1..=86400") || stderr.contains("longer than 366 days"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn help_lists_the_subcommands_and_flows_options() {
    let out = agent().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("run"), "{help}");
    assert!(help.contains("flows"), "{help}");

    let out = agent().args(["flows", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--follow",
        "--port",
        "--protocol",
        "--direction",
        "--outcome",
        "--output",
    ] {
        assert!(help.contains(option), "flows --help lacks {option}: {help}");
    }
}

/// Runs `flows` (with `extra` arguments) for one 3 s interval while making loopback connections, and
/// checks that it printed exactly the outbound and inbound flow of those connections as JSON. Returns
/// the port and how many connections were made.
fn flows_show_connections(extra: &[&str]) -> (u16, u64) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut child = agent()
        .args(["flows", "--interval", "3", "-o", "json"])
        .args(extra)
        .arg("--port")
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::spawn(move || while let Ok((_stream, _)) = listener.accept() {});
    // Connect until the command is done: the first connections may come before its programs attach.
    let mut connections = 0;
    while child.try_wait().unwrap().is_none() {
        TcpStream::connect(("127.0.0.1", port)).unwrap();
        connections += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let flows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(flows.len(), 2, "one outbound and one inbound flow: {text}");
    for flow in &flows {
        assert_eq!(flow["port"], port);
        assert_eq!(flow["protocol"], "tcp");
        assert_eq!(flow["outcome"], "established");
        assert_eq!(flow["peer_ip"], "127.0.0.1");
        // No watched object has the address: the name field is there, and null.
        assert_eq!(flow.get("peer"), Some(&serde_json::Value::Null), "{flow}");
        let count = flow["count"].as_u64().unwrap();
        assert!(
            count >= 1 && count <= connections,
            "count {count} of {connections}"
        );
    }
    let mut directions: Vec<&str> = flows
        .iter()
        .map(|f| f["direction"].as_str().unwrap())
        .collect();
    directions.sort();
    assert_eq!(directions, ["inbound", "outbound"]);
    (port, connections)
}

#[test]
fn flows_loads_its_own_programs_with_local() {
    support::require_root();
    flows_show_connections(&["--local", "--dedupe-seconds", "0"]);
}

#[test]
fn flows_reads_a_running_agent_through_its_debug_socket() {
    support::require_root();
    let socket = std::env::temp_dir().join(format!("ne-cli-{}/agent.sock", std::process::id()));
    let metrics_address = free_port();
    let mut run = agent()
        .env("RUST_LOG", "warn")
        .args([
            "run",
            "--dedupe-seconds",
            "0",
            "--flush-seconds",
            "1",
            "--debug-socket",
        ])
        .arg(&socket)
        .arg("--metrics-address")
        .arg(metrics_address.to_string())
        .spawn()
        .unwrap();
    // Stops the agent even if an assertion fails.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill with a valid pid of our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(run.try_wait().unwrap().is_none(), "the agent exited early");
        assert!(
            std::time::Instant::now() < deadline,
            "no debug socket after 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let run = Stop(run);
    let (port, connections) = flows_show_connections(&["--socket", socket.to_str().unwrap()]);

    // --since answers at once from the agent's recent-records buffer: the agent ran before the first
    // connection and reports every one (--dedupe-seconds 0), so each end counts all of them.
    let out = output_within_20s(
        agent()
            .args(["flows", "--since", "5m", "-o", "json", "--port"])
            .arg(port.to_string())
            .arg("--socket")
            .arg(&socket),
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flows: Vec<(String, u64)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|f| {
            assert_eq!(f["port"], port);
            assert_eq!(f["peer_ip"], "127.0.0.1");
            (
                f["direction"].as_str().unwrap().to_string(),
                f["count"].as_u64().unwrap(),
            )
        })
        .collect();
    flows.sort();
    assert_eq!(
        flows,
        [
            ("inbound".to_string(), connections),
            ("outbound".to_string(), connections)
        ],
        "{text}"
    );
    // A window that ended before the connections shows none of them.
    let out = output_within_20s(
        agent()
            .args(["flows", "--since", "1ms", "-o", "json", "--port"])
            .arg(port.to_string())
            .arg("--socket")
            .arg(&socket),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");

    // The agent counted those events on its metrics endpoint (updated continuously).
    let events = metric(metrics_address, "network_enforcer_agent_events_total");
    assert!(events >= 2, "events_total {events}");
    assert!(metric(metrics_address, "network_enforcer_agent_events_lost_total") == 0);

    // SIGTERM stops the agent cleanly and it removes its socket.
    let mut run = run;
    // SAFETY: as above.
    unsafe { libc::kill(run.0.id() as i32, libc::SIGTERM) };
    let status = run.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!socket.exists());
    let _ = std::fs::remove_dir(socket.parent().unwrap());
}

/// Runs `command` to completion, killing it (and failing) after 20 s: a `run` that got past its flag
/// checks would otherwise load the programs and run until stopped.
fn output_within_20s(command: &mut Command) -> std::process::Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running after 20 s: {:?}", child.wait_with_output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn flows_since_needs_a_running_agent() {
    let out = output_within_20s(agent().args(["flows", "--local", "--since", "5m"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--since needs the running agent"),
        "{stderr}"
    );
    let out = output_within_20s(agent().args(["flows", "--since", "5x"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("unknown unit"), "{stderr}");
}

#[test]
fn run_checks_the_uplink_flags_before_loading_anything() {
    let out = agent().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--controller-url",
        "--token-file",
        "--node-name",
        "NODE_NAME",
        "--controller-ca-file",
        "--controller-server-name",
        "--controller-insecure",
    ] {
        assert!(help.contains(option), "run --help lacks {option}: {help}");
    }

    let out = output_within_20s(
        agent()
            .args(["run", "--controller-url", "http://127.0.0.1:1"])
            .env_remove("NODE_NAME"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--node-name or NODE_NAME"), "{stderr}");

    let out = output_within_20s(agent().args([
        "run",
        "--controller-url",
        "https://controller:9443",
        "--node-name",
        "node-1",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--controller-ca-file"), "{stderr}");

    // Plaintext only when asked for.
    let out = output_within_20s(agent().args([
        "run",
        "--controller-url",
        "http://controller:9443",
        "--node-name",
        "node-1",
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("NE_CONTROLLER_INSECURE=true"), "{stderr}");
}

/// An address this host does not have fails the start at once, naming the flag and the chart value
/// (docs/install.md, "Metrics and health"), before anything is loaded (no root needed).
#[test]
fn run_refuses_a_listen_address_this_host_does_not_have() {
    let port = free_port().port().to_string();
    // 192.0.2.1 is TEST-NET-1: never an address of this host.
    let out = output_within_20s(agent().args([
        "run",
        "--listen-address",
        "192.0.2.1",
        "--metrics-port",
        &port,
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "binding the metrics and health endpoint to 192.0.2.1:{port}"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("--listen-address") && stderr.contains("agent.listenAddresses"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// With the host network a wildcard listener is reachable on every interface of the node: by default
/// the endpoint binds loopback only, and with --listen-address exactly the addresses given.
#[test]
fn run_serves_its_endpoint_only_on_the_listen_addresses() {
    support::require_root();
    let socket =
        std::env::temp_dir().join(format!("ne-cli-listen-{}/agent.sock", std::process::id()));
    let port = free_port().port();
    let mut run = agent()
        .env("RUST_LOG", "warn")
        .env("NE_METRICS_PORT", port.to_string())
        .env_remove("NE_LISTEN_ADDRESS")
        .arg("run")
        .arg("--debug-socket")
        .arg(&socket)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let served = loop {
        if let Ok(Some(status)) = run.try_wait() {
            break Err(format!("the agent exited: {status}"));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break Ok(());
        }
        if std::time::Instant::now() > deadline {
            break Err("no endpoint on 127.0.0.1 after 20 s".to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Another loopback address reaches a wildcard listener, never one bound to 127.0.0.1 alone.
    let other = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 2], port)),
        Duration::from_secs(2),
    );
    // SAFETY: kill with a valid pid of our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let _ = run.wait();
    let _ = std::fs::remove_dir(socket.parent().unwrap());
    served.unwrap();
    assert_eq!(
        other.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "the endpoint answered on 127.0.0.2: it listens on every address"
    );
}
