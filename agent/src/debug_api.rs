//! The agent's local debug API: a unix socket streaming every connection event as a JSON line, so
//! `network-enforcer-agent flows` (run with `kubectl exec` in the agent's pod) shows what the running agent
//! sees instead of loading a second copy of the programs.
//!
//! One event per line (an [`EventRecord`]). A slow client never slows the agent: each client has a
//! bounded queue, and when it falls behind the lines it missed are dropped and counted in a
//! `{"lagged": N}` line.

use crate::error::{Error, Result};
use crate::events::{ConnectionEvent, Direction, Outcome, Protocol};
use crate::flows::{direction_name, outcome_name, protocol_name};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::broadcast;

/// Where the agent listens by default (inside the agent's pod; `kubectl exec` reaches it there).
pub const DEFAULT_SOCKET: &str = "/run/network-enforcer/agent.sock";

/// Lines a client may fall behind before it starts missing some.
const CLIENT_QUEUE: usize = 16_384;

/// One event on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Kernel time (CLOCK_MONOTONIC) in nanoseconds.
    pub monotonic_ns: u64,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// `outbound` or `inbound`.
    pub direction: String,
    /// `established`, `failed` or `datagram`.
    pub outcome: String,
    /// The local socket address.
    pub local: SocketAddr,
    /// The peer's address.
    pub remote: SocketAddr,
    /// The local socket's network namespace inode.
    pub netns_ino: Option<u32>,
    /// The local socket's cgroup v2 id.
    pub cgroup_id: Option<u64>,
    /// The process that opened the connection.
    pub pid: Option<u32>,
    /// The socket error of a failed attempt.
    pub error: Option<u8>,
    /// Occurrences this event stands for.
    pub count: u32,
}

impl From<&ConnectionEvent> for EventRecord {
    fn from(e: &ConnectionEvent) -> Self {
        Self {
            monotonic_ns: u64::try_from(e.monotonic.as_nanos()).unwrap_or(u64::MAX),
            protocol: protocol_name(e.protocol).into(),
            direction: direction_name(e.direction).into(),
            outcome: outcome_name(e.outcome).into(),
            local: e.local,
            remote: e.remote,
            netns_ino: e.netns_ino,
            cgroup_id: e.cgroup_id,
            pid: e.pid,
            error: e.error,
            count: e.count,
        }
    }
}

impl TryFrom<EventRecord> for ConnectionEvent {
    type Error = String;

    fn try_from(r: EventRecord) -> Result<Self, String> {
        let protocol = match r.protocol.as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            other => return Err(format!("unknown protocol {other:?}")),
        };
        let direction = match r.direction.as_str() {
            "outbound" => Direction::Outbound,
            "inbound" => Direction::Inbound,
            other => return Err(format!("unknown direction {other:?}")),
        };
        let outcome = match r.outcome.as_str() {
            "established" => Outcome::Established,
            "failed" => Outcome::Failed,
            "datagram" => Outcome::Datagram,
            other => return Err(format!("unknown outcome {other:?}")),
        };
        Ok(Self {
            monotonic: Duration::from_nanos(r.monotonic_ns),
            protocol,
            direction,
            outcome,
            local: r.local,
            remote: r.remote,
            netns_ino: r.netns_ino,
            cgroup_id: r.cgroup_id,
            pid: r.pid,
            error: r.error,
            count: r.count.max(1),
        })
    }
}

/// The serving side, held by `run`: publish events, and every connected client gets them.
pub struct DebugServer {
    lines: broadcast::Sender<Arc<str>>,
    path: PathBuf,
}

impl DebugServer {
    /// Listens on `path` (its directory is created; a stale socket file from a previous run is replaced).
    pub fn bind(path: &Path) -> Result<Self> {
        let io = |source| Error::DebugSocket {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let listener = UnixListener::bind(path).map_err(io)?;
        let (lines, _) = broadcast::channel(CLIENT_QUEUE);
        let server = Self {
            lines: lines.clone(),
            path: path.to_path_buf(),
        };
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_client(stream, lines.subscribe()));
                    }
                    Err(err) => {
                        tracing::warn!(%err, "debug socket: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        Ok(server)
    }

    /// Sends events to every connected client (nothing happens without clients).
    pub fn publish(&self, events: &[ConnectionEvent]) {
        if self.lines.receiver_count() == 0 {
            return;
        }
        for event in events {
            if let Ok(line) = serde_json::to_string(&EventRecord::from(event)) {
                let _ = self.lines.send(line.into());
            }
        }
    }
}

impl Drop for DebugServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve_client(mut stream: UnixStream, mut lines: broadcast::Receiver<Arc<str>>) {
    loop {
        let line = match lines.recv().await {
            Ok(line) => line,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                format!("{{\"lagged\":{missed}}}").into()
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let written = async {
            stream.write_all(line.as_bytes()).await?;
            stream.write_all(b"\n").await
        };
        if written.await.is_err() {
            return; // the client went away
        }
    }
}

/// The client side, used by `flows`.
pub struct DebugClient {
    lines: tokio::io::Lines<BufReader<UnixStream>>,
    lagged: u64,
}

impl DebugClient {
    /// Connects to a running agent.
    pub async fn connect(path: &Path) -> Result<Self> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| Error::DebugSocket {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            lines: BufReader::new(stream).lines(),
            lagged: 0,
        })
    }

    /// Waits for the next event and appends it to `out`. Fails when the agent closes the connection.
    pub async fn read_batch(&mut self, out: &mut Vec<ConnectionEvent>) -> Result<()> {
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .map_err(Error::Poll)?
                .ok_or_else(|| Error::Poll(std::io::ErrorKind::UnexpectedEof.into()))?;
            if let Ok(record) = serde_json::from_str::<EventRecord>(&line) {
                match ConnectionEvent::try_from(record) {
                    Ok(event) => {
                        out.push(event);
                        return Ok(());
                    }
                    Err(err) => tracing::warn!(%err, "debug socket: skipping an event"),
                }
            } else if let Some(missed) = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v["lagged"].as_u64())
            {
                self.lagged += missed;
            }
        }
    }

    /// Events the agent dropped for this client because it fell behind.
    pub fn lagged(&self) -> u64 {
        self.lagged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> ConnectionEvent {
        ConnectionEvent {
            monotonic: Duration::from_nanos(123_456_789),
            protocol: Protocol::Udp,
            direction: Direction::Inbound,
            outcome: Outcome::Datagram,
            local: "[fd00::1]:53".parse().unwrap(),
            remote: "[fd00::2]:40000".parse().unwrap(),
            netns_ino: Some(4026532178),
            cgroup_id: Some(7),
            pid: None,
            error: None,
            count: 2,
        }
    }

    #[test]
    fn records_round_trip_through_json() {
        let line = serde_json::to_string(&EventRecord::from(&event())).unwrap();
        let record: EventRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(ConnectionEvent::try_from(record), Ok(event()));
    }

    #[tokio::test]
    async fn clients_receive_published_events() {
        let dir = std::env::temp_dir().join(format!("ne-debug-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let server = DebugServer::bind(&path).unwrap();
        let mut client = DebugClient::connect(&path).await.unwrap();
        // The server registers the client asynchronously; publish until it arrives.
        let mut got = Vec::new();
        let read = async {
            client.read_batch(&mut got).await.unwrap();
        };
        let publish = async {
            loop {
                server.publish(&[event()]);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            () = read => {}
            () = publish => unreachable!(),
            () = tokio::time::sleep(Duration::from_secs(5)) => panic!("no event within 5 s"),
        }
        assert_eq!(got, vec![event()]);
        drop(server);
        assert!(!path.exists(), "the socket file is removed with the server");
        let _ = std::fs::remove_dir(dir);
    }
}
